"""The operator on the real local control plane: decisions, webhook latency, memory.

    python -m benchmarks.bench_operator [--jobs 1000] [--nodes 100] [--webhook-rate 200]
                                        [--memory-gpunodes 5000] [--memory-jobs 10000]

Targets (design): 1,000 FineTuneJobs created at once on 100 kwok nodes x 8 GPUs all decided
(Admitted True or False with a decision reason) in < 10 s; validating and mutating webhook
latency p99, read from the API server's own
`apiserver_admission_webhook_admission_duration_seconds`, <= 1.2 x that of a no-op webhook
served the same way in the same run (`noop_webhook.py`, figures read by `webhook_latency.py`);
operator RSS < 300 MB with 5,000 GPUNodes and 10,000 FineTuneJobs. Each part starts from a
fresh control plane.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes import client, config, watch

from benchmarks import noop_webhook
from benchmarks import webhook_latency as latency
from benchmarks.webhook_latency import Histogram, histograms
from controller.api.base import GROUP, PRODUCT_LABEL, VERSION
from e2e.cluster import Cluster
from e2e.nodes import RUN_FOR_ANNOTATION
from e2e.wait import wait_until
from tests.integration.gpunodes import gpu_status, publish
from tests.integration.test_operator import REPO, OperatorProcess

PLURAL = "finetunejobs"
#: More `vramgate operator` flags for every run (e.g. -v to log each pass's timing).
OPERATOR_ARGS: tuple[str, ...] = ()
PRODUCT = "NVIDIA-H100-80GB-HBM3"
CRDS = Path(__file__).resolve().parents[1] / "charts" / "vramgate" / "crds"
DECIDED = {"Fits", "Resized", "Advised", "WaitingForVRAM", "WaitingForGPUs", "WaitingInQueue",
           "InsufficientVRAM", "NoMatchingGPU", "InsufficientGPUs", "NoTemplate"}  # fmt: skip


def job(name: str, gpus: int = 1, template: bool = True, policy: str = "Enforce") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"preset": "llama-3.1-8b"},
        "method": "QLoRA",
        "admissionPolicy": policy,
        "lora": {"rank": 16},
        "parallelism": "DDP" if gpus > 1 else "FSDP",
        "resources": {"gpus": gpus, "gpuSelector": {PRODUCT_LABEL: PRODUCT}},
    }
    if template:
        spec["template"] = {
            "metadata": {"annotations": {RUN_FOR_ANNOTATION: "3600s"}},
            "spec": {"containers": [{"name": "trainer", "image": "trainer:v1"}]},
        }
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "FineTuneJob",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def in_parallel(work: list[Callable[[], object]], clients: int) -> None:
    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(w) for w in work]:
            future.result()


def _http(api: client.ApiClient) -> tuple[ssl.SSLContext, dict[str, str]]:
    """The TLS context and headers of `api`'s credentials, for an aiohttp session."""
    conf = api.configuration
    context = ssl.create_default_context(cafile=conf.ssl_ca_cert)
    if conf.cert_file:
        context.load_cert_chain(conf.cert_file, conf.key_file)
    headers = {"Content-Type": "application/json"}
    token = conf.get_api_key_with_prefix("authorization")
    if token:
        headers["Authorization"] = token
    return context, headers


def create_at_once(
    api: client.ApiClient,
    bodies: list[dict[str, Any]],
    clients: int,
    rate: float | None = None,
    dry_run: bool = False,
    path: str = f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}",
) -> int:
    """POST every body to `path` (FineTuneJobs unless told) with up to `clients` requests in
    flight (`rate` a second when given), from one asyncio loop: the official client's threads
    cost the benchmark a core's worth of Python on the machine the API server and the operator
    share, and "at once" should not wait for the client. A dry run counts its failures
    (returned); a real one raises."""
    context, headers = _http(api)
    url = f"{api.configuration.host}{path}"
    if dry_run:
        url += "?dryRun=All"
    errors = 0

    async def run() -> None:
        connector = aiohttp.TCPConnector(ssl=context, limit=clients)
        async with aiohttp.ClientSession(connector=connector) as session:
            gate = asyncio.Semaphore(clients)
            began = time.monotonic()

            async def one(i: int, body: dict[str, Any]) -> None:
                nonlocal errors
                if rate is not None:
                    await asyncio.sleep(max(0.0, began + i / rate - time.monotonic()))
                async with gate, session.post(url, data=json.dumps(body), headers=headers) as r:
                    text = await r.text()
                    if r.status == 201:
                        return
                    if not dry_run:
                        raise RuntimeError(f"create {body['metadata']['name']}: {r.status} {text}")
                    errors += 1

            await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))

    asyncio.run(run())
    return errors


