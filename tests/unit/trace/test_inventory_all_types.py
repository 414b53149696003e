"""Every causal-LM and image-text-to-text model type of the installed transformers, read.

Each type's own default config (`AutoConfig.for_model`) is cut to two decoder layers, built on
the meta device with the mapping's auto class, and inventoried: the inventory's parameter
count must be the one transformers reports on that model, its layers and outside parts must
add up to it, and it must find the decoder layers and their linears. A type that cannot be
built here is listed below with the reason (a strict xfail: once it builds, the test says so
and the entry goes). Meta builds take no storage: the whole set takes about 35 CPU-seconds
(two workers: `pytest -n 2`).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest

from tests.unit.trace_support import require_trace_extra

require_trace_extra()

from controller.estimator.model.inventory import ModelInventory  # noqa: E402
from controller.trace.build import TraceUnsupported  # noqa: E402
from controller.trace.inventory import (  # noqa: E402
    UnknownModelType,
    build_meta_model,
    inventory_of,
    main,
    mapping,
    read_inventory,
)

CAUSAL = "causal_lm"
VLM = "image_text_to_text"

_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}
#: Fields a type's default config leaves unset (None) or invalid although its modelling code
#: needs them; a checkpoint's config.json states them. Any valid value serves: the check
#: compares the inventory with the model built from the same config.
CONFIG_FIXES: dict[str, dict[str, Any]] = {
    "ministral": {"head_dim": 128},  # head_dim None: 4096 hidden / 32 heads
    "hunyuan_v1_dense": {"head_dim": 128},  # the same
    "hunyuan_v1_moe": {"head_dim": 128},  # the same
    "hunyuan_vl": {"text_config": {"head_dim": 128}},  # the same, in its text config
    "nemotron": {"num_key_value_heads": 48},  # None: one KV head per query head
    "deepseek_v2": {"num_experts_per_tok": 6},  # None: its router's top-k (DeepSeek-V2's 6)
    "dots1": {"n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6},
    "lfm2_moe": {"layer_types": ["full_attention"] * 32},  # None: one type per layer
    "deepseek_ocr2": {"text_config": {"mlp_layer_types": ["dense"] * 32}},  # the same
    "cohere_compass": {"text_config": {"rope_parameters": _ROPE}},  # none for its layer type
    "cohere_compass_text": {"rope_parameters": _ROPE},
    # attn_config without rope_theta; clip_qkv unset, which its attention clamps with
    "dbrx": {"attn_config": {"rope_theta": 500000.0, "clip_qkv": 8.0}},
    "reformer": {"is_decoder": True},  # its LM head class asserts a decoder config
    "aya_vision": {"vision_config": {"num_attention_heads": 16}},  # 1152 wide, 14 heads
    "chameleon": {"vocabulary_map": {"<image>": 8711}},  # no image token in its vocabulary
    "emu3": {"vocabulary_map": {"<image>": 8711}},  # the same
    "diffusion_gemma": {  # MoE sizes unset in its text config
        "text_config": {"num_experts": 8, "top_k_experts": 2, "moe_intermediate_size": 704}
    },
}

#: Built at their own depth: the last `num_kv_shared_layers` layers reuse an earlier layer's
#: keys and values, and a 2-layer cut leaves none to reuse (transformers refuses it).
OWN_DEPTH = {
    "gemma3n_text": "its last 15 layers share earlier layers' KV cache (num_kv_shared_layers)",
    "gemma4_unified_assistant": "its layers share other layers' KV cache (num_kv_shared_layers)",
}

#: Cut, but the cut does not reach the decoder the class builds (its depth is elsewhere):
#: counted as built.
NOT_CUT = {
    "hrm_text": "its stacks are num_layers_per_stack deep; num_hidden_layers counts cycles",
    "blt": "the byte-latent model keeps each stack's depth in a sub-config of its own",
    "pi0": "the robot policy nests its language model two configs deep (vlm_config)",
    "pi05": "the same as pi0",
}

_PIL = "its vision tower is timm's (TimmWrapperModel), which needs Pillow, not installed"
#: Types that cannot be built here, with why.
CANNOT_BUILD = {
    "gemma3n": _PIL,
    "fast_vlm": _PIL,
    "perception_lm": _PIL,
    "gemma4_assistant": "its default config fails transformers' own validation "
    "(hidden_size_per_layer_input must be 0, got 256)",
    "musicgen": "an audio model: its causal-LM class takes the decoder's config "
    "(musicgen_decoder), which the composite default config does not give it",
    "musicgen_melody": "the same as musicgen",
    "evolla": "listed in the image-text-to-text names, but AutoModelForImageTextToText has "
    "no class for its config (a protein-text model)",
    "granite4_vision": "its default config leaves deepstack_layer_map unset (a per-layer map "
    "of vision features into the decoder)",
}


def _merge(base: dict[str, Any], fix: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in fix.items():
        nested = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = _merge(base[key], value) if nested else value
    return out


def default_config(model_type: str) -> dict[str, Any]:
    from transformers import AutoConfig

    return _merge(AutoConfig.for_model(model_type).to_dict(), CONFIG_FIXES.get(model_type, {}))


def _cases() -> list[Any]:
    cases = []
    for auto in (CAUSAL, VLM):
        for model_type in sorted(mapping(auto)):
            reason = CANNOT_BUILD.get(model_type)
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            cases.append(pytest.param(auto, model_type, marks=marks, id=f"{auto}-{model_type}"))
    return cases


def _build(auto: str, model_type: str, layers: int | None) -> tuple[Any, ModelInventory]:
    model, built_type, used, depth = build_meta_model(default_config(model_type), layers, auto)
    assert used == auto
    return model, inventory_of(model, built_type, used, depth)


@pytest.mark.parametrize(("auto", "model_type"), _cases())
def test_inventory_counts_what_transformers_builds(auto: str, model_type: str) -> None:
    layers = None if model_type in OWN_DEPTH else 2
    model, inv = _build(auto, model_type, layers)

    assert inv.params == model.num_parameters() == sum(p.numel() for p in model.parameters())
    assert inv.layer_params + inv.outside_params == inv.params
    if model_type in NOT_CUT:  # until the cut reaches it
        assert inv.layers > 2, f"{model_type} is cut now: take it off NOT_CUT"
    else:
        expected = inv.config_layers if layers is None else 2
        assert inv.layers == expected, f"{inv.layers} layers built at {inv.layers_path!r}"
    indices = sorted(i for kind in inv.kinds for i in kind.indices)
    assert indices == list(range(inv.layers))
    assert any(kind.linears for kind in inv.kinds), f"no linears in {inv.layers_path!r}"
    assert all(group.count > 0 for group in inv.linears)


def test_every_type_is_tested_or_marked_and_the_lists_name_real_types() -> None:
    """The data above names only types the installed transformers lists, so an entry does not
    outlive its type; at most a few dozen are fixed or marked."""
    listed = set(mapping(CAUSAL)) | set(mapping(VLM))
    for table in (CONFIG_FIXES, OWN_DEPTH, NOT_CUT, CANNOT_BUILD):
        assert set(table) <= listed, set(table) - listed
    assert len(CANNOT_BUILD) < len(listed) // 20


# -- at the config's own depth: the outside parts and the layer kinds add up -------------------

FULL_DEPTH = [
    (CAUSAL, "llama"),
    (CAUSAL, "gpt2"),
    (CAUSAL, "deepseek_v3"),  # 3 dense layers, then MoE ones
    (CAUSAL, "jamba"),  # Mamba among attention, MoE every other layer
    (CAUSAL, "qwen3_next"),  # linear attention among full attention
    (CAUSAL, "zamba"),  # shared attention blocks among Mamba layers
    (VLM, "qwen2_5_vl"),
    (VLM, "gemma3"),
    (VLM, "llava"),
]


@pytest.mark.parametrize(("auto", "model_type"), FULL_DEPTH)
def test_full_depth_is_the_cut_builds_outside_plus_every_layers_own(
    auto: str, model_type: str
) -> None:
    """The parts outside the layers do not depend on the depth, and the full model's count is
    those parts plus each of its layers' own: what the cut build reads scales exactly once the
    kind of every layer is known, and the first layers are the same in both builds."""
    _, cut = _build(auto, model_type, 2)
    model, full = _build(auto, model_type, None)

    assert full.layers == full.config_layers == cut.config_layers
    assert full.params == sum(p.numel() for p in model.parameters())
    assert full.outside == cut.outside
    per_layer = [full.kind_of(i).params for i in range(full.layers)]
    assert cut.outside_params + sum(per_layer) == full.params
    for i in range(2):
        assert cut.kind_of(i).params == full.kind_of(i).params
        assert cut.kind_of(i).linears == full.kind_of(i).linears


# -- what the inventory reads ----------------------------------------------------------------


def test_deepseek_v3_reads_its_dense_and_moe_layers_and_mla_heads() -> None:
    inv = read_inventory(default_config("deepseek_v3"))
    dense, moe = inv.kinds
    assert dense.indices == (0, 1, 2) and moe.indices == tuple(range(3, 61))
    assert dense.experts == ()
    (experts,) = moe.experts
    assert experts.count == 256 and experts.name == "mlp.experts"
    assert all(shape[0] == 256 and len(shape) == 3 for _, shape in experts.tensors)
    # The query/key head is 128 + 64 wide (no-RoPE and RoPE parts), the value head 128.
    assert moe.attention is not None
    assert (moe.attention.heads, moe.attention.head_dim, moe.attention.value_head_dim) == (
        128,
        192,
        128,
    )
    # The shared expert's linears are linears; the fused experts are not.
    names = {g.name for g in moe.linears}
    assert "mlp.shared_experts.up_proj" in names
    assert not any(name.startswith("mlp.experts") for name in names)


def test_experts_fused_in_3d_or_stacked_in_2d_and_no_convolution_is_one() -> None:
    jamba = read_inventory(default_config("jamba"), layers=2)
    dense, moe = jamba.kind_of(0), jamba.kind_of(1)  # MoE every other layer, from layer 1
    assert dense.experts == ()  # its Mamba mixer's 3-D conv1d weight is no expert stack
    (experts,) = moe.experts
    assert experts.count == 16 and experts.params > 0
    # DBRX stacks its experts' weights in 2-D (experts x ffn rows by hidden): the count is
    # the config's, and the stack holds every expert parameter of the layer.
    config = default_config("dbrx")
    ffn = config["ffn_config"]
    dbrx = read_inventory(config, layers=1)
    (stack,) = dbrx.kinds[0].experts
    assert stack.count == ffn["moe_num_experts"] > 1
    rows = ffn["moe_num_experts"] * ffn["ffn_hidden_size"]
    assert {shape for _, shape in stack.tensors} == {(rows, config["d_model"])}


def test_linears_shapes_heads_and_conv1d() -> None:
    inv = read_inventory(default_config("gpt_bigcode"), layers=1)
    (kind,) = inv.kinds
    assert kind.attention is not None
    assert (kind.attention.heads, kind.attention.kv_heads) == (12, 1)  # multi-query
    shapes = {g.name: (g.in_features, g.out_features) for g in kind.linears}
    assert shapes["attn.c_attn"] == (768, 768 + 2 * 64)  # queries, one key and one value head
    gpt2 = read_inventory(default_config("gpt2"), layers=1)
    shapes = {g.name: (g.in_features, g.out_features) for g in gpt2.kinds[0].linears}
    assert shapes["attn.c_attn"] == (768, 3 * 768)  # Conv1D: weight stored (in, out)
    assert gpt2.tied_embeddings and gpt2.head_params == 0
    assert {n.name for n in gpt2.kinds[0].norms} == {"ln_1", "ln_2"}


def test_all_linear_and_4bit_follow_peft_and_transformers() -> None:
    llama = read_inventory(default_config("llama"), layers=2)
    assert llama.kept_16bit == ("lm_head",)
    assert "lm_head" not in llama.all_linear
    assert "model.layers.*.self_attn.q_proj" in llama.all_linear
    assert not llama.tied_embeddings and llama.head_params == llama.embedding_params

    # A config's own skip list replaces transformers' default skips (lm_head among them).
    quantized = default_config("llama") | {
        "quantization_config": {"load_in_4bit": True, "llm_int8_skip_modules": ["down_proj"]}
    }
    skipping = read_inventory(quantized, layers=2)
    assert skipping.kept_16bit == ("model.layers.*.mlp.down_proj",)

    # PEFT's all-linear adapts a vision tower's linears too; 4-bit quantises them.
    vlm = read_inventory(default_config("qwen2_5_vl"), layers=2)
    assert vlm.vision_path == "model.visual" and vlm.vision_params > 0
    assert any(name.startswith("model.visual.") for name in vlm.all_linear)
    assert vlm.kept_16bit == ("lm_head",)
    assert vlm.layers_path == "model.language_model.layers"


def test_inventory_is_plain_data() -> None:
    inv = read_inventory(default_config("qwen3_moe"), layers=2)
    assert json.loads(json.dumps(asdict(inv)))["params"] == inv.params


# -- refusals --------------------------------------------------------------------------------


def test_unknown_model_type_is_refused_in_one_line_saying_what_to_do() -> None:
    with pytest.raises(UnknownModelType) as error:
        read_inventory({"model_type": "my_custom_llm", "hidden_size": 64})
    message = str(error.value)
    assert "\n" not in message
    assert "trust_remote_code" in message and "preset" in message and "model_type" in message


def test_a_config_without_model_type_is_refused_not_guessed() -> None:
    with pytest.raises(UnknownModelType, match="states no model_type"):
        read_inventory({"hidden_size": 4096, "num_hidden_layers": 32})


def test_a_type_that_is_no_language_model_is_refused() -> None:
    with pytest.raises(UnknownModelType, match="not a causal or image-text-to-text"):
        read_inventory({"model_type": "vit"})


def test_remote_code_is_not_run_the_known_type_is_built() -> None:
    config = default_config("llama") | {"auto_map": {"AutoModelForCausalLM": "x.Model"}}
    assert read_inventory(config, layers=1).model_class == "LlamaForCausalLM"


def test_a_config_transformers_refuses_is_one_line() -> None:
    with pytest.raises(TraceUnsupported, match="transformers cannot build this config"):
        read_inventory(default_config("llama") | {"hidden_size": 100, "num_attention_heads": 3})


def test_command_line_prints_an_inventory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mistral", "--layers", "1"]) == 0
    out = capsys.readouterr().out
    assert "MistralForCausalLM" in out and "self_attn.q_proj" in out and "all-linear" in out
    assert main(["no_such_type"]) == 2
    assert "trust_remote_code" in capsys.readouterr().err
