"""`make demo`: vramgate end to end on this machine, with nothing but its own processes.

The local control plane (e2e.cluster) with kwok nodes shaped like `vramgate plan`'s example
cluster, a node agent per node (`vramgate agent --backend static`, its GPUs in a file), the
operator (`vramgate operator`, webhook included) and a real Prometheus scraping them all,
loaded with the chart's alert rules. The example jobs (e2e/demo-jobs.yaml) are applied and
`kubectl get ftj` shows them admitted, resized, queued and rejected.

Why simulated trainers: kwok runs no containers, so nothing would use GPU memory. While a
trainer pod runs, `Trainers` writes a process for it into its node's static file on each GPU
the operator gave it (the pod's VRAMGATE_GPU_UUIDS), using the share of the estimate named
by the pod annotation `demo.vramgate.dev/uses` (default 0.9); the agents then report per-pod
bytes as NVML would, and the estimator's accuracy shows up in the metrics.

Ctrl-C stops everything it started; `--once` stops after printing (for tests).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from controller.api.base import JOB_LABEL, PRODUCT_LABEL
from controller.base.units import parse_size
from e2e.cluster import Cluster
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
from e2e.prometheus import Prometheus, ScrapeJob
from e2e.wait import wait_until

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_CLUSTER = REPO / "controller" / "examples" / "cluster.yaml"
DEMO_JOBS = Path(__file__).with_name("demo-jobs.yaml")
ALERTS = REPO / "charts" / "vramgate" / "files" / "alerts.yaml"
USES_ANNOTATION = "demo.vramgate.dev/uses"
DEFAULT_USES = 0.9
DECISIONS = {"Fits": "Admit", "Resized": "Resize", "WaitingForVRAM": "Queue",
             "InsufficientVRAM": "Reject"}  # fmt: skip
#: Pids of simulated processes: the agent looks up no /proc for them (podUID is given).
HOST_PID, FIRST_POD_PID = 100, 1000
#: The pod that holds an `allocated: true` GPU of the example cluster (no pod of any job).
HOLDER_UID, HOLDER_PID = "00000000-0000-4000-8000-00000000d0d0", 200


def _log(line: str) -> None:
    print(f"[demo] {line}", file=sys.stderr, flush=True)


# -- simulated GPUs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SimGpu:
    """One GPU of a simulated node; ``other_bytes`` are used by a process outside any pod, or
    by a pod that holds the GPU (``allocated``: the device plugin hands it to no other)."""

    uuid: str
    total_bytes: int
    other_bytes: int = 0
    allocated: bool = False


@dataclass
class SimNode:
    """A kwok node with GPUs of one product, and the static file its agent reads."""

    name: str
    product: str
    gpus: list[SimGpu]
    static_file: Path = Path()
    pods: dict[str, dict[str, int]] = field(default_factory=dict)  # pod uid -> uuid -> bytes

    def render(self) -> str:
        gpus = []
        for index, gpu in enumerate(self.gpus):
            processes: list[dict[str, Any]] = []
            if gpu.allocated:
                processes.append({"pid": HOLDER_PID, "usedBytes": gpu.other_bytes,
                                  "podUID": HOLDER_UID})  # fmt: skip
            elif gpu.other_bytes:
                processes.append({"pid": HOST_PID, "usedBytes": gpu.other_bytes})
            for n, (uid, on) in enumerate(sorted(self.pods.items())):
                if gpu.uuid in on:
                    processes.append({"pid": FIRST_POD_PID + n, "usedBytes": on[gpu.uuid],
                                      "podUID": uid})  # fmt: skip
            used = min(gpu.total_bytes, sum(p["usedBytes"] for p in processes))
            gpus.append({"index": index, "uuid": gpu.uuid, "product": self.product,
                         "totalBytes": gpu.total_bytes, "usedBytes": used,
                         "processes": processes})  # fmt: skip
        return yaml.safe_dump({"gpus": gpus}, sort_keys=False)

    def write(self) -> None:
        """Atomically, so the agent never reads half a file."""
        tmp = self.static_file.with_suffix(".tmp")
        tmp.write_text(self.render())
        tmp.replace(self.static_file)


def example_nodes(path: Path = EXAMPLE_CLUSTER) -> list[SimNode]:
    """The nodes of `vramgate plan`'s example cluster; a GPU's memory not free is in use by
    a process outside vramgate's jobs: a pod's where the GPU is `allocated`, else outside any
    pod."""
    nodes = []
    for entry in yaml.safe_load(path.read_text())["nodes"]:
        spec = entry["gpus"]
        listed = spec if isinstance(spec, list) else [spec] * int(spec.get("count", 1))
        gpus = []
        for i, gpu in enumerate(listed):
            total = parse_size(str(gpu["memory"]))
            free = parse_size(str(gpu.get("free", gpu["memory"])))
            held = bool(gpu.get("allocated", False))
            gpus.append(SimGpu(f"GPU-{entry['name']}-{i}", total, total - free, held))
        nodes.append(SimNode(entry["name"], entry["labels"][PRODUCT_LABEL], gpus))
    return nodes


class Trainers:
    """Keeps each node's static file in step with the trainer pods running on it."""

    def __init__(self, kubeconfig: Path, nodes: Sequence[SimNode], interval_s: float = 1.0):
        self.kubeconfig = kubeconfig
        self.nodes = {node.name: node for node in nodes}
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainers", daemon=True)

    def start(self) -> Trainers:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        try:
            while not self._stop.wait(self.interval_s):
                try:
                    self.sync(client.CoreV1Api(api))
                except Exception as error:
                    _log(f"trainer simulation: {error}")
        finally:
            api.close()

    def sync(self, core: client.CoreV1Api) -> None:
        running: dict[str, dict[str, dict[str, int]]] = {name: {} for name in self.nodes}
        listed: list[Any] = core.list_pod_for_all_namespaces(label_selector=JOB_LABEL).items
        for pod in listed:
            node = self.nodes.get(pod.spec.node_name or "")
            if node is None or pod.status.phase != "Running":
                continue
            usage = pod_usage(pod, {g.uuid for g in node.gpus})
            if usage:
                running[node.name][str(pod.metadata.uid)] = usage
        for name, pods in running.items():
            node = self.nodes[name]
            if pods != node.pods:
                node.pods = pods
                node.write()


