"""The operator's state gauges as plain data: what one admission pass leaves the cluster as.

Why plain data: the figures (predicted bytes per job and GPU, reservations, effective free
memory, the queue) are the admission pass's own arithmetic, and are tested as such; the
Prometheus shell (`metrics.py`) only renders them. Each pass yields a fresh view, so a job or
GPU that is gone has no series left behind.

Label names follow dcgm-exporter (`node`, `gpu` = the NVML index as a string, `UUID`,
`modelName` = the product as the agent reports it) so dashboards can join the agent's, the
operator's and dcgm-exporter's series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from controller.admission import kueue, observed
from controller.admission.cluster import (
    ClusterObjects,
    finished,
    parse_time,
    reservation,
    snapshot,
)
from controller.api import conditions as cond
from controller.packing.index import schedulable
from controller.packing.inventory import GpuMode, NodeGpus, PackingSettings, working_nodes

GPU_LABELS = ("node", "gpu", "UUID", "modelName")
JOB_LABELS = ("namespace", "job")


@dataclass(frozen=True)
class Gauge:
    """One gauge family: its name, help, label names and samples (label values, value)."""

    name: str
    doc: str
    labels: tuple[str, ...]
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)

    def add(self, values: tuple[str, ...], value: float) -> None:
        self.samples.append((values, value))


def metric_view(
    objects: ClusterObjects,
    packing: PackingSettings,
    now: datetime,
    peaks: Mapping[str, observed.Peaks],
    family: Callable[[Mapping[str, Any]], str],
) -> tuple[Gauge, ...]:
    """The state gauges of `objects` (the jobs as the pass left them) at `now`; `peaks` are
    admitted jobs' observed peaks by job uid, `family` a job's model family."""
    predicted = Gauge(
        "vramgate_job_predicted_bytes",
        "Bytes the estimate predicts on each GPU of an admitted, unfinished job's placement.",
        (*JOB_LABELS, *GPU_LABELS, "profile"),
    )
    peak = Gauge(
        "vramgate_job_observed_peak_bytes",
        "Most bytes a running job's pods were seen using on a GPU at once (status.observed).",
        (*JOB_LABELS, *GPU_LABELS),
    )
    ratio = Gauge(
        "vramgate_job_observed_ratio",
        "A running job's highest observed peak over its GPUs divided by its predicted "
        "per-GPU bytes: above 1, the estimator under-predicted.",
        (*JOB_LABELS, "profile", "family"),
    )
    reserved = Gauge(
        "vramgate_gpu_reservation_bytes",
        "Bytes promised on a GPU to admitted, unfinished jobs (the sum of their per-GPU "
        "estimates); 0 when nothing is reserved.",
        GPU_LABELS,
    )
    free = Gauge(
        "vramgate_gpu_schedulable_free_bytes",
        "Bytes a new job may plan on per GPU of a placeable node, as admission sees them: "
        "measured free less what admitted jobs will still allocate less headroom (negative: "
        "over-committed); 0 on a GPU a job or pod holds whole (devicePlugin, dra); with "
        "devicePlugin, whose device plugin may hand a pod any free GPU of its node, the least "
        "free of those GPUs on each of them, and 0 on a node with no device slot left.",
        GPU_LABELS,
    )
    heartbeat = Gauge(
        "vramgate_gpunode_heartbeat_timestamp_seconds",
        "When a GPUNode's agent last read its GPUs, in seconds since the Unix epoch.",
        ("node",),
    )
    pending = Gauge(
        "vramgate_pending_jobs",
        "Jobs neither admitted nor finished, by their Admitted condition's reason.",
        ("reason",),
    )
    created = Gauge(
        "vramgate_pending_job_created_timestamp_seconds",
        "Creation time of each job neither admitted nor finished, in seconds since the Unix "
        "epoch (its queue age is time() minus this).",
        (*JOB_LABELS, "reason"),
    )

    products: dict[str, str] = {}
    reserved_on: dict[str, int] = {}
    gpus: list[tuple[str, ...]] = []
    for name, gpunode in sorted(objects.gpunodes.items()):
        status = gpunode.get("status") or {}
        beat = parse_time(status.get("heartbeatTime"))
        if beat is not None:
            heartbeat.add((name,), beat.timestamp())
        for gpu in status.get("gpus") or []:
            uuid = str(gpu.get("uuid"))
            products[uuid] = str(gpu.get("product") or "")
            known = gpu.get("memoryInfoSupported", True) and gpu.get("totalBytes") is not None
            if known:
                gpus.append((name, str(gpu.get("index") or 0), uuid, products[uuid]))

    by_reason: dict[str, int] = {}
    for key, job in sorted(objects.jobs.items()):
        meta = job.get("metadata") or {}
        namespace, name = key.split("/", 1)
        status = job.get("status") or {}
        held = reservation(job, [])
        if held is None:
            if finished(job):
                continue
            admitted = cond.find_condition(status.get("conditions") or [], cond.ADMITTED)
            if (admitted or {}).get("status") == "True":
                continue  # handed to Kueue and admitted there: its Workload holds its GPUs
            reason = str((admitted or {}).get("reason") or cond.REASON_PENDING)
            by_reason[reason] = by_reason.get(reason, 0) + 1
            born = parse_time(meta.get("creationTimestamp"))
            if born is not None:
                created.add((namespace, name, reason), born.timestamp())
            continue
        profile = str((status.get("estimate") or {}).get("profile") or "")
        found = peaks.get(str(meta.get("uid"))) or observed.from_status(status.get("observed"))
        for node, index, uuid in _where_held(held.placement, found):
            reserved_on[uuid] = reserved_on.get(uuid, 0) + held.per_gpu_bytes
            labels = (namespace, name, node, str(index), uuid, products.get(uuid, ""))
            predicted.add((*labels, profile), float(held.per_gpu_bytes))
        for p in sorted(found.values(), key=lambda p: (p.node, p.index, p.uuid)):
            where = (namespace, name, p.node, str(p.index), p.uuid, products.get(p.uuid, ""))
            peak.add(where, float(p.peak_bytes))
        if found and held.per_gpu_bytes > 0:
            top = observed.highest(found.values())
            ratio.add((namespace, name, profile, family(job)), top / held.per_gpu_bytes)

    # Kueue Workloads vramgate admitted hold memory in the same ledger (`kueue.py`): their
    # holds count in the reservation gauge, as in the free memory the next gauge reports.
    if objects.kueue_checks:
        for workload in objects.kueue_workloads.values():
            hold = kueue.reservation(workload, objects.kueue_checks, ())
            if hold is None:
                continue
            meta = workload.get("metadata") or {}
            owner = (str(meta.get("namespace")), str(meta.get("name")))
            for part in hold.placement:
                for index, uuid in zip(part.indices, part.uuids, strict=False):
                    reserved_on[uuid] = reserved_on.get(uuid, 0) + hold.per_gpu_bytes
                    gpu = (part.node, str(index), uuid, products.get(uuid, ""))
                    predicted.add((*owner, *gpu, "Kueue"), float(hold.per_gpu_bytes))

    for reason, count in sorted(by_reason.items()):
        pending.add((reason,), float(count))
    for gpu_labels in gpus:
        reserved.add(gpu_labels, float(reserved_on.get(gpu_labels[2], 0)))
    exclusive = packing.gpu_mode is not GpuMode.VISIBLE_DEVICES
    unpinned = packing.gpu_mode is GpuMode.DEVICE_PLUGIN
    for working in working_nodes(snapshot(objects, now), packing):
        usable = schedulable(working, exclusive=exclusive, unpinned=unpinned)
        for slot, each in zip(working.gpus, usable, strict=True):
            free.add((slot.node, str(slot.index), slot.uuid, slot.product), float(each))
    return (predicted, peak, ratio, reserved, free, heartbeat, pending, created)


def _where_held(placement: Iterable[NodeGpus], seen: observed.Peaks) -> list[tuple[str, int, str]]:
    """The GPUs a job holds: its placement's, except that a placed GPU where its pods are not
    seen gives way to one of the same node where they are. With the device plugin the kubelet,
    not vramgate, picks which of a node's GPUs a pod gets; charging the placement's GPU would
    put the prediction beside an idle GPU and the usage beside no prediction."""
    placed = [(p.node, i, u) for p in placement for i, u in zip(p.indices, p.uuids, strict=False)]
    uuids = {u for _, _, u in placed}
    elsewhere = sorted((p.node, p.index, p.uuid) for p in seen.values() if p.uuid not in uuids)
    out = []
    for node, index, uuid in placed:
        if uuid not in seen:
            swap = next((s for s in elsewhere if s[0] == node), None)
            if swap is not None:
                elsewhere.remove(swap)
                out.append(swap)
                continue
        out.append((node, index, uuid))
    return out


def accuracy_series(
    objects: ClusterObjects, family: Callable[[Mapping[str, Any]], str]
) -> set[tuple[str, str]]:
    """The (profile, family) of every admitted, unfinished job: the accuracy histogram's
    series each will observe at its end, made at 0 by whichever replica leads now (a new
    leader after a failover would otherwise create them only with their first observation,
    which increase() cannot count)."""
    found = set()
    for job in objects.jobs.values():
        if reservation(job, []) is not None:
            profile = str(((job.get("status") or {}).get("estimate") or {}).get("profile") or "")
            if profile:
                found.add((profile, family(job)))
    return found
