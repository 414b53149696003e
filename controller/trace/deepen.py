"""The step's allocations at a depth that was not traced, for the allocator replay.

A deep model is traced at n and n + period layers and every figure is extended affinely
(`extrapolate.py`). The caching allocator's reserve is not such a figure: it is what the
blocks cached so far cannot serve, and it rises and falls with the depth. SmolLM3-3B, full
fine-tuning, 2,048 tokens, reserved minus allocated: 2,166 MiB at 4 layers, 2,471 at 5, 3,111
at 8, 3,216 at 16, 2,505 at its own 36 (the affine rule read 12,504 from 4 and 5); Granite-3.3-8B
LoRA: 912 at 4 and 5, 1,005 at 12, 1,372 at its 40 (the rule read 912). Only a replay of the
deep step's own mallocs and frees gives the deep step's reserve.

That sequence is built from the deeper run: its repeating block of layers (the `period`
layers from index lead + 2, a middle of the stack) is copied in after itself as many more
times as the depth needs. Where a storage was born decides its copies:

* in the block's forward or backward (a span of the run: the segments of those layers, one
  per step and micro-batch) it is copied with the span, and where it dies follows: in the
  same span, at the same tick of the same copy; in the span of the other direction (a
  forward's saved activation freed in backward), in the mirrored copy, since backward runs
  the layers in reverse; in the block after a span (a layer's output read by the next layer,
  FSDP's prefetched parameters), in the next copy, the last copy's where the original died;
* in the setup or the optimizer step, it is copied when it belongs to the block's layers:
  the births the deeper run has beyond the shallower one's in that phase (its weights,
  optimizer states and scratch, found by aligning the two runs' sizes), each copy freed with
  its original;
* anywhere else it is left as it is.

The built sequence replays to the extended peak of allocated bytes (checked: a sequence that
does not is not used) and its reserved peak is the deep step's.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from controller.allocator.events import Interval

#: (step, phase, region, first tick, last tick) of one segment of a run: its events' ticks
#: are first + 1 .. last (a segment starts at the clock's value when it was entered).
SegmentSpan = tuple[int, str, str, int, int]

#: Where a tick sits in the built sequence: (anchor tick, copy, tick). The run's own ticks
#: are (t, 0, 0); copy k >= 1 of tick t of a span ending at e is (e - 1, k, t): after the
#: original span's last tick, before the tick that follows it.
Key = tuple[int, int, int]

_LAYERED = ("forward", "backward")
_ALIGNED = ("setup", "optimizer")


@dataclass(frozen=True, slots=True)
class Timeline:
    """A run's storages as an allocator replay reads them, and its segments."""

    intervals: tuple[Interval, ...]
    segments: tuple[SegmentSpan, ...]


@dataclass(frozen=True, slots=True)
class _Span:
    """Ticks start .. end - 1 of the run, copied with the block."""

    start: int
    end: int
    phase: str

    @property
    def layered(self) -> bool:
        return self.phase in _LAYERED


def _layer(region: str) -> int | None:
    if not region.startswith("layer "):
        return None
    head = region[6:].split("/", 1)[0].split("#", 1)[0]
    return int(head) if head.isdigit() else None


def _layer_spans(segments: Sequence[SegmentSpan], block: range) -> list[_Span]:
    """Maximal runs of consecutive segments of one step and phase inside the block."""
    spans: list[_Span] = []
    run: list[SegmentSpan] = []

    def close() -> None:
        if run:
            spans.append(_Span(run[0][3] + 1, run[-1][4] + 1, run[0][1]))
            run.clear()

    for seg in segments:
        step, phase, region = seg[0], seg[1], seg[2]
        layer = _layer(region)
        inside = phase in _LAYERED and layer is not None and layer in block
        if inside and run and (run[-1][0], run[-1][1]) != (step, phase):
            close()
        if inside:
            run.append(seg)
        else:
            close()
    close()
    return spans


