"""The caching allocator's rules, one test each, against what c10/cuda/CUDACachingAllocator.cpp
and test/test_cuda.py state (the comment on each test quotes or names its source)."""

from __future__ import annotations

import pytest

from controller.allocator import (
    AllocatorConfig,
    CachingAllocator,
    Event,
    replay,
    replay_live_intervals,
)

MIB = 2**20
GIB = 2**30


def malloc(block: int, size: int, stream: int = 0) -> Event:
    return Event(block, size, stream, free=False)


def free(block: int, size: int, stream: int = 0) -> Event:
    return Event(block, size, stream, free=True)


def test_a_request_just_above_1_mib_takes_a_20_mib_segment() -> None:
    # "requests between 1MB and 10MB will allocate and split a 20MB block"
    result = replay([malloc(0, MIB + 1)])
    assert result.peak_reserved == 20 * MIB
    assert result.peak_allocated == MIB + 512
    assert result.segments == 1


def test_small_allocations_share_one_2_mib_segment() -> None:
    # "Small requests are packed into 2MB buffers."
    result = replay([malloc(0, 512), malloc(1, 512), malloc(2, 100_000)])
    assert result.peak_reserved == 2 * MIB
    assert result.segments == 1
    assert result.peak_allocated == 512 + 512 + 100_352


def test_the_pools_do_not_lend_to_each_other() -> None:
    # A cached 20 MiB large-pool block does not serve a 512-byte request.
    result = replay([malloc(0, 2 * MIB), free(0, 2 * MIB), malloc(1, 512)])
    assert result.peak_reserved == 22 * MIB


def test_a_block_freed_on_one_stream_is_not_reused_by_another() -> None:
    # "Once freed, blocks can be re-allocated on the same stream, but not on any other stream."
    other = replay([malloc(0, 4 * MIB, stream=1), free(0, 4 * MIB, 1), malloc(1, 4 * MIB, 0)])
    same = replay([malloc(0, 4 * MIB, stream=1), free(0, 4 * MIB, 1), malloc(1, 4 * MIB, 1)])
    assert other.peak_reserved == 40 * MIB and other.device_allocs == 2
    assert same.peak_reserved == 20 * MIB and same.device_allocs == 1


def test_best_fit_takes_the_smallest_cached_block_that_fits() -> None:
    # "The allocator attempts to find the smallest cached block that will fit the requested
    # size." With 30 and 50 MiB cached, 25 MiB goes to the 30 and 45 MiB still finds the 50.
    result = replay(
        [
            malloc(0, 30 * MIB),
            malloc(1, 50 * MIB),
            free(0, 30 * MIB),
            free(1, 50 * MIB),
            malloc(2, 25 * MIB),
            malloc(3, 45 * MIB),
        ]
    )
    assert result.peak_reserved == 80 * MIB
    assert result.device_allocs == 2
    assert result.final_allocated == 25 * MIB + 45 * MIB


def test_large_blocks_split_only_when_more_than_1_mib_would_remain() -> None:
    # should_split: `remaining > kSmallSize` in the large pool. 11 MiB + 1 B rounds to a
    # 12 MiB segment with less than 1 MiB left: the whole 12 MiB counts as allocated.
    unsplit = replay([malloc(0, 11 * MIB + 1)])
    assert (unsplit.peak_reserved, unsplit.peak_allocated) == (12 * MIB, 12 * MIB)
    exactly_one_left = replay([malloc(0, 19 * MIB)])
    assert exactly_one_left.peak_allocated == 20 * MIB
    split = replay([malloc(0, 9 * MIB), malloc(1, 9 * MIB)])
    assert (split.peak_reserved, split.peak_allocated) == (20 * MIB, 18 * MIB)


def test_small_blocks_split_down_to_512_bytes() -> None:
    # should_split: `remaining >= kMinBlockSize` in the small pool: two 1 MiB requests fill
    # one 2 MiB segment exactly.
    result = replay([malloc(0, MIB), malloc(1, MIB), malloc(2, 512)])
    assert result.peak_allocated == 2 * MIB + 512
    assert result.peak_reserved == 4 * MIB


