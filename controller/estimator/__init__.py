"""The training-VRAM estimator: pure functions from a model and settings to bytes.

    shape = parse_config(config_json)            # or load_shape("llama-3.1-8b")
    est = estimate(shape, TrainingSettings(method=Method.QLORA, rank=16))
    est.per_gpu_bytes(2, Parallelism.FSDP)      # what each of 2 GPUs holds

No I/O beyond reading the bundled presets, no Kubernetes: the operator, webhook and CLI call
this and nothing here calls them.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from controller.estimator import analytic, calibrated, unsloth
from controller.estimator.architecture import ModelShape, canonical_targets, parse_config
from controller.estimator.errors import SpecError, SpecErrors
from controller.estimator.result import Estimate
from controller.estimator.settings import (
    PATHS,
    Attention,
    Checkpointing,
    Method,
    Optimizer,
    Parallelism,
    Precision,
    Profile,
    TrainingSettings,
    build_settings,
)

__all__ = [
    "Attention",
    "Checkpointing",
    "Estimate",
    "Method",
    "ModelShape",
    "Optimizer",
    "Parallelism",
    "Precision",
    "Profile",
    "SpecError",
    "SpecErrors",
    "TrainingSettings",
    "build_settings",
    "check_against_model",
    "estimate",
    "load_shape",
    "parse_config",
]


def load_shape(preset: str) -> ModelShape:
    """The parsed shape of a bundled preset (any spelling `load_preset` accepts)."""
    from controller.estimator.presets import load_preset

    return _preset_shape(load_preset(preset).name)


@cache
def _preset_shape(name: str) -> ModelShape:
    """Parsed once per process: estimates reuse the shape and its memoised counts."""
    from controller.estimator.presets import load_preset

    return parse_config(load_preset(name).config, prefix="model.preset")


def check_against_model(
    shape: ModelShape, settings: TrainingSettings, paths: dict[str, str] | None = None
) -> tuple[TrainingSettings, list[SpecError]]:
    """Checks that need the model: context length, LoRA target names, 4-bit checkpoints.

    Returns the settings with targets made canonical, and every error found.
    """
    where = PATHS | (paths or {})
    errors: list[SpecError] = []
    limit = shape.max_position_embeddings
    if limit is not None and settings.seq_len > limit:
        errors.append(
            SpecError(
                where["seq_len"],
                f"must be less than or equal to the model's context length ({limit}), "
                f"got {settings.seq_len}",
            )
        )
    quant = shape.quantization
    if settings.method is Method.FULL and quant is not None and quant.load_in_4bit:
        errors.append(
            SpecError(
                where["method"],
                "full fine-tuning needs a 16-bit checkpoint; this model is pre-quantised to "
                "4-bit (use lora or qlora)",
            )
        )
    if settings.is_adapter:
        try:
            targets = canonical_targets(settings.targets, shape, where["targets"])
            settings = replace(settings, targets=targets)
        except SpecError as error:
            errors.append(error)
    return settings, errors


def estimate(shape: ModelShape, settings: TrainingSettings) -> Estimate:
    """The estimate of the profile the settings name. Raises SpecErrors on invalid input."""
    settings, errors = check_against_model(shape, settings)
    if errors:
        raise SpecErrors(errors)
    if settings.profile is Profile.UNSLOTH:
        return unsloth.estimate(shape, settings)
    if settings.profile is Profile.CALIBRATED:
        return calibrated.estimate(shape, settings)
    if settings.profile is Profile.TRACE:
        return _trace(shape, settings)
    per_rank = shape.lora_params_per_rank(settings.targets) if settings.is_adapter else 0
    return analytic.estimate(shape, settings, per_rank)


def _trace(shape: ModelShape, settings: TrainingSettings) -> Estimate:
    """The `trace` profile, imported only when asked for: it needs torch (the `trace` extra)."""
    try:
        from controller.trace import TraceUnsupported
        from controller.trace import estimate as trace_estimate
    except ImportError as error:
        raise SpecError(
            PATHS["profile"],
            f"trace needs the `trace` extra (pip install 'vramgate[trace]'): {error}",
        ) from None
    if shape.source is None:
        raise SpecError(PATHS["profile"], "trace needs the model's config.json")
    try:
        return trace_estimate(shape.source, settings)
    except TraceUnsupported as error:
        raise SpecError(PATHS["profile"], f"trace: {error}") from None
