"""What a FineTuneJob's status should say after a reconcile: pure, given the current status.

Each function returns the status keys to patch (only those that differ from the current
status) and the Event to post (only when something changed). An unchanged job therefore
yields an empty patch and no Event: re-reconciling or restarting the operator writes nothing,
and the conditions' `lastTransitionTime` keeps the moment the job entered its state.

Admission owns the `Admitted` condition once it decides; before that (and while the spec is
invalid) this module sets it, so that `kubectl get ftj` shows a reason from the first
reconcile on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from controller.api import conditions as cond
from controller.api.enums import ConditionStatus
from controller.api.finetunejob import EstimateStatus, PerGpuLevels
from controller.base.units import format_gib
from controller.estimator import Estimate, Parallelism
from controller.jobs.spec import JobPlan

#: Longest condition message we write; the API allows 32768 and people read one line.
MAX_MESSAGE = 4096
NORMAL, WARNING = "Normal", "Warning"


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the job."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class StatusUpdate:
    """Status keys to merge-patch (None deletes) and the Event that reports the change."""

    patch: dict[str, Any] = field(default_factory=dict)
    event: Event | None = None


def estimate_status(plan: JobPlan, est: Estimate, gpus: int | None = None) -> dict[str, Any]:
    """`status.estimate` of a plan and its estimate, as stored: at the requested count, or at
    `gpus` (the count admitted by policy Resize)."""
    gpus = plan.gpus if gpus is None else gpus
    per_gpu = est.per_gpu_bytes(gpus, plan.parallelism)
    levels = est.per_gpu_levels(gpus, plan.parallelism)
    return EstimateStatus(
        model=plan.model,
        profile=est.profile,
        components=dict(est.components),
        total_bytes=est.total_bytes,
        per_gpu_bytes=per_gpu,
        gpus=gpus,
        parallelism=plan.parallelism,
        total_params=est.total_params,
        trainable_params=est.trainable_params,
        total_gib=format_gib(est.total_bytes),
        per_gpu_gib=format_gib(per_gpu),
        per_gpu_levels=PerGpuLevels(
            allocated_bytes=levels.allocated,
            reserved_bytes=levels.reserved,
            nvml_bytes=levels.nvml,
        ),
    ).model_dump(mode="json", by_alias=True)


def estimated(
    plan: JobPlan, est: Estimate, generation: int, status: Mapping[str, Any], now: datetime
) -> StatusUpdate:
    """The job was estimated: Estimated=True with the figures, Admitted pending."""
    estimate = estimate_status(plan, est)
    message = _estimated_message(plan, estimate, est)
    conditions = cond.set_condition(
        _conditions(status),
        cond.ESTIMATED,
        ConditionStatus.TRUE,
        cond.REASON_ESTIMATED,
        message,
        generation,
        now,
    )
    conditions = _admission_pending(conditions, generation, now)
    settings = plan.settings
    method = settings.method.api
    rank = f" r={settings.rank}" if settings.is_adapter else ""
    detail = (
        f"{plan.model}, {method}{rank}, {settings.tokens_said} x batch {settings.batch}, "
        f"profile {est.profile}"
    )
    return _update(
        status,
        {"estimate": estimate, "observedGeneration": generation, "conditions": conditions},
        Event(NORMAL, cond.REASON_ESTIMATED, f"{message} ({detail})"),
    )


def admitted_estimate(
    plan: JobPlan,
    est: Estimate,
    gpus: int,
    generation: int,
    status: Mapping[str, Any],
    now: datetime,
) -> StatusUpdate:
    """Admitted on `gpus`: `status.estimate` and the Estimated message at the count that
    runs, so that `kubectl describe` shows one estimate, the one the GPUs were reserved for
    (nothing changes unless policy Resize chose another count than the request). No Event:
    the admission's says it."""
    estimate = estimate_status(plan, est, gpus)
    conditions = cond.set_condition(
        _conditions(status),
        cond.ESTIMATED,
        ConditionStatus.TRUE,
        cond.REASON_ESTIMATED,
        _estimated_message(plan, estimate, est),
        generation,
        now,
    )
    desired = {"estimate": estimate, "conditions": conditions}
    return StatusUpdate({key: value for key, value in desired.items() if status.get(key) != value})


