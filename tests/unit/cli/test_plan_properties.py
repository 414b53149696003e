"""Admission invariants on generated clusters and queues (hypothesis).

Each property is checked against figures recomputed here from the raw snapshot (health, the
agents' free memory, reservations, device slots), not read back from the packer's index, so a
bug in the index or the inventory cannot hide itself.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from functools import cache
from itertools import combinations
from typing import TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.api import conditions as cond
from controller.api.enums import AdmissionPolicy
from controller.api.finetunejob import MAX_GPUS
from controller.base.units import GIB
from controller.decision import (
    AdmissionSettings,
    Decision,
    JobRequest,
    Outcome,
    QueueingStrategy,
    plan,
    queue_order,
)
from controller.estimator.result import Estimate
from controller.estimator.settings import Parallelism
from controller.packing.inventory import (
    GpuDevice,
    GpuMode,
    NodeGpus,
    NodeState,
    PackingSettings,
    Reservation,
    Snapshot,
)
from controller.packing.placement import Placed, closest, place, place_by_count
from controller.packing.view import ClusterView

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
TTL = timedelta(seconds=90)
NAMES = ["node-a", "node-b", "node-c", "node-d", "node-e", "gpu-1", "gpu-2", "z"]
POOLS = ["x", "y"]
PRODUCTS = ["NVIDIA-H100", "NVIDIA-L4"]
EXAMPLES = settings(max_examples=120, deadline=None)
T = TypeVar("T")


# -- generated inputs -------------------------------------------------------------------------


@cache
def ints(low: int, high: int) -> st.SearchStrategy[int]:
    """One strategy object per range: building strategies inside draws is what costs."""
    return st.integers(low, high)


def pick(draw: st.DrawFn, options: Sequence[T]) -> T:
    return options[draw(ints(0, len(options) - 1))]


SCALES = (4, 10, 40, 160)
WHOLE_GIB = {hi: ints(0, hi).map(lambda g: g * GIB) for hi in SCALES}
ODD_BYTES = {hi: ints(0, hi * GIB) for hi in SCALES}


def gib_bytes(draw: st.DrawFn, high: int) -> int:
    """Bytes, mostly whole GiB (ties are where the rules are subtle), sometimes odd."""
    return draw(ODD_BYTES[high] if draw(ints(0, 2)) == 0 else WHOLE_GIB[high])


def gpus_of(draw: st.DrawFn, name: str, product: str) -> tuple[GpuDevice, ...]:
    total_gib = pick(draw, [16, 24, 40, 80])
    out = []
    for i in range(pick(draw, [1, 2, 2, 3, 4, 4])):
        total = total_gib * GIB
        if draw(ints(0, 19)) == 0:  # memory not reported
            out.append(GpuDevice(f"{name}-{i}", i, product, None, None))
            continue
        free = total if draw(ints(0, 1)) else draw(ints(0, total_gib)) * GIB
        pods: dict[str, int] = {}
        if draw(ints(0, 3)) == 0 and free < total:
            pods[pick(draw, ["pod-r0", "pod-r1", "pod-other"])] = total - free
        out.append(GpuDevice(f"{name}-{i}", i, product, total, free, pods))
    return tuple(out)


def node_state(draw: st.DrawFn, name: str, healthy: bool = False) -> NodeState:
    product = pick(draw, PRODUCTS)
    gpus = gpus_of(draw, name, product)
    sick = not healthy and draw(ints(0, 7)) == 0
    allocatable = draw(ints(-4, 4))  # None half the time
    return NodeState(
        name=name,
        gpus=gpus,
        labels={"pool": pick(draw, POOLS)},
        ready=not (sick and draw(ints(0, 1))),
        cordoned=sick and bool(draw(ints(0, 1))),
        agent_ready=not (sick and draw(ints(0, 1))),
        heartbeat=NOW - timedelta(seconds=0 if not sick else pick(draw, [0, 90, 91, 600])),
        gpu_allocatable=None if allocatable < 0 else allocatable,
        gpu_allocated=0 if healthy else max(0, draw(ints(-2, 2))),
    )


def node_states(name: str, healthy: bool = False) -> st.SearchStrategy[NodeState]:
    return st.composite(lambda draw: node_state(draw, name, healthy))()


def reservations_on(draw: st.DrawFn, nodes: Sequence[NodeState]) -> tuple[Reservation, ...]:
    out = []
    for r in range(draw(ints(0, 3))):
        n = pick(draw, nodes)
        picked = [g for g in n.gpus if draw(ints(0, 1))] or [n.gpus[0]]
        part = NodeGpus(n.name, tuple(g.index for g in picked), tuple(g.uuid for g in picked))
        pods = frozenset(pick(draw, [(), (f"pod-r{r}",)]))
        allocated = {n.name: draw(ints(0, len(picked)))}
        out.append(Reservation(f"ns/old{r}", (part,), gib_bytes(draw, 40), pods, allocated))
    return tuple(out)


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    names = [name for name in NAMES if draw(ints(0, 1))][:6] or [pick(draw, NAMES)]
    nodes = tuple(node_state(draw, name) for name in names)
    return Snapshot(nodes, reservations_on(draw, nodes), NOW)


def estimate_of(draw: st.DrawFn, head: bool = False) -> Estimate:
    sharded = gib_bytes(draw, pick(draw, SCALES))
    replicated = gib_bytes(draw, pick(draw, SCALES[:3]))
    head_bytes = draw(ints(0, 40)) * replicated // 40 if head else 0
    return Estimate(
        "x", {"a": sharded + replicated}, 0, 0, sharded, replicated, Fraction(1), head_bytes
    )


def estimates(head: bool = False) -> st.SearchStrategy[Estimate]:
    return st.composite(lambda draw: estimate_of(draw, head))()


def job_request(
    draw: st.DrawFn, i: int, policies: Sequence[AdmissionPolicy], selected: bool | None
) -> JobRequest:
    policy = pick(draw, policies)
    gpus = draw(ints(1, 4)) if draw(ints(0, 1)) else 1
    low, high = 1, None
    if policy is AdmissionPolicy.RESIZE:
        low = draw(ints(1, gpus))
        bound = draw(ints(gpus - 1, 6))
        high = None if bound < gpus else bound
    chosen = bool(draw(ints(0, 1))) if selected is None else selected
    age = draw(ints(-1, 60))
    return JobRequest(
        key=f"ns/job{i}",
        estimate=estimate_of(draw, head=bool(draw(ints(0, 1)))),
        parallelism=pick(draw, list(Parallelism)),
        gpus=gpus,
        policy=policy,
        min_gpus=low,
        max_gpus=high,
        selector={"pool": pick(draw, POOLS)} if chosen else {},
        priority=draw(ints(0, 2)),
        created=None if age < 0 else NOW - timedelta(minutes=age),
        suspend=draw(ints(0, 9)) == 0,
    )


def queues(
    policies: Sequence[AdmissionPolicy] = (AdmissionPolicy.ENFORCE, AdmissionPolicy.RESIZE),
    selected: bool | None = None,
) -> st.SearchStrategy[list[JobRequest]]:
    @st.composite
    def build(draw: st.DrawFn) -> list[JobRequest]:
        return [job_request(draw, i, policies, selected) for i in range(draw(ints(1, 6)))]

    return build()


admission_settings = st.builds(
    AdmissionSettings,
    packing=st.builds(
        PackingSettings,
        headroom_bytes=st.sampled_from([0, GIB]),
        headroom_percent=st.sampled_from([0, 5]),
        gpu_mode=st.sampled_from(list(GpuMode)),
    ),
    queueing=st.sampled_from(list(QueueingStrategy)),
    starvation_limit=st.sampled_from([timedelta(minutes=30), timedelta(minutes=1)]),
)


# -- the snapshot, recomputed independently ----------------------------------------------


def healthy(node: NodeState, now: datetime | None) -> bool:
    fresh = now is None or (node.heartbeat is not None and now - node.heartbeat <= TTL)
    return node.ready and not node.cordoned and node.agent_ready and fresh


def reported(g: GpuDevice) -> bool:
    return g.total_bytes is not None and g.free_bytes is not None


@dataclass
class RefGpu:
    uuid: str
    index: int
    free: int
    taken: bool
    #: Measured free less headroom, None where a pod's process is on it: what the device
    #: plugin may hand a new pod (it picks any GPU of the node no pod holds).
    whole: int | None = None


@dataclass
class RefNode:
    name: str
    labels: dict[str, str]
    gpus: list[RefGpu]
    slots: int
    held: set[str] = field(default_factory=set)

    def open(self) -> list[RefGpu]:
        return [g for g in self.gpus if not g.taken and g.uuid not in self.held]


def reference(snapshot: Snapshot, packing: PackingSettings) -> dict[str, RefNode]:
    """Placeable nodes with each GPU's effective free memory, straight from the rules."""
    owed: dict[str, int] = {}
    pending: dict[str, int] = {}
    reserved: set[str] = set()
    devices = {g.uuid: g for n in snapshot.nodes for g in n.gpus}
    for r in snapshot.reservations:
        for part in r.placement:
            pending[part.node] = pending.get(part.node, 0) + max(
                0, len(part.uuids) - r.allocated_gpus.get(part.node, 0)
            )
            for uuid in part.uuids:
                reserved.add(uuid)
                used = devices[uuid].pod_used_bytes if uuid in devices else {}
                seen = sum(b for uid, b in used.items() if uid in r.pod_uids)
                owed[uuid] = owed.get(uuid, 0) + max(0, r.per_gpu_bytes - seen)
    exclusive = packing.gpu_mode is not GpuMode.VISIBLE_DEVICES
    out = {}
    for n in snapshot.nodes:
        if not healthy(n, snapshot.now):
            continue
        gpus = []
        for g in n.gpus:
            if not reported(g):
                continue
            assert g.total_bytes is not None and g.free_bytes is not None
            keep = packing.headroom_bytes + g.total_bytes * packing.headroom_percent // 100
            free = min(g.total_bytes - keep, g.free_bytes - keep - owed.get(g.uuid, 0))
            taken = exclusive and (g.uuid in reserved or bool(g.pod_used_bytes))
            whole = None if g.pod_used_bytes else min(g.total_bytes - keep, g.free_bytes - keep)
            gpus.append(RefGpu(g.uuid, g.index, free, taken, whole))
        if not gpus:
            continue
        slots = len(gpus)
        if packing.gpu_mode is GpuMode.DEVICE_PLUGIN:
            allocatable = len(gpus) if n.gpu_allocatable is None else n.gpu_allocatable
            slots = max(0, min(len(gpus), allocatable) - n.gpu_allocated - pending.get(n.name, 0))
        out[n.name] = RefNode(n.name, dict(n.labels), gpus, slots)
    return out


