"""Invariants of the replay on generated sequences of mallocs and frees (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.allocator import AllocatorConfig, CachingAllocator, OutOfMemory
from controller.allocator.sizes import round_size

MIB = 2**20

#: Sizes across both pools and all three segment rules: small, 1-10 MiB, above 10 MiB.
SIZES = st.one_of(
    st.integers(1, MIB),
    st.integers(MIB + 1, 10 * MIB),
    st.integers(10 * MIB, 120 * MIB),
)
#: A step: (size, stream, free a live block instead, which live block).
STEPS = st.lists(
    st.tuples(SIZES, st.integers(0, 2), st.booleans(), st.integers(0, 10**6)),
    max_size=120,
)
CONFIGS = st.sampled_from(
    [
        AllocatorConfig(),
        AllocatorConfig(expandable_segments=True),
        AllocatorConfig(max_split_size=40 * MIB),
        AllocatorConfig(roundup_power2_divisions=(4,) * 16),
        AllocatorConfig(capacity=2**30, garbage_collection_threshold=0.5),
    ]
)


def check_segments(allocator: CachingAllocator) -> None:
    """The block lists behind the figures: every segment's blocks are contiguous, mapped
    bytes add up to reserved, no two free neighbours are left unmerged, and each cached or
    unmapped block sits in its pool under its current key."""
    blocks = list(allocator._live.values())
    for pool in allocator._pools:
        assert pool.keys == sorted(pool.blocks) and pool.unmapped_keys == sorted(pool.unmapped)
        for key, block in pool.blocks.items():
            assert block.mapped and not block.allocated and block.key == key
        for key, block in pool.unmapped.items():
            assert not block.mapped and block.key == key
        blocks += pool.blocks.values()
        blocks += pool.unmapped.values()
    assert len({id(block) for block in blocks}) == len(blocks)
    mapped = 0
    for block in blocks:
        if block.mapped:
            mapped += block.size
        following = block.next
        if following is not None:
            assert following.prev is block
            assert block.ptr + block.size == following.ptr
            free_pair = not block.allocated and not following.allocated
            assert not (free_pair and block.mapped == following.mapped)
    assert mapped == allocator.reserved


@settings(max_examples=150, deadline=None)
@given(steps=STEPS, config=CONFIGS)
def test_invariants_hold_at_every_step(
    steps: list[tuple[int, int, bool, int]], config: AllocatorConfig
) -> None:
    allocator = CachingAllocator(config)
    live: dict[int, tuple[int, int]] = {}  # block -> (rounded request, size handed out)
    for block, (size, stream, frees, pick) in enumerate(steps):
        if frees and live:
            victim = sorted(live)[pick % len(live)]
            allocator.free(victim)
            del live[victim]
        else:
            try:
                handed = allocator.malloc(block, size, stream)
            except OutOfMemory as error:  # only a capacity can make a malloc fail
                assert config.capacity is not None, error
                continue
            rounded = round_size(size, config.roundup_power2_divisions)
            assert handed >= rounded
            live[block] = (rounded, handed)
        # allocated is the sum of the blocks handed out, each at least the rounded request
        assert allocator.allocated == sum(handed for _, handed in live.values())
        assert allocator.allocated >= sum(rounded for rounded, _ in live.values())
        assert allocator.reserved >= allocator.allocated
        assert allocator.peak_reserved >= allocator.reserved
        assert allocator.peak_allocated >= allocator.allocated
        if config.capacity is not None:
            assert allocator.reserved <= config.capacity
        check_segments(allocator)
    for block in list(live):
        allocator.free(block)
    assert allocator.allocated == 0
    check_segments(allocator)
    allocator.empty_cache()
    check_segments(allocator)
    assert (allocator.reserved, allocator.segments) == (0, 0)
