"""The training-VRAM estimator: pure functions from a model and settings to bytes.

    shape = parse_config(config_json)            # or load_shape("llama-3.1-8b")
    settings, errors = check_against_model(shape, TrainingSettings(method=Method.QLORA))
    est = formula_estimate(shape, settings)
    est.per_gpu_bytes(2, Parallelism.FSDP)      # what each of 2 GPUs holds

No I/O beyond reading the bundled presets, no Kubernetes: the operator, webhook and CLI call
this and nothing here calls them. Callers estimate through `controller.jobs.profiles.estimate`,
which checks the settings and also reaches the trace profile; this package never imports
`controller.trace`, which is built on it.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from controller.estimator import analytic, calibrated, unsloth
from controller.estimator.context import context_warnings
from controller.estimator.errors import SpecError, SpecErrors
from controller.estimator.load import with_load_moment
from controller.estimator.model import (
    ModelShape,
    canonical_targets,
    parse_config,
    peft_name,
    skip_module_matches,
    skip_module_matches_text,
)
from controller.estimator.model.tower import tower_from_json, with_tower
from controller.estimator.presets import load_preset, preset_names
from controller.estimator.result import Estimate
from controller.estimator.settings import (
    DEFAULT_RANK,
    DEFAULT_SWITCHES,
    MAX_BATCH,
    MAX_GPUS,
    MAX_LORA_RANK,
    MAX_SEQUENCE_LENGTH,
    MAX_TRACE_GPUS,
    PATHS,
    Attention,
    Checkpointing,
    Choice,
    KbitPreparation,
    LoadPath,
    Loss,
    Method,
    Offloading,
    Optimizer,
    Parallelism,
    Precision,
    Profile,
    Switches,
    TrainingSettings,
    build_settings,
    int_in_range,
)
from controller.estimator.storage import static_bytes

__all__ = [
    "DEFAULT_RANK",
    "MAX_BATCH",
    "MAX_GPUS",
    "MAX_LORA_RANK",
    "MAX_SEQUENCE_LENGTH",
    "MAX_TRACE_GPUS",
    "PATHS",
    "Attention",
    "Checkpointing",
    "Choice",
    "Estimate",
    "KbitPreparation",
    "LoadPath",
    "Loss",
    "Method",
    "ModelShape",
    "Offloading",
    "Optimizer",
    "Parallelism",
    "Precision",
    "Profile",
    "SpecError",
    "SpecErrors",
    "Switches",
    "TrainingSettings",
    "build_settings",
    "check_against_model",
    "context_warnings",
    "formula_estimate",
    "int_in_range",
    "load_preset",
    "load_shape",
    "parse_config",
    "peft_name",
    "preset_names",
    "skip_module_matches",
    "skip_module_matches_text",
    "static_bytes",
    "with_load_moment",
]


def load_shape(preset: str) -> ModelShape:
    """The parsed shape of a bundled preset (any spelling `load_preset` accepts)."""
    return _preset_shape(load_preset(preset).name)


@cache
def _preset_shape(name: str) -> ModelShape:
    """Parsed once per process: estimates reuse the shape and its memoised counts. A preset
    warns of nothing its config leaves out (Gemma 3 4B's heads and vocabulary): its shape is
    held to the model's published parameter count (tests/unit/estimator/test_presets.py)."""
    from controller.estimator.presets import load_preset

    preset = load_preset(name)
    shape = parse_config(preset.config, prefix="model.preset")
    if preset.tower is not None:  # counted from its stored figures (no note: see above)
        shape = with_tower(shape, tower_from_json(preset.tower), None)
    return replace(shape, config_warnings=()) if shape.config_warnings else shape


def check_against_model(
    shape: ModelShape, settings: TrainingSettings, paths: dict[str, str] | None = None
) -> tuple[TrainingSettings, list[SpecError]]:
    """Checks that need the model: LoRA target names, 4-bit checkpoints.

    Returns the settings with targets made canonical, and every error found. A sequence
    longer than the model's context is no error: `context_warnings` reports it.
    """
    where = PATHS | (paths or {})
    errors: list[SpecError] = []
    quant = shape.quantization
    if settings.method is Method.FULL and quant is not None and quant.load_in_4bit:
        errors.append(
            SpecError(
                where["method"],
                "full fine-tuning needs a 16-bit checkpoint; this model is pre-quantised to "
                "4-bit (use lora or qlora)",
            )
        )
    if settings.image_tokens and not shape.has_vision_tower:
        errors.append(
            SpecError(
                where["image_tokens"],
                f"applies only to a vision-language model; {shape.model_type} has no vision "
                "tower, so its samples hold no image tokens",
            )
        )
    if settings.is_adapter:
        try:
            targets = canonical_targets(settings.targets, shape, where["targets"])
            if targets != settings.targets:  # settings are immutable: unchanged, kept
                settings = replace(settings, targets=targets)
        except SpecError as error:
            errors.append(error)
    return settings, errors


def formula_estimate(shape: ModelShape, settings: TrainingSettings) -> Estimate:
    """The estimate of a formula profile (analytic, unsloth, calibrated), for settings that
    `check_against_model` returned (its targets are canonical). The trace profile is not a
    formula: `controller.jobs.profiles.estimate` dispatches to it."""
    if settings.profile is Profile.UNSLOTH:
        est = unsloth.estimate(shape, settings)
    elif settings.profile is Profile.CALIBRATED:
        est = calibrated.estimate(shape, settings)
    elif settings.profile is Profile.TRACE:
        raise ValueError(
            "the trace profile is not a formula; use controller.jobs.profiles.estimate"
        )
    else:
        per_rank = shape.lora_params_per_rank(settings.targets) if settings.is_adapter else 0
        est = analytic.estimate(shape, settings, per_rank)
    if settings.switches is DEFAULT_SWITCHES:  # the common case, at no cost
        return est
    return with_load_moment(est, settings)