def empty_reference(snapshot: Snapshot, packing: PackingSettings) -> list[RefNode]:
    """The cluster with no work at all: every node with reported GPUs, whatever its health,
    each GPU at its total less headroom, every device slot free."""
    out = []
    for n in snapshot.nodes:
        gpus = []
        for g in n.gpus:
            if g.total_bytes is not None and g.free_bytes is not None:
                keep = packing.headroom_bytes + g.total_bytes * packing.headroom_percent // 100
                gpus.append(RefGpu(g.uuid, g.index, g.total_bytes - keep, False))
        if gpus:
            # Every GPU, whatever the device plugin reports now (it may be restarting).
            out.append(RefNode(n.name, dict(n.labels), gpus, len(gpus)))
    return out


def matches(labels: dict[str, str] | NodeState, selector: dict[str, str]) -> bool:
    got = labels.labels if isinstance(labels, NodeState) else labels
    return all(got.get(k) == v for k, v in selector.items())


def matching_gpus(snapshot: Snapshot, selector: dict[str, str]) -> int:
    return sum(1 for n in snapshot.nodes if matches(n, selector) for g in n.gpus if reported(g))


def allowed_counts(job: JobRequest) -> range:
    if job.policy is AdmissionPolicy.RESIZE:
        return range(job.min_gpus, (job.max_gpus or MAX_GPUS) + 1)
    return range(job.gpus, job.gpus + 1)


