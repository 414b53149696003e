"""Admission decisions: Admit, Resize, Queue, Reject and Advise for one job, and plan's queue.

Estimates are built by hand (see test_packing.py): FSDP needs `S // n + R` per GPU at n GPUs,
DDP `S + R` on every GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from controller.api import conditions as cond
from controller.api.enums import AdmissionPolicy
from controller.base.units import GIB
from controller.decision import (
    AdmissionSettings,
    Decision,
    JobRequest,
    Outcome,
    QueueingStrategy,
    decide,
    plan,
    plan_on,
    queue_order,
)
from controller.decision.decide import resize_counts
from controller.estimator.settings import Parallelism
from controller.packing.inventory import (
    GpuMode,
    NodeGpus,
    NodeState,
    PackingSettings,
    Reservation,
    Snapshot,
)
from controller.packing.view import ClusterView
from tests.unit.builders.decision import EXCLUSIVE, job, says
from tests.unit.builders.packing import NOW, SHARED, SPANS, est, gpu, node, reservation, view

FSDP, DDP, DEVICE_MAP = Parallelism.FSDP, Parallelism.DDP, Parallelism.DEVICE_MAP
ENFORCE, RESIZE, ADVISE = AdmissionPolicy.ENFORCE, AdmissionPolicy.RESIZE, AdmissionPolicy.ADVISE


def where(decision: Decision) -> list[tuple[str, tuple[int, ...]]]:
    return [(part.node, part.indices) for part in decision.placement]


def run(
    nodes: Sequence[NodeState],
    jobs: Sequence[JobRequest],
    reservations: Sequence[Reservation] = (),
    now: datetime | None = None,
    **settings: object,
) -> dict[str, Decision]:
    packing = settings.pop("packing", SHARED)
    admission = AdmissionSettings(packing=packing, **settings)  # type: ignore[arg-type]
    decisions = plan(Snapshot(tuple(nodes), tuple(reservations), now), jobs, admission)
    return {d.job.removeprefix("ns/"): d for d in decisions}


# -- Admit -------------------------------------------------------------------------------------


def test_a_job_that_fits_now_is_admitted_with_its_place_and_what_is_left() -> None:
    d = decide(job("j", est(20)), view(node("a", [80, 30])))
    assert (d.outcome, d.reason, d.admitted) == (Outcome.ADMIT, cond.REASON_FITS, True)
    assert d.placement == (NodeGpus("a", (1,), ("a-1",)),)
    assert (d.requested_gpus, d.admitted_gpus, d.per_gpu_bytes) == (1, 1, 20 * GIB)
    says(d, "20.00 GiB per GPU on 1 GPU with FSDP", "a GPU 1", "10.00 GiB left")
    assert d.warnings == ()


def test_a_multi_node_admission_names_its_nodes() -> None:
    v = view(node("a", [40, 40]), node("b", [35, 35]), settings=SPANS)
    d = decide(job("j", est(80, 10), gpus=4), v)
    assert d.outcome is Outcome.ADMIT
    assert sorted(where(d)) == [("a", (0, 1)), ("b", (0, 1))]
    says(d, "30.00 GiB per GPU on 4 GPUs with FSDP", "2 nodes x 2 GPUs (", "5.00 GiB left")
    assert "(a, b)" in d.message or "(b, a)" in d.message


# -- Resize ----------------------------------------------------------------------------------


def test_resize_counts_go_nearest_the_request_first_ties_to_the_larger() -> None:
    assert list(resize_counts(4, 1, 8)) == [4, 5, 3, 6, 2, 7, 1, 8]
    assert list(resize_counts(4, 3, 4)) == [4, 3]
    assert list(resize_counts(1, 1, 1)) == [1]
    assert list(resize_counts(8, 1, 4)) == [4, 3, 2, 1]  # a request above the bound
    assert list(resize_counts(2, 1, 5)) == [2, 3, 1, 4, 5]


def test_resize_goes_down_to_the_nearest_count_that_fits_now() -> None:
    # DDP: 30 GiB on every GPU; two of the four GPUs are nearly full, so 4 and 3 do not fit.
    nodes = [node("a", [80, 80, 5, 5])]
    d = decide(job("j", est(30), gpus=4, parallelism=DDP, policy=RESIZE), view(*nodes))
    assert (d.outcome, d.reason, d.admitted) == (Outcome.RESIZE, cond.REASON_RESIZED, True)
    assert (d.requested_gpus, d.admitted_gpus, d.per_gpu_bytes) == (4, 2, 30 * GIB)
    assert where(d) == [("a", (0, 1))]
    says(d, "resized 4 -> 2 GPUs (policy Resize)", "30.00 GiB per GPU on 2 GPUs with DDP")
    says(d, "a GPUs 0, 1", "50.00 GiB left")
    # The same job under Enforce waits for its 4 GPUs.
    enforce = decide(job("j", est(30), gpus=4, parallelism=DDP), view(*nodes))
    assert (enforce.outcome, enforce.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM)


def test_resize_goes_up_when_more_fsdp_shards_fit_where_fewer_do_not() -> None:
    # FSDP 120 GiB: 60 per GPU at 2, 40 at 3; the four GPUs have 45 free each.
    d = decide(job("j", est(120), gpus=2, policy=RESIZE), view(node("a", [45] * 4)))
    assert (d.outcome, d.admitted_gpus, d.per_gpu_bytes) == (Outcome.RESIZE, 3, 40 * GIB)
    says(d, "resized 2 -> 3 GPUs", "40.00 GiB per GPU on 3 GPUs with FSDP")


def test_resize_prefers_the_larger_of_two_equally_near_counts() -> None:
    # DDP on two 3-GPU nodes: 5 GPUs have no shape (5 nodes x 1), 4 (2 x 2) and 6 (2 x 3) do.
    v = view(node("a", [80] * 3), node("b", [80] * 3), settings=SPANS)
    d = decide(job("j", est(10), gpus=5, parallelism=DDP, policy=RESIZE), v)
    assert (d.outcome, d.admitted_gpus) == (Outcome.RESIZE, 6)
    assert sorted(where(d)) == [("a", (0, 1, 2)), ("b", (0, 1, 2))]
    bounded = job("j", est(10), gpus=5, parallelism=DDP, policy=RESIZE, max_gpus=5)
    assert decide(bounded, v).admitted_gpus == 4


def test_resize_stays_within_min_and_max_gpus() -> None:
    nodes = [node("a", [80, 80, 5, 5])]
    bounded = job("j", est(30), gpus=4, parallelism=DDP, policy=RESIZE, min_gpus=3)
    d = decide(bounded, view(*nodes))
    assert (d.outcome, d.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM)
    up = job("j", est(120), gpus=2, policy=RESIZE, max_gpus=2)
    d = decide(up, view(node("a", [45] * 4)))
    assert (d.outcome, d.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM)


def test_a_resize_job_that_fits_at_its_request_is_simply_admitted() -> None:
    d = decide(job("j", est(20), gpus=1, policy=RESIZE), view(node("a", [80, 80])))
    assert (d.outcome, d.reason, d.admitted_gpus) == (Outcome.ADMIT, cond.REASON_FITS, 1)


# -- Queue -------------------------------------------------------------------------------------


def test_a_job_that_fits_the_empty_cluster_but_not_its_free_memory_waits_for_vram() -> None:
    d = decide(job("j", est(30)), view(node("a", [10], total=80)))
    assert (d.outcome, d.reason, d.admitted) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM, False)
    assert d.placement == () and d.admitted_gpus is None and d.per_gpu_bytes == 30 * GIB
    says(
        d,
        "30.00 GiB per GPU on 1 GPU with FSDP",
        "the most free GPU has 10.00 GiB (a GPU 0)",
        "the cluster's largest holds 80.00 GiB usable",
        "waits",
    )


def test_a_job_waiting_for_more_gpus_says_how_many_hold_it_not_the_most_free() -> None:
    """The most free GPU holds the per-GPU need: what blocks is how many do, or where."""
    d = decide(job("j", est(30), gpus=2, parallelism=DDP), view(node("a", [80, 10])))
    assert (d.outcome, d.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM)
    says(d, "30.00 GiB per GPU on 2 GPUs with DDP",
         "only 1 of the matching GPUs that take work has 30.00 GiB free now")  # fmt: skip
    assert "most free GPU" not in d.message and "placement" not in d.message
    apart = view(node("a", [80, 10]), node("b", [80, 10]))  # visibleDevices: one node per job
    d = decide(job("j", est(30), gpus=2, parallelism=DDP), apart)
    assert (d.outcome, d.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM)
    says(d, "2 or more matching GPUs that take work have 30.00 GiB free now, but no 2 of them "
         "in a placement it can use (all on one node)")  # fmt: skip
    spans = view(node("a", [80, 80, 10]), node("b", [80, 10, 10]), settings=SPANS)
    d = decide(job("j", est(30), gpus=3, parallelism=DDP), spans)
    assert (d.outcome, d.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM)
    says(d, "3 or more matching GPUs that take work have 30.00 GiB free now, but no 3 of them "
         "in a placement it can use (k nodes x g GPUs, the same g on every node)")  # fmt: skip
    # Device plugin: a GPU allocated to another pod takes no work, whatever its free memory.
    held = tuple(gpu("a", i, 60, pods={f"p{i}": 20}) for i in range(3))
    busy = view(NodeState("a", (*held, gpu("a", 3, 80)), gpu_allocatable=4, gpu_allocated=3),
                settings=EXCLUSIVE)  # fmt: skip
    d = decide(job("j", est(30), gpus=2, parallelism=DDP), busy)
    assert (d.outcome, d.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM)
    says(d, "only 1 of the matching GPUs that take work is on nodes whose free GPUs all have "
         "30.00 GiB free now (in GPU mode devicePlugin the device plugin picks which of a "
         "node's free GPUs a pod gets)")  # fmt: skip
    # Pods hold three GPUs, but which ones their processes do not show yet: the one left may
    # be GPU 3, of 10 GiB, so that is all the node promises.
    unseen = view(node("a", [80, 80, 80, 10], gpu_allocatable=4, gpu_allocated=3),
                  settings=EXCLUSIVE)  # fmt: skip
    d = decide(job("j", est(30), gpus=2, parallelism=DDP), unseen)
    assert (d.outcome, d.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM)
    says(d, "the device plugin picks which of a node's free GPUs a pod gets, and the best "
         "node's least free one has 10.00 GiB (a GPU 3)")  # fmt: skip


def test_a_job_that_fits_only_a_node_taking_no_work_waits_for_that_node_not_for_memory() -> None:
    """Freeing memory elsewhere would not admit it; the node taking work would."""
    v = view(node("a", [80], ready=False), node("b", [24], total=24))
    d = decide(job("j", est(30)), v)
    assert (d.outcome, d.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_NODES)
    assert d.message == (
        "needs 30.00 GiB per GPU on 1 GPU with FSDP; it would fit now on a, which takes no "
        "work now (node not Ready), so it waits for it"
    )
    alone = decide(job("j", est(30)), view(node("a", [80], cordoned=True)))
    assert (alone.outcome, alone.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_NODES)
    says(alone, "would fit now on a, which takes no work now (node cordoned)")


def test_a_job_that_would_not_fit_the_resting_nodes_either_waits_for_memory() -> None:
    """The cordoned node is as full as the others: the job waits for memory, and its message
    still says why that node is not counted."""
    v = view(node("a", [10], cordoned=True), node("b", [24], total=24))
    d = decide(job("j", est(30)), v)
    assert (d.outcome, d.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM)
    says(d, "the most free GPU has 24.00 GiB (b GPU 0)", "the cluster's largest holds 80.00 GiB")
    says(d, "(1 matching node takes no work now: a: node cordoned)", "so it waits for memory")


def test_a_job_waiting_for_several_nodes_names_each_and_why() -> None:
    # FSDP 120 at 2 GPUs: 60 each; a (stale) and b (cordoned) hold 60 each only together.
    stale = NOW - timedelta(seconds=120)
    v = view(
        node("a", [70], heartbeat=stale), node("b", [70], cordoned=True, heartbeat=NOW),
        node("c", [30], heartbeat=NOW), now=NOW, settings=SPANS,
    )  # fmt: skip
    d = decide(job("j", est(120), gpus=2), v)
    assert (d.outcome, d.reason, d.per_gpu_bytes) == (
        Outcome.QUEUE,
        cond.REASON_WAITING_FOR_NODES,
        60 * GIB,
    )
    says(d, "it would fit now on 2 nodes that take no work now (a: agent heartbeat stale; "
         "b: node cordoned), so it waits for them")  # fmt: skip


def test_a_resize_job_waiting_for_a_node_says_at_which_count() -> None:
    # FSDP 100: 100 on 1 GPU, 50 at 2. The cordoned node's two GPUs hold 50 each.
    j = job("j", est(100), gpus=1, policy=RESIZE)
    d = decide(j, view(node("a", [60, 60], cordoned=True), node("b", [20])))
    assert (d.outcome, d.reason, d.per_gpu_bytes) == (
        Outcome.QUEUE,
        cond.REASON_WAITING_FOR_NODES,
        50 * GIB,
    )
    says(d, "needs 50.00 GiB per GPU on 2 GPUs with FSDP (policy Resize: the count nearest 1 "
         "there); it would fit now on a")  # fmt: skip


def test_what_this_pass_admitted_is_charged_to_the_resting_nodes_view_too() -> None:
    """After `first` takes 25 of b's 30 GiB, `second` (20) fits neither b nor the cordoned
    a (10): it waits for memory, whether the view of the cluster as if every node took work
    was built before the admission (then charged with it) or after it."""
    jobs = [job("first", est(25)), job("second", est(20))]
    v = view(node("a", [10], cordoned=True), node("b", [30]))
    d = plan_on(v, jobs, AdmissionSettings(), None)
    assert [x.reason for x in d] == [cond.REASON_FITS, cond.REASON_WAITING_FOR_VRAM]
    v = view(node("a", [10], cordoned=True), node("b", [30]))
    assert decide(job("probe", est(35)), v).reason == cond.REASON_WAITING_FOR_VRAM
    assert "resting" in v.__dict__  # built by the probe's decision
    d = plan_on(v, jobs, AdmissionSettings(), None)
    assert [x.reason for x in d] == [cond.REASON_FITS, cond.REASON_WAITING_FOR_VRAM]


def test_a_waiting_job_says_which_nodes_are_not_counted_and_why() -> None:
    """`kubectl get gpunodes` shows a silent agent's last free memory: the message says why
    it is not the most free GPU here."""
    stale = NOW - timedelta(seconds=120)
    v = view(
        node("a", [20], heartbeat=stale), node("b", [20], heartbeat=stale),
        node("c", [20], heartbeat=stale), node("d", [20], heartbeat=stale),
        node("e", [24], total=24, heartbeat=NOW), now=NOW,
    )  # fmt: skip
    d = decide(job("j", est(30)), v)
    says(
        d,
        "the most free GPU has 24.00 GiB (e GPU 0) (4 matching nodes take no work now: "
        "a: agent heartbeat stale; b: agent heartbeat stale; c: agent heartbeat stale; ...)",
    )
    fresh = decide(job("j", est(30)), view(node("a", [20], heartbeat=NOW), now=NOW))
    assert "no work now" not in fresh.message


def test_a_resize_job_waits_at_the_nearest_count_that_fits_the_empty_cluster() -> None:
    # FSDP 150 + 10: 160 on 1, 85 at 2, 60 at 3; three 80 GiB GPUs with 10 free each.
    j = job("j", est(150, 10), gpus=1, policy=RESIZE)
    d = decide(j, view(node("a", [10, 10, 10])))
    assert (d.outcome, d.reason, d.per_gpu_bytes) == (
        Outcome.QUEUE,
        cond.REASON_WAITING_FOR_VRAM,
        60 * GIB,
    )
    says(d, "60.00 GiB per GPU on 3 GPUs with FSDP", "80.00 GiB usable")


# -- Reject ------------------------------------------------------------------------------------


def test_a_job_that_never_fits_even_the_empty_cluster_is_rejected_with_the_largest_gpu() -> None:
    v = view(node("a", [10, 10]), node("b", [24, 24], total=24))
    d = decide(job("j", est(90, 10), gpus=2, parallelism=DDP), v)
    assert (d.outcome, d.reason, d.admitted) == (
        Outcome.REJECT,
        cond.REASON_INSUFFICIENT_VRAM,
        False,
    )
    assert d.per_gpu_bytes == 100 * GIB and d.placement == ()
    says(d, "100.00 GiB per GPU on 2 GPUs with DDP", "the largest GPU holds 80.00 GiB usable")
    says(d, "even when the cluster is empty")


def test_the_largest_usable_gpu_in_a_rejection_is_after_headroom() -> None:
    packing = PackingSettings(headroom_percent=5, gpu_mode=GpuMode.VISIBLE_DEVICES)
    v = view(node("a", [80]), settings=packing)
    d = decide(job("j", est(77), parallelism=DDP), v)
    assert d.outcome is Outcome.REJECT
    says(d, "77.00 GiB per GPU", "the largest GPU holds 76.00 GiB usable")


def test_an_enforced_job_that_would_fit_at_another_count_is_told_which() -> None:
    # FSDP 150 + 10: 160 on 1, 85 at 2, 60 at 3, 47.5 at 4; four 80 GiB GPUs.
    d = decide(job("j", est(150, 10), gpus=1), view(node("a", [80] * 4)))
    assert (d.outcome, d.reason) == (Outcome.REJECT, cond.REASON_INSUFFICIENT_VRAM)
    says(d, "needs 3 GPUs with FSDP (60.00 GiB each)", "requested 1", "policy Enforce")
    says(d, "spec.resources.gpus to 3", "Resize")


def test_a_resize_job_no_count_of_which_ever_fits_is_rejected_with_its_range() -> None:
    d = decide(
        job("j", est(100), gpus=1, parallelism=DDP, policy=RESIZE), view(node("a", [80, 80]))
    )
    assert (d.outcome, d.reason) == (Outcome.REJECT, cond.REASON_INSUFFICIENT_VRAM)
    says(d, "[1, 2]", "even when the cluster is empty", "100.00 GiB per GPU on 2 GPUs with DDP")
    says(d, "the largest GPU holds 80.00 GiB usable")


def test_a_selector_that_matches_no_node_is_rejected_naming_the_clusters_gpus() -> None:
    v = view(
        node("a", [24], total=24, product="NVIDIA-L4", labels={"gpu": "l4"}),
        node("b", [80], product="NVIDIA-H100", labels={"gpu": "h100"}),
    )
    d = decide(job("j", est(10), selector={"gpu": "a100"}), v)
    assert (d.outcome, d.reason) == (Outcome.REJECT, cond.REASON_NO_MATCHING_GPU)
    says(d, "spec.resources.gpuSelector {gpu=a100}", "NVIDIA-H100, NVIDIA-L4")


def test_a_cluster_without_reported_gpus_matches_nothing() -> None:
    blind = NodeState("a", (gpu("a", 0, None, total=None),))
    for v in (view(), view(blind)):
        d = decide(job("j", est(10)), v)
        assert (d.outcome, d.reason) == (Outcome.REJECT, cond.REASON_NO_MATCHING_GPU)
        says(d, "no GPU node has reported its GPUs")


def test_fewer_matching_gpus_than_requested_is_rejected_as_insufficient_gpus() -> None:
    v = view(node("a", [80, 80], labels={"pool": "x"}), node("b", [80, 80], labels={"pool": "y"}))
    d = decide(job("j", est(10), gpus=8), v)
    assert (d.outcome, d.reason) == (Outcome.REJECT, cond.REASON_INSUFFICIENT_GPUS)
    says(d, "requests 8 GPUs", "the cluster has 4 matching GPUs")
    narrowed = decide(job("j", est(10), gpus=3, selector={"pool": "x"}), v)
    assert narrowed.reason == cond.REASON_INSUFFICIENT_GPUS
    says(narrowed, "requests 3 GPUs", "the cluster has 2 matching GPUs")
    resize = decide(job("j", est(10), gpus=5, policy=RESIZE, min_gpus=5), v)
    assert resize.reason == cond.REASON_INSUFFICIENT_GPUS
    advise = decide(job("j", est(10), gpus=5, policy=ADVISE), v)
    assert advise.reason == cond.REASON_INSUFFICIENT_GPUS


def test_a_selector_confines_placement_and_the_numbers_to_matching_nodes() -> None:
    v = view(
        node("a", [30], labels={"pool": "x"}),
        node("b", [24], total=24, labels={"pool": "y"}),
    )
    d = decide(job("j", est(20), selector={"pool": "y"}), v)
    assert where(d) == [("b", (0,))]
    big = decide(job("j", est(25), parallelism=DDP, selector={"pool": "y"}), v)
    assert (big.outcome, big.reason) == (Outcome.REJECT, cond.REASON_INSUFFICIENT_VRAM)
    says(big, "25.00 GiB per GPU", "the largest GPU holds 24.00 GiB usable")


# -- Advise ------------------------------------------------------------------------------------


def test_advise_admits_by_gpu_count_on_the_most_free_gpus_and_warns() -> None:
    d = decide(
        job("j", est(100), gpus=2, parallelism=DDP, policy=ADVISE), view(node("a", [30, 80, 70]))
    )
    assert (d.outcome, d.reason, d.admitted) == (Outcome.ADMIT, cond.REASON_ADVISED, True)
    assert (d.admitted_gpus, d.per_gpu_bytes) == (2, 100 * GIB)
    assert where(d) == [("a", (1, 2))]
    says(d, "policy Advise", "a GPUs 1, 2", "100.00 GiB per GPU on 2 GPUs with DDP")
    says(d, "70.00 GiB free", "out of memory")
    assert d.warnings == (d.message,)


def test_advise_admits_a_job_that_fits_without_a_warning() -> None:
    d = decide(job("j", est(20), policy=ADVISE), view(node("a", [30, 80])))
    assert (d.outcome, d.reason, d.warnings) == (Outcome.ADMIT, cond.REASON_FITS, ())
    assert where(d) == [("a", (0,))]


def test_advise_waits_for_gpus_when_every_gpu_is_taken() -> None:
    busy = NodeState("a", (gpu("a", 0, 60, pods={"p": 20}), gpu("a", 1, 60, pods={"q": 20})))
    d = decide(job("j", est(100), policy=ADVISE), view(busy, settings=EXCLUSIVE))
    assert (d.outcome, d.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_GPUS)
    says(d, "1 GPU", "policy Advise", "100.00 GiB per GPU on 1 GPU with FSDP")


def test_advise_rejects_a_count_no_node_shape_can_take_rather_than_wait_forever() -> None:
    # visibleDevices keeps a job on one node: 4 GPUs on 2-GPU nodes can never be free at once.
    nodes = (node("a", [80, 80]), node("b", [80, 80]))
    d = decide(job("j", est(100), gpus=4, parallelism=DDP, policy=ADVISE), view(*nodes))
    assert (d.outcome, d.reason) == (Outcome.REJECT, cond.REASON_INSUFFICIENT_GPUS)
    says(d, "visibleDevices keeps a job on one node", "at most 2 GPUs")


# -- plan: the queue -----------------------------------------------------------------------


def test_the_queue_goes_by_priority_then_creation_time_then_the_given_order() -> None:
    e = est(1)
    jobs = [
        job("j0", e, priority=0, created=NOW),
        job("j1", e, priority=1, created=NOW + timedelta(seconds=1)),
        job("j2", e, priority=0, created=NOW - timedelta(seconds=1)),
        job("j3", e, priority=0, created=NOW),
        job("j4", e, priority=-1, created=NOW - timedelta(days=1)),
    ]
    assert queue_order(jobs) == [1, 2, 0, 3, 4]
    decisions = plan(Snapshot((node("a", [80]),)), jobs, AdmissionSettings(packing=SHARED))
    assert [d.job for d in decisions] == ["ns/j1", "ns/j2", "ns/j0", "ns/j3", "ns/j4"]


def test_a_higher_class_goes_first_whatever_the_age_and_a_job_without_one_is_told_why() -> None:
    """The priority is the job's PriorityClass value (resolved where requests are made); a
    job whose class does not exist has no place: told so, it holds nothing, and is in no
    job's way, StrictFIFO or not."""
    jobs = [
        job("old", est(30), created=NOW - timedelta(hours=1)),
        job("unranked", est(30), created=NOW - timedelta(hours=2),
            priority_problem="spec.priorityClassName: no PriorityClass named 'x'"),
        job("high", est(30), priority=1000, created=NOW),
    ]  # fmt: skip
    for strategy in QueueingStrategy:
        d = run([node("a", [40])], jobs, queueing=strategy)
        assert d["high"].admitted and d["old"].reason == cond.REASON_WAITING_FOR_VRAM
        assert (d["unranked"].outcome, d["unranked"].reason) == (
            Outcome.QUEUE, cond.REASON_PRIORITY_CLASS_UNAVAILABLE,
        )  # fmt: skip
        assert d["unranked"].message == "spec.priorityClassName: no PriorityClass named 'x'"
        assert d["unranked"].placement == ()
        alone = run([node("a", [40])], [jobs[1], job("next", est(30))], queueing=strategy)
        assert alone["next"].admitted


