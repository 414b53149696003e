"""The API models and the spec validator agree: what `translate` refuses for a reason the CRD
schema can state, `FineTuneJobSpec` refuses at the same field path, and it accepts every
spec `translate` accepts.

The models validate the spec as the API server does: JSON, strictly typed (no "16" for 16).
`translate` stays the validator of record, because it also finds what no schema can: errors
that need the model's config, and the rules the CRD states in CEL instead.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from controller.api.finetunejob import FineTuneJobSpec
from controller.estimator.presets import load_preset
from controller.jobs.spec import translate
from tests.unit.builders.jobs import job
from tests.unit.jobs import test_jobspec

#: Errors beyond the schema, by the start of their message: they need the model (its preset,
#: config fields, module names, context length) or they are CEL rules of the CRD.
BEYOND_THE_SCHEMA = (
    "spec.model.preset: unknown preset",
    "spec.model.config.",
    "spec.lora.targetModules: unknown module",
    "spec.training.sequenceLength: must be less than or equal to the model's context",
    "spec.lora.modulesToSave: applies only when method is lora or qlora",
    "spec.model: must set exactly one of",
    "spec.lora.rank: is required when method is LoRA or QLoRA",
    "spec.resources.maxGPUs: must be greater than or equal to minGPUs",
    "spec.resources.gpus: must be greater than or equal to minGPUs",
    "spec.resources.gpus: must be between minGPUs",
)

#: The cases of `test_each_bad_input_names_its_field`, so that each new one is checked here.
(_PARAMETRIZE,) = [
    mark
    for mark in test_jobspec.test_each_bad_input_names_its_field.pytestmark
    if mark.name == "parametrize"
]
BAD_INPUTS: list[tuple[object, str]] = list(_PARAMETRIZE.args[1])

VALID = [
    job(),
    job(
        training={"optimizer": "AdamW8bit", "attention": "SDPA", "gradientCheckpointing": "Off"},
        estimator={"profile": "Unsloth"},
        parallelism="DeviceMap",
        resources={"gpus": 2, "gpuSelector": {"nvidia.com/gpu.product": "H100"}},
        admissionPolicy="Resize",
        suspend=True,
    ),
    job(model={"preset": "meta-llama/Llama-3.1-8B"}),
    job(model={"config": load_preset("llama-3.1-8b").config_dict()}),
    job(model={"configMapRef": {"name": "qwen", "key": "config.json"}}, method="LoRA"),
    job(method="Full", lora=None),
    job(lora={"rank": 8, "targetModules": ["q_proj", "v_proj"], "modulesToSave": ["lm_head"]}),
]


def schema_errors(spec: object) -> list[str]:
    """`spec.` paths of what the models refuse in `spec`, validated as the API server does."""
    try:
        FineTuneJobSpec.model_validate_json(json.dumps(spec), strict=True)
    except ValidationError as error:
        return [".".join(["spec", *(str(part) for part in e["loc"])]) for e in error.errors()]
    return []


@pytest.mark.parametrize("spec", VALID)
def test_the_models_accept_every_spec_translate_accepts(spec: dict[str, Any]) -> None:
    assert translate(spec)[1] == []
    assert schema_errors(spec) == []


@pytest.mark.parametrize(("spec", "expected"), BAD_INPUTS)
def test_the_models_refuse_what_the_schema_can_state_at_the_same_path(
    spec: object, expected: str
) -> None:
    path = expected.split(":", 1)[0]
    found = schema_errors(spec)
    if expected.startswith(BEYOND_THE_SCHEMA):
        assert found == [], "the schema states this rule now: drop it from BEYOND_THE_SCHEMA"
    else:
        assert found, f"the models accept a spec translate refuses ({expected})"
        assert all(p == path or p.startswith(f"{path}.") for p in found), (path, found)
