"""Hybrid stacks (layers that are not all attention): Nemotron-H, Falcon-H1, Jamba and
Qwen3-Next parsed layer type by layer type and priced by the formula profiles; their fields
on any other model type refused by field."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from controller.estimator import (
    Checkpointing,
    Method,
    Profile,
    SpecError,
    TrainingSettings,
    load_shape,
    parse_config,
)
from controller.estimator.analytic import mixer_bytes_per_token
from controller.estimator.model import canonical_targets
from controller.estimator.module_paths import layer_linear_paths
from controller.estimator.presets import load_preset
from controller.estimator.storage import static_bytes
from controller.jobs.profiles import estimate
from tests.unit.estimator.test_families import _error
from tests.unit.trace_support import require_trace_extra

NANO = "nemotron-nano-9b-v2"
# What transformers 5.24 builds from the preset's config on the meta device (sum of numel):
#   with torch.device("meta"): AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
NANO_PARAMS = 8_888_227_328
TARGETS = ("in_proj", "q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj")
SMALL: dict[str, Any] = {
    "model_type": "nemotron_h",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 100,
    "hybrid_override_pattern": "M-*M",
    "mamba_num_heads": 8,
    "mamba_head_dim": 16,
    "n_groups": 2,
    "ssm_state_size": 8,
    "conv_kernel": 4,
}


# -- weights -------------------------------------------------------------------------------


def test_nemotron_nano_counts_what_transformers_builds() -> None:
    shape = load_shape(NANO)
    assert shape.total_params == NANO_PARAMS
    assert round(shape.total_params / 1e9, 2) == 8.89  # the model page's 8.89B
    counts = {layer.mixer: count for layer, count in shape.layer_counts}
    assert counts == {"mamba2": 27, "mlp": 25, "attention": 4}


def test_each_nemotron_layer_holds_one_mixer_after_one_norm() -> None:
    shape = parse_config(SMALL)
    h, inner, conv_dim = 64, 8 * 16, 8 * 16 + 2 * 2 * 8
    by_mixer = {layer.mixer: layer for layer, _ in shape.layer_counts}
    mamba = by_mixer["mamba2"]
    assert [(lin.name, lin.in_features, lin.out_features, lin.bias) for lin in mamba.linears] == [
        ("in_proj", h, inner + conv_dim + 8, False),  # z, x/B/C, dt per head
        ("out_proj", inner, h, False),
    ]
    # conv1d weight and bias, dt_bias, A_log, D, the gated norm, the block's norm
    assert mamba.other_tensors == (conv_dim * 4, conv_dim, 8, 8, 8, inner, h)
    attention = by_mixer["attention"]
    assert [lin.name for lin in attention.linears] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert not any(lin.bias for lin in attention.linears)  # bias-free whatever the config says
    assert attention.other_tensors == (h,)
    mlp = by_mixer["mlp"]
    assert [(lin.name, lin.in_features, lin.out_features) for lin in mlp.linears] == [
        ("up_proj", h, 96),
        ("down_proj", 96, h),
    ]  # ReLU²: no gate
    assert [layer.mixer for layer in shape.layers] == ["mamba2", "mlp", "attention", "mamba2"]
    assert shape.layers[0] is shape.layers[3]


def test_every_spelling_of_the_layer_list_is_the_same_model() -> None:
    pattern = parse_config(SMALL)
    blocks = {k: v for k, v in SMALL.items() if k != "hybrid_override_pattern"}
    v5 = ["linear_attention", "mlp", "full_attention", "linear_attention"]
    remote = ["mamba", "mlp", "attention", "mamba"]
    for config in (blocks | {"layers_block_type": v5}, blocks | {"layer_types": remote}):
        assert parse_config(config).layers == pattern.layers
    aliases = SMALL | {"mamba_n_groups": 4, "n_groups": 2, "mamba_d_conv": 2}
    ssm = parse_config(aliases).dims.ssm
    assert ssm is not None and (ssm.n_groups, ssm.conv_kernel) == (4, 2)  # mamba_* wins


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"hybrid_override_pattern": "M-E*", "n_routed_experts": 0}, "n_routed_experts",
         "greater than or equal to 1"),
        ({"hybrid_override_pattern": "M-E*", "n_routed_experts": 4, "num_experts_per_tok": 6},
         "num_experts_per_tok", "must not exceed the number of experts (4)"),
        ({"hybrid_override_pattern": "M-E*", "moe_latent_size": 0}, "moe_latent_size",
         "greater than or equal to 1"),
        ({"hybrid_override_pattern": "M-X*"}, "hybrid_override_pattern[2]", "unknown layer type"),
        ({"hybrid_override_pattern": ""}, "hybrid_override_pattern", "non-empty string"),
        ({"hybrid_override_pattern": "M-*", "num_hidden_layers": 4}, "hybrid_override_pattern",
         "one layer type per layer"),
        ({"hybrid_override_pattern": None}, "hybrid_override_pattern", "is required"),
        ({"layers_block_type": ["mamba", "moa"]}, "layers_block_type[1]", "unknown layer type"),
        ({"layers_block_type": "M-*"}, "layers_block_type", "list of layer types"),
        ({"n_groups": 3}, "n_groups", "must divide mamba_num_heads"),
        ({"mamba_head_dim": 0}, "mamba_head_dim", "greater than or equal to 1"),
    ],
)  # fmt: skip
def test_a_malformed_nemotron_config_is_one_line_naming_the_field(
    change: dict[str, Any], field: str, words: str
) -> None:
    error = _error(SMALL | change)
    assert error.field == f"spec.model.config.{field}"
    assert words in error.message


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"attn_layer_period": 8}, "attn_layer_period"),  # not jamba
        ({"full_attention_interval": 4}, "full_attention_interval"),  # not qwen3_next
        ({"linear_num_key_heads": 16}, "linear_num_key_heads"),
        ({"mamba_d_ssm": 3072}, "mamba_d_ssm"),  # not falcon_h1
        ({"hybrid_override_pattern": "M-*-"}, "hybrid_override_pattern"),  # not nemotron_h
    ],
)
def test_hybrids_not_built_yet_stay_refused(change: dict[str, Any], field: str) -> None:
    config = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4}
    error = _error(config | {"intermediate_size": 128, "vocab_size": 100} | change)
    assert error.field == f"spec.model.config.{field}"


def test_nemotron_never_ties_its_lm_head() -> None:
    # NemotronHForCausalLM declares no tied weights: transformers builds an lm_head regardless
    tied = parse_config(SMALL | {"tie_word_embeddings": True})
    assert tied.lm_head_params == 100 * 64 and not tied.dims.tie_word_embeddings


def test_expert_fields_of_a_dense_nemotron_shape_nothing() -> None:
    # transformers' class defaults carry n_routed_experts even where no layer is MoE
    with_defaults = SMALL | {"n_routed_experts": 8, "num_experts_per_tok": 2}
    assert parse_config(with_defaults).layers == parse_config(SMALL).layers


# -- LoRA targets --------------------------------------------------------------------------


@pytest.mark.parametrize("targets", [["all-linear"], ["q_proj", "out_proj"], ["conv1d"]])
def test_lora_targets_peft_refuses_on_mamba_are_refused(targets: list[str]) -> None:
    with pytest.raises(SpecError) as info:
        canonical_targets(targets, load_shape(NANO), "spec.lora.targetModules")
    assert info.value.field == "spec.lora.targetModules"
    assert "PEFT refuses LoRA on out_proj and conv1d" in info.value.message
    assert "in_proj" in info.value.message  # what to write instead


def test_lora_counts_each_layer_types_own_modules() -> None:
    shape = load_shape(NANO)
    h, i, q, kv, p = 4480, 15680, 40 * 128, 8 * 128, 10240 + 12288 + 128
    expected = {
        ("in_proj",): 27 * (h + p),
        ("q_proj", "v_proj"): 4 * ((h + q) + (h + kv)),
        ("down_proj", "up_proj"): 25 * 2 * (h + i),
    }
    for targets, per_rank in expected.items():
        assert shape.lora_params_per_rank(targets) == per_rank
        job = TrainingSettings(method=Method.LORA, rank=8, targets=targets)
        for profile in (Profile.ANALYTIC, Profile.UNSLOTH):
            est = estimate(shape, replace(job, profile=profile))
            assert est.trainable_params == 8 * per_rank


# -- activations and profiles --------------------------------------------------------------


def test_analytic_activations_are_per_mixer_without_checkpointing() -> None:
    shape = load_shape(NANO)
    h, i, q, kv = 4480, 15680, 40 * 128, 8 * 128
    inner, conv, p = 10240, 10240 + 2 * 8 * 128, 10240 + 12288 + 128
    assert mixer_bytes_per_token(shape, "attention") == 4 * h + 4 * q + 4 * kv
    assert mixer_bytes_per_token(shape, "mlp") == 4 * h + 4 * i
    state = 4 * inner * 128 // 128  # fp32 state per chunk of 128 tokens, per token
    assert mixer_bytes_per_token(shape, "mamba2") == 4 * h + 2 * p + 4 * conv + 6 * inner + state
    per_token = sum(
        mixer_bytes_per_token(shape, mixer) * n
        for mixer, n in (("attention", 4), ("mlp", 25), ("mamba2", 27))
    )
    off = TrainingSettings(
        method=Method.LORA, targets=TARGETS, gradient_checkpointing=Checkpointing.OFF
    )
    assert estimate(shape, off).components["activations"] == 2048 * per_token
    on = TrainingSettings(method=Method.LORA, targets=TARGETS)  # one hidden state per layer
    assert estimate(shape, on).components["activations"] == 56 * 2048 * h * 2


def test_unsloth_prices_the_mixers_own_modules() -> None:
    shape = load_shape(NANO)
    est = estimate(
        shape, TrainingSettings(method=Method.LORA, targets=TARGETS, profile=Profile.UNSLOTH)
    )
    # seed 1 counts two norms per layer and no final norm: 56 x 4480 - 4480 more than exact
    assert est.total_params == NANO_PARAMS + 55 * 4480
    assert est.components["weights"] == 2 * est.total_params
    # the formula's (S·B·qkv + S·B·2 + S·B·2·mlp) x 2 x 1.25 of the largest layer (LoRA, gc):
    # the Mamba-2 layer, in_proj's output and the convolution's
    widest = 10240 + 12288 + 128 + 10240 + 2 * 8 * 128
    assert est.components["activations"] == 2048 * (widest + 2) * 2 * 5 // 4


# -- Nemotron 3 (MoE layers) ------------------------------------------------------------------

NANO3 = "nemotron-3-nano-30b-a3b"
# transformers 5.24 on the meta device: 31,577,937,344 parameters; the 23 MoE layers'
# fp32 score-correction biases (buffers of 128) are weights on the GPU, not parameters
NANO3_PARAMS = 31_577_937_344
SMALL_MOE: dict[str, Any] = SMALL | {
    "hybrid_override_pattern": "ME*E",
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 48,
    "moe_shared_expert_intermediate_size": 80,
}


def test_nemotron_3_nano_counts_what_transformers_builds() -> None:
    shape = load_shape(NANO3)
    assert shape.total_params == NANO3_PARAMS
    assert round(shape.total_params / 1e9, 1) == 31.6  # the model card's 31.6B
    counts = {layer.mixer: count for layer, count in shape.layer_counts}
    assert counts == {"mamba2": 23, "moe": 23, "attention": 6}


@pytest.mark.parametrize("latent", [None, 32])
def test_a_nemotron_moe_layer_is_two_expert_stacks_a_router_and_a_shared_expert(
    latent: int | None,
) -> None:
    shape = parse_config(SMALL_MOE | {"moe_latent_size": latent})
    moe = shape.layers[1]
    h, w = 64, latent or 64
    assert moe.mixer == "moe" and moe.moe and shape.layers[3] is moe
    projections = [("fc1_latent_proj", h, w, 1, False), ("fc2_latent_proj", w, h, 1, False)]
    assert [(lin.name, lin.in_features, lin.out_features, lin.copies, lin.expert)
            for lin in moe.linears] == [
        *(projections if latent else []),
        ("up_proj", w, 48, 8, True), ("down_proj", 48, w, 8, True),  # ReLU², no gate
        ("router", h, 8, 1, False),
        ("up_proj", h, 80, 1, False), ("down_proj", 80, h, 1, False),  # the shared expert
    ]  # fmt: skip
    assert moe.other_tensors == (h,)  # the block's norm
    assert moe.fp32_buffers == (8,)  # the score-correction bias: a buffer, no parameter
    assert layer_linear_paths("nemotron_h", shape.dims, moe)[-5:] == (
        "mixer.experts", "mixer.experts", "mixer.gate",
        "mixer.shared_experts.up_proj", "mixer.shared_experts.down_proj",
    )  # fmt: skip


def test_nemotron_moe_activations_and_lora() -> None:
    shape = parse_config(SMALL_MOE | {"moe_latent_size": 32})
    h, e, k, i, s, w = 64, 8, 2, 48, 80, 32
    assert mixer_bytes_per_token(shape, "moe") == (
        8 * h + 4 * e + 4 * s + k * (4 * w + 4 * i) + 2 * w
    )
    # LoRA only on nn.Linear modules (the shared experts' here: "ME*E" has no MLP layer):
    # the expert stacks are 3-D parameters PEFT does not adapt, in every formula profile
    assert shape.lora_params_per_rank(("up_proj", "down_proj")) == 2 * ((h + s) + (s + h))
    for profile in (Profile.ANALYTIC, Profile.UNSLOTH, Profile.CALIBRATED):
        job = TrainingSettings(Method.LORA, rank=4, targets=("up_proj",), profile=profile)
        assert estimate(shape, job).trainable_params == 4 * 2 * (h + s)


def test_the_nemotron_3_trace_trains_what_every_profile_counts() -> None:
    """The trace builds and trains transformers' NemotronHMoE: its full fine-tune trains every
    parameter the parser counts (the routers' correction biases are buffers, counted in
    neither), and LoRA PEFT's adapters, which the formula profiles count too."""
    require_trace_extra()
    from controller.trace.run import trace_run

    config = SMALL_MOE | {"moe_latent_size": 32, "pad_token_id": 0}
    shape = parse_config(config)
    full = trace_run(config, TrainingSettings(method=Method.FULL, seq_len=32), breakdowns=False)
    assert full.trainable_params == shape.total_params
    assert shape.buffer_bytes == 2 * 8 * 4  # two MoE layers' fp32 score-correction biases
    for method in (Method.LORA, Method.QLORA):
        job = TrainingSettings(method=method, rank=4, targets=TARGETS, seq_len=32)
        traced = trace_run(config, job, breakdowns=False).trainable_params
        for profile in (Profile.ANALYTIC, Profile.UNSLOTH):
            assert estimate(shape, replace(job, profile=profile)).trainable_params == traced


