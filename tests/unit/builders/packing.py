"""Builders of the packing core's inputs: NodeStates with GPUs of given free memory,
estimates, views."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from controller.base.units import GIB
from controller.estimator.result import Estimate
from controller.packing.inventory import (
    GpuDevice,
    GpuMode,
    NodeGpus,
    NodeState,
    PackingSettings,
    Reservation,
    Snapshot,
)
from controller.packing.view import ClusterView

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


SHARED = PackingSettings(gpu_mode=GpuMode.VISIBLE_DEVICES)


SPANS = PackingSettings(gpu_mode=GpuMode.DRA)  # may span nodes; no kubelet slots to count


def est(sharded: float, replicated: float = 0, head: float = 0) -> Estimate:
    """An estimate of `sharded` + `replicated` GiB (whole or fractional GiB)."""
    s, r = int(sharded * GIB), int(replicated * GIB)
    return Estimate(
        profile="x",
        components={"a": s + r},
        total_params=0,
        trainable_params=0,
        sharded_bytes=s,
        replicated_bytes=r,
        head_bytes=int(head * GIB),
    )


def gpu(
    name: str,
    index: int,
    free: float | None,
    total: float | None = 80,
    pods: Mapping[str, float] | None = None,
    product: str = "NVIDIA-H100",
    mig: bool = False,
) -> GpuDevice:
    return GpuDevice(
        uuid=f"{name}-{index}",
        index=index,
        product=product,
        total_bytes=None if total is None else int(total * GIB),
        free_bytes=None if free is None else int(free * GIB),
        pod_used_bytes={uid: int(b * GIB) for uid, b in (pods or {}).items()},
        mig=mig,
    )


def node(
    name: str,
    frees: Sequence[float],
    total: float = 80,
    labels: Mapping[str, str] | None = None,
    product: str = "NVIDIA-H100",
    **kw: object,
) -> NodeState:
    """A node whose GPU i has `frees[i]` GiB free of `total` GiB; UUIDs are `name-i`."""
    gpus = tuple(gpu(name, i, f, total, product=product) for i, f in enumerate(frees))
    return NodeState(name=name, gpus=gpus, labels=dict(labels or {}), **kw)  # type: ignore[arg-type]


def view(
    *nodes: NodeState,
    reservations: Sequence[Reservation] = (),
    settings: PackingSettings = SHARED,
    now: datetime | None = None,
) -> ClusterView:
    return ClusterView(Snapshot(tuple(nodes), tuple(reservations), now), settings)


def frees(v: ClusterView) -> dict[str, float]:
    """Effective free GiB of every placeable GPU, by UUID."""
    return {slot.uuid: slot.free / GIB for n in v.now.nodes for slot in n.gpus}


def reservation(
    job: str,
    parts: Mapping[str, Sequence[int]],
    per_gpu: float,
    pods: Sequence[str] = (),
    allocated: Mapping[str, int] | None = None,
) -> Reservation:
    placement = tuple(
        NodeGpus(n, tuple(ix), tuple(f"{n}-{i}" for i in ix)) for n, ix in parts.items()
    )
    return Reservation(job, placement, int(per_gpu * GIB), frozenset(pods), dict(allocated or {}))
