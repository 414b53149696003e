"""Model families beyond the Llama layout: parsed as what they are, or refused by field."""

from __future__ import annotations

from typing import Any

import pytest

from controller.estimator import SpecError, parse_config

BASE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "vocab_size": 100,
}
DBRX_SMALL: dict[str, Any] = {
    "model_type": "dbrx",
    "d_model": 64,
    "n_heads": 4,
    "n_layers": 2,
    "vocab_size": 100,
    "max_seq_len": 4096,
    "attn_config": {"kv_n_heads": 2, "clip_qkv": 8, "rope_theta": 500000},
    "ffn_config": {
        "ffn_hidden_size": 96,
        "moe_num_experts": 4,
        "moe_top_k": 2,
        "moe_jitter_eps": 0,
        "moe_loss_weight": 0.05,
    },
}


def _error(config: dict[str, Any]) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_config(config, prefix="spec.model.config")
    assert "\n" not in str(info.value)
    return info.value


def test_dbrx_is_read_as_the_mixture_of_experts_it_is() -> None:
    shape = parse_config(DBRX_SMALL)
    d = shape.dims
    assert (d.num_experts, d.experts_per_token, d.moe_intermediate_size) == (4, 2, 96)
    assert (d.hidden_size, d.num_layers, d.num_heads, d.num_kv_heads) == (64, 2, 4, 2)
    assert all(layer.moe for layer in shape.layers)
    assert shape.max_position_embeddings == 4096
    # Fused Wqkv (64 -> 64 + 2 x 32), out_proj, 4 experts x 3 x 64 x 96, router, 2 norms.
    layer = 64 * 128 + 64 * 64 + 4 * 3 * 64 * 96 + 64 * 4 + 2 * 64
    assert shape.total_params == 2 * layer + 2 * 100 * 64 + 64


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_local_experts": 4, "num_expert_slots": 8}, "spec.model.config.num_expert_slots"),
        ({"moe_num_routed": 8}, "spec.model.config.moe_num_routed"),
        (
            {"ffn_config": {"moe_experts_total": 16}},
            "spec.model.config.ffn_config.moe_experts_total",
        ),
        ({"moe_layer_pattern": [0, 1, 1]}, "spec.model.config.moe_layer_pattern"),
    ],
)
def test_an_expert_field_not_understood_is_an_error_naming_it(
    change: dict[str, Any], field: str
) -> None:
    error = _error(BASE | change)
    assert error.field == field
    assert "does not understand" in error.message and "num_local_experts" in error.message


def test_expert_hyperparameters_change_nothing_and_are_accepted() -> None:
    moe = BASE | {"num_local_experts": 4, "num_experts_per_tok": 2}
    quiet = moe | {
        "router_aux_loss_coef": 0.01,
        "moe_jitter_eps": 0.01,
        "moe_capacity": [64, 64, 64],
        "output_router_logits": False,
        "moe_gate": "topk",
        "moe_use_aux_free": True,
        "ep_size": 1,
    }
    assert parse_config(quiet).total_params == parse_config(moe).total_params


def test_an_unknown_layer_type_is_an_error_naming_the_entry() -> None:
    types = ["full_attention", "sliding_attention", "recurrent_block", "full_attention"]
    error = _error(BASE | {"layer_types": types})
    assert error.field == "spec.model.config.layer_types[2]"
    assert "unknown layer type 'recurrent_block'; allowed: full_attention" in error.message


def test_llama4_moe_layers_and_interleaving() -> None:
    moe = BASE | {"num_local_experts": 4, "num_experts_per_tok": 1}
    listed = parse_config(moe | {"moe_layers": [1, 3]})
    assert [layer.moe for layer in listed.layers] == [False, True, False, True]
    step = parse_config(moe | {"interleave_moe_layer_step": 2})
    assert [layer.moe for layer in step.layers] == [False, True, False, True]
    error = _error(moe | {"moe_layers": [4]})
    assert error.field.endswith("moe_layers") and "[0, 4)" in error.message