@pytest.mark.parametrize("latent", [None, 32])
@pytest.mark.parametrize("method", [Method.FULL, Method.LORA, Method.QLORA], ids=lambda m: m.value)
def test_nemotron_moe_resident_bytes_are_storages_exactly(
    latent: int | None, method: Method
) -> None:
    """What the traced model holds before the step (the fp32 router and its fp32 bias, the
    expert stacks, 4-bit under QLoRA; PEFT's adapters on the shared expert) is what the
    exact static bytes (`storage.py`, the calibrated profile's static part) say."""
    require_trace_extra()
    from tests.unit.trace.test_trace import resident_bytes

    config = SMALL_MOE | {"moe_latent_size": latent, "pad_token_id": 0}
    job = TrainingSettings(
        method=method, rank=None if method is Method.FULL else 16, seq_len=64,
        targets=() if method is Method.FULL else TARGETS,
    )  # fmt: skip
    static = static_bytes(parse_config(config), job)
    assert resident_bytes(config, job) == {
        "weights": static.weights,
        "gradients": static.gradients,
        "trainable": static.trainable_params,
    }


# -- Falcon-H1 ---------------------------------------------------------------------------------

FALCON = "falcon-h1-1.5b"
FALCON_PARAMS = 1_554_789_760  # transformers 5.24 on the meta device, as for Nemotron-H
FALCON_SMALL: dict[str, Any] = {
    "model_type": "falcon_h1",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "mamba_d_ssm": 128,
    "mamba_n_heads": 8,
    "mamba_d_state": 16,
    "mamba_n_groups": 2,
    "mamba_d_conv": 4,
}


