"""Estimate a job with the profile its settings name: a formula, or a traced training step.

    est = estimate(load_shape("llama-3.1-8b"), TrainingSettings(profile=Profile.TRACE))

The dispatch lives here, above both `controller.estimator` (the formula profiles) and
`controller.trace` (the trace profile), because the trace is built on the estimator (its
settings, its overheads): with the dispatch inside the estimator, the two would import each
other and the pure core would reach torch. The trace package is imported only when a job asks
for it, since it needs the optional `trace` extra.
"""

from __future__ import annotations

import contextlib
import importlib
import marshal
import threading
from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from typing import Any

from controller.base.errors import ProfileUnavailable
from controller.estimator import (
    PATHS,
    Estimate,
    ModelShape,
    Parallelism,
    Profile,
    SpecError,
    SpecErrors,
    TrainingSettings,
    check_against_model,
    formula_estimate,
    load_preset,
    load_shape,
    with_load_moment,
)
from controller.estimator.errors import UnreadFamily
from controller.estimator.model import parse_config
from controller.estimator.model.generic import shape_from_inventory
from controller.estimator.model.tower import states_tower, with_tower, without_tower
from controller.estimator.presets import read_by_hand

#: How to install the trace profile, as its error says it.
TRACE_EXTRA = "pip install 'vramgate[trace]'"


def estimate(
    shape: ModelShape,
    settings: TrainingSettings,
    paths: dict[str, str] | None = None,
    gpus: int = 1,
    parallelism: Parallelism = Parallelism.FSDP,
) -> Estimate:
    """The estimate of the profile `settings.profile` names.

    `gpus` and `parallelism` are the job's spread: the trace profile traces one rank of an
    FSDP or DDP job at that world size, so that the estimate's per-GPU figure there is the
    traced rank's (the formula profiles spread by rule and ignore them).

    Raises SpecErrors when the settings do not suit the model, SpecError when the trace
    profile cannot trace it, and ProfileUnavailable when the trace extra is not installed;
    `paths` overrides the field paths errors name, as in `build_settings`.
    """
    settings, errors = check_against_model(shape, settings, paths)
    if errors:
        raise SpecErrors(errors)
    path = (paths or {}).get("profile", PATHS["profile"])
    if settings.profile is Profile.TRACE:
        return _trace(shape, settings, path, gpus, parallelism)
    if settings.profile is Profile.CALIBRATED and calibrated_hands_to_trace(shape):
        if not trace_extra_installed():
            raise ProfileUnavailable(
                f"{path}: calibrated has no fit for {shape.model_type}'s "
                f"{', '.join(shape.unpriced_mixers)} layers and hands such a job to the trace "
                f"profile, which needs the `trace` extra ({TRACE_EXTRA})"
            )
        return _trace(shape, replace(settings, profile=Profile.TRACE), path, gpus, parallelism)
    return formula_estimate(shape, settings)


def calibrated_hands_to_trace(shape: ModelShape) -> bool:
    """Whether the calibrated profile hands a job on `shape` to the trace: a family read
    generically whose layers mix tokens by something other than softmax attention (Mamba's
    and RWKV's recurrences, linear attention, short convolutions; `ModelShape.unpriced_mixers`).
    The dense and MoE fits price attention blocks; their per-layer constants say nothing of
    a state space's scan, so the trace measures what they would guess. The estimate that
    comes back is the trace's (profile "trace"), and the shape's note says why."""
    return bool(shape.unpriced_mixers)


def _trace(
    shape: ModelShape,
    settings: TrainingSettings,
    path: str,
    gpus: int = 1,
    parallelism: Parallelism = Parallelism.FSDP,
) -> Estimate:
    try:
        from controller.trace import TraceUnsupported
        from controller.trace import estimate as trace_estimate
    except ImportError as error:
        raise ProfileUnavailable(
            f"{path}: trace needs the `trace` extra ({TRACE_EXTRA}): {error}"
        ) from None
    if shape.source is None:
        raise SpecError(path, "trace needs the model's config.json")
    try:
        return with_load_moment(trace_estimate(shape.source, settings, gpus, parallelism), settings)
    except TraceUnsupported as error:
        raise SpecError(path, f"trace: {error}") from None


#: Generic shapes kept by their config's content (as `parse_config` keeps hand-read ones):
#: reading one builds the model on the meta device (0.03 s for most; seconds for the first,
#: which imports transformers).
GENERIC_SHAPES = 64


def trace_extra_installed() -> bool:
    """Whether the trace extra's packages are importable (found, not imported: cheap)."""
    from importlib.util import find_spec

    return all(find_spec(name) is not None for name in ("torch", "transformers", "peft"))


