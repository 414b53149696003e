"""The allocator replay's input: a sequence of mallocs and frees, each with its stream.

This is the format the trace's storage tracker emits; `replay` reads it. A tracker that keeps
lifetimes instead of events (a size, the tick a storage was born, the tick it died) turns them
into this sequence with `events_from_intervals`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Event:
    """One call into the caching allocator.

    `block` names one allocation, unique in the sequence; its free carries the same `block`
    and `size`. `size` is the bytes the op requested (the storage's nbytes, unrounded: the
    allocator rounds). `stream` is 0 for the compute stream; other integers are side streams
    (FSDP's all-gather and reduce-scatter streams, for instance): the allocator never hands a
    block freed on one stream to another. `free` is False for a malloc, True for its free.
    """

    block: int  # id of one allocation, unique in the sequence
    size: int  # bytes the op requested (unrounded storage nbytes); the same size on its free
    stream: int  # 0 = the compute stream; other ints = side streams
    free: bool  # False: malloc; True: free of that block


#: One storage's life: (size, born_tick, died_tick or None if alive at the end, stream).
Interval = tuple[int, int, int | None, int]


def events_from_intervals(intervals: Iterable[Interval]) -> list[Event]:
    """The mallocs and frees of `intervals`, in tick order; at one tick frees come first.

    Frees first because a storage that dies at tick t and one born at t do not overlap: the
    tracker records a death when the last reference goes, before the next op allocates, so
    the allocator can hand the freed block straight to the newcomer, as it does on a GPU.
    Within one tick the intervals' own order is kept (a stable sort), and block ids are the
    intervals' positions. A storage still alive at the end (died None) is never freed; one
    that dies at the tick it is born is freed after that tick's mallocs.
    """
    keyed: list[tuple[int, int, int, Event]] = []
    for index, (size, born, died, stream) in enumerate(intervals):
        if size < 0:
            raise ValueError(f"interval {index}: size must not be negative, got {size}")
        if died is not None and died < born:
            raise ValueError(f"interval {index}: died at {died}, before it was born at {born}")
        keyed.append((born, 1, index, Event(index, size, stream, free=False)))
        if died is not None:
            phase = 2 if died == born else 0
            keyed.append((died, phase, index, Event(index, size, stream, free=True)))
    keyed.sort(key=lambda item: (item[0], item[1], item[2]))
    return [event for _, _, _, event in keyed]
