"""One enum per concept: each estimator member carries its API spelling, and the API's types
read, write and describe exactly those spellings."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from controller.api import enums as api
from controller.estimator import settings as est

PAIRS: list[tuple[type[est.Choice], Any]] = [
    (est.Method, api.TrainingMethod),
    (est.Checkpointing, api.CheckpointingMode),
    (est.Optimizer, api.OptimizerName),
    (est.Attention, api.AttentionImpl),
    (est.Precision, api.PrecisionName),
    (est.Profile, api.EstimatorProfile),
    (est.Parallelism, api.ParallelismMode),
]
IDS = [enum.__name__ for enum, _ in PAIRS]


@pytest.mark.parametrize(("enum", "api_type"), PAIRS, ids=IDS)
def test_every_member_has_one_camel_case_api_spelling(
    enum: type[est.Choice], api_type: Any
) -> None:
    spellings = [member.api for member in enum]
    assert len(set(spellings)) == len(spellings)
    for spelling in spellings:
        assert spelling[0].isupper() and "_" not in spelling and "-" not in spelling


@pytest.mark.parametrize(("enum", "api_type"), PAIRS, ids=IDS)
def test_the_estimator_parses_each_api_spelling_to_its_member(
    enum: type[est.Choice], api_type: Any
) -> None:
    for member in enum:
        assert enum.parse(member.api, "x") is member


@pytest.mark.parametrize(("enum", "api_type"), PAIRS, ids=IDS)
def test_the_api_type_reads_and_writes_the_api_spelling(
    enum: type[est.Choice], api_type: Any
) -> None:
    adapter: TypeAdapter[est.Choice] = TypeAdapter(api_type)
    for member in enum:
        assert adapter.validate_python(member.api) is member
        assert adapter.validate_python(member) is member
        assert adapter.dump_python(member, mode="json") == member.api
    assert adapter.json_schema() == {"enum": [m.api for m in enum], "type": "string"}


def test_the_api_type_refuses_the_estimators_token_as_the_crd_does() -> None:
    with pytest.raises(ValidationError, match=r"unsupported value 'qlora'; allowed: Full, LoRA"):
        TypeAdapter(api.TrainingMethod).validate_python("qlora")


def test_messages_list_api_spellings() -> None:
    assert api.allowed(est.Method) == "Full, LoRA, QLoRA"
    assert api.allowed(api.AdmissionPolicy) == "Enforce, Resize, Advise"


def test_savable_modules_are_the_estimators() -> None:
    assert tuple(m.value for m in api.SavableModule) == est.SAVABLE_MODULES
