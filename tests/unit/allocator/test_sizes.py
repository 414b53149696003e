"""The sizing rules against what c10/cuda/CUDACachingAllocator.cpp and PyTorch's tests state."""

from __future__ import annotations

import pytest

from controller.allocator.sizes import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    allocation_size,
    divisions_for,
    is_small,
    round_size,
    roundup_power2_next_division,
    should_split,
)

MIB = 2**20
NO_LIMIT = 2**64 - 1


def test_constants_are_the_sources() -> None:
    assert (K_MIN_BLOCK_SIZE, K_SMALL_SIZE, K_SMALL_BUFFER, K_LARGE_BUFFER) == (
        512,
        1_048_576,
        2_097_152,
        20_971_520,
    )


@pytest.mark.parametrize(
    ("size", "rounded"), [(0, 512), (1, 512), (512, 512), (513, 1024), (MIB + 1, MIB + 512)]
)
def test_round_size_is_a_multiple_of_512_and_at_least_512(size: int, rounded: int) -> None:
    assert round_size(size) == rounded


def test_roundup_power2_next_division_matches_the_sources_example() -> None:
    # "if we need to round-up 1200 and number of divisions is 4 ... return 1280"
    assert roundup_power2_next_division(1200, 4) == 1280
    assert roundup_power2_next_division(1024, 4) == 1024  # powers of two stay


def test_roundup_power2_divisions_4_turns_84_mib_into_96_mib() -> None:
    # test/test_cuda.py test_allocator_settings: 21 Mi float32 (84 MiB) with
    # "roundup_power2_divisions:4" take power2_div(nbytes, 4), the next 16 MiB step: 96 MiB.
    nbytes = 4 * 21 * MIB
    assert round_size(nbytes) == nbytes
    assert round_size(nbytes, (4,) * 16) == 96 * MIB


def test_divisions_apply_only_above_512_times_divisions() -> None:
    # round_size: `divisions > 1 && size > (kMinBlockSize * divisions)`
    assert round_size(1200, (4,) * 16) == 1536  # 1200 < 2048: plain 512-byte rounding
    assert round_size(3 * MIB + 1, (2,) * 16) == 4 * MIB  # halves between 2 and 4 MiB
    assert round_size(3 * MIB + 1, (1,) * 16) == 3 * MIB + 512  # 1 division: plain


def test_divisions_interval_is_clamped_to_1_mib_and_64_gib() -> None:
    table = tuple(range(16))
    assert divisions_for(1000, table) == 0  # below 1 MiB: the first interval
    assert divisions_for(3 * MIB, table) == 1
    assert divisions_for(2**40, table) == 15  # above 32 GiB: the last


def test_the_small_pool_takes_up_to_1_mib_inclusive() -> None:
    assert is_small(K_SMALL_SIZE)
    assert not is_small(round_size(K_SMALL_SIZE + 1))


@pytest.mark.parametrize(
    ("size", "segment"),
    [
        (512, 2 * MIB),  # kSmallBuffer
        (MIB, 2 * MIB),
        (MIB + 512, 20 * MIB),  # kLargeBuffer below kMinLargeAlloc
        (10 * MIB - 512, 20 * MIB),
        (10 * MIB, 10 * MIB),  # from kMinLargeAlloc: rounded to kRoundLarge
        (11 * MIB + 512, 12 * MIB),
    ],
)
def test_get_allocation_size(size: int, segment: int) -> None:
    assert allocation_size(size) == segment


def test_small_pool_splits_a_remainder_of_512_bytes_but_not_less() -> None:
    kwargs = {"small": True, "expandable": False, "max_split_size": NO_LIMIT}
    assert should_split(2 * MIB, 2 * MIB - 512, **kwargs)
    assert not should_split(2 * MIB, 2 * MIB - 256, **kwargs)


def test_large_pool_splits_only_a_remainder_above_1_mib() -> None:
    kwargs = {"small": False, "expandable": False, "max_split_size": NO_LIMIT}
    assert not should_split(20 * MIB, 19 * MIB, **kwargs)  # exactly 1 MiB left: kept
    assert should_split(20 * MIB, 19 * MIB - 512, **kwargs)


def test_large_pool_does_not_split_for_requests_at_max_split_size() -> None:
    kwargs = {"small": False, "expandable": False, "max_split_size": 100 * MIB}
    assert not should_split(200 * MIB, 100 * MIB, **kwargs)
    assert should_split(200 * MIB, 99 * MIB, **kwargs)


def test_expandable_segments_split_any_remainder_of_512_bytes() -> None:
    assert should_split(20 * MIB, 20 * MIB - 512, small=False, expandable=True, max_split_size=0)
