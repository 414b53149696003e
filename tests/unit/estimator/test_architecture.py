"""config.json parsing: nesting, family layouts, MoE, MLA, and one-line errors."""

from __future__ import annotations

import inspect
import json
import re
import time
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from controller.estimator import SpecError, SpecErrors, load_shape, parse_config
from controller.estimator.model import (
    MAX_LAYERS,
    REQUIRED_DIMENSIONS,
    SUPPORTED_MODEL_TYPES,
    canonical_targets,
)
from controller.estimator.model.dims import _dense_layer_indices
from controller.estimator.model.read import Reader as _Reader
from controller.estimator.model.read import model_defaults as _model_defaults
from controller.estimator.presets import hand_read_preset_names, load_preset
from controller.estimator.settings import MAX_SEQUENCE_LENGTH
from tests.unit.conftest import LLAMA_31_8B, PYTHIA_69B, QWEN25_05B

BASE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 100,
}


def test_text_config_nesting_reads_the_language_model() -> None:
    nested = {"model_type": "llava", "text_config": LLAMA_31_8B, "vision_config": {"x": 1}}
    assert parse_config(nested).total_params == parse_config(LLAMA_31_8B).total_params


def test_nested_config_falls_back_to_outer_tie_flag() -> None:
    text = {k: v for k, v in LLAMA_31_8B.items() if k != "tie_word_embeddings"}
    tied = parse_config({"tie_word_embeddings": True, "text_config": text})
    assert tied.lm_head_params == 0
    assert parse_config(LLAMA_31_8B).lm_head_params == 128256 * 4096


def test_gqa_head_dim_and_biases() -> None:
    plain = parse_config(BASE | {"num_key_value_heads": 2})
    attn = {lin.name: lin for lin in plain.layers[0].linears}
    assert (attn["k_proj"].in_features, attn["k_proj"].out_features) == (64, 32)
    wide = parse_config(BASE | {"head_dim": 32})
    q = next(lin for lin in wide.layers[0].linears if lin.name == "q_proj")
    assert q.out_features == 128  # heads x head_dim, not hidden_size
    biased = parse_config(BASE | {"attention_bias": True})
    assert biased.total_params - parse_config(BASE).total_params == 2 * (64 * 4)
    qwen = parse_config(BASE | {"model_type": "qwen2", "num_key_value_heads": 4})
    assert qwen.total_params - parse_config(BASE).total_params == 2 * (64 * 3)  # q/k/v only


