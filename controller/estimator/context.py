"""How long a sequence a model's positions cover, and the warning when a job asks for more.

A sequence longer than the context is not an error: rotary positions are computed, not
looked up, so training past the window runs (and a job may extend the context on purpose).
The memory is estimated all the same, and the user is told.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from controller.estimator.errors import SpecError, shown
from controller.estimator.frameworks import UNKNOWN_FRAMEWORK, framework_notes
from controller.estimator.settings import (
    MAX_SEQUENCE_LENGTH,
    PATHS,
    UNKNOWN_ATTENTION,
    Attention,
    KbitPreparation,
    Method,
    Precision,
    TrainingSettings,
)

if TYPE_CHECKING:
    from controller.estimator.model import ModelShape

#: The `rope_type` (older configs: `type`) values that stretch the window by `factor`
#: (transformers' names; `su` is Phi-3's early name for `longrope`).
SCALED_ROPE_TYPES = frozenset({"linear", "dynamic", "yarn", "llama3", "longrope", "su"})
_ROPE_FIELDS = ("rope_scaling", "rope_parameters")  # transformers 4, transformers 5


def rope_context(config: Mapping[str, Any], prefix: str, max_positions: int | None) -> int | None:
    """The context length of a model config: the longest of `max_positions` and, for each
    scaled rope, `factor` x its original window (`original_max_position_embeddings`, else
    `max_positions`). None when the config states neither.

    Configs write both conventions (Llama 3.1's 131072 is already scaled, a 16k Vicuna's
    4096 is not), so the longer reading wins: a warning too few rather than a wrong one.
    Capped at the longest sequence a job may ask for, so an absurd factor stays an integer.
    """
    top_original = _positive_int(config, "original_max_position_embeddings", prefix)
    contexts = [max_positions] if max_positions is not None else []
    for path, params in _rope_params(config, prefix):
        kind = params.get("rope_type", params.get("type"))
        factor = params.get("factor")
        if kind not in SCALED_ROPE_TYPES or factor is None:
            continue
        factor = _factor(factor, f"{path}.factor")
        original = _positive_int(params, "original_max_position_embeddings", path)
        window = original or top_original or max_positions
        if window is not None:
            contexts.append(int(min(factor * window, MAX_SEQUENCE_LENGTH)))
    return max(contexts) if contexts else None


def context_warnings(
    shape: ModelShape, settings: TrainingSettings, paths: dict[str, str] | None = None
) -> list[str]:
    """One line per setting beyond what the model was built for, at its field path (or
    flag): a sequence longer than the model's context, an attention implementation outside
    the known four (estimated on the quadratic path: `build_settings(any_attention=True)`),
    and what the estimate takes on trust about the trainer (`frameworks.framework_notes`)."""
    where = PATHS | (paths or {})
    lines = []
    unknown = settings.extras.get(UNKNOWN_ATTENTION)
    if unknown is not None:
        lines.append(
            f"{where['attention']}: {shown(unknown)} is none of "
            f"{', '.join(a.value for a in Attention)}; estimated as eager attention (the "
            "quadratic, non-flash path)"
        )
    lines += framework_notes(
        settings.extras.get(UNKNOWN_FRAMEWORK), settings.switches, where["framework"],
        where["switches"], where,
    )  # fmt: skip
    lines += _kbit_note(shape, settings, where)
    limit = shape.context_length
    if limit is None or settings.lm_seq_len <= limit:
        return lines
    if settings.image_tokens:
        said = (
            f"{where['seq_len']} {settings.seq_len} with {where['image_tokens']} "
            f"{settings.image_tokens}: {settings.lm_seq_len} positions are"
        )
    else:
        said = f"{where['seq_len']}: {settings.seq_len} is"
    return [*lines, f"{said} longer than the model's context length ({limit}); estimating anyway"]


def _kbit_note(shape: ModelShape, settings: TrainingSettings, where: dict[str, str]) -> list[str]:
    """A k-bit preparation named for a job it cannot touch: it casts a 4-bit model's other
    parameters, so without 4-bit weights, or in fp32, the switch changes nothing."""
    kind = settings.switches.kbit_preparation
    if kind is KbitPreparation.NONE:
        return []
    quant = shape.quantization
    four_bit = settings.method is Method.QLORA or (
        settings.method is Method.LORA and quant is not None and quant.load_in_4bit
    )
    if four_bit and settings.precision is not Precision.FP32:
        return []
    path = where.get("switches.kbitPreparation", f"{where['switches']}.kbitPreparation")
    why = "the job trains in fp32" if four_bit else "the job's weights are not 4-bit"
    return [f"{path}: {kind.value} changes nothing here ({why}); ignored"]


def _rope_params(config: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each rope parameter set with its path: one flat object, or (transformers 5, Gemma 3)
    one object per attention type."""
    for name in _ROPE_FIELDS:
        value = config.get(name)
        path = f"{prefix}.{name}" if prefix else name
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise SpecError(path, "must be an object")
        if value and all(isinstance(v, Mapping) for v in value.values()):
            yield from ((f"{path}.{key}", params) for key, params in value.items())
        else:
            yield path, value


def _factor(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(path, f"must be a number, got {shown(value)}")
    if not math.isfinite(value) or value <= 0:
        raise SpecError(path, f"must be a positive number, got {value}")
    return float(value)


def _positive_int(config: Mapping[str, Any], name: str, prefix: str) -> int | None:
    value = config.get(name)
    if value is None:
        return None
    path = f"{prefix}.{name}" if prefix else name
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(path, f"must be an integer, got {shown(value)}")
    if value < 1:
        raise SpecError(path, f"must be greater than or equal to 1, got {value}")
    return value
