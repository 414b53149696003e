"""The enum strings of the vramgate.dev API.

Kubernetes API conventions spell enum values in CamelCase (`QLoRA`, `FlashAttention2`), while
the estimator and the CLI use lower-case tokens (`qlora`, `flash_attention_2`). The seven
enums that are estimator settings are the estimator's own (`controller.estimator.settings`),
whose members carry both spellings; the API types below are those enums read, written and
schema'd in their `api` spelling, so the CRD and the estimator share one list per concept.
The enums only the API has (admission policy, condition status, savable modules) are here.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import GetCoreSchemaHandler
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from controller.estimator import (
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
)


class _InApiSpelling:
    """Pydantic metadata: an estimator enum whose wire form is each member's `api` spelling.

    Validation accepts exactly those spellings (as the CRD schema does) or a member; a dump
    writes the spelling; the JSON schema is a string enum of them, in the members' order.
    """

    def __get_pydantic_core_schema__(
        self, source: type[Choice], handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        members = {member.api: member for member in source}

        def validate(value: object) -> Choice:
            if isinstance(value, source):
                return value
            if isinstance(value, str) and value in members:
                return members[value]
            raise PydanticCustomError(
                "unsupported_value",
                "unsupported value {value}; allowed: {allowed}",
                {"value": repr(value), "allowed": allowed(source)},
            )

        return core_schema.no_info_plain_validator_function(
            validate,
            json_schema_input_schema=core_schema.literal_schema(list(members)),
            serialization=core_schema.plain_serializer_function_ser_schema(api_spelling),
        )


_API = _InApiSpelling()

TrainingMethod = Annotated[Method, _API]
CheckpointingMode = Annotated[Checkpointing, _API]
OptimizerName = Annotated[Optimizer, _API]
AttentionImpl = Annotated[Attention, _API]
PrecisionName = Annotated[Precision, _API]
EstimatorProfile = Annotated[Profile, _API]
ParallelismMode = Annotated[Parallelism, _API]
LossImpl = Annotated[Loss, _API]
LoadPathMode = Annotated[LoadPath, _API]
OffloadingMode = Annotated[Offloading, _API]
KbitPreparationMode = Annotated[KbitPreparation, _API]


class AdmissionPolicy(StrEnum):
    """What admission does when the requested GPU count is not the count that fits."""

    ENFORCE = "Enforce"
    RESIZE = "Resize"
    ADVISE = "Advise"


class EstimateCorrection(StrEnum):
    """What the correction admission learned from jobs like this one may do to its per-GPU
    figure (`controller.learning.Policy`, in the API's spelling)."""

    OFF = "Off"
    RAISE_ONLY = "RaiseOnly"
    ADJUST = "Adjust"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class SavableModule(StrEnum):
    """Modules PEFT can train in full beside the adapter; the estimator's SAVABLE_MODULES."""

    EMBED_TOKENS = "embed_tokens"
    LM_HEAD = "lm_head"


def api_spelling(member: StrEnum) -> str:
    """How the API spells `member`: an estimator enum's `api`, an API-only enum's value."""
    return member.api if isinstance(member, Choice) else member.value


def allowed(enum: type[StrEnum]) -> str:
    """`Full, LoRA, QLoRA`: the values the API allows, as error messages list them."""
    return ", ".join(api_spelling(member) for member in enum)