def test_falcon_h1_counts_what_transformers_builds() -> None:
    shape = load_shape(FALCON)
    assert shape.total_params == FALCON_PARAMS
    assert round(shape.total_params / 1e9, 2) == 1.55
    assert [(layer.mixer, n) for layer, n in shape.layer_counts] == [("parallel", 24)]


def test_each_falcon_layer_runs_attention_beside_mamba_then_a_gated_mlp() -> None:
    ((layer, _),) = parse_config(FALCON_SMALL).layer_counts
    h, inner, conv_dim, heads = 64, 128, 128 + 2 * 2 * 16, 8
    assert [(lin.name, lin.in_features, lin.out_features) for lin in layer.linears] == [
        ("in_proj", h, inner + conv_dim + heads),
        ("out_proj", inner, h),
        ("q_proj", h, 64), ("k_proj", h, 32), ("v_proj", h, 32), ("o_proj", 64, h),
        ("gate_proj", h, 96), ("up_proj", h, 96), ("down_proj", 96, h),
    ]  # fmt: skip
    # conv1d and its bias, dt_bias, A_log, D; no gated norm (mamba_rms_norm false); 2 norms
    assert layer.other_tensors == (conv_dim * 4, conv_dim, heads, heads, heads, h, h)
    normed = parse_config(FALCON_SMALL | {"mamba_rms_norm": True, "projectors_bias": True})
    ((layer, _),) = normed.layer_counts
    assert inner in layer.other_tensors[:-2]  # the gated norm over the SSM width
    assert [lin.bias for lin in layer.linears[:2]] == [False, True]  # out_proj only