def test_ernie_start_interval_and_end() -> None:
    moe = BASE | {"moe_num_experts": 4, "moe_k": 2, "num_hidden_layers": 6}
    start = parse_config(moe | {"moe_layer_start_index": 1, "moe_layer_interval": 1})
    assert [layer.moe for layer in start.layers] == [False, True, True, True, True, True]
    assert start.dims.experts_per_token == 2
    every_other = moe | {"moe_layer_start_index": 0, "moe_layer_interval": 2}
    bounded = parse_config(every_other | {"moe_layer_end_index": 3})
    assert [layer.moe for layer in bounded.layers] == [False, True, False, True, False, False]


def test_list_valued_expert_fields_read_the_text_model() -> None:
    """ERNIE-VL states experts and their width as [text, vision]; a per-layer top-k (Hunyuan)
    is bounded by its largest entry; `top_k_experts` (Gemma 4) is a top-k."""
    config = BASE | {
        "moe_num_experts": [8, 4],
        "moe_intermediate_size": [48, 16],
        "moe_k": [2, 3, 2, 2],
    }
    d = parse_config(config).dims
    assert (d.num_experts, d.moe_intermediate_size, d.experts_per_token) == (8, 48, 3)
    gemma4 = BASE | {"num_experts": 8, "top_k_experts": 2, "moe_intermediate_size": 32}
    assert parse_config(gemma4).dims.experts_per_token == 2
    error = _error(BASE | {"moe_num_experts": [8, "x"]})
    assert error.field.endswith("moe_num_experts") and "integers" in error.message


# --- llm_int8_skip_modules, matched as transformers' bitsandbytes integration matches -------


@pytest.mark.parametrize(
    ("entry", "name", "matches"),
    [
        ("q_proj", "model.layers.7.self_attn.q_proj", True),  # bare name: every layer
        ("lm_head", "lm_head", True),
        ("self_attn.q_proj", "model.layers.0.self_attn.q_proj", True),  # dotted: by suffix
        ("model.layers.1", "model.layers.1.mlp.down_proj", True),  # from the root, a subtree
        ("model.layers.1", "model.layers.11.mlp.down_proj", False),  # at a module boundary
        ("model.layers.1.", "model.layers.1.mlp.down_proj", True),
        ("mlp.shared_expert", "model.layers.3.mlp.shared_expert", True),
        ("mlp.gate", "model.layers.3.mlp.gate_proj", False),
        (r"model\.layers\.[0-3]\.mlp", "model.layers.2.mlp.up_proj", True),  # a regex
        ("vision_tower", "model.layers.0.self_attn.q_proj", False),
        ("[", "model.layers.0.self_attn.q_proj", False),  # not a regex: suffix rule only
    ],
)
def test_skip_entries_match_as_the_loader_matches(entry: str, name: str, matches: bool) -> None:
    from controller.estimator.model import skip_module_matches

    assert skip_module_matches(entry, name) is matches


def _unsloth_weights(config: dict[str, Any], skip: list[str]) -> int:
    from controller.estimator import Method, Profile, TrainingSettings
    from controller.jobs.profiles import estimate

    qc = {"load_in_4bit": True, "llm_int8_skip_modules": skip}
    settings = TrainingSettings(profile=Profile.UNSLOTH, method=Method.QLORA, targets=("q_proj",))
    return estimate(parse_config(config | {"quantization_config": qc}), settings).components[
        "weights"
    ]


def _sixteen_bit_extra(elements: int) -> int:
    """What keeping `elements` in 16-bit adds to seed 1's NF4 weights (2 - 2/3.2 bytes)."""
    return elements * 2 - elements * 2 * 5 // 16


