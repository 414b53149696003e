"""A real Kubernetes control plane on loopback, for integration and end-to-end tests.

etcd, kube-apiserver (TLS, RBAC, service-account tokens), kube-controller-manager,
kube-scheduler and kwok (simulated nodes and pod lifecycle), each a process of its own with
its log in the state dir. Real components rather than API mocks, so that admission, RBAC,
garbage collection, scheduling and OpenAPI behave as on a real cluster.

CLI: ``python -m e2e.cluster up`` (last line ``KUBECONFIG=<path>``) and
``python -m e2e.cluster down``; ``--state-dir`` or ``$VRAMGATE_CLUSTER_DIR`` picks the dir.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from e2e import components as comp
from e2e.build import BuildError, MissingPrerequisite, ensure_binaries
from e2e.certs import CertificateAuthority, CertPair, write_service_account_keys
from e2e.kubeconfig import write_kubeconfig
from e2e.paths import default_cluster_dir
from e2e.procs import (
    PORT_TRIES,
    ManagedProcess,
    free_ports,
    is_running,
    log_tail,
    port_taken,
    read_pidfile,
    start,
    stop,
    stop_all,
    write_pidfile,
)

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
CLIENT_TOOLS = ("kubectl", "helm")
MARKER = ".vramgate-cluster"
PIDFILE = "pids.json"
START_TIMEOUT_S = 90.0
Log = Callable[[str], None]


class ClusterError(Exception):
    """The control plane could not start; the message ends with the failing log's tail."""