# -- (1) no GPU below zero ------------------------------------------------------------------


@EXAMPLES
@given(snapshots(), queues(), admission_settings)
def test_no_admission_ever_takes_a_gpu_below_zero_effective_free_memory(
    snapshot: Snapshot, jobs: list[JobRequest], admission: AdmissionSettings
) -> None:
    packing = admission.packing
    ref = reference(snapshot, packing)
    decisions = plan(snapshot, jobs, admission)
    by_key = {j.key: j for j in jobs}
    charged: dict[str, int] = {}
    used_slots: dict[str, int] = {}
    exclusive = packing.gpu_mode is not GpuMode.VISIBLE_DEVICES
    for d in decisions:
        if not d.admitted:
            assert d.placement == ()
            continue
        j = by_key[d.job]
        assert d.admitted_gpus is not None
        assert d.per_gpu_bytes == j.estimate.per_gpu_bytes(d.admitted_gpus, j.parallelism)
        assert sum(len(p.indices) for p in d.placement) == d.admitted_gpus
        assert len({len(p.indices) for p in d.placement}) == 1  # the same g on every node
        if j.parallelism is Parallelism.DEVICE_MAP or not exclusive:
            assert len(d.placement) == 1  # visibleDevices: the UUIDs go into one pod
        for part in d.placement:
            n = ref[part.node]  # KeyError: placed on a node that takes no work
            assert matches(n.labels, dict(j.selector))
            gpus = {g.uuid: g for g in n.gpus}
            assert len(set(part.uuids)) == len(part.uuids)
            used_slots[n.name] = used_slots.get(n.name, 0) + len(part.uuids)
            if packing.gpu_mode is GpuMode.DEVICE_PLUGIN:
                # The device plugin may hand the pod any GPU of the node that no pod's process
                # is on, whichever reservation names it: the least free of them must hold it.
                worst = sorted(g.whole for g in n.gpus if g.whole is not None)[: len(part.uuids)]
                assert len(worst) == len(part.uuids)
                if j.parallelism is Parallelism.DEVICE_MAP:
                    assert device_map_ok(j.estimate, worst[::-1]), f"{d.job} may not fit"
                else:
                    assert worst[0] >= d.per_gpu_bytes, f"{d.job} may get a GPU too small"
            for p, (uuid, index) in enumerate(zip(part.uuids, part.indices, strict=True)):
                g = gpus[uuid]
                assert g.index == index and not g.taken
                if exclusive:
                    assert uuid not in charged, f"{uuid} handed out twice"
                # A device map's first GPU holds the LM head; each other one its own share.
                held = d.per_gpu_bytes
                if j.parallelism is Parallelism.DEVICE_MAP and p > 0:
                    held = j.estimate.device_map_min_bytes(d.admitted_gpus)
                charged[uuid] = charged.get(uuid, 0) + held
                assert charged[uuid] <= g.free, f"{uuid} below zero after {d.job}"
    if packing.gpu_mode is GpuMode.DEVICE_PLUGIN:
        for name, count in used_slots.items():
            assert count <= ref[name].slots


