"""The towers of hand-read multimodal models: read from the model transformers builds, added
to the hand reading of the language model, priced as the generic reading prices them, and
stored in the presets that have one (held here to transformers' own build).

A small LLaVA (2 text layers 128 wide, a 2-layer CLIP tower 64 wide) builds on the meta
device in a fraction of a second.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.unit.trace_support import require_trace_extra

require_trace_extra()

from controller.estimator import Profile, TrainingSettings, load_shape  # noqa: E402
from controller.estimator.model import parse_config  # noqa: E402
from controller.estimator.model.tower import (  # noqa: E402
    TOWER_NOTE,
    states_tower,
    tower_from_json,
    tower_to_json,
)
from controller.estimator.presets import hand_read_preset_names, load_preset  # noqa: E402
from controller.estimator.settings import Method  # noqa: E402
from controller.jobs.profiles import estimate, read_shape  # noqa: E402
from controller.trace.inventory import build_meta_model  # noqa: E402
from controller.trace.towers import main, read_tower  # noqa: E402

RANK = 8
TOWER_PRESETS = [n for n in hand_read_preset_names() if load_preset(n).tower is not None]


def small_llava(**outer: Any) -> dict[str, Any]:
    """LLaVA's default config at a small width: a Llama text model, a CLIP tower, a
    two-linear projector (`multi_modal_projector.linear_1`, `linear_2`)."""
    from transformers import AutoConfig

    text = {
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1024,
    }
    vision = {
        "model_type": "clip_vision_model",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 56,
        "patch_size": 14,
        "projection_dim": 64,
    }
    config = AutoConfig.for_model("llava", text_config=text, vision_config=vision, **outer)
    out = config.to_dict()
    out.pop("transformers_version", None)
    return out


def _meta_params(config: dict[str, Any]) -> int:
    return int(build_meta_model(config)[0].num_parameters())


def _settings(method: Method, **fields: Any) -> TrainingSettings:
    fields = {"seq_len": 32, "profile": Profile.CALIBRATED} | fields
    return TrainingSettings(method=method, rank=RANK, **fields)


def test_the_hand_reading_counts_the_tower_transformers_builds() -> None:
    config = small_llava()
    text = parse_config(config)
    shape = read_shape(config)
    assert shape.total_params == _meta_params(config) > text.total_params
    # the language model's own figures are the hand reading's
    assert shape.layers == text.layers and shape.embedding_params == text.embedding_params
    assert shape.lm_head_params == text.lm_head_params
    # the CLIP tower frozen, its linears named as built; the projector's two linears outer
    assert {lin.name for lin in shape.frozen_linears} >= {"q_proj", "fc1", "fc2", "out_proj"}
    assert [lin.name for lin in shape.outer_linears] == ["linear_1", "linear_2"]
    assert ("config", TOWER_NOTE) in shape.config_warnings


def test_the_tower_is_frozen_and_all_linear_leaves_it_out() -> None:
    config = small_llava()
    shape = read_shape(config)
    frozen = shape.frozen_params + sum(lin.params for lin in shape.frozen_linears)
    full = estimate(shape, _settings(Method.FULL))
    assert full.trainable_params == shape.total_params - frozen
    lora = estimate(shape, _settings(Method.LORA))
    text = parse_config(config)
    projector = sum(lin.lora_params(RANK) for lin in shape.outer_linears)
    assert lora.trainable_params == text.lora_params_per_rank(("all-linear",)) * RANK + projector
    # a target naming the tower's linears adapts them too (PEFT matches names)
    named = estimate(shape, _settings(Method.LORA, targets=("fc1",)))
    tower_fc1 = sum(lin.lora_params(RANK) for lin in shape.frozen_linears if lin.name == "fc1")
    assert tower_fc1 > 0 and named.trainable_params == tower_fc1
    # QLoRA quantises the tower's linears: its weights take less than LoRA's 16-bit ones
    qlora = estimate(shape, _settings(Method.QLORA))
    text_qlora = estimate(text, _settings(Method.QLORA))
    text_lora = estimate(text, _settings(Method.LORA))
    tower_lora = lora.components["weights"] - text_lora.components["weights"]
    tower_qlora = qlora.components["weights"] - text_qlora.components["weights"]
    assert 0 < tower_qlora < tower_lora


def test_the_lm_head_is_tied_as_the_outer_config_ties_it() -> None:
    """Mistral 3's text config says tie_word_embeddings false, its outer config (whose class
    defaults it to true) ties: transformers builds no LM head of its own."""
    from transformers import AutoConfig

    text = {
        "model_type": "mistral",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1024,
        "head_dim": 32,
        "tie_word_embeddings": False,
    }
    vision = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "head_dim": 32,
        "image_size": 56,
        "patch_size": 14,
    }
    config = AutoConfig.for_model("mistral3", text_config=text, vision_config=vision).to_dict()
    config.pop("transformers_version", None)
    assert parse_config(config).lm_head_params > 0  # the hand reading reads the text config's
    shape = read_shape(config)
    assert shape.lm_head_params == 0 and shape.dims.tie_word_embeddings
    assert shape.total_params == _meta_params(config)


def test_a_text_only_config_is_the_hand_reading_itself() -> None:
    config = small_llava()
    text_only = dict(config["text_config"])
    assert not states_tower(text_only)
    assert read_shape(text_only) is parse_config(text_only)


def test_the_read_is_kept_by_the_configs_content() -> None:
    config = small_llava()
    assert read_shape(config) is read_shape(small_llava())


@pytest.mark.parametrize("name", TOWER_PRESETS)
def test_a_presets_stored_tower_is_what_transformers_builds(name: str) -> None:
    preset = load_preset(name)
    assert preset.tower is not None
    stored = tower_from_json(preset.tower)
    built = read_tower(preset.config_dict())
    assert replace(stored, source="") == replace(built, source="")
    # the whole model, counted without the trace extra, is transformers' count
    assert load_shape(name).total_params == _meta_params(preset.config_dict())


def test_every_hand_read_preset_with_a_tower_stores_it() -> None:
    stated = [n for n in hand_read_preset_names() if states_tower(load_preset(n).config)]
    assert stated == TOWER_PRESETS and {"gemma-3-4b", "gemma-3-12b"} <= set(stated)


def test_the_command_prints_the_json_a_preset_stores(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["gemma-3-4b"]) == 0
    printed = json.loads(capsys.readouterr().out)
    stored = dict(load_preset("gemma-3-4b").tower or {})
    assert tower_from_json(printed) == replace(tower_from_json(stored), source=printed["source"])
    assert tower_to_json(tower_from_json(printed)) == printed