def test_moe_counts_experts_router_and_dense_layers() -> None:
    moe = BASE | {"num_local_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 3}
    shape = parse_config(moe)
    dense = parse_config(BASE | {"num_hidden_layers": 3})
    mlp = 3 * 64 * 128
    assert shape.total_params - dense.total_params == 3 * (3 * mlp + 64 * 4)
    deepseek_like = moe | {"first_k_dense_replace": 1, "moe_intermediate_size": 32}
    shape = parse_config(deepseek_like)
    assert [layer.moe for layer in shape.layers] == [False, True, True]
    qwen_like = moe | {"decoder_sparse_step": 1, "mlp_only_layers": [2]}
    assert [layer.moe for layer in parse_config(qwen_like).layers] == [True, True, False]


def test_shared_experts_deepseek_and_qwen_styles() -> None:
    moe = BASE | {"n_routed_experts": 4, "moe_intermediate_size": 32, "num_experts_per_tok": 2}
    base = parse_config(moe).total_params
    deepseek = parse_config(moe | {"n_shared_experts": 2}).total_params
    assert deepseek - base == 2 * 3 * 64 * 64  # one MLP 2 x 32 wide per layer
    qwen = parse_config(moe | {"shared_expert_intermediate_size": 48}).total_params
    assert qwen - base == 2 * (3 * 64 * 48 + 64)  # shared expert plus its h -> 1 gate


def test_mla_projections() -> None:
    mla = BASE | {
        "model_type": "deepseek_v3",
        "q_lora_rank": 16,
        "kv_lora_rank": 8,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
    }
    names = [lin.name for lin in parse_config(mla).layers[0].linears]
    assert names[:5] == ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
    q_b = parse_config(mla).layers[0].linears[1]
    assert (q_b.in_features, q_b.out_features) == (16, 4 * 12)


def test_phi3_fused_modules_and_target_mapping() -> None:
    shape = parse_config(BASE | {"model_type": "phi3", "num_key_value_heads": 2})
    assert {"qkv_proj", "gate_up_proj", "down_proj", "o_proj"} == shape.module_names
    assert canonical_targets(["q_proj", "v_proj"], shape, "t") == ("qkv_proj",)


def test_quantization_config() -> None:
    qc = {
        "load_in_4bit": True,
        "bnb_4bit_use_double_quant": True,
        "llm_int8_skip_modules": ["lm_head"],
    }
    shape = parse_config(LLAMA_31_8B | {"quantization_config": qc})
    assert shape.quantization is not None
    assert shape.quantization.double_quant and shape.quantization.skip_modules == ("lm_head",)


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"hidden_size": None}, "hidden_size", "is required"),
        ({"vocab_size": None}, "vocab_size", "is required"),
        ({"num_hidden_layers": 0}, "num_hidden_layers", "greater than or equal to 1"),
        ({"hidden_size": "4096"}, "hidden_size", "must be an integer"),
        ({"num_key_value_heads": 3}, "num_key_value_heads", "must divide"),
        ({"layer_types": ["full_attention"]}, "layer_types", "one type per layer"),
        ({"num_local_experts": 2, "num_experts_per_tok": 3}, "num_experts_per_tok", "exceed"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings", "true or false"),
        ({"num_local_experts": 4, "first_k_dense_replace": 9}, "first_k_dense_replace", "exceed"),
        ({"kv_lora_rank": 8}, "qk_nope_head_dim", "is required"),
        ({"num_kv_shared_layers": 3}, "num_kv_shared_layers", "less than or equal to"),
        ({"quantization_config": {"llm_int8_skip_modules": "x"}}, "llm_int8_skip", "list"),
        ({"quantization_config": {"load_in_4bit": "no"}}, "load_in_4bit", "true or false"),
        ({"num_hidden_layers": 10**6}, "num_hidden_layers", "less than or equal to 4096"),
        ({"num_local_experts": 10**6}, "num_local_experts", "less than or equal to 4096"),
        ({"n_routed_experts": 8, "num_experts_per_tok": 10**9}, "num_experts_per_tok", "4096"),
        ({"n_shared_experts": 10**9}, "n_shared_experts", "less than or equal to 4096"),
        ({"hidden_size": 10**30}, "hidden_size", "less than or equal to 16777216"),
        ({"vocab_size": 2**40}, "vocab_size", "less than or equal to 16777216"),
        ({"head_dim": 10**30}, "head_dim", "less than or equal to 16777216"),
        ({"intermediate_size": [128, True]}, "intermediate_size", "integers from 1 to"),
        ({"intermediate_size": [10**30]}, "intermediate_size", "integers from 1 to"),
        ({"num_attention_heads": 0}, "num_attention_heads", "greater than or equal to 1"),
        ({"vocab_size": 0}, "vocab_size", "greater than or equal to 1"),
        ({"num_attention_heads": True}, "num_attention_heads", "must be an integer, got True"),
        ({"hidden_size": 64.0}, "hidden_size", "must be an integer, got 64.0"),
        ({"model_type": ["llama"]}, "model_type", "must be a string"),
        (
            {"num_local_experts": 4, "decoder_sparse_step": 1, "mlp_only_layers": [True]},
            "mlp_only_layers",
            "list of layer indices",
        ),
        ({"rope_scaling": "yarn"}, "rope_scaling", "must be an object"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": "4"}}, "factor", "must be a number"),
        (
            {"rope_scaling": {"rope_type": "linear", "factor": float("inf")}},
            "rope_scaling.factor",
            "must be a positive number, got inf",
        ),
        (
            {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 0,
                }
            },
            "rope_parameters.original_max_position_embeddings",
            "greater than or equal to 1",
        ),
    ],
)
def test_bad_configs_name_the_field(change: dict[str, Any], field: str, words: str) -> None:
    config = {k: v for k, v in (BASE | change).items() if v is not None}
    with pytest.raises(SpecError) as error:
        parse_config(config, prefix="spec.model.config")
    text = str(error.value)
    assert text.startswith("spec.model.config.") and field in error.value.field
    assert words in text and "\n" not in text


def test_a_huge_value_is_quoted_short() -> None:
    with pytest.raises(SpecError) as error:
        parse_config(BASE | {"hidden_size": "x" * 10**6}, prefix="config")
    assert str(error.value).startswith("config.hidden_size: must be an integer, got 'xxx")
    assert len(str(error.value)) < 120


