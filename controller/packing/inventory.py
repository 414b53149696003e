"""What the cluster holds, as the packer sees it: GPUs, their effective free memory, who holds it.

Built from plain data (`Snapshot`: nodes with their GPUs as the agents measured them, and the
reservations of jobs already admitted), so the same code answers `vramgate plan` offline and
the operator online.

**Placeable.** A GPU takes new work only when its node is Ready and not cordoned, its
GPUNode is Ready with a heartbeat younger than the TTL, and its memory is reported (parts that
report none are never placeable). MIG devices are GPUs of their own: each has its UUID and
its memory, and a job gets whole devices.

**Not yet reported.** A GPU node whose GPUNode does not list its GPUs (deleted, and not yet
made again by its agent; or no agent runs there) takes no work, but it is not absent: its
Node says how many GPUs it has and, with GPU feature discovery, how large they are. It counts
for what the cluster can ever hold (and for what would fit if it took work) with GPUs of
that size, or of `UNKNOWN_BYTES` where no label says: a GPU of unknown size may hold any
job, so it makes a job wait for the node, never refused, until its agent reports.

**Effective free** = measured free - what admitted jobs will still allocate there - headroom.
A job whose pods the agent already sees on a GPU has allocated part of its estimate, which
NVML already counts as used, so it is charged only `max(0, estimate - its pods' used bytes)`;
a job not seen yet is charged in full. A running job is never counted twice (once in NVML's
used, once as a reservation) and never zero times. A reservation whose pods are unknown (an
offline snapshot without pods) is charged in full: the safe side.

**Whole GPUs.** With the device-plugin and DRA modes a GPU belongs to one pod at a time, so a
GPU that a reservation holds, or on which the agent sees a pod's process, takes no new job
whatever its free memory; only `visibleDevices` shares GPUs by memory.

**Slots.** With the device-plugin GPU mode the kubelet hands out whole GPUs, so a node also
needs `n` GPUs not yet allocated: `nvidia.com/gpu` allocatable - GPUs requested by its
running pods - GPUs of admitted jobs whose pods do not exist yet.

**Any free GPU.** With the device-plugin GPU mode the pod asks for `n` GPUs of its node, and
the device plugin, not vramgate, picks which of the node's free GPUs it gets: any GPU no
pod's process is on (`Slot.whole_free`), whatever reservation names it. The index
(`index.py`) holds a node to the least free of those.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

#: Three heartbeats of the agent's default 30 s interval: one lost write is not an outage.
DEFAULT_HEARTBEAT_TTL = timedelta(seconds=90)
#: The size of a GPU not yet reported whose Node does not say how large it is: larger than
#: any job's need (a job is refused only when it is known never to fit), and far below
#: where adding a few of them could overflow anything that sums them.
UNKNOWN_BYTES = 2**60
#: Why a node whose GPUNode lists no GPUs takes no work.
NOT_REPORTED = "GPUs not yet reported by its vramgate agent"


class GpuMode(StrEnum):
    """How a workload is pinned to its GPUs (the operator's cluster mode)."""

    DEVICE_PLUGIN = "devicePlugin"  # nvidia.com/gpu: n + node affinity; whole GPUs
    VISIBLE_DEVICES = "visibleDevices"  # shared GPUs: the chosen UUIDs in NVIDIA_VISIBLE_DEVICES
    DRA = "dra"  # a ResourceClaim selecting the chosen devices by UUID


@dataclass(frozen=True, slots=True)
class Taint:
    """A Node's taint: pods that do not tolerate it stay off the node (NoSchedule,
    NoExecute)."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU or MIG device as its node's agent last read it."""

    uuid: str
    index: int
    product: str
    total_bytes: int | None
    free_bytes: int | None
    pod_used_bytes: Mapping[str, int] = field(default_factory=dict)
    mig: bool = False

    @property
    def reported(self) -> bool:
        return self.total_bytes is not None and self.free_bytes is not None


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node, its labels and health, and the GPUs its GPUNode lists."""

    name: str
    gpus: tuple[GpuDevice, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    ready: bool = True
    cordoned: bool = False
    agent_ready: bool = True
    heartbeat: datetime | None = None
    #: nvidia.com/gpu allocatable; None where the Node does not say (taken as the GPU count).
    gpu_allocatable: int | None = None
    #: nvidia.com/gpu requested by the node's pods that have not finished.
    gpu_allocated: int = 0
    taints: tuple[Taint, ...] = ()
    #: False where no GPUNode lists the node's GPUs: `gpus` are then what its Node says (a
    #: count, and a size where a label gives one, `total_bytes` None where not), never
    #: placeable, counted for what the cluster can hold.
    reported: bool = True

    def counted(self) -> tuple[GpuDevice, ...]:
        """The GPUs that count for what the cluster can hold: those with reported memory,
        or every GPU of a node not yet reported."""
        if not self.reported:
            return self.gpus
        return tuple(gpu for gpu in self.gpus if gpu.reported)


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """The GPUs of one node that a placement uses, in the order the workload sees them."""

    node: str
    indices: tuple[int, ...]
    uuids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Reservation:
    """An admitted job's hold on GPUs: `per_gpu_bytes` on each GPU of `placement`.

    `pod_uids` are the job's pods the caller knows of (their usage is read from the GPUs);
    `allocated_gpus` is how many of its GPUs those pods already hold as `nvidia.com/gpu`
    (counted in the node's `gpu_allocated`), so that slots are not taken twice either.
    """

    job: str
    placement: tuple[NodeGpus, ...]
    per_gpu_bytes: int
    pod_uids: frozenset[str] = frozenset()
    allocated_gpus: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PackingSettings:
    """The operator's packing knobs; every default has its reason.

    Headroom is 0 by default: the calibrated profile's estimate already holds the CUDA
    context, cuBLAS workspace and allocator slack. A cluster that runs other profiles, or
    wants a safety margin, keeps `headroom_bytes` plus `headroom_percent` of each GPU free.
    """

    headroom_bytes: int = 0
    headroom_percent: int = 0
    heartbeat_ttl: timedelta = DEFAULT_HEARTBEAT_TTL
    gpu_mode: GpuMode = GpuMode.DEVICE_PLUGIN

    def headroom(self, total_bytes: int) -> int:
        return self.headroom_bytes + total_bytes * self.headroom_percent // 100


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a decision reads, taken at one moment (`now` judges heartbeats)."""

    nodes: tuple[NodeState, ...]
    reservations: tuple[Reservation, ...] = ()
    now: datetime | None = None


@dataclass(slots=True)
class Slot:
    """One GPU in the packer's working state. `free` is effective free memory (bytes a new
    job may plan on), `capacity` what it offers when the cluster is empty."""

    node: str
    uuid: str
    index: int
    product: str
    capacity: int
    free: int
    #: Handed out whole and already in use (a reservation, or a pod's process on it).
    taken: bool = False
    #: What a pod given this GPU whole may use: measured free less headroom, no reservation
    #: charged (a whole GPU is no other job's). None once a pod's process is on it: the
    #: device plugin has given it to that pod, and hands it to no other.
    whole_free: int | None = None


@dataclass(slots=True)
class NodeSlots:
    """A node in the packer's working state: its placeable GPUs and free device slots."""

    name: str
    order: int
    labels: Mapping[str, str]
    gpus: list[Slot]
    slots: int


def placeable(node: NodeState, now: datetime | None, ttl: timedelta) -> str | None:
    """Why the node takes no new work now, or None when it does."""
    if not node.ready:
        return "node not Ready"
    if node.cordoned:
        return "node cordoned"
    if not node.reported:
        return NOT_REPORTED
    if not node.agent_ready:
        return "agent not Ready"
    if now is not None and (node.heartbeat is None or now - node.heartbeat > ttl):
        return "agent heartbeat stale"
    return None


def charges(reservations: Iterable[Reservation], nodes: Mapping[str, NodeState]) -> dict[str, int]:
    """Bytes each GPU (by UUID) must still keep for admitted jobs: never twice, never zero."""
    owed: dict[str, int] = {}
    for reservation in reservations:
        for part in reservation.placement:
            node = nodes.get(part.node)
            devices = {gpu.uuid: gpu for gpu in node.gpus} if node else {}
            for uuid in part.uuids:
                device = devices.get(uuid)
                seen = 0
                if device is not None:
                    seen = sum(
                        used
                        for uid, used in device.pod_used_bytes.items()
                        if uid in reservation.pod_uids
                    )
                owed[uuid] = owed.get(uuid, 0) + max(0, reservation.per_gpu_bytes - seen)
    return owed


def slots_taken(reservations: Iterable[Reservation]) -> dict[str, int]:
    """Device slots admitted jobs hold per node beyond what their pods already requested."""
    taken: dict[str, int] = {}
    for reservation in reservations:
        for part in reservation.placement:
            pending = len(part.uuids) - reservation.allocated_gpus.get(part.node, 0)
            taken[part.node] = taken.get(part.node, 0) + max(0, pending)
    return taken


def working_nodes(
    snapshot: Snapshot, settings: PackingSettings, *, empty: bool = False, resting: bool = False
) -> list[NodeSlots]:
    """The packer's nodes, sorted by name: placeable GPUs with effective free memory.

    `empty=True` gives the cluster as it would be with no work at all: every GPU node with
    reported memory, whatever its health now (it may come back), each GPU at its total less
    headroom, and the GPUs of nodes not yet reported at the size their Node gives. That is
    what Reject is judged against: never fits even when empty.

    `resting=True` gives the cluster now as if every node took work: the nodes that do not
    (not Ready, cordoned, a silent agent, GPUs not yet reported) with their free memory as
    last read, charged as the others are. A job that fits there but not now waits for those
    nodes, not for memory.
    """
    by_name = {node.name: node for node in snapshot.nodes}
    owed = {} if empty else charges(snapshot.reservations, by_name)
    taken = {} if empty else slots_taken(snapshot.reservations)
    exclusive = settings.gpu_mode is not GpuMode.VISIBLE_DEVICES and not empty
    reserved = {uuid for r in snapshot.reservations for part in r.placement for uuid in part.uuids}
    out: list[NodeSlots] = []
    for order, name in enumerate(sorted(by_name)):
        node = by_name[name]
        ttl = settings.heartbeat_ttl
        if not (empty or resting) and placeable(node, snapshot.now, ttl) is not None:
            continue
        if node.reported:
            gpus = []
            for device in sorted(node.gpus, key=lambda g: (g.index, g.uuid)):
                if not device.reported:
                    continue
                total = device.total_bytes or 0
                capacity = max(0, total - settings.headroom(total))
                measured = total if empty else device.free_bytes or 0
                whole = min(capacity, measured - settings.headroom(total))
                free = min(capacity, measured - settings.headroom(total) - owed.get(device.uuid, 0))
                in_pod = bool(device.pod_used_bytes) and not empty
                busy = exclusive and (device.uuid in reserved or in_pod)
                slot = Slot(name, device.uuid, device.index, device.product, capacity, free, busy)
                slot.whole_free = None if in_pod else whole
                gpus.append(slot)
        else:
            gpus = _unreported(node, [] if empty else snapshot.reservations, settings, exclusive)
        if not gpus:
            continue
        slots = len(gpus)
        if settings.gpu_mode is GpuMode.DEVICE_PLUGIN and not empty:
            # Empty: every GPU, whatever the device plugin reports now (it may be restarting).
            allocatable = node.gpu_allocatable if node.gpu_allocatable is not None else len(gpus)
            used = node.gpu_allocated + taken.get(name, 0)
            slots = max(0, min(len(gpus), allocatable) - used)
        out.append(NodeSlots(name, order, node.labels, gpus, slots))
    return out


def _unreported(
    node: NodeState,
    reservations: Iterable[Reservation],
    settings: PackingSettings,
    exclusive: bool,
) -> list[Slot]:
    """The GPUs of a node not yet reported, at the size its Node gives (`UNKNOWN_BYTES` where
    none), idle but for what admitted jobs hold there: no agent read them, and their UUIDs
    are unknown, so a reservation is charged by GPU index."""
    owed: dict[int, int] = {}
    for reservation in reservations:
        for part in reservation.placement:
            if part.node == node.name:
                for index in part.indices:
                    owed[index] = owed.get(index, 0) + reservation.per_gpu_bytes
    gpus = []
    for device in sorted(node.gpus, key=lambda g: g.index):
        total = device.total_bytes
        capacity = UNKNOWN_BYTES if total is None else max(0, total - settings.headroom(total))
        free = capacity - owed.get(device.index, 0)
        busy = exclusive and device.index in owed
        slot = Slot(node.name, device.uuid, device.index, device.product, capacity, free, busy)
        slot.whole_free = free  # no pod is known to be on it
        gpus.append(slot)
    return gpus
