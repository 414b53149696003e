"""Estimate a job with the profile its settings name: a formula, or a traced training step.

    est = estimate(load_shape("llama-3.1-8b"), TrainingSettings(profile=Profile.TRACE))

The dispatch lives here, above both `controller.estimator` (the formula profiles) and
`controller.trace` (the trace profile), because the trace is built on the estimator (its
settings, its overheads): with the dispatch inside the estimator, the two would import each
other and the pure core would reach torch. The trace package is imported only when a job asks
for it, since it needs the optional `trace` extra.
"""

from __future__ import annotations

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
    with_load_moment,
)

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
    if settings.profile is Profile.TRACE:
        path = (paths or {}).get("profile", PATHS["profile"])
        return _trace(shape, settings, path, gpus, parallelism)
    return formula_estimate(shape, settings)


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
