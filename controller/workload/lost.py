"""A workload that went away: how it ended, from what it left behind.

The operator creates a job's workload once, and records its uid (`status.workloadRef.uid`)
as soon as the create returns. A batch Job of that uid missing under an admitted job was
deleted: by its user (`kubectl delete job`: the training is to stop), or by a cleanup after it
finished that the operator did not see end (`ttlSecondsAfterFinished`, a cleanup policy, while
the operator was down or before its watch caught up). Creating it again would run the whole
training twice, so it is never created again: the job ends as the Job did.

How it ended is read from what it left behind (`Remains`, read from the API server when it
goes missing): the Job controller's Events about that uid (`Completed` when it succeeded, its
failure's reason such as `BackoffLimitExceeded` when it failed; the API server keeps Events
for an hour by default), and its pods while the garbage collector has not removed them.
Nothing that says it ended: it was stopped (`WorkloadDeleted`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from controller.api import conditions as cond
from controller.workload.state import Phase, WorkloadState, failure_of_pods, timestamp

#: The Job controller's Event reasons for a Job that failed (batch/v1 JobFailed reasons).
FAILURE_REASONS = frozenset(
    {
        "BackoffLimitExceeded",
        "DeadlineExceeded",
        "PodFailurePolicy",
        "MaxFailedIndexesExceeded",
        "FailedIndexes",
    }
)
#: The Job controller's Event reason for a Job that completed.
COMPLETED = "Completed"


@dataclass(frozen=True, slots=True)
class Remains:
    """What the API server holds of an admitted job's missing workload, read for the
    FineTuneJob of uid `job_uid` when its workload `name` went missing."""

    job_uid: str
    name: str
    #: The Job is there after all, owned by the job: only the operator's cache lags.
    exists: bool = False
    #: Core v1 Events about the Job (kept to those of its uid).
    events: tuple[Mapping[str, Any], ...] = ()


def ending(remains: Remains, pods: Sequence[Mapping[str, Any]], created_uid: str) -> WorkloadState:
    """How the missing workload of uid `created_uid` ended."""
    name = remains.name
    events = [
        e for e in remains.events if str((e.get("involvedObject") or {}).get("uid")) == created_uid
    ]
    events.sort(key=lambda e: _event_time(e) or datetime.min.replace(tzinfo=UTC))
    reasons = {str(e.get("reason") or "") for e in events}
    if COMPLETED in reasons:
        return WorkloadState(
            Phase.SUCCEEDED,
            cond.REASON_SUCCEEDED,
            f"Job {name} completed (its Events say so) and was deleted since",
        )
    failed = [e for e in events if e.get("reason") in FAILURE_REASONS]
    if failed:
        reason = str(failed[-1]["reason"])
        said = " ".join(str(failed[-1].get("message") or "failed").split())
        return WorkloadState(
            Phase.FAILED, reason, f"Job {name} failed ({reason}): {said}; it was deleted since"
        )
    failed_pods = [p for p in pods if (p.get("status") or {}).get("phase") == "Failed"]
    if failed_pods:
        return failure_of_pods(name, failed_pods)
    return WorkloadState(
        Phase.FAILED,
        cond.REASON_WORKLOAD_DELETED,
        f"Job {name} was deleted before it finished: the training stopped and its GPUs are "
        "released; to run it again, delete this FineTuneJob and apply it again",
    )


def _event_time(event: Mapping[str, Any]) -> datetime | None:
    """When the event last happened: core v1's lastTimestamp, else its eventTime (events
    written through events.k8s.io), else when the Event object was made."""
    meta = event.get("metadata") or {}
    for value in (event.get("lastTimestamp"), event.get("eventTime"), event.get("firstTimestamp"),
                  meta.get("creationTimestamp")):  # fmt: skip
        at = timestamp(value)
        if at is not None:
            return at
    return None