# -- (2) adding unrelated GPUs never costs an admission ---------------------------------------


def essence(d: Decision) -> tuple[object, ...]:
    message = "" if d.reason == cond.REASON_NO_MATCHING_GPU else d.message
    return (d.job, d.outcome, d.reason, d.admitted_gpus, d.per_gpu_bytes, d.placement, message)


@EXAMPLES
@given(
    snapshots(),
    queues(policies=list(AdmissionPolicy), selected=True),
    admission_settings,
    st.data(),
)
def test_a_node_no_job_selects_changes_no_decision(
    snapshot: Snapshot, jobs: list[JobRequest], admission: AdmissionSettings, data: st.DataObject
) -> None:
    name = data.draw(st.sampled_from(["aaa-new", "zzz-new"]))
    extra = replace(data.draw(node_states(name, healthy=True)), labels={"pool": "z"})
    before = plan(snapshot, jobs, admission)
    after = plan(replace(snapshot, nodes=(*snapshot.nodes, extra)), jobs, admission)
    assert [essence(d) for d in after] == [essence(d) for d in before]


@EXAMPLES
@given(snapshots(), queues(policies=list(AdmissionPolicy)), admission_settings, st.data())
def test_the_first_job_in_the_queue_stays_admitted_when_any_node_is_added(
    snapshot: Snapshot, jobs: list[JobRequest], admission: AdmissionSettings, data: st.DataObject
) -> None:
    name = data.draw(st.sampled_from(["aaa-new", "zzz-new"]))
    extra = data.draw(node_states(name, healthy=True))
    first = jobs[queue_order(jobs)[0]]
    before = plan(snapshot, jobs, admission)[0]
    after = plan(replace(snapshot, nodes=(*snapshot.nodes, extra)), jobs, admission)[0]
    assert before.job == after.job == first.key
    if before.admitted:
        assert after.admitted, f"{after.reason}: {after.message}"
        assert before.admitted_gpus is not None and after.admitted_gpus is not None
        # Resize: the count that fits can only come nearer the request.
        assert abs(after.admitted_gpus - first.gpus) <= abs(before.admitted_gpus - first.gpus)
        if before.outcome is Outcome.ADMIT and before.reason == cond.REASON_FITS:
            assert after.reason == cond.REASON_FITS


