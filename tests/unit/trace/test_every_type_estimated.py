"""Every causal-LM and image-text-to-text model type of the installed transformers, estimated.

Each type's own default config (`test_inventory_all_types.default_config`, with its fixes) is
cut to two decoder layers and estimated twice, as a job of that model would be: by the
operator's default profile (calibrated, through `read_shape` and `estimate`: the hand reading
of its family, else the generic reading of the built model) and by the trace profile's own
estimate of the config (LoRA, batch 1, 16 tokens, no checkpointing). Both must count the
parameters transformers reports for the model built on the meta device with the class the
operator builds the config with (`inventory.auto_class_for`: a type both mappings list is
one job, built as a vision-language model where its config has a vision tower). A type that
cannot be estimated here is a strict xfail with why; once it can, the test says so and the
entry goes. Default configs are full-width (Qwen2.5-VL's text model is 8,192 wide, its 2
layers 7.3B parameters with the tower): a trace takes 1-5 s, Gemma 3n's text model, traced
at its own depth (35 layers: its KV-shared layers), about a minute.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.unit.trace_support import require_trace_extra

require_trace_extra()

from controller.estimator import Profile, TrainingSettings  # noqa: E402
from controller.estimator.settings import Checkpointing, Method  # noqa: E402
from controller.jobs.profiles import estimate, read_shape  # noqa: E402
from controller.trace import estimate as trace_estimate  # noqa: E402
from controller.trace.inventory import (  # noqa: E402
    auto_class_for,
    build_meta_model,
    cut_layers,
    mapping,
)
from tests.unit.trace.test_inventory_all_types import (  # noqa: E402
    CANNOT_BUILD,
    CAUSAL,
    OWN_DEPTH,
    VLM,
    _merge,
    default_config,
)

#: The trace's job: the cheapest step that runs every module of the language model (no
#: checkpointing: its recomputation doubles the forward's ops, and a few classes refuse it).
TRACED = TrainingSettings(
    profile=Profile.TRACE,
    method=Method.LORA,
    batch=1,
    seq_len=16,
    gradient_checkpointing=Checkpointing.OFF,
)
DEFAULT = TrainingSettings(profile=Profile.CALIBRATED, method=Method.LORA, seq_len=16)

#: Fields set on the two-layer job config: a default that a two-layer model cannot keep.
JOB_FIXES: dict[str, dict[str, Any]] = {
    # three dense layers before the MoE ones: in two layers, one dense, one MoE
    "deepseek_v3": {"first_k_dense_replace": 1},
    "kimi_k25": {"text_config": {"first_k_dense_replace": 1}},
}

#: Targets for the types whose all-linear LoRA vramgate refuses, since PEFT would fail on a
#: linear all-linear selects (`canonical_targets`): Llama 4's and PhiMoE's routers return a
#: tuple, Mamba mixers' out_proj and conv1d take no LoRA.
LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "llama4": ("q_proj", "v_proj"),
    "llama4_text": ("q_proj", "v_proj"),
    "falcon_h1": ("q_proj", "in_proj"),
    "nemotron_h": ("in_proj", "up_proj"),
    "nemotron_h_omni": ("in_proj", "up_proj"),
    # PEFT refuses LoRA on a Mamba mixer's out_proj and conv1d, which all-linear selects
    "mamba": ("in_proj",),
    "mamba2": ("in_proj",),
    "falcon_mamba": ("in_proj",),
    # PEFT's LoRA on its router fails on the tuple it returns, as on Llama 4's: vramgate
    # refuses all-linear for it
    "phimoe": ("q_proj", "v_proj"),
}

_DEPTH_ELSEWHERE = (
    "the cut does not reach the decoder transformers builds (test_inventory_all_types' "
    "NOT_CUT): the generic reading needs the model at the config's own depth"
)
_LAYER_SPLIT = (
    "its config validates a split of the layers against num_hidden_layers, which the "
    "two-layer cut does not rewrite (transformers refuses the cut config)"
)
#: Types whose default profile's estimate does not count what transformers builds, with why.
_HANDED_NO_CKPT = (
    "calibrated hands it to the trace (the generic reading finds no attention module its fits "
    "price), and its class does not support activation checkpointing, which the default "
    "settings turn on: the trace refuses it in one line"
)
ESTIMATE_FAILS: dict[str, str] = {
    **dict.fromkeys(("cpmant", "openai-gpt", "xlm", "xlnet", "pix2struct"), _HANDED_NO_CKPT),
    "udop": "calibrated hands it to the trace (no attention module its fits price), and its "
    "default config lacks decoder_start_token_id, which its forward reads",
    **dict.fromkeys(("blt", "hrm_text", "pi0", "pi05"), _DEPTH_ELSEWHERE),
    **dict.fromkeys(("dory", "kolibri1_1"), _LAYER_SPLIT),
    "olmo_hybrid": "its two first layers hold no attention layer, which its config refuses",
    "qwen3_next": "calibrated fits qwen3_next stacks that end on an attention layer; the "
    "two-layer cut ends on a DeltaNet one (analytic and the trace price it)",
    "nemotron_h_omni": "read by hand as its text model, which it counts exactly: the vision "
    "tower and projector are not counted",
}

_NEEDS_IMAGES = (
    "its forward needs the image input (pixel values or their features): the language model "
    "is conditioned on them and does not run on text alone"
)
_DATA_DEPENDENT = (
    "its forward reads a tensor's value (aten._local_scalar_dense), which fake tensors have not"
)
_EXPERT_LOOP = (
    "its experts loop over the experts the router picked, which fake tensors cannot trace "
    "(the trace refuses it in one line)"
)
_MROPE = (
    "its default config's mrope_section (8, 12, 12) does not split its rotary width: "
    "transformers' own forward fails on it"
)
#: Types the trace cannot estimate here, with why.
TRACE_FAILS: dict[str, str] = {
    **dict.fromkeys(
        (
            "blip",
            "blip-2",
            "instructblip",
            "instructblipvideo",
            "idefics",
            "kosmos-2",
            "pix2struct",
            "vision-encoder-decoder",
        ),
        _NEEDS_IMAGES,
    ),
    "molmo2": "its forward needs mm_token_type_ids in training (which positions are images)",
    **dict.fromkeys(
        ("florence2", "xlm", "qianfan_ocr", "inkling_mm_model", "blt"), _DATA_DEPENDENT
    ),
    **dict.fromkeys(
        ("pi0", "pi05"),
        "a robot policy: PEFT's causal-LM wrapper calls prepare_inputs_for_generation, which "
        "its class lacks",
    ),
    **dict.fromkeys(("doge", "jetmoe", "kimi_k25", "nemotron_h_omni"), _EXPERT_LOOP),
    **dict.fromkeys(("glm4v", "glm46v", "glm4v_moe", "glmga"), _MROPE),
    **dict.fromkeys(("dory", "kolibri1_1"), _LAYER_SPLIT),
    "olmo_hybrid": ESTIMATE_FAILS["olmo_hybrid"],
    "moss_transcribe_diarize": "traced as its text model (a hand-read family): the audio "
    "tower is not built",
    "deepseek_v2": "its default moe_intermediate_size (1407) makes grouped_mm's strides "
    "unaligned (a multiple of 16 bytes is needed), as on a GPU",
    "deepseek_v4": "transformers' forward fails on its default config cut to two layers "
    "(a broadcast of 8192 positions against its compressed attention)",
    "diffusion_gemma": "a block-diffusion model: its training forward calls "
    "prepare_inputs_for_generation, which its class lacks",
    "gemma4_unified_assistant": "a draft model: its forward needs the main model's embeddings "
    "and shared KV states",
    "git": "its loss drops the logits of the image tokens it expects before the text",
    "hunyuan_vl": "transformers' forward fails on a text-only batch (a None where its "
    "image grid is expected)",
    "qwen2_5_omni_thinker": "its default config lacks vision_start_token_id, which its "
    "forward reads",
    "qwen3_omni_moe_thinker": "PEFT's all-linear reaches its audio tower, whose encoder layer "
    "PEFT refuses as a target",
    "reformer": "in training its sequences must be exactly prod(axial_pos_shape) = 4096 tokens",
    "step3p7": "its default config leaves sliding_window unset, which its attention reads",
    "udop": "its default config lacks decoder_start_token_id, which its forward reads",
    "xlnet": "its forward mixes bf16 and fp32 tensors (it builds fp32 positions)",
    "xmod": "its forward needs a language set (XmodPreTrainedModel.set_default_language)",
    "pp_formulanet": "its class does not expose its input embeddings (get_input_embeddings), "
    "which PEFT needs",
}


def job_config(model_type: str) -> dict[str, Any]:
    """The type's default config (fixed where it must be), cut to two decoder layers (at its
    own depth where a cut cannot build), as the config.json a job would carry."""
    from transformers import AutoConfig

    raw = default_config(model_type)
    raw.pop("model_type", None)
    cfg = AutoConfig.for_model(model_type, **raw)
    if model_type not in OWN_DEPTH:
        cfg = cut_layers(cfg, 2)
    config = cfg.to_dict()
    config.pop("transformers_version", None)
    if model_type not in OWN_DEPTH:
        for where in (config, config.get("text_config") or {}):
            _cut_per_layer_config(where, 2)
    return _merge(config, JOB_FIXES.get(model_type, {}))


def _cut_per_layer_config(config: dict[str, Any], layers: int) -> None:
    """A per-layer override table keyed by layer index (transformers' heterogeneous configs:
    Gemma 4's wider heads on some layers) cut with the depth, as transformers refuses an
    index past it when it reads the config back."""
    table = config.get("per_layer_config")
    if isinstance(table, dict):
        config["per_layer_config"] = {k: v for k, v in table.items() if int(k) < layers}


def _types() -> list[str]:
    return sorted(set(mapping(CAUSAL)) | set(mapping(VLM)))


def _cases(fails: dict[str, str]) -> list[Any]:
    cases = []
    for model_type in _types():
        reason = CANNOT_BUILD.get(model_type) or fails.get(model_type)
        marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
        cases.append(pytest.param(model_type, marks=marks, id=model_type))
    return cases


def _meta_params(config: dict[str, Any]) -> int:
    """What transformers reports for the model the operator builds `config` as."""
    model_type = config["model_type"]
    model, _, _, _ = build_meta_model(config, auto=auto_class_for(model_type, config))
    return int(model.num_parameters())


def _settings(model_type: str, settings: TrainingSettings) -> TrainingSettings:
    targets = LORA_TARGETS.get(model_type)
    return replace(settings, targets=targets) if targets else settings


@pytest.mark.parametrize("model_type", _cases(ESTIMATE_FAILS))
def test_the_default_profile_counts_what_transformers_builds(model_type: str) -> None:
    config = job_config(model_type)
    est = estimate(read_shape(config), _settings(model_type, DEFAULT))
    assert est.total_bytes > 0 and sum(est.components.values()) == est.total_bytes
    assert est.trainable_params > 0  # the adapters, which the total counts too
    assert est.total_params - est.trainable_params == _meta_params(config)


@pytest.mark.parametrize("model_type", _cases(TRACE_FAILS))
def test_the_trace_counts_what_transformers_builds(model_type: str) -> None:
    config = job_config(model_type)
    est = trace_estimate(config, _settings(model_type, TRACED))
    assert est.total_bytes > 0 and est.trainable_params > 0
    assert est.total_params - est.trainable_params == _meta_params(config)


def test_the_tables_name_real_types() -> None:
    listed = set(_types())
    for table in (ESTIMATE_FAILS, TRACE_FAILS, JOB_FIXES, LORA_TARGETS):
        assert set(table) <= listed, set(table) - listed
