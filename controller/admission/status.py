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
from datetime import UTC, datetime
from typing import Any

from controller.api import conditions as cond
from controller.api.enums import ConditionStatus
from controller.api.finetunejob import CorrectionStatus, EstimateStatus, PerGpuLevels
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


@dataclass(frozen=True)
class Stored:
    """A traced estimate as status keeps it, so that no replica traces the job again:
    `digest` of what it was computed from (`controller.jobs.spec.estimate_digest`) and the
    estimate itself (`controller.estimator.codec.encode`)."""

    digest: str
    traced: str


@dataclass(frozen=True)
class Tracing:
    """A trace under way for a job: since `started`, expected to take `about_s` seconds,
    the median of this operator's last `measured` traces (0: none yet, a default), once the
    `ahead` traces queued before it on the operator's `workers` trace workers have run."""

    started: datetime
    about_s: float
    measured: int = 0
    ahead: int = 0
    workers: int = 1

    @property
    def rounds(self) -> int:
        """How many traces' time the job waits: those ahead, `workers` at once, then its own."""
        return self.ahead // max(1, self.workers) + 1


def estimate_status(
    plan: JobPlan,
    est: Estimate,
    gpus: int | None = None,
    stored: Stored | None = None,
    correction: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`status.estimate` of a plan and its estimate, as stored: at the requested count, or at
    `gpus` (the count admitted by policy Resize), with the traced estimate kept (`stored`)
    and what learning does to the figure (`correction`, `Correction.to_dict()`): the figures
    stay the estimator's own."""
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
        correction=CorrectionStatus.model_validate(correction) if correction else None,
        config=plan.config or None,
        digest=stored.digest if stored else None,
        traced=stored.traced if stored else None,
    ).model_dump(mode="json", by_alias=True, exclude_none=True)


def estimated(
    plan: JobPlan,
    est: Estimate,
    generation: int,
    status: Mapping[str, Any],
    now: datetime,
    stored: Stored | None = None,
    correction: Mapping[str, Any] | None = None,
) -> StatusUpdate:
    """The job was estimated: Estimated=True with the figures, Admitted pending."""
    estimate = estimate_status(plan, est, stored=stored, correction=correction)
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
    stored: Stored | None = None,
    correction: Mapping[str, Any] | None = None,
) -> StatusUpdate:
    """Admitted on `gpus`: `status.estimate` and the Estimated message at the count that
    runs, so that `kubectl describe` shows one estimate, the one the GPUs were reserved for
    (nothing changes unless policy Resize chose another count than the request). No Event:
    the admission's says it."""
    estimate = estimate_status(plan, est, gpus, stored, correction)
    conditions = cond.set_condition(
        _conditions(status),
        cond.ESTIMATED,
        ConditionStatus.TRUE,
        cond.REASON_ESTIMATED,
        _estimated_message(plan, estimate, est),
        generation,
        now,
    )
    return StatusUpdate(_patch(status, {"estimate": estimate, "conditions": conditions}))


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
    correction = estimate.get("correction")
    if correction:  # "calibrated 21.30 GiB x 0.86 learned from 12 jobs like it (p95) = ..."
        message += f"; {correction['message']}"
    return message + "".join(f"; warning: {warning}" for warning in plan.warnings)


def tracing(
    plan: JobPlan, trace: Tracing, generation: int, status: Mapping[str, Any], now: datetime
) -> StatusUpdate:
    """The job's estimate is being traced: Estimated=False, reason Tracing, saying what is
    traced, for about how long and since when; Admitted Unknown for the same reason (until
    admission first decides). A Normal Event, once: the message stays the same until the
    trace ends, so later passes write nothing."""
    each = max(1, round(trace.about_s))
    basis = (
        f"the median of this operator's last {trace.measured} trace"
        + ("s" if trace.measured > 1 else "")
        if trace.measured
        else "a default: no trace has ended here yet"
    )
    if trace.ahead:  # queued: it waits for those ahead (`trace_workers` at once)
        queue = f"{trace.ahead} trace{'s' if trace.ahead > 1 else ''} ahead: "
        about = f"about {trace.rounds * each} s ({trace.rounds} x {each} s, {basis})"
    else:
        queue, about = "", f"about {each} s ({basis})"
    message = (
        f"tracing one training step of {plan.model} {_traced_spread(plan)}: {queue}{about}, "
        f"started {trace.started.astimezone(UTC).strftime('%H:%M:%SZ')}"
    )
    conditions = cond.set_condition(
        _conditions(status),
        cond.ESTIMATED,
        ConditionStatus.FALSE,
        cond.REASON_TRACING,
        message,
        generation,
        now,
    )
    conditions = _before_decision(
        conditions,
        ConditionStatus.UNKNOWN,
        cond.REASON_TRACING,
        f"not decided until estimated: {message}",
        generation,
        now,
    )
    return _update(
        status,
        {"estimate": None, "observedGeneration": generation, "conditions": conditions},
        Event(NORMAL, cond.REASON_TRACING, message),
    )


def _traced_spread(plan: JobPlan) -> str:
    """The spread the trace runs: one rank at the job's world size under FSDP or DDP (the
    trace runs that distributed step), else one process (a device map places its modules)."""
    if plan.gpus > 1 and plan.parallelism in (Parallelism.FSDP, Parallelism.DDP):
        return f"at world size {plan.gpus} ({plan.parallelism.api})"
    if plan.gpus > 1:
        return f"placed on {plan.gpus} GPUs ({plan.parallelism.api})"
    return "on one GPU"


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
    patch = _patch(status, desired)
    return StatusUpdate(patch, event if patch else None)


#: The keys of `status.estimate` that keep a traced estimate for reuse (`Stored`), nothing
#: anyone reads: an API server whose CRD predates them prunes them from every write.
STORED_KEYS = frozenset({"digest", "traced"})


def _patch(status: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that takes `status` to `desired` at each of its keys, for the keys that
    differ. Status is written as a JSON merge patch, which keeps what the patch leaves out:
    a nested key the status has and `desired` lacks (a traced job's `estimate.digest`, once
    the job is edited to a formula profile) is deleted with an explicit null, else it stays
    and every later pass would write the same status again."""
    return {
        key: _with_deletions(status.get(key), value)
        for key, value in desired.items()
        if not same(key, status.get(key), value)
    }


def same(key: str, current: Any, desired: Any) -> bool:
    """Whether status key `key` holds `desired` already: a null and an absent key are the same
    (a merge patch's null deletes), and an estimate that lacks every `STORED_KEYS` is the same
    as one that has them (the API server pruned them: writing again would loop, and without
    them the next operator only traces again)."""
    current, desired = _no_nulls(current), _no_nulls(desired)
    if (
        key == "estimate"
        and isinstance(current, dict)
        and isinstance(desired, dict)
        and not STORED_KEYS & current.keys()
    ):
        desired = {k: v for k, v in desired.items() if k not in STORED_KEYS}
    return bool(current == desired)


def _no_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    return value


def _with_deletions(current: Any, desired: Any) -> Any:
    """`desired` as a merge patch over `current`: nested keys only `current` has are null."""
    if not isinstance(desired, Mapping) or not isinstance(current, Mapping):
        return desired
    out = {key: _with_deletions(current.get(key), value) for key, value in desired.items()}
    out.update({key: None for key in current if key not in desired})
    return out


def one_line(text: str) -> str:
    """`text` on one line, cut to MAX_MESSAGE."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 3] + "..."