# -- (3) deterministic ------------------------------------------------------------------------


@EXAMPLES
@given(snapshots(), queues(policies=list(AdmissionPolicy)), admission_settings, st.randoms())
def test_plan_is_deterministic_whatever_the_order_of_nodes_gpus_and_reservations(
    snapshot: Snapshot,
    jobs: list[JobRequest],
    admission: AdmissionSettings,
    rng: random.Random,
) -> None:
    first = plan(snapshot, jobs, admission)
    assert plan(snapshot, jobs, admission) == first
    nodes = [replace(n, gpus=tuple(rng.sample(n.gpus, len(n.gpus)))) for n in snapshot.nodes]
    rng.shuffle(nodes)
    reservations = list(snapshot.reservations)
    rng.shuffle(reservations)
    shuffled = Snapshot(tuple(nodes), tuple(reservations), snapshot.now)
    assert plan(shuffled, jobs, admission) == first


# -- (4) Reject means never, Queue means some day ---------------------------------------------


@EXAMPLES
@given(snapshots(), queues(policies=list(AdmissionPolicy)), admission_settings)
def test_a_rejected_job_fits_no_allowed_count_of_the_empty_cluster(
    snapshot: Snapshot, jobs: list[JobRequest], admission: AdmissionSettings
) -> None:
    by_key = {j.key: j for j in jobs}
    for d in plan(snapshot, jobs, admission):
        j = by_key[d.job]
        fresh = ClusterView(snapshot, admission.packing)
        where = fresh.select(j.selector)
        fits_empty = [
            n
            for n in allowed_counts(j)
            if n <= where.gpus and place(fresh.empty, j.estimate, j.parallelism, n, where.empty)
        ]
        # The same question answered from the raw snapshot, without the view's empty index.
        empty = empty_reference(snapshot, admission.packing)
        slots = admission.packing.gpu_mode is GpuMode.DEVICE_PLUGIN
        one_node = admission.packing.gpu_mode is GpuMode.VISIBLE_DEVICES
        brute = [
            n
            for n in allowed_counts(j)
            if n <= where.gpus
            and brute_force(
                empty, j.estimate, j.parallelism, n, dict(j.selector), slots, one_node=one_node
            )
        ]
        assert fits_empty == brute
        if d.outcome is Outcome.REJECT:
            assert not fits_empty, f"{d.reason}: {d.message}"
            if d.reason == cond.REASON_NO_MATCHING_GPU:
                assert matching_gpus(snapshot, dict(j.selector)) == 0
            elif d.reason == cond.REASON_INSUFFICIENT_GPUS:
                # Too few matching GPUs, or none in a shape the parallelism can use.
                nothing = Estimate("x", {"a": 0}, 0, 0, 0, 0)
                matching = matching_gpus(snapshot, dict(j.selector))
                assert matching > 0
                assert matching < min(allowed_counts(j)) or not brute_force(
                    empty,
                    nothing,
                    j.parallelism,
                    j.gpus,
                    dict(j.selector),
                    slots,
                    one_node=one_node,
                )
            else:
                assert d.reason == cond.REASON_INSUFFICIENT_VRAM
        if d.reason in (cond.REASON_WAITING_FOR_VRAM, cond.REASON_WAITING_FOR_NODES):
            assert fits_empty, d.message