def decision_status(name: str) -> dict[str, Any]:
    """A status of the size and shape the operator writes for an admitted job."""
    now = "2026-12-02T00:00:00Z"
    condition = {"lastTransitionTime": now, "observedGeneration": 1, "status": "True"}
    # fmt: off
    return {
        "observedGeneration": 1,
        "conditions": [
            condition | {"type": "Estimated", "reason": "Estimated",
                         "message": "11.64 GiB in total, 11.64 GiB per GPU on 1 GPU with FSDP"},
            condition | {"type": "Admitted", "reason": "Fits",
                         "message": "needs 11.64 GiB per GPU on 1 GPU with FSDP; placed on "
                                    "bench-0 GPU 0, 68.36 GiB left on the tightest GPU it may "
                                    "get (bench-0 GPU 0; in GPU mode devicePlugin the device "
                                    "plugin picks which of the node's free GPUs the pod gets)"},
        ],
        "estimate": {
            "components": {"activations": 3728179599, "allocator_slack": 993447975,
                           "cublas_workspace": 67108864, "cuda_context": 1503238553,
                           "gradients": 0, "optimizer": 335773696, "optimizer_scratch": 0,
                           "weights": 5870526464},
            "gpus": 1, "model": "llama-3.1-8b", "parallelism": "FSDP", "perGpu": "11.64 GiB",
            "perGpuBytes": 12498275151, "profile": "calibrated", "total": "11.64 GiB",
            "totalBytes": 12498275151, "totalParams": 8072204288,
            "trainableParams": 41943040,
        },
        "placement": {
            "admittedGPUs": 1, "perGpuBytes": 12498275151, "requestedGPUs": 1,
            "nodes": [{"node": "bench-0", "gpuIndices": [0], "gpuUUIDs": ["GPU-bench-0-0"]}],
        },
        "workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": name},
    }
    # fmt: on