def test_falcon_ssm_width_follows_its_config_class() -> None:
    absent = {k: v for k, v in FALCON_SMALL.items() if k != "mamba_d_ssm"}
    ssm = parse_config(absent).dims.ssm
    assert ssm is not None and (ssm.inner, ssm.head_dim) == (1024, 128)  # the class default
    expanded = parse_config(FALCON_SMALL | {"mamba_d_ssm": None, "mamba_expand": 3}).dims.ssm
    assert expanded is not None and expanded.inner == 192
    tied = parse_config(FALCON_SMALL | {"tie_word_embeddings": True})
    assert tied.lm_head_params == 0  # Falcon-H1 ties where the config says so


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"mamba_d_head": 8}, "mamba_d_head"),  # 8 x 8 heads is not the width 128
        ({"mamba_n_heads": 3}, "mamba_n_heads"),  # does not divide 128
        ({"mamba_n_groups": 3}, "mamba_n_groups"),
        ({"mamba_d_state": "big"}, "mamba_d_state"),
    ],
)
def test_a_malformed_falcon_config_is_one_line_naming_the_field(
    change: dict[str, Any], field: str
) -> None:
    assert _error(FALCON_SMALL | change).field == f"spec.model.config.{field}"


def test_falcon_activations_and_lora_price_all_three_parts() -> None:
    shape = load_shape(FALCON)
    h, i, q, kv = 2048, 4608, 8 * 128, 2 * 128
    inner, conv, p = 3072, 3072 + 2 * 256, 3072 + 3072 + 2 * 256 + 48
    state = 4 * inner * 256 // 128
    scan = 2 * p + 4 * conv + 6 * inner + state
    expected = (4 * h + 4 * q + 4 * kv) + scan + 4 * h + 8 * i
    assert mixer_bytes_per_token(shape, "parallel") == expected
    targets = ("gate_proj", "in_proj", "q_proj")
    per_rank = 24 * ((h + i) + (h + p) + (h + q))
    assert shape.lora_params_per_rank(targets) == per_rank
    job = TrainingSettings(method=Method.LORA, rank=4, targets=targets, profile=Profile.UNSLOTH)
    est = estimate(shape, job)
    assert est.trainable_params == 4 * per_rank
    # seed 1's activations, largest layer, LoRA with checkpointing: qkv + mamba's projections
    assert (
        est.components["activations"] == 2048 * ((q + 2 * kv + p + conv) + 2 + 2 * i) * 2 * 5 // 4
    )
    with pytest.raises(SpecError, match="PEFT refuses LoRA"):
        canonical_targets(["all-linear"], shape, "spec.lora.targetModules")


