"""A model of PyTorch's CUDA caching allocator, replayed over a sequence of mallocs and frees.

NVML, `nvidia-smi` and every scheduler see what the caching allocator *reserved* from the
driver, not what tensors hold. `replay` runs a traced sequence (controller.allocator.events)
through the allocator's rules as c10/cuda/CUDACachingAllocator.cpp states them
(DeviceCachingAllocator in PyTorch 2.x) and reports both peaks:

* **allocated**: the bytes of the blocks handed out (`torch.cuda.max_memory_allocated`), each
  block its rounded size or, when a cached block is not split, the whole block;
* **reserved**: the bytes of the segments cudaMalloc'd or mapped
  (`torch.cuda.max_memory_reserved`).

The rules, in the order `malloc` applies them (names as in the source):

1. round_size: at least kMinBlockSize (512), then multiples of 512 or power-of-two divisions
   (controller.allocator.sizes);
2. get_pool: at most kSmallSize (1 MiB) from the small pool, else the large pool;
3. get_free_block: the smallest cached block of the same pool **and stream** with at least the
   size, blocks ordered by (stream, size, address) (BlockComparatorSize); an oversize block
   (>= max_split_size) serves only requests of at least max_split_size that it exceeds by
   less than max_non_split_rounding;
4. garbage_collect_cached_blocks when nothing is cached and a threshold is set: frees whole
   cached large segments older than the average until reserved falls below the threshold;
5. alloc_block: a new segment of get_allocation_size (2 MiB, 20 MiB, or the size rounded to
   2 MiB); if it would pass `capacity`, release_available_cached_blocks (oversize blocks
   only), then release_cached_blocks (every cached whole segment, as empty_cache does), each
   followed by a retry; after that an out-of-memory error, where the replay stops;
6. should_split: the block is cut and the remainder cached (small pool: remainder >= 512;
   large pool: request below max_split_size and remainder > 1 MiB; expandable: >= 512);
7. free_block: a freed block merges with free neighbours of its segment and is cached for its
   stream; memory goes back to the driver only on release (empty_cache, the retries, GC).

With expandable_segments each stream and pool has one segment that grows by pages, 2 MiB in
the small pool and 20 MiB (kLargeBuffer) in the large one (find_expandable_block,
ExpandableSegment's segment_size_), at the lowest free address; released pages are unmapped
one by one, so reserved shrinks only on release.

What the model leaves out: CUDA graph private pools, recordStream's deferred frees (a free
here is complete at once), the FreeCudaMemoryCallbacks, and the driver's real addresses: each
new segment takes the next addresses in one growing space, so ties in (stream, size) fall to
the older segment, as they tend to on a GPU. Source read: pytorch/pytorch main, files as of
commit 001074d25084fdb87a799823e395a50f5ec044d3 (CUDACachingAllocator.cpp) and
065861fba7598880aa3216822742a1172d0a197c (c10/core/AllocatorConfig.cpp).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from dataclasses import dataclass

from controller.allocator.config import NO_MAX_SPLIT_SIZE, AllocatorConfig
from controller.allocator.events import Event, Interval, events_from_intervals
from controller.allocator.sizes import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    allocation_size,
    round_size,
)

#: Virtual address space of one expandable segment when no capacity bounds it (PyTorch
#: reserves 1 1/8 of the GPU's memory; any figure far above what is mapped behaves the same).
_DEFAULT_ADDRESS_SPACE = 1 << 46
_SIZE_SHIFT = 64
_STREAM_SHIFT = 128


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What the replay reached, in bytes; `peak_reserved_at` is the index of the event at
    which reserved first reached its peak (-1 if nothing was reserved). `oom_at` is the index
    of the malloc that failed with `capacity` exhausted (the replay stops there), else None.
    `segments` counts the segments held at the end (an expandable segment counts once) and
    `device_allocs` the cudaMalloc calls or page mappings made (num_device_alloc)."""

    peak_allocated: int
    peak_reserved: int
    peak_reserved_at: int
    final_allocated: int
    final_reserved: int
    segments: int
    device_allocs: int
    alloc_retries: int
    oom_at: int | None


class _Segment:
    """An expandable segment: its base address, page size and address-space size."""

    __slots__ = ("base", "page", "size")

    def __init__(self, base: int, page: int, size: int) -> None:
        self.base = base
        self.page = page
        self.size = size