def pod_usage(pod: Any, uuids: set[str]) -> dict[str, int]:
    """Bytes a simulated trainer allocates on each of its GPUs on this node."""
    env: dict[str, str] = {}
    for container in pod.spec.containers:
        env.update({e.name: e.value for e in container.env or [] if e.value is not None})
    per_gpu = int(env.get("VRAMGATE_PER_GPU_BYTES", "0"))
    share = float((pod.metadata.annotations or {}).get(USES_ANNOTATION, DEFAULT_USES))
    mine = [u for u in env.get("VRAMGATE_GPU_UUIDS", "").split(",") if u in uuids]
    return {uuid: int(per_gpu * share) for uuid in mine}


# -- processes --------------------------------------------------------------------------------


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


#: The log lines that name the port a metrics server bound (--metrics-port 0).
AGENT_METRICS_AT = re.compile(r"metrics on 127\.0\.0\.1:(\d+),")
OPERATOR_METRICS_AT = re.compile(r"metrics on http://127\.0\.0\.1:(\d+)/metrics")


def logged_port(proc: ManagedProcess, line: re.Pattern[str]) -> int | None:
    """The port `proc` logged it bound (`line`'s group), once it has."""
    try:
        found = line.search(Path(proc.log).read_text(errors="replace"))
    except OSError:
        return None
    return int(found[1]) if found else None