def test_a_jobs_own_warnings_end_each_of_its_decisions_messages() -> None:
    said = ("spec.priority 5 is ignored",)
    jobs = [
        job("fits", est(10), warnings=said),
        job("waits", est(70), warnings=said),
        job("advised", est(100), policy=ADVISE, warnings=said),
    ]
    d = run([node("a", [50])], jobs)  # an 80 GiB GPU with 50 free
    assert [d[n].reason for n in ("fits", "waits", "advised")] == [
        cond.REASON_FITS, cond.REASON_WAITING_FOR_VRAM, cond.REASON_ADVISED,
    ]  # fmt: skip
    for name in ("fits", "waits", "advised"):
        assert d[name].message.endswith("; warning: spec.priority 5 is ignored"), name
    assert d["advised"].warnings == (d["advised"].message,), "said once, not twice"


def test_each_admission_is_charged_before_the_next_job_is_decided() -> None:
    one = run([node("a", [40])], [job("j1", est(30)), job("j2", est(30))])
    assert one["j1"].outcome is Outcome.ADMIT
    assert (one["j2"].outcome, one["j2"].reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM)
    says(one["j2"], "the most free GPU has 10.00 GiB (a GPU 0)")
    two = run([node("a", [40, 40])], [job("j1", est(30)), job("j2", est(30))])
    assert where(two["j1"]) == [("a", (0,))] and where(two["j2"]) == [("a", (1,))]
    # Shared GPUs pack by memory: three 20s on one 80 GiB GPU, the fourth 20 too, not a fifth.
    packed = run([node("a", [80])], [job(f"j{i}", est(20)) for i in range(5)])
    assert [packed[f"j{i}"].admitted for i in range(5)] == [True] * 4 + [False]


