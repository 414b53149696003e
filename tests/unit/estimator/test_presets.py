"""The bundled presets: well-formed data, lookup, and parameter counts the parser must reproduce."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from functools import cache
from importlib import resources

import pytest

from controller.estimator.errors import SpecError, UnreadFamily
from controller.estimator.model import parse_config
from controller.estimator.presets import (
    hand_read_preset_names,
    load_preset,
    preset_names,
    read_by_hand,
)
from tests.unit.trace_support import require_trace_extra

NAMES = preset_names()
HAND = hand_read_preset_names()
GENERIC = [n for n in NAMES if n not in HAND]
EXACT = [n for n in HAND if load_preset(n).published_params is not None]
APPROX = [n for n in HAND if load_preset(n).published_params is None]
KEYS = {"name", "repo", "family", "published_params", "published_params_note", "config"}
UNITS = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


@cache
def _files() -> dict[str, dict]:
    folder = resources.files("controller.estimator") / "presets"
    return {
        f.name: json.loads(f.read_text(encoding="utf-8"))
        for f in folder.iterdir()
        if f.name.endswith(".json")
    }


def test_at_least_25_presets_covering_the_required_families() -> None:
    assert len(NAMES) >= 25
    assert sorted(NAMES) == NAMES
    required = {
        "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
        "mistral-7b-v0.1", "mistral-nemo-12b", "mixtral-8x7b",
        "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b",
        "qwen2.5-32b", "qwen2.5-72b", "qwen3-0.6b", "qwen3-4b", "qwen3-8b", "qwen3-32b",
        "qwen3-30b-a3b", "gemma-2-2b", "gemma-2-9b", "gemma-2-27b", "gemma-3-1b", "gemma-3-4b",
        "phi-3-mini-4k", "phi-4", "deepseek-v3", "gpt-oss-20b", "gpt-oss-120b",
        "llama-3.1-8b-bnb-4bit",
    }  # fmt: skip
    assert required <= set(NAMES), sorted(required - set(NAMES))


@pytest.mark.parametrize("filename", sorted(_files()))
def test_every_file_is_well_formed(filename: str) -> None:
    data = _files()[filename]
    assert data.keys() >= KEYS
    assert data["name"] == filename.removesuffix(".json")
    assert re.fullmatch(r"[a-z0-9]+(?:[.-][a-z0-9]+)*", data["name"])
    assert re.fullmatch(r"[\w.-]+/[\w.-]+", data["repo"])
    assert data["family"] and data["published_params_note"]
    config = data["config"]
    text = config.get("text_config", config)
    assert config["architectures"] and text["model_type"]
    if data["published_params"] is None:
        assert re.fullmatch(r"\d+(\.\d+)?[KMBT]", data["published_params_approx"])
    else:
        assert type(data["published_params"]) is int and data["published_params"] > 0
        assert "published_params_approx" not in data


def test_loading_is_case_insensitive_cached_and_accepts_the_repo_id() -> None:
    preset = load_preset("llama-3.1-8b")
    assert load_preset("LLaMA-3.1-8B") is preset
    assert load_preset("  Llama-3.1-8b ") is preset
    assert load_preset("meta-llama/Llama-3.1-8B") is preset
    assert preset.repo == "meta-llama/Llama-3.1-8B"
    assert preset.family == "llama"
    assert preset.published_params == 8_030_261_248
    assert preset.published_params_approx is None
    assert preset.note


def test_config_is_read_only_and_config_dict_is_a_plain_copy() -> None:
    preset = load_preset("gemma-3-12b")
    with pytest.raises(TypeError):
        preset.config["hidden_size"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        preset.config["text_config"]["hidden_size"] = 1  # type: ignore[index]
    copy = preset.config_dict()
    copy["text_config"]["hidden_size"] = 1
    assert preset.config["text_config"]["hidden_size"] == 3840
    assert json.loads(json.dumps(preset.config_dict())) == _files()["gemma-3-12b.json"]["config"]


def test_unknown_name_names_the_field_and_suggests_close_names() -> None:
    with pytest.raises(SpecError) as info:
        load_preset("llama-8b")
    error = info.value
    assert error.field == "model.preset"
    text = str(error)
    assert "\n" not in text
    assert text.startswith("model.preset: unknown preset 'llama-8b'; closest: ")
    assert text.endswith("(see `vramgate presets`)")
    closest = text.split("closest: ", 1)[1].removesuffix(" (see `vramgate presets`)").split(", ")
    assert "llama-3.1-8b" in closest
    assert all(name in NAMES for name in closest)


def test_presets_extending_the_name_come_first() -> None:
    """A tester asked for mistral-7b and was offered mixtral-8x7b first."""
    with pytest.raises(SpecError, match=r"closest: mistral-7b-v0\.1, mistral-7b-v0\.3, "):
        load_preset("mistral-7b")


def test_unknown_name_suggests_substring_matches() -> None:
    with pytest.raises(SpecError, match=r"closest: .*qwen3-30b-a3b"):
        load_preset("30b-a3b")


def test_unknown_name_without_any_close_name() -> None:
    with pytest.raises(SpecError) as info:
        load_preset("zzzzzzzz")
    assert str(info.value) == "model.preset: unknown preset 'zzzzzzzz' (see `vramgate presets`)"


@pytest.mark.parametrize("bad", ["", "   ", None, 7])
def test_invalid_name(bad: object) -> None:
    with pytest.raises(SpecError) as info:
        load_preset(bad)  # type: ignore[arg-type]
    assert info.value.field == "model.preset"


def test_presets_of_families_read_generically() -> None:
    """Families without a hand reading have presets of their own (the generic reading's
    accuracy set); the hand-read list is the rest, and only a generic one is refused by the
    pure parser."""
    assert len(GENERIC) >= 12
    assert sorted(HAND + GENERIC) == NAMES
    assert not any(read_by_hand(load_preset(n)) for n in GENERIC)
    families = {load_preset(n).config["model_type"] for n in GENERIC}
    named = {"phi", "gpt_neox", "falcon", "granite", "cohere", "starcoder2", "exaone4", "stablelm"}
    assert named <= families
    with pytest.raises(UnreadFamily):
        parse_config(load_preset(GENERIC[0]).config)


@pytest.mark.parametrize("name", GENERIC)
def test_the_generic_reading_counts_every_generic_presets_parameters(name: str) -> None:
    """The count transformers builds (meta device), which is the published one where the
    model page gives an exact figure (Pythia-6.9B: 6,857,302,016)."""
    require_trace_extra()
    from controller.jobs.profiles import read_shape

    preset = load_preset(name)
    assert read_shape(preset.config, "model.preset").total_params == preset.published_params


@pytest.mark.parametrize("name", EXACT)
def test_parser_reproduces_the_published_count_exactly(name: str) -> None:
    preset = load_preset(name)
    assert parse_config(preset.config).total_params == preset.published_params


def _tolerance(approx: str) -> tuple[int, int]:
    """The figure and how far a count may be from it and still be quoted as that figure."""
    number, unit = Decimal(approx[:-1]), UNITS[approx[-1]]
    value = int(number * unit)
    last_digit = int(Decimal(1).scaleb(number.as_tuple().exponent) * unit)
    return value, max(last_digit // 2, value // 100)


@pytest.mark.parametrize("name", APPROX)
def test_parser_count_rounds_to_the_published_figure(name: str) -> None:
    preset = load_preset(name)
    value, tolerance = _tolerance(preset.published_params_approx or "")
    assert abs(parse_config(preset.config).total_params - value) <= tolerance


def test_approx_tolerance() -> None:
    assert _tolerance("671B") == (671 * 10**9, 6_710_000_000)
    assert _tolerance("20.91B") == (20_910_000_000, 209_100_000)
    assert _tolerance("4B") == (4 * 10**9, 500_000_000)


def test_bnb_preset_carries_the_real_quantization_config() -> None:
    preset = load_preset("llama-3.1-8b-bnb-4bit")
    qc = preset.config["quantization_config"]
    assert qc["quant_method"] == "bitsandbytes"
    assert qc["load_in_4bit"] is True and qc["bnb_4bit_quant_type"] == "nf4"
    assert qc["bnb_4bit_use_double_quant"] is True
    assert "llm_int8_skip_modules" in qc
    shape = parse_config(preset.config)
    assert shape.quantization is not None and shape.quantization.load_in_4bit
    assert shape.total_params == load_preset("llama-3.1-8b").published_params


def test_architecture_specific_fields_are_present() -> None:
    ds = load_preset("deepseek-v3").config
    for key in (
        "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
        "n_routed_experts", "n_shared_experts", "moe_intermediate_size",
        "first_k_dense_replace", "moe_layer_freq", "num_experts_per_tok",
    ):  # fmt: skip
        assert key in ds, key
    for name in ("gpt-oss-20b", "gpt-oss-120b"):
        oss = load_preset(name).config
        assert oss["quantization_config"]["quant_method"] == "mxfp4"
        assert len(oss["layer_types"]) == oss["num_hidden_layers"]
        assert oss["num_local_experts"] > 1 and oss["attention_bias"] is True
    gemma3 = load_preset("gemma-3-4b").config
    assert gemma3["text_config"]["sliding_window"] == 1024
    g270 = load_preset("gemma-3-270m").config
    assert len(g270["layer_types"]) == g270["num_hidden_layers"]
    assert "num_experts" in load_preset("qwen3-30b-a3b").config
    assert load_preset("mixtral-8x7b").config["num_local_experts"] == 8
