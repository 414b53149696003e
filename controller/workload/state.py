"""A workload's batch Job and pods -> where the training stands, said plainly.

The two out-of-memory failures a fine-tuning job meets are told apart, because they have
opposite fixes: `OOMKilled` is the kernel killing the container for host memory (raise the
pod's memory limit), `GPUOutOfMemory` is CUDA refusing an allocation (vramgate's estimate
was too low: give the job more GPUs or less per GPU). The second is read from the
container's termination message, which `build.py`'s `FallbackToLogsOnError` fills with the
log tail that holds the traceback.

Where Kubernetes already names the cause (a pod waiting on ImagePullBackOff, Unschedulable,
a Job that failed with DeadlineExceeded, a pod it disrupted: DeletionByPodGC when its node
was deleted), its word is the reason, passed through.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from controller.api import conditions as cond
from controller.api.enums import ConditionStatus
from controller.workload.build import COMPLETION_INDEX_ANNOTATION

#: Substrings of a termination message that mean CUDA ran out of GPU memory: PyTorch's
#: RuntimeError text and its torch.OutOfMemoryError (torch.cuda.OutOfMemoryError) class.
GPU_OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError")
#: Waiting reasons of a container that is merely starting, not stuck.
_STARTING = {"ContainerCreating", "PodInitializing"}
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_MAX_QUOTED = 300
#: A batch/v1 Job's default spec.backoffLimit.
_DEFAULT_BACKOFF_LIMIT = 6


class Phase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


@dataclass(frozen=True, slots=True)
class WorkloadState:
    """Where the workload stands; `reason` is a condition reason, `message` one line."""

    phase: Phase
    reason: str
    message: str


#: How long a Job may have no pod before its message says something refuses them: the Job
#: controller makes pods within a second or two, and retries refused ones with backoff.
NO_POD_HINT = timedelta(seconds=60)


def timestamp(value: object) -> datetime | None:
    """An API timestamp (RFC 3339 text, or already parsed); None when absent or malformed."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def workload_state(
    job: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    now: datetime | None = None,
) -> WorkloadState:
    """The state of a workload from its batch Job (None: not created yet) and its pods, at
    `now` (for how long it has had no pod)."""
    if job is None:
        return WorkloadState(Phase.PENDING, cond.REASON_STARTING, "the workload is not created yet")
    name = str((job.get("metadata") or {}).get("name") or "")
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    expected = int(spec.get("completions") or 1)
    verdicts = {
        c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"
    }
    pods = sorted(pods, key=_pod_order)

    # SuccessCriteriaMet and FailureTarget come first, while the last pods terminate.
    if "Complete" in verdicts or "SuccessCriteriaMet" in verdicts:
        succeeded = int(status.get("succeeded") or expected)
        return WorkloadState(
            Phase.SUCCEEDED,
            cond.REASON_SUCCEEDED,
            f"Job {name} completed: {succeeded} of {expected} pods succeeded",
        )
    verdict = verdicts.get("Failed") or verdicts.get("FailureTarget")
    failed = [pod for pod in pods if (pod.get("status") or {}).get("phase") == "Failed"]
    # With backoffLimit 0 (vramgate's), one failed pod fails the Job: say so at once.
    backoff_limit = spec.get("backoffLimit", _DEFAULT_BACKOFF_LIMIT)
    if verdict is not None or (failed and backoff_limit == 0):
        return _failure(name, verdict, failed, int(status.get("failed") or 0))
    running = [pod for pod in pods if (pod.get("status") or {}).get("phase") == "Running"]
    if running:
        nodes = sorted({str((pod.get("spec") or {}).get("nodeName")) for pod in running})
        return WorkloadState(
            Phase.RUNNING,
            cond.REASON_RUNNING,
            f"{len(running)} of {expected} pods running on {', '.join(nodes)}",
        )
    if not pods and now is not None:
        refused = _no_pod_for_long(job, name, now)
        if refused is not None:
            return refused
    return _pending(name, pods, expected)


def _no_pod_for_long(job: Mapping[str, Any], name: str, now: datetime) -> WorkloadState | None:
    """A Job that has had no pod for NO_POD_HINT: the Job controller's reason
    (FailedCreate: a ResourceQuota, a LimitRange, an admission webhook) is in the Job's
    Events only, which the operator does not read, so the message says where to look."""
    meta = job.get("metadata") or {}
    created = timestamp(meta.get("creationTimestamp"))
    if not name or created is None or now - created < NO_POD_HINT:
        return None
    # Worded once, not with the time waited: each pass would rewrite the status.
    minutes = int(NO_POD_HINT.total_seconds()) // 60
    return WorkloadState(
        Phase.PENDING,
        cond.REASON_STARTING,
        f"Job {name} has had no pod for over {minutes} minute{'s' if minutes > 1 else ''}: "
        "something refuses its pods (a ResourceQuota, a LimitRange, an admission webhook); "
        f"see `kubectl describe job {name} -n {meta.get('namespace') or 'default'}`",
    )