def test_a_million_layers_are_refused_before_any_work() -> None:
    start = time.perf_counter()
    with pytest.raises(SpecError, match="num_hidden_layers: must be less than or equal to 4096"):
        parse_config(BASE | {"num_hidden_layers": 10**6})
    assert time.perf_counter() - start < 0.05
    assert parse_config(BASE | {"num_hidden_layers": MAX_LAYERS}).num_layers == MAX_LAYERS


def test_dense_layer_rules_are_linear_in_the_depth() -> None:
    """`mlp_only_layers` was tested by list membership for every layer: quadratic."""
    depth = 200_000  # beyond MAX_LAYERS, to make a quadratic rule take minutes
    config = {"decoder_sparse_step": 2, "mlp_only_layers": list(range(0, depth, 3))}
    start = time.perf_counter()
    dense = _dense_layer_indices(_Reader(config, "config"), depth, 8)
    assert time.perf_counter() - start < 1
    assert dense[:5] == (0, 2, 3, 4, 6) and len(dense) == 133_333  # all but 1, 5 mod 6


def test_rope_scaling_extends_the_context() -> None:
    """Configs state a scaled context both ways: Llama 3.1 already in max_position_embeddings,
    a yarn Qwen as factor x the original window; the longer reading is the context."""
    assert parse_config(LLAMA_31_8B).context_length == 131072
    qwen = BASE | {"max_position_embeddings": 32768}
    assert parse_config(qwen).context_length == 32768
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert parse_config(qwen | {"rope_scaling": yarn}).context_length == 131072
    linear = {"type": "linear", "factor": 2}  # original: max_position_embeddings
    assert parse_config(qwen | {"rope_scaling": linear}).context_length == 65536
    per_type = {"full_attention": {"rope_type": "dynamic", "factor": 8.0}, "sliding": {}}
    assert parse_config(qwen | {"rope_parameters": per_type}).context_length == 262144
    phi3 = {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}  # no factor
    assert parse_config(qwen | {"rope_scaling": phi3}).context_length == 32768
    absurd = {"rope_type": "linear", "factor": 1e300}
    assert parse_config(qwen | {"rope_scaling": absurd}).context_length == MAX_SEQUENCE_LENGTH
    assert parse_config(BASE).context_length is None


def test_not_an_object() -> None:
    with pytest.raises(SpecError, match="must be a JSON object"):
        parse_config([1, 2], prefix="config")  # type: ignore[arg-type]


def test_unknown_lora_target_lists_the_modules() -> None:
    shape = parse_config(LLAMA_31_8B)
    with pytest.raises(SpecError) as error:
        canonical_targets(["qkv"], shape, "lora.targetModules")
    assert "lora.targetModules: unknown module 'qkv'" in str(error.value)
    assert "q_proj" in str(error.value)
    assert canonical_targets(["w1", "q_proj"], shape, "t") == ("gate_proj", "q_proj")
    assert canonical_targets(["ALL_LINEAR"], shape, "t") == ("all-linear",)


def test_class_defaults_are_transformers_own() -> None:
    """model_defaults.json is facts from transformers' config classes: each value is the
    default of its class's constructor (not a value derived at init, as head_dim is)."""
    transformers = pytest.importorskip("transformers")
    mapping = transformers.models.auto.configuration_auto.CONFIG_MAPPING
    text = resources.files("controller.estimator").joinpath("model_defaults.json").read_text()
    defaults = {k: v for k, v in json.loads(text).items() if not k.startswith("_")}
    assert {"qwen2_moe", "qwen3_moe", "deepseek_v3", "mixtral", "qwen3"} <= defaults.keys()
    for model_type, fields in defaults.items():
        signature: dict[str, object] = {}
        for cls in reversed(mapping[model_type].__mro__):
            if "__init__" in cls.__dict__:
                for name, p in inspect.signature(cls.__dict__["__init__"]).parameters.items():
                    signature[name] = p.default
        for name, value in fields.items():
            assert signature.get(name) == value, (model_type, name)


