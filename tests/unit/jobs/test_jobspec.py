"""FineTuneJob spec -> estimator input: every bad input gets one line at its `spec.` path."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.api.finetunejob import FineTuneJobSpec
from controller.estimator import Method, Optimizer, Parallelism, Profile
from controller.estimator.presets import load_preset
from controller.jobs.spec import (
    ConfigMapKey,
    config_map_ref,
    estimate_plan,
    translate,
    validate_spec,
)
from tests.unit.builders.jobs import job
from tests.unit.conftest import LLAMA_31_8B, PYTHIA_69B, QWEN25_05B

LLAMA_QLORA_BYTES = 7_780_056_064  # seed 2's worked example: 7.25 GiB
# The dimensions a config must state, at a toy size.
TINY_CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
               "vocab_size": 1000}  # fmt: skip


def messages(spec: object, config: dict[str, Any] | None = None) -> list[str]:
    plan, errors = translate(spec, config)
    assert (plan is None) == bool(errors)
    return [str(e) for e in errors]


def test_the_reference_job_estimates_7_25_gib() -> None:
    plan, errors = translate(job())
    assert errors == [] and plan is not None
    assert plan.model == "llama-3.1-8b"
    assert plan.settings.method is Method.QLORA
    assert plan.settings.profile is Profile.ANALYTIC
    assert plan.parallelism is Parallelism.FSDP and plan.gpus == 1
    est = estimate_plan(plan)
    assert est.total_bytes == LLAMA_QLORA_BYTES
    assert est.per_gpu_bytes(plan.gpus, plan.parallelism) == LLAMA_QLORA_BYTES


def test_camel_case_values_reach_the_estimator() -> None:
    plan, _ = translate(
        job(
            training={
                "optimizer": "AdamW8bit",
                "attention": "SDPA",
                "gradientCheckpointing": "Off",
            },
            estimator={"profile": "Unsloth"},
            parallelism="DeviceMap",
            resources={"gpus": 2, "gpuSelector": {"nvidia.com/gpu.product": "H100"}},
            admissionPolicy="Resize",
        )
    )
    assert plan is not None
    assert plan.settings.optimizer is Optimizer.ADAMW_8BIT
    assert plan.settings.profile is Profile.UNSLOTH
    assert plan.parallelism is Parallelism.DEVICE_MAP
    assert plan.gpus == 2 and plan.gpu_selector == {"nvidia.com/gpu.product": "H100"}
    assert plan.admission_policy == "Resize"


def test_a_preset_may_be_named_by_its_repo() -> None:
    plan, _ = translate(job(model={"preset": "meta-llama/Llama-3.1-8B"}))
    assert plan is not None and plan.model == "llama-3.1-8b"


def test_an_inline_config_estimates_like_its_preset() -> None:
    config = load_preset("llama-3.1-8b").config_dict()
    plan, _ = translate(job(model={"config": config}))
    assert plan is not None and plan.model == "inline"
    assert estimate_plan(plan).total_bytes == LLAMA_QLORA_BYTES


def test_gpus_split_the_estimate_per_parallelism() -> None:
    fsdp, _ = translate(job(resources={"gpus": 4}))
    ddp, _ = translate(job(resources={"gpus": 4}, parallelism="DDP"))
    assert fsdp is not None and ddp is not None
    est = estimate_plan(fsdp)
    assert est.per_gpu_bytes(4, fsdp.parallelism) < est.total_bytes
    assert est.per_gpu_bytes(4, ddp.parallelism) == est.total_bytes


def test_a_module_saved_twice_is_estimated_as_once_like_a_target_named_twice() -> None:
    once, _ = translate(job(lora={"targetModules": ["q_proj"], "modulesToSave": ["lm_head"]}))
    twice, errors = translate(
        job(lora={"targetModules": ["q_proj", "q_proj"], "modulesToSave": ["lm_head", "lm_head"]})
    )
    assert errors == [] and once is not None and twice is not None
    assert twice.settings == once.settings
    assert estimate_plan(twice).total_bytes == estimate_plan(once).total_bytes


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (job(lora={"rank": 0}), "spec.lora.rank: must be greater than or equal to 1, got 0"),
        (job(lora={"rank": "16"}), "spec.lora.rank: must be an integer, got '16'"),
        (
            job(model={"preset": "llama-8b"}),
            "spec.model.preset: unknown preset 'llama-8b'; closest: llama-3.1-8b",
        ),
        (job(model={"preset": 8}), "spec.model.preset: must be a preset name, got 8"),
        (
            job(training={"sequenceLength": 10**8}),
            "spec.training.sequenceLength: must be less than or equal to 16777216, got 100000000",
        ),
        (job(method=None), "spec.method: must be one of Full, LoRA, QLoRA, got null"),
        (
            job(estimator={"profile": None}),
            "spec.estimator.profile: must be one of Calibrated, Analytic, Unsloth, Trace, got null",
        ),
        (
            job(training={"optimizer": None}),
            "spec.training.optimizer: must be one of AdamW, AdamW8bit",
        ),
        (
            job(training={"microBatchSize": None}),
            "spec.training.microBatchSize: must not be null; leave it out for the default",
        ),
        (
            job(parallelism=None),
            "spec.parallelism: must be one of DDP, FSDP, DeviceMap, got null",
        ),
        (
            job(lora={"targetModules": {"q_proj": True}}),
            "spec.lora.targetModules: must be a list of module names",
        ),
        (
            job(model={"config": LLAMA_31_8B | {"num_hidden_layers": 10**6}}),
            "spec.model.config.num_hidden_layers: must be less than or equal to 4096, got 1000000",
        ),
        (
            job(training={"optimizer": "Lion"}),
            "spec.training.optimizer: unsupported value 'Lion'; allowed: AdamW, AdamW8bit, "
            "AdamWFp32Master, AdamWTorch, PagedAdamW32bit, SGD",
        ),
        (job(method="DoRA"), "spec.method: unsupported value 'DoRA'; allowed: Full, LoRA, QLoRA"),
        (
            job(training={"attention": "xformers"}),
            "spec.training.attention: unsupported value 'xformers'; allowed: FlashAttention2, "
            "SDPA, FlexAttention, Eager",
        ),
        (
            job(training={"gradientCheckpointing": "Maybe"}),
            "spec.training.gradientCheckpointing: unsupported value 'Maybe'; "
            "allowed: On, Off, Unsloth",
        ),
        (
            job(training={"precision": "INT8"}),
            "spec.training.precision: unsupported value 'INT8'; allowed: BF16, FP16, FP32",
        ),
        (
            job(estimator={"profile": "Magic"}),
            "spec.estimator.profile: unsupported value 'Magic'; allowed: Calibrated, Analytic, "
            "Unsloth, Trace",
        ),
        (
            job(training={"microBatchSize": 0}),
            "spec.training.microBatchSize: must be greater than or equal to 1, got 0",
        ),
        (
            job(training={"gradientAccumulationSteps": -1}),
            "spec.training.gradientAccumulationSteps: must be greater than or equal to 1",
        ),
        (job(training={"fusedLoss": "yes"}), "spec.training.fusedLoss: must be true or false"),
        (
            job(training={"framework": "x" * 64}),
            "spec.training.framework: must be a string of at most 63 characters",
        ),
        (
            job(lora={"targetModules": ["q_proj", "attn"]}),
            "spec.lora.targetModules: unknown module 'attn' for this model; allowed: all-linear",
        ),
        (job(lora={"targetModules": []}), "spec.lora.targetModules: must name at least one"),
        (
            job(lora={"modulesToSave": ["norm"]}),
            "spec.lora.modulesToSave: unsupported module 'norm'; allowed: embed_tokens, lm_head",
        ),
        (
            job(method="Full", lora={"modulesToSave": ["lm_head"]}),
            "spec.lora.modulesToSave: applies only when method is lora or qlora",
        ),
        (
            job(parallelism="TensorParallel"),
            "spec.parallelism: unsupported value 'TensorParallel'; allowed: DDP, FSDP, DeviceMap",
        ),
        (job(resources={"gpus": 0}), "spec.resources.gpus: must be greater than or equal to 1"),
        (
            job(resources={"gpus": 10_000}),
            "spec.resources.gpus: must be less than or equal to 4096",
        ),
        (job(resources={"gpus": 1.5}), "spec.resources.gpus: must be an integer, got 1.5"),
        (
            job(resources={"gpuSelector": {"nvidia.com/gpu.count": 8}}),
            "spec.resources.gpuSelector: must be a map of node label names to strings",
        ),
        (
            job(admissionPolicy="Always"),
            "spec.admissionPolicy: unsupported value 'Always'; allowed: Enforce, Resize, Advise",
        ),
        (job(suspend="no"), "spec.suspend: must be true or false, got 'no'"),
        (job(template=["pod"]), "spec.template: must be an object (a PodTemplateSpec)"),
        (job(training="fast"), "spec.training: must be an object"),
        (
            job(training={"seqLen": 4096}),
            "spec.training.seqLen: unknown field (did you mean sequenceLength?); allowed: "
            "framework, microBatchSize, sequenceLength",
        ),
        (job(priorty=3), "spec.priorty: unknown field (did you mean priority?); allowed: model"),
        (job(priority=True), "spec.priority: must be an integer, got True"),
        (job(priority=10**10), "spec.priority: must be less than or equal to 1000000000"),
        (
            job(priorityClassName="High_Priority"),
            "spec.priorityClassName: must be a PriorityClass name: a DNS-1123 subdomain "
            "(lower-case letters, digits, '-' and '.', starting and ending alphanumeric, at "
            "most 253 characters), got 'High_Priority'",
        ),
        (job(priorityClassName=7), "spec.priorityClassName: must be a PriorityClass name"),
        (
            job(resources={"minGPUs": 4, "maxGPUs": 2}),
            "spec.resources.maxGPUs: must be greater than or equal to minGPUs (4), got 2",
        ),
        (job(resources={"minGPUs": 0}), "spec.resources.minGPUs: must be greater than or equal"),
        (
            job(resources={"gpus": 1, "minGPUs": 2}),
            "spec.resources.gpus: must be greater than or equal to minGPUs (2), got 1",
        ),
        (
            job(resources={"gpus": 8, "minGPUs": 2, "maxGPUs": 4}),
            "spec.resources.gpus: must be between minGPUs (2) and maxGPUs (4), got 8",
        ),
        (
            job(resources={"gpus": 0, "minGPUs": 2}),
            "spec.resources.gpus: must be greater than or equal to 1, got 0",
        ),
        (
            job(model={"config": TINY_CONFIG | {"hidden_size": "big"}}),
            "spec.model.config.hidden_size: must be an integer, got 'big'",
        ),
        (
            job(model={"config": "llama"}),
            "spec.model.config: must be an object (a Hugging Face config.json)",
        ),
        # A type no reading reads (remote code: transformers does not build it either) is
        # refused at its field, with or without the trace extra.
        (
            job(model={"config": PYTHIA_69B | {"model_type": "my_remote_llm"}}),
            "spec.model.config.model_type: ",
        ),
        (job(model={}), "spec.model: must set exactly one of preset, config, configMapRef"),
        (
            job(model={"preset": "llama-3.1-8b", "config": {}}),
            "spec.model: must set exactly one of preset, config, configMapRef, got preset and "
            "config",
        ),
        (job(model={"configMapRef": {}}), "spec.model.configMapRef.name: is required"),
        (
            job(model={"configMapRef": {"name": "Bad Name"}}),
            "spec.model.configMapRef.name: must be a ConfigMap name: a DNS-1123 subdomain",
        ),
        (
            job(model={"configMapRef": {"name": "../kube-system/x"}}),
            "spec.model.configMapRef.name: must be a ConfigMap name",
        ),
        (
            job(model={"configMapRef": {"name": "a" * 254}}),
            "spec.model.configMapRef.name: must be a ConfigMap name",
        ),
        (
            job(model={"configMapRef": {"name": ""}}),
            "spec.model.configMapRef.name: must be a ConfigMap name",
        ),
        (
            job(model={"configMapRef": {"name": "qwen", "key": "../config.json"}}),
            "spec.model.configMapRef.key: must be a ConfigMap key",
        ),
        (
            job(model={"configMapRef": {"name": "qwen", "key": "config json"}}),
            "spec.model.configMapRef.key: must be a ConfigMap key",
        ),
        (
            job(model={"configMapRef": {"name": "qwen", "key": "k" * 254}}),
            "spec.model.configMapRef.key: must be a ConfigMap key",
        ),
        (
            {"method": "QLoRA", "lora": {"rank": 16}},
            "spec.model: is required; set one of preset, config, configMapRef",
        ),
        (job(lora={"rank": None}), "spec.lora.rank: is required when method is LoRA or QLoRA"),
        ({"model": {"preset": "llama-3.1-8b"}}, "spec.method: is required; allowed: Full"),
        ("QLoRA please", "spec: must be an object"),
    ],
)
def test_each_bad_input_names_its_field(spec: object, expected: str) -> None:
    found = messages(spec)
    assert len(found) == 1, found
    assert found[0].startswith(expected)
    assert "\n" not in found[0]


def test_every_error_is_reported_at_once_in_spec_order() -> None:
    spec = job(
        resources={"gpus": 0},
        lora={"rank": 0, "targetModules": ["bogus"]},
        training={"sequenceLength": 10**8, "optimizer": "Lion"},
        method="QLoRA",
    )
    fields = [m.split(":", 1)[0] for m in messages(spec)]
    assert fields == [
        "spec.lora.rank",
        "spec.lora.targetModules",
        "spec.training.optimizer",
        "spec.training.sequenceLength",
        "spec.resources.gpus",
    ]


def test_a_configmap_model_is_checked_once_read() -> None:
    spec = job(model={"configMapRef": {"name": "qwen"}}, method="LoRA")
    assert config_map_ref(spec) == ConfigMapKey("qwen", "config.json")
    plan, errors = translate(spec)
    assert errors == [] and plan is not None and plan.shape is None
    assert plan.model == "configmaps/qwen[config.json]"
    plan, errors = translate(spec, QWEN25_05B)
    assert errors == [] and plan is not None and plan.shape is not None
    assert estimate_plan(plan).total_params == plan.shape.total_params
    bad = {**QWEN25_05B, "num_hidden_layers": 0}
    (message,) = messages(spec, bad)
    assert message.startswith("configmaps/qwen[config.json].num_hidden_layers: must be")
    long = job(
        model={"configMapRef": {"name": "q", "key": "c"}}, training={"sequenceLength": 10**5}
    )
    plan, errors = translate(long, QWEN25_05B)
    assert errors == [] and plan is not None
    assert plan.warnings == (
        "spec.training.sequenceLength: 100000 is longer than the model's context length "
        "(32768); estimating anyway",
    )


@pytest.mark.parametrize(
    "ref",
    [
        {"name": "Bad Name"},
        {"name": "../kube-system/x"},
        {"name": "qwen", "key": ".."},
        {"name": "qwen", "key": "..config.json"},
        {"name": "qwen", "key": "a/b"},
    ],
)
def test_a_configmap_no_configmap_can_be_named_is_refused_not_looked_up(
    ref: dict[str, str],
) -> None:
    spec = job(model={"configMapRef": ref}, method="LoRA")
    assert config_map_ref(spec) is None  # so the operator reads nothing
    (message,) = messages(spec)
    assert message.startswith("spec.model.configMapRef.")
    assert "\n" not in message


@pytest.mark.parametrize(
    ("name", "key"),
    [("qwen", "config.json"), ("a.b-c.d", ".config_1-x"), ("x" * 253, "k" * 253), ("0", "_")],
)
def test_any_configmap_the_api_server_allows_may_be_named(name: str, key: str) -> None:
    spec = job(model={"configMapRef": {"name": name, "key": key}}, method="LoRA")
    assert config_map_ref(spec) == ConfigMapKey(name, key)
    assert messages(spec) == []


def test_a_sequence_beyond_the_context_is_estimated_with_a_warning() -> None:
    plan, errors = translate(job(training={"sequenceLength": 200_000}))
    assert errors == [] and plan is not None
    assert plan.warnings == (
        "spec.training.sequenceLength: 200000 is longer than the model's context length "
        "(131072); estimating anyway",
    )
    assert estimate_plan(plan).total_bytes > LLAMA_QLORA_BYTES
    assert translate(job())[0].warnings == ()  # type: ignore[union-attr]
    # rope scaling stretches the window: yarn x4 over Qwen's 32768 covers 100000 tokens.
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    scaled = job(
        model={"config": QWEN25_05B | {"rope_scaling": yarn}},
        training={"sequenceLength": 100_000},
    )
    plan, errors = translate(scaled)
    assert errors == [] and plan is not None and plan.warnings == ()


def test_a_config_naming_only_its_model_type_is_refused_dimension_by_dimension() -> None:
    """`{"model_type": "llama"}` was estimated as Llama-2-7B, transformers' defaults, without
    a word: each dimension the estimate is built on is refused on a line of its own, with
    the default it was not read as."""
    found = messages(job(model={"config": {"model_type": "llama"}}))
    assert found == [
        f"spec.model.config.{name}: is required in a model config: the estimate depends on "
        f"it (transformers' llama default, {default}, may be another model's)"
        for name, default in (("hidden_size", 4096), ("num_hidden_layers", 32),
                              ("num_attention_heads", 32), ("intermediate_size", 11008),
                              ("vocab_size", 32000))
    ]  # fmt: skip
    # Under any name the parser reads it, a dimension is stated; a bad one is said with the
    # missing ones, so one answer lists everything to fix.
    gpt2_names = {"n_embd": 64, "n_layer": 2, "n_head": 4, "intermediate_size": 128}
    (message,) = messages(job(model={"config": gpt2_names}))
    assert message == (
        "spec.model.config.vocab_size: is required in a model config: the estimate depends on it"
    )
    found = messages(job(model={"config": {"hidden_size": "big", "vocab_size": 1000}}))
    assert [m.split(":", 1)[0] for m in found] == [
        "spec.model.config.hidden_size",
        "spec.model.config.num_hidden_layers",
        "spec.model.config.num_attention_heads",
        "spec.model.config.intermediate_size",
    ]
    assert found[0] == "spec.model.config.hidden_size: must be an integer, got 'big'"
    plan, errors = translate(job(model={"config": TINY_CONFIG}))
    assert errors == [] and plan is not None and plan.warnings == ()


def test_what_a_config_leaves_to_defaults_is_said_in_the_plans_warnings() -> None:
    """A nested text_config is read with its class's defaults, as transformers 4 saved it
    without them (llava-1.5-7b's names no dimension), and the warning says which and what;
    key/value heads a config leaves out are the attention heads', which is said too."""
    llava = {"model_type": "llava", "text_config": {"model_type": "llama", "vocab_size": 32064}}
    plan, errors = translate(job(model={"config": llava}))
    assert errors == [] and plan is not None
    assert plan.shape is not None and plan.shape.dims.hidden_size == 4096
    assert plan.warnings == (
        "spec.model.config.text_config: estimated with the defaults of transformers' llama "
        "config class for what the config leaves out (hidden_size=4096, intermediate_size="
        "11008, num_hidden_layers=32, num_attention_heads=32), as transformers loads it; set "
        "them in the config if the model's differ",
        "spec.model.config.text_config.num_key_value_heads: not in the config, so estimated as "
        "num_attention_heads (32): keys and values for every head, as transformers reads it; "
        "set it if the model shares them among heads (grouped-query attention)",
    )
    # A ConfigMap's config is named by its ConfigMap, as its errors are.
    ref = job(model={"configMapRef": {"name": "llava"}})
    plan, errors = translate(ref, llava)
    assert errors == [] and plan is not None
    assert plan.warnings[0].startswith("configmaps/llava[config.json].text_config: estimated")
    # A preset warns of nothing: its defaults are checked against the published count.
    gemma = load_preset("gemma-3-4b").config_dict()
    assert "num_attention_heads" not in gemma["text_config"]
    plan, errors = translate(job(model={"preset": "gemma-3-4b"}))
    assert errors == [] and plan is not None and plan.warnings == ()
    plan, errors = translate(job(model={"config": gemma}))
    assert errors == [] and plan is not None
    assert plan.warnings[0].startswith("spec.model.config.text_config: estimated with")


def test_the_webhook_check_skips_only_the_configmap_model() -> None:
    spec = job(model={"configMapRef": {"name": "x"}}, lora={"rank": 0})
    assert [str(e) for e in validate_spec(spec)] == [
        "spec.lora.rank: must be greater than or equal to 1, got 0"
    ]


def test_translation_does_not_modify_the_spec() -> None:
    spec = job(model={"config": dict(LLAMA_31_8B)}, lora={"targetModules": ["Q_PROJ".lower()]})
    before = copy.deepcopy(spec)
    translate(spec)
    assert spec == before


# -- the validator agrees with the CRD schema ----------------------------------------------

VALID_SPECS = st.fixed_dictionaries(
    {
        "model": st.sampled_from([{"preset": "llama-3.1-8b"}, {"preset": "qwen2.5-0.5b"}]),
        "method": st.sampled_from(["Full", "LoRA", "QLoRA"]),
        "lora": st.fixed_dictionaries(
            {"rank": st.integers(1, 512)}, optional={"targetModules": st.just(["all-linear"])}
        ),
    },
    optional={
        "training": st.fixed_dictionaries(
            {},
            optional={
                "microBatchSize": st.integers(1, 64),
                "sequenceLength": st.integers(1, 32768),
                "optimizer": st.sampled_from(["AdamW", "AdamW8bit", "SGD"]),
                "attention": st.sampled_from(["FlashAttention2", "SDPA", "Eager"]),
                "fusedLoss": st.booleans(),
            },
        ),
        "parallelism": st.sampled_from(["DDP", "FSDP", "DeviceMap"]),
        "resources": st.fixed_dictionaries({}, optional={"gpus": st.integers(1, 64)}),
        "admissionPolicy": st.sampled_from(["Enforce", "Resize", "Advise"]),
        "suspend": st.booleans(),
    },
)


@settings(max_examples=60, deadline=None)
@given(VALID_SPECS)
def test_specs_the_schema_accepts_translate(spec: dict[str, Any]) -> None:
    FineTuneJobSpec.model_validate(spec)
    plan, errors = translate(spec)
    assert errors == [], errors
    assert plan is not None and estimate_plan(plan).total_bytes > 0


def test_the_pure_modules_import_no_kubernetes_client() -> None:
    code = (
        "import sys, json, controller.jobs.spec, controller.api.crds, controller.admission.status;"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('kopf', 'kubernetes', 'aiohttp'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_the_operator_estimates_with_the_calibrated_profile_by_default() -> None:
    spec = {k: v for k, v in job().items() if k != "estimator"}
    plan, errors = translate(spec)
    assert errors == [] and plan is not None
    assert plan.settings.profile is Profile.CALIBRATED
    assert estimate_plan(plan).profile == "calibrated"