# -- Jamba ---------------------------------------------------------------------------------

JAMBA = "jamba-v0.1"
JAMBA_PARAMS = 51_570_323_328  # transformers 5.24 on the meta device, as for Nemotron-H
JAMBA_SMALL: dict[str, Any] = {
    "model_type": "jamba",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "attn_layer_period": 2,
    "attn_layer_offset": 1,
    "expert_layer_period": 2,
    "expert_layer_offset": 0,
    "mamba_d_state": 8,
    "vocab_size": 100,
}


def test_jamba_counts_what_transformers_builds() -> None:
    shape = load_shape(JAMBA)
    assert shape.total_params == JAMBA_PARAMS
    assert round(shape.total_params / 1e9, 1) == 51.6
    kinds = {(layer.mixer, layer.moe): n for layer, n in shape.layer_counts}
    assert kinds == {
        ("mamba1_mlp", False): 12,
        ("mamba1_mlp", True): 16,
        ("attention_mlp", False): 4,
    }
    assert [shape.layers[i].mixer for i in (3, 4, 5, 12)] == [
        "mamba1_mlp", "attention_mlp", "mamba1_mlp", "attention_mlp",
    ]  # fmt: skip
    assert [shape.layers[i].moe for i in (0, 1, 2, 3)] == [False, True, False, True]