class PortTaken(ClusterError):
    """A component could not listen: another program took its port after it was chosen."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Cluster:
    """One local control plane in ``state_dir``; usable as a context manager."""

    def __init__(
        self, state_dir: Path | None = None, *, log: Log = _stderr, die_with_parent: bool = False
    ) -> None:
        """``die_with_parent``: components are killed if this Python process dies (tests);
        off for ``up``, whose processes must outlive the command."""
        self.state_dir = (state_dir or default_cluster_dir()).resolve()
        self.log = log
        self.die_with_parent = die_with_parent
        self.pki_dir = self.state_dir / "pki"
        self.kubeconfig = self.state_dir / "admin.kubeconfig"
        self.ca_path = self.pki_dir / "ca.crt"
        self.admin_cert = CertPair(self.pki_dir / "admin.crt", self.pki_dir / "admin.key")
        self.pidfile = self.state_dir / PIDFILE
        self.processes: list[ManagedProcess] = []
        self.binaries: dict[str, Path] = {}
        self.server = ""
        self._ca: CertificateAuthority | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> Cluster:
        """Build what is missing, then start every component and wait until it serves."""
        started = time.monotonic()
        self.binaries = ensure_binaries((*COMPONENTS, *CLIENT_TOOLS), log=self.log)
        for attempt in range(1, PORT_TRIES + 1):
            self._prepare_state_dir()  # a fresh etcd and PKI for the new ports
            try:
                self._start_components()
                break
            except PortTaken as error:
                self.stop()
                if attempt == PORT_TRIES:
                    raise
                self.log(f"[cluster] {str(error).splitlines()[0]}: starting again")
            except BaseException:
                self.stop()
                raise
        self.log(f"[cluster] ready in {time.monotonic() - started:.1f}s: {self.server}")
        return self

    def stop(self) -> None:
        """Stop exactly the processes this cluster started (also those of a crashed run)."""
        procs = self.processes or read_pidfile(self.pidfile)
        stop_all(procs)
        self.processes = []
        self.pidfile.unlink(missing_ok=True)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _prepare_state_dir(self) -> None:
        running = [p for p in read_pidfile(self.pidfile) if is_running(p)]
        if running:
            pids = ", ".join(f"{p.name}={p.pid}" for p in running)
            raise ClusterError(
                f"a cluster is already running from {self.state_dir} ({pids}); "
                "stop it with `python -m e2e.cluster down` first"
            )
        if self.state_dir.exists() and any(self.state_dir.iterdir()):
            if not (self.state_dir / MARKER).exists():
                raise ClusterError(
                    f"{self.state_dir} is not empty and not a vramgate cluster dir; "
                    "refusing to wipe it"
                )
            shutil.rmtree(self.state_dir)
        self.pki_dir.mkdir(parents=True)
        (self.state_dir / MARKER).write_text("state dir of e2e/cluster.py; wiped on `up`\n")

    def _write_pki(self, ports: comp.Ports) -> tuple[comp.Pki, dict[str, Path]]:
        """CA, serving cert, service-account keys, and one kubeconfig per identity."""
        ca = self._ca = CertificateAuthority(self.pki_dir)
        serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            dns_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ip_addresses=(comp.LOOPBACK, comp.first_service_ip()),
            server=True,
        )
        front_proxy_ca = CertificateAuthority(
            self.pki_dir, "vramgate-front-proxy-ca", stem="front-proxy-ca"
        )
        pki = comp.Pki(
            ca=ca.pair,
            serving=serving,
            service_account=write_service_account_keys(self.pki_dir),
            front_proxy_ca=front_proxy_ca.pair,
            front_proxy_client=front_proxy_ca.issue(
                "front-proxy-client", comp.FRONT_PROXY_CLIENT, client=True
            ),
        )
        self.server = f"https://{comp.LOOPBACK}:{ports.apiserver}"
        identities = {
            # name: (common name, groups); CNs match the built-in RBAC bindings.
            "admin": ("vramgate-admin", ("system:masters",)),
            "controller-manager": ("system:kube-controller-manager", ()),
            "scheduler": ("system:kube-scheduler", ()),
            "kwok": ("kwok-controller", ("system:masters",)),
        }
        kubeconfigs = {}
        for name, (cn, groups) in identities.items():
            pair = ca.issue(name, cn, organizations=groups, client=True)
            path = self.kubeconfig if name == "admin" else self.state_dir / f"{name}.kubeconfig"
            kubeconfigs[name] = write_kubeconfig(path, self.server, ca.pair.cert, pair, cn)
        return pki, kubeconfigs

    def _start_components(self) -> None:
        ports = comp.Ports(*free_ports(5))
        pki, kubeconfigs = self._write_pki(ports)
        scheduler_config = self.state_dir / "scheduler.yaml"
        scheduler_config.write_text(comp.scheduler_config(kubeconfigs["scheduler"]))
        b = self.binaries

        self.launch("etcd", comp.etcd_args(b["etcd"], self.state_dir / "etcd-data", ports))
        self._wait("etcd", lambda: self._etcd_healthy(ports))
        self.launch("kube-apiserver", comp.apiserver_args(b["kube-apiserver"], pki, ports))
        self._wait("kube-apiserver", lambda: self._https_ok(f"{self.server}/readyz"))
        self.launch(
            "kube-controller-manager",
            comp.controller_manager_args(
                b["kube-controller-manager"], pki, ports, kubeconfigs["controller-manager"]
            ),
        )
        self.launch(
            "kube-scheduler",
            comp.scheduler_args(
                b["kube-scheduler"], pki, ports, scheduler_config, kubeconfigs["scheduler"]
            ),
        )
        # KWOK_WORKDIR: otherwise kwok also loads stages from a user's ~/.kwok/kwok.yaml.
        self.launch(
            "kwok",
            comp.kwok_args(b["kwok"], kubeconfigs["kwok"]),
            env={**os.environ, "KWOK_WORKDIR": str(self.state_dir / "kwok")},
        )
        loopback = f"https://{comp.LOOPBACK}"
        self._wait(
            "kube-controller-manager",
            lambda: self._https_ok(f"{loopback}:{ports.controller_manager}/healthz"),
        )
        self._wait(
            "kube-scheduler", lambda: self._https_ok(f"{loopback}:{ports.scheduler}/healthz")
        )
        # The ServiceAccount admission plugin rejects pods until their namespace has a
        # `default` ServiceAccount, which only kube-controller-manager creates.
        self._wait(
            "kube-controller-manager",
            lambda: self._https_ok(
                f"{self.server}/api/v1/namespaces/default/serviceaccounts/default"
            ),
            what="default ServiceAccount",
        )

    def launch(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> ManagedProcess:
        """Start a process as the components are started: its log (``<name>.log``, appended
        to) and command line in the state dir, killed with this Python process under
        ``die_with_parent``, and in the pid file, so that ``stop`` and ``down`` stop it too,
        before the components it needs (e2e/kueue.py starts Kueue so)."""
        log = self.state_dir / f"{name}.log"
        (self.state_dir / f"{name}.cmdline").write_text(" ".join(argv) + "\n")
        proc = start(name, argv, log, self.state_dir, env=env, die_with_parent=self.die_with_parent)
        self.processes.append(proc)
        # Written after every start, so `down` can clean up even a half-started cluster.
        write_pidfile(self.pidfile, self.processes)
        return proc

    def stop_process(self, proc: ManagedProcess) -> None:
        """Stop one process of ``launch`` and drop it from the pid file."""
        stop(proc)
        if proc in self.processes:
            self.processes.remove(proc)
            write_pidfile(self.pidfile, self.processes)

    # -- readiness -------------------------------------------------------------------

    def _wait(
        self, name: str, ready: Callable[[], bool], what: str = "", timeout: float = START_TIMEOUT_S
    ) -> None:
        """Poll ``ready`` until it holds; fail fast, with its log, if a component died."""
        started = time.monotonic()
        deadline = started + timeout
        last_error = ""
        while True:
            for proc in self.processes:
                if not is_running(proc):
                    # Its port was free when chosen (free_ports), and taken when it bound.
                    failed = PortTaken if port_taken(proc.log) else ClusterError
                    raise failed(
                        f"{proc.name} exited during startup; last lines of {proc.log}:\n"
                        f"{log_tail(proc.log)}"
                    )
            try:
                if ready():
                    break
            except (OSError, ssl.SSLError, urllib.error.URLError) as err:
                last_error = str(err)
            if time.monotonic() > deadline:
                log = self.state_dir / f"{name}.log"
                raise ClusterError(
                    f"{what or name} not ready after {timeout:.0f}s ({last_error}); "
                    f"last lines of {log}:\n{log_tail(log)}"
                )
            time.sleep(0.2)
        self.log(f"[cluster] {what or name} ready after {time.monotonic() - started:.1f}s")

    def _etcd_healthy(self, ports: comp.Ports) -> bool:
        url = f"http://{comp.LOOPBACK}:{ports.etcd_client}/health"
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(json.load(resp).get("health") == "true")

    def ssl_context(self) -> ssl.SSLContext:
        """Trusts the cluster CA and presents the admin client certificate."""
        context = ssl.create_default_context(cafile=str(self.ca_path))
        context.load_cert_chain(str(self.admin_cert.cert), str(self.admin_cert.key))
        return context

    def _https_ok(self, url: str) -> bool:
        try:
            with urllib.request.urlopen(url, context=self.ssl_context(), timeout=2) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError:
            return False

    def readyz(self) -> str:
        """Body of the API server's ``/readyz?verbose`` (raises if it is not ready)."""
        url = f"{self.server}/readyz?verbose"
        with urllib.request.urlopen(url, context=self.ssl_context(), timeout=5) as resp:
            return str(resp.read().decode())

    # -- helpers for tests -----------------------------------------------------------

    def env(self) -> dict[str, str]:
        """Environment for kubectl/helm/operator subprocesses that targets this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return self._tool("kubectl", args, stdin)

    def helm(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return self._tool("helm", args, stdin)

    def _tool(
        self, name: str, args: tuple[str, ...], stdin: str | None
    ) -> subprocess.CompletedProcess[str]:
        binary = self.binaries.get(name) or ensure_binaries([name], log=self.log)[name]
        return subprocess.run(
            [str(binary), *args],
            env=self.env(),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def issue_serving_cert(self, stem: str, *extra_dns: str) -> CertPair:
        """A 127.0.0.1 serving cert signed by the cluster CA, e.g. for a webhook server.

        Register the webhook with ``clientConfig.url: https://127.0.0.1:<port>/...`` and
        ``caBundle`` = base64 of ``ca_path``; a Service reference would route to a virtual
        IP that nothing serves here.
        """
        if self._ca is None:
            raise ClusterError("the cluster CA exists only in the process that started it")
        return self._ca.issue_serving(stem, *extra_dns)

    def create_gpu_nodes(
        self,
        count: int,
        gpus_per_node: int = 8,
        product: str = "NVIDIA-H100-80GB-HBM3",
        memory_mib: int = 81559,
        name_prefix: str = "gpu-node",
        timeout: float = 60.0,
    ) -> list[str]:
        """Create kwok-managed GPU nodes and wait until the scheduler may use them."""
        from e2e.nodes import create_gpu_nodes

        return create_gpu_nodes(
            self.kubeconfig,
            count,
            gpus_per_node=gpus_per_node,
            product=product,
            memory_mib=memory_mib,
            name_prefix=name_prefix,
            timeout=timeout,
        )


# -- CLI ---------------------------------------------------------------------------------


def _up(state_dir: Path | None) -> int:
    cluster = Cluster(state_dir)
    try:
        cluster.start()
    except (ClusterError, BuildError) as err:
        print(f"e2e.cluster: {err}", file=sys.stderr)
        return 2 if isinstance(err, MissingPrerequisite) else 1
    _stderr(
        f"[cluster] logs and pids in {cluster.state_dir}; stop with `python -m e2e.cluster down`"
    )
    print(f"KUBECONFIG={cluster.kubeconfig}", flush=True)
    return 0


def _down(state_dir: Path | None) -> int:
    cluster = Cluster(state_dir)
    procs = read_pidfile(cluster.pidfile)
    running = [p for p in procs if is_running(p)]
    cluster.stop()
    _stderr(f"[cluster] stopped {len(running)} process(es) from {cluster.state_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster", description=__doc__)
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="default: $VRAMGATE_CLUSTER_DIR or ~/.cache/vramgate/cluster",
    )
    args = parser.parse_args(argv)
    return _up(args.state_dir) if args.command == "up" else _down(args.state_dir)


if __name__ == "__main__":
    sys.exit(main())
