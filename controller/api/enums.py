"""The CamelCase enum strings of the vramgate.dev API, and the estimator value each one means.

Kubernetes API conventions spell enum values in CamelCase (`QLoRA`, `FlashAttention2`), while
the estimator and the CLI use lower-case tokens (`qlora`, `flash_attention_2`). The estimator's
`.parse` accepts both spellings, so the API enums below only fix which spelling the CRD
schema allows and which one messages show. `tests/unit/test_api_enums.py` checks that every
API value parses to its own estimator member and that no member lacks an API value.
"""

from __future__ import annotations

from enum import StrEnum


class TrainingMethod(StrEnum):
    FULL = "Full"
    LORA = "LoRA"
    QLORA = "QLoRA"


class CheckpointingMode(StrEnum):
    ON = "On"
    OFF = "Off"
    UNSLOTH = "Unsloth"


class OptimizerName(StrEnum):
    ADAMW = "AdamW"
    ADAMW_8BIT = "AdamW8bit"
    ADAMW_FP32_MASTER = "AdamWFp32Master"
    ADAMW_TORCH = "AdamWTorch"
    PAGED_ADAMW_32BIT = "PagedAdamW32bit"
    SGD = "SGD"


class AttentionImpl(StrEnum):
    FLASH_ATTENTION_2 = "FlashAttention2"
    SDPA = "SDPA"
    FLEX_ATTENTION = "FlexAttention"
    EAGER = "Eager"


class PrecisionName(StrEnum):
    BF16 = "BF16"
    FP16 = "FP16"
    FP32 = "FP32"


class EstimatorProfile(StrEnum):
    CALIBRATED = "Calibrated"
    ANALYTIC = "Analytic"
    UNSLOTH = "Unsloth"
    TRACE = "Trace"


class ParallelismMode(StrEnum):
    DDP = "DDP"
    FSDP = "FSDP"
    DEVICE_MAP = "DeviceMap"


class AdmissionPolicy(StrEnum):
    """What admission does when the requested GPU count is not the count that fits."""

    ENFORCE = "Enforce"
    RESIZE = "Resize"
    ADVISE = "Advise"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class SavableModule(StrEnum):
    """Modules PEFT can train in full beside the adapter; the estimator's SAVABLE_MODULES."""

    EMBED_TOKENS = "embed_tokens"
    LM_HEAD = "lm_head"


def allowed(enum: type[StrEnum]) -> str:
    """`Full, LoRA, QLoRA`: the allowed values as error messages list them."""
    return ", ".join(member.value for member in enum)
