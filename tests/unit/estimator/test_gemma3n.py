"""Gemma 3n's text model: per-layer inputs, kv-shared layers, LAuReL and AltUp, counted as
transformers builds them and priced by the formula profiles (the calibrated profile's fit is
held to the trace in test_calibrated_hybrid.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from controller.estimator import (
    Checkpointing,
    Method,
    Profile,
    SpecError,
    TrainingSettings,
    calibrated,
    load_shape,
    parse_config,
)
from controller.estimator.presets import load_preset
from controller.estimator.storage import static_bytes
from controller.jobs.profiles import estimate
from tests.unit.trace_support import require_trace_extra

E4B = "gemma-3n-e4b"
# What transformers 5.24 builds from the preset's text_config on the meta device:
#   with torch.device("meta"): AutoModelForCausalLM.from_config(AutoConfig.for_model(**text))
E4B_PARAMS = 6_835_235_568
# PEFT 0.21's all-linear LoRA at rank 16 on that model (trainable parameters, built with
# controller.trace.build.build_model on fake tensors): every nn.Linear but the LM head.
E4B_LORA_16 = 43_871_744
SMALL: dict[str, Any] = {
    "model_type": "gemma3n_text",
    "vocab_size": 512,
    "vocab_size_per_layer_input": 256,
    "hidden_size": 128,
    "hidden_size_per_layer_input": 32,
    "intermediate_size": 256,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "altup_num_inputs": 3,
    "laurel_rank": 16,
    "num_kv_shared_layers": 1,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "max_position_embeddings": 4096,
    "pad_token_id": 0,
}


def test_gemma_3n_e4b_counts_what_transformers_builds() -> None:
    shape = load_shape(E4B)
    assert shape.total_params == E4B_PARAMS
    assert sum(layer.params * n for layer, n in shape.layer_counts) < E4B_PARAMS


def test_each_layer_carries_laurel_altup_and_its_per_layer_input() -> None:
    shape = parse_config(SMALL)
    h, r, n, pli = 128, 16, 3, 32
    first, shared = shape.layers[0], shape.layers[2]
    names = [lin.name for lin in first.linears]
    assert names == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
        "per_layer_input_gate", "per_layer_projection",
        "linear_left", "linear_right", "correction_coefs", "prediction_coefs", "modality_router",
    ]  # fmt: skip
    sizes = {lin.name: (lin.in_features, lin.out_features) for lin in first.linears}
    assert sizes["linear_left"] == (h, r) and sizes["linear_right"] == (r, h)
    assert sizes["correction_coefs"] == (n, n) and sizes["prediction_coefs"] == (n, n * n)
    assert sizes["modality_router"] == (h, n)
    # q/k norms, 4 block norms, post_per_layer_input_norm, post_laurel_norm, AltUp's two
    assert first.other_tensors == (64, 64, h, h, h, h, h, h, h, h)
    # the kv-shared last layer: no k_proj, v_proj or k_norm
    assert "k_proj" not in {lin.name for lin in shared.linears}
    assert shared.other_tensors == (64, h, h, h, h, h, h, h, h)
    outer = [(lin.name, lin.in_features, lin.out_features) for lin in shape.outer_linears]
    assert (
        outer
        == [("per_layer_model_projection", h, 3 * pli)]
        + [("altup_projections", h, h)] * 2
        + [("altup_unembed_projections", h, h)] * 2
    )


def test_lora_is_what_peft_puts_on_every_linear() -> None:
    shape = load_shape(E4B)
    job = TrainingSettings(method=Method.LORA, rank=16)
    assert 16 * shape.lora_params_per_rank(("all-linear",)) == E4B_LORA_16
    assert estimate(shape, job).trainable_params == E4B_LORA_16
    assert static_bytes(shape, job).trainable_params == E4B_LORA_16
    # unsloth's all-linear: the seven projections of its table, k/v only where a layer has
    # them (20 of 35 layers)
    h, q, kv, i = 2048, 2048, 512, 16384
    per_layer = 2 * (h + q) + 3 * (h + i)
    seven = 20 * (per_layer + 2 * (h + kv)) + 15 * per_layer
    unsloth = estimate(shape, replace(job, profile=Profile.UNSLOTH))
    assert unsloth.trainable_params == 16 * seven


def test_analytic_activations_carry_altups_four_streams() -> None:
    shape = load_shape(E4B)
    on = estimate(shape, TrainingSettings(method=Method.LORA))
    assert on.components["activations"] == 35 * 2048 * 2048 * 2 * 4
    off = TrainingSettings(method=Method.LORA, gradient_checkpointing=Checkpointing.OFF)
    assert estimate(shape, off).components["activations"] == 35 * 2048 * 2048 * (34 + 4 * 3)


def test_calibrated_prices_gemma_3n_from_its_own_fit() -> None:
    """Priced by the hybrid section's `gemma3n` fit (layer by layer: sparse, dense and
    kv-shared layers), not read as Llama: more than the analytic profile's activations here."""
    shape = load_shape(E4B)
    job = TrainingSettings(method=Method.LORA, profile=Profile.CALIBRATED)
    est = estimate(shape, job)
    assert est.profile == "calibrated" and est.total_bytes == sum(est.components.values())
    assert est.trainable_params == E4B_LORA_16
    longer = estimate(shape, replace(job, seq_len=8192))
    assert longer.components["activations"] > 3 * est.components["activations"] > 0
    analytic = estimate(shape, replace(job, profile=Profile.ANALYTIC))
    assert est.components["activations"] > 2 * analytic.components["activations"]
    assert calibrated._hybrid_family(shape) == "gemma3n"  # not the default (Llama) fit
    untied = load_preset(E4B).config_dict() | {"tie_word_embeddings": False}
    with pytest.raises(SpecError, match="tie_word_embeddings false") as info:
        estimate(parse_config(untied), job)  # a fit whose samples all tie: refused
    assert info.value.field == "estimator.profile"


