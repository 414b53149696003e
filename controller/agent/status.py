"""What the agent knows at one moment, and the GPUNode status it writes for it.

Why built through the API models (``controller.api.gpunode``): the status the agent writes
is validated against the same models the CRD is generated from, so a field the CRD does not
declare is a test failure here rather than a value the API server silently prunes.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controller.agent.readings import GpuReading
from controller.api.conditions import (
    READY,
    REASON_AGENT_STOPPED,
    REASON_BACKEND_FAILED,
    REASON_GPUS_READ,
    set_condition,
)
from controller.api.enums import ConditionStatus
from controller.api.gpunode import (
    MAX_UUID,
    GPUNodeStatus,
    GPUStatus,
    MIGStatus,
    PodUsageStatus,
)
from controller.base.units import format_gib

MAX_MESSAGE = 1024  # a condition message is one line for `kubectl describe`, not a log
STOPPED_MESSAGE = (
    "the node agent stopped (SIGTERM or SIGINT); status.gpus holds its last readings, and no "
    "new work is placed on this node until the agent runs again"
)


@dataclass(frozen=True)
class Observation:
    """The last good readings (kept while the backend fails) and the current error, if any."""

    backend: str
    readings: tuple[GpuReading, ...]
    error: str | None = None
    #: The agent is stopping: the readings are its last, and no more will come.
    stopped: bool = False

    @property
    def ready(self) -> bool:
        return self.error is None and not self.stopped


def pod_usage(reading: GpuReading) -> dict[str, int | None]:
    """Used bytes per pod UID on one GPU; None where no process of the pod reports its usage."""
    usage: dict[str, int | None] = {}
    for proc in reading.processes:
        if proc.pod_uid is None:
            continue
        if proc.used_bytes is None:
            usage.setdefault(proc.pod_uid, None)
        else:
            usage[proc.pod_uid] = (usage.get(proc.pod_uid) or 0) + proc.used_bytes
    return usage


def left_out_reason(reading: GpuReading, published: Collection[str]) -> str | None:
    """Why ``status.gpus`` cannot hold this reading, or None when it can.

    ``status.gpus`` is a list-map keyed by ``uuid``: a reading without a UUID, with one the
    CRD refuses, or with the UUID of a reading already published (``published``) would make
    the API server refuse the whole write, every poll. Such a reading is left out and named
    in the Ready message instead. MIG devices (which share their parent's index) and parts
    without memory info are published like any GPU.
    """
    if not reading.uuid:
        return "no UUID"
    if len(reading.uuid) > MAX_UUID:
        return f"UUID longer than {MAX_UUID} characters"
    if reading.uuid in published:
        return f"duplicate UUID (index {reading.index})"
    return None


def pod_entries(reading: GpuReading) -> list[PodUsageStatus] | None:
    """The pods using this GPU, by UID; None when no pod's process is seen on it."""
    usage = pod_usage(reading)
    if not usage:
        return None
    return [PodUsageStatus(uid=uid, used_bytes=used) for uid, used in sorted(usage.items())]


def gpu_entry(reading: GpuReading) -> GPUStatus:
    """One ``status.gpus`` entry; memory figures absent (never zero) when the part has none."""
    supported = reading.memory_info_supported
    mig = reading.mig
    return GPUStatus(
        uuid=reading.uuid,
        index=reading.index,
        product=reading.product,
        memory_info_supported=supported,
        total_bytes=reading.total_bytes if supported else None,
        free_bytes=reading.free_bytes if supported else None,
        used_bytes=reading.used_bytes if supported else None,
        driver_reserved_bytes=reading.reserved_bytes if supported else None,
        reserved_bytes=None,  # the operator's reservation: the agent leaves it alone
        mig=None
        if mig is None
        else MIGStatus(
            parent_uuid=mig.parent_uuid,
            gpu_instance_id=mig.gpu_instance_id,
            compute_instance_id=mig.compute_instance_id,
        ),
        pods=pod_entries(reading),
    )


def gpu_entries(readings: tuple[GpuReading, ...]) -> tuple[list[GPUStatus], list[str]]:
    """The ``status.gpus`` entries, and the readings left out, each named with its reason."""
    entries: list[GPUStatus] = []
    left_out: list[str] = []
    published: set[str] = set()
    for reading in readings:
        why = left_out_reason(reading, published)
        if why is not None:
            left_out.append(f"{reading.uuid or f'GPU {reading.index}'}: {why}")
            continue
        published.add(reading.uuid)
        entries.append(gpu_entry(reading))
    return entries, left_out


def ready_condition(
    observation: Observation, left_out: list[str]
) -> tuple[ConditionStatus, str, str]:
    if observation.stopped:
        return ConditionStatus.FALSE, REASON_AGENT_STOPPED, STOPPED_MESSAGE
    if observation.error is not None:
        return ConditionStatus.FALSE, REASON_BACKEND_FAILED, observation.error[:MAX_MESSAGE]
    count = len(observation.readings) - len(left_out)
    message = f"read {count} GPU(s) through {observation.backend}"
    if left_out:
        message += "; not published: " + "; ".join(left_out)
    return ConditionStatus.TRUE, REASON_GPUS_READ, message[:MAX_MESSAGE]


def build_status(
    observation: Observation,
    heartbeat: datetime,
    conditions: list[dict[str, Any]],
    generation: int | None,
) -> dict[str, Any]:
    """The ``status`` the agent applies: GPUs, summary columns, heartbeat, Ready condition.

    ``conditions``: the Ready condition last written, so its lastTransitionTime is kept while
    its status stays the same.
    """
    entries, left_out = gpu_entries(observation.readings)
    free = sum(entry.free_bytes or 0 for entry in entries)
    products = sorted({entry.product for entry in entries})
    status = GPUNodeStatus.model_validate(
        {
            "gpus": entries,
            "gpuCount": len(entries),
            "product": ", ".join(products) or None,
            "freeBytes": free,
            "free": format_gib(free),
            "heartbeatTime": heartbeat.replace(microsecond=0),
        }
    )
    body = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    ready, reason, message = ready_condition(observation, left_out)
    body["conditions"] = set_condition(
        conditions, READY, ready, reason, message, generation, heartbeat
    )
    return body