def test_whole_gpus_take_one_job_each_in_a_pass() -> None:
    d = run([node("a", [80])], [job("j1", est(10)), job("j2", est(10))], packing=EXCLUSIVE)
    assert d["j1"].admitted and not d["j2"].admitted
    assert d["j2"].reason == cond.REASON_WAITING_FOR_VRAM
    says(d["j2"], "no matching GPU takes work now")


def test_admitted_jobs_in_the_snapshot_keep_their_reservations() -> None:
    running = reservation("ns/old", {"a": [0]}, 60)
    d = run([node("a", [80])], [job("j1", est(30)), job("j2", est(20))], [running])
    assert not d["j1"].admitted and d["j2"].admitted


def test_best_effort_fifo_lets_a_later_small_job_go_ahead_of_a_waiting_big_one() -> None:
    nodes = [node("a", [50])]  # 80 GiB GPU with 50 free
    jobs = [job("big", est(70)), job("small", est(10))]
    d = run(nodes, jobs)
    assert (d["big"].outcome, d["big"].reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM)
    assert (d["small"].outcome, d["small"].reason) == (Outcome.ADMIT, cond.REASON_FITS)


def test_strict_fifo_makes_a_later_job_that_fits_wait_in_queue() -> None:
    nodes = [node("a", [50])]
    jobs = [job("big", est(70)), job("small", est(10))]
    d = run(nodes, jobs, queueing=QueueingStrategy.STRICT_FIFO)
    assert d["big"].reason == cond.REASON_WAITING_FOR_VRAM
    assert (d["small"].outcome, d["small"].reason) == (Outcome.QUEUE, cond.REASON_WAITING_IN_QUEUE)
    assert d["small"].placement == ()
    says(d["small"], "ns/big", "StrictFIFO")


