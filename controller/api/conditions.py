"""Conditions in the `metav1.Condition` shape: their types, reasons, and the one way to set them.

Types and reasons are named constants so that the operator, the webhook, the node agent,
tests and docs cannot drift apart by a typo. Each reason's comment says what it indicates and
why. FineTuneJob's come first, then GPUNode's (written by the node agent).

`set_condition` is the only writer: it keeps `lastTransitionTime` while the status stays the
same (as `meta.SetStatusCondition` does in Go), so re-reconciling an unchanged job, or
restarting the operator, records nothing new.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from controller.api.enums import ConditionStatus

# -- condition types ------------------------------------------------------------------------

#: Estimated indicates whether status.estimate holds the VRAM estimate of the current spec.
ESTIMATED = "Estimated"
#: Admitted indicates whether the job's workload was created on GPUs that hold its estimate.
ADMITTED = "Admitted"
#: Running indicates whether a pod of the job's workload runs now; False once it finished,
#: with the reason it finished.
RUNNING = "Running"
#: Succeeded indicates whether the job's workload (its batch/v1 Job) completed.
SUCCEEDED = "Succeeded"
#: Failed indicates whether the job's workload failed; the reason says how (OOMKilled,
#: GPUOutOfMemory, or the batch Job's own reason) and the message names the pod and container.
FAILED = "Failed"

# -- reasons --------------------------------------------------------------------------------

#: Estimated indicates that status.estimate is up to date because the spec was valid and the
#: estimator computed it for the current generation.
REASON_ESTIMATED = "Estimated"
#: InvalidSpec indicates that the job cannot be estimated or admitted because its spec is
#: invalid; the message names every invalid field. Permanent until the spec changes.
REASON_INVALID_SPEC = "InvalidSpec"
#: ConfigMapUnavailable indicates that the job is not estimated yet because the ConfigMap named
#: in spec.model.configMapRef (or its key) could not be read; the operator retries.
REASON_CONFIGMAP_UNAVAILABLE = "ConfigMapUnavailable"
#: ProfileUnavailable indicates that the job is not estimated yet because the estimator profile
#: it asks for is not installed in the operator (Trace without the `trace` extra); the operator
#: retries, and a redeployed operator with the extra estimates it.
REASON_PROFILE_UNAVAILABLE = "ProfileUnavailable"
#: EstimationFailed indicates that the estimator raised an unexpected error for a spec that
#: passed validation; this is a vramgate bug, and the operator log has the traceback.
REASON_ESTIMATION_FAILED = "EstimationFailed"
#: Tracing indicates that the job is not estimated yet because its estimate is a traced
#: training step (profile Trace), which runs now on one of the operator's trace workers
#: (seconds to a minute); the message says what is traced, for about how long, and since
#: when. Estimated and decided once the trace ends; no other job waits for it.
REASON_TRACING = "Tracing"
#: Pending indicates that no admission decision exists yet because the job was estimated but
#: admission has not evaluated it.
REASON_PENDING = "Pending"
#: Fits indicates that the job was admitted as requested because its estimate fits the free
#: VRAM of the GPUs it asked for.
REASON_FITS = "Fits"
#: Resized indicates that the job was admitted with a different GPU count because its
#: admissionPolicy is Resize and the requested count did not match the count that fits.
REASON_RESIZED = "Resized"
#: WaitingForVRAM indicates that the job is queued because it fits the cluster when empty but
#: not the VRAM free now.
REASON_WAITING_FOR_VRAM = "WaitingForVRAM"
#: WaitingForNodes indicates that the job is queued because it would fit now on nodes that
#: take no work now (cordoned, not Ready, a silent agent, GPUs not yet reported, a taint its
#: pod template does not tolerate); the message names them and why. Admitted by itself once
#: they take work (or memory frees up elsewhere).
REASON_WAITING_FOR_NODES = "WaitingForNodes"
#: InsufficientVRAM indicates that the job was rejected because no GPUs in the cluster hold its
#: estimate even when empty.
REASON_INSUFFICIENT_VRAM = "InsufficientVRAM"
#: NoMatchingGPU indicates that the job was rejected because no GPU matches its
#: spec.resources.gpuSelector.
REASON_NO_MATCHING_GPU = "NoMatchingGPU"
#: InsufficientGPUs indicates that the job was rejected because the cluster has fewer GPUs
#: matching its spec.resources.gpuSelector than it requests, whatever their memory.
REASON_INSUFFICIENT_GPUS = "InsufficientGPUs"
#: Advised indicates that the job was admitted by GPU count alone because its
#: admissionPolicy is Advise, although its estimate does not fit the GPUs it got; the message
#: says by how much, since the job may run out of memory.
REASON_ADVISED = "Advised"
#: WaitingForGPUs indicates that the job is queued because its admissionPolicy is Advise and
#: fewer GPUs than it requests are free of other jobs now.
REASON_WAITING_FOR_GPUS = "WaitingForGPUs"
#: WaitingInQueue indicates that the job is queued because an earlier job in the queue waits
#: for memory and the queueing strategy is StrictFIFO, which lets no job go ahead of it.
REASON_WAITING_IN_QUEUE = "WaitingInQueue"
#: PriorityClassUnavailable indicates that the job is not decided because it has no place in
#: the queue: the PriorityClass it names (spec.priorityClassName, else its pod template's)
#: does not exist, or is a system class kept for the cluster's own components. It is decided
#: once the class exists, or once the spec names another.
REASON_PRIORITY_CLASS_UNAVAILABLE = "PriorityClassUnavailable"
#: Suspended indicates that the job is not admitted because spec.suspend is true; a suspended
#: job holds no reservation.
REASON_SUSPENDED = "Suspended"
#: NoTemplate indicates that the job is not admitted because spec.template is empty: there is
#: nothing to run, so nothing is reserved; the message says what admission would decide.
REASON_NO_TEMPLATE = "NoTemplate"
#: QueuedInKueue indicates that the job (spec.queueName) was handed to Kueue: its workload
#: waits, suspended, for Kueue's quota and for vramgate's AdmissionCheck to place it by GPU
#: memory; the message says the check's latest answer.
REASON_QUEUED_IN_KUEUE = "QueuedInKueue"
#: SpecLocked indicates that a change to the spec of an admitted job was ignored: only
#: spec.suspend may change once a job is admitted (suspend, edit, resume to change the rest).
REASON_SPEC_LOCKED = "SpecLocked"

#: Admitted reasons a job has before admission first decides it: set while the job cannot be
#: estimated (Admitted False, with the estimation's reason) or waits for its first decision.
BEFORE_ADMISSION = frozenset(
    {
        REASON_PENDING,
        REASON_TRACING,
        REASON_INVALID_SPEC,
        REASON_CONFIGMAP_UNAVAILABLE,
        REASON_PROFILE_UNAVAILABLE,
        REASON_ESTIMATION_FAILED,
    }
)

# Reasons of Running, Succeeded and Failed. Where Kubernetes says why a pod waits or a batch
# Job failed (ImagePullBackOff, Unschedulable, BackoffLimitExceeded, DeadlineExceeded ...),
# the reason is Kubernetes' own word, passed through: those are documented upstream.

#: Starting indicates that the job's workload is not running yet because it was just created
#: or its pods are still being scheduled and started.
REASON_STARTING = "Starting"
#: Running indicates that the job's workload runs because at least one of its pods is Running;
#: the message says how many of them, on which nodes.
REASON_RUNNING = "Running"
#: Succeeded indicates that the job's workload finished because its batch Job completed.
REASON_SUCCEEDED = "Succeeded"
#: OOMKilled indicates that the job's workload failed because the kernel killed a trainer
#: container for exceeding host memory (its memory limit or the node's RAM), not GPU memory.
REASON_OOM_KILLED = "OOMKilled"
#: GPUOutOfMemory indicates that the job's workload failed because the trainer ran out of GPU
#: memory (CUDA out of memory): vramgate's estimate was too low for this job.
REASON_GPU_OUT_OF_MEMORY = "GPUOutOfMemory"
#: WorkloadFailed indicates that the job's workload failed because a pod failed for a reason
#: Kubernetes did not name; the message holds the container's exit code and reason.
REASON_WORKLOAD_FAILED = "WorkloadFailed"
#: WorkloadDeleted indicates that the job failed because its workload (the batch Job) was
#: deleted before it finished (`kubectl delete job`, or a cleanup that did not wait for the
#: operator to see its end): the training stopped, and it is never started again by itself.
REASON_WORKLOAD_DELETED = "WorkloadDeleted"
#: WorkloadNotCreated indicates that the API server refused the job's workload for a reason
#: that may pass (a ResourceQuota, a webhook, the API server unreachable); an Event's reason,
#: not a condition's. The operator retries with backoff, up to every five minutes; the job
#: keeps its GPUs until it is created, suspended or deleted.
REASON_WORKLOAD_NOT_CREATED = "WorkloadNotCreated"
#: InvalidTemplate indicates that the job is not admitted because the API server refuses the
#: workload built from its pod template (400 or 422: an invalid container name, a malformed
#: quantity); the message is the API server's. Its GPUs are released; permanent until the
#: spec changes.
REASON_INVALID_TEMPLATE = "InvalidTemplate"

# -- GPUNode condition types ----------------------------------------------------------------

#: Ready indicates whether the GPUNode's status.gpus holds what the node agent's backend read
#: at status.heartbeatTime.
READY = "Ready"

# -- GPUNode reasons ------------------------------------------------------------------------

#: GPUsRead indicates that the GPUNode's status.gpus is current because the agent's backend
#: answered on its last poll; the message says how many GPUs it read and through which backend.
REASON_GPUS_READ = "GPUsRead"
#: BackendFailed indicates that the GPUNode's status.gpus may be stale because the agent's
#: backend (NVML, dcgm-exporter, the static file) failed; the message holds its error and what
#: to do. The agent keeps the last readings and retries with backoff.
REASON_BACKEND_FAILED = "BackendFailed"
#: AgentStopped indicates that the GPUNode takes no new work because its node agent stopped
#: cleanly (SIGTERM or SIGINT: a rollout, a drain, a node shutting down) and reads nothing
#: more; status.gpus holds its last readings, and the agent sets Ready again when it runs.
REASON_AGENT_STOPPED = "AgentStopped"


class Condition(BaseModel):
    """One condition, as `metav1.Condition`."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    type: str = Field(
        min_length=1,
        max_length=316,
        description="type of the condition in CamelCase, e.g. Estimated or Admitted.",
    )
    status: ConditionStatus = Field(
        description="status of the condition: True, False or Unknown.",
    )
    observed_generation: int | None = Field(
        None,
        ge=0,
        description="observedGeneration is the metadata.generation the condition was set for; "
        "older than the job's generation means the condition is out of date.",
    )
    last_transition_time: datetime = Field(
        description="lastTransitionTime is when the status last changed (RFC 3339, seconds).",
    )
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="reason is a CamelCase word for the last transition, e.g. InvalidSpec.",
    )
    message: str = Field(
        max_length=32768,
        description="message says what happened in one line, naming fields and numbers.",
    )

    def as_status(self) -> dict[str, Any]:
        """The condition as stored in status (camelCase keys, RFC 3339 time with `Z`)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def now_utc() -> datetime:
    """Wall-clock time truncated to seconds, the precision of `metav1.Time`."""
    return datetime.now(UTC).replace(microsecond=0)


def set_condition(
    conditions: Iterable[Mapping[str, Any]],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """The conditions with `type_` set; the others are kept as they are, in order.

    `lastTransitionTime` changes only when the status changes, so that it tells when the job
    entered its state, not when the operator last looked at it.
    """
    out: list[dict[str, Any]] = []
    found = False
    for existing in conditions:
        if existing.get("type") != type_:
            out.append(dict(existing))
            continue
        found = True
        same = existing.get("status") == status.value and existing.get("lastTransitionTime")
        if (
            same
            and (existing.get("reason"), existing.get("message")) == (reason, message)
            and (existing.get("observedGeneration") == generation)
        ):
            out.append(dict(existing))  # unchanged: no need to validate it again
            continue
        since = existing["lastTransitionTime"] if same else _rfc3339(now)
        out.append(_condition(type_, status, reason, message, generation, since))
    if not found:
        out.append(_condition(type_, status, reason, message, generation, _rfc3339(now)))
    return out


def find_condition(conditions: Iterable[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def _condition(
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int | None,
    since: str,
) -> dict[str, Any]:
    condition = Condition(
        type=type_,
        status=status,
        observed_generation=generation,
        last_transition_time=datetime.fromisoformat(since),
        reason=reason,
        message=message,
    ).as_status()
    # The recorded string itself, not a re-formatting of it: a kept time must compare equal.
    condition["lastTransitionTime"] = since
    return condition


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
