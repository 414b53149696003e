"""Build the local control plane's binaries from the Go module proxy and cache them.

Why build instead of download: this project's machines reach only package registries, so
etcd, Kubernetes, kwok and helm come from the Go module proxy and are compiled with the
machine's own Go. Every version is pinned in ``e2e/versions.json``; a binary is cached as
``<cache>/bin/<name>-<version>`` so that only the first run pays the (minutes-long) build.

Run as ``python -m e2e.build``. Exit codes: 0 built or cached, 1 a build failed, 2 a
prerequisite (Go, the module proxy) is missing.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from e2e.paths import cache_root

VERSIONS_FILE = Path(__file__).with_name("versions.json")
MIN_GO = (1, 26)
Log = Callable[[str], None]


class BuildError(Exception):
    """A binary could not be built; ``str()`` is one line meant for a person."""


class MissingPrerequisite(BuildError):
    """Go or the Go module proxy is not available: nothing can be built at all."""


@dataclass(frozen=True)
class ModuleSpec:
    """One Go module from versions.json and the binaries built from it."""

    module: str
    version: str
    local_replace_version: str | None
    binaries: dict[str, str]
    ldflags_x: dict[str, str]


def load_versions(path: Path = VERSIONS_FILE) -> list[ModuleSpec]:
    """Read the pinned modules; the single source of truth for what gets built."""
    data = json.loads(path.read_text())
    return [
        ModuleSpec(
            module=entry["module"],
            version=entry["version"],
            local_replace_version=entry.get("local_replace_version"),
            binaries=dict(entry["binaries"]),
            ldflags_x=dict(entry.get("ldflags_x", {})),
        )
        for entry in data["modules"]
    ]


def bin_dir() -> Path:
    return cache_root() / "bin"


def binary_path(name: str, specs: Iterable[ModuleSpec] | None = None) -> Path:
    """Where the cached binary ``name`` lives (whether or not it is built yet)."""
    for spec in specs if specs is not None else load_versions():
        if name in spec.binaries:
            return bin_dir() / f"{name}-{spec.version}"
    raise KeyError(f"{name} is not pinned in {VERSIONS_FILE.name}")


def find_go() -> str:
    """The machine's Go, from PATH or the standard install location."""
    found = shutil.which("go") or (
        "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None
    )
    if found is None:
        raise MissingPrerequisite(
            "Go toolchain not found (need go >= 1.26 on PATH or at /usr/local/go/bin/go)"
        )
    return found


def go_env() -> dict[str, str]:
    """Environment for every go command: static binaries, reproducible, jsonv2 off.

    GOEXPERIMENT=nojsonv2: Go 1.27 turns jsonv2 on, which breaks kube-apiserver's OpenAPI
    output; on 1.26 it is a no-op. GOTOOLCHAIN=local: build with this machine's Go, never
    switch toolchains behind the user's back.
    """
    env = dict(os.environ)
    env.update(CGO_ENABLED="0", GOEXPERIMENT="nojsonv2", GOTOOLCHAIN="local", GOWORK="off")
    env.setdefault("GOFLAGS", "-buildvcs=false")
    return env


def _run_go(go: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [go, *args], cwd=cwd, env=go_env(), capture_output=True, text=True, check=False
    )


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def check_go_version(go: str) -> str:
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False)
    version = out.stdout.strip()
    match = re.match(r"go(\d+)\.(\d+)", version)
    if out.returncode != 0 or match is None:
        raise MissingPrerequisite(f"cannot run {go}: {_last_line(out.stderr)}")
    if (int(match[1]), int(match[2])) < MIN_GO:
        raise MissingPrerequisite(
            f"{go} is {version}; need go >= {MIN_GO[0]}.{MIN_GO[1]} to build the pinned versions"
        )
    return version


def _download(go: str, module: str, version: str, cwd: Path) -> dict[str, str]:
    """Fetch one module from the proxy; a failure here means the proxy is unreachable."""
    result = _run_go(go, ["mod", "download", "-json", f"{module}@{version}"], cwd)
    info: dict[str, str] = {}
    if result.stdout.strip():
        info = json.loads(result.stdout)
    if result.returncode != 0 or "Error" in info or "GoMod" not in info:
        detail = info.get("Error") or _last_line(result.stderr)
        goproxy = go_env().get("GOPROXY") or "default"
        raise MissingPrerequisite(
            f"cannot fetch {module}@{version} from the Go module proxy "
            f"(GOPROXY={goproxy}): {detail}"
        )
    return info


def module_dir(module: str) -> Path:
    """The source folder of a module pinned in versions.json, in Go's module cache
    (downloaded if missing): e2e/kueue.py installs Kueue's CRDs from there."""
    spec = next((s for s in load_versions() if s.module == module), None)
    if spec is None:
        raise KeyError(f"{module} is not pinned in {VERSIONS_FILE.name}")
    cache_root().mkdir(parents=True, exist_ok=True)
    return Path(_download(find_go(), spec.module, spec.version, cache_root())["Dir"])


def _local_replaces(go: str, gomod: str, cwd: Path) -> list[str]:
    """Module paths that the dependency's go.mod replaces with directories of its own repo.

    Those replaces are ignored when the module is not the main module, so the throwaway
    module must point each of them at a published version instead.
    """
    result = _run_go(go, ["mod", "edit", "-json", gomod], cwd)
    if result.returncode != 0:
        raise BuildError(f"cannot parse {gomod}: {_last_line(result.stderr)}")
    parsed = json.loads(result.stdout)
    return sorted(
        rep["Old"]["Path"]
        for rep in parsed.get("Replace") or []
        if rep["New"]["Path"].startswith(("./", "../")) and not rep["New"].get("Version")
    )