def _estimated_message(plan: JobPlan, estimate: Mapping[str, Any], est: Estimate) -> str:
    """The Estimated condition's message: what `estimate` (status.estimate) says, and the
    count asked for where admission resized the job."""
    gpus = estimate["gpus"]
    # The total is the job on one GPU, not a sum over its GPUs: say so where they differ.
    differs = estimate["total"] != estimate["perGpu"]  # FSDP and device maps split it; DDP not
    notes = [f"{estimate['total']} on one GPU"] if differs else []
    if gpus > 1 and plan.parallelism is Parallelism.FSDP:
        # Why the figure can be far above the total over the count (`Estimate.undivided_bytes`).
        notes.insert(0, f"{format_gib(est.undivided_bytes(gpus))} of it FSDP does not divide")
    message = f"{estimate['perGpu']} per GPU on {gpus} GPU{'s' if gpus > 1 else ''} with "
    message += str(estimate["parallelism"]) + (f" ({'; '.join(notes)})" if notes else "")
    if gpus != plan.gpus:
        asked = f"{plan.gpus} GPU{'s' if plan.gpus > 1 else ''}"
        message += f"; resized from the {asked} asked for (policy Resize)"
    return message + "".join(f"; warning: {warning}" for warning in plan.warnings)


def invalid(
    message: str, generation: int, status: Mapping[str, Any], now: datetime
) -> StatusUpdate:
    """The spec is invalid: Estimated=False and Admitted=False, both InvalidSpec. `message`
    names every invalid field (`str(SpecErrors(errors))`)."""
    message = one_line(message)
    conditions = _conditions(status)
    for type_ in (cond.ESTIMATED, cond.ADMITTED):
        conditions = cond.set_condition(
            conditions,
            type_,
            ConditionStatus.FALSE,
            cond.REASON_INVALID_SPEC,
            message,
            generation,
            now,
        )
    return _update(
        status,
        {"estimate": None, "observedGeneration": generation, "conditions": conditions},
        Event(WARNING, cond.REASON_INVALID_SPEC, message),
    )


def not_estimated(
    reason: str, message: str, generation: int, status: Mapping[str, Any], now: datetime
) -> StatusUpdate:
    """No estimate for a reason other than the spec (ConfigMap unreadable, estimator bug)."""
    message = one_line(message)
    conditions = cond.set_condition(
        _conditions(status),
        cond.ESTIMATED,
        ConditionStatus.FALSE,
        reason,
        message,
        generation,
        now,
    )
    # `kubectl get ftj` shows Admitted and its reason: say there why nothing is decided.
    conditions = _before_decision(
        conditions,
        ConditionStatus.FALSE,
        reason,
        one_line(f"not admitted until estimated: {message}"),
        generation,
        now,
    )
    return _update(
        status,
        {"estimate": None, "observedGeneration": generation, "conditions": conditions},
        Event(WARNING, reason, message),
    )


def _admission_pending(
    conditions: list[dict[str, Any]], generation: int, now: datetime
) -> list[dict[str, Any]]:
    return _before_decision(
        conditions,
        ConditionStatus.UNKNOWN,
        cond.REASON_PENDING,
        "not evaluated by admission yet",
        generation,
        now,
    )


def _before_decision(
    conditions: list[dict[str, Any]],
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int,
    now: datetime,
) -> list[dict[str, Any]]:
    """Admitted as given, unless admission has decided the job: its decision stays."""
    admitted = cond.find_condition(conditions, cond.ADMITTED)
    if admitted is not None and admitted.get("reason") not in cond.BEFORE_ADMISSION:
        return conditions
    return cond.set_condition(conditions, cond.ADMITTED, status, reason, message, generation, now)


def _conditions(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(c) for c in status.get("conditions") or []]


def _update(status: Mapping[str, Any], desired: dict[str, Any], event: Event) -> StatusUpdate:
    patch = {key: value for key, value in desired.items() if status.get(key) != value}
    return StatusUpdate(patch, event if patch else None)


def one_line(text: str) -> str:
    """`text` on one line, cut to MAX_MESSAGE."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 3] + "..."
