"""A QLoRA job whose trainer prepares the 4-bit model (`Switches.kbit_preparation`) on the
traced model: the parameters PEFT casts, the fp32 residual stream that follows, and the
calibrated profile against it.

The cast bytes are computed here from the model's parameter counts (2 more bytes for each
parameter that is not 4-bit, or for each norm parameter), not read back from the trace."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest

from tests.unit.trace_support import require_trace_extra, with_layers

require_trace_extra()

from controller.estimator import (  # noqa: E402
    KbitPreparation,
    Method,
    Profile,
    Switches,
    TrainingSettings,
    calibrated,
    check_against_model,
    load_preset,
    parse_config,
)
from controller.trace.run import trace_run  # noqa: E402

# Llama 3.2 1B cut to 3 layers: real widths, a tied embedding (cast once), no biases.
CONFIG = with_layers(dict(load_preset("llama-3.2-1b").config), 3)
SHAPE = parse_config(CONFIG)
QLORA = TrainingSettings(
    method=Method.QLORA,
    targets=("q_proj", "v_proj"),
    seq_len=1024,
    batch=2,
    profile=Profile.CALIBRATED,
)
NONE, NORMS, ALL = KbitPreparation
H, LAYERS = CONFIG["hidden_size"], CONFIG["num_hidden_layers"]
NORM_PARAMS = (2 * LAYERS + 1) * H  # two RMSNorms a layer and the final one
NON_QUANTIZED = NORM_PARAMS + CONFIG["vocab_size"] * H  # and the (tied) embedding


def prepared(kind: KbitPreparation) -> TrainingSettings:
    settings, errors = check_against_model(
        SHAPE, replace(QLORA, switches=Switches(kbit_preparation=kind))
    )
    assert not errors
    return settings


@cache
def run(kind: KbitPreparation) -> tuple[int, dict[str, int], dict[str, int]]:
    """The peak, what it holds, and what forward's largest moment (the loss, every
    checkpoint held) holds."""
    result = trace_run(CONFIG, prepared(kind))
    return result.peak, result.breakdown, result.phase_peaks["forward"].breakdown


@pytest.mark.parametrize(("kind", "cast"), [(NORMS, NORM_PARAMS), (ALL, NON_QUANTIZED)])
def test_prepared_weights_are_two_bytes_wider_per_cast_parameter(
    kind: KbitPreparation, cast: int
) -> None:
    _, plain, _ = run(NONE)
    _, upcast, _ = run(kind)
    assert upcast["weights"] - plain["weights"] == 2 * cast


@pytest.mark.parametrize("kind", [NORMS, ALL])
def test_the_residual_stream_runs_in_fp32(kind: KbitPreparation) -> None:
    """Every layer's checkpoint but the first (whose input is the 16-bit embedding's output
    under `upcast-norms`) is fp32 once forward is done: 2 more bytes per token and width."""
    plain_peak, _, plain = run(NONE)
    peak, _, upcast = run(kind)
    checkpoints = (LAYERS - 1) * QLORA.batch * QLORA.seq_len * H * 2
    assert upcast["activations"] - plain["activations"] >= checkpoints
    assert peak - plain_peak >= checkpoints


@pytest.mark.parametrize("kind", list(KbitPreparation))
def test_calibrated_prices_the_preparation_within_two_percent_of_the_trace(
    kind: KbitPreparation,
) -> None:
    peak, _, _ = run(kind)
    priced = calibrated.peak_bytes(SHAPE, prepared(kind))
    assert abs(priced - peak) <= 0.02 * peak
