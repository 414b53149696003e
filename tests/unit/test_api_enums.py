"""The API's CamelCase enum values and the estimator's enums mean the same things."""

from __future__ import annotations

from enum import StrEnum

import pytest

from controller.api import enums as api
from controller.estimator import settings as est
from controller.jobspec import api_value

#: Estimator values the API does not offer, each for a reason (none today).
NOT_IN_API: set[str] = set()

PAIRS: list[tuple[type[StrEnum], type[StrEnum]]] = [
    (api.TrainingMethod, est.Method),
    (api.CheckpointingMode, est.Checkpointing),
    (api.OptimizerName, est.Optimizer),
    (api.AttentionImpl, est.Attention),
    (api.PrecisionName, est.Precision),
    (api.EstimatorProfile, est.Profile),
    (api.ParallelismMode, est.Parallelism),
]


@pytest.mark.parametrize(("api_enum", "estimator_enum"), PAIRS, ids=lambda e: e.__name__)
def test_every_api_value_parses_to_its_own_member(
    api_enum: type[StrEnum], estimator_enum: type[StrEnum]
) -> None:
    parsed = [estimator_enum.parse(v.value, "x") for v in api_enum]  # type: ignore[attr-defined]
    assert len(set(parsed)) == len(parsed), "two API values mean the same member"
    offered = {m for m in estimator_enum if m.value not in NOT_IN_API}
    assert set(parsed) == offered, "an estimator member has no API value (or NOT_IN_API)"


@pytest.mark.parametrize(("api_enum", "estimator_enum"), PAIRS, ids=lambda e: e.__name__)
def test_api_value_is_the_inverse(api_enum: type[StrEnum], estimator_enum: type[StrEnum]) -> None:
    for member in (m for m in estimator_enum if m.value not in NOT_IN_API):
        value = api_value(api_enum, member)
        assert estimator_enum.parse(value.value, "x") is member  # type: ignore[attr-defined]


def test_api_values_are_camel_case() -> None:
    for api_enum, _ in PAIRS:
        for member in api_enum:
            assert member.value[0].isupper() and "_" not in member.value and "-" not in member.value


def test_savable_modules_are_the_estimators() -> None:
    assert tuple(m.value for m in api.SavableModule) == est.SAVABLE_MODULES