def test_freed_neighbours_merge_within_a_segment() -> None:
    # free_block -> try_merge_blocks with prev and next: two adjacent freed 5 MiB blocks
    # serve a 9 MiB request without a new segment.
    result = replay(
        [
            malloc(0, 5 * MIB),
            malloc(1, 5 * MIB),
            malloc(2, 5 * MIB),
            free(0, 5 * MIB),
            free(1, 5 * MIB),
            malloc(3, 9 * MIB),
        ]
    )
    assert result.peak_reserved == 20 * MIB
    assert result.device_allocs == 1


def test_without_max_split_size_a_large_cached_block_is_split_for_a_small_request() -> None:
    result = replay([malloc(0, 100 * MIB), free(0, 100 * MIB), malloc(1, 30 * MIB)])
    assert result.peak_reserved == 100 * MIB
    assert result.final_allocated == 30 * MIB


def test_max_split_size_keeps_oversize_blocks_whole_and_for_large_requests() -> None:
    # get_free_block: "Do not return an oversized block for a large request" (a request below
    # max_split_size), and "Allow oversized block size to be rounded up but within a limit"
    # (kLargeBuffer, max_non_split_rounding_mb's default).
    config = AllocatorConfig(max_split_size=40 * MIB)
    below = replay([malloc(0, 100 * MIB), free(0, 100 * MIB), malloc(1, 30 * MIB)], config)
    assert below.peak_reserved == 130 * MIB
    within = replay([malloc(0, 100 * MIB), free(0, 100 * MIB), malloc(1, 90 * MIB)], config)
    assert within.peak_reserved == 100 * MIB
    assert within.final_allocated == 100 * MIB  # not split: the whole block is allocated
    beyond = replay([malloc(0, 100 * MIB), free(0, 100 * MIB), malloc(1, 70 * MIB)], config)
    assert beyond.peak_reserved == 170 * MIB


def test_expandable_segments_grow_in_20_mib_pages_for_large_and_2_mib_for_small() -> None:
    # Note [Expandable Segments]: "we use 2MiB pages for our small pool and 20MiB pages for
    # our large pool"; the request itself is mapped, not a kLargeBuffer per request.
    config = AllocatorConfig(expandable_segments=True)
    result = replay([malloc(0, 21 * MIB), malloc(1, 512), malloc(2, 10 * MIB)], config)
    assert result.peak_reserved == 40 * MIB + 2 * MIB
    assert result.segments == 2  # one per pool


def test_expandable_segments_tile_a_slightly_larger_batch_into_the_same_memory() -> None:
    # Note [Expandable Segments]: after running at size N, requests at N + 1 "tile nicely
    # into the one large segment until it fills up"; with one segment per cudaMalloc the
    # freed N-size blocks are too small and a second set of segments is made.
    events = [malloc(i, 24 * MIB) for i in range(10)]
    events += [free(i, 24 * MIB) for i in range(10)]
    events += [malloc(10 + i, 26 * MIB) for i in range(10)]
    plain = replay(events)
    grown = replay(events, AllocatorConfig(expandable_segments=True))
    assert plain.peak_reserved == 10 * 24 * MIB + 10 * 26 * MIB
    assert grown.peak_reserved == 260 * MIB  # 13 pages of 20 MiB
    assert grown.segments == 1


def test_expandable_segments_are_per_stream() -> None:
    config = AllocatorConfig(expandable_segments=True)
    result = replay([malloc(0, 5 * MIB, 0), malloc(1, 5 * MIB, 1)], config)
    assert result.segments == 2
    assert result.peak_reserved == 40 * MIB


def test_expandable_segments_shrink_only_on_release() -> None:
    allocator = CachingAllocator(AllocatorConfig(expandable_segments=True))
    allocator.malloc(0, 30 * MIB)
    allocator.malloc(1, 30 * MIB)
    assert allocator.reserved == 60 * MIB
    allocator.free(0)
    allocator.free(1)
    assert allocator.reserved == 60 * MIB  # cached, still mapped
    allocator.empty_cache()
    assert (allocator.reserved, allocator.segments) == (0, 0)