@EXAMPLES
@given(snapshots(), queues(), admission_settings)
def test_a_job_waits_for_nodes_exactly_when_it_would_be_admitted_were_every_node_healthy(
    snapshot: Snapshot, jobs: list[JobRequest], admission: AdmissionSettings
) -> None:
    """WaitingForNodes: the job would be admitted, at the count it names, on the same
    snapshot with every node Ready, uncordoned and its agent fresh; WaitingForVRAM: not."""
    job = replace(jobs[0], suspend=False)
    (d,) = plan(snapshot, [job], admission)
    healed = tuple(
        replace(n, ready=True, cordoned=False, agent_ready=True, heartbeat=NOW)
        for n in snapshot.nodes
    )
    (again,) = plan(replace(snapshot, nodes=healed), [job], admission)
    if d.reason == cond.REASON_WAITING_FOR_NODES:
        assert again.admitted, again.message
        assert again.per_gpu_bytes == d.per_gpu_bytes
    elif d.reason == cond.REASON_WAITING_FOR_VRAM:
        assert not again.admitted, f"{d.message} / {again.message}"


# -- (5) the index agrees with a brute-force search -------------------------------------------


def device_map_ok(estimate: Estimate, frees_desc: Sequence[int]) -> bool:
    """Seed 1's rule for GPUs taken most free first, written out."""
    n = len(frees_desc)
    pool = frees_desc[0] + Fraction(85, 100) * sum(frees_desc[1:])
    head_ok = frees_desc[0] >= estimate.per_gpu_bytes(n, Parallelism.DEVICE_MAP)
    rest_ok = n == 1 or min(frees_desc[1:]) >= estimate.device_map_min_bytes(n)
    return pool >= estimate.total_bytes and head_ok and rest_ok


Choice = list[tuple[str, tuple[int, ...]]]


