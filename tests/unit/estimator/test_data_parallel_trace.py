"""The calibrated profile's per-rank figure against the distributed trace, moment by moment.

Qwen2.5-0.5B cut to four layers at 512 tokens (its embedding, 260 MiB, is FSDP2's root: held
unsharded through the step), full fine-tuning with checkpointing, FSDP2 and DDP at 2 and 8
ranks: `calibrated.phase_bytes` within 5 % of `trace_distributed_run`'s phase peaks.
Needs the `trace` extra; a few seconds.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.trace_support import require_trace_extra, with_layers

require_trace_extra()

from controller.estimator import (  # noqa: E402
    Checkpointing,
    Method,
    TrainingSettings,
    calibrated,
    parse_config,
)
from controller.estimator.presets import load_preset  # noqa: E402
from controller.estimator.settings import Parallelism  # noqa: E402
from controller.trace.distributed import Distributed, trace_distributed_run  # noqa: E402

SETTINGS = TrainingSettings(
    method=Method.FULL, rank=None, gradient_checkpointing=Checkpointing.ON, seq_len=512
)


def _config() -> dict[str, Any]:
    return with_layers(dict(load_preset("qwen2.5-0.5b").config), 4)


@pytest.mark.parametrize("parallelism", [Parallelism.FSDP, Parallelism.DDP])
@pytest.mark.parametrize("world", [2, 8])
def test_within_5_percent_of_the_distributed_trace_per_moment(
    parallelism: Parallelism, world: int
) -> None:
    config = _config()
    traced = trace_distributed_run(config, SETTINGS, Distributed(world, parallelism))
    predicted = calibrated.phase_bytes(parse_config(config), SETTINGS, world, parallelism)
    last = max(seg.step for seg in traced.result.segments)  # the steady state
    peaks = {}
    for seg in traced.result.segments:
        if seg.step == last and (seg.phase not in peaks or seg.peak > peaks[seg.phase].peak):
            peaks[seg.phase] = seg
    assert {"backward", "optimizer"} <= set(predicted)
    for phase, held in predicted.items():
        if phase == "forward" and peaks[phase].region != "head":
            assert peaks[phase].peak <= peaks["backward"].peak  # forward's tail
            continue
        truth = peaks[phase].peak
        assert abs(held - truth) <= 0.05 * truth, (phase, held, truth)