def test_an_moe_config_with_its_class_defaults_left_out_is_read_whole_and_says_so() -> None:
    """A config that leaves out what equals its class's defaults (transformers 4 saved a
    nested text_config so; a hand-trimmed one) is read with them, as transformers loads it:
    a Qwen1.5-MoE config without its 60 experts of 1408, top-4 and shared expert of 5632 is
    that model, and its warning names each default read."""
    full = {"model_type": "qwen2_moe", "hidden_size": 2048, "num_hidden_layers": 24,
            "num_attention_heads": 16, "vocab_size": 151936, "intermediate_size": 5632,
            "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632, "num_key_value_heads": 16}  # fmt: skip
    stated = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "vocab_size", "intermediate_size")  # fmt: skip
    short = {k: full[k] for k in stated}
    assert parse_config(short).dims == parse_config(full).dims
    assert parse_config(short).dims.num_experts == 60
    assert parse_config(full).config_warnings == ()
    assert parse_config(short, prefix="config").config_warnings == (
        (
            "config",
            "estimated with the defaults of transformers' qwen2_moe config class for what the "
            "config leaves out (num_key_value_heads=16, moe_intermediate_size=1408, "
            "num_experts=60, num_experts_per_tok=4, shared_expert_intermediate_size=5632), as "
            "transformers loads it; set them in the config if the model's differ",
        ),
    )
    # The config's own name for a field wins over the class default under another name.
    named = short | {"model_type": "qwen3_moe", "num_local_experts": 64,
                     "num_experts_per_token": 4}  # fmt: skip
    dims = parse_config(named).dims
    assert (dims.num_experts, dims.experts_per_token) == (64, 4)
    # DeepSeek-V3's MLA widths, Llama 4's dense MLP width: read as attention and a shared
    # expert of the class's widths, not as plain multi-head attention and no shared expert.
    for preset, omitted in (
        ("deepseek-v3", ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
                         "qk_rope_head_dim", "v_head_dim")),
        ("llama-4-maverick", ("intermediate_size_mlp",)),
    ):  # fmt: skip
        config = load_preset(preset).config_dict()
        text = config.get("text_config", config)
        trimmed = {k: v for k, v in text.items() if k not in omitted}
        whole = parse_config(text).dims
        assert parse_config(trimmed).dims == whole, preset


def test_class_defaults_fill_fields_a_config_omits() -> None:
    gemma3_text = {"model_type": "gemma3_text", "hidden_size": 2560, "num_hidden_layers": 34}
    shape = parse_config({"model_type": "gemma3", "text_config": gemma3_text})
    assert shape.dims.num_heads == 8 and shape.dims.head_dim == 256
    assert shape.vocab_size == 262208


def test_a_refused_class_default_says_the_config_did_not_set_it() -> None:
    """Qwen3's class says 32 KV heads; a trimmed 16-head config inherits them and is refused,
    as transformers would fail on it, but "got 32" must not read as the user's own value."""
    trimmed = {"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16,
               "num_hidden_layers": 4, "intermediate_size": 2048, "vocab_size": 1000}  # fmt: skip
    with pytest.raises(SpecError) as error:
        parse_config(trimmed, prefix="config")
    assert str(error.value) == (
        "config.num_key_value_heads: must divide num_attention_heads (16), got 32 (not in the "
        "config: the default of transformers' qwen3 config class; set it in the config)"
    )
    with pytest.raises(SpecError) as error:  # written by the user: said as before
        parse_config(trimmed | {"num_key_value_heads": 32}, prefix="config")
    assert str(error.value).endswith("got 32")
    # A bare text_config's defaults are its own class's, and named so.
    with pytest.raises(SpecError) as error:
        text = {k: v for k, v in trimmed.items() if k != "model_type"}
        text |= {"hidden_size": 1536, "num_attention_heads": 12}
        parse_config({"model_type": "mistral3", "text_config": text})
    assert str(error.value) == (
        "text_config.num_key_value_heads: must divide num_attention_heads (12), got 8 (not in "
        "the config: the default of transformers' mistral config class; set it in the config)"
    )
    assert parse_config(trimmed | {"num_key_value_heads": 8}).dims.num_kv_heads == 8


def test_transformers_writes_every_required_dimension_at_a_configs_top_level() -> None:
    """Why a config without one is refused rather than read with its class's default:
    `save_pretrained` leaves out only what equals the base config class's defaults, which
    hold none of them, so every config transformers writes states them all."""
    transformers = pytest.importorskip("transformers")
    mapping = transformers.models.auto.configuration_auto.CONFIG_MAPPING
    classes, _ = _model_defaults()
    for model_type in classes:
        saved = mapping[model_type]().to_diff_dict()
        for names in REQUIRED_DIMENSIONS:
            assert any(name in saved for name in names), (model_type, names[0])