def test_strict_fifo_is_not_blocked_by_a_job_that_is_rejected() -> None:
    jobs = [job("never", est(100), parallelism=DDP), job("small", est(10))]
    d = run([node("a", [50])], jobs, queueing=QueueingStrategy.STRICT_FIFO)
    assert d["never"].outcome is Outcome.REJECT
    assert d["small"].outcome is Outcome.ADMIT


# -- jobs without a pod template: told what admission would do, holding nothing ----------------


def plan_bare(
    nodes: Sequence[NodeState], jobs: Sequence[JobRequest], bare: set[str], **settings: object
) -> dict[str, Decision]:
    """`run`, with the jobs named in `bare` template-less; the dict in the order decided."""
    admission = AdmissionSettings(packing=SHARED, **settings)  # type: ignore[arg-type]
    keys = {f"ns/{name}" for name in bare}
    decisions = plan_on(ClusterView(Snapshot(tuple(nodes)), SHARED), jobs, admission, None, keys)
    return {d.job.removeprefix("ns/"): d for d in decisions}


def test_a_job_without_a_template_is_decided_last_and_charged_nothing() -> None:
    nodes = [node("a", [50])]
    d = plan_bare(nodes, [job("bare", est(40)), job("later", est(30))], {"bare"})
    assert list(d) == ["later", "bare"], "decided after the rest"
    assert where(d["later"]) == [("a", (0,))], "the first in the queue holds nothing"
    bare = d["bare"]
    assert (bare.outcome, bare.reason) == (Outcome.QUEUE, cond.REASON_NO_TEMPLATE)
    assert bare.placement == () and bare.admitted_gpus is None
    says(bare, "spec.template is empty", "would wait (WaitingForVRAM: ")
    alone = plan_bare(nodes, [job("bare", est(40))], {"bare"})["bare"]
    assert (alone.outcome, alone.admitted_gpus, alone.placement) == (Outcome.ADMIT, None, ())
    says(alone, "would be admitted (Fits: ")
    # Nor is one charged for another: each fits alone, so each is told it would be admitted.
    two = plan_bare(nodes, [job("one", est(40)), job("two", est(40))], {"one", "two"})
    assert [d.outcome for d in two.values()] == [Outcome.ADMIT, Outcome.ADMIT]


