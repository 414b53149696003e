"""The allocator replay at a depth that was not traced (`controller.trace.deepen`).

The reserve is not affine in the depth, so an extended trace replays the deeper run with its
middle block copied in. Where every layer is alike, that sequence is the whole run's, malloc
for malloc and free for free; the tests hold it to that, and to the whole run's reserve.
"""

from __future__ import annotations

import functools

import pytest

from tests.unit.trace_support import TINY_LLAMA, require_trace_extra, with_layers

require_trace_extra()

from controller.allocator.events import events_from_intervals  # noqa: E402
from controller.estimator import Method, Parallelism, TrainingSettings  # noqa: E402
from controller.trace.deepen import Timeline, deepen, live_peak  # noqa: E402
from controller.trace.distributed import Distributed, trace_distributed_run  # noqa: E402
from controller.trace.extrapolate import extend  # noqa: E402
from controller.trace.run import RunResult, trace_run  # noqa: E402

FULL = TrainingSettings(method=Method.FULL, rank=None, seq_len=128)
DEPTH = 9

CASES = {
    "full": (FULL, None),
    "lora, gradient accumulation": (
        TrainingSettings(method=Method.LORA, seq_len=128, gradient_accumulation=4),
        None,
    ),
    "fsdp2 on 4": (FULL, Distributed(4)),
}


@functools.cache
def _run(settings: TrainingSettings, distributed: Distributed | None, layers: int) -> RunResult:
    config = with_layers(TINY_LLAMA, layers)
    if distributed is None:
        return trace_run(config, settings)
    return trace_distributed_run(config, settings, distributed).result


def _events(intervals: list[tuple[int, int, int | None, int]]) -> list[tuple[int, bool, int]]:
    return [(e.size, e.free, e.stream) for e in events_from_intervals(intervals)]


@pytest.mark.parametrize("case", list(CASES))
def test_the_built_sequence_is_the_whole_runs(case: str) -> None:
    settings, distributed = CASES[case]
    small, large, whole = (_run(settings, distributed, n) for n in (4, 5, DEPTH))
    assert small.timeline and large.timeline and whole.timeline
    built = deepen(large.timeline, small.timeline, range(2, 3), DEPTH - 5)
    assert built is not None
    assert _events(built) == _events(list(whole.timeline.intervals))
    assert live_peak(built) == whole.peak
    extended = extend(small, large, DEPTH)
    assert extended.reserved - extended.peak == whole.reserved - whole.peak


def test_the_reserve_is_not_extended_affinely() -> None:
    """The gap moves with the depth by more than a rule per layer reads: at 4, 5 and 9
    layers of this model it is not on one line, and the extended run has the 9-layer one."""
    small, large, whole = (_run(FULL, None, n) for n in (4, 5, DEPTH))
    gaps = [r.reserved - r.peak for r in (small, large, whole)]
    affine = gaps[0] + (DEPTH - 4) * (gaps[1] - gaps[0])
    assert affine != gaps[2]
    assert extend(small, large, DEPTH).reserved - whole.peak == gaps[2]


def test_without_a_sequence_to_build_the_deeper_runs_own_gap_stays() -> None:
    """DDP's gradient bucket grows with the model (a resize, not one more layer's births):
    no sequence is built, and the deeper run's own gap stands in, not its affine
    extension."""
    ddp = Distributed(2, Parallelism.DDP)
    small, large = (_run(FULL, ddp, n) for n in (4, 5))
    assert small.timeline and large.timeline
    assert deepen(large.timeline, small.timeline, range(2, 3), 4) is None
    extended = extend(small, large, DEPTH)
    assert extended.reserved - extended.peak == large.reserved - large.peak


def test_a_run_without_its_block_builds_nothing() -> None:
    timeline = Timeline(
        intervals=((1024, 1, None, 0), (2048, 2, 3, 0)),
        segments=((-1, "setup", "setup", 0, 1), (0, "forward", "head", 1, 3)),
    )
    assert deepen(timeline, timeline, range(2, 3), 3) is None


def test_live_peak_counts_blocks_of_512_bytes() -> None:
    # two storages of 1 and 600 bytes live together: one block and two
    assert live_peak([(1, 1, 3, 0), (600, 2, 4, 0), (10_000, 5, None, 0)]) == 10_240
    assert live_peak([(1, 1, 3, 0), (600, 2, 4, 0)]) == 512 + 1024


def test_a_period_without_a_whole_period_beside_its_block_keeps_the_deeper_runs_gap() -> None:
    """Layers in a period of 3 traced at 4 and 7: the block's copies would have no whole
    period of layers before them (the embedding's ticks instead), so nothing is built."""
    small, large = (_run(FULL, None, n) for n in (4, 7))
    extended = extend(small, large, 10, period=3)
    assert extended.reserved - extended.peak == large.reserved - large.peak