def test_a_jamba_mamba_layer_is_mamba_1_then_its_mlp_or_moe() -> None:
    shape = parse_config(JAMBA_SMALL)
    mamba_moe = shape.layers[0]  # layer 0: Mamba (0 % 2 != 1), MoE (0 % 2 == 0)
    h, inner, rank, state = 64, 128, 4, 8  # dt_rank "auto": ceil(64 / 16)
    names = [(lin.name, lin.in_features, lin.out_features, lin.bias) for lin in mamba_moe.linears]
    assert names[:4] == [
        ("in_proj", h, 2 * inner, False),
        ("x_proj", inner, rank + 2 * state, False),
        ("dt_proj", rank, inner, True),
        ("out_proj", inner, h, False),
    ]
    assert [lin.name for lin in mamba_moe.linears[4:]] == ["gate_up_proj", "down_proj", "router"]
    # conv1d and its bias, A_log, D, the dt/B/C norms, the two block norms
    assert mamba_moe.other_tensors == (inner * 4, inner, inner * state, inner, rank, 8, 8, h, h)
    attention_dense = shape.layers[1]
    assert attention_dense.mixer == "attention_mlp" and not attention_dense.moe
    assert [lin.name for lin in attention_dense.linears] == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"attn_layer_offset": 2}, "attn_layer_offset"),  # not below the period
        ({"expert_layer_offset": 5, "expert_layer_period": 4}, "expert_layer_offset"),
        ({"attn_layer_period": 0}, "attn_layer_period"),
        ({"mamba_dt_rank": "wide"}, "mamba_dt_rank"),
        ({"moe_layer_stride": 2}, "moe_layer_stride"),  # an expert field it does not know
    ],
)
def test_a_malformed_jamba_config_is_one_line_naming_the_field(
    change: dict[str, Any], field: str
) -> None:
    assert _error(JAMBA_SMALL | change).field == f"spec.model.config.{field}"


def test_jamba_prices_its_mamba_layers_in_every_formula_profile() -> None:
    shape = load_shape(JAMBA)
    h, inner, rank, state = 4096, 8192, 256, 16
    mamba = 4 * h + 14 * inner + 4 * (rank + 2 * state)
    assert mixer_bytes_per_token(shape, "mamba1_mlp") == 21 * h + mamba
    assert mixer_bytes_per_token(shape, "attention_mlp") == 34 * h
    off = TrainingSettings(method=Method.LORA, gradient_checkpointing=Checkpointing.OFF)
    per_token = 4 * 34 * h + 28 * (21 * h + mamba)
    assert estimate(shape, off).components["activations"] == 2048 * per_token
    # PEFT's all-linear puts LoRA on the four Mamba linears of each of the 28 Mamba layers
    mamba_lora = (h + 2 * inner) + (inner + rank + 2 * state) + (rank + inner) + (inner + h)
    targets = ("dt_proj", "in_proj", "out_proj", "x_proj")
    assert shape.lora_params_per_rank(targets) == 28 * mamba_lora
    unsloth = TrainingSettings(method=Method.LORA, rank=2, targets=targets, profile=Profile.UNSLOTH)
    assert estimate(shape, unsloth).trainable_params == 2 * 28 * mamba_lora
    q_only = replace(unsloth, targets=("q_proj",))  # attention in 4 layers only
    assert estimate(shape, q_only).trainable_params == 2 * 4 * (h + h)
    # calibrated: its own fit (tests/unit/estimator/test_calibrated_hybrid.py)
    fitted = estimate(shape, replace(unsloth, profile=Profile.CALIBRATED))
    assert fitted.profile == "calibrated" and fitted.components["activations"] > 0


