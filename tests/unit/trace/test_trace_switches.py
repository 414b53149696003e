"""The trainer's switches on the traced model, and the calibrated profile against them.

The calibrated fits are of the model's own loss and a separate optimizer step; its prices of
a chunked or fused loss (`calibrated.chunked_logit_bytes`, `_Switched.last_layer_backward`)
and of an optimizer stepped in backward are held here to what the trace of each holds, on
a small model (whose vocabulary makes the logits weigh, for the losses).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest

from tests.unit.trace_support import TINY_LLAMA, require_trace_extra, with_layers

require_trace_extra()

from controller.estimator import (  # noqa: E402
    Loss,
    Method,
    Profile,
    Switches,
    TrainingSettings,
    calibrated,
    check_against_model,
    load_preset,
    parse_config,
)
from controller.estimator.storage import static_bytes  # noqa: E402
from controller.trace.loss import fused_chunk_tokens  # noqa: E402
from controller.trace.run import trace_run  # noqa: E402

WIDE_VOCAB = TINY_LLAMA | {"vocab_size": 32000}
LORA = TrainingSettings(method=Method.LORA, seq_len=512, profile=Profile.CALIBRATED)
FULL = replace(LORA, method=Method.FULL, rank=None)


@cache
def phases(settings: TrainingSettings) -> dict[str, int]:
    return {k: p.peak for k, p in trace_run(WIDE_VOCAB, settings).phase_peaks.items()}


def traced(settings: TrainingSettings) -> int:
    return max(phases(settings).values())


@pytest.mark.parametrize("base", [LORA, FULL], ids=["lora", "full"])
def test_each_loss_holds_less_than_the_one_before(base: TrainingSettings) -> None:
    peaks = [phases(replace(base, switches=Switches(loss=loss)))["backward"] for loss in Loss]
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


def test_an_optimizer_in_backward_never_holds_the_whole_gradients() -> None:
    # Short sequences: the optimizer step decides the plain peak.
    short = replace(FULL, seq_len=64)
    stepped = replace(short, switches=Switches(optimizer_in_backward=True))
    tiny = TINY_LLAMA
    plain = trace_run(tiny, short).phase_peaks
    in_backward = trace_run(tiny, stepped).phase_peaks
    gradients = static_bytes(parse_config(tiny), short).gradients
    assert plain["optimizer"].peak - in_backward["optimizer"].peak >= gradients
    peak = max(p.peak for p in in_backward.values())
    fitted = calibrated.peak_bytes(parse_config(tiny), stepped)
    assert 0.99 <= fitted / peak <= 1.02
    assert fitted < calibrated.peak_bytes(parse_config(tiny), short)


def test_a_fused_loss_prices_the_last_layers_backward_the_fits_did_not_keep() -> None:
    # Qwen2's QLoRA fit has no moment of the last layer's backward (under the plain loss the
    # loss's backward always held more); under a fused loss it decides, and without the
    # moment built for it the price falls under the trace.
    config = with_layers(dict(load_preset("qwen2.5-0.5b").config), 4)
    shape = parse_config(config)
    settings = TrainingSettings(
        method=Method.QLORA, seq_len=1024, switches=Switches(loss=Loss.FUSED)
    )
    settings, _ = check_against_model(shape, settings)
    est = calibrated.estimate(shape, settings)
    assert max(est.moments, key=sum) == est.moments[-1]  # the built moment decides
    peak = max(p.peak for p in trace_run(config, settings).phase_peaks.values())
    assert peak <= calibrated.peak_bytes(shape, settings) <= 1.02 * peak


def test_fused_chunks_are_liger_s() -> None:
    # 4,096 tokens, vocabulary 151,936, hidden 896 (Qwen2.5-0.5B): ceil(V / h) = 170,
    # ceil(4096 / 170) = 25, next power of two 32.
    assert fused_chunk_tokens(4096, 151_936, 896) == 32
    assert fused_chunk_tokens(1, 32_000, 512) == 1
