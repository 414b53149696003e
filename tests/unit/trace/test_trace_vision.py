"""The trace of a vision-language model: built whole, its vision tower frozen as the generic
reading keeps it, the step run on text through the language model; image tokens per sample.

A small Qwen2.5-VL (10 text layers 128 wide, a 2-block vision tower 64 wide) traces in about a
second; its figures are compared with the model transformers builds on the meta device and
with the generic formula reading of the same config.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.trace_support import require_trace_extra

require_trace_extra()

from controller.estimator import Profile, SpecErrors, TrainingSettings  # noqa: E402
from controller.estimator.settings import Checkpointing, Method  # noqa: E402
from controller.jobs.profiles import estimate, read_shape  # noqa: E402
from controller.jobs.spec import translate  # noqa: E402
from controller.trace import trace  # noqa: E402
from controller.trace.build import build_model, vision_language, vision_tower  # noqa: E402
from controller.trace.inventory import build_meta_model, read_inventory  # noqa: E402
from tests.unit.trace_support import TINY_LLAMA  # noqa: E402

RANK = 8
LAYERS = 10


def small_vlm(layers: int = LAYERS) -> dict[str, Any]:
    """Qwen2.5-VL's default config at a small width and `layers` text layers."""
    from transformers import AutoConfig

    text = {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1024,
        "max_window_layers": layers,
        "layer_types": ["full_attention"] * layers,
        # half the head width (32 / 2), split into temporal, height and width positions
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]},
        "bos_token_id": 0,
        "eos_token_id": 1,
    }
    vision = {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "out_hidden_size": 128,
        "fullatt_block_indexes": [1],
    }
    config = AutoConfig.for_model("qwen2_5_vl", text_config=text, vision_config=vision).to_dict()
    config.pop("transformers_version", None)
    return config


def _settings(method: Method, **fields: Any) -> TrainingSettings:
    fields = {"seq_len": 32, "profile": Profile.TRACE} | fields
    return TrainingSettings(method=method, rank=RANK, **fields)


def _meta_params(config: dict[str, Any]) -> int:
    return int(build_meta_model(config)[0].num_parameters())


@pytest.mark.parametrize("method", [Method.FULL, Method.LORA])
def test_the_trace_counts_the_whole_model_and_trains_what_the_generic_reading_trains(
    method: Method,
) -> None:
    config = small_vlm(4)
    assert vision_language(config)
    shape = read_shape(config)
    assert shape.has_vision_tower and shape.frozen_params > 0
    traced = estimate(shape, _settings(method))
    formula = estimate(shape, _settings(method, profile=Profile.CALIBRATED))
    adapters = traced.trainable_params if method is Method.LORA else 0
    assert traced.total_params - adapters == _meta_params(config)  # the tower included
    assert traced.trainable_params == formula.trainable_params
    assert traced.total_params == formula.total_params
    inv = read_inventory(config)
    if method is Method.FULL:  # the language model and projector, not the tower
        assert traced.trainable_params == inv.params - inv.vision_params


def test_the_tower_is_frozen_and_kept_out_of_all_linear_but_a_named_target_adapts_it() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    config = small_vlm(2)
    with FakeTensorMode():
        full = build_model(config, _settings(Method.FULL))
        tower = vision_tower(full)
        assert tower is not None
        assert not any(p.requires_grad for p in tower.parameters())
        assert all(p.requires_grad for n, p in full.named_parameters() if ".visual." not in n)

        lora = build_model(config, _settings(Method.LORA))
        adapted = [n for n, p in lora.named_parameters() if p.requires_grad]
        assert adapted and not any(".visual." in n for n in adapted)
        named = build_model(config, _settings(Method.LORA, targets=("qkv",)))
        adapted = [n for n, p in named.named_parameters() if p.requires_grad]
        assert adapted and all(".visual." in n and ".qkv." in n for n in adapted)
    # the generic reading prices the same adapters on the tower's qkv
    shape = read_shape(config)
    traced = estimate(shape, _settings(Method.LORA, targets=("qkv",)))
    assert traced.trainable_params == shape.lora_params_per_rank(("qkv",)) * RANK > 0