def workload_conditions(
    state: WorkloadState,
    conditions: Iterable[Mapping[str, Any]],
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """`conditions` with Running, Succeeded and Failed set from `state`.

    Running is always set (False until a pod runs and once the workload finished, with the
    reason). Succeeded and Failed appear when they become True; one already there from an
    earlier run of the job turns False while the new run has not finished that way.
    """
    out = [dict(c) for c in conditions]
    true, false = ConditionStatus.TRUE, ConditionStatus.FALSE
    updates = [(cond.RUNNING, true if state.phase is Phase.RUNNING else false)]
    for phase, type_ in ((Phase.SUCCEEDED, cond.SUCCEEDED), (Phase.FAILED, cond.FAILED)):
        if state.phase is phase:
            updates.append((type_, true))
        elif cond.find_condition(out, type_) is not None:
            updates.append((type_, false))
    for type_, status in updates:
        out = cond.set_condition(out, type_, status, state.reason, state.message, generation, now)
    return out


# -- failures ---------------------------------------------------------------------------------


def failure_of_pods(name: str, failed: Sequence[Mapping[str, Any]]) -> WorkloadState:
    """The failure of Job `name` as its failed pods tell it (the Job itself is gone)."""
    return _failure(name, None, sorted(failed, key=_pod_order))


def _failure(
    name: str,
    verdict: Mapping[str, Any] | None,
    failed: Sequence[Mapping[str, Any]],
    counted: int = 0,
) -> WorkloadState:
    """Blame an out-of-memory first (on a multi-node job, the other ranks then fail on
    their broken connections), then a pod Kubernetes disrupted (its node deleted, drained
    or shut down: the containers' exit codes are the kill's, not the training's), then the
    Job's own reason, then the first failed container. `counted`: the pods the Job counts
    as failed (its status.failed)."""
    diagnoses = [d for pod in failed for d in _diagnoses(pod)]
    for reason, message in diagnoses:
        if reason in (cond.REASON_GPU_OUT_OF_MEMORY, cond.REASON_OOM_KILLED):
            return WorkloadState(Phase.FAILED, reason, message)
    for pod in failed:
        disrupted = _disruption(pod)
        if disrupted is not None:
            return WorkloadState(Phase.FAILED, *disrupted)
    detail = diagnoses[0][1] if diagnoses else ""
    if verdict is not None:
        reason = _reason(verdict.get("reason"), cond.REASON_WORKLOAD_FAILED)
        said = str(verdict.get("message") or "").strip() or "failed"
        message = f"Job {name} failed ({reason}): {said}"
        if not failed and counted and reason == _BACKOFF_LIMIT_EXCEEDED:
            # A failed pod stays (the Job counted it) unless someone deleted it: PodGC does,
            # once its node is gone, and then nothing is left that says so.
            detail = _GONE
        return WorkloadState(Phase.FAILED, reason, f"{message}; {detail}" if detail else message)
    if detail:
        return WorkloadState(Phase.FAILED, cond.REASON_WORKLOAD_FAILED, detail)
    return WorkloadState(Phase.FAILED, cond.REASON_WORKLOAD_FAILED, f"Job {name} failed")


def _diagnoses(pod: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(reason, message) for each container of a failed pod that exited in error, or for
    the pod itself (Evicted, DeadlineExceeded) when no container says why."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    pod_name = meta.get("name", "")
    out: list[tuple[str, str]] = []
    statuses = [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]
    for container in statuses:
        state = container.get("state") or {}
        terminated = state.get("terminated") or (container.get("lastState") or {}).get("terminated")
        if not terminated:
            continue
        code = terminated.get("exitCode")
        killed = terminated.get("reason")
        if code == 0 and killed != "OOMKilled":
            continue
        who = f"container {container.get('name')} of pod {pod_name}"
        text = str(terminated.get("message") or "")
        if killed == "OOMKilled":
            message = (
                f"{who} was OOMKilled (exit {code}): the node ran out of host memory, or the "
                "container reached its memory limit; this is host RAM, not GPU memory, so "
                "raise the container's memory request and limit, then run it again as a new "
                "job (a finished job is final: delete it and apply it again)"
            )
            out.append((cond.REASON_OOM_KILLED, message))
        elif any(marker in text for marker in GPU_OOM_MARKERS):
            message = (
                f"{who} ran out of GPU memory (exit {code}): the GPU memory estimate was too "
                "low for this job; run it again as a new job (delete it and apply it again) "
                "with more GPUs (FSDP shards the memory) or a smaller batch or sequence: "
                f"{_oom_line(text)}"
            )
            out.append((cond.REASON_GPU_OUT_OF_MEMORY, message))
        else:
            said = f": {_quote(text)}" if text.strip() else ""
            out.append(
                (
                    cond.REASON_WORKLOAD_FAILED,
                    f"{who} exited with code {code} ({killed or 'Error'}){said}",
                )
            )
    if not out and (status.get("reason") or status.get("message")):
        said = str(status.get("message") or "").strip()
        out.append(
            (
                cond.REASON_WORKLOAD_FAILED,
                f"pod {pod_name} failed ({status.get('reason') or 'Failed'}): {said}",
            )
        )
    return out


#: The Job's reason when its pods failed more often than spec.backoffLimit (0: once).
_BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
_RUN_AGAIN = "run it again as a new job (a finished job is final: delete it and apply it again)"
_GONE = (
    "its failed pod is gone, deleted by hand or by Kubernetes because its node went away "
    f"(the training stopped with it); {_RUN_AGAIN}"
)
#: What a pod's DisruptionTarget condition says happened, by its reason (k8s.io/api core/v1
#: and the controllers that set it: PodGC for a pod whose node was deleted, the taint
#: eviction controller, the kubelet, the scheduler, the Eviction API).
_DISRUPTIONS = {
    "DeletionByPodGC": "was deleted because its node {node} no longer exists",
    "DeletionByTaintManager": (
        "was evicted from node {node} by a NoExecute taint (the node became unreachable or "
        "not ready, or was tainted)"
    ),
    "TerminationByKubelet": (
        "was terminated by the kubelet of node {node} (node-pressure eviction or a node shutdown)"
    ),
    "PreemptionByScheduler": "was preempted on node {node} for a pod of higher priority",
    "EvictionByEvictionAPI": "was evicted from node {node} through the Eviction API (a drain)",
}


def _disruption(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of a failed pod that Kubernetes disrupted (a True DisruptionTarget
    condition), else None; the reason is Kubernetes' own (DeletionByPodGC: its node was
    deleted)."""
    status = pod.get("status") or {}
    target = next(
        (c for c in status.get("conditions") or []
         if c.get("type") == "DisruptionTarget" and c.get("status") == "True"),
        None,
    )  # fmt: skip
    if target is None:
        return None
    pod_name = (pod.get("metadata") or {}).get("name", "")
    node = (pod.get("spec") or {}).get("nodeName") or "(none)"
    kind = str(target.get("reason") or "")
    what = _DISRUPTIONS.get(kind, "was disrupted on node {node}").format(node=node)
    said = str(target.get("message") or "").strip()
    message = f"pod {pod_name} {what}{f' ({_quote(said)})' if said else ''}"
    reason = _reason(kind, cond.REASON_WORKLOAD_FAILED)
    return reason, f"{message}; the training stopped with it: {_RUN_AGAIN}"


def _oom_line(text: str) -> str:
    """The line of the traceback that says how much CUDA could not allocate."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    hit = next((ln for ln in reversed(lines) if any(m in ln for m in GPU_OOM_MARKERS)), "")
    return _quote(hit)


def _quote(text: str) -> str:
    """A termination message on one line, its end kept when long (a traceback ends in the
    error)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= _MAX_QUOTED else "..." + flat[-_MAX_QUOTED:]


# -- pending ----------------------------------------------------------------------------------


def _pending(name: str, pods: Sequence[Mapping[str, Any]], expected: int) -> WorkloadState:
    """Starting, unless a pod is stuck on something Kubernetes names: its reason then."""
    for pod in pods:
        pod_name = (pod.get("metadata") or {}).get("name", "")
        status = pod.get("status") or {}
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                reason = _reason(condition.get("reason"), cond.REASON_STARTING)
                said = str(condition.get("message") or "").strip()
                return WorkloadState(
                    Phase.PENDING, reason, f"pod {pod_name} is not scheduled ({reason}): {said}"
                )
        statuses = [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]
        for container in statuses:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") and waiting["reason"] not in _STARTING:
                reason = _reason(waiting["reason"], cond.REASON_STARTING)
                said = str(waiting.get("message") or "").strip()
                return WorkloadState(
                    Phase.PENDING,
                    reason,
                    (
                        f"container {container.get('name')} of pod {pod_name} is waiting "
                        f"({reason}){': ' + _quote(said) if said else ''}"
                    ),
                )
    if not pods:
        return WorkloadState(
            Phase.PENDING,
            cond.REASON_STARTING,
            f"Job {name} is created; no pod yet" if name else "the workload is being created",
        )
    return WorkloadState(
        Phase.PENDING, cond.REASON_STARTING, f"{len(pods)} of {expected} pods starting"
    )


# -- helpers ----------------------------------------------------------------------------------


def _reason(value: Any, default: str) -> str:
    """Kubernetes' own reason when it is a valid condition reason, else `default`."""
    return value if isinstance(value, str) and _REASON.match(value) else default


def _pod_order(pod: Mapping[str, Any]) -> tuple[int, str]:
    """Pods in rank order (an Indexed Job's completion index), then by name."""
    meta = pod.get("metadata") or {}
    index = (meta.get("annotations") or {}).get(COMPLETION_INDEX_ANNOTATION)
    rank = int(index) if isinstance(index, str) and index.isdigit() else 0
    return rank, str(meta.get("name") or "")
