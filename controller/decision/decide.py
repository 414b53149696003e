"""The decision for one job: Admit, Resize, Queue or Reject, with a message a person can act on.

In order:

1. No GPU node matches the selector: Reject (NoMatchingGPU). Fewer matching GPUs than the job
   needs (any count its policy allows): Reject (InsufficientGPUs).
2. The requested count fits the free memory now: Admit (Fits).
3. Policy Resize: the count nearest the request in [minGPUs, maxGPUs] that fits now (ties to
   the larger): Resize (Resized).
4. Policy Advise: the requested count by GPU count alone, the GPUs with the most free memory:
   Admit (Advised) with a warning, or Queue (WaitingForGPUs) while they are busy.
5. A count the policy allows fits the cluster when empty: Queue. WaitingForNodes when one
   would fit now if the matching nodes that take no work now took it (cordoned, not Ready, a
   silent agent, GPUs not yet reported, a taint the template does not tolerate: each as its
   agent last read it, or at the size its Node gives), naming them; else WaitingForVRAM.
6. Otherwise: Reject (InsufficientVRAM), saying which count would fit where one would.

A node whose GPUs are not yet reported counts, at the size its Node gives, for the GPUs the
cluster has (1) and what it holds when empty (5, 6): a GPUNode deleted and being made again
never turns a job that fits into a refusal. Where no label gives that size, it may hold any
job: the job waits for the node (5), and is decided on its memory once its agent reports.

A decision reads the view and changes nothing; `plan` charges admissions to the view.
"""

from __future__ import annotations

from collections.abc import Iterator

from controller.api import conditions as cond
from controller.api.enums import AdmissionPolicy
from controller.decision import explain
from controller.decision.types import Decision, JobRequest, Outcome
from controller.estimator import MAX_GPUS
from controller.packing.placement import Placed
from controller.packing.view import ClusterView, Selection


def resize_counts(requested: int, low: int, high: int) -> Iterator[int]:
    """Counts in [low, high] nearest `requested` first, ties to the larger."""
    for distance in range(max(requested - low, high - requested) + 1):
        pair = (requested,) if distance == 0 else (requested + distance, requested - distance)
        yield from (n for n in pair if low <= n <= high)


def decide(job: JobRequest, view: ClusterView, *, nodes_waited_for: bool = True) -> Decision:
    """The decision for `job` against the view's free memory now. `nodes_waited_for=False`
    leaves out whether a waiting job waits for nodes (WaitingForVRAM either way): that takes
    a view of the cluster as if every node took work, which the webhook, refusing only what
    never fits, has no use for on its request path."""
    return decide_placed(job, view, nodes_waited_for=nodes_waited_for)[0]


