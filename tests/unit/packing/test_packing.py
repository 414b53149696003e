"""Packing: which GPUs take work, their effective free memory, and best-fit placement.

Expectations are computed by hand from estimates built directly: with `sharded_bytes` S and
`replicated_bytes` R (margin 1), FSDP needs `S // n + R` per GPU at n GPUs, DDP `S + R` on
every GPU, and one GPU holds the total `S + R`.

`SHARED` (visibleDevices: GPUs shared by memory, every job on one node) is the default view;
tests about jobs spanning nodes use `SPANS` (DRA: whole GPUs, no device-plugin slots).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from controller.base.units import GIB
from controller.estimator.settings import Parallelism
from controller.packing.index import FreeIndex
from controller.packing.inventory import (
    GpuMode,
    NodeState,
    PackingSettings,
    Snapshot,
    charges,
    placeable,
    slots_taken,
    working_nodes,
)
from controller.packing.placement import Placed, closest, place, place_by_count, shapes
from controller.packing.view import ClusterView
from tests.unit.builders.packing import NOW, SHARED, SPANS, est, frees, gpu, node, reservation, view

# -- builders (shared with test_decision.py and test_plan_properties.py) -----------------------


def everywhere(pos: int) -> bool:
    return True


def on(v: ClusterView, placed: Placed | None) -> list[tuple[str, tuple[int, ...]]]:
    """A placement as (node, GPU indices) in the order the workload sees them."""
    assert placed is not None
    return [(part.node, part.indices) for part in v.node_gpus(placed)]


# -- placeable ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("health", "why"),
    [
        ({"ready": False}, "node not Ready"),
        ({"cordoned": True}, "node cordoned"),
        ({"agent_ready": False}, "agent not Ready"),
    ],
)
def test_a_gpu_takes_no_work_on_an_unready_cordoned_or_agentless_node(
    health: dict[str, bool], why: str
) -> None:
    sick = node("a", [80], **health)
    assert placeable(sick, None, timedelta(seconds=90)) == why
    v = view(sick, node("b", [20]))
    assert [n.name for n in v.now.nodes] == ["b"]
    # ... but it still counts for the empty cluster: it may come back.
    assert [n.name for n in v.empty.nodes] == ["a", "b"]


def test_a_heartbeat_exactly_at_the_ttl_is_fresh_and_one_second_older_is_stale() -> None:
    ttl = timedelta(seconds=90)
    at_ttl = node("a", [80], heartbeat=NOW - ttl)
    past_ttl = node("b", [80], heartbeat=NOW - ttl - timedelta(seconds=1))
    assert placeable(at_ttl, NOW, ttl) is None
    assert placeable(past_ttl, NOW, ttl) == "agent heartbeat stale"
    v = view(at_ttl, past_ttl, now=NOW)
    assert [n.name for n in v.now.nodes] == ["a"]


def test_the_default_heartbeat_ttl_is_ninety_seconds() -> None:
    ttl = PackingSettings().heartbeat_ttl
    assert ttl == timedelta(seconds=90)
    assert placeable(node("a", [80], heartbeat=NOW - timedelta(seconds=90)), NOW, ttl) is None
    assert placeable(node("a", [80], heartbeat=NOW - timedelta(seconds=91)), NOW, ttl)


def test_a_node_without_a_heartbeat_is_stale_when_the_snapshot_has_a_time() -> None:
    silent = node("a", [80])
    assert placeable(silent, NOW, timedelta(seconds=90)) == "agent heartbeat stale"
    # An offline snapshot without a time does not judge heartbeats.
    assert placeable(silent, None, timedelta(seconds=90)) is None


def test_gpus_whose_memory_is_not_reported_are_not_placeable_even_when_empty() -> None:
    a = NodeState(
        "a",
        (gpu("a", 0, None), gpu("a", 1, 40, total=None), gpu("a", 2, 30)),
    )
    blind = NodeState("b", (gpu("b", 0, None, total=None),))
    v = view(a, blind)
    assert [s.uuid for n in v.now.nodes for s in n.gpus] == ["a-2"]
    assert [s.uuid for n in v.empty.nodes for s in n.gpus] == ["a-2"]
    assert v.select({}).gpus == 1


def test_mig_devices_are_gpus_of_their_own() -> None:
    migs = tuple(
        gpu("a", i, 9.5, total=10, product="NVIDIA-A100-MIG-1g.10gb", mig=True) for i in range(7)
    )
    v = view(NodeState("a", migs))
    assert len(v.now.nodes[0].gpus) == 7
    one = place(v.now, est(8), Parallelism.FSDP, 1, everywhere)
    assert on(v, one) == [("a", (0,))]
    # A job bigger than one device does not fit on the node's total memory.
    assert place(v.now, est(12), Parallelism.FSDP, 1, everywhere) is None
    # FSDP over MIG devices: 7 devices of 9.5 GiB hold 56 + 1 GiB at 7 (8 + 1 each).
    seven = place(v.now, est(56, 1), Parallelism.FSDP, 7, everywhere)
    assert on(v, seven) == [("a", (0, 1, 2, 3, 4, 5, 6))]


# -- effective free memory ------------------------------------------------------------------


def test_a_job_not_seen_on_its_gpu_yet_is_charged_in_full() -> None:
    v = view(node("a", [70]), reservations=[reservation("j", {"a": [0]}, 30, pods=["p1"])])
    assert frees(v) == {"a-0": 40}


def test_a_running_job_is_charged_only_what_it_has_not_allocated_yet() -> None:
    # 80 GiB GPU: the job's pod uses 20 GiB (so NVML says 60 free) of its 30 GiB estimate.
    a = NodeState("a", (gpu("a", 0, 60, pods={"p1": 20}),))
    v = view(a, reservations=[reservation("j", {"a": [0]}, 30, pods=["p1"])])
    assert frees(v) == {"a-0": 50}  # 60 measured - the 10 GiB still to come
    owed = charges([reservation("j", {"a": [0]}, 30, pods=["p1"])], {"a": a})
    assert owed == {"a-0": 10 * GIB}


def test_a_job_using_more_than_its_estimate_is_charged_nothing_more() -> None:
    a = NodeState("a", (gpu("a", 0, 40, pods={"p1": 40}),))
    owed = charges([reservation("j", {"a": [0]}, 30, pods=["p1"])], {"a": a})
    assert owed == {"a-0": 0}
    v = view(a, reservations=[reservation("j", {"a": [0]}, 30, pods=["p1"])])
    assert frees(v) == {"a-0": 40}


def test_only_the_jobs_own_pods_reduce_its_charge() -> None:
    # Another job's pod (p9) uses 25 GiB on the GPU: NVML counts it, this job's charge does not.
    a = NodeState("a", (gpu("a", 0, 45, pods={"p9": 25, "p1": 10}),))
    owed = charges([reservation("j", {"a": [0]}, 30, pods=["p1"])], {"a": a})
    assert owed == {"a-0": 20 * GIB}


def test_a_multi_gpu_job_is_charged_per_gpu_by_what_its_pods_use_on_each() -> None:
    a = NodeState("a", (gpu("a", 0, 55, pods={"p1": 25}), gpu("a", 1, 80), gpu("a", 2, 80)))
    owed = charges([reservation("j", {"a": [0, 1]}, 30, pods=["p1"])], {"a": a})
    assert owed == {"a-0": 5 * GIB, "a-1": 30 * GIB}
    v = view(a, reservations=[reservation("j", {"a": [0, 1]}, 30, pods=["p1"])])
    assert frees(v) == {"a-0": 50, "a-1": 50, "a-2": 80}


def test_a_reservation_without_known_pods_is_charged_in_full() -> None:
    # An offline snapshot: the GPU shows usage, but nothing ties it to the reservation.
    a = NodeState("a", (gpu("a", 0, 60, pods={"p1": 20}),))
    owed = charges([reservation("j", {"a": [0]}, 30)], {"a": a})
    assert owed == {"a-0": 30 * GIB}


def test_two_reservations_on_one_shared_gpu_are_both_charged() -> None:
    reservations = [reservation("j1", {"a": [0]}, 30), reservation("j2", {"a": [0]}, 20)]
    v = view(node("a", [80]), reservations=reservations)
    assert frees(v) == {"a-0": 30}


def test_headroom_in_bytes_and_percent_is_kept_free_now_and_when_empty() -> None:
    settings = PackingSettings(
        headroom_bytes=2 * GIB, headroom_percent=10, gpu_mode=GpuMode.VISIBLE_DEVICES
    )
    assert settings.headroom(80 * GIB) == 10 * GIB
    v = view(node("a", [80, 50]), settings=settings)
    assert frees(v) == {"a-0": 70, "a-1": 40}  # 80 - 2 - 8, 50 - 2 - 8
    assert [s.capacity / GIB for s in v.now.nodes[0].gpus] == [70, 70]
    assert [s.free / GIB for s in v.empty.nodes[0].gpus] == [70, 70]
    assert place(v.now, est(40), Parallelism.FSDP, 1, everywhere) is not None
    assert place(v.now, est(41), Parallelism.FSDP, 1, everywhere) is not None
    assert place(v.empty, est(70), Parallelism.FSDP, 1, everywhere) is not None
    assert place(v.empty, est(70.5), Parallelism.FSDP, 1, everywhere) is None


def test_effective_free_never_exceeds_capacity() -> None:
    # An agent reading more free than total (rounding, a stale read) is capped at the total.
    a = NodeState("a", (gpu("a", 0, 81, total=80),))
    assert frees(view(a)) == {"a-0": 80}


# -- whole GPUs and device-plugin slots -----------------------------------------------------


def test_device_plugin_and_dra_hand_out_whole_gpus() -> None:
    a = NodeState("a", (gpu("a", 0, 60, pods={"p1": 20}), gpu("a", 1, 80), gpu("a", 2, 80)))
    res = [reservation("j", {"a": [1]}, 10, pods=["p2"])]
    for mode in (GpuMode.DEVICE_PLUGIN, GpuMode.DRA):
        v = view(a, reservations=res, settings=PackingSettings(gpu_mode=mode))
        assert [s.taken for s in v.now.nodes[0].gpus] == [True, True, False]
        two = place(v.now, est(5), Parallelism.DDP, 2, everywhere)
        assert two is None  # only GPU 2 is open, whatever the free memory on 0 and 1
        assert on(v, place(v.now, est(5), Parallelism.DDP, 1, everywhere)) == [("a", (2,))]


def test_visible_devices_shares_gpus_by_memory() -> None:
    a = NodeState("a", (gpu("a", 0, 60, pods={"p1": 20}), gpu("a", 1, 80)))
    v = view(a, reservations=[reservation("j", {"a": [1]}, 10)], settings=SHARED)
    assert [s.taken for s in v.now.nodes[0].gpus] == [False, False]
    # GPU 1: 80 - 10 reserved = 70; GPU 0: 60 measured. Best fit for 50 is GPU 0.
    assert on(v, place(v.now, est(50), Parallelism.FSDP, 1, everywhere)) == [("a", (0,))]


def test_an_exclusive_gpu_assumed_by_one_job_takes_no_other_in_the_same_pass() -> None:
    v = view(node("a", [80]), settings=PackingSettings())
    first = place(v.now, est(10), Parallelism.FSDP, 1, everywhere)
    assert first is not None
    v.assume(first)
    assert place(v.now, est(10), Parallelism.FSDP, 1, everywhere) is None
    shared = view(node("a", [80]))
    first = place(shared.now, est(10), Parallelism.FSDP, 1, everywhere)
    assert first is not None
    shared.assume(first)
    assert frees(shared) == {"a-0": 70}
    assert place(shared.now, est(70), Parallelism.FSDP, 1, everywhere) is not None
    assert place(shared.now, est(71), Parallelism.FSDP, 1, everywhere) is None


def test_device_plugin_slots_are_allocatable_less_allocated_less_pending_reservations() -> None:
    settings = PackingSettings()
    # 4 allocatable, 1 requested by some pod, a 2-GPU job admitted whose pods do not exist yet.
    a = node("a", [80, 80, 80, 80], gpu_allocatable=4, gpu_allocated=1)
    res = reservation("j", {"a": [0, 1]}, 10)
    assert slots_taken([res]) == {"a": 2}
    (a_slots,) = working_nodes(Snapshot((a,), (res,)), settings)
    assert a_slots.slots == 1
    # Once its pods exist they are in gpu_allocated: not counted a second time.
    running = reservation("j", {"a": [0, 1]}, 10, pods=["p1"], allocated={"a": 2})
    a_running = node("a", [80, 80, 80, 80], gpu_allocatable=4, gpu_allocated=3)
    assert slots_taken([running]).get("a", 0) == 0
    (a_slots,) = working_nodes(Snapshot((a_running,), (running,)), settings)
    assert a_slots.slots == 1


def test_slots_default_to_the_gpu_count_and_never_exceed_it() -> None:
    settings = PackingSettings()
    (plain,) = working_nodes(Snapshot((node("a", [80, 80]),)), settings)
    assert plain.slots == 2
    (generous,) = working_nodes(Snapshot((node("a", [80, 80], gpu_allocatable=8),)), settings)
    assert generous.slots == 2
    (short,) = working_nodes(Snapshot((node("a", [80, 80, 80], gpu_allocatable=1),)), settings)
    assert short.slots == 1
    # Other modes do not count kubelet slots.
    (shared,) = working_nodes(Snapshot((node("a", [80, 80, 80], gpu_allocatable=1),)), SHARED)
    assert shared.slots == 3


def test_a_node_without_free_device_slots_takes_no_job_whatever_its_memory() -> None:
    full = node("a", [80, 80], gpu_allocatable=2, gpu_allocated=1)
    roomy = node("b", [80, 80, 80])
    v = view(full, roomy, settings=PackingSettings())
    # Best fit would take a (its 2nd largest, 80, ties with b's): a has only one slot.
    assert on(v, place(v.now, est(20, 10), Parallelism.FSDP, 2, everywhere)) == [("b", (0, 1))]
    assert on(v, place(v.now, est(10), Parallelism.FSDP, 1, everywhere)) == [("a", (0,))]
    first = place(v.now, est(10), Parallelism.FSDP, 1, everywhere)
    assert first is not None
    v.assume(first)
    # a's last slot is taken: the next 1-GPU job goes to b although a GPU 1 is untouched.
    assert on(v, place(v.now, est(10), Parallelism.FSDP, 1, everywhere)) == [("b", (0,))]


# -- devicePlugin: the device plugin picks which of the node's free GPUs the pod gets -------

DEVICE_PLUGIN = PackingSettings()  # the default


def _h100_0(gpu6_free: float) -> NodeState:
    """The node of the report: pods hold six GPUs; GPU 1 is partly used outside any pod (20
    GiB free) and GPU 6, free of pods too, has `gpu6_free` GiB."""
    gpus = []
    for i in range(8):
        if i == 1:
            gpus.append(gpu("h100-0", i, 20))
        elif i == 6:
            gpus.append(gpu("h100-0", i, gpu6_free))
        else:
            gpus.append(gpu("h100-0", i, 10, pods={f"pod-{i}": 70}))
    return NodeState("h100-0", tuple(gpus), gpu_allocatable=8, gpu_allocated=6)


def test_device_plugin_places_on_a_node_only_what_each_gpu_it_may_hand_out_holds() -> None:
    """11.64 GiB fits GPU 1 (20 free), but the pod asks the node for one GPU and the device
    plugin may hand it GPU 6 (10 free): the node must not take it."""
    job = est(11.64)
    v = view(_h100_0(10), settings=DEVICE_PLUGIN)
    assert place(v.now, job, Parallelism.FSDP, 1, everywhere) is None
    # dra and visibleDevices pin the GPU named: GPU 1, the least free that holds it.
    for pinned in (SPANS, SHARED):
        v = view(_h100_0(10), settings=pinned)
        assert on(v, place(v.now, job, Parallelism.FSDP, 1, everywhere)) == [("h100-0", (1,))]
    # Once GPU 6 holds it too the node takes it, naming the least free GPU it may hand out.
    v = view(_h100_0(12), settings=DEVICE_PLUGIN)
    placed = place(v.now, job, Parallelism.FSDP, 1, everywhere)
    assert on(v, placed) == [("h100-0", (6,))]
    assert placed is not None and v.tightest(placed) == (12 * GIB, "h100-0", 6)


def test_device_plugin_best_fit_across_nodes_goes_by_each_nodes_least_free_gpu() -> None:
    # The placement docstring's example: a's 13 is the least that holds 12, but a may hand
    # the pod its GPU 2, of 10; b's least free GPU, 14, holds 12.
    a, b = node("a", [13, 80, 10]), node("b", [14, 30])
    dra = view(a, b, settings=SPANS)
    assert on(dra, place(dra.now, est(12), Parallelism.FSDP, 1, everywhere)) == [("a", (0,))]
    v = view(a, b, settings=DEVICE_PLUGIN)
    assert on(v, place(v.now, est(12), Parallelism.FSDP, 1, everywhere)) == [("b", (0,))]
    # Of two nodes that both hold it, the one whose least free GPU is tighter: b's 14 over
    # c's 15, although b's other GPU is the loosest of all.
    v = view(b, node("c", [15, 15]), settings=DEVICE_PLUGIN)
    assert on(v, place(v.now, est(12), Parallelism.FSDP, 1, everywhere)) == [("b", (0,))]


def test_device_plugin_judges_each_node_of_a_multi_node_placement_by_its_least_free_gpu() -> None:
    # FSDP on 4 GPUs of 35 (100 // 4 + 10) over 3-GPU nodes: 2 nodes x 2 GPUs.
    job = est(100, 10)
    a, b, c = node("a", [36, 36, 10]), node("b", [40, 40, 40]), node("c", [50, 50, 50])
    dra = view(a, b, c, settings=SPANS)
    assert sorted(on(dra, place(dra.now, job, Parallelism.FSDP, 4, everywhere))) == [
        ("a", (0, 1)), ("b", (0, 1))]  # fmt: skip
    v = view(a, b, c, settings=DEVICE_PLUGIN)
    placed = place(v.now, job, Parallelism.FSDP, 4, everywhere)
    assert sorted(on(v, placed)) == [("b", (0, 1)), ("c", (0, 1))]
    assert placed is not None and v.tightest(placed) == (40 * GIB, "b", 0)


def test_device_plugin_counts_gpus_that_reservations_name_but_whose_pods_are_not_there() -> None:
    """A job admitted on GPU 1 whose pod does not run yet may get GPU 0 or 2 instead, and
    the next pod GPU 1: its 10 GiB bound the node, though GPU 1 is promised already."""
    a = node("a", [80, 10, 80])
    pending = [reservation("first", {"a": [1]}, 8)]
    v = view(a, reservations=pending, settings=DEVICE_PLUGIN)
    assert place(v.now, est(20), Parallelism.FSDP, 1, everywhere) is None
    assert on(v, place(v.now, est(9), Parallelism.FSDP, 1, everywhere)) == [("a", (0,))]


def test_device_plugin_charges_no_reservation_to_a_gpu_its_pod_did_not_get() -> None:
    """The device plugin gave the admitted job GPU 1, not GPU 0 that its placement names: the
    reservation on idle GPU 0 does not make the node look fuller than it is."""
    a = NodeState("a", (gpu("a", 0, 80), gpu("a", 1, 50, pods={"p1": 30}), gpu("a", 2, 80)),
                  gpu_allocatable=3, gpu_allocated=1)  # fmt: skip
    running = [reservation("first", {"a": [0]}, 30, pods=["p1"], allocated={"a": 1})]
    v = view(a, reservations=running, settings=DEVICE_PLUGIN)
    assert on(v, place(v.now, est(70), Parallelism.FSDP, 1, everywhere)) == [("a", (2,))]


def test_device_plugin_assumed_jobs_take_slots_and_names_but_not_the_bound() -> None:
    v = view(node("a", [30, 20, 40]), settings=DEVICE_PLUGIN)
    first = place(v.now, est(15), Parallelism.FSDP, 1, everywhere)
    assert on(v, first) == [("a", (1,))]  # the least free GPU it may get
    assert first is not None
    v.assume(first)
    second = place(v.now, est(15), Parallelism.FSDP, 1, everywhere)
    assert on(v, second) == [("a", (0,))]  # another name; GPU 1 still bounds what it may get
    assert second is not None and v.tightest(second) == (20 * GIB, "a", 1)
    v.assume(second)
    assert place(v.now, est(15), Parallelism.FSDP, 2, everywhere) is None  # one slot left


def test_device_plugin_device_map_must_fit_the_least_free_gpus_it_may_get() -> None:
    # A device map on 2 GPUs: 70 GiB in all, 40 on each (no LM head of its own here).
    job = est(60, 10)
    assert job.per_gpu_bytes(2, Parallelism.DEVICE_MAP) == job.device_map_min_bytes(2) == 40 * GIB
    a = node("a", [45, 80, 20])
    dra = view(a, settings=SPANS)
    assert on(dra, place(dra.now, job, Parallelism.DEVICE_MAP, 2, everywhere)) == [("a", (1, 0))]
    v = view(a, settings=DEVICE_PLUGIN)
    assert place(v.now, job, Parallelism.DEVICE_MAP, 2, everywhere) is None  # 45 and 20
    v = view(node("a", [45, 80, 42]), settings=DEVICE_PLUGIN)
    assert on(v, place(v.now, job, Parallelism.DEVICE_MAP, 2, everywhere)) == [("a", (0, 2))]


def test_the_empty_cluster_is_not_held_to_the_least_free_gpu() -> None:
    """Reject is judged on the empty cluster: a node whose small GPU another pod may hold
    hands a pod only its big one then, so what the big one holds may fit some day."""
    mixed = NodeState("a", (gpu("a", 0, 80), gpu("a", 1, 24, total=24)))
    v = view(mixed, settings=DEVICE_PLUGIN)
    every = v.select({})
    assert v.place_now(est(60), Parallelism.FSDP, 1, every) is None
    assert v.fits_empty(est(60), Parallelism.FSDP, 1, every)


# -- placement: the module docstring's worked examples --------------------------------------


def test_worked_example_one_gpu_goes_to_the_least_free_gpu_that_holds_it() -> None:
    v = view(node("a", [80, 24]), node("b", [30]))
    assert on(v, place(v.now, est(20), Parallelism.FSDP, 1, everywhere)) == [("a", (1,))]


def test_worked_example_two_fsdp_gpus_go_to_the_node_whose_second_largest_is_tightest() -> None:
    # FSDP at 2: 60 // 2 + 10 = 40 GiB per GPU.
    job = est(60, 10)
    assert job.per_gpu_bytes(2, Parallelism.FSDP) == 40 * GIB
    v = view(node("a", [80, 80, 45, 10]), node("b", [50, 41]))
    assert on(v, place(v.now, job, Parallelism.FSDP, 2, everywhere)) == [("b", (1, 0))]


def test_worked_example_eight_fsdp_gpus_on_four_gpu_nodes_take_the_two_tightest_nodes() -> None:
    job = est(160, 10)  # 160 // 8 + 10 = 30 GiB per GPU at 8
    assert job.per_gpu_bytes(8, Parallelism.FSDP) == 30 * GIB
    v = view(
        node("n1", [80] * 4),
        node("n2", [35] * 4),
        node("n3", [31, 31, 31, 31]),
        node("n4", [40, 40, 40, 29]),  # its 4th largest is below 30
        node("n5", [30, 30, 30, 30]),  # exactly 30 holds
        settings=SPANS,
    )
    placed = on(v, place(v.now, job, Parallelism.FSDP, 8, everywhere))
    assert sorted(placed) == [("n3", (0, 1, 2, 3)), ("n5", (0, 1, 2, 3))]


def test_worked_example_ddp_on_three_gpus_over_two_gpu_nodes_takes_three_nodes() -> None:
    assert list(shapes(3, 2, Parallelism.DDP)) == [(3, 1)]
    nodes = (node("a", [80, 80]), node("b", [30, 25]), node("c", [50, 50]), node("d", [22, 22]))
    v = view(*nodes, settings=SPANS)
    placed = on(v, place(v.now, est(24), Parallelism.DDP, 3, everywhere))
    # Each node's tightest GPU that holds 24: b 25, c 50, a 80 (d holds none).
    assert sorted(placed) == [("a", (0,)), ("b", (1,)), ("c", (0,))]


# -- placement: the rules ---------------------------------------------------------------------


def test_ties_go_by_node_name_then_gpu_index_whatever_the_input_order() -> None:
    v = view(node("b", [30, 30]), node("a", [30, 30]))
    assert on(v, place(v.now, est(20), Parallelism.FSDP, 1, everywhere)) == [("a", (0,))]
    assert on(v, place(v.now, est(20, 10), Parallelism.FSDP, 2, everywhere)) == [("a", (0, 1))]


def test_a_node_with_gpus_in_index_order_unlike_the_listing_still_ties_by_index() -> None:
    a = NodeState("a", (gpu("a", 3, 30), gpu("a", 1, 30), gpu("a", 2, 25)))
    v = view(a)
    assert on(v, place(v.now, est(26), Parallelism.FSDP, 1, everywhere)) == [("a", (1,))]
    assert on(v, place(v.now, est(20), Parallelism.FSDP, 1, everywhere)) == [("a", (2,))]


def test_one_node_comes_first_even_when_several_nodes_would_be_tighter() -> None:
    job = est(80, 10)  # 80 // 4 + 10 = 30 at 4
    v = view(node("a", [80] * 4), node("b", [31, 31]), node("c", [31, 31]))
    assert on(v, place(v.now, job, Parallelism.FSDP, 4, everywhere)) == [("a", (0, 1, 2, 3))]


def test_fewest_nodes_first_over_tighter_spreads() -> None:
    job = est(80, 10)  # 30 GiB per GPU at 4
    v = view(
        node("a", [40, 40, 10, 10]),
        node("b", [40, 40, 10, 10]),
        node("c", [30, 10, 10, 10]),
        node("d", [30, 10, 10, 10]),
        node("e", [30, 10, 10, 10]),
        node("f", [30, 10, 10, 10]),
        settings=SPANS,
    )
    placed = on(v, place(v.now, job, Parallelism.FSDP, 4, everywhere))
    assert sorted(placed) == [("a", (0, 1)), ("b", (0, 1))]


def test_nodes_of_a_spread_all_run_the_same_number_of_gpus() -> None:
    job = est(80, 10)  # 30 GiB per GPU at 4
    # 3 + 1 GPUs would make 4, but torchrun needs the same count on every node.
    v = view(node("a", [80, 80, 80]), node("b", [80]), settings=SPANS)
    assert place(v.now, job, Parallelism.FSDP, 4, everywhere) is None
    v = view(node("a", [80, 80, 80]), node("b", [80]), node("c", [80, 80]), settings=SPANS)
    placed = on(v, place(v.now, job, Parallelism.FSDP, 4, everywhere))
    assert sorted(placed) == [("a", (0, 1)), ("c", (0, 1))]


def test_ddp_needs_the_whole_job_on_every_gpu() -> None:
    v = view(node("a", [50, 50]))
    assert place(v.now, est(40, 10), Parallelism.DDP, 2, everywhere) is not None
    assert place(v.now, est(41, 10), Parallelism.DDP, 2, everywhere) is None
    assert place(v.now, est(41, 10), Parallelism.FSDP, 2, everywhere) is not None  # 30.5 each


def test_a_device_map_never_spans_nodes() -> None:
    assert list(shapes(4, 2, Parallelism.DEVICE_MAP)) == []
    assert list(shapes(2, 2, Parallelism.DEVICE_MAP)) == [(1, 2)]
    v = view(node("a", [80, 80]), node("b", [80, 80]), settings=SPANS)
    assert place(v.now, est(60, 10), Parallelism.DEVICE_MAP, 4, everywhere) is None
    assert place(v.now, est(60, 10), Parallelism.FSDP, 4, everywhere) is not None


def test_a_device_map_takes_the_tightest_node_and_its_gpus_most_free_first() -> None:
    job = est(60, 10)  # head GPU 60 // 2 + 10 = 40; total 70
    v = view(node("a", [80, 80]), node("b", [40, 45]))
    # b: 45 + 85 % of 40 = 79 >= 70 and both hold 40; the head (most free) GPU is listed first.
    assert on(v, place(v.now, job, Parallelism.DEVICE_MAP, 2, everywhere)) == [("b", (1, 0))]


def test_a_device_map_counts_further_gpus_at_85_percent_of_the_pool() -> None:
    job = est(100)  # 50 per GPU at 2; the pool must reach 100
    # 54 + 0.85 * 54 = 99.9 < 100: too small although each GPU holds its 50.
    v = view(node("a", [54, 54]), node("b", [55, 54]))
    assert on(v, place(v.now, job, Parallelism.DEVICE_MAP, 2, everywhere)) == [("b", (0, 1))]
    tight = view(node("a", [54, 54]))
    assert place(tight.now, job, Parallelism.DEVICE_MAP, 2, everywhere) is None
    assert place(tight.now, job, Parallelism.FSDP, 2, everywhere) is not None


def test_a_device_map_needs_the_logits_only_on_the_gpu_with_the_lm_head() -> None:
    job = est(60, 10, head=8)  # head GPU 30 + 10 = 40; others 30 + 10 - 8 = 32; total 70
    assert job.per_gpu_bytes(2, Parallelism.DEVICE_MAP) == 40 * GIB
    assert job.device_map_min_bytes(2) == 32 * GIB

    def fits(*gpus: float) -> bool:
        v = view(node("a", list(gpus)))
        return place(v.now, job, Parallelism.DEVICE_MAP, 2, everywhere) is not None

    assert fits(45, 33)  # pool 45 + 28.05 = 73.05; head 45 >= 40; other 33 >= 32
    assert not fits(45, 31)  # pool 71.35 suffices, the other GPU does not hold 32
    assert not fits(39, 39)  # pool 72.15 suffices, the head GPU does not hold 40
    assert not fits(40, 33)  # pool 40 + 28.05 = 68.05 < 70


def test_a_one_gpu_device_map_is_the_whole_job_on_one_gpu() -> None:
    v = view(node("a", [80, 71]))
    assert on(v, place(v.now, est(60, 10), Parallelism.DEVICE_MAP, 1, everywhere)) == [("a", (1,))]


def test_placement_only_uses_nodes_the_filter_allows() -> None:
    v = view(node("a", [30]), node("b", [80]))
    assert on(v, v.place_now(est(20), Parallelism.FSDP, 1, v.select({}))) == [("a", (0,))]
    assert on(v, place(v.now, est(20), Parallelism.FSDP, 1, lambda pos: pos == 1)) == [("b", (0,))]


def test_by_count_placement_takes_the_most_free_gpus_whatever_the_need() -> None:
    v = view(node("a", [10, 30, 20]), node("b", [25]))
    placed = place_by_count(v.now, est(100), Parallelism.FSDP, 2, everywhere)
    assert on(v, placed) == [("a", (1, 2))]
    assert placed is not None and placed.per_gpu_bytes == 50 * GIB


def test_the_index_follows_assumptions_and_holds() -> None:
    v = view(node("a", [30, 50]), node("b", [40]))
    first = place(v.now, est(25), Parallelism.FSDP, 1, everywhere)
    assert on(v, first) == [("a", (0,))]
    assert first is not None
    v.assume(first)  # a-0 now holds 5
    assert on(v, place(v.now, est(25), Parallelism.FSDP, 1, everywhere)) == [("b", (0,))]
    v.now.hold(1, (0,))  # b-0 held for another job
    assert on(v, place(v.now, est(25), Parallelism.FSDP, 1, everywhere)) == [("a", (1,))]
    assert v.largest_now(v.select({})) == (50 * GIB, "a", 1)


def test_a_node_whose_gpus_were_assumed_is_ranked_by_what_is_left() -> None:
    job = est(60, 10)  # 40 GiB per GPU at 2
    v = view(node("a", [50, 50]), node("b", [45, 45]))
    first = place(v.now, job, Parallelism.FSDP, 2, everywhere)
    assert on(v, first) == [("b", (0, 1))]
    assert first is not None
    v.assume(first)  # b: [5, 5]
    assert on(v, place(v.now, job, Parallelism.FSDP, 2, everywhere)) == [("a", (0, 1))]
    second = place(v.now, job, Parallelism.FSDP, 2, everywhere)
    assert second is not None
    v.assume(second)  # a: [10, 10]
    assert place(v.now, job, Parallelism.FSDP, 2, everywhere) is None
    assert on(v, place(v.now, est(9), Parallelism.FSDP, 1, everywhere)) == [("a", (0,))]


def test_a_device_map_charges_the_head_gpu_its_figure_and_each_other_its_share() -> None:
    job = est(60, 10, head=8)  # head GPU 30 + 10 = 40; the other 30 + 10 - 8 = 32
    v = view(node("a", [33, 45]))
    placed = place(v.now, job, Parallelism.DEVICE_MAP, 2, everywhere)
    assert on(v, placed) == [("a", (1, 0))]  # the most free GPU holds the LM head
    assert placed is not None
    v.assume(placed)
    assert frees(v) == {"a-0": 1, "a-1": 5}


def test_an_empty_index_places_nothing() -> None:
    index = FreeIndex([])
    assert place(index, est(1), Parallelism.FSDP, 1, everywhere) is None
    assert index.largest_free(everywhere) is None


def test_a_device_map_admission_leaves_no_gpu_below_zero_effective_free_memory() -> None:
    job = est(60, 10, head=8)  # head GPU 40, others 32: seed 1's rule places it on [45, 33]
    v = view(node("a", [45, 33]))
    placed = place(v.now, job, Parallelism.DEVICE_MAP, 2, everywhere)
    assert placed is not None
    v.assume(placed)
    assert min(frees(v).values()) >= 0  # a-1 holds its 32 GiB share, not the head's 40


# -- visibleDevices: every job on one node -------------------------------------------------


def test_one_node_shapes_are_the_whole_job_on_one_node_or_none() -> None:
    assert list(shapes(8, 4, Parallelism.FSDP)) == [(2, 4), (4, 2), (8, 1)]
    assert list(shapes(8, 4, Parallelism.FSDP, one_node=True)) == []
    assert list(shapes(4, 4, Parallelism.FSDP, one_node=True)) == [(1, 4)]
    assert list(shapes(3, 4, Parallelism.DDP, one_node=True)) == [(1, 3)]
    assert list(shapes(3, 2, Parallelism.DDP, one_node=True)) == []


def test_only_visible_devices_keeps_every_job_on_one_node_now_and_when_empty() -> None:
    for mode in GpuMode:
        v = view(node("a", [80]), settings=PackingSettings(gpu_mode=mode))
        one = mode is GpuMode.VISIBLE_DEVICES
        assert (v.now.one_node, v.empty.one_node) == (one, one), mode


def _eight_gpu_cluster(settings: PackingSettings) -> ClusterView:
    """The worked example: 4-GPU nodes, two of which (n3, n5) take 8 x 30 GiB together."""
    return view(
        node("n1", [80] * 4),
        node("n2", [35] * 4),
        node("n3", [31] * 4),
        node("n4", [40, 40, 40, 29]),
        node("n5", [30] * 4),
        settings=settings,
    )


def test_visible_devices_never_places_a_job_across_nodes() -> None:
    job = est(160, 10)  # 30 GiB per GPU at 8: every 4-GPU node but n4 holds its share
    spread = [("n3", (0, 1, 2, 3)), ("n5", (0, 1, 2, 3))]
    for settings in (SPANS, PackingSettings(gpu_mode=GpuMode.DEVICE_PLUGIN)):
        v = _eight_gpu_cluster(settings)
        assert sorted(on(v, place(v.now, job, Parallelism.FSDP, 8, everywhere))) == spread
        by_count = place_by_count(v.now, job, Parallelism.FSDP, 8, everywhere)
        assert by_count is not None and len(by_count.parts) == 2
        assert closest(v.now, job, Parallelism.FSDP, 8, everywhere) is not None
    v = _eight_gpu_cluster(SHARED)
    for index in (v.now, v.empty):
        for parallelism in (Parallelism.FSDP, Parallelism.DDP):
            assert place(index, job, parallelism, 8, everywhere) is None
            assert place_by_count(index, job, parallelism, 8, everywhere) is None
            assert closest(index, job, parallelism, 8, everywhere) is None
    every = v.select({})
    assert not v.fits_empty(job, Parallelism.FSDP, 8, every)
    assert not v.shapes_empty(job, Parallelism.FSDP, 8, every)
    # The worked DDP example (3 GPUs over 2-GPU nodes) has no placement either.
    two_gpu = view(node("a", [80, 80]), node("b", [30, 25]), node("c", [50, 50]))
    assert place(two_gpu.now, est(24), Parallelism.DDP, 3, everywhere) is None
    assert place_by_count(two_gpu.now, est(24), Parallelism.DDP, 3, everywhere) is None
    assert closest(two_gpu.now, est(24), Parallelism.DDP, 3, everywhere) is None


def test_visible_devices_places_a_job_that_fits_one_node_there() -> None:
    job = est(80, 10)  # 30 GiB per GPU at 4
    # a's GPUs 0 and 1 run another job's pods (20 GiB each): shared by memory they still
    # hold 30, so a takes the whole job; with whole GPUs only 2 and 3 are open on a.
    a = NodeState(
        "a",
        (
            gpu("a", 0, 60, pods={"p": 20}),
            gpu("a", 1, 60, pods={"q": 20}),
            gpu("a", 2, 80),
            gpu("a", 3, 80),
        ),
    )
    nodes = (a, node("b", [80, 80]), node("c", [80, 80]))
    shared = view(*nodes, settings=SHARED)
    assert on(shared, place(shared.now, job, Parallelism.FSDP, 4, everywhere)) == [
        ("a", (0, 1, 2, 3))
    ]
    for placed in (
        place_by_count(shared.now, job, Parallelism.FSDP, 4, everywhere),
        closest(shared.now, job, Parallelism.FSDP, 4, everywhere),
    ):
        assert on(shared, placed) == [("a", (2, 3, 0, 1))]  # the most free first
    spans = view(*nodes, settings=SPANS)
    placed = on(spans, place(spans.now, job, Parallelism.FSDP, 4, everywhere))
    assert sorted(placed) == [("a", (2, 3)), ("b", (0, 1))]


def test_counting_gpus_that_hold_a_need_stops_at_enough() -> None:
    """Messages need "fewer than n" or "n or more"; a pass must not walk a whole cluster."""
    v = view(node("a", [80, 40, 10]), node("b", [50, 30]), settings=SPANS)
    everywhere = v.select({})
    assert v.count_now(everywhere, 35 * GIB, enough=10) == 3  # 80, 50 and 40 hold 35
    assert v.count_now(everywhere, 35 * GIB, enough=2) == 2
    assert v.count_now(everywhere, 90 * GIB, enough=2) == 0
    assert v.count_now(everywhere, 50 * GIB, enough=5) == 2  # exactly the need holds it
    assert v.count_empty(everywhere, 35 * GIB, enough=10) == 5  # empty: 80 GiB each
