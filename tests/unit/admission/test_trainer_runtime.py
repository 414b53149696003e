"""What a TrainJob and its Trainer runtime say of its training (`trainer_runtime`), read from
the shape of Trainer v2.2.0's built-in runtime torchtune-llama3.2-1b (data/, copied as it is)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.admission import trainer_runtime as runtimes
from controller.admission.trainer_runtime import RuntimeRef, read, runtime_ref, slim
from controller.admission.trainjob import pod_constraints

BUILTIN = yaml.safe_load(
    (Path(__file__).parent / "data" / "torchtune_llama3_2_1b.yaml").read_text()
)
GPU = "nvidia.com/gpu"


def trainjob(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "tune", "namespace": "ml"},
        "spec": {"runtimeRef": {"name": "torchtune-llama3.2-1b"}, **spec},
    }


def tune_run(*args: str) -> dict[str, Any]:
    """A TrainJob whose command is `tune run` alone: Trainer picks the recipe and config."""
    return trainjob(trainer={"command": ["tune", "run"], "args": list(args)})


def test_the_builtin_torchtune_runtime_says_its_model_method_and_gpus() -> None:
    reading = read(trainjob(), BUILTIN)
    assert reading.fields == {
        "model": {"preset": "llama-3.2-1b"},  # hf://meta-llama/Llama-3.2-1B-Instruct
        "method": "Full",  # --config llama3_2/1B_full
        "training": {"framework": "torchtune"},
    }
    assert reading.unread == {}
    (_, model), (_, method), (_, overrides) = reading.sources
    assert "hf://meta-llama/Llama-3.2-1B-Instruct (the runtime's model-initializer " in model
    assert "read as its base model" in model
    assert method == "method Full (torchtune config llama3_2/1B_full)"
    assert "the FineTuneJob defaults stand in" in overrides
    assert runtimes.runtime_nodes(BUILTIN) == (1, "spec.mlPolicy.numNodes")
    assert runtimes.trainer_container(BUILTIN)["resources"] == {"limits": {GPU: 2}}


def test_the_cached_copy_reads_as_the_runtime_does_and_keeps_no_more() -> None:
    placed = copy.deepcopy(BUILTIN)
    node = placed["spec"]["template"]["spec"]["replicatedJobs"][2]
    node["template"]["spec"]["template"]["spec"]["nodeSelector"] = {"gpu": "a100"}
    kept = slim(placed)
    for job in (trainjob(), tune_run("model.lora_attn_modules=[q_proj]", "model.lora_rank=8")):
        assert read(job, kept) == read(job, placed)
    assert runtimes.trainer_container(kept) == {
        "name": "node",
        "command": node["template"]["spec"]["template"]["spec"]["containers"][0]["command"],
        "resources": {"limits": {GPU: 2}},
        "env": [],
    }
    assert pod_constraints(trainjob(), kept) == pod_constraints(trainjob(), placed)
    assert pod_constraints(trainjob(), kept).node_selector == (("gpu", "a100"),)
    assert "image" not in str(kept) and "dataset-initializer" not in str(kept)


def test_the_trainjobs_own_storage_uri_wins_over_the_runtimes() -> None:
    job = trainjob(initializer={"model": {"storageUri": "hf://Qwen/Qwen2.5-1.5B-Instruct"}})
    assert read(job, BUILTIN).fields["model"] == {"preset": "qwen2.5-1.5b"}
    assert "(spec.initializer.model.storageUri;" in read(job, BUILTIN).sources[0][1]
    exact = trainjob(initializer={"model": {"storageUri": "hf://meta-llama/Llama-3.2-3B"}})
    assert read(exact, BUILTIN).sources[0][1].endswith("(spec.initializer.model.storageUri)")


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("s3://bucket/llama", "is not a Hugging Face model (hf://)"),
        ("hf://someone/Unknown-7B-Instruct", "is no bundled preset"),
    ],
)
def test_a_model_no_preset_names_is_not_read(uri: str, why: str) -> None:
    reading = read(trainjob(initializer={"model": {"storageUri": uri}}), BUILTIN)
    assert "model" not in reading.fields
    assert reading.unread["model"].startswith(f"model {uri} (spec.initializer.model.storageUri)")
    assert why in reading.unread["model"]


def test_tune_run_alone_is_read_as_trainer_picks_its_config_with_the_overrides() -> None:
    reading = read(
        tune_run(
            "model.lora_attn_modules=['q_proj','v_proj','output_proj']",
            "model.apply_lora_to_mlp=True",
            "model.lora_rank=16",
            "batch_size=8",
            "tokenizer.max_seq_len=4096",
            "dataset.max_seq_len=1024",
            "enable_activation_checkpointing=False",
            "gradient_accumulation_steps=4",
            "dtype=fp32",
        ),
        BUILTIN,
    )
    assert reading.fields["method"] == "LoRA"
    assert reading.fields["lora"] == {
        "rank": 16,
        "targetModules": ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    }
    assert reading.fields["training"] == {
        "framework": "torchtune",
        "microBatchSize": 8,
        "sequenceLength": 1024,  # the smaller of the two
        "gradientCheckpointing": "Off",
        "gradientAccumulationSteps": 4,
        "precision": "FP32",
    }
    assert "chosen by Trainer from spec.trainer.args" in reading.sources[1][1]


@pytest.mark.parametrize(
    ("args", "method"),
    [
        ((), "Full"),
        (("model.lora_attn_modules=[q_proj]",), "LoRA"),
        (("model.lora_attn_modules=[q_proj]", "model.quantize_base=True"), "QLoRA"),
        (("model.lora_attn_modules=[q_proj]", "model.use_dora=True"), "LoRA"),
        # Trainer picks its LoRA config for DoRA (isUseQLoraFinetune), whose base the
        # override still quantizes: QDoRA, priced as QLoRA.
        (("model.lora_attn_modules=[q_proj]", "model.quantize_base=True",
          "model.use_dora=True"), "QLoRA"),
        (("model.lora_attn_modules=[q_proj]", "model.quantize_base=False"), "LoRA"),
    ],
    ids=["full", "lora", "qlora", "dora", "qdora", "quantize-base-false"],
)  # fmt: skip
def test_trainer_picks_the_method_from_the_args(args: tuple[str, ...], method: str) -> None:
    assert read(tune_run(*args), BUILTIN).fields["method"] == method


@pytest.mark.parametrize(
    ("config", "method"),
    [
        ("llama3_2/1B_lora_single_device", "LoRA"),
        ("llama3_2/3B_qlora_single_device", "QLoRA"),
        ("llama3_3/70B_full_multinode", "Full"),
        ("llama3_2/1B_custom", None),
    ],
)
def test_the_runtimes_config_name_says_the_method(config: str, method: str | None) -> None:
    runtime = copy.deepcopy(BUILTIN)
    container = runtimes.trainer_container(runtime)
    command = container["command"]  # type: ignore[index]
    command[command.index("--config") + 1] = config
    reading = read(trainjob(), runtime)
    assert reading.fields.get("method") == method
    if method is None:
        assert reading.unread["method"] == f"torchtune config {config}: no method in its name"


def test_a_trainer_that_is_not_torchtune_says_no_method() -> None:
    runtime = copy.deepcopy(BUILTIN)
    runtimes.trainer_container(runtime)["command"][:] = ["torchrun", "train.py"]  # type: ignore[index]
    reading = read(trainjob(), runtime)
    assert "method" not in reading.fields and "training" not in reading.fields
    assert "not torchtune" in reading.unread["method"]
    assert reading.fields["model"] == {"preset": "llama-3.2-1b"}


def test_an_override_that_cannot_be_read_is_said_and_skipped() -> None:
    reading = read(tune_run("batch_size=lots", "dtype=int8"), BUILTIN)
    assert "microBatchSize" not in reading.fields["training"]
    assert reading.notes == (
        "batch_size=lots: not a whole number; not read",
        "dtype=int8: a dtype of bf16, fp16 or fp32; not read",
    )


def test_the_runtime_a_trainjob_names() -> None:
    assert runtime_ref(trainjob()) == RuntimeRef("ClusterTrainingRuntime", "torchtune-llama3.2-1b")
    named = trainjob()
    named["spec"]["runtimeRef"] = {"name": "mine", "kind": "TrainingRuntime"}
    assert runtime_ref(named) == RuntimeRef("TrainingRuntime", "mine", "ml")
    assert runtime_ref(named).key == "ml/mine"  # type: ignore[union-attr]
    named["spec"]["runtimeRef"]["apiGroup"] = "example.com"
    assert runtime_ref(named) is None


def _node_job(runtime: dict[str, Any]) -> dict[str, Any]:
    job: dict[str, Any] = runtime["spec"]["template"]["spec"]["replicatedJobs"][2]
    return job


def _node_pod(runtime: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = _node_job(runtime)["template"]["spec"]["template"]["spec"]
    return pod


@pytest.mark.parametrize(
    ("args", "method"),
    [
        # Trainer picks its QLoRA config (the key is in an arg); the value says nothing.
        (("model.lora_attn_modules=[q_proj]", "model.quantize_base=yes"), "QLoRA"),
        (("model.lora_attn_modules=[q_proj]", "model.quantize_base="), "QLoRA"),
    ],
)
def test_a_quantize_base_that_is_no_bool_is_not_read_and_said(
    args: tuple[str, ...], method: str
) -> None:
    reading = read(tune_run(*args), BUILTIN)
    assert reading.fields["method"] == method
    value = args[-1].partition("=")[2]
    assert reading.notes == (f"model.quantize_base={value}: not True or False; not read",)
    runtime = copy.deepcopy(BUILTIN)  # a LoRA config: the unread value leaves it LoRA
    command = runtimes.trainer_container(runtime)["command"]  # type: ignore[index]
    command[command.index("--config") + 1] = "llama3_2/1B_lora"
    assert read(trainjob(trainer={"args": [args[-1]]}), runtime).fields["method"] == "LoRA"


def test_quantize_base_is_named_among_the_overrides_read() -> None:
    reading = read(tune_run("model.lora_attn_modules=[q_proj]", "model.quantize_base=False"),
                   BUILTIN)  # fmt: skip
    assert "model.quantize_base=False" in dict(reading.sources)["training"]


@pytest.mark.parametrize(
    "trainer",
    [{"command": 5}, {"command": True}, {"command": ["tune", 1]}, {"args": 3},
     {"command": ["tune", "run"], "args": False}, {"args": ["batch_size=2", None]}],
)  # fmt: skip
def test_a_command_or_args_that_is_no_list_of_strings_says_no_method(
    trainer: dict[str, Any],
) -> None:
    reading = read(trainjob(trainer=trainer), BUILTIN)
    assert reading.unread["method"] == (
        "no method: the trainer's command and args must be lists of strings"
    )
    assert reading.fields["model"] == {"preset": "llama-3.2-1b"}


def test_the_trainer_is_the_job_labelled_trainer_whatever_its_name() -> None:
    """Trainer finds the trainer's and the model initializer's jobs by their ancestor label
    (builder.go, FindPodSetByAncestor), not by name."""
    renamed = copy.deepcopy(BUILTIN)
    _node_job(renamed)["name"] = "trainer-node"
    assert read(trainjob(), renamed) == read(trainjob(), BUILTIN)
    assert runtimes.trainer_container(slim(renamed))["resources"] == {"limits": {GPU: 2}}
    unlabelled = copy.deepcopy(BUILTIN)
    for job in unlabelled["spec"]["template"]["spec"]["replicatedJobs"]:
        del job["template"]["metadata"]
    assert runtimes.trainer_container(unlabelled) == {}  # a job named node is not enough
    assert "model" not in read(trainjob(), unlabelled).fields
    assert slim(unlabelled)["spec"]["template"]["spec"]["replicatedJobs"] == []


def test_trainer_picks_a_config_only_for_the_trainjobs_own_tune_run() -> None:
    """Trainer's Torch plugin appends a recipe and config only where the TrainJob's own
    command is `tune run` (torch.go), picking from the TrainJob's own args, and on more than
    one node always its full multi-node config (torchtune.go getRecipeAndConfig)."""
    runtime = copy.deepcopy(BUILTIN)  # the runtime's command alone: nothing appended
    runtimes.trainer_container(runtime)["command"][:] = ["tune", "run"]  # type: ignore[index]
    reading = read(trainjob(trainer={"args": ["model.lora_attn_modules=[q_proj]"]}), runtime)
    assert reading.unread["method"] == "torchtune config (none): no method in its name"
    lora = "model.lora_attn_modules=[q_proj]"
    runtimes.trainer_container(runtime)["args"] = [lora, "model.lora_rank=8"]  # type: ignore[index]
    picked = read(trainjob(trainer={"command": ["tune", "run"]}), runtime)
    assert picked.fields["method"] == "Full"  # the runtime's args run, but are not picked from
    assert picked.fields["lora"] == {"rank": 8, "targetModules": ["q_proj"]}
    two_nodes = trainjob(trainer={"command": ["tune", "run"], "args": [lora], "numNodes": 2})
    assert read(two_nodes, BUILTIN).fields["method"] == "Full"
    plain = copy.deepcopy(BUILTIN)
    del plain["spec"]["mlPolicy"]["torch"]  # no Torch plugin: `tune run` runs as it is
    assert "method" not in read(tune_run(lora), plain).fields
    assert "method" not in read(tune_run(lora), slim(plain)).fields
    assert read(tune_run(lora), slim(BUILTIN)).fields["method"] == "LoRA"


def test_a_storage_uri_in_the_trainjobs_model_env_wins_over_its_storage_uri() -> None:
    """Trainer's builder upserts STORAGE_URI from storageUri, then the model's env over it."""
    job = trainjob(initializer={"model": {
        "storageUri": "hf://meta-llama/Llama-3.2-3B",
        "env": [{"name": "STORAGE_URI", "value": "hf://meta-llama/Llama-3.2-1B"},
                {"name": "STORAGE_URI", "value": "hf://Qwen/Qwen2.5-1.5B-Instruct"}],
    }})  # fmt: skip
    reading = read(job, BUILTIN)
    assert reading.fields["model"] == {"preset": "qwen2.5-1.5b"}
    assert "(spec.initializer.model.env STORAGE_URI;" in reading.sources[0][1]
    secret = trainjob(initializer={"model": {"env": [{"name": "STORAGE_URI", "valueFrom": {}}]}})
    assert read(secret, BUILTIN).unread["model"] == (
        "no model: spec.initializer.model.env STORAGE_URI has no value here (valueFrom)"
    )


def test_without_an_ml_policy_the_trainers_pods_are_its_jobs_parallelism() -> None:
    """trainingruntime.go: a job labelled trainer counts mlPolicy.numNodes only where the
    runtime has an mlPolicy; else, as any job, its parallelism (default 1)."""
    runtime = copy.deepcopy(BUILTIN)
    del runtime["spec"]["mlPolicy"]
    path = "spec.template.spec.replicatedJobs[node].template.spec.parallelism"
    assert runtimes.runtime_nodes(runtime) == (1, path)
    _node_job(runtime)["template"]["spec"]["parallelism"] = 3
    assert runtimes.runtime_nodes(runtime) == (3, path)
    assert runtimes.runtime_nodes(slim(runtime)) == (3, path)
    assert runtimes.runtime_nodes(slim(BUILTIN)) == (1, "spec.mlPolicy.numNodes")


def _patched(*pods: dict[str, Any], name: str = "node") -> dict[str, Any]:
    """A TrainJob whose runtimePatches give the replicated job `name` these pod specs."""
    patches = [
        {"manager": f"m{i}", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
            {"name": name, "template": {"spec": {"template": {"spec": pod}}}}]}}}}
        for i, pod in enumerate(pods)
    ]  # fmt: skip
    return trainjob(runtimePatches=patches)


def _term(key: str) -> dict[str, Any]:
    return {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": key, "operator": "Exists"}]}]}  # fmt: skip


def test_runtime_patches_merge_into_the_trainers_pod_as_trainers_strategic_merge_patch() -> None:
    """A PodSpec's tolerations have no patch strategy: a patch's replace the runtime's. Its
    affinity is merged field by field (a required node affinity replaced whole, the pod
    anti-affinity kept), its nodeSelector key by key; an empty list is no value."""
    runtime = copy.deepcopy(BUILTIN)
    anti = {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone"}]}
    _node_pod(runtime).update(
        nodeSelector={"pool": "a", "gpu": "a100"},
        tolerations=[{"key": "runtime", "operator": "Exists"}],
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                   _term("runtime")},
                  "podAntiAffinity": anti},
    )  # fmt: skip
    preferred = [{"weight": 1, "preference": {"matchExpressions": []}}]
    job = _patched(
        {"nodeSelector": {"gpu": "h100"}, "tolerations": [{"key": "first", "operator": "Exists"}],
         "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution":
                                       preferred}}},
        {"tolerations": [{"key": "second", "operator": "Exists"}], "nodeSelector": {"disk": "ssd"},
         "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                       _term("patch")}}},
        {"tolerations": []},
    )  # fmt: skip
    for cached in (runtime, slim(runtime)):
        pod = runtimes.placement(job, cached)
        assert pod["tolerations"] == [{"key": "second", "operator": "Exists"}]
        assert pod["nodeSelector"] == {"pool": "a", "gpu": "h100", "disk": "ssd"}
        assert pod["affinity"] == {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": _term("patch"),
                             "preferredDuringSchedulingIgnoredDuringExecution": preferred},
            "podAntiAffinity": anti,
        }  # fmt: skip
        constraints = pod_constraints(job, cached)
        assert [t.key for t in constraints.tolerations] == ["second"]
        assert [r.key for term in constraints.terms for r in term] == ["patch"]


def test_a_runtime_patch_applies_to_the_job_of_the_trainers_name() -> None:
    """Trainer matches a patch to a replicated job by name: the trainer's, whatever it is."""
    renamed = copy.deepcopy(BUILTIN)
    _node_job(renamed)["name"] = "trainer-node"
    pool = {"nodeSelector": {"pool": "b"}}
    assert runtimes.placement(_patched(pool, name="trainer-node"), renamed) == pool
    assert runtimes.placement(_patched(pool, name="node"), renamed) == {}
    assert runtimes.placement(_patched(pool, name="model-initializer"), BUILTIN) == {}
    assert runtimes.placement(_patched(pool), None) == pool  # not at hand: Trainer's `node`