def brute_force(
    nodes: Sequence[RefNode],
    estimate: Estimate,
    parallelism: Parallelism,
    n: int,
    selector: dict[str, str],
    count_slots: bool,
    *,
    one_node: bool,
    any_free: bool = False,
) -> Choice | None:
    """Search every node set and GPU subset for the documented best fit; with `one_node`
    (visibleDevices) only on one node; with `any_free` (devicePlugin) a node judged by the
    least free GPUs its device plugin may hand out, naming its least free open ones."""
    usable = [x for x in sorted(nodes, key=lambda x: x.name) if matches(x.labels, selector)]
    if parallelism is Parallelism.DEVICE_MAP and n > 1:
        best: tuple[tuple[int, str], Choice] | None = None
        for x in usable:
            open_gpus = x.open()
            if len(open_gpus) < n or (count_slots and x.slots < n):
                continue
            if any_free:
                worst = sorted(g.whole for g in x.gpus if g.whole is not None)[:n]
                tighter = best is None or (worst[0], x.name) < best[0]
                if device_map_ok(estimate, worst[::-1]) and tighter:
                    named = sorted(open_gpus, key=lambda g: (g.free, g.index))[:n]
                    named.sort(key=lambda g: (-g.free, g.index))
                    best = ((worst[0], x.name), [(x.name, tuple(g.index for g in named))])
                continue
            ranked = sorted(open_gpus, key=lambda g: (-g.free, g.index))
            top = ranked[:n]
            some = any(
                device_map_ok(estimate, sorted((g.free for g in c), reverse=True))
                for c in combinations(open_gpus, n)
            )
            # Most free first is as good as any subset: if any n GPUs hold it, those do.
            assert some == device_map_ok(estimate, [g.free for g in top])
            if some:
                key = (top[-1].free, x.name)
                if best is None or key < best[0]:
                    best = (key, [(x.name, tuple(g.index for g in top))])
        return None if best is None else best[1]
    need = estimate.per_gpu_bytes(n, parallelism)
    for k in range(1, 2 if one_node else n + 1):
        if n % k:
            continue
        g = n // k
        fits: list[tuple[tuple[int, str], str, tuple[int, ...]]] = []
        for x in usable:
            if count_slots and x.slots < g:
                continue
            if any_free:
                wholes = [y.whole for y in x.gpus if y.whole is not None]
                named = sorted((y.free, y.index) for y in x.open())[:g]
                if wholes and min(wholes) >= need and len(named) == g:
                    fits.append(((min(wholes), x.name), x.name, tuple(i for _, i in named)))
                continue
            holding = sorted((y.free, y.index) for y in x.open() if y.free >= need)
            if len(holding) < g:
                continue
            frees = sorted((y.free for y in x.open()), reverse=True)
            # One GPU: the least free that holds; g GPUs: the node's g-th largest free.
            key = holding[0][0] if g == 1 else frees[g - 1]
            fits.append(((key, x.name), x.name, tuple(i for _, i in holding[:g])))
        if len(fits) < k:
            continue
        chosen = min(combinations(fits, k), key=lambda c: sorted(f[0] for f in c))
        return sorted((name, tuple(sorted(ix))) for _, name, ix in chosen)
    return None


def as_choice(view: ClusterView, placed: Placed | None, ordered: bool) -> Choice | None:
    if placed is None:
        return None
    parts = [(p.node, p.indices) for p in view.node_gpus(placed)]
    return parts if ordered else sorted((name, tuple(sorted(ix))) for name, ix in parts)


def charge(
    ref: dict[str, RefNode],
    choice: Choice,
    per_gpu: int,
    exclusive: bool,
    slots: bool,
    head_extra: int = 0,
) -> None:
    """A device map's first GPU (in the choice's order) holds the LM head: `head_extra` more
    than each of the others."""
    for p, (name, indices) in enumerate(choice):
        x = ref[name]
        for g in x.gpus:
            if g.index in indices:
                head = p == 0 and g.index == indices[0]
                g.free -= per_gpu if head else per_gpu - head_extra
                g.taken = g.taken or exclusive
        if slots:
            x.slots -= len(indices)


placements = st.tuples(
    st.one_of(estimates(), estimates(head=True)),
    st.sampled_from(list(Parallelism)),
    st.one_of(st.integers(1, 2), st.integers(1, 8)),
    st.sampled_from([{}, {"pool": "x"}, {"pool": "y"}]),
)


