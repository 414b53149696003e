"""Whether a job fits N GPUs of given free memory, and the smallest count that would.

This is the question `vramgate estimate --gpu-memory` answers for a list of identical cards;
the cluster-wide placement (`placement.py`) asks the same per-GPU question of real GPUs.
Every figure comes from `Estimate.per_gpu_bytes`, the one per-GPU rule:

* DDP: every GPU holds the whole job; more GPUs add throughput only.
* FSDP / ZeRO-3 (seed 2): each of n GPUs holds `sharded / n + replicated`. Activations do
  not shard, so when one micro-batch of them fills a GPU no number of GPUs fits.
* device map (seed 1): the job is split into consecutive pieces over the GPUs with the most
  free memory; the first counts in full and every further one at 85 % (NCCL buffers,
  transfer overhead, uneven shards). The first GPU holds the LM head, so it needs the
  per-GPU figure with the logits; every other one its share without them.

The count search is linear in the number of GPUs (one sort, then O(1) per count), so a
request for thousands of GPUs stays cheap. Nothing widens silently: a job asked onto N GPUs
is answered for N, and `min_gpus` says what would fit instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from controller.base.units import GIB
from controller.estimator import MAX_GPUS, Estimate, Parallelism

FURTHER_GPU_SHARE = Fraction(85, 100)


@dataclass(frozen=True, slots=True)
class Fit:
    """The answer for `gpus` GPUs. `chosen` indexes the caller's list, in selection order;
    `min_gpus` is the smallest count that fits (None: none up to all of them)."""

    fits: bool
    parallelism: Parallelism
    gpus: int
    chosen: tuple[int, ...]
    per_gpu_bytes: int
    min_gpus: int | None
    min_gpus_per_gpu_bytes: int | None
    reason: str


def gib(n_bytes: int) -> str:
    return f"{n_bytes / GIB:.2f} GiB"


def plural(n: int, word: str = "GPU") -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def by_free(free: Sequence[int]) -> list[int]:
    """GPU indices, most free memory first; ties keep index order (deterministic)."""
    return sorted(range(len(free)), key=lambda i: (-free[i], i))


def device_map_pool(frees_desc: Sequence[int]) -> int:
    """Seed 1's usable pool of GPUs taken most-free first: the first in full, 85 % of the rest."""
    if not frees_desc:
        return 0
    return int(frees_desc[0] + sum(frees_desc[1:]) * FURTHER_GPU_SHARE)


def device_map_holds(estimate: Estimate, frees_desc: Sequence[int]) -> bool:
    """Seed 1's test for GPUs taken most-free first: the pool covers the job, the first GPU
    holds its share with the LM head, and each further one its share without it."""
    n = len(frees_desc)
    if n == 0 or frees_desc[0] < estimate.per_gpu_bytes(n, Parallelism.DEVICE_MAP):
        return False
    if n > 1 and frees_desc[-1] < estimate.device_map_min_bytes(n):
        return False
    return device_map_pool(frees_desc) >= estimate.total_bytes


def select_device_map(
    free: Sequence[int],
    required: int,
    min_per_gpu: Callable[[int], int] = lambda n: 0,
    max_gpus: int | None = None,
) -> tuple[tuple[int, ...], int] | None:
    """Seed 1's greedy selection: add GPUs by free memory until the usable pool covers
    `required` and every chosen GPU holds `min_per_gpu(n)`. Returns (GPUs, pool) or None."""
    order = by_free(free)[: max_gpus or len(free)]
    pool = Fraction(0)
    for n, index in enumerate(order, start=1):
        pool += free[index] if n == 1 else free[index] * FURTHER_GPU_SHARE
        if pool >= required and free[index] >= min_per_gpu(n):
            return tuple(order[:n]), int(pool)
    return None


def holds(estimate: Estimate, parallelism: Parallelism, frees_desc: Sequence[int]) -> bool:
    """Whether these GPUs (most free first) hold the job spread over all of them."""
    n = len(frees_desc)
    if n == 0:
        return False
    if parallelism is Parallelism.DEVICE_MAP:
        return device_map_holds(estimate, frees_desc)
    return frees_desc[-1] >= estimate.per_gpu_bytes(n, parallelism)


