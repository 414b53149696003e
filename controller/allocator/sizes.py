"""The caching allocator's sizing rules, each a constant or a small function.

Every name here is the one PyTorch's source gives it: c10/cuda/CUDACachingAllocator.cpp
(DeviceCachingAllocator: round_size, get_pool, get_allocation_size, should_split) and
c10/core/AllocatorConfig.cpp (roundup_power2_divisions). Comments quote the source.
"""

from __future__ import annotations

from collections.abc import Sequence

#: "all sizes are rounded to at least 512 bytes" (kMinBlockSize).
K_MIN_BLOCK_SIZE = 512
#: "largest 'small' allocation is 1 MiB" (kSmallSize): requests of at most this many bytes,
#: after rounding, come from the small pool; larger ones from the large pool.
K_SMALL_SIZE = 1_048_576
#: "'small' allocations are packed in 2 MiB blocks" (kSmallBuffer): a small-pool segment.
K_SMALL_BUFFER = 2_097_152
#: "'large' allocations may be packed in 20 MiB blocks" (kLargeBuffer).
K_LARGE_BUFFER = 20_971_520
#: "allocations between 1 and 10 MiB may use kLargeBuffer" (kMinLargeAlloc).
K_MIN_LARGE_ALLOC = 10_485_760
#: "round up large allocations to 2 MiB" (kRoundLarge).
K_ROUND_LARGE = 2_097_152

#: roundup_power2_divisions keeps one setting per power-of-two interval from 1 MiB
#: (kRoundUpPowerOfTwoStart) to 64 GiB (kRoundUpPowerOfTwoEnd): kRoundUpPowerOfTwoIntervals.
K_ROUND_UP_POWER_OF_TWO_INTERVALS = 16
_K_ROUND_UP_POWER_OF_TWO_START_LOG2 = 20  # log2(1 MiB)


def divisions_for(size: int, divisions: Sequence[int]) -> int:
    """AllocatorConfig::roundup_power2_divisions(size): the setting of the interval that
    holds `size`: index log2(size) - 20, clamped to [0, 15] (so sizes under 1 MiB use the
    first interval's setting and sizes over 32 GiB the last)."""
    index = size.bit_length() - 1 - _K_ROUND_UP_POWER_OF_TWO_START_LOG2
    index = max(0, min(index, K_ROUND_UP_POWER_OF_TWO_INTERVALS - 1))
    return divisions[index] if index < len(divisions) else 0


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """roundup_power2_next_division: `size` rounded up to the next of `divisions` equal steps
    between the powers of two around it. The source's example: 1200 with 4 divisions lies
    between 1024 and 2048, whose steps are 1024, 1280, 1536, 1792, so it becomes 1280."""
    if size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    # power2_floor >> log2(divisions); divisions is a power of two (the config checks it).
    step = power2_floor >> (divisions.bit_length() - 1)
    if step == 0:
        return power2_floor << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


def round_size(size: int, divisions: Sequence[int] = ()) -> int:
    """round_size: what a request of `size` bytes becomes. Below kMinBlockSize, 512; else
    a multiple of 512, unless roundup_power2_divisions is set for the size's interval and
    the size exceeds 512 x divisions, when it is rounded to the next power-of-two division
    (test/test_cuda.py test_allocator_settings: with "roundup_power2_divisions:4" an 84 MiB
    tensor takes 96 MiB, the next quarter step between 64 and 128 MiB)."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    split = divisions_for(size, divisions) if divisions else 0
    if split > 1 and size > K_MIN_BLOCK_SIZE * split:
        return roundup_power2_next_division(size, split)
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def is_small(size: int) -> bool:
    """get_pool: a rounded size of at most kSmallSize (1 MiB, inclusive) goes to the small
    pool, anything larger to the large pool. The pools never lend to each other."""
    return size <= K_SMALL_SIZE


def allocation_size(size: int) -> int:
    """get_allocation_size: how much one cudaMalloc reserves when no cached block fits a
    rounded request of `size`. Small requests get a kSmallBuffer (2 MiB) segment that later
    small requests share; requests above 1 MiB and below kMinLargeAlloc (10 MiB) get a
    kLargeBuffer (20 MiB) segment ("requests between 1MB and 10MB will allocate and split a
    20MB block"); larger ones exactly their size rounded up to kRoundLarge (2 MiB)."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


def should_split(
    block_size: int,
    size: int,
    *,
    small: bool,
    expandable: bool,
    max_split_size: int,
) -> bool:
    """should_split: whether a cached block of `block_size` that serves a request of `size`
    is cut in two, the remainder going back to the pool. In the small pool, and with
    expandable segments, whenever the remainder is at least kMinBlockSize; in the large pool
    only for requests below max_split_size and a remainder above kSmallSize (strictly: a
    remainder of exactly 1 MiB stays with the block and counts as allocated)."""
    remaining = block_size - size
    if small or expandable:
        return remaining >= K_MIN_BLOCK_SIZE
    return size < max_split_size and remaining > K_SMALL_SIZE