def bench_floor(jobs: int, clients: int) -> dict[str, Any]:
    """What the API server alone needs for the writes any deciding operator makes per job
    (the create, one status write of a decision's size, one Event), sent as fast as it takes
    them from one client with `clients` in flight: no operator, no webhooks, no workloads.
    The decisions benchmark cannot end sooner on the same machine."""
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as tmp:
        cluster = Cluster(Path(tmp) / "cluster")
        cluster.start()
        try:
            cluster.kubectl("apply", "--server-side", "-f", str(CRDS))
            cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
            api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
            context, headers = _http(api)
            base = f"{api.configuration.host}/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}"
            events = f"{api.configuration.host}/api/v1/namespaces/default/events"
            patch_headers = headers | {"Content-Type": "application/merge-patch+json"}

            async def run() -> None:
                connector = aiohttp.TCPConnector(ssl=context, limit=clients)
                async with aiohttp.ClientSession(connector=connector) as session:
                    gate = asyncio.Semaphore(clients)

                    async def send(method: str, url: str, body: Any, head: dict[str, str]) -> Any:
                        async with session.request(method, url, data=json.dumps(body),
                                                   headers=head) as r:  # fmt: skip
                            if r.status >= 300:
                                raise RuntimeError(f"{method} {url}: {r.status} {await r.text()}")
                            return await r.json()

                    async def one(name: str) -> None:
                        async with gate:
                            made = await send("POST", base, job(name), headers)
                            status = {"status": decision_status(name)}
                            await send("PATCH", f"{base}/{name}/status", status, patch_headers)
                            meta = made["metadata"]
                            await send("POST", events, {
                                "metadata": {"generateName": f"{name}."},
                                "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}",
                                                   "kind": "FineTuneJob", "namespace": "default",
                                                   "name": name, "uid": meta["uid"]},
                                "reason": "Fits", "type": "Normal",
                                "message": "needs 11.64 GiB per GPU on 1 GPU with FSDP",
                                "source": {"component": "vramgate"},
                            }, headers)  # fmt: skip

                    await asyncio.gather(*(one(f"f{i:04d}") for i in range(jobs)))

            own = own_processes(cluster, client=os.getpid())
            own_before = own_cpu(own)
            programs_before = cpu_by_process()
            began = time.monotonic()
            asyncio.run(run())
            elapsed = time.monotonic() - began
            return {"jobs": jobs, "clients": clients, "all_written_s": round(elapsed, 2),
                    "per_second": round(jobs / elapsed, 1),
                    "cpu_s_own": own_cpu_spent(own_before, own_cpu(own)),
                    "cpu_s_by_program": cpu_spent(programs_before, cpu_by_process())}  # fmt: skip
        finally:
            cluster.stop()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (the load-independent share of a run)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_process() -> dict[tuple[int, str, str], float]:
    """CPU seconds so far of every process on the machine, by (pid, start time, name)."""
    out: dict[tuple[int, str, str], float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended meanwhile
            continue
        name, fields = text[text.index("(") + 1 : text.rindex(")")], text.rsplit(")", 1)[1]
        values = fields.split()
        ticks = int(values[11]) + int(values[12])
        out[(int(stat.parent.name), values[19], name)] = ticks / os.sysconf("SC_CLK_TCK")
    return out


def cpu_spent(
    before: dict[tuple[int, str, str], float], after: dict[tuple[int, str, str], float]
) -> dict[str, float]:
    """CPU seconds each program (all its processes) spent between two `cpu_by_process`
    readings, largest first: what the API server, etcd, the controllers, kwok, the operator
    and this client each took of a run on a machine they share. Processes that ended before
    the second reading are not counted."""
    spent: dict[str, float] = {}
    for key, seconds in after.items():
        name = key[2]
        spent[name] = spent.get(name, 0.0) + seconds - before.get(key, 0.0)
    rounded = {n: round(c, 1) for n, c in spent.items() if c >= 0.05}
    return dict(sorted(rounded.items(), key=lambda x: -x[1]))


def own_processes(cluster: Cluster, **more: int) -> dict[str, int]:
    """The pids of this run's own programs by name: the cluster's components (and Kueue, when
    it was started on it), and `more` (the operator, this client). `cpu_by_process` counts a
    program's every process on the machine, another developer's control plane too."""
    return {proc.name: proc.pid for proc in cluster.processes} | more


def own_cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each of `pids` (0 for one that has ended)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            out[name] = cpu_seconds(pid)
        except OSError:
            out[name] = 0.0
    return out


def own_cpu_spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds each of this run's programs spent between two `own_cpu` readings."""
    spent = {name: round(seconds - before.get(name, 0.0), 1) for name, seconds in after.items()}
    return dict(sorted(spent.items(), key=lambda x: -x[1]))


def api_requests(cluster: Cluster) -> dict[str, float]:
    """The API server's requests so far, by "VERB resource[/subresource]" (its own
    `apiserver_request_total`, summed over codes, scopes and clients)."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    out: dict[str, float] = {}
    for m in re.finditer(r"^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m[1]))
        sub = labels.get("subresource", "")
        key = f"{labels['verb']} {labels['resource']}{'/' + sub if sub else ''}"
        out[key] = out.get(key, 0.0) + float(m[2])
    return out


def decided(api: client.ApiClient, namespace: str) -> tuple[int, int]:
    listed = client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL
    )["items"]
    done = 0
    for obj in listed:
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c["type"] == "Admitted" and c["reason"] in DECIDED:
                done += 1
    return done, len(listed)


class DecidedWatch:
    """Counts decided jobs from one watch stream: a LIST of 1,000 jobs every half second cost
    the API server (and this process) more than the operator's own reads. A subclass watches
    another custom resource (`resource`: group, version, plural) and says what is decided."""

    resource: tuple[str, str, str] = (GROUP, VERSION, PLURAL)

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.decided: set[str] = set()
        self._watch = watch.Watch()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        objects = client.CustomObjectsApi(self.api)
        group, version, plural = self.resource
        while not self._stopped.is_set():
            try:  # a watch from scratch replays every job's current state first
                stream = self._watch.stream(
                    objects.list_namespaced_custom_object, group, version, self.namespace,
                    plural, timeout_seconds=900,
                )  # fmt: skip
                for event in stream:
                    self._saw(event)
            except Exception:  # a stream the API server ended: watch again
                time.sleep(0.1)

    def _saw(self, event: dict[str, Any]) -> None:
        obj = event["object"]
        name = obj["metadata"]["name"]
        if event["type"] == "DELETED":
            self.decided.discard(name)
            return
        if self.is_decided(obj):
            self.decided.add(name)

    def is_decided(self, obj: dict[str, Any]) -> bool:
        return any(c["type"] == "Admitted" and c["reason"] in DECIDED
                   for c in (obj.get("status") or {}).get("conditions") or [])  # fmt: skip

    def stop(self) -> None:
        self._stopped.set()
        self._watch.stop()


def start(workdir: Path, webhook: bool) -> tuple[Cluster, client.ApiClient, OperatorProcess]:
    cluster = Cluster(workdir / "cluster")
    cluster.start()
    cluster.kubectl("apply", "--server-side", "-f", str(CRDS))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    extra = ("--resync-seconds", "10", *OPERATOR_ARGS)
    operator = OperatorProcess(cluster, api, workdir, extra=extra)
    operator.start(webhook=webhook)
    return cluster, api, operator


def gpu_nodes(cluster: Cluster, api: client.ApiClient, count: int) -> list[str]:
    names = cluster.create_gpu_nodes(count, name_prefix="bench", timeout=300)
    in_parallel(
        [lambda n=n: publish(api, n, [gpu_status(n, i, 80, None, PRODUCT) for i in range(8)])
         for n in names],
        16,
    )  # fmt: skip
    return names


def keep_fresh(api: client.ApiClient, names: list[str], stop: threading.Event) -> None:
    """Heartbeats every 20 s, as agents write them, until `stop` (a round cut short by the
    control plane stopping under it ends quietly)."""
    while not stop.wait(20):
        for n in names:
            if stop.is_set():
                return
            try:
                publish(api, n, [gpu_status(n, i, 80, None, PRODUCT) for i in range(8)])
            except Exception:
                if stop.is_set():
                    return
                raise


def bench_decisions(
    jobs: int, nodes: int, clients: int, webhook: bool = True, kopf_floor: bool = False
) -> dict[str, Any]:
    """With `kopf_floor`, `benchmarks.kopf_floor` watches beside the operator (the same
    watches, handlers that do nothing): its CPU over the same part is kopf's own share."""
    with tempfile.TemporaryDirectory(prefix="bench-op-") as tmp:
        cluster, api, operator = start(Path(tmp), webhook=webhook)
        stop = threading.Event()
        floor: KopfFloor | None = None
        try:
            if kopf_floor:
                floor = KopfFloor(cluster, Path(tmp))
            names = gpu_nodes(cluster, api, nodes)
            threading.Thread(target=keep_fresh, args=(api, names, stop), daemon=True).start()
            time.sleep(3)  # the operator's caches hold the nodes
            floor_before = 0.0 if floor is None else floor.cpu_seconds()
            objects = client.CustomObjectsApi(api)
            bodies = [job(f"j{i:04d}", gpus=1 + i % 2) for i in range(jobs)]
            assert operator.proc is not None
            cpu_before = cpu_seconds(operator.proc.pid)
            own = own_processes(cluster, operator=operator.proc.pid, client=os.getpid())
            own_before = own_cpu(own)
            programs_before = cpu_by_process()
            requests_before = api_requests(cluster)
            seen = DecidedWatch(api, "default")
            began = time.monotonic()
            create_at_once(api, bodies, clients)
            created = time.monotonic() - began
            wait_until(lambda: len(seen.decided) == jobs, timeout=600, interval=0.05,
                       what="every job decided")  # fmt: skip
            total = time.monotonic() - began
            seen.stop()
            assert decided(api, "default")[0] == jobs, "the watch and a fresh list agree"
            operator_cpu = cpu_seconds(operator.proc.pid) - cpu_before
            floor_cpu = None if floor is None else floor.cpu_seconds() - floor_before
            own_spent = own_cpu_spent(own_before, own_cpu(own))
            programs = cpu_spent(programs_before, cpu_by_process())
            requests = {k: int(v - requests_before.get(k, 0.0))
                        for k, v in api_requests(cluster).items()}  # fmt: skip
            requests = dict(sorted(((k, v) for k, v in requests.items() if v >= 10),
                                   key=lambda x: -x[1]))  # fmt: skip
            admitted = sum(
                1 for obj in objects.list_namespaced_custom_object(
                    GROUP, VERSION, "default", PLURAL)["items"]
                for c in obj["status"]["conditions"]
                if c["type"] == "Admitted" and c["status"] == "True"
            )  # fmt: skip
            log = (Path(tmp) / "operator.log").read_text(errors="replace")
            Path(tempfile.gettempdir(), "bench-operator.log").write_text(log)
            passes = re.findall(r"decided (\d+) jobs in ([0-9.]+) s", log)
            slowest = max((float(t) for _, t in passes), default=0.0)
            return {"jobs": jobs, "nodes": nodes, "clients": clients, "webhook": webhook,
                    "passes": len(passes), "slowest_decide_s": slowest,
                    "created_s": round(created, 2), "all_decided_s": round(total, 2),
                    "decided_after_last_create_s": round(total - created, 2),
                    "operator_cpu_s": round(operator_cpu, 1),
                    "operator_ms_per_job": round(1000 * operator_cpu / jobs, 1),
                    **({} if floor_cpu is None else {
                        "kopf_floor_cpu_s": round(floor_cpu, 1),
                        "kopf_floor_ms_per_job": round(1000 * floor_cpu / jobs, 1)}),
                    "per_second": round(jobs / total, 1), "admitted": admitted,
                    "cpu_s_own": own_spent, "cpu_s_by_program": programs,
                    "api_requests": requests}  # fmt: skip
        finally:
            stop.set()
            if floor is not None:
                floor.stop()
            operator.stop()
            cluster.stop()


def webhook_histograms(cluster: Cluster) -> dict[tuple[str, ...], Histogram]:
    """The API server's webhook latency histograms so far, by webhook name and type."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    return histograms(text, latency.METRIC, ("name", "type"))


def operator_webhook_histogram(port: int) -> dict[tuple[str, ...], Histogram]:
    """The operator's own histogram of its webhook handlers' time (from the request's
    arrival in the handler to its answer): what of the API server's figure is ours."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return histograms(text, "vramgate_webhook_request_duration_seconds", ("webhook",))


class KopfFloor:
    """`benchmarks.kopf_floor` running beside the operator on `cluster` (its output in
    `workdir/kopf-floor.log`): what kopf alone spends on the operator's watches."""

    def __init__(self, cluster: Cluster, workdir: Path, kueue: bool = False) -> None:
        self.log_path = workdir / "kopf-floor.log"
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.kopf_floor", *(["--kueue"] if kueue else [])],
                cwd=REPO, env={**cluster.env(), "PYTHONUNBUFFERED": "1"},
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def cpu_seconds(self) -> float:
        """Its CPU so far; a dead one fails the run (its /proc entry would read as ~0)."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"the kopf floor exited:\n{self.log_path.read_text()[-4000:]}")
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class NoopWebhookProcess:
    """`benchmarks.noop_webhook` in a process of its own, as the operator runs in its own,
    registered under its own configuration names; its output in `workdir/noop-webhook.log`."""

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.cluster, self.workdir = cluster, workdir
        self.log_path = workdir / "noop-webhook.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "benchmarks.noop_webhook",
                "--cert-dir", str(self.workdir / "noop-certs")]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, env={**self.cluster.env(), "PYTHONUNBUFFERED": "1"},
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_until(self._ready, timeout=60, interval=0.2, what="the no-op webhook registered")

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"the no-op webhook exited:\n{self.log_path.read_text()[-4000:]}")
        return f"{noop_webhook.READY} " in self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM: it deletes its configurations."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def bench_webhook(rate: int, seconds: int, nodes: int) -> dict[str, Any]:
    """vramgate's webhooks and a no-op's (`benchmarks.noop_webhook`), both called for each of
    `rate` x `seconds` dry-run creates sent at `rate` a second, timed by the API server."""
    with tempfile.TemporaryDirectory(prefix="bench-hook-") as tmp:
        cluster, api, operator = start(Path(tmp), webhook=True)
        noop = NoopWebhookProcess(cluster, Path(tmp))
        try:
            noop.start()
            gpu_nodes(cluster, api, nodes)
            # Resize: the mutating webhooks' matchConditions let only such a job reach them
            # (it fits as asked, so nothing is rewritten): each create calls all four.
            probes = iter(range(10**6))

            def all_called() -> bool:
                create_at_once(api, [job(f"p{next(probes):05d}", policy="Resize")], 1,
                               dry_run=True)  # fmt: skip
                found = webhook_histograms(cluster)
                try:
                    latency.sides(found, operator.webhook_config, noop_webhook.CONFIG_NAME)
                except ValueError:
                    return False
                return True

            wait_until(all_called, timeout=60, interval=0.5, what="all four webhooks called")
            time.sleep(3)
            before = webhook_histograms(cluster)
            load_before = os.getloadavg()[0]
            bodies = [job(f"w{i:05d}", policy="Resize") for i in range(rate * seconds)]
            began = time.monotonic()
            errors = create_at_once(api, bodies, 16, rate=rate, dry_run=True)
            sent = len(bodies)
            elapsed = time.monotonic() - began
            after = webhook_histograms(cluster)
            result: dict[str, Any] = {"requests": sent, "errors": errors,
                                      "achieved_per_s": round(sent / elapsed, 1),
                                      # The machine's 1-minute load, before and after: a
                                      # shared machine's other work delays both webhooks.
                                      "load_1m": [round(load_before, 2),
                                                  round(os.getloadavg()[0], 2)]}  # fmt: skip
            own = operator_webhook_histogram(operator.metrics_port)
            for (name,), h in own.items():
                result[f"operator_{name}"] = {
                    "p50_ms": round(1000 * h.quantile(0.5), 2),
                    "p99_ms": round(1000 * h.quantile(0.99), 2),
                }
            deltas = {key: h.minus(before.get(key)) for key, h in after.items()}
            found = latency.sides(deltas, operator.webhook_config, noop_webhook.CONFIG_NAME)
            for side in found:
                for who, h in (("vramgate", side.ours), ("noop", side.noop)):
                    result[f"{who}_{side.kind}"] = {
                        "calls": int(h.count),
                        "p50_ms": round(1000 * h.quantile(0.5), 2),
                        "p99_ms": round(1000 * h.quantile(0.99), 2),
                        "mean_ms": round(1000 * h.mean, 2),
                        # The histogram's own buckets: the share of calls within 5 and 25 ms.
                        "within_5ms": round(h.within(0.005), 4),
                        "within_25ms": round(h.within(0.025), 4),
                    }
                result[f"ratio_{side.kind}"] = {
                    "p99": round(side.p99_ratio, 3), "mean": round(side.mean_ratio, 3),
                    "same_bucket": side.same_bucket, "target": latency.TARGET_RATIO,
                }  # fmt: skip
            print(latency.table(found), flush=True)
            return result
        finally:
            noop.stop()
            operator.stop()
            cluster.stop()


MEMORY_WAIT_S = 300.0


def _rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return round(int(re.search(r"VmRSS:\s+(\d+)", status)[1]) / 1024)  # type: ignore[index]


def bench_memory(gpunodes: int, jobs: int) -> dict[str, Any]:
    global OPERATOR_ARGS
    if "-v" not in OPERATOR_ARGS:  # the pass log line this waits for is logged with -v
        OPERATOR_ARGS = (*OPERATOR_ARGS, "-v")
    with tempfile.TemporaryDirectory(prefix="bench-mem-") as tmp:
        cluster, api, operator = start(Path(tmp), webhook=False)
        try:
            objects = client.CustomObjectsApi(api)

            def gpunode(i: int) -> None:
                name = f"mem-{i:05d}"
                objects.create_cluster_custom_object(
                    GROUP,
                    VERSION,
                    "gpunodes",
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "GPUNode",
                        "metadata": {"name": name},
                        "spec": {"nodeName": name},
                    },
                )
                status = {
                    "gpus": [gpu_status(name, g, 80, 40, PRODUCT) for g in range(8)],
                    "gpuCount": 8,
                    "heartbeatTime": "2026-01-01T00:00:00Z",
                }
                objects.patch_cluster_custom_object_status(GROUP, VERSION, "gpunodes", name,
                                                           {"status": status})  # fmt: skip

            in_parallel([lambda i=i: gpunode(i) for i in range(gpunodes)], 16)
            in_parallel(
                [lambda i=i: objects.create_namespaced_custom_object(
                    GROUP, VERSION, "default", PLURAL, job(f"m{i:05d}", template=False))
                 for i in range(jobs)],
                16,
            )  # fmt: skip
            # Memory once the caches hold every object and a pass has decided every job (the
            # status writes of 10,000 decisions take minutes more on this machine; RSS is
            # sampled again at the end of the wait for them, up to --memory-wait seconds).
            wait_until(lambda: f"decided {jobs} jobs" in operator.log_since_start(),
                       timeout=1200, interval=2, what="a pass over every job")  # fmt: skip
            assert operator.proc is not None
            first = _rss(operator.proc.pid)
            deadline = time.monotonic() + MEMORY_WAIT_S
            while time.monotonic() < deadline and decided(api, "default")[0] < jobs:
                time.sleep(5)
            status = Path(f"/proc/{operator.proc.pid}/status").read_text()
            rss_kb = int(re.search(r"VmRSS:\s+(\d+)", status)[1])  # type: ignore[index]
            hwm_kb = int(re.search(r"VmHWM:\s+(\d+)", status)[1])  # type: ignore[index]
            return {"gpunodes": gpunodes, "jobs": jobs, "rss_after_first_pass_mb": first,
                    "decided": decided(api, "default")[0], "rss_mb": round(rss_kb / 1024),
                    "peak_rss_mb": round(hwm_kb / 1024)}  # fmt: skip
        finally:
            operator.stop()
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--webhook-rate", type=int, default=200)
    parser.add_argument("--webhook-seconds", type=int, default=20)
    parser.add_argument("--memory-gpunodes", type=int, default=5000)
    parser.add_argument("--memory-jobs", type=int, default=10000)
    parser.add_argument("--only", choices=["decisions", "webhook", "memory", "floor"])
    parser.add_argument("--no-webhook", action="store_true",
                        help="decisions without the webhooks (creation speed alone)")  # fmt: skip
    parser.add_argument("--kopf-floor", action="store_true",
                        help="decisions with benchmarks.kopf_floor watching beside the "
                             "operator: kopf's own CPU for the same events")  # fmt: skip
    parser.add_argument("--operator-arg", action="append", default=[],
                        help="pass this flag to the operator too (repeat)")  # fmt: skip
    args = parser.parse_args()
    if args.kopf_floor and args.only not in (None, "decisions"):
        parser.error("--kopf-floor: only with the decisions part (no --only, or --only decisions)")
    global OPERATOR_ARGS
    OPERATOR_ARGS = tuple(args.operator_arg)
    results: dict[str, Any] = {}
    if args.only in (None, "decisions"):
        results["decisions"] = bench_decisions(
            args.jobs,
            args.nodes,
            args.clients,
            webhook=not args.no_webhook,
            kopf_floor=args.kopf_floor,
        )
        print(json.dumps(results["decisions"]), flush=True)
    if args.only in (None, "floor"):
        results["floor"] = bench_floor(args.jobs, args.clients)
        print(json.dumps(results["floor"]), flush=True)
    if args.only in (None, "webhook"):
        results["webhook"] = bench_webhook(args.webhook_rate, args.webhook_seconds, 10)
        print(json.dumps(results["webhook"]), flush=True)
    if args.only in (None, "memory"):
        results["memory"] = bench_memory(args.memory_gpunodes, args.memory_jobs)
        print(json.dumps(results["memory"]), flush=True)


if __name__ == "__main__":
    main()