def test_the_jamba_trace_builds_what_the_parser_counts() -> None:
    """Two layers at 16 tokens: Jamba's Mamba runs token by token on CPU (no fused scan), so
    a trace of the real model at thousands of tokens takes far too long to test."""
    require_trace_extra()
    from controller.trace.run import trace_run

    config = JAMBA_SMALL | {"num_hidden_layers": 2, "pad_token_id": 0}
    shape = parse_config(config)
    targets = ("in_proj", "x_proj", "dt_proj", "out_proj", "q_proj", "gate_proj")
    for method in (Method.LORA, Method.QLORA):  # QLoRA: dt_proj called as a module
        job = TrainingSettings(method=method, rank=4, targets=targets, seq_len=16)
        result = trace_run(config, job, breakdowns=False)
        assert result.trainable_params == 4 * shape.lora_params_per_rank(targets)
        assert result.total_params == shape.total_params + result.trainable_params


# -- Qwen3-Next ------------------------------------------------------------------------------

NEXT = "qwen3-next-80b-a3b"
NEXT_PARAMS = 79_674_391_296  # transformers 5.24 on the meta device, as for Nemotron-H
NEXT_SMALL: dict[str, Any] = {
    "model_type": "qwen3_next",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "vocab_size": 100,
    "full_attention_interval": 2,
}


def test_qwen3_next_counts_what_transformers_builds() -> None:
    shape = load_shape(NEXT)
    assert shape.total_params == NEXT_PARAMS
    assert abs(shape.total_params - 80 * 10**9) < 10**9  # Qwen's 80B
    kinds = {(layer.mixer, layer.moe): n for layer, n in shape.layer_counts}
    assert kinds == {("deltanet_mlp", True): 36, ("attention_mlp", True): 12}
    assert [shape.layers[i].mixer for i in (2, 3, 4)] == [
        "deltanet_mlp", "attention_mlp", "deltanet_mlp",
    ]  # fmt: skip


def test_a_qwen3_next_layer_is_gated_deltanet_or_gated_attention() -> None:
    shape = parse_config(NEXT_SMALL)
    linear, full = shape.layers[0], shape.layers[1]
    h, key, value, v_heads = 64, 2 * 8, 4 * 16, 4
    assert [(lin.name, lin.in_features, lin.out_features) for lin in linear.linears[:3]] == [
        ("in_proj_qkvz", h, 2 * key + 2 * value),
        ("in_proj_ba", h, 2 * v_heads),
        ("out_proj", value, h),
    ]
    conv = (2 * key + value) * 4
    assert linear.other_tensors[:4] == (conv, v_heads, v_heads, 16)  # conv, dt_bias, A_log, norm
    q_proj = full.linears[0]
    assert (q_proj.name, q_proj.out_features) == ("q_proj", 2 * 4 * 16)  # q and its gate
    assert full.linears[3].in_features == 4 * 16  # o_proj reads q's width
    moe = [lin.name for lin in linear.linears[3:]]
    assert moe == ["gate_up_proj", "down_proj", "router",
                   "gate_proj", "up_proj", "down_proj", "shared_expert_gate"]  # fmt: skip
    types = ["full_attention", "linear_attention", "linear_attention", "full_attention"]
    listed = parse_config(NEXT_SMALL | {"layer_types": types})
    assert [layer.mixer for layer in listed.layers] == [
        "attention_mlp", "deltanet_mlp", "deltanet_mlp", "attention_mlp",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"layer_types": ["linear_attention"] * 3}, "layer_types"),
        ({"layer_types": ["linear_attention", "mamba", "x", "y"]}, "layer_types[1]"),
        ({"linear_num_value_heads": 3}, "linear_num_value_heads"),
        ({"full_attention_interval": 0}, "full_attention_interval"),
        ({"linear_key_head_dim": -8}, "linear_key_head_dim"),
    ],
)
def test_a_malformed_qwen3_next_config_is_one_line_naming_the_field(
    change: dict[str, Any], field: str
) -> None:
    assert _error(NEXT_SMALL | change).field == f"spec.model.config.{field}"