@pytest.mark.parametrize(
    ("skip", "elements"),
    [
        (["q_proj"], 4 * 64 * 64),  # in each of the 4 layers
        (["self_attn.q_proj", "q_proj"], 4 * 64 * 64),  # counted once
        (["model.layers.0.self_attn.q_proj"], 64 * 64),
        (["language_model.model.layers.0.self_attn.q_proj"], 64 * 64),
        (["model.language_model.layers.1.mlp"], 3 * 64 * 128),
        (["layers.1"], 2 * 64 * 64 + 2 * 64 * 64 + 3 * 64 * 128),
        (["lm_head", "embed_tokens", "vision_tower", "multi_modal_projector"], 0),
    ],
)
def test_skip_modules_price_the_matched_modules_in_16_bit(skip: list[str], elements: int) -> None:
    base = _unsloth_weights(BASE, [])
    assert abs(_unsloth_weights(BASE, skip) - base - _sixteen_bit_extra(elements)) <= 1


def test_shared_experts_and_expert_stacks_are_matchable() -> None:
    moe = BASE | {
        "n_routed_experts": 4,
        "moe_intermediate_size": 32,
        "num_experts_per_tok": 2,
        "shared_expert_intermediate_size": 48,
    }
    base = _unsloth_weights(moe, [])
    shared = 3 * 64 * 48 + 64  # the shared expert and its gate
    routed = 3 * 64 * 32 * 4 + 4 * 64  # the expert stacks and the router
    for names in (["mlp.shared_expert"], ["mlp.shared_experts"]):
        extra = _unsloth_weights(moe, names) - base
        assert abs(extra - _sixteen_bit_extra(4 * shared)) <= 1
    extra = _unsloth_weights(moe, ["model.layers.0.mlp.experts"]) - base
    assert abs(extra - _sixteen_bit_extra(routed)) <= 1


def test_the_trace_quantizes_what_the_loader_would() -> None:
    pytest.importorskip("torch")
    from torch import nn

    from controller.trace.qlora import Linear4bitStorage, quantize_linears

    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj, self.k_proj = nn.Linear(8, 8), nn.Linear(8, 8)

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.self_attn = Attn()

    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([Layer() for _ in range(12)])

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.lm_head = Inner(), nn.Linear(8, 8)

    import torch

    model = Model()
    skip = ["language_model.model.layers.1", "k_proj"]
    quantize_linears(model, skip, torch.bfloat16)
    kept = {n for n, m in model.named_modules() if type(m) is nn.Linear}
    assert kept == {"lm_head", "model.layers.1.self_attn.q_proj"} | {
        f"model.layers.{i}.self_attn.k_proj" for i in range(12)
    }
    assert isinstance(model.model.layers[11].self_attn.q_proj, Linear4bitStorage)


# --- the unsloth profile as seed 1 writes it; inputs its reference accepts ----------------


def _unsloth(config: dict[str, Any], **kw: Any) -> Any:
    from controller.estimator import Profile, TrainingSettings
    from controller.jobs.profiles import estimate

    return estimate(parse_config(config), TrainingSettings(profile=Profile.UNSLOTH, **kw))


PLE: dict[str, Any] = BASE | {
    "head_dim": 16,
    "num_key_value_heads": 2,
    "num_kv_shared_layers": 2,
    "vocab_size_per_layer_input": 50,
    "hidden_size_per_layer_input": 8,
}


def test_all_linear_is_the_seven_projections_of_the_table() -> None:
    seven = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    every = _unsloth(PLE, targets=("all-linear",))
    assert every.trainable_params == _unsloth(PLE, targets=seven).trainable_params