def test_a_config_must_state_every_dimension_the_estimate_is_built_on() -> None:
    """One line per dimension left out, naming the class default it was not read as; a
    family's own names count (DBRX's, Nemotron-H's layer pattern), and a nested text_config
    whose class vramgate holds no defaults of has no default to stand in."""
    with pytest.raises(SpecErrors) as error:
        parse_config({"model_type": "qwen3", "hidden_size": 1024}, prefix="config")
    assert [(e.field, e.message) for e in error.value.errors] == [
        (f"config.{name}", "is required in a model config: the estimate depends on it "
                           f"(transformers' qwen3 default, {default}, may be another model's)")
        for name, default in (("num_hidden_layers", 32), ("num_attention_heads", 32),
                              ("intermediate_size", 22016), ("vocab_size", 151936))
    ]  # fmt: skip
    for config in (
        BASE,
        load_preset("dbrx-instruct").config_dict(),  # d_model, n_layers, ffn_config...
        {k: v for k, v in BASE.items() if k != "hidden_size"} | {"n_embd": 64},
    ):
        parse_config(config)
    nemotron = {k: v for k, v in BASE.items() if k != "num_hidden_layers"}
    parse_config(nemotron | {"model_type": "nemotron_h", "hybrid_override_pattern": "M*"})
    with pytest.raises(SpecErrors) as error:
        parse_config({"model_type": "gemma3n", "text_config": {"hidden_size": 64}})
    assert [e.field for e in error.value.errors] == [
        "text_config.num_hidden_layers",
        "text_config.num_attention_heads",
        "text_config.intermediate_size",
        "text_config.vocab_size",
    ]
    assert error.value.errors[-1].message == (
        "is required in a model config: the estimate depends on it"
    )


def test_key_value_heads_a_config_leaves_out_are_said_where_they_shape_attention() -> None:
    """Taken to be the attention heads, as transformers reads such a config: a grouped-query
    model written without them is estimated with every head's keys and values."""
    (said,) = parse_config(BASE, prefix="config").config_warnings
    assert said[0] == "config.num_key_value_heads"
    assert said[1].startswith("not in the config, so estimated as num_attention_heads (4): ")
    for stated in ({"num_key_value_heads": 4}, {"num_kv_heads": 2}, {"num_attention_heads": 1}):
        assert parse_config(BASE | stated).config_warnings == ()
    # MLA shares no heads: DeepSeek's attention has no key/value heads to default.
    deepseek = load_preset("deepseek-v3").config_dict()
    del deepseek["num_key_value_heads"]
    assert parse_config(deepseek).config_warnings == ()
    dbrx = load_preset("dbrx-instruct").config_dict()  # attn_config.kv_n_heads
    assert parse_config(dbrx).config_warnings == ()


def test_a_text_config_without_its_model_type_takes_its_own_class_defaults() -> None:
    """Llama 4's wrapper builds a bare `text_config` dict as a Llama4TextConfig: its 16
    experts, top-1 and 8192-wide dense MLP apply though the dict names no model_type."""
    text = {"hidden_size": 5120, "num_hidden_layers": 4, "intermediate_size": 8192,
            "num_attention_heads": 40, "num_key_value_heads": 8, "vocab_size": 1000}  # fmt: skip
    bare = parse_config({"model_type": "llama4", "text_config": text})
    typed = text | {"model_type": "llama4_text"}
    named = parse_config({"model_type": "llama4", "text_config": typed})
    assert bare.dims == named.dims and bare.dims.num_experts == 16


def test_a_text_config_without_its_model_type_is_read_as_the_family_it_is_built_as() -> None:
    """InternVL builds a bare text_config as a Qwen2Config: its layers are Qwen2's (q/k/v
    biases), and the shape says qwen2, so every profile prices the family it is."""
    text = {k: v for k, v in QWEN25_05B.items() if k != "model_type"}
    wrapped = parse_config({"model_type": "internvl", "text_config": text})
    assert wrapped.model_type == "qwen2"
    assert wrapped.total_params == parse_config(QWEN25_05B).total_params
    mistral = parse_config({"model_type": "mistral3", "text_config": dict(LLAMA_31_8B)})
    assert mistral.model_type == "llama", "a text_config's own model_type wins"
    bare = {k: v for k, v in LLAMA_31_8B.items() if k != "model_type"}
    assert parse_config({"model_type": "mistral3", "text_config": bare}).model_type == "mistral"
    # A wrapper that is a family of its own keeps its name (Gemma 3, Llama 4).
    assert parse_config({"model_type": "llama4", "text_config": bare}).model_type == "llama4"


