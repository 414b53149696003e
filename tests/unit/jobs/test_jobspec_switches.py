"""spec.training.framework and spec.training.switches: resolved, validated at their `spec.`
paths in the API's spellings, and noted where the framework is only a label."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from controller.api.finetunejob import FineTuneJobSpec
from controller.estimator import LoadPath, Loss, Offloading
from controller.estimator.settings import DEFAULT_SWITCHES
from controller.jobs.spec import estimate_plan, translate
from tests.unit.builders.jobs import job


def test_a_preset_and_an_override_reach_the_settings() -> None:
    plan, errors = translate(
        job(training={"framework": "Unsloth", "switches": {"loadPath": "MetaSharded"}})
    )
    assert errors == [] and plan is not None
    switches = plan.settings.switches
    assert switches.loss is Loss.FUSED and switches.activation_offloading is Offloading.CPU
    assert switches.load_path is LoadPath.META_SHARDED  # the override wins
    assert plan.settings.framework == "unsloth"
    assert plan.warnings == (
        "spec.training.switches.compile: torch.compile is not priced; the estimate is of the "
        "eager step",
    )


def test_an_unknown_framework_stays_a_label_and_is_noted() -> None:
    plan, errors = translate(job(training={"framework": "my-own-loop"}))
    assert errors == [] and plan is not None
    assert plan.settings.switches == DEFAULT_SWITCHES
    (note,) = plan.warnings
    assert note.startswith(
        "spec.training.framework: framework 'my-own-loop' is not one vramgate knows: default "
        "switches assumed; known: huggingface"
    )
    unlabelled, _ = translate(job())
    assert unlabelled is not None
    assert estimate_plan(plan) == estimate_plan(unlabelled)


def test_bad_switches_are_one_line_each_in_the_apis_spelling() -> None:
    _, errors = translate(
        job(
            training={
                "switches": {
                    "loss": "Streamed",
                    "activationOffloading": "Disk",
                    "fsdpVersion": 3,
                    "speed": 1,
                }
            }
        )
    )
    assert [str(e) for e in errors] == [
        "spec.training.switches.speed: unknown field; allowed: loss, compile, loadPath, "
        "activationOffloading, fsdpVersion, optimizerInBackward, kbitPreparation",
        "spec.training.switches.loss: unsupported value 'Streamed'; allowed: Plain, Chunked, Fused",
        "spec.training.switches.activationOffloading: unsupported value 'Disk'; allowed: None, CPU",
        "spec.training.switches.fsdpVersion: unsupported value 3; allowed: 1, 2",
    ]


def test_switches_must_be_an_object_and_fused_loss_must_agree() -> None:
    _, errors = translate(job(training={"switches": "fast"}))
    assert [str(e) for e in errors] == ["spec.training.switches: must be an object"]
    _, errors = translate(job(training={"fusedLoss": True, "switches": {"loss": "Chunked"}}))
    assert [str(e) for e in errors] == [
        "spec.training.fusedLoss: true contradicts spec.training.switches.loss Chunked; set "
        "only spec.training.switches.loss"
    ]


@pytest.mark.parametrize("framework", [3, ["torchtune"], {"name": "torchtune"}, True])
def test_a_framework_that_is_no_string_is_one_error(framework: object) -> None:
    _, errors = translate(job(training={"framework": framework}))
    assert [str(e) for e in errors] == [
        f"spec.training.framework: must be a string of at most 63 characters, got {framework!r}"
    ]


def test_optimizer_in_backward_with_accumulation_is_refused() -> None:
    _, errors = translate(
        job(training={"gradientAccumulationSteps": 8, "switches": {"optimizerInBackward": True}})
    )
    assert [e.field for e in errors] == ["spec.training.switches.optimizerInBackward"]


@pytest.mark.parametrize(
    ("switches", "path"),
    [
        ({"loss": "Streamed"}, ("training", "switches", "loss")),
        ({"loadPath": "wholeModel"}, ("training", "switches", "loadPath")),
        ({"fsdpVersion": 3}, ("training", "switches", "fsdpVersion")),
        ({"speed": 1}, ("training", "switches", "speed")),
    ],
)
def test_the_api_model_refuses_what_the_validator_refuses(
    switches: dict[str, object], path: tuple[str, ...]
) -> None:
    spec = job(training={"switches": switches})
    with pytest.raises(ValidationError) as caught:
        FineTuneJobSpec.model_validate(spec)
    assert any(tuple(str(p) for p in e["loc"][: len(path)]) == path for e in caught.value.errors())
    assert translate(spec)[1]