class _Block:
    """A block of a segment: allocated, cached (free, mapped) or, in an expandable segment,
    unmapped address space. prev/next link the blocks of one segment in address order."""

    __slots__ = (
        "allocated",
        "gc_base",
        "key",
        "mapped",
        "next",
        "prev",
        "ptr",
        "segment",
        "size",
        "small",
        "stream",
    )

    def __init__(
        self,
        size: int,
        ptr: int,
        stream: int,
        small: bool,
        segment: _Segment | None = None,
        mapped: bool = True,
    ) -> None:
        self.size = size
        self.ptr = ptr
        self.stream = stream
        self.small = small
        self.segment = segment
        self.mapped = mapped
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.key = 0
        self.gc_base = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class _Pool:
    """One BlockPool: the cached blocks sorted by (stream, size, address) as packed integer
    keys (a bisect on ints is several times faster than on tuples), and the unmapped blocks
    of expandable segments sorted by (stream, address)."""

    __slots__ = ("blocks", "calls", "keys", "small", "unmapped", "unmapped_keys")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[int] = []
        self.blocks: dict[int, _Block] = {}
        self.unmapped_keys: list[int] = []
        self.unmapped: dict[int, _Block] = {}
        #: get_free_blocks_call_count: the clock garbage collection measures ages with.
        self.calls = 0


class OutOfMemory(Exception):
    """A malloc that no cached block, release or retry could satisfy within `capacity`."""


