"""What the agent knows at one moment, and the GPUNode status it writes for it.

Why built through the API models (``controller.api.gpunode``): the status the agent writes
is validated against the same models the CRD is generated from, so a field the CRD does not
declare is a test failure here rather than a value the API server silently prunes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controller.agent.readings import GpuReading
from controller.api.conditions import set_condition
from controller.api.enums import ConditionStatus
from controller.api.gpunode import GPUNodeStatus, GPUStatus
from controller.units import format_gib

#: Ready indicates whether status.gpus holds what the agent's backend read at heartbeatTime.
READY = "Ready"
#: GPUsRead indicates that status.gpus is current because the backend answered on this poll.
REASON_GPUS_READ = "GPUsRead"
#: BackendFailed indicates that status.gpus may be stale because the backend (NVML, dcgm, the
#: static file) failed; the message holds its error and what to do. The agent retries.
REASON_BACKEND_FAILED = "BackendFailed"

MAX_MESSAGE = 1024  # a condition message is one line for `kubectl describe`, not a log


@dataclass(frozen=True)
class Observation:
    """The last good readings (kept while the backend fails) and the current error, if any."""

    backend: str
    readings: tuple[GpuReading, ...]
    error: str | None = None

    @property
    def ready(self) -> bool:
        return self.error is None


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


def left_out_reason(reading: GpuReading) -> str | None:
    """Why the GPUNode CRD cannot hold this reading yet, or None when it can.

    The CRD's ``status.gpus`` requires total / free / used bytes and is keyed by ``index``, so
    a part without memory info and MIG devices (which share their parent's index) are left
    out and named in the Ready message instead of being published as zero free memory.
    """
    if not reading.memory_info_supported:
        return "memory info not supported (unified memory)"
    if reading.mig is not None:
        return f"MIG device on GPU {reading.index}"
    return None


def gpu_entries(readings: tuple[GpuReading, ...]) -> tuple[list[GPUStatus], list[str]]:
    entries: list[GPUStatus] = []
    left_out: list[str] = []
    for reading in readings:
        why = left_out_reason(reading)
        if why is not None:
            left_out.append(f"{reading.uuid}: {why}")
            continue
        assert reading.total_bytes is not None and reading.free_bytes is not None
        assert reading.used_bytes is not None
        entries.append(GPUStatus(
            index=reading.index,
            uuid=reading.uuid,
            product=reading.product,
            total_bytes=reading.total_bytes,
            free_bytes=reading.free_bytes,
            used_bytes=reading.used_bytes,
            reserved_bytes=None,  # the operator's field: the agent leaves it alone
        ))
    return entries, left_out


def ready_condition(observation: Observation, left_out: list[str]) -> tuple[ConditionStatus,
                                                                             str, str]:
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
    free = sum(entry.free_bytes for entry in entries)
    products = sorted({entry.product for entry in entries})
    status = GPUNodeStatus.model_validate({
        "gpus": entries,
        "gpuCount": len(entries),
        "product": ", ".join(products) or None,
        "freeBytes": free,
        "freeGiB": format_gib(free),
        "heartbeatTime": heartbeat.replace(microsecond=0),
    })
    body = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    ready, reason, message = ready_condition(observation, left_out)
    body["conditions"] = set_condition(
        conditions, READY, ready, reason, message, generation, heartbeat
    )
    return body
