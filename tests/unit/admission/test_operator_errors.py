"""The one adapter from vramgate's errors to conditions and kopf's retries."""

from __future__ import annotations

import pytest

from controller.admission.failures import PROFILE_RETRY_S, TEMPORARY_REASONS, failure_of
from controller.agent.publisher import PublishError
from controller.agent.readings import BackendError
from controller.agent.settings import SettingsError
from controller.api import conditions as cond
from controller.base.errors import (
    ConfigMapUnavailable,
    DeploymentError,
    PermanentError,
    ProfileUnavailable,
    TemporaryError,
    VramgateError,
)
from controller.estimator import SpecError, SpecErrors
from controller.operator.run import StartupError


def test_a_spec_error_is_recorded_as_invalid_spec_and_never_retried() -> None:
    errors = SpecErrors([SpecError("spec.lora.rank", "must be set"), SpecError("spec.x", "no")])
    failure = failure_of(errors, temporary_retry_s=7)
    assert failure.reason == cond.REASON_INVALID_SPEC and failure.retry_s is None
    assert failure.message == "spec.lora.rank: must be set; spec.x: no"
    assert not failure.is_bug


def test_any_permanent_error_is_an_invalid_spec() -> None:
    class Untraceable(PermanentError):
        pass

    failure = failure_of(Untraceable("model_type 'x' cannot be traced"), temporary_retry_s=7)
    assert (failure.reason, failure.retry_s) == (cond.REASON_INVALID_SPEC, None)


def test_an_unreadable_configmap_is_retried_after_the_temporary_delay() -> None:
    failure = failure_of(
        ConfigMapUnavailable("spec.model.configMapRef.name: gone"), temporary_retry_s=7
    )
    assert failure.reason == cond.REASON_CONFIGMAP_UNAVAILABLE
    assert (failure.message, failure.retry_s) == ("spec.model.configMapRef.name: gone", 7)


def test_a_missing_profile_waits_for_a_redeployment() -> None:
    failure = failure_of(ProfileUnavailable("trace needs the `trace` extra"), temporary_retry_s=7)
    assert failure.reason == cond.REASON_PROFILE_UNAVAILABLE
    assert failure.retry_s == PROFILE_RETRY_S and not failure.is_bug


def test_anything_else_is_a_bug_recorded_once() -> None:
    failure = failure_of(ZeroDivisionError("division by zero"), temporary_retry_s=7)
    assert failure.reason == cond.REASON_ESTIMATION_FAILED and failure.retry_s is None
    assert failure.message == "the estimator failed: ZeroDivisionError: division by zero"
    assert failure.is_bug


def test_a_temporary_error_without_a_reason_is_a_bug_not_a_silent_retry() -> None:
    class Flaky(TemporaryError):
        pass

    assert failure_of(Flaky("later"), temporary_retry_s=7).is_bug


def test_every_reason_it_records_is_a_documented_condition_reason() -> None:
    reasons = {value for name, value in vars(cond).items() if name.startswith("REASON_")}
    assert set(TEMPORARY_REASONS.values()) <= reasons
    assert {cond.REASON_INVALID_SPEC, cond.REASON_PROFILE_UNAVAILABLE} <= reasons


@pytest.mark.parametrize(
    ("error", "branch"),
    [
        (SpecError, PermanentError),
        (SpecErrors, PermanentError),
        (ConfigMapUnavailable, TemporaryError),
        (BackendError, TemporaryError),
        (PublishError, TemporaryError),
        (ProfileUnavailable, DeploymentError),
        (StartupError, DeploymentError),
        (SettingsError, DeploymentError),
    ],
    ids=lambda kind: kind.__name__,
)
def test_every_error_vramgate_raises_has_one_branch(
    error: type[VramgateError], branch: type[VramgateError]
) -> None:
    branches = (PermanentError, TemporaryError, DeploymentError)
    assert issubclass(error, branch)
    assert [b for b in branches if issubclass(error, b)] == [branch]


def test_a_spec_error_is_still_a_value_error() -> None:
    assert issubclass(SpecError, ValueError)