def test_garbage_collection_releases_old_cached_segments_above_the_threshold() -> None:
    # garbage_collect_cached_blocks: above garbage_collection_threshold x the allowed memory,
    # cached whole segments at least as old as the average go back to the driver.
    events = [
        malloc(0, 300 * MIB),
        malloc(1, 300 * MIB),
        free(0, 300 * MIB),
        free(1, 300 * MIB),
        malloc(2, 400 * MIB),
    ]
    without = replay(events, AllocatorConfig(capacity=GIB))
    with_gc = replay(events, AllocatorConfig(capacity=GIB, garbage_collection_threshold=0.5))
    assert without.final_reserved == 1000 * MIB
    assert with_gc.final_reserved == 400 * MIB
    assert with_gc.peak_reserved == 600 * MIB


def test_garbage_collection_needs_the_memory_fraction() -> None:
    events = [malloc(0, 300 * MIB), free(0, 300 * MIB), malloc(1, 400 * MIB)]
    result = replay(events, AllocatorConfig(garbage_collection_threshold=0.1))
    assert result.final_reserved == 700 * MIB


def test_at_capacity_cached_blocks_are_released_and_the_malloc_retried() -> None:
    # malloc: alloc_block fails, then "Free all non-split cached blocks and retry alloc."
    # (test_cuda.py test_out_of_memory_retry: after `del a`, the same large request works.)
    result = replay(
        [malloc(0, 600 * MIB), free(0, 600 * MIB), malloc(1, 700 * MIB)],
        AllocatorConfig(capacity=GIB),
    )
    assert result.oom_at is None
    assert result.alloc_retries == 1
    assert result.final_reserved == 700 * MIB
    assert result.peak_reserved == 700 * MIB


def test_beyond_capacity_with_nothing_to_release_is_out_of_memory() -> None:
    # test_cuda.py test_set_per_process_memory_fraction: past the allowed fraction a malloc
    # raises; the replay stops at that event and keeps its peaks.
    result = replay(
        [malloc(0, 600 * MIB), malloc(1, 700 * MIB), malloc(2, MIB)],
        AllocatorConfig(capacity=GIB),
    )
    assert result.oom_at == 1
    assert result.peak_reserved == 600 * MIB


def test_release_available_cached_blocks_frees_one_oversize_block_first() -> None:
    # release_available_cached_blocks: with max_split_size set, the smallest cached oversize
    # block of at least the request goes first; the other cached blocks stay.
    config = AllocatorConfig(max_split_size=256 * MIB, capacity=600 * MIB)
    result = replay(
        [
            malloc(0, 300 * MIB),
            malloc(1, 100 * MIB),
            free(0, 300 * MIB),
            free(1, 100 * MIB),
            malloc(2, 270 * MIB),  # the 300 MiB block is 30 MiB too big (> kLargeBuffer)
        ],
        config,
    )
    assert result.alloc_retries == 0
    assert result.final_reserved == 100 * MIB + 270 * MIB


def test_peak_reserved_at_names_the_event() -> None:
    result = replay([malloc(0, 512), malloc(1, 30 * MIB), free(1, 30 * MIB), malloc(2, MIB)])
    assert result.peak_reserved_at == 1


def test_live_intervals_free_before_allocating_at_the_same_tick() -> None:
    # A storage that dies at tick 1 hands its block to the one born at tick 1.
    result = replay_live_intervals([(30 * MIB, 0, 1, 0), (30 * MIB, 1, None, 0)])
    assert result.peak_reserved == 30 * MIB
    assert result.final_allocated == 30 * MIB


def test_zero_byte_allocations_take_no_block() -> None:
    # NativeCachingAllocator::allocate: `if (size != 0) { this->malloc(...) }`
    result = replay([malloc(0, 0), free(0, 0), malloc(1, 0)])
    assert (result.peak_allocated, result.peak_reserved) == (0, 0)


def test_a_free_of_an_unknown_block_is_an_error() -> None:
    with pytest.raises(ValueError, match="not allocated"):
        replay([free(7, 512)])