def _groups(segments: Sequence[SegmentSpan]) -> list[tuple[int, str, int, int]]:
    """(step, phase, first tick, end tick) of each run of setup or optimizer segments."""
    out: list[tuple[int, str, int, int]] = []
    for step, phase, _, first, last in segments:
        if phase not in _ALIGNED:
            continue
        if out and out[-1][:2] == (step, phase) and out[-1][3] == first + 1:
            out[-1] = (step, phase, out[-1][2], last + 1)
        else:
            out.append((step, phase, first + 1, last + 1))
    return out


def _births(intervals: Sequence[Interval], start: int, end: int) -> list[Interval]:
    return sorted((iv for iv in intervals if start <= iv[1] < end), key=lambda iv: iv[1])


def _aligned_spans(large: Timeline, small: Timeline) -> list[_Span] | None:
    """The births the deeper run has beyond the shallower one's, per setup or optimizer
    phase; None where the two do not differ by insertions alone."""
    big, little = _groups(large.segments), _groups(small.segments)
    if [g[:2] for g in big] != [g[:2] for g in little]:
        return None
    spans: list[_Span] = []
    for (_, phase, start, end), (_, _, s_start, s_end) in zip(big, little, strict=True):
        b = _births(large.intervals, start, end)
        a = _births(small.intervals, s_start, s_end)
        matcher = SequenceMatcher(
            None, [(iv[0], iv[3]) for iv in a], [(iv[0], iv[3]) for iv in b], autojunk=False
        )
        for tag, _, _, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                continue
            if tag != "insert":
                return None
            spans.append(_Span(b[j1][1], b[j2 - 1][1] + 1, phase))
    return spans


def deepen(large: Timeline, small: Timeline, block: range, copies: int) -> list[Interval] | None:
    """The deeper run's storages with `copies` more copies of the layers in `block` (indices
    of the deeper run); None where the runs' segments do not show the block."""
    layered = _layer_spans(large.segments, block)
    aligned = _aligned_spans(large, small)
    if not layered or aligned is None:
        return None
    return _Builder(layered + aligned, copies).build(large.intervals)