@settings(max_examples=200, deadline=None)
@given(
    snapshots(),
    st.sampled_from(list(GpuMode)),
    st.lists(placements, min_size=1, max_size=6),
    st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_best_fit_placement_agrees_with_a_brute_force_search(
    snapshot: Snapshot,
    mode: GpuMode,
    requests: list[tuple[Estimate, Parallelism, int, dict[str, str]]],
    holds: list[bool],
) -> None:
    packing = PackingSettings(gpu_mode=mode)
    exclusive = mode is not GpuMode.VISIBLE_DEVICES
    slots = mode is GpuMode.DEVICE_PLUGIN
    view = ClusterView(snapshot, packing)
    ref = reference(snapshot, packing)
    # The inventory the index starts from is the one the rules give.
    assert {
        x.name: (x.slots, [(g.uuid, g.free, g.taken) for g in x.gpus]) for x in ref.values()
    } == {x.name: (x.slots, [(s.uuid, s.free, s.taken) for s in x.gpus]) for x in view.now.nodes}
    for (estimate, parallelism, n, selector), hold in zip(requests, holds, strict=False):
        where = view.select(selector)
        dm = parallelism is Parallelism.DEVICE_MAP and n > 1
        expected = brute_force(
            list(ref.values()),
            estimate,
            parallelism,
            n,
            selector,
            slots,
            one_node=mode is GpuMode.VISIBLE_DEVICES,
            any_free=mode is GpuMode.DEVICE_PLUGIN,
        )
        placed = place(view.now, estimate, parallelism, n, where.now)
        assert as_choice(view, placed, ordered=dm) == expected
        by_count = place_by_count(view.now, estimate, parallelism, n, where.now)
        if placed is not None:
            assert by_count is not None
        near = closest(view.now, estimate, parallelism, n, where.now)
        if by_count is not None:
            assert near == by_count
        for some in (placed, by_count, near):
            if some is not None and mode is GpuMode.VISIBLE_DEVICES:
                assert len(some.parts) == 1  # the UUIDs go into one pod's environment
        if hold and by_count is not None:
            # A starving job's hold: those GPUs leave the reference as they leave the index.
            for name, indices in as_choice(view, by_count, ordered=True) or []:
                ref[name].held.update(g.uuid for g in ref[name].gpus if g.index in indices)
            for pos, gpus in by_count.parts:
                view.now.hold(pos, gpus)
        elif placed is not None:
            assert expected is not None
            charge(ref, expected, placed.per_gpu_bytes, exclusive, slots, placed.head_gpu_extra)
            view.assume(placed)


def test_the_reference_search_finds_the_worked_examples() -> None:
    """The brute force itself, on the docstring's second example (so it can fail too)."""
    a = RefNode(
        "a", {}, [RefGpu(f"a-{i}", i, f * GIB, False) for i, f in enumerate([80, 80, 45, 10])], 4
    )
    b = RefNode("b", {}, [RefGpu(f"b-{i}", i, f * GIB, False) for i, f in enumerate([50, 41])], 2)
    e = Estimate("x", {"a": 70 * GIB}, 0, 0, 60 * GIB, 10 * GIB)
    for one_node in (False, True):
        assert brute_force([a, b], e, Parallelism.FSDP, 2, {}, True, one_node=one_node) == [
            ("b", (0, 1))
        ]
        assert brute_force([a, b], e, Parallelism.DDP, 2, {}, True, one_node=one_node) == [
            ("a", (0, 1))
        ]
        assert brute_force([b], e, Parallelism.DDP, 2, {}, True, one_node=one_node) is None
    # FSDP on 4 (25 GiB each): a has only three GPUs that hold 25, so 2 nodes x 2 GPUs, which
    # visibleDevices (one node) cannot take.
    spread = [("a", (0, 2)), ("b", (0, 1))]
    assert brute_force([a, b], e, Parallelism.FSDP, 4, {}, True, one_node=False) == spread
    assert brute_force([a, b], e, Parallelism.FSDP, 4, {}, True, one_node=True) is None