def test_qwen3_next_prices_its_linear_attention_layers() -> None:
    shape = load_shape(NEXT)
    h, key, value, v_heads = 2048, 16 * 128, 32 * 128, 32
    state = 4 * 32 * 128 * 128 // 64
    net = 4 * h + 4 * (key + value) + 4 * v_heads + 4 * (2 * key + value) + 4 * key + 4 * value
    assert mixer_bytes_per_token(shape, "deltanet_mlp") == 21 * h + net + state
    net_lora = (h + 2 * key + 2 * value) + (h + 2 * v_heads) + (value + h)
    targets = ("in_proj_ba", "in_proj_qkvz", "out_proj")
    assert shape.lora_params_per_rank(targets) == 36 * net_lora
    job = TrainingSettings(method=Method.LORA, rank=2, targets=targets, profile=Profile.UNSLOTH)
    assert estimate(shape, job).trainable_params == 2 * 36 * net_lora
    q_only = estimate(shape, replace(job, targets=("q_proj",)))
    assert q_only.trainable_params == 2 * 12 * (h + 2 * 16 * 256)  # 12 attention layers
    calibrated = estimate(shape, replace(job, profile=Profile.CALIBRATED))
    assert calibrated.trainable_params == 2 * 36 * net_lora


def test_the_qwen3_next_trace_builds_what_the_parser_counts() -> None:
    require_trace_extra()
    from controller.trace.run import trace_run

    config = NEXT_SMALL | {"num_hidden_layers": 2, "pad_token_id": 0}
    shape = parse_config(config)
    full = trace_run(config, TrainingSettings(method=Method.FULL, seq_len=64), breakdowns=False)
    assert full.total_params == full.trainable_params == shape.total_params
    targets = ("in_proj_qkvz", "in_proj_ba", "out_proj", "q_proj", "v_proj")
    for method in (Method.LORA, Method.QLORA):
        job = TrainingSettings(method=method, rank=4, targets=targets, seq_len=64)
        result = trace_run(config, job, breakdowns=False)
        assert result.trainable_params == 4 * shape.lora_params_per_rank(targets)


# -- trace -----------------------------------------------------------------------------------


def _shrunk(family: str) -> dict[str, Any]:
    from controller.calibration.calibrate import shrunk_hybrid

    return shrunk_hybrid(family, random.Random(f"test/{family}"), "M*-")


@pytest.mark.parametrize("family", ["nemotron_h", "falcon_h1"])
@pytest.mark.parametrize("method", [Method.FULL, Method.LORA, Method.QLORA])
def test_the_trace_builds_what_the_parser_counts(family: str, method: Method) -> None:
    require_trace_extra()
    from controller.trace.run import trace_run

    config = _shrunk(family)
    targets = ("all-linear",) if method is Method.FULL else TARGETS
    job = TrainingSettings(method=method, rank=None if method is Method.FULL else 8,
                           targets=targets, seq_len=256)  # fmt: skip
    result = trace_run(config, job, breakdowns=False)
    shape = parse_config(config)
    assert result.total_params == shape.total_params + (
        0 if method is Method.FULL else 8 * shape.lora_params_per_rank(TARGETS)
    )
    expected = (
        shape.total_params if method is Method.FULL else 8 * shape.lora_params_per_rank(TARGETS)
    )
    assert result.trainable_params == expected


def test_a_hybrid_is_traced_whole() -> None:
    require_trace_extra()
    from controller.trace import TraceUnsupported, trace

    with pytest.raises(TraceUnsupported, match="traced whole"):
        trace(load_preset(NANO).config, TrainingSettings(method=Method.LORA, targets=TARGETS), 4)
