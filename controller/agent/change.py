"""When the agent writes: only when something moved enough to matter, or the heartbeat is due.

Why: free memory jitters by megabytes every second while a job trains; writing every poll
from 5,000 nodes would be 1,000 writes per second on the API server and on every GPUNode
watcher. A change threshold (256 MiB by default, far below any job's footprint) and a
heartbeat (30 s) bound the steady rate at one write per heartbeat per node; real changes
(a job starting or ending, the backend failing or healing) are written on the poll that
sees them.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.agent.readings import GpuReading
from controller.agent.status import Observation, pod_usage

# Reasons, also the `reason` label of vramgate_agent_status_writes_total.
INITIAL = "initial"
READY_CHANGED = "ready"
INVENTORY = "inventory"
MEMORY = "memory"
PODS = "pods"
HEARTBEAT = "heartbeat"
REASONS = (INITIAL, READY_CHANGED, INVENTORY, MEMORY, PODS, HEARTBEAT)


@dataclass(frozen=True)
class Written:
    """What was last written, and when (monotonic seconds)."""

    observation: Observation
    at: float


def _identity(reading: GpuReading) -> tuple[object, ...]:
    return (
        reading.uuid,
        reading.index,
        reading.product,
        reading.memory_info_supported,
        reading.mig,
    )


def _moved(before: int | None, after: int | None, threshold: int) -> bool:
    if before is None or after is None:
        return before is not after
    return abs(after - before) > threshold


def _memory_moved(before: GpuReading, after: GpuReading, threshold: int) -> bool:
    pairs = [
        (before.total_bytes, after.total_bytes),
        (before.free_bytes, after.free_bytes),
        (before.used_bytes, after.used_bytes),
        (before.reserved_bytes, after.reserved_bytes),
    ]
    return any(_moved(b, a, threshold) for b, a in pairs)


def write_reason(
    last: Written | None,
    current: Observation,
    now: float,
    threshold_bytes: int,
    heartbeat_s: float,
) -> str | None:
    """Why ``current`` must be written at ``now``, or None when the last write still holds."""
    if last is None:
        return INITIAL
    before = last.observation
    if (before.ready, before.error) != (current.ready, current.error):
        return READY_CHANGED
    if [_identity(r) for r in before.readings] != [_identity(r) for r in current.readings]:
        return INVENTORY
    pairs = list(zip(before.readings, current.readings, strict=True))
    if any(_memory_moved(b, a, threshold_bytes) for b, a in pairs):
        return MEMORY
    for b, a in pairs:
        pods_before, pods_after = pod_usage(b), pod_usage(a)
        if pods_before.keys() != pods_after.keys():
            return PODS
        if any(_moved(pods_before[uid], pods_after[uid], threshold_bytes) for uid in pods_after):
            return MEMORY
    if now - last.at >= heartbeat_s:
        return HEARTBEAT
    return None