class Processes:
    """The agents and the operator this stack started, stopped in reverse order."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[ManagedProcess] = []

    def launch(self, name: str, argv: list[str], env: Mapping[str, str]) -> ManagedProcess:
        proc = start(name, argv, self.workdir / f"{name}.log", REPO,
                     env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
                     die_with_parent=True)  # fmt: skip
        self.started.append(proc)
        return proc

    def wait(self, proc: ManagedProcess, ready: Any, what: str, timeout: float = 90) -> Any:
        """What `ready` returns once it is truthy; RuntimeError if `proc` exits first."""

        def check() -> Any:
            if not is_running(proc):
                raise RuntimeError(f"{proc.name} exited:\n{log_tail(proc.log)}")
            return ready()

        return wait_until(check, timeout=timeout, what=what, interval=0.2)

    def stop(self) -> None:
        for proc in reversed(self.started):
            stop(proc, timeout=30)
        self.started = []


@dataclass
class Stack:
    """Agents for ``nodes``, the operator and Prometheus against ``cluster``."""

    cluster: Cluster
    workdir: Path
    nodes: list[SimNode]
    operator_args: Sequence[str] = ()
    lease_name: str = "vramgate-demo"
    webhook_config: str = "vramgate-demo.vramgate.dev"
    prometheus_port: int = 0
    agent_ports: dict[str, int] = field(default_factory=dict)
    operator_port: int = 0
    prometheus: Prometheus | None = None
    _exit: ExitStack = field(default_factory=ExitStack)

    def start(self) -> Stack:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        procs = Processes(self.workdir)
        self._exit.callback(procs.stop)
        for node in self.nodes:
            gpus = len(node.gpus)
            mib = node.gpus[0].total_bytes // 2**20
            (made,) = self.cluster.create_gpu_nodes(
                1, gpus_per_node=gpus, product=node.product, memory_mib=mib,
                name_prefix=node.name,
            )  # fmt: skip
            if made != node.name:  # kwok nodes are named <prefix>-<i>
                node.gpus = [SimGpu(f"GPU-{made}-{i}", g.total_bytes, g.other_bytes, g.allocated)
                             for i, g in enumerate(node.gpus)]  # fmt: skip
                node.name = made
            node.static_file = self.workdir / f"gpus-{node.name}.yaml"
            node.write()
        no_proc = self.workdir / "no-proc"
        no_proc.mkdir(exist_ok=True)
        agents = []
        for node in self.nodes:
            # Port 0: the agent binds any free port and logs it (a port chosen free here
            # could be taken by another program before the agent binds it).
            agents.append(procs.launch(f"agent-{node.name}", [
                sys.executable, "-m", "controller.cli", "agent", "--node-name", node.name,
                "--backend", "static", "--static-file", str(node.static_file),
                "--proc-root", str(no_proc), "--kubeconfig", str(self.cluster.kubeconfig),
                "--metrics-address", "127.0.0.1", "--metrics-port", "0",
                "--heartbeat-interval-seconds", "2",
            ], {"VRAMGATE_AGENT_POLL_INTERVAL_SECONDS": "0.5"}))  # fmt: skip
        for node, proc in zip(self.nodes, agents, strict=True):
            port = procs.wait(proc, lambda p=proc: logged_port(p, AGENT_METRICS_AT),
                              f"the agent of {node.name} to log its metrics port")  # fmt: skip
            self.agent_ports[node.name] = port
            url = f"http://127.0.0.1:{port}/metrics"
            procs.wait(proc, lambda url=url: _http_ok(url), f"the agent of {node.name}")
        trainers = Trainers(self.cluster.kubeconfig, self.nodes).start()
        self._exit.callback(trainers.stop)
        for attempt in range(1, PORT_TRIES + 1):
            # kopf's liveness endpoint cannot bind port 0 and say which it got: a port free
            # now, and another start if another program takes it first.
            (liveness,) = free_ports(1)
            operator = procs.launch(f"operator-{attempt}", [
                sys.executable, "-m", "controller.cli", "operator",
                "--webhook", "managed", "--webhook-addr", "127.0.0.1", "--webhook-port", "0",
                "--webhook-config-name", self.webhook_config,
                "--cert-dir", str(self.workdir / "certs"),
                "--lease-name", self.lease_name, "--identity", f"{self.lease_name}-0",
                "--metrics-addr", "127.0.0.1", "--metrics-port", "0",
                "--liveness", f"http://127.0.0.1:{liveness}/healthz",
                *self.operator_args,
            ], self.cluster.env())  # fmt: skip
            try:
                live = f"http://127.0.0.1:{liveness}/healthz"
                procs.wait(operator, lambda url=live: _http_ok(url), "the operator to be live")
                break
            except RuntimeError:  # it exited
                if attempt == PORT_TRIES or not port_taken(operator.log):
                    raise
        self.operator_port = procs.wait(
            operator, lambda: logged_port(operator, OPERATOR_METRICS_AT),
            "the operator to log its metrics port",
        )  # fmt: skip
        self._exit.callback(self._forget_webhooks)
        targets = [f"127.0.0.1:{p}" for p in self.agent_ports.values()]
        self.prometheus = Prometheus(
            self.workdir / "prometheus",
            [ScrapeJob("vramgate-operator", [f"127.0.0.1:{self.operator_port}"],
                       honor_labels=True),
             ScrapeJob("vramgate-agent", targets)],
            rule_files=[ALERTS], port=self.prometheus_port,
        )  # fmt: skip
        self.prometheus.start()
        self._exit.callback(self.prometheus.stop)
        wait_until(self.prometheus.all_up, timeout=60, what="Prometheus to scrape every target")

    def _forget_webhooks(self) -> None:
        """A managed operator removes its webhook configurations at a clean exit; one that
        was killed leaves them, and they would send the API server to a dead port."""
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            self.cluster.kubectl("delete", kind, self.webhook_config, "--ignore-not-found")

    def stop(self) -> None:
        self._exit.close()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the demo ---------------------------------------------------------------------------------


def documents(path: Path = DEMO_JOBS) -> Iterator[dict[str, Any]]:
    yield from (doc for doc in yaml.safe_load_all(path.read_text()) if doc)


def apply_all(cluster: Cluster, docs: Sequence[Mapping[str, Any]]) -> list[str]:
    """`kubectl apply` each document as a user would, one at a time; what kubectl said about
    the FineTuneJobs (warnings and refusals included)."""
    said = []
    for doc in docs:
        done = None

        def applied(doc: Mapping[str, Any] = doc) -> bool:
            nonlocal done
            done = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(doc))
            # Right after start the API server may still be learning the webhook's view.
            return done.returncode == 0 or "refused" in done.stderr or "denied" in done.stderr

        wait_until(applied, timeout=60, what=f"kubectl apply of {doc['metadata']['name']}")
        assert done is not None
        if doc["kind"] == "FineTuneJob":
            said.append((done.stdout + done.stderr).strip())
    return said


def get_ftj(cluster: Cluster) -> str:
    return cluster.kubectl("get", "ftj", "-A").stdout


def messages(cluster: Cluster) -> dict[str, str]:
    """Each job's Admitted message: the numbers behind its decision."""
    listed = json.loads(cluster.kubectl("get", "ftj", "-A", "-o", "json").stdout or "{}")
    return {
        item["metadata"]["name"]: cond.get("message", "")
        for item in listed.get("items", [])
        for cond in (item.get("status") or {}).get("conditions") or []
        if cond["type"] == "Admitted"
    }


