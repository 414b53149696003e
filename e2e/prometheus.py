"""A real Prometheus on loopback: the distribution's binaries, a generated config, a temp TSDB.

Why the distribution's package and not a download: Debian ships prometheus and promtool
(bookworm: 2.42), apt is how this machine gets system tools, and the tests then check the
dashboard and alerts against the very PromQL engine an operator of a cluster would run.

CLI: ``python -m e2e.prometheus install`` installs the package when a binary is missing
(``make prometheus``; root, non-interactive, the package's service never started);
``python -m e2e.prometheus check`` prints where the binaries are.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from e2e.procs import (
    PORT_TRIES,
    ManagedProcess,
    free_ports,
    is_running,
    log_tail,
    port_taken,
    start,
    stop,
)
from e2e.wait import wait_until

PACKAGE = "prometheus"
BINARIES = ("prometheus", "promtool")
#: Where Debian's init script keeps the pid of the daemon it starts.
PACKAGE_PIDFILE = Path("/run/prometheus/prometheus.pid")
#: Denies every service start while apt runs (see invoke-rc.d(8), "policy-rc.d").
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
START_TIMEOUT_S = 60.0


class PrometheusMissing(Exception):
    """prometheus or promtool is not installed; the message says how to get them."""


def find_binaries() -> dict[str, Path]:
    """Paths of prometheus and promtool: ``$VRAMGATE_PROMETHEUS_BIN_DIR`` first, then PATH."""
    found: dict[str, Path] = {}
    extra = os.environ.get("VRAMGATE_PROMETHEUS_BIN_DIR")
    for name in BINARIES:
        candidates = [Path(extra) / name] if extra else []
        which = shutil.which(name)
        candidates += [Path(which)] if which else []
        hit = next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)
        if hit is None:
            raise PrometheusMissing(
                f"{name} is not installed: run `make prometheus` (apt-get install {PACKAGE}) "
                "or set VRAMGATE_PROMETHEUS_BIN_DIR to a folder holding prometheus and promtool"
            )
        found[name] = hit
    return found


def install() -> dict[str, Path]:
    """apt-get install the package unless both binaries are there; returns their paths.

    Non-interactive; while apt runs, a policy-rc.d that denies service starts is in place
    (the package's postinst would start a system-wide daemon on :9090), and a daemon that
    started anyway is stopped: nothing of the package's stays running.
    """
    try:
        return find_binaries()
    except PrometheusMissing:
        pass
    if shutil.which("apt-get") is None:
        raise PrometheusMissing(
            f"prometheus is not installed and apt-get is missing: install the {PACKAGE} "
            "package (2.42 or newer) with this system's package manager"
        )
    if os.geteuid() != 0:
        raise PrometheusMissing(
            f"prometheus is not installed: run `sudo apt-get install -y {PACKAGE}`, "
            "or `make prometheus` as root"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    placed_policy = not POLICY_RC_D.exists()
    if placed_policy:
        POLICY_RC_D.write_text("#!/bin/sh\n# placed by e2e.prometheus while apt runs\nexit 101\n")
        POLICY_RC_D.chmod(0o755)
    try:
        for argv in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends",
             "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold",
             PACKAGE],
        ):  # fmt: skip
            done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, text=True,
                                  capture_output=True, check=False)  # fmt: skip
            if done.returncode != 0:
                raise PrometheusMissing(
                    f"`{' '.join(argv)}` failed ({done.returncode}): "
                    f"{(done.stderr or done.stdout).strip()[-2000:]}"
                )
    finally:
        if placed_policy:
            POLICY_RC_D.unlink(missing_ok=True)
        _stop_package_daemon()
    return find_binaries()


def _stop_package_daemon() -> None:
    """Stop the daemon the package's init script may have started (its own pid file)."""
    try:
        pid = int(PACKAGE_PIDFILE.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return
    if Path(exe).name == "prometheus":
        subprocess.run(["invoke-rc.d", "--force", PACKAGE, "stop"], check=False,
                       capture_output=True)  # fmt: skip


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool; its output, whatever the exit status."""
    tool = find_binaries()["promtool"]
    return subprocess.run([str(tool), *args], cwd=cwd, text=True, capture_output=True,
                          check=False, timeout=120)  # fmt: skip


@dataclass(frozen=True)
class ScrapeJob:
    """One scrape job: ``targets`` as host:port on loopback.

    ``honor_labels``: where a series' own label clashes with a target label, keep the
    series' one. The operator's per-job series carry ``job`` (the FineTuneJob) and
    ``namespace`` labels, which Prometheus would otherwise rename to ``exported_job`` and
    ``exported_namespace`` (kube-state-metrics is scraped this way for the same reason).
    """

    name: str
    targets: Sequence[str]
    honor_labels: bool = False
    metrics_path: str = "/metrics"


@dataclass
class Prometheus:
    """prometheus on 127.0.0.1 scraping ``jobs`` every second, with ``rule_files`` loaded."""

    workdir: Path
    jobs: Sequence[ScrapeJob]
    rule_files: Sequence[Path] = ()
    interval_s: float = 1.0
    die_with_parent: bool = True
    port: int = 0
    process: ManagedProcess | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        interval = f"{self.interval_s:g}s"
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval,
                       "scrape_timeout": interval},
            "rule_files": [str(Path(p).resolve()) for p in self.rule_files],
            "scrape_configs": [
                {"job_name": job.name, "honor_labels": job.honor_labels,
                 "metrics_path": job.metrics_path,
                 "static_configs": [{"targets": list(job.targets)}]}
                for job in self.jobs
            ],
        }  # fmt: skip

    def start(self) -> Prometheus:
        binary = find_binaries()["prometheus"]
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        checked = promtool("check", "config", str(config))
        if checked.returncode != 0:
            raise RuntimeError(f"promtool refuses {config}: {checked.stdout}{checked.stderr}")
        chosen = not self.port  # a port chosen here, another one if it is taken meanwhile
        storage = self.workdir / "data"
        storage.mkdir(exist_ok=True)
        log = self.workdir / "prometheus.log"
        attempt = 1
        while True:
            if chosen:
                (self.port,) = free_ports(1)
            argv = [
                str(binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={storage}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1d",
                "--log.level=warn",
            ]
            log.unlink(missing_ok=True)  # what port_taken reads: this start's words only
            self.process = start("prometheus", argv, log, self.workdir,
                                 die_with_parent=self.die_with_parent)  # fmt: skip
            try:
                wait_until(self._ready, timeout=START_TIMEOUT_S, what="prometheus to be ready")
                return self
            except RuntimeError:  # it exited
                self.stop()
                if not (chosen and port_taken(log) and attempt < PORT_TRIES):
                    raise
                attempt += 1
            except BaseException:
                self.stop()
                raise

    def _ready(self) -> bool:
        if self.process is not None and not is_running(self.process):
            raise RuntimeError(f"prometheus exited:\n{log_tail(self.process.log)}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)
            self.process = None

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- HTTP API --------------------------------------------------------------------

    def api(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """GET /api/v1/<path>; the ``data`` of a success, RuntimeError with the error else."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as error:
            body = json.load(error)
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {dict(params or {})}: {body.get('errorType')}: "
                               f"{body.get('error')}")  # fmt: skip
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query; its vector (a scalar comes back as one sample without labels)."""
        data = self.api("query", {"query": expr})
        if data["resultType"] == "vector":
            return list(data["result"])
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        raise RuntimeError(f"{expr}: a {data['resultType']}, not an instant vector")

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets")["activeTargets"])

    def all_up(self) -> bool:
        """Every target scraped at least once, and the last scrape succeeded."""
        targets = self.targets()
        return bool(targets) and all(t["health"] == "up" for t in targets)

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]


@dataclass(frozen=True)
class PanelQuery:
    """One query of a Grafana dashboard panel, its variables replaced."""

    panel: str
    ref: str
    expr: str

    @property
    def name(self) -> str:
        return f"{self.panel} [{self.ref}]"


_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def dashboard_queries(
    dashboard: Mapping[str, Any], builtins: Mapping[str, str]
) -> list[PanelQuery]:
    """Every panel query of a Grafana dashboard (rows' nested panels too), with its template
    variables replaced as Grafana would with "All" selected (each variable's allValue) and
    the built-ins (``__rate_interval``, ``__range`` ...) taken from ``builtins``; a variable
    neither defines is a KeyError, so a new one cannot slip by unreplaced."""
    known = dict(builtins)
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            known[variable["name"]] = variable.get("allValue") or ".*"

    def replace(match: re.Match[str]) -> str:
        return known[match.group(1) or match.group(2)]

    found: list[PanelQuery] = []

    def walk(panels: Sequence[Mapping[str, Any]]) -> None:
        for panel in panels:
            walk(panel.get("panels", []))
            for target in panel.get("targets", []):
                expr = target.get("expr")
                if expr:
                    found.append(PanelQuery(panel["title"], target.get("refId", "?"),
                                            _VARIABLE.sub(replace, expr)))  # fmt: skip

    walk(dashboard.get("panels", []))
    return found


def rule_expressions(rule_file: Mapping[str, Any]) -> dict[str, str]:
    """Every rule's expression in a rule file, by its alert or record name."""
    return {
        rule.get("alert") or rule["record"]: rule["expr"]
        for group in rule_file["groups"]
        for rule in group["rules"]
    }


def values(result: list[dict[str, Any]]) -> list[float]:
    """The sample values of an instant vector, as floats (NaN included)."""
    return [float(sample["value"][1]) for sample in result]


def has_numbers(result: list[dict[str, Any]]) -> bool:
    """At least one sample that is a number (not NaN), as a panel would draw."""
    return any(not math.isnan(v) for v in values(result))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.prometheus",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["install", "check"])
    args = parser.parse_args(argv)
    try:
        found = install() if args.command == "install" else find_binaries()
    except PrometheusMissing as error:
        print(f"e2e.prometheus: {error}", file=sys.stderr)
        return 2
    for name, path in found.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
