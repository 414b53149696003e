"""A GPU node whose GPUs are not yet reported (its GPUNode deleted and not yet made again by
its agent, or no agent at all) is not absent: it takes no work, counts for what the cluster
can ever hold at the size its Node gives, and messages name it.

The cluster is given as the API serves it (Node and GPUNode dicts) and read by
`controller.admission.cluster.snapshot`, the operator's, the webhook's and `vramgate plan`'s one
path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controller.admission.cluster import ClusterObjects, snapshot
from controller.api import conditions as cond
from controller.base.units import GIB
from controller.decision import AdmissionSettings, Decision, JobRequest, Outcome, decide, plan
from controller.estimator.result import Estimate
from controller.estimator.settings import Parallelism
from controller.packing.inventory import (
    GpuMode,
    NodeGpus,
    PackingSettings,
    Reservation,
    placeable,
)
from controller.packing.view import ClusterView
from tests.unit.builders.packing import est

FSDP, DDP = Parallelism.FSDP, Parallelism.DDP
DRA = PackingSettings(gpu_mode=GpuMode.DRA)


def k8s_node(
    name: str,
    gpus: int | None = 4,
    labels: Mapping[str, str] | None = None,
    cordoned: bool = False,
) -> dict[str, Any]:
    """A Ready Node with `gpus` nvidia.com/gpu (None: no such resource)."""
    resources = {} if gpus is None else {"nvidia.com/gpu": str(gpus)}
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {"unschedulable": cordoned},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def gpunode(name: str, frees: Sequence[float] | None, total: float = 80) -> dict[str, Any]:
    """The GPUNode its agent writes; `frees` None: made again, its status not yet applied."""
    if frees is None:
        return {"kind": "GPUNode", "metadata": {"name": name}}
    gpus = [
        {
            "uuid": f"GPU-{name}-{i}",
            "index": i,
            "product": "H100",
            "totalBytes": int(total * GIB),
            "freeBytes": int(free * GIB),
        }
        for i, free in enumerate(frees)
    ]
    status = {"conditions": [{"type": "Ready", "status": "True"}], "gpus": gpus}
    return {"kind": "GPUNode", "metadata": {"name": name}, "status": status}


def view_of(*objects: dict[str, Any], settings: PackingSettings = DRA) -> ClusterView:
    cluster = ClusterObjects()
    for i, obj in enumerate(objects):
        cluster.add(obj, f"object {i}")
    return ClusterView(snapshot(cluster, None), settings)


def job(estimate: Estimate, gpus: int = 1, parallelism: Parallelism = FSDP) -> JobRequest:
    return JobRequest("ns/j", estimate, parallelism, gpus)


def says(decision: Decision, *parts: str) -> None:
    missing = [part for part in parts if part not in decision.message]
    assert not missing, f"{missing} not in {decision.message!r}"


#: Why such a node takes no work, as messages say it.
NOT_REPORTED = "GPUs not yet reported by its vramgate agent"
H100_LABELS = {"nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.product": "NVIDIA-H100"}


def test_a_gpunode_deleted_does_not_shrink_the_cluster_a_job_that_fits_waits_for_it() -> None:
    """Two 4-GPU nodes; a's GPUNode is deleted (its agent makes it again in a moment): an
    8-GPU job fits the cluster, so it waits, naming a, where it was refused for 4 GPUs."""
    v = view_of(k8s_node("a"), k8s_node("b"), gpunode("b", [80] * 4))
    d = decide(job(est(400), gpus=8), v)
    assert (d.outcome, d.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_NODES)
    assert d.message == (
        "needs 50.00 GiB per GPU on 8 GPUs with FSDP; it may fit now on a, which takes no work "
        f"now ({NOT_REPORTED}, their size unknown), so it waits for it"
    )


def test_a_gpunode_made_again_without_its_status_yet_is_not_yet_reported_either() -> None:
    v = view_of(k8s_node("a"), gpunode("a", None), k8s_node("b"), gpunode("b", [80] * 4))
    d = decide(job(est(400), gpus=8), v)
    assert (d.outcome, d.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_NODES)
    says(d, f"on a, which takes no work now ({NOT_REPORTED}")


def test_a_gpu_node_without_any_gpunode_counts_at_the_size_its_labels_give() -> None:
    """GPU feature discovery's labels say 80 GiB H100s: a job that fits them waits for the
    node; one that no 80 GiB GPU holds is refused with that size."""
    v = view_of(k8s_node("a", labels=H100_LABELS))
    fits = decide(job(est(60)), v)
    assert (fits.outcome, fits.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_NODES)
    says(fits, f"it would fit now on a, which takes no work now ({NOT_REPORTED})")
    assert "size unknown" not in fits.message
    never = decide(job(est(300), gpus=2, parallelism=DDP), v)
    assert (never.outcome, never.reason) == (Outcome.REJECT, cond.REASON_INSUFFICIENT_VRAM)
    says(never, "the largest GPU holds 80.00 GiB usable")
    assert v.select({}).products == ("NVIDIA-H100",)


def test_a_gpu_of_unknown_size_makes_a_job_wait_never_refused() -> None:
    """No label says how large the GPUs are: refusing would claim the job never fits, which
    nobody knows until the agent reports; the job waits for the node, and the message says
    the size is unknown. The largest GPU a message names is one whose size is known."""
    v = view_of(k8s_node("a", labels={"nvidia.com/gpu.present": "true"}))
    d = decide(job(est(500), parallelism=DDP), v)
    assert (d.outcome, d.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_NODES)
    says(d, "it may fit now on a", "their size unknown")
    both = view_of(k8s_node("a"), k8s_node("b"), gpunode("b", [10] * 4, total=24))
    waits = decide(job(est(20)), both)  # b is full now; a would take it, if it fits a
    says(waits, "it may fit now on a")
    largest = both.largest_empty(both.select({}))
    assert largest is not None and largest[:2] == (24 * GIB, "b")


def test_its_gpus_take_no_work_now() -> None:
    """Nothing was read of them: no free memory, no UUID to pin."""
    v = view_of(k8s_node("a", labels=H100_LABELS), k8s_node("b"), gpunode("b", [80]))
    assert [n.name for n in v.now.nodes] == ["b"]
    (a,) = (n for n in v._snapshot.nodes if n.name == "a")
    assert (a.reported, len(a.gpus), a.gpus[0].total_bytes) == (False, 4, 80 * GIB)
    assert placeable(a, None, DRA.heartbeat_ttl) == NOT_REPORTED
    d = decide(job(est(60), gpus=2), v)  # b has one GPU: only a has two
    assert d.outcome is Outcome.QUEUE and not d.placement


def test_a_node_without_gpus_is_not_a_gpu_node() -> None:
    v = view_of(k8s_node("cpu", gpus=None), k8s_node("b"), gpunode("b", [80]))
    assert [n.name for n in v._snapshot.nodes] == ["b"]
    assert v.select({}).gpus == 1


def test_its_gpus_count_for_the_gpus_a_job_may_ask_for() -> None:
    """The GPU count comes from the Node's capacity, its allocatable (0 while the device
    plugin restarts) or GPU feature discovery's count label: the most of them."""
    restarting = k8s_node("a", gpus=8)
    restarting["status"]["allocatable"] = {"nvidia.com/gpu": "0"}
    labelled = k8s_node("c", gpus=None, labels={"nvidia.com/gpu.count": "2"})
    v = view_of(restarting, k8s_node("b"), gpunode("b", [80] * 4), labelled)
    assert v.select({}).gpus == 14
    d = decide(job(est(60), gpus=8), v)  # only a has 8
    assert d.reason == cond.REASON_WAITING_FOR_NODES, d.message
    says(d, "on a, which takes no work now")
    too_many = decide(job(est(100), gpus=16), v)
    assert too_many.reason == cond.REASON_INSUFFICIENT_GPUS
    says(too_many, "the cluster has 14 matching GPUs (with reported memory, or on nodes whose "
         "agent has not reported them yet)")  # fmt: skip


