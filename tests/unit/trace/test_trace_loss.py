"""The chunked and fused losses on the traced model, and the calibrated profile against them.

The calibrated fits are of the model's own loss; its chunked and fused prices
(`calibrated.chunked_logit_bytes`, `_Switched.last_layer_backward`) are held here to what the
trace of each loss holds, on a small model whose vocabulary makes the logits weigh.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest

from tests.unit.trace_support import TINY_LLAMA, require_trace_extra

require_trace_extra()

from controller.estimator import (  # noqa: E402
    Loss,
    Method,
    Profile,
    Switches,
    TrainingSettings,
    calibrated,
    parse_config,
)
from controller.trace.loss import fused_chunk_tokens  # noqa: E402
from controller.trace.run import trace_run  # noqa: E402

WIDE_VOCAB = TINY_LLAMA | {"vocab_size": 32000}
LORA = TrainingSettings(method=Method.LORA, seq_len=1024, profile=Profile.CALIBRATED)
FULL = replace(LORA, method=Method.FULL, rank=None)


@cache
def traced(settings: TrainingSettings) -> int:
    return max(p.peak for p in trace_run(WIDE_VOCAB, settings).phase_peaks.values())


@pytest.mark.parametrize("base", [LORA, FULL], ids=["lora", "full"])
def test_each_loss_holds_less_than_the_one_before(base: TrainingSettings) -> None:
    peaks = [traced(replace(base, switches=Switches(loss=loss))) for loss in Loss]
    plain, chunked, fused = peaks
    assert fused < chunked < plain


@pytest.mark.parametrize("base", [LORA, FULL], ids=["lora", "full"])
@pytest.mark.parametrize("loss", [Loss.CHUNKED, Loss.FUSED])
def test_calibrated_prices_each_loss_as_the_trace_holds_it(
    base: TrainingSettings, loss: Loss
) -> None:
    settings = replace(base, switches=Switches(loss=loss))
    fitted = calibrated.peak_bytes(parse_config(WIDE_VOCAB), settings)
    assert 0.99 <= fitted / traced(settings) <= 1.02  # never under by more than 1 %


def test_fused_chunks_are_liger_s() -> None:
    # 4,096 tokens, vocabulary 151,936, hidden 896 (Qwen2.5-0.5B): ceil(V / h) = 170,
    # ceil(4096 / 170) = 25, next power of two 32.
    assert fused_chunk_tokens(4096, 151_936, 896) == 32
    assert fused_chunk_tokens(1, 32_000, 512) == 1