def test_activations_charge_h_k_k_on_kv_shared_layers_too() -> None:
    from controller.estimator import Checkpointing

    off = {"gradient_checkpointing": Checkpointing.OFF, "batch": 1, "seq_len": 100}
    shared = _unsloth(PLE, **off).components["activations"]
    unshared = _unsloth(PLE | {"num_kv_shared_layers": 0}, **off).components["activations"]
    assert shared == unshared
    q, kv, mlp, t = 4 * 16, 2 * 16, 128, 100
    assert shared == 4 * (t * (q + 2 * kv + 2 + 2 * mlp) * 2 * 5 // 4)


def test_deepseek_shared_experts_get_no_gate_in_the_unsloth_weights() -> None:
    from controller.estimator import Method

    moe = BASE | {"n_routed_experts": 4, "moe_intermediate_size": 32, "num_experts_per_tok": 2}
    full = {"method": Method.FULL}
    deepseek = _unsloth(moe | {"n_shared_experts": 1}, **full).components["weights"]
    assert deepseek - _unsloth(moe, **full).components["weights"] == 2 * 4 * (3 * 64 * 32)
    assert parse_config(moe | {"n_shared_experts": 1}).total_params - parse_config(
        moe
    ).total_params == 4 * (3 * 64 * 32)
    qwen = _unsloth(moe | {"shared_expert_intermediate_size": 32}, **full).components["weights"]
    assert qwen - deepseek == 2 * 4 * 64  # Qwen's h -> 1 gate, per layer


def test_an_unknown_attention_implementation_takes_the_quadratic_path_with_a_warning() -> None:
    from controller.estimator import Attention, Profile, context_warnings
    from controller.estimator.settings import build_settings
    from controller.jobs.profiles import estimate

    values = {"profile": "unsloth", "attention": "kernels-community/flash-attn3"}
    refused, errors = build_settings(values)
    assert refused is None and "training.attention: unsupported value" in str(errors[0])
    settings, errors = build_settings(values, any_attention=True)
    assert settings is not None and not errors
    assert settings.attention is Attention.EAGER and settings.profile is Profile.UNSLOTH
    shape = parse_config(BASE)
    eager, _ = build_settings(values | {"attention": "eager"})
    assert eager is not None and estimate(shape, settings) == estimate(shape, eager)
    (line,) = context_warnings(shape, settings)
    assert line.startswith("training.attention: 'kernels-community/flash-attn3' is none of")
    assert "quadratic" in line and not context_warnings(shape, eager)


def test_head_dim_is_derived_where_the_config_has_none() -> None:
    shape = parse_config(BASE | {"hidden_size": 66})  # 66 // 4 = 16, as transformers floors
    q = next(lin for lin in shape.layers[0].linears if lin.name == "q_proj")
    assert (q.in_features, q.out_features) == (66, 64)
    assert _unsloth(BASE | {"hidden_size": 66}).total_bytes > 0


def test_kv_shared_layers_equal_to_the_depth_share_nothing() -> None:
    everything = parse_config(PLE | {"num_kv_shared_layers": 4})
    none = parse_config(PLE | {"num_kv_shared_layers": 0})
    assert everything.total_params == none.total_params
    assert _unsloth(PLE | {"num_kv_shared_layers": 4}).total_bytes > 0


def test_a_short_mlp_layer_types_leaves_the_later_layers_moe() -> None:
    moe = BASE | {"num_experts": 4, "num_experts_per_tok": 2}
    shape = parse_config(moe | {"mlp_layer_types": ["dense", "sparse"]})
    assert [layer.moe for layer in shape.layers] == [False, True, True, True]
    longer = parse_config(moe | {"mlp_layer_types": ["dense"] * 6})
    assert not any(layer.moe for layer in longer.layers)
    assert _unsloth(moe | {"mlp_layer_types": ["dense"]}).total_bytes > 0


# --- families with a preset: the parser's count is transformers' count --------------------

#: Each new family's preset and the parameters transformers 5 gives for its config (the fp32
#: e_score_correction_bias GLM and DeepSeek keep in the checkpoint is a buffer, not counted),
#: measured by building the model on the meta device (see the presets' notes).
FAMILY_COUNTS = {
    "dbrx-instruct": 131_596_523_520,
    "llama-4-maverick": 400_711_848_960,
    "ernie-4.5-21b-a3b": 21_825_437_888,
    "glm-4.5": 352_797_814_784,
    "kimi-k2": 1_026_408_209_408,
}


@pytest.mark.parametrize("name", sorted(FAMILY_COUNTS))
def test_each_family_preset_counts_as_transformers_builds_it(name: str) -> None:
    from controller.estimator.presets import load_preset

    assert parse_config(load_preset(name).config).total_params == FAMILY_COUNTS[name]


def test_family_layouts() -> None:
    from controller.estimator.presets import load_preset

    maverick = parse_config(load_preset("llama-4-maverick").config)
    assert [layer.moe for layer in maverick.layers[:4]] == [False, True, False, True]
    dense = {lin.name: lin.out_features for lin in maverick.layers[0].linears}
    assert dense["gate_proj"] == 16384  # intermediate_size_mlp
    moe = maverick.layers[1].linears
    assert {lin.name for lin in moe if lin.expert} == {"gate_up_proj", "down_proj"}
    assert "shared_expert_gate" not in {lin.name for lin in moe}
    glm = parse_config(load_preset("glm-4.5").config)
    assert sum(not layer.moe for layer in glm.layers) == 3
    ernie = parse_config(load_preset("ernie-4.5-21b-a3b").config)
    assert [layer.moe for layer in ernie.layers].count(False) == 1
    assert ernie.dims.experts_per_token == 6 and ernie.lm_head_params == 0
    kimi = parse_config(load_preset("kimi-k2").config)
    assert kimi.dims.num_experts == 384 and kimi.dims.kv_lora_rank == 512


def test_meta_build_matches_where_transformers_has_the_family() -> None:
    """The counts above, measured again (slow families skipped: DBRX and ERNIE only)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from controller.estimator.presets import load_preset
    from controller.trace.build import text_config

    for name in ("dbrx-instruct", "ernie-4.5-21b-a3b"):
        raw = text_config(load_preset(name).config)
        cfg = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
        assert sum(p.numel() for p in model.parameters()) == FAMILY_COUNTS[name]


def test_kimi_k2_is_built_by_the_trace_as_deepseek_v3s_code() -> None:
    """Kimi K2 has no transformers class: its checkpoints ship DeepSeek-V3's modelling code
    (`architectures`: DeepseekV3ForCausalLM), so the trace builds it as that class. At the
    preset's widths it holds the parser's count (the 60 MoE layers' fp32 score-correction
    biases of 384 are buffers, counted by neither), and a small variant trains with the
    trainable tensors the estimator prices."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from controller.estimator import Attention, Method, TrainingSettings
    from controller.estimator.presets import load_preset
    from controller.estimator.storage import static_bytes
    from controller.trace.build import hf_config
    from controller.trace.run import trace_run

    config = load_preset("kimi-k2").config_dict()
    cfg = hf_config(config, Attention.SDPA)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    params = sum(p.numel() for p in model.parameters())
    assert params == FAMILY_COUNTS["kimi-k2"]
    assert parse_config(config).buffer_bytes == 4 * 60 * 384

    for name in ("bos_token_id", "eos_token_id", "rope_scaling"):
        config.pop(name)
    small = config | {
        "hidden_size": 256, "num_hidden_layers": 2, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 128, "intermediate_size": 512,
        "kv_lora_rank": 64, "q_lora_rank": 128, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": 1024, "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 32, "v_head_dim": 32, "pad_token_id": 0,
    }  # fmt: skip
    shape = parse_config(small)
    for method in (Method.FULL, Method.LORA):
        job = TrainingSettings(method=method, rank=None if method is Method.FULL else 4, seq_len=32)
        traced = trace_run(small, job, breakdowns=False)
        assert traced.trainable_params == static_bytes(shape, job).trainable_params


@pytest.mark.parametrize(
    "change",
    [
        {"hybrid_override_pattern": "M-M*-"},
        {"full_attention_interval": 4, "linear_num_key_heads": 16},
        {"mamba_d_state": 256},
        {"ssm_state_size": 128},
        {"layer_types": ["linear_attention", "full_attention"] * 2},
    ],
)
def test_hybrid_models_are_refused_not_estimated_as_all_attention(change: dict[str, Any]) -> None:
    error = _error(BASE | change)
    assert error.field.startswith("spec.model.config.")


@pytest.mark.parametrize(
    "preset", ["gpt-oss-20b", "llama-4-maverick", "dbrx-instruct", "jamba-v0.1"]
)
def test_analytic_lora_adapts_no_expert_stack_peft_does_not(preset: str) -> None:
    """Expert stacks are 3-D parameters in transformers 5, no nn.Linear: where PEFT maps no
    names onto them (no `peft_moe_pattern`), analytic's adapter count leaves them out, and
    equals the exact placement (`storage.py`, held to the trace's PEFT model)."""
    from controller.estimator import Method, TrainingSettings, load_shape
    from controller.estimator.storage import static_bytes

    shape = load_shape(preset)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    job = TrainingSettings(method=Method.LORA, rank=8, targets=targets)
    stacks = sum(
        lin.lora_params(8) * n for layer, n in shape.layer_counts for lin in layer.linears
        if lin.expert and lin.name in targets
    )  # fmt: skip
    assert stacks > 0  # the model has stacks those names would have reached
    assert 8 * shape.lora_params_per_rank(targets) == static_bytes(shape, job).trainable_params


@pytest.mark.parametrize("targets", [["all-linear"], ["q_proj", "router"]])
def test_llama4_lora_on_its_router_is_refused_as_training_would_fail(targets: list[str]) -> None:
    """PEFT wraps Llama 4's tuple-returning router and its LoRA layer fails on the tuple in
    the first forward (the trace shows it: tests/unit/trace/test_trace.py), so a job that would
    adapt the router is refused in one line that says what to write instead."""
    from controller.estimator import load_shape
    from controller.estimator.model import canonical_targets

    shape = load_shape("llama-4-maverick")
    with pytest.raises(SpecError) as info:
        canonical_targets(targets, shape, "spec.lora.targetModules")
    assert info.value.field == "spec.lora.targetModules"
    assert "router (an nn.Linear) returns" in info.value.message
    assert "q_proj" in info.value.message and "\n" not in info.value.message
    assert canonical_targets(["q_proj", "down_proj"], shape, "t") == ("down_proj", "q_proj")


@pytest.mark.parametrize(
    ("preset", "targets", "words"),
    [
        ("dbrx-instruct", ["gate_proj"], "selects no module PEFT adapts"),
        ("gpt-oss-20b", ["gate_up_proj", "down_proj"], "select no module PEFT adapts"),
        ("nemotron-nano-9b-v2", ["out_proj"], "'out_proj' is one of them"),
    ],
)
def test_targets_peft_cannot_adapt_are_refused_naming_those_it_can(
    preset: str, targets: list[str], words: str
) -> None:
    from controller.estimator import load_shape
    from controller.estimator.model import canonical_targets, peft_adaptable_modules

    shape = load_shape(preset)
    with pytest.raises(SpecError) as info:
        canonical_targets(targets, shape, "spec.lora.targetModules")
    assert words in info.value.message and "\n" not in info.value.message
    adaptable = peft_adaptable_modules(shape)
    assert adaptable and info.value.message.endswith(", ".join(adaptable))
    for name in adaptable:  # each accepted, and adapting something
        assert shape.lora_params_per_rank(canonical_targets([name], shape, "t")) > 0


def test_dbrx_targets_may_use_its_own_module_names() -> None:
    """PEFT matches DBRX's modules by transformers' names (Wqkv, out_proj, the router's
    layer): those are accepted as the canonical names are, and listed as what can be
    adapted; canonicalising twice changes nothing."""
    from controller.estimator import load_shape
    from controller.estimator.model import canonical_targets, peft_adaptable_modules

    shape = load_shape("dbrx-instruct")
    own = canonical_targets(["Wqkv", "out_proj", "layer"], shape, "t")
    assert own == canonical_targets(["qkv_proj", "o_proj", "router"], shape, "t")
    assert canonical_targets(own, shape, "t") == own
    assert peft_adaptable_modules(shape) == ("Wqkv", "layer", "out_proj")
