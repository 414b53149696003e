"""Kueue alone, Kueue with vramgate's AdmissionCheck, vramgate alone and the API server's
write floor, side by side in one run on the local control plane.

    python -m benchmarks.bench_kueue [--jobs 1000] [--nodes 100] [--clients 20]
                                     [--only floor|decisions|kueue|kueue-check]

Targets (design): vramgate alone (`bench_operator`'s decisions) within 1.5 x the floor;
Kueue + the vramgate check within 1.2 x Kueue alone; <= 3 ms of operator CPU per decided job.
Absolute times on a 2-core machine are bound by the API server, so only ratios of runs made
in the same minutes mean anything: one invocation runs every mode, each on a fresh control
plane (`e2e/`), 100 kwok nodes x 8 GPUs with their GPUNodes, and prints one table.

* `kueue`: Kueue (e2e/kueue.py, client QPS 1000 / burst 2000) alone. `--jobs` suspended
  one-GPU batch Jobs, created at once, in a LocalQueue of a ClusterQueue with a GPU quota
  for all of them and no AdmissionCheck; time until every Job's Workload is Admitted (Kueue
  admits on quota alone: all of them, though only 800 pods find a GPU).
* `kueue-check`: the same Jobs (with the `vramgate.dev/finetune` annotation), the ClusterQueue
  listing an AdmissionCheck of controllerName vramgate.dev/vram, the operator running with
  `--kueue-admission-check`; time until every Workload is Admitted or its check decided
  Retry or Rejected (Kueue resets those to Pending at once; the entry's retryCount and its
  message keep what it was). With 800 GPUs, 200 one-GPU jobs wait.
* `decisions` and `floor`: `bench_operator`'s, unchanged (1,000 FineTuneJobs of one or two
  GPUs, webhooks on; and the API server alone taking a decision's writes per job).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from benchmarks import bench_operator
from benchmarks.bench_operator import (
    CRDS,
    PRODUCT,
    DecidedWatch,
    KopfFloor,
    api_requests,
    bench_decisions,
    bench_floor,
    cpu_by_process,
    cpu_spent,
    create_at_once,
    gpu_nodes,
    keep_fresh,
    own_cpu,
    own_cpu_spent,
    own_processes,
)
from controller.admission import kueue as check
from controller.api.base import PRODUCT_LABEL
from e2e.cluster import Cluster
from e2e.kueue import API_VERSION, QUEUE_NAME_LABEL, Kueue
from e2e.nodes import RUN_FOR_ANNOTATION
from e2e.wait import wait_until
from tests.integration.test_operator import OperatorProcess

KUEUE_GROUP, KUEUE_VERSION = API_VERSION.split("/")
GPU = "nvidia.com/gpu"
QUEUE = "bench"
CHECK = "vramgate-vram"
#: What each Job trains, as the check reads it: 11.64 GiB on one GPU (calibrated).
FINETUNE = {"model": {"preset": "llama-3.1-8b"}, "method": "QLoRA", "lora": {"rank": 16}}
TARGETS = {"decisions / floor": 1.5, "kueue-check / kueue": 1.2, "operator ms per job": 3.0}


def batch_job(name: str, with_check: bool) -> dict[str, Any]:
    """A suspended one-GPU batch Job in the LocalQueue, on the benchmark's GPU product; its
    pod runs an hour under kwok once it lands."""
    annotations = {RUN_FOR_ANNOTATION: "3600s"}
    if with_check:
        annotations[check.SPEC_ANNOTATION] = yaml.safe_dump(FINETUNE)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_NAME_LABEL: QUEUE}},
        "spec": {
            "suspend": True, "parallelism": 1, "completions": 1, "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {PRODUCT_LABEL: PRODUCT},
                    "containers": [{"name": "trainer", "image": "trainer:v1",
                                    "resources": {"limits": {GPU: "1"}}}],
                },
            },
        },
    }  # fmt: skip


def entry_decided(entry: dict[str, Any]) -> bool:
    """Whether vramgate's check on a Workload has said Retry or Rejected: the state itself,
    or what Kueue leaves of it when it resets the entry to Pending (its retryCount, its
    message "Reset to Pending after eviction. Previously: Retry")."""
    if entry.get("state") in (check.RETRY, check.REJECTED):
        return True
    said = str(entry.get("message") or "")
    was = said.rsplit("Previously: ", 1)[-1] if "Previously: " in said else ""
    return bool(entry.get("retryCount")) or was in (check.RETRY, check.REJECTED)


def true(workload: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True"
               for c in (workload.get("status") or {}).get("conditions") or [])  # fmt: skip


def admitted(workload: dict[str, Any]) -> bool:
    return true(workload, "Admitted")


#: The stages of a Workload the watch times: seen, quota reserved, vramgate's check answered
#: (any state but Pending, or Pending after a Retry), admitted.
STAGES = ("seen", "reserved", "answered", "admitted")


class WorkloadWatch(DecidedWatch):
    """Workloads admitted (Admitted=True), and those admitted or whose check decided; when
    (monotonic) this client first saw each stage of each (`STAGES`)."""

    resource = (KUEUE_GROUP, KUEUE_VERSION, "workloads")

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.admitted: set[str] = set()
        self.stages: dict[str, dict[str, float]] = {stage: {} for stage in STAGES}
        super().__init__(api, namespace)

    def is_decided(self, obj: dict[str, Any]) -> bool:
        name, now = obj["metadata"]["name"], time.monotonic()
        entries = (obj.get("status") or {}).get("admissionChecks") or []
        answered = any(e.get("name") == CHECK and (e.get("state") != check.PENDING
                       or entry_decided(e)) for e in entries)  # fmt: skip
        for stage, reached in (("seen", True), ("reserved", true(obj, "QuotaReserved")),
                               ("answered", answered), ("admitted", admitted(obj))):  # fmt: skip
            if reached:
                self.stages[stage].setdefault(name, now)
        if admitted(obj):
            self.admitted.add(name)
            return True
        return any(e.get("name") == CHECK and entry_decided(e) for e in entries)

    def timeline(self, began: float) -> dict[str, Any]:
        """For each stage: when the last Workload reached it (s after `began`), and the median
        wait from the stage before, over the Workloads that reached both."""
        out: dict[str, Any] = {}
        before: dict[str, float] = {}
        for stage in STAGES:
            times = self.stages[stage]
            if not times:
                continue
            waits = sorted(t - before[n] for n, t in times.items() if n in before)
            median = round(waits[len(waits) // 2], 2) if waits else None
            out[stage] = {"count": len(times), "last_s": round(max(times.values()) - began, 2),
                          "median_wait_s": median}  # fmt: skip
            before = times
        return out


def queues(api: client.ApiClient, gpus: int, with_check: bool) -> None:
    """A ResourceFlavor, a ClusterQueue of `gpus` GPUs (listing vramgate's check `with_check`)
    and the LocalQueue the Jobs name, in `default`."""
    custom = client.CustomObjectsApi(api)

    def make(kind: str, plural: str, name: str, spec: dict[str, Any]) -> None:
        body = {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name},
                "spec": spec}  # fmt: skip
        custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, body)

    if with_check:
        make("AdmissionCheck", "admissionchecks", CHECK, {"controllerName": check.CONTROLLER})
    make("ResourceFlavor", "resourceflavors", QUEUE, {})
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": [GPU], "flavors": [
            {"name": QUEUE, "resources": [{"name": GPU, "nominalQuota": str(gpus)}]}]}],
    }  # fmt: skip
    if with_check:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": CHECK}]}
    make("ClusterQueue", "clusterqueues", QUEUE, spec)
    custom.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, "default", "localqueues", {
        "apiVersion": API_VERSION, "kind": "LocalQueue",
        "metadata": {"name": QUEUE, "namespace": "default"}, "spec": {"clusterQueue": QUEUE},
    })  # fmt: skip

    def active() -> bool:
        found: Any = custom.get_cluster_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", QUEUE
        )
        return any(c["type"] == "Active" and c["status"] == "True"
                   for c in (found.get("status") or {}).get("conditions") or [])  # fmt: skip

    wait_until(active, timeout=120, interval=0.2, what="the ClusterQueue to be Active")


def bench_kueue(
    jobs: int,
    nodes: int,
    clients: int,
    with_check: bool,
    retry_seconds: int,
    kopf_floor: bool = False,
) -> dict[str, Any]:
    """With `kopf_floor` (and the check), `benchmarks.kopf_floor --kueue` watches beside the
    operator: kopf's own CPU for the same events."""
    mode = "kueue-check" if with_check else "kueue"
    with tempfile.TemporaryDirectory(prefix=f"bench-{mode}-") as tmp:
        cluster = Cluster(Path(tmp) / "cluster")
        cluster.start()
        stop = threading.Event()
        operator: OperatorProcess | None = None
        floor: KopfFloor | None = None
        try:
            cluster.kubectl("apply", "--server-side", "-f", str(CRDS))
            cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
            kueue = Kueue(cluster, frameworks=("batch/job",)).start()
            assert kueue.process is not None
            api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
            names = gpu_nodes(cluster, api, nodes)
            threading.Thread(target=keep_fresh, args=(api, names, stop), daemon=True).start()
            if with_check:
                operator = OperatorProcess(cluster, api, Path(tmp), extra=(
                    "--resync-seconds", "10", "--kueue-admission-check",
                    "--kueue-retry-seconds", str(retry_seconds),
                    *bench_operator.OPERATOR_ARGS))  # fmt: skip
                operator.start(webhook=False)
                if kopf_floor:
                    floor = KopfFloor(cluster, Path(tmp), kueue=True)
            queues(api, jobs, with_check)  # with the check: Active once the operator says so
            time.sleep(3)  # the operator's caches hold the nodes
            bodies = [batch_job(f"j{i:04d}", with_check) for i in range(jobs)]
            more = {"client": os.getpid()}
            if operator is not None and operator.proc is not None:
                more["operator"] = operator.proc.pid
            own = own_processes(cluster, **more)
            own_before = own_cpu(own)
            floor_before = 0.0 if floor is None else floor.cpu_seconds()
            programs_before = cpu_by_process()
            requests_before = api_requests(cluster)
            seen = WorkloadWatch(api, "default")
            began = time.monotonic()
            create_at_once(api, bodies, clients, path="/apis/batch/v1/namespaces/default/jobs")
            created = time.monotonic() - began
            what = "every Workload admitted" + (" or decided" if with_check else "")
            wait_until(lambda: len(seen.decided) == jobs, timeout=900, interval=0.05, what=what)
            total = time.monotonic() - began
            seen.stop()
            timeline = seen.timeline(began)
            own_spent = own_cpu_spent(own_before, own_cpu(own))
            floor_cpu = None if floor is None else round(floor.cpu_seconds() - floor_before, 1)
            programs = cpu_spent(programs_before, cpu_by_process())
            requests = {k: int(v - requests_before.get(k, 0.0))
                        for k, v in api_requests(cluster).items()}  # fmt: skip
            requests = dict(sorted(((k, v) for k, v in requests.items() if v >= 10),
                                   key=lambda x: -x[1]))  # fmt: skip
            if operator is not None:
                log = (Path(tmp) / "operator.log").read_text(errors="replace")
                Path(tempfile.gettempdir(), "bench-kueue-operator.log").write_text(log)
            return {"mode": mode, "jobs": jobs, "nodes": nodes, "clients": clients,
                    "created_s": round(created, 2), "all_decided_s": round(total, 2),
                    "admitted": len(seen.admitted), "decided": len(seen.decided),
                    "timeline": timeline,
                    "operator_cpu_s": own_spent.get("operator", 0.0),
                    **({} if floor_cpu is None else {"kopf_floor_cpu_s": floor_cpu}),
                    "cpu_s_own": own_spent, "cpu_s_by_program": programs,
                    "api_requests": requests}  # fmt: skip
        finally:
            stop.set()
            if floor is not None:
                floor.stop()
            if operator is not None:
                operator.stop()
            cluster.stop()


def row(name: str, result: dict[str, Any]) -> dict[str, Any]:
    """One mode's figures in the table's terms, from whichever benchmark measured it."""
    own = result.get("cpu_s_own") or {}
    decided = result.get("decided", result["jobs"] if name != "floor" else None)
    operator = result.get("operator_cpu_s") if name in ("decisions", "kueue-check") else None
    per_job = round(1000 * operator / decided, 1) if operator and decided else None
    # Everything else on the machine over the run (another developer's tests, the kernel): a
    # large figure says the run's times are not its own.
    machine = sum((result.get("cpu_s_by_program") or {}).values())
    return {
        "mode": name,
        "jobs": result["jobs"],
        "admitted": result.get("admitted"),
        "decided": decided,
        "seconds": result.get("all_decided_s", result.get("all_written_s")),
        "apiserver_cpu_s": own.get("kube-apiserver"),
        "kueue_cpu_s": own.get("kueue"),
        "operator_cpu_s": operator,
        "operator_ms_per_job": per_job,
        "kopf_floor_ms_per_job": (
            round(1000 * result["kopf_floor_cpu_s"] / decided, 1)
            if "kopf_floor_cpu_s" in result and decided
            else None
        ),
        "client_cpu_s": own.get("client"),
        "other_cpu_s": round(machine - sum(own.values()), 1),
    }


def ratios(rows: dict[str, dict[str, Any]]) -> list[tuple[str, float | None, float]]:
    """(what, measured, target) for each target whose modes were run."""
    out: list[tuple[str, float | None, float]] = []

    def ratio(a: str, b: str) -> float | None:
        if a in rows and b in rows and rows[b]["seconds"]:
            return round(rows[a]["seconds"] / rows[b]["seconds"], 2)
        return None

    out.append(("decisions / floor", ratio("decisions", "floor"), TARGETS["decisions / floor"]))
    out.append(("kueue-check / kueue", ratio("kueue-check", "kueue"),
                TARGETS["kueue-check / kueue"]))  # fmt: skip
    for mode in ("decisions", "kueue-check"):
        per_job = rows.get(mode, {}).get("operator_ms_per_job")
        out.append((f"operator ms per job ({mode})", per_job, TARGETS["operator ms per job"]))
    return out


def table(rows: dict[str, dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        return "-" if value is None else str(value)

    head = ["mode", "jobs", "admitted", "decided", "seconds", "API server CPU s", "Kueue CPU s",
            "operator CPU s", "operator ms/job", "kopf floor ms/job", "client CPU s",
            "other CPU s"]  # fmt: skip
    keys = ["mode", "jobs", "admitted", "decided", "seconds", "apiserver_cpu_s", "kueue_cpu_s",
            "operator_cpu_s", "operator_ms_per_job", "kopf_floor_ms_per_job", "client_cpu_s",
            "other_cpu_s"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    lines += ["| " + " | ".join(cell(r[k]) for k in keys) + " |" for r in rows.values()]
    lines += ["", "| ratio | measured | target | met |", "|---|---:|---:|---|"]
    for what, measured, target in ratios(rows):
        met = "-" if measured is None else ("yes" if measured <= target else "no")
        lines.append(f"| {what} | {cell(measured)} | <= {target} | {met} |")
    return "\n".join(lines)


MODES = ("floor", "decisions", "kueue", "kueue-check")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--only", choices=MODES, action="append",
                        help="run this mode (repeat for several; all four by default)")  # fmt: skip
    parser.add_argument("--kueue-retry-seconds", type=int, default=check.DEFAULT_RETRY_SECONDS,
                        help="the operator's wait that Kueue is told with a Retry")  # fmt: skip
    parser.add_argument("--kopf-floor", action="store_true",
                        help="decisions and kueue-check with benchmarks.kopf_floor watching "
                             "beside the operator: kopf's own CPU for the same events")  # fmt: skip
    parser.add_argument("--operator-arg", action="append", default=[],
                        help="pass this flag to the operator too (repeat)")  # fmt: skip
    args = parser.parse_args()
    bench_operator.OPERATOR_ARGS = tuple(args.operator_arg)
    rows: dict[str, dict[str, Any]] = {}
    began = time.monotonic()
    for mode in args.only or MODES:
        if mode == "floor":
            result = bench_floor(args.jobs, args.clients)
        elif mode == "decisions":
            result = bench_decisions(
                args.jobs, args.nodes, args.clients, kopf_floor=args.kopf_floor
            )
        else:
            result = bench_kueue(args.jobs, args.nodes, args.clients, mode == "kueue-check",
                                 args.kueue_retry_seconds, kopf_floor=args.kopf_floor)  # fmt: skip
        print(json.dumps({"mode": mode} | result), flush=True)
        rows[mode] = row(mode, result)
    print(f"\n{args.jobs} jobs, {args.nodes} kwok nodes x 8 GPUs, {args.clients} clients; "
          f"the whole run {time.monotonic() - began:.0f} s\n")  # fmt: skip
    print(table(rows), flush=True)


if __name__ == "__main__":
    main()