def test_a_waiting_job_names_a_node_not_yet_reported_among_those_that_take_no_work() -> None:
    """A job bigger than a's labelled GPUs waits for memory on b, and says why a is not
    counted."""
    small = {"nvidia.com/gpu.memory": "24576"}
    v = view_of(k8s_node("a", labels=small), k8s_node("b"), gpunode("b", [10] * 4))
    d = decide(job(est(30)), v)
    assert (d.outcome, d.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM)
    says(d, f"(1 matching node takes no work now: a: {NOT_REPORTED})")


def test_what_admitted_jobs_hold_on_it_is_charged_by_gpu_index() -> None:
    """A job admitted on a before its GPUNode went away still holds GPUs 0-2 there: with
    whole GPUs, a 3-GPU job would not fit a now even if it took work, so it waits for
    memory; a 1-GPU job would (GPU 3)."""
    held = Reservation(
        "ns/running", (NodeGpus("a", (0, 1, 2), ("GPU-a-0", "GPU-a-1", "GPU-a-2")),), 70 * GIB
    )
    cluster = ClusterObjects()
    cluster.add(k8s_node("a", labels=H100_LABELS), "a")
    snap = snapshot(cluster, None)
    snap = type(snap)(snap.nodes, (held,), snap.now)
    three = plan(snap, [job(est(150), gpus=3)], AdmissionSettings(packing=DRA))
    assert three[0].reason == cond.REASON_WAITING_FOR_VRAM, three[0].message
    one = plan(snap, [job(est(50))], AdmissionSettings(packing=DRA))
    assert one[0].reason == cond.REASON_WAITING_FOR_NODES, one[0].message
