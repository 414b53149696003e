"""The one validator: every bad training setting gets a one-line error naming its field."""

from __future__ import annotations

import pytest

from controller.estimator import (
    Method,
    Optimizer,
    SpecErrors,
    TrainingSettings,
    build_settings,
    check_against_model,
    context_warnings,
    parse_config,
)
from controller.jobs.profiles import estimate
from tests.unit.conftest import LLAMA_31_8B


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"method": "dora"}, "method: unsupported value 'dora'; allowed: full, lora, qlora"),
        ({"rank": None}, "lora.rank: is required when method is LoRA or QLoRA"),
        ({"rank": 0}, "lora.rank: must be greater than or equal to 1, got 0"),
        ({"rank": 10**9}, "lora.rank: must be less than or equal to 65536"),
        ({"rank": 1.5}, "lora.rank: must be an integer, got 1.5"),
        ({"batch": 0}, "training.microBatchSize: must be greater than or equal to 1, got 0"),
        ({"batch": -3}, "training.microBatchSize: must be greater than or equal to 1"),
        ({"batch": True}, "training.microBatchSize: must be an integer, got True"),
        ({"seq_len": "2048"}, "training.sequenceLength: must be an integer"),
        ({"optimizer": "lion"}, "training.optimizer: unsupported value 'lion'; allowed: adamw"),
        ({"gradient_checkpointing": "maybe"}, "training.gradientCheckpointing: unsupported"),
        ({"attention": "xformers"}, "training.attention: unsupported value 'xformers'"),
        ({"precision": "int8"}, "training.precision: unsupported value 'int8'"),
        ({"profile": "magic"}, "estimator.profile: unsupported value 'magic'"),
        ({"gradient_accumulation": 0}, "training.gradientAccumulationSteps: must be greater"),
        ({"targets": []}, "lora.targetModules: must name at least one module"),
        ({"targets": [1]}, "lora.targetModules: must be a list of module names"),
        ({"modules_to_save": ["norm"]}, "lora.modulesToSave: unsupported module 'norm'"),
        (
            {"method": "full", "modules_to_save": ["lm_head"]},
            "lora.modulesToSave: applies only when method is lora or qlora",
        ),
        ({"fused_loss": "yes"}, "training.fusedLoss: must be true or false"),
    ],
)
def test_each_bad_value(values: dict[str, object], message: str) -> None:
    settings, errors = build_settings(values)
    assert settings is None
    assert len(errors) == 1
    assert str(errors[0]).startswith(message)
    assert "\n" not in str(errors[0])


def test_every_error_is_reported_at_once() -> None:
    _, errors = build_settings({"batch": 0, "seq_len": 0, "optimizer": "x", "rank": 0})
    assert {e.field for e in errors} == {
        "training.microBatchSize",
        "training.sequenceLength",
        "training.optimizer",
        "lora.rank",
    }


@pytest.mark.parametrize("raw", [{"q_proj": 1}, 5, [["q_proj"]]])
def test_module_lists_are_lists(raw: object) -> None:
    _, errors = build_settings({"targets": raw})
    assert [str(e) for e in errors] == ["lora.targetModules: must be a list of module names"]


def test_spellings_from_crds_and_hugging_face_are_accepted() -> None:
    settings, errors = build_settings(
        {"method": "QLoRA", "optimizer": "adamw_8bit", "gradient_checkpointing": "Unsloth"}
    )
    assert not errors and settings is not None
    assert settings.method is Method.QLORA and settings.optimizer is Optimizer.ADAMW_8BIT
    settings, _ = build_settings({"optimizer": "AdamWFp32Master", "method": "Full"})
    assert settings is not None and settings.optimizer is Optimizer.ADAMW_FP32_MASTER
    assert settings.rank is None  # full fine-tuning has no adapter


@pytest.mark.parametrize("raw", [["lm_head", "lm_head"], "lm_head,lm_head", "lm_head, lm_head"])
def test_a_repeated_module_to_save_is_kept_once_as_a_repeated_target_is(raw: object) -> None:
    settings, errors = build_settings({"method": "lora", "modules_to_save": raw})
    assert errors == [] and settings is not None
    assert settings.modules_to_save == ("lm_head",)
    both, _ = build_settings({"method": "lora", "modules_to_save": ["lm_head", "embed_tokens"] * 2})
    assert both is not None and both.modules_to_save == ("lm_head", "embed_tokens")


def test_paths_can_be_renamed_for_the_cli() -> None:
    _, errors = build_settings({"batch": 0}, {"batch": "--batch"})
    assert str(errors[0]).startswith("--batch: ")


def test_a_sequence_beyond_the_context_is_a_warning_not_an_error() -> None:
    shape = parse_config(LLAMA_31_8B)
    long = TrainingSettings(seq_len=200_000)
    assert check_against_model(shape, long)[1] == []
    assert context_warnings(shape, long) == [
        "training.sequenceLength: 200000 is longer than the model's context length (131072); "
        "estimating anyway"
    ]
    assert context_warnings(shape, TrainingSettings(seq_len=131_072)) == []
    assert estimate(shape, long).total_bytes > estimate(shape, TrainingSettings()).total_bytes


def test_model_dependent_checks() -> None:
    shape = parse_config(LLAMA_31_8B)
    with pytest.raises(SpecErrors, match=r"lora\.targetModules: unknown module 'nope'"):
        estimate(shape, TrainingSettings(targets=("nope",)))
    four_bit = parse_config(LLAMA_31_8B | {"quantization_config": {"load_in_4bit": True}})
    with pytest.raises(SpecErrors, match="method: full fine-tuning needs a 16-bit checkpoint"):
        estimate(four_bit, TrainingSettings(method=Method.FULL, rank=None))