def reasons(cluster: Cluster) -> dict[str, str]:
    listed = json.loads(cluster.kubectl("get", "ftj", "-A", "-o", "json").stdout or "{}")
    found = {}
    for item in listed.get("items", []):
        for cond in (item.get("status") or {}).get("conditions") or []:
            if cond["type"] == "Admitted" and cond.get("reason") in DECISIONS:
                found[item["metadata"]["name"]] = cond["reason"]
    return found


def _port_or_any(port: int) -> int:
    """`port` if it is free on 127.0.0.1 (a stable URL to bookmark), else 0: any."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return 0
    return port


def run(once: bool, state_dir: Path | None, prometheus_port: int) -> int:
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vramgate-demo-")))
        cluster = Cluster(state_dir or workdir / "cluster", die_with_parent=True, log=_log)
        stack.callback(cluster.stop)
        cluster.start()
        crds = cluster.kubectl("apply", "--server-side", "-f", str(REPO / "charts" / "vramgate"
                                                                     / "crds"))  # fmt: skip
        if crds.returncode != 0:
            raise RuntimeError(crds.stderr)
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        wait_until(lambda: cluster.kubectl("get", "ftj", "-A").returncode == 0, timeout=30,
                   what="FineTuneJobs in discovery")  # fmt: skip
        nodes = example_nodes()
        port = _port_or_any(prometheus_port)
        demo = Stack(cluster, workdir / "stack", nodes, prometheus_port=port)
        _log("starting agents, the operator and Prometheus")
        stack.enter_context(demo)
        docs = list(documents())
        apply_all(cluster, [d for d in docs if d["kind"] == "Namespace"])
        refused = next(d for d in docs if d["metadata"]["name"] == "llama-405b-preset")
        # Until the operator's first pass the webhook has no view of the GPUs and lets every
        # job through; a user would apply a moment later.
        wait_until(lambda: "denied" in cluster.kubectl(
            "apply", "--dry-run=server", "-f", "-", stdin=json.dumps(refused)).stderr,
            timeout=60, what="the webhook to know the GPUs")  # fmt: skip
        for said in apply_all(cluster, [d for d in docs if d["kind"] != "Namespace"]):
            print(said, flush=True)
        wait_until(lambda: len(set(reasons(cluster).values())) == len(DECISIONS), timeout=120,
                   what="admit, resize, queue and reject in kubectl get ftj")  # fmt: skip
        print(f"\n$ kubectl get ftj -A\n{get_ftj(cluster)}", flush=True)
        for name, message in messages(cluster).items():
            print(f"{name}: {message}", flush=True)
        assert demo.prometheus is not None
        print(
            f"Prometheus: {demo.prometheus.url}  (try vramgate_job_predicted_bytes, "
            "vramgate_pending_jobs, vramgate_decisions_total)",
            flush=True,
        )
        print(f"KUBECONFIG={cluster.kubeconfig}", flush=True)
        if once:
            return 0
        print("Ctrl-C stops everything the demo started.", flush=True)
        stopped = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
        # Also where SIGINT came ignored (started in the background by a script's `&`).
        signal.signal(signal.SIGINT, lambda *_: stopped.set())
        with suppress(KeyboardInterrupt):
            stopped.wait()
        _log("stopping")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="stop everything after printing `kubectl get ftj` (tests)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="the control plane's state dir (default: a temp dir)",
    )
    parser.add_argument(
        "--prometheus-port",
        type=int,
        default=9090,
        help="Prometheus' port on 127.0.0.1 (0: any free port)",
    )
    args = parser.parse_args(argv)
    return run(args.once, args.state_dir, args.prometheus_port)


if __name__ == "__main__":
    sys.exit(main())