def live_peak(intervals: Sequence[Interval]) -> int:
    """The most bytes live at once, each storage at the allocator's 512-byte block, as the
    storage tracker counts its peak: what the built sequence is checked against."""
    changes: dict[int, int] = {}
    for size, born, died, _ in intervals:
        nbytes = -(-size // 512) * 512
        changes[born] = changes.get(born, 0) + nbytes
        if died is not None:
            changes[died] = changes.get(died, 0) - nbytes
    live = peak = 0
    for tick in sorted(changes):
        live += changes[tick]
        peak = max(peak, live)
    return peak


class _Builder:
    """Places each copy of each storage of the run; see the module docstring."""

    def __init__(self, spans: list[_Span], copies: int) -> None:
        self.spans = sorted(spans, key=lambda s: s.start)
        self.starts = [s.start for s in self.spans]
        self.copies = copies

    def build(self, intervals: Sequence[Interval]) -> list[Interval]:
        # A copied storage whose death no span places (a gradient freed by zero_grad, the
        # optimizer's scratch at the end of its op) dies beside its original: the copies of a
        # run of such deaths follow the run, or precede it where the run frees in the reverse
        # order of the births (a stack, as foreach scratch is freed).
        loose: dict[int, int] = {}
        for _, born, died, _ in intervals:
            span = self._inside(born)
            if span is not None and died is not None and self._death(span, 0, died) is None:
                loose[died] = born
        runs = _runs(loose, intervals)
        built: list[tuple[int, Key, Key | None, int]] = []
        for size, born, died, stream in intervals:
            span = self._inside(born)
            if span is None:
                built.append((size, (born, 0, 0), self._uncopied_death(born, died), stream))
                continue
            for copy in range(self.copies + 1):
                end: Key | None = None
                if died is not None:
                    end = self._death(span, copy, died)
                    if end is None:
                        end = _beside(runs[died], copy, died)
                built.append((size, self._key(span, copy, born), end, stream))
        order = sorted({k for _, b, d, _ in built for k in (b, d) if k is not None})
        rank = {k: i for i, k in enumerate(order)}
        return [(s, rank[b], None if d is None else rank[d], st) for s, b, d, st in built]

    def _inside(self, tick: int) -> _Span | None:
        i = bisect_right(self.starts, tick) - 1
        return self.spans[i] if i >= 0 and tick < self.spans[i].end else None

    def _near(self, tick: int) -> tuple[_Span, int] | None:
        """The layered span whose neighbouring block holds `tick`: (span, +1) for the block
        after it, (span, -1) for the one before."""
        i = bisect_right(self.starts, tick) - 1
        for j in (i, i + 1):
            if 0 <= j < len(self.spans) and self.spans[j].layered:
                span = self.spans[j]
                length = span.end - span.start
                if span.end <= tick < span.end + length:
                    return span, 1
                if span.start - length <= tick < span.start:
                    return span, -1
        return None

    def _key(self, span: _Span, copy: int, tick: int) -> Key:
        return (tick, 0, 0) if copy == 0 else (span.end - 1, copy, tick)

    def _uncopied_death(self, born: int, died: int | None) -> Key | None:
        """A storage made before the block's forward and freed in its backward (the block's
        input, saved for it) is freed by the backward of the first copy forward ran: the
        last that backward runs."""
        if died is None:
            return None
        where = self._inside(died)
        if where is not None and where.phase == "backward":
            i = self.spans.index(where)
            forward = next((s for s in reversed(self.spans[:i]) if s.phase == "forward"), None)
            if forward is not None and born < forward.start:
                return self._key(where, self.copies, died)
        return (died, 0, 0)

    def _death(self, span: _Span, copy: int, died: int) -> Key | None:
        """Where copy `copy` of a storage born in `span` dies, when a span places it."""
        if died < span.end:  # freed inside its own span: in its own copy
            return self._key(span, copy, died)
        if not span.layered:
            return None
        where = self._inside(died)
        side = 0
        if where is None:
            near = self._near(died)
            if near is None:
                return None
            where, side = near
        if not where.layered:
            return None
        # backward runs the layers in reverse: forward's copy k is backward's copies - k
        mirrored = (span.phase, where.phase) == ("forward", "backward")
        position = (self.copies - copy if mirrored else copy) + side
        if side == 0:
            return self._key(where, position, died)
        if not 0 <= position <= self.copies:
            return (died, 0, 0)  # the first or last copy: where the original died
        length = where.end - where.start
        return self._key(where, position, died - side * length)


def _runs(loose: dict[int, int], intervals: Sequence[Interval]) -> dict[int, tuple[int, bool]]:
    """For each loose death tick: the tick its copies are placed beside (the run's last, or
    its first where the run frees as a stack) and whether they go before it."""
    busy = {born for _, born, _, _ in intervals} | {d for _, _, d, _ in intervals if d is not None}
    out: dict[int, tuple[int, bool]] = {}
    ticks = sorted(loose)
    i = 0
    while i < len(ticks):
        j = i
        while j + 1 < len(ticks) and all(
            t in loose or t not in busy for t in range(ticks[j] + 1, ticks[j + 1])
        ):
            j += 1
        run = ticks[i : j + 1]
        births = [loose[t] for t in run]
        stack = len(run) > 1 and births == sorted(births, reverse=True)
        for t in run:
            out[t] = (run[0], True) if stack else (run[-1], False)
        i = j + 1
    return out


def _beside(run: tuple[int, bool], copy: int, died: int) -> Key:
    if copy == 0:
        return (died, 0, 0)
    anchor, before = run
    return (anchor, -copy, died) if before else (anchor, copy, died)