def test_qlora_quantises_the_linears_the_generic_reading_counts_4bit() -> None:
    """bitsandbytes quantises the tower's linears too (transformers skips the LM head only):
    the trace's 4-bit linears are the inventory's, tower included."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from controller.estimator.model.inventory import pattern
    from controller.trace.qlora import Linear4bitStorage

    config = small_vlm(2)
    with FakeTensorMode():
        model = build_model(config, _settings(Method.QLORA))
        built = {
            pattern(name.removeprefix("base_model.model.").removesuffix(".base_layer"))
            for name, module in model.named_modules()
            if isinstance(module, Linear4bitStorage)
        }
    inv = read_inventory(config)
    assert built == {g.name for g in inv.linears if g.quantized_4bit}
    assert any(name.startswith("model.visual.") for name in built)
    shape = read_shape(config)
    traced = estimate(shape, _settings(Method.QLORA))
    assert traced.total_params == estimate(shape, _settings(Method.LORA)).total_params


def test_a_deep_vision_language_model_is_extrapolated_from_its_language_models_depth() -> None:
    """The cut applies to the language model (text_config.num_hidden_layers); the tower is
    held whole in both shallow traces, so it is counted once at the model's depth."""
    config = small_vlm()
    settings = _settings(Method.LORA, gradient_checkpointing=Checkpointing.OFF)
    whole = trace(config, settings, layers="full")
    extended = trace(config, settings, layers=4)
    assert extended.traced_layers == (4, 5) and whole.traced_layers == (LAYERS,)
    assert extended.total_params == whole.total_params
    assert extended.total_params - extended.trainable_params == _meta_params(config)
    assert extended.trainable_params == whole.trainable_params
    assert abs(extended.peak_bytes - whole.peak_bytes) <= whole.peak_bytes // 200


# -- image tokens per sample ------------------------------------------------------------------


def test_image_tokens_are_positions_of_the_language_model_in_every_profile() -> None:
    config = small_vlm(2)
    shape = read_shape(config)
    for profile in (Profile.TRACE, Profile.CALIBRATED, Profile.ANALYTIC):
        settings = _settings(Method.LORA, profile=profile)
        text = estimate(shape, settings)
        both = estimate(shape, TrainingSettings(**_fields(settings, seq_len=32, image_tokens=96)))
        as_text = estimate(shape, TrainingSettings(**_fields(settings, seq_len=128)))
        assert both.total_bytes == as_text.total_bytes > text.total_bytes, profile


def _fields(settings: TrainingSettings, **changes: Any) -> dict[str, Any]:
    from dataclasses import fields

    return {f.name: getattr(settings, f.name) for f in fields(settings)} | changes


def test_image_tokens_on_a_model_without_a_vision_tower_are_refused_at_the_field() -> None:
    shape = read_shape(TINY_LLAMA)
    with pytest.raises(SpecErrors) as caught:
        estimate(shape, TrainingSettings(image_tokens=256))
    (error,) = caught.value.errors
    assert str(error).startswith("training.imageTokens: applies only to a vision-language model")
    assert "\n" not in str(error)
    spec = {
        "model": {"config": TINY_LLAMA},
        "method": "LoRA",
        "lora": {"rank": 16},
        "training": {"imageTokens": 256},
    }
    plan, errors = translate(spec)
    assert plan is None
    assert [str(e).split(":")[0] for e in errors] == ["spec.training.imageTokens"]
    negative = spec | {"model": {"config": small_vlm(2)}, "training": {"imageTokens": -1}}
    plan, errors = translate(negative)
    assert [str(e) for e in errors] == [
        "spec.training.imageTokens: must be greater than or equal to 0, got -1"
    ]
    plan, errors = translate(negative | {"training": {"imageTokens": 256}})
    assert plan is not None and plan.settings.image_tokens == 256 and not errors
    assert plan.settings.lm_seq_len == 2048 + 256