def decide_placed(
    job: JobRequest, view: ClusterView, *, nodes_waited_for: bool = True
) -> tuple[Decision, Placed | None]:
    """The decision and, when admitted, its placement in the view's terms (to assume)."""
    where = view.select(job.selector, job.constraints)
    requested = job.gpus
    if where.gpus == 0:
        return _unplaced(
            _reject(job, cond.REASON_NO_MATCHING_GPU, explain.no_matching_gpu(job, view))
        )
    low, high = _bounds(job, where)
    if low > high:
        return _unplaced(
            _reject(job, cond.REASON_INSUFFICIENT_GPUS, explain.too_few_gpus(job, where, low))
        )

    placed = view.place_now(job.estimate, job.parallelism, requested, where)
    if placed is not None:
        return _admit(job, view, placed, Outcome.ADMIT, cond.REASON_FITS), placed

    if job.policy is AdmissionPolicy.RESIZE:
        for n in resize_counts(requested, low, high):
            placed = view.place_now(job.estimate, job.parallelism, n, where)
            if placed is not None:
                return _admit(job, view, placed, Outcome.RESIZE, cond.REASON_RESIZED), placed

    if job.policy is AdmissionPolicy.ADVISE:
        if not view.shapes_empty(job.estimate, job.parallelism, requested, where):
            # No node shape takes the count at all (visibleDevices: wider than every node):
            # waiting for GPUs to free up would be waiting forever.
            return _unplaced(
                _reject(job, cond.REASON_INSUFFICIENT_GPUS, explain.no_shape(job, view, where))
            )
        placed = view.place_by_count(job.estimate, job.parallelism, requested, where)
        if placed is not None:
            return _admit(job, view, placed, Outcome.ADMIT, cond.REASON_ADVISED), placed
        return _unplaced(
            Decision(
                job.key,
                Outcome.QUEUE,
                cond.REASON_WAITING_FOR_GPUS,
                explain.waiting_for_gpus(job),
                requested,
                per_gpu_bytes=job.estimate.per_gpu_bytes(requested, job.parallelism),
            )
        )

    counts = [requested] if job.policy is not AdmissionPolicy.RESIZE else None
    queue_at = _fits_empty(job, view, where, counts or resize_counts(requested, low, high))
    if queue_at is not None:
        waits_for = None
        if nodes_waited_for:
            again = counts or resize_counts(requested, low, high)
            waits_for = _fits_resting(job, view, where, again)
        if waits_for is not None:
            n, placed = waits_for
            return _unplaced(
                Decision(
                    job.key,
                    Outcome.QUEUE,
                    cond.REASON_WAITING_FOR_NODES,
                    explain.waiting_for_nodes(job, view, where, n, placed),
                    requested,
                    per_gpu_bytes=job.estimate.per_gpu_bytes(n, job.parallelism),
                )
            )
        return _unplaced(
            Decision(
                job.key,
                Outcome.QUEUE,
                cond.REASON_WAITING_FOR_VRAM,
                explain.waiting_for_vram(job, view, where, queue_at),
                requested,
                per_gpu_bytes=job.estimate.per_gpu_bytes(queue_at, job.parallelism),
            )
        )
    if not view.shapes_empty(job.estimate, job.parallelism, requested, where):
        return _unplaced(
            _reject(job, cond.REASON_INSUFFICIENT_GPUS, explain.no_shape(job, view, where))
        )
    every = range(1, min(where.gpus, MAX_GPUS) + 1)
    other = None if counts is None else _fits_empty(job, view, where, every)
    return _unplaced(
        _reject(
            job, cond.REASON_INSUFFICIENT_VRAM, explain.never_fits(job, view, where, high, other)
        )
    )


def _bounds(job: JobRequest, where: Selection) -> tuple[int, int]:
    """The counts the policy allows, capped by the matching GPUs."""
    if job.policy is not AdmissionPolicy.RESIZE:
        return job.gpus, min(job.gpus, where.gpus)
    high = min(job.max_gpus or MAX_GPUS, where.gpus)
    return job.min_gpus, high


def _fits_empty(
    job: JobRequest, view: ClusterView, where: Selection, counts: Iterator[int] | list[int] | range
) -> int | None:
    for n in counts:
        if view.fits_empty(job.estimate, job.parallelism, n, where):
            return n
    return None


def _fits_resting(
    job: JobRequest, view: ClusterView, where: Selection, counts: Iterator[int] | list[int]
) -> tuple[int, Placed] | None:
    """The first count that would fit now if the matching nodes that take no work did, and
    where."""
    if not where.resting:
        return None
    for n in counts:
        placed = view.place_resting(job.estimate, job.parallelism, n, where)
        if placed is not None:
            return n, placed
    return None


def _admit(
    job: JobRequest, view: ClusterView, placed: Placed, outcome: Outcome, reason: str
) -> Decision:
    warnings: tuple[str, ...] = ()
    if reason == cond.REASON_ADVISED:
        message = explain.advised(job, view, placed)
        warnings = (message,)
    else:
        message = explain.fits(job, view, placed, outcome is Outcome.RESIZE)
    return Decision(
        job.key,
        outcome,
        reason,
        message,
        job.gpus,
        admitted_gpus=placed.gpus,
        per_gpu_bytes=placed.per_gpu_bytes,
        placement=view.node_gpus(placed),
        warnings=warnings,
    )


def _unplaced(decision: Decision) -> tuple[Decision, None]:
    return decision, None


def _reject(job: JobRequest, reason: str, message: str) -> Decision:
    return Decision(
        job.key,
        Outcome.REJECT,
        reason,
        message,
        job.gpus,
        per_gpu_bytes=job.estimate.per_gpu_bytes(job.gpus, job.parallelism),
    )
