"""Which GPUs a job fits on, given each GPU's free bytes, and why not when it does not.

Parallelism decides how an estimate spreads over GPUs:

* DDP: every GPU holds the whole job (`per_gpu_bytes(1)`); more GPUs add throughput only.
* FSDP / ZeRO-3 (seed 2): each of n cards holds `sharded / n + replicated`. Activations do
  not shard, so when one micro-batch of them exceeds a card no number of cards fits.
* device-map (seed 1): the job is split into consecutive pieces over GPUs chosen greedily by
  free memory; the first GPU counts in full and every further one at 85 % (NCCL buffers,
  transfer overhead, uneven shards), and each chosen GPU must still hold its per-GPU
  minimum (`sharded / n + replicated`).

Free bytes are first scaled by the profile's usable fraction (92 % of a card for the analytic
profile, which stands in for its overall 1.1 margin on a per-card basis, as seed 2 does).
The answer is always the smallest set that fits, or a reason naming the numbers: there is
no silent fallback to "all GPUs".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from controller.estimator.result import Estimate
from controller.estimator.settings import Parallelism
from controller.units import GIB

FURTHER_GPU_SHARE = Fraction(85, 100)


@dataclass(frozen=True, slots=True)
class Fit:
    """Where a job fits. `gpus` indexes the caller's list, in selection order."""

    fits: bool
    parallelism: Parallelism
    gpus: tuple[int, ...]
    min_gpus: int | None
    per_gpu_bytes: int | None
    usable_bytes: int
    reason: str


def _g(n_bytes: int) -> str:
    return f"{n_bytes / GIB:.1f} GiB"


def _by_free(free: Sequence[int]) -> list[int]:
    """GPU indices, most free memory first; ties keep index order (deterministic)."""
    return sorted(range(len(free)), key=lambda i: (-free[i], i))


def select_device_map(
    free: Sequence[int],
    required: int,
    min_per_gpu: Callable[[int], int] = lambda n: 0,
    max_gpus: int | None = None,
) -> tuple[tuple[int, ...], int] | None:
    """Seed 1's greedy selection: add GPUs by free memory until the usable pool covers
    `required` and every chosen GPU holds `min_per_gpu(n)`. Returns (GPUs, pool) or None."""
    order = _by_free(free)[: max_gpus or len(free)]
    pool = Fraction(0)
    for n, index in enumerate(order, start=1):
        pool += free[index] if n == 1 else free[index] * FURTHER_GPU_SHARE
        chosen = order[:n]
        if pool >= required and min(free[i] for i in chosen) >= min_per_gpu(n):
            return tuple(chosen), int(pool)
    return None


def fit(
    estimate: Estimate,
    free: Sequence[int],
    parallelism: Parallelism = Parallelism.FSDP,
    gpus: int | None = None,
) -> Fit:
    """Smallest set of GPUs from `free` (bytes per GPU) that holds the job.

    With `gpus`, exactly that many are considered (the user asked for them); otherwise any
    number up to all of them, smallest first.
    """
    usable = [int(f * estimate.usable_fraction) for f in free]
    if not usable:
        return Fit(False, parallelism, (), None, None, 0, "no GPUs to place on")
    if gpus is not None and gpus > len(usable):
        return Fit(
            False,
            parallelism,
            (),
            None,
            None,
            0,
            f"asks for {gpus} GPUs but only {len(usable)} are available",
        )
    order = _by_free(usable)
    largest = usable[order[0]]
    counts = [gpus] if gpus is not None else list(range(1, len(usable) + 1))

    if parallelism is Parallelism.DEVICE_MAP:
        return _device_map(estimate, usable, gpus)

    for n in counts:
        per = estimate.per_gpu_bytes(1 if parallelism is Parallelism.DDP else n)
        chosen = tuple(order[:n])
        if min(usable[i] for i in chosen) >= per:
            return Fit(True, parallelism, chosen, n, per, sum(usable[i] for i in chosen), "fits")

    if parallelism is Parallelism.DDP:
        per = estimate.per_gpu_bytes(1)
        reason = f"needs {_g(per)} on every GPU with DDP; the largest GPU has {_g(largest)} usable"
        if per <= largest and gpus is not None:
            reason = f"needs {_g(per)} on each of {gpus} GPUs; fewer GPUs have that much free"
        return Fit(False, parallelism, (), None, per, largest, reason)

    if estimate.replicated_bytes >= largest:
        return Fit(
            False,
            parallelism,
            (),
            None,
            None,
            largest,
            f"no number of GPUs fits: activations alone need {_g(estimate.replicated_bytes)} "
            f"per GPU, and the largest GPU has {_g(largest)} usable",
        )
    needed = -(-estimate.sharded_bytes // (largest - estimate.replicated_bytes))
    n = counts[-1]
    per = estimate.per_gpu_bytes(n)
    return Fit(
        False,
        parallelism,
        (),
        None,
        per,
        largest,
        f"needs {_g(per)} per GPU on {n} GPU{'s' if n > 1 else ''}; "
        f"the largest GPU has {_g(largest)} usable "
        f"(at least {needed} GPUs of that size would fit with FSDP)",
    )


def _pool(usable: Sequence[int], chosen: Sequence[int]) -> int:
    return int(usable[chosen[0]] + sum(usable[i] for i in chosen[1:]) * FURTHER_GPU_SHARE)


def _device_map(estimate: Estimate, usable: list[int], gpus: int | None) -> Fit:
    required = estimate.pooled_bytes
    order = _by_free(usable)
    if gpus is None:
        found = select_device_map(usable, required, min_per_gpu=estimate.per_gpu_bytes)
    else:
        # GPUs the user asked for are all used (the model is split across every one of them).
        chosen = tuple(order[:gpus])
        pool = _pool(usable, chosen)
        enough = min(usable[i] for i in chosen) >= estimate.per_gpu_bytes(gpus)
        found = (chosen, pool) if pool >= required and enough else None
    if found:
        chosen, pool = found
        n = len(chosen)
        return Fit(True, Parallelism.DEVICE_MAP, chosen, n, estimate.per_gpu_bytes(n), pool, "fits")
    n = gpus or len(usable)
    pool = _pool(usable, order[:n])
    return Fit(
        False,
        Parallelism.DEVICE_MAP,
        (),
        None,
        estimate.per_gpu_bytes(n),
        pool,
        f"needs {_g(required)} in total; {n} GPU{'s' if n > 1 else ''} give {_g(pool)} "
        "usable with a device map (the first in full, 85 % of each further one)",
    )