def fewest_fsdp_gpus(estimate: Estimate, largest: int) -> int | None:
    """The fewest GPUs of `largest` free bytes each that hold the job with FSDP (up to
    MAX_GPUS), if any: counted up from the bound the tensors alone set. The allocator's
    reserve is no fixed factor of them (a share of what a GPU holds beyond its weights), so
    a bound that assumed the one-GPU margin could start past the fewest; and the need is not
    monotone in the count (a load moment that holds the whole model on every rank grows
    with it, a count the trace measured is its own figure), so nothing is bisected. One GPU
    holds no FSDP overhead and is asked first."""

    def fits(n: int) -> bool:
        return estimate.per_gpu_bytes(n, Parallelism.FSDP) <= largest

    if fits(1):
        return 1
    traced = min(
        (
            count
            for value, count, _ in estimate.traced_per_gpu
            if value == Parallelism.FSDP.value and 2 <= count <= MAX_GPUS and fits(count)
        ),
        default=None,
    )
    # What the rule's tensors may reach before the correction (`Estimate._corrected`) takes
    # the figure over `largest`, NCCL's buffers on every rank aside; each moment needs
    # sharded // n + replicated of it, and a reserve of at least nothing.
    room = largest * 100 // estimate.correction_percent - estimate.comm_bytes
    pairs = estimate.fsdp_pairs
    if any(replicated > room for _, replicated in pairs):
        return traced  # what every GPU holds whole at one moment: no count divides it
    if not estimate.load_moment and not fits(MAX_GPUS):
        # Without a load moment the rule does not grow with the count (each moment's share
        # shrinks, the rest stays): none fits if the most does not, and the walk is skipped.
        return traced
    low = max(2, *(sharded // (room - replicated + 1) + 1 for sharded, replicated in pairs))
    for n in range(low, min(traced or MAX_GPUS + 1, MAX_GPUS + 1)):
        if fits(n):
            return n
    return traced


def smallest_count(
    estimate: Estimate, parallelism: Parallelism, frees_desc: Sequence[int]
) -> int | None:
    """The fewest of these GPUs (most free first) that hold the job, in one pass."""
    pool = Fraction(0)
    for n, free in enumerate(frees_desc, start=1):
        pool += free if n == 1 else free * FURTHER_GPU_SHARE
        if parallelism is Parallelism.DEVICE_MAP:
            ok = (
                pool >= estimate.total_bytes
                and frees_desc[0] >= estimate.per_gpu_bytes(n, parallelism)
                and (n == 1 or free >= estimate.device_map_min_bytes(n))
            )
        else:
            ok = free >= estimate.per_gpu_bytes(n, parallelism)
        if ok:
            return n
        if parallelism is Parallelism.DDP:
            return None  # the need does not shrink with more GPUs
    return None


def fit(
    estimate: Estimate,
    free: Sequence[int],
    parallelism: Parallelism = Parallelism.FSDP,
    gpus: int = 1,
) -> Fit:
    """Whether `gpus` of the GPUs in `free` (bytes each) hold the job, and which ones."""
    order = by_free(free)
    frees_desc = [free[i] for i in order]
    per_gpu = estimate.per_gpu_bytes(gpus, parallelism)
    smallest = smallest_count(estimate, parallelism, frees_desc)
    smallest_per_gpu = None if smallest is None else estimate.per_gpu_bytes(smallest, parallelism)
    if gpus > len(free):
        reason = f"asks for {plural(gpus)} but only {len(free)} are available"
        return Fit(False, parallelism, gpus, (), per_gpu, smallest, smallest_per_gpu, reason)
    if holds(estimate, parallelism, frees_desc[:gpus]):
        chosen = tuple(order[:gpus])
        return Fit(True, parallelism, gpus, chosen, per_gpu, smallest, smallest_per_gpu, "fits")
    reason = _why_not(estimate, parallelism, gpus, frees_desc, smallest)
    return Fit(False, parallelism, gpus, (), per_gpu, smallest, smallest_per_gpu, reason)


def _why_not(
    estimate: Estimate,
    parallelism: Parallelism,
    gpus: int,
    frees_desc: Sequence[int],
    smallest: int | None,
) -> str:
    mode = parallelism.prose
    largest = frees_desc[0] if frees_desc else 0
    if not frees_desc:
        return "no GPUs to place on"
    if parallelism is Parallelism.DEVICE_MAP:
        chosen = frees_desc[:gpus]
        pool = device_map_pool(chosen)
        if pool < estimate.total_bytes:
            why = (
                f"the pool of a device map is short: needs {gib(estimate.total_bytes)} in total, "
                f"and the pool of {plural(gpus)} is {gib(pool)}, the first in full and 85 % of "
                "each further one"
            )
        else:
            head = estimate.per_gpu_bytes(gpus, parallelism)
            rest = estimate.device_map_min_bytes(gpus)
            short = chosen[0] < head
            why = "the pool of a device map suffices but a per-GPU minimum does not: " + (
                f"the GPU with the LM head needs {gib(head)} and has {gib(chosen[0])}"
                if short
                else f"each further GPU needs {gib(rest)} and one has {gib(chosen[-1])}"
            )
    else:
        per_gpu = estimate.per_gpu_bytes(gpus, parallelism)
        need = f"needs {gib(per_gpu)} per GPU on {plural(gpus)} with {mode}"
        if parallelism is Parallelism.FSDP and fewest_fsdp_gpus(estimate, largest) is None:
            most = estimate.per_gpu_bytes(MAX_GPUS, parallelism)
            whole = estimate.undivided_bytes(MAX_GPUS)
            return (
                f"no number of GPUs fits: even on {MAX_GPUS:,} GPUs each needs {gib(most)}, "
                f"{gib(whole)} of it what FSDP does not divide (activations, buffers), and the "
                f"largest GPU has {gib(largest)}"
            )
        held = frees_desc[gpus - 1] if gpus <= len(frees_desc) else 0
        why = (
            f"{need}; the largest GPU has {gib(largest)}"
            if gpus == 1
            else f"{need}; of the {gpus} most free GPUs the least free has {gib(held)}"
        )
    if smallest is not None:
        per = estimate.per_gpu_bytes(smallest, parallelism)
        why += f" ({plural(smallest)} would fit with {mode}, {gib(per)} each)"
    return why
