"""Many jobs against one snapshot, in queue order, each admission charged before the next.

The order is priority (highest first: the value of the job's PriorityClass, resolved where
the requests are made, `controller.admission.priority`), then creation time, whatever the namespace,
then the order given: the queue the operator keeps. An admitted job's reservation is assumed
in the view before the next job is decided, so two jobs are never placed on the same free
memory, exactly as the operator's loop assumes before it writes.

* `BestEffortFIFO` (default) lets a later job that fits go ahead of an earlier one that
  waits (backfill). A waiting job older than the starvation limit holds the GPUs it is
  closest to fitting (those with the most free memory for its count; with whole GPUs, the
  open ones of the nodes with the most open), so later jobs cannot take them and it gets
  them as they drain.
* `StrictFIFO` never lets a job go ahead of one that waits: behind it, every job waits too
  (or is rejected, if it could never fit).

A job without a pod template runs nothing, so it holds nothing: it is told what admission
would do (reason NoTemplate), decided after the others on what they leave, never charged, and
never in another job's way; under StrictFIFO it waits behind a job that waits ahead of it, as
it would with a template.

A job without a priority (the PriorityClass it names does not exist) has no place in the
queue: it is told why (PriorityClassUnavailable), holds nothing, and is in no job's way. A
job's own warnings (a spec.priority that was ignored) end each of its decisions' messages.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import replace
from datetime import UTC, datetime

from controller.api import conditions as cond
from controller.decision import explain
from controller.decision.decide import decide_placed
from controller.decision.types import (
    AdmissionSettings,
    Decision,
    JobRequest,
    Outcome,
    QueueingStrategy,
)
from controller.packing.inventory import Snapshot
from controller.packing.view import ClusterView

_END = datetime.max.replace(tzinfo=UTC)


def queue_order(jobs: Sequence[JobRequest]) -> list[int]:
    """Indices of `jobs` in queue order: priority, then creation time (a job without one
    last: it cannot claim to be older), then as given."""

    def created(job: JobRequest) -> datetime:
        moment = job.created or _END
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)

    return sorted(range(len(jobs)), key=lambda i: (-jobs[i].priority, created(jobs[i]), i))


def plan(
    snapshot: Snapshot, jobs: Sequence[JobRequest], settings: AdmissionSettings | None = None
) -> list[Decision]:
    """Decide `jobs` in queue order; the decisions come back in that order."""
    settings = settings or AdmissionSettings()
    view = ClusterView(snapshot, settings.packing)
    return plan_on(view, jobs, settings, snapshot.now)


def plan_on(
    view: ClusterView,
    jobs: Sequence[JobRequest],
    settings: AdmissionSettings,
    now: datetime | None,
    template_less: Set[str] = frozenset(),
) -> list[Decision]:
    """`plan` on a view the caller built (the operator keeps one per pass). The jobs keyed in
    `template_less` have no pod template: they come last, each told what admission would do
    (a suspended one is told so in its place in the queue, as any job)."""
    order = queue_order(jobs)
    decisions: list[Decision] = []
    blocker: tuple[int, str] | None = None  # StrictFIFO: the first waiting job's place, key
    for place, i in enumerate(order):
        job = jobs[i]
        if job.suspend:
            decisions.append(_suspended(job))
            continue
        if job.priority_problem is not None:
            decisions.append(_unranked(job, job.priority_problem))
            continue
        if job.key in template_less:
            continue
        decision, placed = decide_placed(job, view)
        if placed is not None and blocker is not None:
            decision = _behind(job, blocker[1])
        elif placed is not None:
            view.assume(placed)
        elif decision.outcome is Outcome.QUEUE:
            if settings.queueing is QueueingStrategy.STRICT_FIFO:
                blocker = blocker or (place, job.key)
            elif _starving(job, now, settings):
                where = view.select(job.selector, job.constraints)
                view.hold_closest(job.estimate, job.parallelism, job.gpus, where)
        decisions.append(decision)
    for place, i in enumerate(order):
        job = jobs[i]
        if job.key in template_less and not job.suspend and job.priority_problem is None:
            decision, placed = decide_placed(job, view)
            if placed is not None and blocker is not None and blocker[0] < place:
                decision = _behind(job, blocker[1])
            decisions.append(_no_template(decision))
    warned = {job.key: job.warnings for job in jobs if job.warnings}
    return [_warned(d, warned[d.job]) if d.job in warned else d for d in decisions]


def _warned(decision: Decision, warnings: tuple[str, ...]) -> Decision:
    """The job's warnings at the end of the message, where every reader of a decision sees
    them (the Admitted condition, its Event, `vramgate plan`)."""
    message = decision.message + "".join(f"; warning: {w}" for w in warnings)
    # Advised repeats its message as a warning: the same text, lengthened alike.
    said = tuple(message if w == decision.message else w for w in decision.warnings)
    return replace(decision, message=message, warnings=said)


def _no_template(would: Decision) -> Decision:
    return replace(
        would,
        reason=cond.REASON_NO_TEMPLATE,
        message=explain.no_template(would),
        admitted_gpus=None,
        placement=(),
    )


def _starving(job: JobRequest, now: datetime | None, settings: AdmissionSettings) -> bool:
    return (
        now is not None
        and job.created is not None
        and (now - job.created > settings.starvation_limit)
    )


def _behind(job: JobRequest, blocker: str) -> Decision:
    return Decision(
        job.key,
        Outcome.QUEUE,
        cond.REASON_WAITING_IN_QUEUE,
        f"fits now, but waits behind {blocker} (queueing StrictFIFO lets no job go ahead of "
        "one that waits)",
        job.gpus,
        per_gpu_bytes=job.estimate.per_gpu_bytes(job.gpus, job.parallelism),
    )


def _unranked(job: JobRequest, problem: str) -> Decision:
    return Decision(
        job.key,
        Outcome.QUEUE,
        cond.REASON_PRIORITY_CLASS_UNAVAILABLE,
        problem,
        job.gpus,
        per_gpu_bytes=job.estimate.per_gpu_bytes(job.gpus, job.parallelism),
    )


def _suspended(job: JobRequest) -> Decision:
    return Decision(
        job.key,
        Outcome.QUEUE,
        cond.REASON_SUSPENDED,
        "spec.suspend is true: not admitted, and holds no GPU memory",
        job.gpus,
        per_gpu_bytes=job.estimate.per_gpu_bytes(job.gpus, job.parallelism),
    )