def test_strict_fifo_tells_a_job_without_a_template_it_would_wait_behind_a_waiting_one() -> None:
    nodes = [node("a", [50])]
    jobs = [job("big", est(70)), job("bare", est(10))]
    d = plan_bare(nodes, jobs, {"bare"}, queueing=QueueingStrategy.STRICT_FIFO)
    assert d["big"].reason == cond.REASON_WAITING_FOR_VRAM
    assert (d["bare"].outcome, d["bare"].reason) == (Outcome.QUEUE, cond.REASON_NO_TEMPLATE)
    says(d["bare"], "would wait (WaitingInQueue: fits now, but waits behind ns/big")
    # Ahead of the waiting job in the queue (higher priority): nothing in its way.
    first = [job("big", est(70)), job("bare", est(10), priority=1)]
    ahead = plan_bare(nodes, first, {"bare"}, queueing=QueueingStrategy.STRICT_FIFO)["bare"]
    says(ahead, "would be admitted (Fits: ")
    # Best effort lets it go ahead, and a waiting template-less job blocks nobody.
    says(plan_bare(nodes, jobs, {"bare"})["bare"], "would be admitted (Fits: ")
    blocked = [job("bare", est(70)), job("small", est(10))]
    d = plan_bare(nodes, blocked, {"bare"}, queueing=QueueingStrategy.STRICT_FIFO)
    says(d["bare"], "would wait (WaitingForVRAM: ")
    assert (d["small"].outcome, where(d["small"])) == (Outcome.ADMIT, [("a", (0,))])


