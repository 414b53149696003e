"""Profile dispatch: formulas from the estimator, the trace only when asked for and installed."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from controller.base.errors import ProfileUnavailable
from controller.estimator import (
    Profile,
    SpecError,
    SpecErrors,
    TrainingSettings,
    check_against_model,
    formula_estimate,
    load_shape,
)
from controller.jobs.profiles import estimate
from controller.jobs.spec import SPEC_PATHS
from tests.unit.trace_support import require_trace_extra

LLAMA = load_shape("llama-3.1-8b")


@pytest.mark.parametrize("profile", [Profile.ANALYTIC, Profile.UNSLOTH, Profile.CALIBRATED])
def test_a_formula_profile_is_the_estimators_formula(profile: Profile) -> None:
    settings = TrainingSettings(profile=profile)
    checked, _ = check_against_model(LLAMA, settings)
    assert estimate(LLAMA, settings) == formula_estimate(LLAMA, checked)
    assert estimate(LLAMA, settings).profile == profile.value


def test_settings_the_model_refuses_raise_every_error_at_the_given_paths() -> None:
    with pytest.raises(SpecErrors, match=r"^spec\.lora\.targetModules: unknown module 'nope'"):
        estimate(LLAMA, TrainingSettings(targets=("nope",)), SPEC_PATHS)


def test_the_trace_without_its_extra_is_unavailable_not_a_spec_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "controller.trace", None)  # as if torch were missing
    settings = TrainingSettings(profile=Profile.TRACE)
    with pytest.raises(ProfileUnavailable) as caught:
        estimate(LLAMA, settings, SPEC_PATHS)
    assert str(caught.value).startswith(
        "spec.estimator.profile: trace needs the `trace` extra (pip install 'vramgate[trace]')"
    )
    assert not isinstance(caught.value, ValueError)


def test_the_trace_needs_the_models_config() -> None:
    require_trace_extra()  # without it, the trace profile is unavailable before it reads a shape
    shapeless = replace(LLAMA, source=None)
    with pytest.raises(SpecError, match=r"^estimator\.profile: trace needs the model's config"):
        estimate(shapeless, TrainingSettings(profile=Profile.TRACE))


def test_the_estimator_alone_refuses_the_trace_profile() -> None:
    with pytest.raises(ValueError, match="not a formula"):
        formula_estimate(LLAMA, TrainingSettings(profile=Profile.TRACE))
