"""The locks in requirements/ against pyproject.toml, offline: a dependency added to or
narrowed in pyproject.toml without `make lock` fails here, not later in a build that installs
from the lock with `--no-deps` and so would never fetch it.

`make install` installs dev.txt (the dependencies, the test and trace extras); the image
installs runtime.txt, or trace.txt with `--build-arg EXTRAS=trace`. Each also holds the build
backend, so the package is built from locked files too.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "requirements"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
#: Where the locks are resolved (the Makefile's `lock` target): markers are judged there.
TARGET = {
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)")
_HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def read_lock(name: str) -> dict[str, Version]:
    """Each package of a lock and its pinned version. Fails on a line that is not
    `name==version` with at least one sha256 hash (`pip --require-hashes` would refuse it)."""
    text = (REQUIREMENTS / name).read_text()
    lines = re.sub(r"\\\n", " ", text).splitlines()
    pins: dict[str, Version] = {}
    for line in lines:
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        match = _PIN.match(line)
        assert match, f"{name}: not pinned with ==: {line[:80]}"
        assert _HASH.search(line), f"{name}: {match[1]} has no sha256 hash"
        key = canonicalize_name(match[1])
        assert key not in pins, f"{name}: {key} pinned twice"
        pins[key] = Version(match[2])
    return pins


def required(*extras: str) -> list[Requirement]:
    """pyproject.toml's requirements for these extras, the base and the build backend, as they
    apply on the lock's target."""
    project = PYPROJECT["project"]
    texts = [
        *project["dependencies"],
        *PYPROJECT["build-system"]["requires"],
        *(text for extra in extras for text in project["optional-dependencies"][extra]),
    ]
    reqs = [Requirement(text) for text in texts]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(TARGET)]


LOCKS = {
    "dev.txt": ("test", "trace"),
    "runtime.txt": (),
    "trace.txt": ("trace",),
}


@pytest.mark.parametrize(("lock", "extras"), LOCKS.items())
def test_every_requirement_of_pyproject_is_pinned_in_range_with_hashes(
    lock: str, extras: tuple[str, ...]
) -> None:
    pins = read_lock(lock)
    for requirement in required(*extras):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{lock}: {requirement} is not locked; run `make lock`"
        version = pins[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{lock}: {name}=={version} is outside {requirement}; run `make lock`"
        )


@pytest.mark.parametrize("lock", ["runtime.txt", "trace.txt"])
def test_the_images_locks_pin_what_the_tests_ran_with(lock: str) -> None:
    """The image runs the versions the suite tested: each pin in its lock is dev.txt's."""
    dev = read_lock("dev.txt")
    for name, version in read_lock(lock).items():
        assert dev.get(name) == version, f"{lock}: {name}=={version} not dev's"


def test_the_default_image_has_no_trace_stack() -> None:
    trace = PYPROJECT["project"]["optional-dependencies"]["trace"]
    names = {canonicalize_name(Requirement(text).name) for text in trace}
    assert names.isdisjoint(read_lock("runtime.txt"))
    assert names <= read_lock("trace.txt").keys()


def test_the_build_backend_input_is_pyprojects() -> None:
    """requirements/build.in feeds the build backend into every lock: the same requirement as
    [build-system]."""
    lines = (REQUIREMENTS / "build.in").read_text().splitlines()
    wanted = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert wanted == PYPROJECT["build-system"]["requires"]


def test_each_lock_says_how_it_is_refreshed() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^lock:", makefile, re.M)
    for lock in LOCKS:
        assert f"requirements/{lock}" in makefile
        assert "#    make lock\n" in (REQUIREMENTS / lock).read_text()