def read_shape(config: Mapping[str, Any], prefix: str = "") -> ModelShape:
    """The shape of `config`: the hand reading of its family (`parse_config`), or, for a
    family no hand reading reads, the generic reading of the model transformers builds
    (`model.generic`), where the trace extra is installed. Without it the refusal stays and
    says that the extra would read the config; a type transformers does not build (remote
    code) is refused in one line. A hand-read multimodal config's towers (`model.tower`) are
    read from the built model too, with the extra; without it the shape says they are not
    counted. Blocking (it may import torch): never on an event loop."""
    try:
        shape = parse_config(config, prefix=prefix)
    except UnreadFamily as refusal:
        return _generic_shape(config, prefix, refusal)
    if not states_tower(config):
        return shape
    try:
        blob: bytes | None = marshal.dumps(config, 2)  # type: ignore[arg-type]
    except ValueError:
        blob = None
    if blob is None:
        return _with_towers(shape, config, prefix)
    return _towers_marshalled(blob, prefix)


@lru_cache(maxsize=GENERIC_SHAPES)
def _towers_marshalled(blob: bytes, prefix: str) -> ModelShape:
    """`_with_towers`, kept by the config's content (as `parse_config` keeps the hand
    reading, which this reads again from its own cache)."""
    config = marshal.loads(blob)
    return _with_towers(parse_config(config, prefix=prefix), config, prefix)


def _with_towers(shape: ModelShape, config: Mapping[str, Any], prefix: str) -> ModelShape:
    """The hand reading `shape` of the multimodal `config` with its towers read from the model
    transformers builds (`trace.towers`), or said to be left out: without the trace extra,
    or where transformers cannot build the config (the text reading still answers)."""
    where = prefix or "config"
    if not trace_extra_installed():
        return without_tower(shape, where)
    from controller.trace.build import TraceUnsupported
    from controller.trace.towers import read_tower

    try:
        tower = read_tower(config)
    except TraceUnsupported as error:
        return without_tower(
            shape, where, f"only the language model is counted: its towers are not ({error})"
        )
    return with_tower(shape, tower, where)


def preset_shape(name: str) -> ModelShape:
    """The shape of the bundled preset `name` (any spelling `load_preset` accepts): its hand
    reading (`load_shape`), or for a family read generically, the generic reading of its
    config (`read_shape`, which needs the trace extra and says so without it)."""
    preset = load_preset(name)
    if read_by_hand(preset):
        return load_shape(preset.name)
    return read_shape(preset.config, prefix="model.preset")


def _generic_shape(config: Mapping[str, Any], prefix: str, refusal: UnreadFamily) -> ModelShape:
    try:
        from controller.trace.build import TraceUnsupported
        from controller.trace.inventory import ConfigFieldError, read_inventory
    except ImportError:
        raise UnreadFamily(
            refusal.field,
            f"{refusal.message}; the trace extra ({TRACE_EXTRA}) reads any model "
            "transformers builds",
        ) from None
    try:
        blob: bytes | None = marshal.dumps(config, 2)  # type: ignore[arg-type]
    except ValueError:
        blob = None
    try:
        if blob is None:
            return shape_from_inventory(read_inventory(config), config, prefix)
        return _generic_marshalled(blob, prefix)
    except ConfigFieldError as error:
        raise SpecError(f"{prefix or 'config'}.{error.field}", error.message) from None
    except TraceUnsupported as error:
        raise SpecError(refusal.field, str(error)) from None


def warm_generic_reading() -> threading.Thread | None:
    """Import the generic reading (transformers and torch: seconds) on a thread of its own,
    where the trace extra is installed, so the first review of a family without a hand
    reading does not wait for it on the webhook's loop (`check_generic_type` is a lookup
    once they are imported). The thread, or None without the extra."""
    if not trace_extra_installed():
        return None

    def load() -> None:
        with contextlib.suppress(Exception):  # an import that fails now fails later, named
            importlib.import_module("controller.trace.inventory")

    thread = threading.Thread(target=load, name="vramgate-warm-generic", daemon=True)
    thread.start()
    return thread


def check_generic_type(config: Mapping[str, Any], refusal: UnreadFamily) -> None:
    """Refuse at once (SpecError at the refusal's field) a config whose model_type the
    installed transformers does not build, in the inventory's own words: a lookup in its
    mappings, no model built, so the webhook can say it at apply time instead of the operator
    later. Needs the trace extra (the caller checks `trace_extra_installed`)."""
    from controller.trace.build import TraceUnsupported
    from controller.trace.inventory import check_model_type

    try:
        check_model_type(config)
    except TraceUnsupported as error:
        raise SpecError(refusal.field, str(error)) from None


@lru_cache(maxsize=GENERIC_SHAPES)
def _generic_marshalled(blob: bytes, prefix: str) -> ModelShape:
    from controller.trace.inventory import read_inventory

    config = marshal.loads(blob)
    return shape_from_inventory(read_inventory(config), config, prefix)