class CachingAllocator:
    """The allocator's state: `malloc`, `free` and `empty_cache` as PyTorch's, with its
    statistics in bytes. `replay` drives one; use it directly to interleave releases."""

    def __init__(self, config: AllocatorConfig | None = None) -> None:
        self.config = config or AllocatorConfig()
        self._divisions = self.config.roundup_power2_divisions
        self._round_plain = not any(d > 1 for d in self._divisions)
        self._max_split = self.config.max_split_size
        self._rounding = self.config.max_non_split_rounding
        self._expandable = self.config.expandable_segments
        self._capacity = self.config.capacity
        self._gc = self.config.garbage_collects
        self._pools = (_Pool(small=False), _Pool(small=True))
        self._streams: dict[int, int] = {}
        self._live: dict[int, _Block] = {}
        #: Zero-byte allocations: NativeCachingAllocator::allocate calls malloc only
        #: `if (size != 0)`, so they take no block; their frees are no-ops too.
        self._empty: set[int] = set()
        self._next_ptr = 0
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.segments = 0
        self.device_allocs = 0
        self.alloc_retries = 0
        #: Set by the caller to the event index, so the reserved peak can say when.
        self.clock = -1
        self.peak_reserved_at = -1

    # -- the public calls ---------------------------------------------------------------

    def malloc(self, block_id: int, orig_size: int, stream: int = 0) -> int:
        """Hands out a block for `orig_size` bytes on `stream`; returns its size. Raises
        OutOfMemory where PyTorch raises torch.OutOfMemoryError."""
        if block_id in self._live or block_id in self._empty:
            raise ValueError(f"block {block_id} is already allocated")
        if orig_size <= 0:
            if orig_size < 0:
                raise ValueError(f"block {block_id}: size must not be negative, got {orig_size}")
            self._empty.add(block_id)
            return 0
        rank = self._streams.get(stream)
        if rank is None:
            rank = self._streams[stream] = len(self._streams)
        if self._round_plain:
            size = (
                K_MIN_BLOCK_SIZE
                if orig_size < K_MIN_BLOCK_SIZE
                else (orig_size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE * K_MIN_BLOCK_SIZE
            )
        else:
            size = round_size(orig_size, self._divisions)
        small = size <= K_SMALL_SIZE
        pool = self._pools[small]
        block = self._get_free_block(pool, rank, size)
        if block is None:
            if self._gc:
                self._garbage_collect_cached_blocks()
            alloc_size = allocation_size(size)
            block = self._alloc_block(pool, rank, size, alloc_size)
            if block is None and self._release_available_cached_blocks(pool, rank, size):
                block = self._alloc_block(pool, rank, size, alloc_size)
            if block is None:
                self.release_cached_blocks()
                self.alloc_retries += 1
                block = self._alloc_block(pool, rank, size, alloc_size)
            if block is None:
                raise OutOfMemory(
                    f"block {block_id}: cannot allocate {alloc_size} bytes with "
                    f"{self.reserved} reserved ({self.allocated} allocated) of a "
                    f"capacity of {self._capacity}"
                )
        if self._should_split(block.size, size, small):
            block = self._split(pool, block, size)
        block.allocated = True
        self._live[block_id] = block
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        return block.size

    def free(self, block_id: int) -> None:
        """Frees block `block_id` into its pool's cache (free_block)."""
        block = self._live.pop(block_id, None)
        if block is None:
            if block_id in self._empty:
                self._empty.discard(block_id)
                return
            raise ValueError(f"block {block_id} is freed but not allocated")
        block.allocated = False
        self.allocated -= block.size
        pool = self._pools[block.small]
        self._merge(block, block.prev, pool)
        self._merge(block, block.next, pool)
        self._insert(pool, block)

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache: release_cached_blocks."""
        self.release_cached_blocks()

    def release_cached_blocks(self) -> None:
        """release_cached_blocks: every cached block that is a whole segment goes back to the
        driver (release_blocks, large pool first); in expandable segments every fully free
        page is unmapped, and a segment left with nothing mapped is released."""
        for pool in self._pools:
            to_unmap: list[_Block] = []
            for key in list(pool.keys):
                block = pool.blocks[key]
                if block.segment is not None:
                    to_unmap.append(block)
                elif block.prev is None and block.next is None:
                    self._release_block(pool, block)
            for block in to_unmap:
                self._unmap_block(pool, block)
                if not block.mapped and block.prev is None and block.next is None:
                    self._remove_unmapped(pool, block)
                    self.segments -= 1

    # -- the pools' sorted keys ------------------------------------------------------------

    def _insert(self, pool: _Pool, block: _Block) -> None:
        key = (block.stream << _STREAM_SHIFT) | (block.size << _SIZE_SHIFT) | block.ptr
        block.key = key
        if self._gc:
            block.gc_base = pool.calls  # insert_into_blocks sets gc_count_base
        insort(pool.keys, key)
        pool.blocks[key] = block

    @staticmethod
    def _remove(pool: _Pool, block: _Block) -> None:
        keys = pool.keys
        del keys[bisect_left(keys, block.key)]
        del pool.blocks[block.key]

    @staticmethod
    def _insert_unmapped(pool: _Pool, block: _Block) -> None:
        key = (block.stream << _SIZE_SHIFT) | block.ptr
        block.key = key
        insort(pool.unmapped_keys, key)
        pool.unmapped[key] = block

    @staticmethod
    def _remove_unmapped(pool: _Pool, block: _Block) -> None:
        keys = pool.unmapped_keys
        del keys[bisect_left(keys, block.key)]
        del pool.unmapped[block.key]

    # -- the rules -------------------------------------------------------------------------

    def _should_split(self, block_size: int, size: int, small: bool) -> bool:
        """should_split (controller.allocator.sizes.should_split, inlined for speed)."""
        remaining = block_size - size
        if small or self._expandable:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self._max_split and remaining > K_SMALL_SIZE

    def _get_free_block(self, pool: _Pool, rank: int, size: int) -> _Block | None:
        """get_free_block: lower_bound on (stream, size); the first block of this stream at
        least `size` long, subject to the oversize rules."""
        if self._gc:
            pool.calls += 1
        keys = pool.keys
        index = bisect_left(keys, (rank << _STREAM_SHIFT) | (size << _SIZE_SHIFT))
        if index == len(keys):
            return None
        key = keys[index]
        if key >> _STREAM_SHIFT != rank:
            return None
        block = pool.blocks[key]
        if block.segment is not None:
            # Best fit by the size a block can grow to: a free block at the mapped end of an
            # expandable segment counts the unmapped space after it.
            grown = _expandable_size(block)
            while index + 1 < len(keys) and keys[index + 1] >> _STREAM_SHIFT == rank:
                following = pool.blocks[keys[index + 1]]
                following_grown = _expandable_size(following)
                if following_grown >= grown:
                    break
                index += 1
                block, grown = following, following_grown
        # "Do not return an oversized block for a large request"
        if size < self._max_split and block.size >= self._max_split:
            return None
        # "Allow oversized block size to be rounded up but within a limit"
        if size >= self._max_split and block.size >= size + self._rounding:
            return None
        self._remove(pool, block)
        return block

    def _split(self, pool: _Pool, remaining: _Block, size: int) -> _Block:
        """alloc_found_block with split_remainder: the front `size` bytes are handed out, the
        rest stays cached in the pool."""
        block = _Block(size, remaining.ptr, remaining.stream, remaining.small, remaining.segment)
        block.prev = remaining.prev
        if block.prev is not None:
            block.prev.next = block
        block.next = remaining
        remaining.prev = block
        remaining.ptr += size
        remaining.size -= size
        self._insert(pool, remaining)
        return block

    def _merge(self, dst: _Block, src: _Block | None, pool: _Pool) -> None:
        """try_merge_blocks: `src` (a neighbour, free and mapped alike) joins `dst`."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if src.mapped:
            self._remove(pool, src)
        else:
            self._remove_unmapped(pool, src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    def _grow(self, amount: int) -> None:
        self.reserved += amount
        self.device_allocs += 1
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
            self.peak_reserved_at = self.clock

    def _alloc_block(self, pool: _Pool, rank: int, size: int, alloc_size: int) -> _Block | None:
        """alloc_block: a new segment, or None where it would pass `capacity` (the check is
        on alloc_size even for expandable segments, as in the source)."""
        if self._capacity is not None and self.reserved + alloc_size > self._capacity:
            return None
        if self._expandable:
            return self._try_allocate_expandable_block(pool, rank, size)
        block = _Block(alloc_size, self._next_ptr, rank, pool.small)
        self._next_ptr += alloc_size
        self.segments += 1
        self._grow(alloc_size)
        return block

    def _release_block(self, pool: _Pool, block: _Block) -> None:
        """release_block: cudaFree of a cached whole segment."""
        self._remove(pool, block)
        self.reserved -= block.size
        self.segments -= 1

    def _release_available_cached_blocks(self, pool: _Pool, rank: int, size: int) -> bool:
        """release_available_cached_blocks: with max_split_size set, free the smallest cached
        oversize block of this stream at least max(size, max_split_size) long, or else the
        largest ones until that much is freed. Without max_split_size, nothing."""
        if self._max_split == NO_MAX_SPLIT_SIZE:
            return False
        target = max(size, self._max_split)
        keys = pool.keys
        index = bisect_left(keys, (rank << _STREAM_SHIFT) | (target << _SIZE_SHIFT))
        if index < len(keys) and keys[index] >> _STREAM_SHIFT == rank:
            block = pool.blocks[keys[index]]
            if block.segment is not None or block.is_split():
                return False
            self._release_block(pool, block)
            return True
        released = 0
        index -= 1
        while released < target and index >= 0 and keys[index] >> _STREAM_SHIFT == rank:
            block = pool.blocks[keys[index]]
            if block.size < self._max_split or block.segment is not None or block.is_split():
                break
            released += block.size
            self._release_block(pool, block)
            index -= 1
        return released >= target

    def _garbage_collect_cached_blocks(self) -> None:
        """garbage_collect_cached_blocks: above garbage_collection_threshold x capacity,
        release cached whole large segments whose age (get_free_block calls on the large pool
        since they were cached) is at least the average, pass after pass, until reserved is
        back under the threshold or nothing more can go."""
        assert self._capacity is not None
        threshold = int(self.config.garbage_collection_threshold * self._capacity)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        pool = self._pools[False]

        def freeable() -> list[_Block]:
            return [
                block
                for block in (pool.blocks[key] for key in pool.keys)
                if not block.is_split() and block.segment is None
            ]

        candidates = freeable()
        if not candidates:
            return
        total_age = sum(pool.calls - block.gc_base for block in candidates)
        count = len(candidates)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for block in freeable():
                age = pool.calls - block.gc_base
                if age >= age_threshold:
                    freed = True
                    reclaimed += block.size
                    total_age -= age
                    count -= 1
                    self._release_block(pool, block)

    # -- expandable segments ---------------------------------------------------------------

    def _address_space(self) -> int:
        if self._capacity is None:
            return _DEFAULT_ADDRESS_SPACE
        return self._capacity + self._capacity // 8 + K_LARGE_BUFFER

    def _find_expandable_block(self, pool: _Pool, rank: int, size: int) -> _Block:
        """find_expandable_block: the lowest address of this stream's segments where free and
        unmapped blocks together hold `size`; else a new segment, all unmapped."""
        keys = pool.unmapped_keys
        index = bisect_left(keys, rank << _SIZE_SHIFT)
        while index < len(keys) and keys[index] >> _SIZE_SHIFT == rank:
            candidate = pool.unmapped[keys[index]]
            if candidate.prev is not None and not candidate.prev.allocated:
                candidate = candidate.prev
            room = 0
            walk: _Block | None = candidate
            while room < size and walk is not None and not walk.allocated:
                room += walk.size
                walk = walk.next
            if room >= size:
                return candidate
            index += 1
        page = K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER
        space = self._address_space() // page * page + page
        base = -(-self._next_ptr // page) * page
        self._next_ptr = base + space
        segment = _Segment(base, page, space)
        candidate = _Block(space, base, rank, pool.small, segment, mapped=False)
        self._insert_unmapped(pool, candidate)
        self.segments += 1
        return candidate

    def _map_block(self, pool: _Pool, to_map: _Block, size: int) -> bool:
        """map_block: map whole pages from the start of unmapped `to_map` to cover `size`; the
        rest stays unmapped; the mapped part merges with free neighbours and is cached."""
        segment = to_map.segment
        assert segment is not None
        page = segment.page
        mapped = -(-size // page) * page
        if self._capacity is not None and self.reserved + mapped > self._capacity:
            return False
        self._remove_unmapped(pool, to_map)
        to_map.mapped = True
        if mapped < to_map.size:
            rest = _Block(
                to_map.size - mapped,
                to_map.ptr + mapped,
                to_map.stream,
                to_map.small,
                segment,
                mapped=False,
            )
            rest.prev = to_map
            rest.next = to_map.next
            if rest.next is not None:
                rest.next.prev = rest
            to_map.next = rest
            self._insert_unmapped(pool, rest)
            to_map.size = mapped
        self._merge(to_map, to_map.prev, pool)
        self._merge(to_map, to_map.next, pool)
        self._insert(pool, to_map)
        self._grow(mapped)
        return True

    def _try_allocate_expandable_block(self, pool: _Pool, rank: int, size: int) -> _Block | None:
        """try_allocate_expandable_block: map pages after the lowest free room until one free
        block holds `size` (the rounded request, not a 2 or 20 MiB buffer)."""
        candidate = self._find_expandable_block(pool, rank, size)
        if not candidate.mapped and not self._map_block(pool, candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            following = candidate.next
            assert following is not None
            if not self._map_block(pool, following, min(size - candidate.size, following.size)):
                return None
            candidate = following
        self._remove(pool, candidate)
        return candidate

    def _unmap_block(self, pool: _Pool, block: _Block) -> None:
        """unmap_block: unmap the pages wholly inside cached `block`; the partial pages at its
        ends stay mapped as cached blocks of their own."""
        segment = block.segment
        assert segment is not None
        page = segment.page
        begin = -(-(block.ptr - segment.base) // page)
        end = (block.ptr + block.size - segment.base) // page
        if begin >= end:
            return
        self._remove(pool, block)
        start = segment.base + begin * page
        length = (end - begin) * page
        before = start - block.ptr
        if before > 0:
            head = _Block(before, block.ptr, block.stream, block.small, segment)
            head.prev = block.prev
            if head.prev is not None:
                head.prev.next = head
            head.next = block
            block.prev = head
            self._insert(pool, head)
        after = block.size - before - length
        if after > 0:
            tail = _Block(after, start + length, block.stream, block.small, segment)
            tail.next = block.next
            if tail.next is not None:
                tail.next.prev = tail
            tail.prev = block
            block.next = tail
            self._insert(pool, tail)
        block.ptr = start
        block.size = length
        block.mapped = False
        self._merge(block, block.prev, pool)
        self._merge(block, block.next, pool)
        self._insert_unmapped(pool, block)
        self.reserved -= length


def _expandable_size(block: _Block) -> int:
    following = block.next
    if following is not None and not following.mapped:
        return block.size + following.size
    return block.size


def replay(events: Iterable[Event], config: AllocatorConfig | None = None) -> ReplayResult:
    """Runs `events` through a fresh CachingAllocator; see the module's docstring."""
    allocator = CachingAllocator(config)
    oom_at: int | None = None
    malloc = allocator.malloc
    free = allocator.free
    index = -1
    for index, event in enumerate(events):
        allocator.clock = index
        if event.free:
            free(event.block)
        else:
            try:
                malloc(event.block, event.size, event.stream)
            except OutOfMemory:
                oom_at = index
                break
    return ReplayResult(
        peak_allocated=allocator.peak_allocated,
        peak_reserved=allocator.peak_reserved,
        peak_reserved_at=allocator.peak_reserved_at,
        final_allocated=allocator.allocated,
        final_reserved=allocator.reserved,
        segments=allocator.segments,
        device_allocs=allocator.device_allocs,
        alloc_retries=allocator.alloc_retries,
        oom_at=oom_at,
    )


def replay_live_intervals(
    intervals: Iterable[Interval], config: AllocatorConfig | None = None
) -> ReplayResult:
    """`replay` of the events that (size, born_tick, died_tick or None, stream) lifetimes
    make (controller.allocator.events.events_from_intervals)."""
    return replay(events_from_intervals(intervals), config)