@pytest.mark.parametrize("model_type", ["gpt_neox", "phi", "falcon", "opt", "starcoder2"])
def test_a_model_type_vramgate_does_not_read_is_refused_not_read_as_llama(
    model_type: str,
) -> None:
    """Read as a Llama-style block these came out 30-60 % over (Pythia-6.9B at 9.00B, Phi-2
    at 3.62B for 2.78B, Falcon-7B at 11.16B); whatever the dimensions say, the type decides."""
    with pytest.raises(SpecError) as error:
        parse_config(LLAMA_31_8B | {"model_type": model_type}, prefix="config")
    message = str(error.value)
    assert error.value.field == "config.model_type"
    assert message.startswith(f"config.model_type: {model_type!r} is not a model family ")
    assert "supported: dbrx, deepseek_v2, " in message and ", llama, llama4, " in message
    assert message.endswith("(or use a preset: `vramgate presets`)") and "\n" not in message


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"model_type": "llava", "text_config": PYTHIA_69B}, "text_config.model_type"),
        # A wrapper transformers builds no known text model for: its own type is the field.
        ({"model_type": "blip-2", "text_config": dict(BASE)}, "model_type"),
        ({"model_type": ["llama"]} | BASE, "model_type"),
    ],
)
def test_a_model_type_is_refused_at_the_field_the_config_wrote_it(
    config: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError) as error:
        parse_config(config, prefix="spec.model.config")
    assert error.value.field == f"spec.model.config.{field}"


def test_a_config_naming_no_model_type_is_read_as_llama() -> None:
    """Hand-written configs (transformers always writes the field) are Llama's, as the trace
    builds them and the operator labels them."""
    bare = {k: v for k, v in LLAMA_31_8B.items() if k != "model_type"}
    shape = parse_config(bare)
    assert shape.model_type == "llama"
    assert shape.total_params == parse_config(LLAMA_31_8B).total_params


def test_every_family_a_config_can_be_read_as_is_supported() -> None:
    """Each wrapper's text model and each preset's type is one the parser reads by its own
    layout: none of them falls to a refusal, nor to another family's layout."""
    _, text_types = _model_defaults()
    assert set(text_types.values()) <= set(SUPPORTED_MODEL_TYPES)
    for name in hand_read_preset_names():
        config = load_preset(name).config
        own = (config.get("text_config") or {}).get("model_type") or config["model_type"]
        assert load_shape(name).model_type == own in SUPPORTED_MODEL_TYPES, name


def test_the_readme_lists_the_model_types_read() -> None:
    readme = (Path(__file__).parents[3] / "README.md").read_text(encoding="utf-8")
    listed = re.search(r"The `model_type`s read by hand are (.*?), and a multimodal", readme, re.S)
    assert listed is not None
    assert tuple(re.findall(r"`(\w+)`", listed.group(1))) == SUPPORTED_MODEL_TYPES


def test_the_text_config_classes_are_transformers_own() -> None:
    """Every wrapper transformers builds a bare text_config of a class with defaults here, and
    no other: read from its `sub_configs_defaults` (a SubConfigSpec, or the class itself).
    The map may hold wrappers of a newer transformers than the one installed (5.25 added
    llava_onevision1_5 and ovis2_5, which a fresh install of the trace extra gets)."""
    transformers = pytest.importorskip("transformers")
    mapping = transformers.models.auto.configuration_auto.CONFIG_MAPPING
    classes, text_types = _model_defaults()
    found = {}
    for wrapper in mapping:
        spec = (getattr(mapping[wrapper], "sub_configs_defaults", None) or {}).get("text_config")
        if spec is None:
            continue
        cls = spec if isinstance(spec, type) else spec.config_class
        text_type = getattr(spec, "model_type", None) or cls.model_type
        if text_type in classes and text_type != wrapper:
            found[wrapper] = text_type
    assert found == {w: t for w, t in text_types.items() if w in mapping}
    assert {"gemma3", "llama4", "mistral3", "llava"} <= found.keys()