def _write_build_module(go: str, spec: ModuleSpec, workdir: Path, go_version: str) -> None:
    info = _download(go, spec.module, spec.version, workdir)
    replaces = _local_replaces(go, info["GoMod"], workdir)
    if replaces and spec.local_replace_version is None:
        raise BuildError(
            f"{spec.module} replaces {', '.join(replaces)} with local paths; "
            "set local_replace_version in versions.json"
        )
    lines = [
        "// Throwaway module generated by e2e/build.py; safe to delete.",
        "module vramgate.local/e2ebuild",
        "",
        f"go {go_version.removeprefix('go')}",
        "",
        f"require {spec.module} {spec.version}",
        "",
    ]
    lines += [f"replace {mod} => {mod} {spec.local_replace_version}" for mod in replaces]
    lines += ["", *(f"tool {pkg}" for pkg in spec.binaries.values()), ""]
    (workdir / "go.mod").write_text("\n".join(lines))
    tidy = _run_go(go, ["mod", "tidy"], workdir)
    if tidy.returncode != 0:
        detail = _last_line(tidy.stderr)
        if "proxy" in detail or "dial" in detail or "lookup" in detail:
            raise MissingPrerequisite(f"Go module proxy unreachable: {detail}")
        raise BuildError(f"go mod tidy for {spec.module}@{spec.version} failed: {detail}")


def _ldflags(spec: ModuleSpec) -> str:
    xs = [f"-X {var}={value}" for var, value in sorted(spec.ldflags_x.items())]
    return " ".join(["-s", "-w", *xs])


@contextmanager
def _build_lock() -> Iterator[None]:
    """Serialise builds across processes (two pytest sessions, a human and CI)."""
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / "build.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_module(go: str, go_version: str, spec: ModuleSpec, missing: list[str], log: Log) -> None:
    workdir = cache_root() / "gobuild" / f"{spec.module.replace('/', '_')}@{spec.version}"
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    log(f"[build] preparing {spec.module}@{spec.version} (download + go mod tidy)")
    _write_build_module(go, spec, workdir, go_version)
    log(f"[build] prepared {spec.module}@{spec.version} in {time.monotonic() - started:.1f}s")
    # One binary at a time on purpose: a cold kube-apiserver build alone needs ~2 GiB and
    # both cores of the project's 2-core machines; later binaries reuse the Go build cache.
    for name in missing:
        target = bin_dir() / f"{name}-{spec.version}"
        started = time.monotonic()
        log(f"[build] building {name} {spec.version} ...")
        with tempfile.NamedTemporaryFile(dir=bin_dir(), prefix=f".{name}.", delete=False) as tmp:
            tmp_path = Path(tmp.name)
        args = ["build", "-trimpath", f"-ldflags={_ldflags(spec)}", "-o", str(tmp_path)]
        result = _run_go(go, [*args, spec.binaries[name]], workdir)
        if result.returncode != 0:
            tmp_path.unlink(missing_ok=True)
            tail = "\n".join(result.stderr.strip().splitlines()[-15:])
            raise BuildError(f"go build of {name} {spec.version} failed: {tail}")
        tmp_path.chmod(0o755)
        tmp_path.replace(target)
        size_mib = target.stat().st_size / 2**20
        log(
            f"[build] built {name} {spec.version} in {time.monotonic() - started:.1f}s "
            f"({size_mib:.0f} MiB) -> {target}"
        )


def _print_progress(line: str) -> None:
    print(line, flush=True)


def ensure_binaries(
    names: Iterable[str] | None = None, log: Log = _print_progress
) -> dict[str, Path]:
    """Return paths of the wanted binaries, building whichever are not cached yet."""
    specs = load_versions()
    wanted = set(names) if names is not None else {n for s in specs for n in s.binaries}
    paths = {name: binary_path(name, specs) for name in wanted}
    if all(path.exists() for path in paths.values()):
        return paths
    go = find_go()
    go_version = check_go_version(go)
    bin_dir().mkdir(parents=True, exist_ok=True)
    with _build_lock():
        for spec in specs:
            missing = [n for n in spec.binaries if n in wanted and not paths[n].exists()]
            if missing:
                _build_module(go, go_version, spec, missing, log)
    return paths


def main(argv: list[str] | None = None) -> int:
    names = sorted(n for spec in load_versions() for n in spec.binaries)
    parser = argparse.ArgumentParser(
        prog="python -m e2e.build",
        description="Build the pinned control-plane binaries (all, or those named) into "
        f"{bin_dir()}; cached ones are skipped.",
    )
    parser.add_argument("binaries", nargs="*", metavar="BINARY", help=f"one of: {', '.join(names)}")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.binaries) - set(names))
    if unknown:
        parser.error(f"not pinned in {VERSIONS_FILE.name}: {', '.join(unknown)}")
    started = time.monotonic()
    try:
        paths = ensure_binaries(args.binaries or None)
    except MissingPrerequisite as err:
        print(f"e2e.build: {err}", file=sys.stderr)
        return 2
    except BuildError as err:
        print(f"e2e.build: {err}", file=sys.stderr)
        return 1
    for name, path in sorted(paths.items()):
        print(f"[build] {name}: {path}")
    print(f"[build] all binaries ready in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