def _starvation_case(waited: timedelta, **settings: object) -> dict[str, Decision]:
    nodes = [
        node("a", [50], heartbeat=NOW),  # 80 GiB GPU, 50 free: the big job's only hope
        node("b", [18], total=24, heartbeat=NOW),
    ]
    jobs = [
        job("big", est(70), created=NOW - waited),
        job("medium", est(30), created=NOW),  # only a holds it
        job("small", est(15), created=NOW),  # b holds it
    ]
    return run(nodes, jobs, now=NOW, **settings)


def test_before_the_starvation_limit_later_jobs_backfill_a_waiting_jobs_gpus() -> None:
    d = _starvation_case(timedelta(minutes=29))
    assert d["big"].reason == cond.REASON_WAITING_FOR_VRAM
    assert where(d["medium"]) == [("a", (0,))]
    assert where(d["small"]) == [("b", (0,))]
    # Exactly at the limit is not yet longer than it.
    at_limit = _starvation_case(timedelta(minutes=30))
    assert at_limit["medium"].admitted


def test_a_starving_job_holds_the_gpus_it_is_closest_to_fitting() -> None:
    d = _starvation_case(timedelta(minutes=31))
    assert d["big"].reason == cond.REASON_WAITING_FOR_VRAM
    assert (d["medium"].outcome, d["medium"].reason) == (
        Outcome.QUEUE,
        cond.REASON_WAITING_FOR_VRAM,
    )
    # The hold covers only the big job's GPU: other GPUs still take later jobs.
    assert where(d["small"]) == [("b", (0,))]


def test_the_starvation_limit_is_a_setting() -> None:
    short = _starvation_case(timedelta(minutes=6), starvation_limit=timedelta(minutes=5))
    assert not short["medium"].admitted
    long = _starvation_case(timedelta(minutes=31), starvation_limit=timedelta(hours=1))
    assert long["medium"].admitted


def test_a_suspended_job_is_not_admitted_and_holds_no_memory() -> None:
    jobs = [job("paused", est(30), priority=1), job("next", est(30))]
    d = run([node("a", [40])], jobs)
    assert d["paused"].admitted and not d["next"].admitted  # not suspended: it takes the GPU
    jobs[0] = job("paused", est(30), priority=1, suspend=True)
    for queueing in QueueingStrategy:
        d = run([node("a", [40])], jobs, queueing=queueing)
        assert (d["paused"].outcome, d["paused"].reason) == (Outcome.QUEUE, cond.REASON_SUSPENDED)
        assert d["paused"].placement == () and not d["paused"].admitted
        assert d["next"].admitted


def test_a_device_map_job_is_admitted_on_one_node_most_free_gpu_first() -> None:
    d = decide(job("j", est(60, 10), gpus=2, parallelism=DEVICE_MAP), view(node("a", [40, 45])))
    assert (d.outcome, d.per_gpu_bytes) == (Outcome.ADMIT, 40 * GIB)
    assert where(d) == [("a", (1, 0))]
    says(d, "40.00 GiB per GPU on 2 GPUs with DeviceMap", "a GPUs 1, 0")


def test_plan_reads_the_view_it_builds_and_not_a_shared_one() -> None:
    snapshot = Snapshot((node("a", [40]),))
    jobs = [job("j1", est(30))]
    first = plan(snapshot, jobs, AdmissionSettings(packing=SHARED))
    again = plan(snapshot, jobs, AdmissionSettings(packing=SHARED))
    assert first == again and first[0].admitted
    assert ClusterView(snapshot, SHARED).now.nodes[0].gpus[0].free == 40 * GIB


def test_a_starving_multi_gpu_job_holds_the_whole_gpus_already_free() -> None:
    busy = NodeState(
        "a",
        (
            gpu("a", 0, 60, pods={"p": 20}),
            gpu("a", 1, 60, pods={"q": 20}),
            gpu("a", 2, 80),
            gpu("a", 3, 80),
        ),
        heartbeat=NOW,
    )
    jobs = [
        job("big", est(40, 10), gpus=4, created=NOW - timedelta(hours=2)),
        job("small", est(10), created=NOW),
    ]
    d = run([busy], jobs, now=NOW, packing=EXCLUSIVE)
    assert d["big"].reason == cond.REASON_WAITING_FOR_VRAM
    assert not d["small"].admitted  # GPUs 2 and 3 are held for big as they free up


# -- review follow-ups -------------------------------------------------------------------------


def test_advise_on_identical_nodes_takes_the_first_by_name() -> None:
    d = decide(job("j", est(100), policy=ADVISE), view(node("a", [50]), node("b", [50])))
    assert d.reason == cond.REASON_ADVISED and where(d) == [("a", (0,))]


def test_a_count_no_node_shape_can_hold_is_insufficient_gpus_not_vram() -> None:
    nodes = (node("a", [80, 80, 80]), node("b", [80, 80, 80]))
    d = decide(job("j", est(10), gpus=5, parallelism=DDP), view(*nodes, settings=SPANS))
    assert (d.outcome, d.reason) == (Outcome.REJECT, cond.REASON_INSUFFICIENT_GPUS)
    says(d, "needs 5 GPUs as k nodes x g GPUs", "at most 3 GPUs each")
    d = decide(job("j", est(10), gpus=4, parallelism=DEVICE_MAP), view(*nodes))
    assert d.reason == cond.REASON_INSUFFICIENT_GPUS
    says(d, "on one node (a device map)")


def test_a_job_without_a_creation_time_queues_after_those_with_one() -> None:
    jobs = [
        job("unknown", est(1)),
        job("naive", est(1), created=datetime(2024, 1, 2)),
        job("aware", est(1), created=NOW),
    ]
    assert [jobs[i].key for i in queue_order(jobs)] == ["ns/naive", "ns/aware", "ns/unknown"]


def test_the_empty_cluster_has_every_gpu_whatever_the_device_plugin_reports_now() -> None:
    restarting = NodeState("a", (gpu("a", 0, 80),), heartbeat=NOW, gpu_allocatable=0)
    d = run([restarting], [job("j", est(10))], now=NOW, packing=EXCLUSIVE)["j"]
    assert d.reason == cond.REASON_WAITING_FOR_VRAM


# -- visibleDevices: every job on one node ---------------------------------------------------

ONE_NODE = "GPU mode visibleDevices keeps a job on one node"