def test_activation_sparsity_defaults_as_transformers_does() -> None:
    """Left out, the first ten layers of a model deeper than ten are sparse (Gemma3nTextConfig);
    a shallower one has none."""
    deep = parse_config(SMALL | {"num_hidden_layers": 12, "layer_types": None})
    assert deep.dims.activation_sparsity == (0.95,) * 10 + (0.0,) * 2
    assert parse_config(SMALL).dims.activation_sparsity == (0.0,) * 3
    given = parse_config(SMALL | {"activation_sparsity_pattern": [0.5, 0, 1.0]})
    assert given.dims.activation_sparsity == (0.5, 0.0, 1.0)
    assert parse_config(SMALL).dims.sliding_window == 512


@pytest.mark.parametrize(
    ("value", "field", "message"),
    [
        (0.95, "activation_sparsity_pattern", "must be a list of one number per layer (3)"),
        ([0.95, 0.0], "activation_sparsity_pattern", "must be a list of one number per layer"),
        ([0.95, "0", 0.0], "activation_sparsity_pattern[1]", "must be a number in [0, 1]"),
        ([0.95, 0.0, 1.5], "activation_sparsity_pattern[2]", "must be a number in [0, 1]"),
        ([0.95, 0.0, float("nan")], "activation_sparsity_pattern[2]", "must be a number in"),
        ([True, 0.0, 0.0], "activation_sparsity_pattern[0]", "must be a number in [0, 1]"),
    ],
)
def test_a_malformed_sparsity_pattern_is_one_line_naming_the_entry(
    value: Any, field: str, message: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_config(SMALL | {"activation_sparsity_pattern": value}, prefix="spec.model.config")
    assert info.value.field == f"spec.model.config.{field}"
    assert info.value.message.startswith(message) and "\n" not in str(info.value)


def test_a_deep_gemma_3n_is_traced_whole() -> None:
    """Its layers do not repeat from the first ones (sparse first, kv-shared last, per-layer
    lists transformers checks against the depth): traced whole, never extrapolated."""
    require_trace_extra()
    from controller.trace import TraceUnsupported, trace

    deep = SMALL | {"num_hidden_layers": 12, "layer_types": None, "num_kv_shared_layers": 4}
    job = TrainingSettings(method=Method.LORA, rank=4, seq_len=64)
    assert trace(deep, job).traced_layers == (12,)
    with pytest.raises(TraceUnsupported, match="traced whole"):
        trace(deep, job, 4)


@pytest.mark.parametrize(
    ("change", "field"),
    [({"laurel_rank": "64"}, "laurel_rank"), ({"altup_num_inputs": 0}, "altup_num_inputs")],
)
def test_a_malformed_gemma_3n_field_is_one_line_naming_it(
    change: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_config(SMALL | change, prefix="spec.model.config")
    assert info.value.field == f"spec.model.config.{field}" and "\n" not in str(info.value)


def test_the_trace_builds_what_the_parser_counts() -> None:
    require_trace_extra()
    from controller.trace.run import trace_run

    config = SMALL | {"activation_sparsity_pattern": [0.95, 0.0, 0.0]}
    shape = parse_config(config)
    full = trace_run(config, TrainingSettings(method=Method.FULL, seq_len=64), breakdowns=False)
    assert full.total_params == full.trainable_params == shape.total_params
    lora = trace_run(config, TrainingSettings(method=Method.LORA, rank=4, seq_len=64),
                     breakdowns=False)  # fmt: skip
    assert lora.trainable_params == 4 * shape.lora_params_per_rank(("all-linear",))


def test_qlora_traces_once_altups_clamped_linears_stay_16_bit() -> None:
    """AltUp clamps prediction_coefs' and correction_coefs' weights while training: in 4-bit
    that fails (a packed byte tensor takes no float clamp, bitsandbytes' `Params4bit` neither),
    so the trace refuses it with the fix, and with the two skipped the trace holds what the
    parser counts, the other linears in 4-bit."""
    require_trace_extra()
    from controller.estimator.storage import block, nf4_bytes, static_bytes
    from controller.trace.build import TraceUnsupported
    from controller.trace.run import trace_run

    job = TrainingSettings(method=Method.QLORA, rank=4, seq_len=64)
    with pytest.raises(TraceUnsupported, match="llm_int8_skip_modules"):
        trace_run(SMALL, job, breakdowns=False)
    skipped = SMALL | {
        "quantization_config": {
            "quant_method": "bitsandbytes",
            "load_in_4bit": True,
            "llm_int8_skip_modules": ["prediction_coefs", "correction_coefs"],
        }
    }
    shape = parse_config(skipped)
    result = trace_run(skipped, job)
    static = static_bytes(shape, job)
    assert (
        result.trainable_params
        == static.trainable_params
        == 4 * shape.lora_params_per_rank(("all-linear",))
    )
    assert result.total_params == shape.total_params + result.trainable_params
    # the weights the trace holds are the parser's, the two 16-bit linears included (per
    # layer 9 and 27 elements, a 16-bit block each instead of NF4), plus the model's fp32
    # buffers, one block each: two RoPE tables (inv_freq, original_inv_freq) of 32, and
    # scalars: per_layer_projection_scale, per_layer_input_scale, both embeddings'
    # embed_scale and each layer's altup.router_input_scale
    buffers = 4 * block(32 * 4) + (4 + 3) * block(4)
    assert result.breakdown["weights"] == static.weights + buffers == 687104 + buffers
    unskipped = skipped | {"quantization_config": {"load_in_4bit": True}}
    all_nf4 = static_bytes(parse_config(unskipped), job)  # the skip list ignored
    per_layer = sum(nf4_bytes(n, double_quant=False) - block(n * 2) for n in (3 * 3, 3 * 27))
    assert all_nf4.weights - static.weights == 3 * per_layer == 3 * 2048