def test_visible_devices_rejects_a_count_no_node_has_and_says_why() -> None:
    nodes = (node("a", [80] * 4), node("b", [80] * 4))
    for parallelism in (FSDP, DDP):
        d = decide(job("j", est(160, 10), gpus=8, parallelism=parallelism), view(*nodes))
        assert (d.outcome, d.reason, d.placement) == (
            Outcome.REJECT,
            cond.REASON_INSUFFICIENT_GPUS,
            (),
        )
        name = "FSDP" if parallelism is FSDP else "DDP"
        says(d, f"needs 8 GPUs with {name}; {ONE_NODE}", "NVIDIA_VISIBLE_DEVICES")
        says(d, "the matching nodes have at most 4 GPUs each", "spec.resources.gpus to 4 or fewer")
        says(d, "devicePlugin and dra GPU modes can span nodes")
    # The limit is the widest node the selector matches.
    x, y = {"pool": "x"}, {"pool": "y"}
    v = view(
        node("a", [80] * 4, labels=x), node("b", [80] * 2, labels=y), node("c", [80] * 2, labels=y)
    )
    d = decide(job("j", est(10), gpus=3, selector=y), v)
    assert d.reason == cond.REASON_INSUFFICIENT_GPUS
    says(d, ONE_NODE, "at most 2 GPUs each", "spec.resources.gpus to 2 or fewer")
    # A device map is one node in every mode and says so as before.
    d = decide(job("j", est(10), gpus=8, parallelism=DEVICE_MAP), view(*nodes))
    assert d.reason == cond.REASON_INSUFFICIENT_GPUS
    says(d, "on one node (a device map)", "at most 4 GPUs each")


def test_the_job_visible_devices_rejects_spans_two_nodes_in_the_other_modes() -> None:
    nodes = (node("a", [80] * 4), node("b", [80] * 4))
    for packing in (SPANS, EXCLUSIVE):
        d = decide(job("j", est(160, 10), gpus=8), view(*nodes, settings=packing))
        assert (d.outcome, d.reason) == (Outcome.ADMIT, cond.REASON_FITS)
        assert sorted(where(d)) == [("a", (0, 1, 2, 3)), ("b", (0, 1, 2, 3))]
        says(d, "2 nodes x 4 GPUs (a, b)")
        assert ONE_NODE not in d.message


def test_visible_devices_resizes_a_job_too_wide_for_any_node_to_one_node() -> None:
    # FSDP 160 + 10: 50 GiB per GPU at 4; 7, 6 and 5 GPUs are no shape on 4-GPU nodes.
    nodes = (node("a", [80] * 4), node("b", [80] * 4))
    d = decide(job("j", est(160, 10), gpus=8, policy=RESIZE), view(*nodes))
    assert (d.outcome, d.admitted_gpus, d.per_gpu_bytes) == (Outcome.RESIZE, 4, 50 * GIB)
    assert where(d) == [("a", (0, 1, 2, 3))]
    says(d, "resized 8 -> 4 GPUs")


def test_visible_devices_says_when_enough_gpus_for_memory_exceed_every_node() -> None:
    # FSDP 600 + 10 on 80 GiB GPUs: 160 per GPU at 4, and 9 GPUs (76.67 each) would hold it.
    nodes = (node("a", [80] * 4), node("b", [80] * 4))
    d = decide(job("j", est(600, 10), gpus=4), view(*nodes))
    assert (d.outcome, d.reason) == (Outcome.REJECT, cond.REASON_INSUFFICIENT_VRAM)
    says(d, "160.00 GiB per GPU on 4 GPUs with FSDP", "the largest GPU holds 80.00 GiB usable")
    says(d, "at least 9 GPUs of that size would hold it with FSDP, but", ONE_NODE)
    says(d, "at most 4 GPUs each")
    spans = decide(job("j", est(600, 10), gpus=4), view(*nodes, settings=SPANS))
    says(spans, "at least 9 GPUs of that size would hold it with FSDP)")
    assert ONE_NODE not in spans.message
    # Resize: the need quoted is at the most GPUs one node has, not at counts no node has.
    resize = job("j", est(600, 10), gpus=2, policy=RESIZE)
    d = decide(resize, view(*nodes))
    assert (d.outcome, d.reason) == (Outcome.REJECT, cond.REASON_INSUFFICIENT_VRAM)
    says(d, "no count in [1, 8] fits", "160.00 GiB per GPU on 4 GPUs with FSDP at the most")
    says(d, ONE_NODE, "at most 4 GPUs each")
    spans = decide(resize, view(*nodes, settings=SPANS))
    says(spans, "no count in [1, 8] fits", "85.00 GiB per GPU on 8 GPUs with FSDP at the most")
    assert ONE_NODE not in spans.message
    # Enough GPUs hold the need at the widest count, but no k x g placement has that many.
    lopsided = view(node("a", [80] * 8), node("b", [80] * 2), settings=SPANS)
    d = decide(resize, lopsided)
    assert (d.outcome, d.reason) == (Outcome.REJECT, cond.REASON_INSUFFICIENT_VRAM)
    says(d, "no count in [1, 10] fits", "70.00 GiB per GPU on 10 GPUs with FSDP at the most",
         "the largest GPU holds 80.00 GiB usable; the 10 or more GPUs that hold 70.00 GiB are "
         "in no placement it can use (k nodes x g GPUs, the same g on every node)")  # fmt: skip
    # One GPU holds the need at the widest count: too few GPUs, not the layout, is the cause.
    mixed = view(node("a", [80]), node("b", [24] * 8, total=24), settings=SPANS)
    d = decide(job("j", est(600), gpus=2, policy=RESIZE), mixed)
    assert (d.outcome, d.reason) == (Outcome.REJECT, cond.REASON_INSUFFICIENT_VRAM)
    says(d, "no count in [1, 9] fits", "66.67 GiB per GPU on 9 GPUs with FSDP at the most",
         "the largest GPU holds 80.00 GiB usable; only 1 GPU holds 66.67 GiB")  # fmt: skip
    assert "no placement" not in d.message


def test_a_rejection_whose_largest_gpu_holds_the_need_says_what_does_not() -> None:
    """ "the largest GPU holds 80 GiB" alone contradicts refusing a 42 GiB-per-GPU need."""
    apart = (node("a", [24, 24], total=24), node("b", [80]), node("c", [80]))
    d = decide(job("j", est(80, 2), gpus=2, parallelism=DEVICE_MAP), view(*apart))
    assert (d.outcome, d.reason) == (Outcome.REJECT, cond.REASON_INSUFFICIENT_VRAM)
    says(d, "needs 42.00 GiB per GPU on 2 GPUs with DeviceMap; the largest GPU holds 80.00 GiB "
         "usable, but even when the cluster is empty the 2 or more GPUs that hold 42.00 GiB are "
         "in no placement it can use (all on one node)")  # fmt: skip
    # visibleDevices keeps FSDP on one node too: no "2 GPUs of that size would hold it" hint.
    fsdp = decide(job("j", est(80, 2), gpus=2), view(*apart))
    says(fsdp, "in no placement it can use (all on one node)")
    assert "would hold it" not in fsdp.message
    # Too few, not apart: one 80 GiB GPU and small ones.
    few = (node("a", [24, 24], total=24), node("b", [80]))
    d = decide(job("j", est(80, 2), gpus=2, parallelism=DEVICE_MAP), view(*few))
    says(d, "but even when the cluster is empty only 1 GPU holds 42.00 GiB")


# -- devicePlugin: the device plugin picks which of the node's free GPUs the pod gets -------


def _partly_used_node(gpu6_free: float) -> NodeState:
    """h100-0: pods hold six GPUs; GPU 1 is partly used outside any pod (20 GiB free) and GPU
    6, free of pods, has `gpu6_free` GiB."""
    gpus = [
        gpu("h100-0", i, {1: 20, 6: gpu6_free}[i])
        if i in (1, 6)
        else gpu("h100-0", i, 10, pods={f"pod-{i}": 70})
        for i in range(8)
    ]
    return NodeState("h100-0", tuple(gpus), gpu_allocatable=8, gpu_allocated=6)


def test_device_plugin_waits_while_a_gpu_the_pod_may_get_is_too_small_and_says_why() -> None:
    qlora = job("j", est(11.64))
    d = decide(qlora, view(_partly_used_node(10), settings=EXCLUSIVE))
    assert (d.outcome, d.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM)
    says(d, "needs 11.64 GiB per GPU on 1 GPU with FSDP; in GPU mode devicePlugin the device "
         "plugin picks which of a node's free GPUs a pod gets, and the best node's least free "
         "one has 10.00 GiB (h100-0 GPU 6)", "so it waits for memory")  # fmt: skip
    # dra pins the GPU named: GPU 1 holds it.
    pinned = decide(qlora, view(_partly_used_node(10), settings=SPANS))
    assert where(pinned) == [("h100-0", (1,))]
    says(pinned, "placed on h100-0 GPU 1, 8.36 GiB left on the tightest")
    assert "devicePlugin" not in pinned.message
    # With 12 GiB on GPU 6 the node takes it, and says what is left on the worst it may get.
    d = decide(qlora, view(_partly_used_node(12), settings=EXCLUSIVE))
    assert (d.outcome, where(d)) == (Outcome.ADMIT, [("h100-0", (6,))])
    says(d, "placed on h100-0 GPU 6, 0.36 GiB left on the tightest GPU it may get (h100-0 GPU "
         "6; in GPU mode devicePlugin the device plugin picks which of the node's free GPUs "
         "the pod gets)")  # fmt: skip


def test_device_plugin_names_the_gpu_that_bounds_a_node_when_the_placement_does_not() -> None:
    # GPU 1 (10 free) is promised to an admitted job whose pod does not run yet: the next job
    # is named on GPU 0, but the pod may get GPU 1 all the same.
    pending = [reservation("first", {"a": [1]}, 8)]
    d = decide(job("j", est(9)), view(node("a", [80, 10, 80]), reservations=pending,
                                      settings=EXCLUSIVE))  # fmt: skip
    assert where(d) == [("a", (0,))]
    says(d, "placed on a GPU 0, 1.00 GiB left on the tightest GPU it may get (a GPU 1; ")


def test_device_plugin_resizes_to_a_count_whose_share_each_gpu_the_pod_may_get_holds() -> None:
    # FSDP 30 + 10: 40 on 1 GPU, 25 on 2. GPU 0 holds 40, but the pod may get GPU 1 (30).
    j = job("j", est(30, 10), policy=RESIZE, max_gpus=2)
    d = decide(j, view(node("a", [80, 30]), settings=SPANS))
    assert (d.outcome, d.admitted_gpus, where(d)) == (Outcome.ADMIT, 1, [("a", (0,))])
    d = decide(j, view(node("a", [80, 30]), settings=EXCLUSIVE))
    assert (d.outcome, d.reason, d.admitted_gpus) == (Outcome.RESIZE, cond.REASON_RESIZED, 2)
    assert where(d) == [("a", (1, 0))]
    says(d, "resized 1 -> 2 GPUs", "5.00 GiB left on the tightest GPU it may get (a GPU 1; ")


def test_device_plugin_advise_warns_of_the_least_free_gpu_the_pod_may_get() -> None:
    d = decide(job("j", est(50), policy=ADVISE), view(node("a", [30, 80, 20]), settings=EXCLUSIVE))
    assert (d.outcome, d.reason) == (Outcome.ADMIT, cond.REASON_ADVISED)
    says(d, "the least free GPU it may get (a GPU 2; in GPU mode devicePlugin the device plugin "
         "picks which of the node's free GPUs the pod gets) has 20.00 GiB free")  # fmt: skip


def test_device_plugin_queues_rather_than_rejects_what_a_nodes_big_gpus_hold() -> None:
    """Rejection is for what never fits: once a pod holds the node's small GPU, its device
    plugin hands out only the big one."""
    mixed = NodeState("a", (gpu("a", 0, 80), gpu("a", 1, 24, total=24)))
    d = decide(job("j", est(60)), view(mixed, settings=EXCLUSIVE))
    assert (d.outcome, d.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM)
    says(d, "the best node's least free one has 24.00 GiB (a GPU 1)", "80.00 GiB usable")
    held = NodeState("a", (gpu("a", 0, 80), gpu("a", 1, 4, total=24, pods={"p": 20})))
    assert decide(job("j", est(60)), view(held, settings=EXCLUSIVE)).admitted


def test_device_plugin_a_starving_job_holds_the_node_it_is_closest_to() -> None:
    """a is closest to taking big (2 GPUs of 70: each GPU it may hand out has 65); while big
    starves, a later small job does not take a's GPUs, and b may hand it a GPU of 8."""
    nodes = [node("a", [65, 65], heartbeat=NOW), node("b", [8, 80], heartbeat=NOW)]
    small = job("small", est(10), created=NOW)
    fresh = run(nodes, [job("big", est(70), gpus=2, parallelism=DDP, created=NOW), small],
                now=NOW, packing=EXCLUSIVE)  # fmt: skip
    assert where(fresh["small"]) == [("a", (0,))]
    starving = job("big", est(70), gpus=2, parallelism=DDP, created=NOW - timedelta(hours=1))
    d = run(nodes, [starving, small], now=NOW, packing=EXCLUSIVE)
    assert d["big"].reason == cond.REASON_WAITING_FOR_VRAM
    says(d["big"], "the best node's least free one has 65.00 GiB (a GPU 0)")
    assert (d["small"].outcome, d["small"].reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM)
