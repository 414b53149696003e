"""What a TrainJob and its Trainer runtime say of its training, read for its sizing at create
(`controller.admission.trainjob`): data in, data out; the runtime comes from the operator's
cache (`controller.operator.caches`).

Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1, v2.2.0): a TrainJob names its runtime in
`spec.runtimeRef` (kind ClusterTrainingRuntime, the default, cluster-scoped, or
TrainingRuntime in the TrainJob's namespace). The runtime's `spec.template` is a JobSet spec;
what is read of it, as Trainer reads it:

* **The trainer's pods**: the replicated job named `node` (or labelled
  `trainer.kubeflow.org/trainjob-ancestor-step: trainer`), its container `node`. Its resources
  are the trainer's unless the TrainJob sets `spec.trainer.resourcesPerNode`, which replaces
  them whole; `spec.mlPolicy.numNodes` (default 1) is its pod count unless the TrainJob sets
  `spec.trainer.numNodes`; its command and args, unless the TrainJob sets its own.
* **The model**: `spec.initializer.model.storageUri` of the TrainJob, else the env
  `STORAGE_URI` of the container `model-initializer` of the replicated job of that name (or
  label). `hf://org/name` is a Hugging Face repo id, read as a FineTuneJob's
  `spec.model.preset` reads one: a bundled preset whose repo it is (no config is fetched on a
  webhook's request path). An `-Instruct` repo no preset names is read as its base model's
  preset, whose architecture it shares (said in the warning); any other model is not read.
* **torchtune** (`tune run`, Trainer's built-in `torchtune-*` runtimes): the method from the
  config's name (`llama3_2/1B_full`, `..._lora_single_device`, `..._qlora`: full, LoRA, QLoRA),
  or, where the TrainJob's command is `tune run` alone, as Trainer picks the config from its
  args (`model.quantize_base` QLoRA unless `model.use_dora`, `model.lora_attn_modules`
  LoRA, else full); then the `key=value` overrides that change memory: `batch_size`,
  `tokenizer.max_seq_len` / `dataset.max_seq_len` (the smaller), `gradient_accumulation_steps`,
  `enable_activation_checkpointing`, `enable_activation_offloading`, `compile`,
  `optimizer_in_bwd`, `dtype`, `model.lora_rank`, `model.lora_attn_modules`,
  `model.apply_lora_to_mlp`, `model.quantize_base`. What a config sets without an override is
  not known here (configs change with torchtune's version, which the image chooses): the
  FineTuneJob defaults stand in, and a warning says so. Any other trainer says no method.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.api.base import GPU_RESOURCE
from controller.estimator import SpecError, load_preset

GROUP = "trainer.kubeflow.org"
CLUSTER_KIND = "ClusterTrainingRuntime"
NAMESPACED_KIND = "TrainingRuntime"
CLUSTER_PLURAL = "clustertrainingruntimes"
NAMESPACED_PLURAL = "trainingruntimes"
#: The replicated job, and its container, that run the trainer's nodes.
TRAINER_JOB = "node"
MODEL_JOB = "model-initializer"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
_ANCESTORS = {TRAINER_JOB: "trainer", MODEL_JOB: MODEL_JOB}
STORAGE_URI = "STORAGE_URI"
HF_SCHEME = "hf://"
TORCHTUNE = "torchtune"
_TUNE_RUN = ["tune", "run"]
#: What of the trainer's pod spec places it (`trainjob.pod_constraints`).
_WHERE = ("nodeSelector", "affinity", "tolerations")


@dataclass(frozen=True, slots=True)
class RuntimeRef:
    """The runtime a TrainJob names: `namespace` None for a ClusterTrainingRuntime."""

    kind: str
    name: str
    namespace: str | None = None

    @property
    def key(self) -> str:
        """Its key in the operator's cache: `name`, or `namespace/name`."""
        return self.name if self.namespace is None else f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        return f"{self.kind} {self.key}"


@dataclass(frozen=True, slots=True)
class Reading:
    """FineTuneJob spec fields read from a TrainJob and its runtime (`model`, `method`,
    `lora`, `training`), where each came from (`sources`: the field, "what (where)"), what
    could not be read (`unread`, by field: `model` or `method`), and overrides not read."""

    fields: dict[str, Any] = field(default_factory=dict)
    sources: tuple[tuple[str, str], ...] = ()
    unread: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def runtime_ref(trainjob: Mapping[str, Any]) -> RuntimeRef | None:
    """The Trainer runtime the TrainJob names (Trainer's defaults filled in), or None where
    it names none, or one of another API group."""
    ref = _at(trainjob, "spec", "runtimeRef")
    name = ref.get("name")
    if not isinstance(name, str) or not name or ref.get("apiGroup", GROUP) != GROUP:
        return None
    kind = ref.get("kind", CLUSTER_KIND)
    if kind == CLUSTER_KIND:
        return RuntimeRef(kind, name)
    namespace = _at(trainjob, "metadata").get("namespace")
    if kind != NAMESPACED_KIND or not isinstance(namespace, str):
        return None
    return RuntimeRef(kind, name, namespace)


def slim(body: Mapping[str, Any]) -> dict[str, Any]:
    """A runtime as this module reads it: its name, namespace, numNodes, and of its replicated
    jobs the trainer's and the model initializer's containers' command, args, resources and
    STORAGE_URI, and where the trainer's pods may run (the operator caches this much)."""
    jobs = []
    for job in _list(_at(body, "spec", "template", "spec").get("replicatedJobs")):
        role = _role(job)
        if role is None:
            continue
        pod = _at(job, "template", "spec", "template", "spec")
        kept: dict[str, Any] = {k: pod[k] for k in _WHERE if k in pod and role == TRAINER_JOB}
        kept["containers"] = [
            {
                "name": c.get("name"),
                **{k: c[k] for k in ("command", "args", "resources") if k in c},
                "env": [e for e in _list(c.get("env")) if e.get("name") == STORAGE_URI],
            }
            for c in _list(pod.get("containers"))
            if c.get("name") == role
        ]
        template = {
            "metadata": {"labels": {ANCESTOR_LABEL: _ANCESTORS[role]}},
            "spec": {"template": {"spec": kept}},
        }
        jobs.append({"name": job.get("name"), "template": template})
    meta = {k: v for k, v in _at(body, "metadata").items() if k in ("name", "namespace")}
    policy = {k: v for k, v in _at(body, "spec", "mlPolicy").items() if k == "numNodes"}
    return {"metadata": meta, "spec": {"mlPolicy": policy,
                                       "template": {"spec": {"replicatedJobs": jobs}}}}  # fmt: skip


def trainer_container(runtime: Mapping[str, Any]) -> Mapping[str, Any]:
    """The runtime's trainer container (`node` of the replicated job `node`), or {}."""
    return _container(runtime, TRAINER_JOB)


def runtime_nodes(runtime: Mapping[str, Any]) -> object:
    """The runtime's trainer pod count: `spec.mlPolicy.numNodes`, default 1."""
    return _at(runtime, "spec", "mlPolicy").get("numNodes", 1)


def read(trainjob: Mapping[str, Any], runtime: Mapping[str, Any] | None) -> Reading:
    """The model, method and settings the TrainJob and its runtime (None: not at hand) say."""
    fields: dict[str, Any] = {}
    sources: list[tuple[str, str]] = []
    unread: dict[str, str] = {}
    notes: list[str] = []
    uri = _at(trainjob, "spec", "initializer", "model").get("storageUri")
    where = "spec.initializer.model.storageUri"
    if not isinstance(uri, str) and runtime is not None:
        uri = _storage_uri(runtime)
        where = f"the runtime's {MODEL_JOB} {STORAGE_URI}"
    if not isinstance(uri, str):
        unread["model"] = "no model: the TrainJob has no spec.initializer.model.storageUri" + (
            "" if runtime is None else f", its runtime's {MODEL_JOB} no {STORAGE_URI}"
        )
    else:
        preset, why = preset_of(uri)
        if preset is None:
            unread["model"] = f"model {uri} ({where}) {why}"
        else:
            fields["model"] = {"preset": preset}
            sources.append(("model", f"model {preset} from {uri} ({where}{why})"))
    trainer = _at(trainjob, "spec", "trainer")
    container = trainer_container(runtime) if runtime is not None else {}
    command = trainer.get("command", container.get("command"))
    args = trainer.get("args", container.get("args"))
    words = [str(w) for w in [*(command or []), *(args or [])]]
    if not isinstance(command, list) or command[:2] != _TUNE_RUN:
        unread["method"] = (
            "no method: the trainer is not torchtune (`tune run`), whose config names it"
            if command is not None or runtime is not None
            else "no method: its command is its runtime's, not at hand"
        )
        return Reading(fields, tuple(sources), unread, tuple(notes))
    said = _overrides(words)
    method, config = _method(command, words)
    if method is None:
        unread["method"] = f"torchtune config {config or '(none)'}: no method in its name"
    else:
        fields["method"] = method
        sources.append(("method", f"method {method} (torchtune config {config})"))
    training: dict[str, Any] = {"framework": TORCHTUNE}
    switches: dict[str, Any] = {}
    lora: dict[str, Any] = {}
    for key, value in said.items():
        try:
            _apply(key, value, training, switches, lora)
        except ValueError as error:
            notes.append(f"{key}={value}: {error}; not read")
    if switches:
        training["switches"] = switches
    attn, mlp = lora.pop("attn", None), lora.pop("mlp", False)
    if attn is not None:  # MLP alone: its config's attention modules are not known
        lora["targetModules"] = attn + (_MLP if mlp else [])
    fields["training"] = training
    if lora:
        fields["lora"] = lora
    read_keys = sorted(k for k in said if k in _KEYS)
    overrides = ", ".join(f"{k}={said[k]}" for k in read_keys) if read_keys else "none"
    sources.append(
        ("training", f"torchtune overrides {overrides}; what its config sets otherwise is "
                     "not read: the FineTuneJob defaults stand in")
    )  # fmt: skip
    return Reading(fields, tuple(sources), unread, tuple(notes))


def preset_of(uri: str) -> tuple[str | None, str]:
    """The bundled preset a model URI names, and a note ("" or why it is read so); or None
    and why none is."""
    if not uri.startswith(HF_SCHEME):
        return None, "is not a Hugging Face model (hf://): name the model in the annotation"
    repo = uri.removeprefix(HF_SCHEME).strip("/")
    for name, note in ((repo, ""), (_base(repo), f"; {repo} read as its base model")):
        if name:
            try:
                return load_preset(name).name, note
            except SpecError:
                continue
    return None, "is no bundled preset (`vramgate presets`): name the model in the annotation"


def _base(repo: str) -> str | None:
    base = re.sub(r"-Instruct$", "", repo, flags=re.IGNORECASE)
    return base if base != repo else None


def _method(command: Sequence[Any], words: Sequence[str]) -> tuple[str | None, str | None]:
    """The method, and the config it is read from."""
    if list(command) == _TUNE_RUN:  # Trainer appends recipe and config: picked as it picks
        args = words[2:]
        picked = "Full"
        if any("model.quantize_base" in a for a in args) and not any(
            "model.use_dora" in a for a in args
        ):
            picked = "QLoRA"
        elif any("model.lora_attn_modules" in a for a in args):
            picked = "LoRA"
        return _switched(picked, words), "chosen by Trainer from spec.trainer.args"
    config: str | None = None
    for i, word in enumerate(words):
        if word == "--config" and i + 1 < len(words):
            config = words[i + 1]
        elif word.startswith("--config="):
            config = word.removeprefix("--config=")
    if config is None:
        return None, None
    parts = config.rsplit("/", 1)[-1].lower().split("_")
    method = (
        "QLoRA" if "qlora" in parts
        else "LoRA" if "lora" in parts or "dora" in parts
        else "Full" if "full" in parts
        else None
    )  # fmt: skip
    return (None if method is None else _switched(method, words)), config


def _switched(method: str, words: Sequence[str]) -> str:
    """An override `model.quantize_base=` turns LoRA into QLoRA and back."""
    quantize = _overrides(words).get("model.quantize_base")
    if quantize is None or method == "Full":
        return method
    return "QLoRA" if _bool(quantize) else "LoRA"


def _overrides(words: Iterable[str]) -> dict[str, str]:
    """torchtune's `key=value` overrides, the last of each key."""
    said: dict[str, str] = {}
    for word in words:
        key, eq, value = word.partition("=")
        if eq and not key.startswith("-"):
            said[key] = value
    return said


_MODULES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
_MLP = ["gate_proj", "up_proj", "down_proj"]
#: The torchtune overrides `_apply` reads.
_KEYS = (
    "batch_size",
    "tokenizer.max_seq_len",
    "dataset.max_seq_len",
    "gradient_accumulation_steps",
    "enable_activation_checkpointing",
    "enable_activation_offloading",
    "compile",
    "optimizer_in_bwd",
    "dtype",
    "model.lora_rank",
    "model.lora_attn_modules",
    "model.apply_lora_to_mlp",
)


def _apply(
    key: str,
    value: str,
    training: dict[str, Any],
    switches: dict[str, Any],
    lora: dict[str, Any],
) -> None:
    """One override into the FineTuneJob fields it sets; ValueError: unreadable."""
    if key == "batch_size":
        training["microBatchSize"] = _int(value)
    elif key in ("tokenizer.max_seq_len", "dataset.max_seq_len"):
        if value.lower() not in ("null", "none", "~"):
            length = _int(value)
            training["sequenceLength"] = min(length, training.get("sequenceLength", length))
    elif key == "gradient_accumulation_steps":
        training["gradientAccumulationSteps"] = _int(value)
    elif key == "enable_activation_checkpointing":
        training["gradientCheckpointing"] = "On" if _bool(value) else "Off"
    elif key == "enable_activation_offloading":
        switches["activationOffloading"] = "CPU" if _bool(value) else "None"
    elif key == "compile":
        switches["compile"] = _bool(value)
    elif key == "optimizer_in_bwd":
        switches["optimizerInBackward"] = _bool(value)
    elif key == "dtype":
        precision = {"bf16": "BF16", "fp32": "FP32", "fp16": "FP16"}.get(value.lower())
        if precision is None:
            raise ValueError("a dtype of bf16, fp16 or fp32")
        training["precision"] = precision
    elif key == "model.lora_rank":
        lora["rank"] = _int(value)
    elif key == "model.lora_attn_modules":
        names = [n.strip(" '\"") for n in value.strip("[]").split(",") if n.strip(" '\"")]
        if not names or any(n not in _MODULES for n in names):
            raise ValueError(f"a list of {', '.join(_MODULES)}")
        lora["attn"] = [_MODULES[n] for n in names]
    elif key == "model.apply_lora_to_mlp":
        lora["mlp"] = _bool(value)


def _int(value: str) -> int:
    if not value.isdigit():
        raise ValueError("not a whole number")
    return int(value)


def _bool(value: str) -> bool:
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise ValueError("not True or False")


def _role(job: Mapping[str, Any]) -> str | None:
    """`node` or `model-initializer`: a replicated job by its name or its ancestor label."""
    label = _at(job, "template", "metadata", "labels").get(ANCESTOR_LABEL)
    for role, ancestor in _ANCESTORS.items():
        if job.get("name") == role or label == ancestor:
            return role
    return None


def _container(runtime: Mapping[str, Any], role: str) -> Mapping[str, Any]:
    for job in _list(_at(runtime, "spec", "template", "spec").get("replicatedJobs")):
        if _role(job) == role:
            for c in _list(_at(job, "template", "spec", "template", "spec").get("containers")):
                if c.get("name") == role:
                    found: Mapping[str, Any] = c
                    return found
    return {}


def _storage_uri(runtime: Mapping[str, Any]) -> str | None:
    for env in _list(_container(runtime, MODEL_JOB).get("env")):
        if env.get("name") == STORAGE_URI and isinstance(env.get("value"), str):
            return str(env["value"])
    return None


def gpus_of(resources: Mapping[str, Any]) -> dict[str, object]:
    """The nvidia.com/gpu a container's resources say, by part (limits, requests)."""
    return {
        part: _at(resources, part)[GPU_RESOURCE]
        for part in ("limits", "requests")
        if _at(resources, part).get(GPU_RESOURCE) is not None
    }


def _at(obj: object, *keys: str) -> Mapping[str, Any]:
    for key in keys:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    found: Mapping[str, Any] = obj if isinstance(obj, Mapping) else {}
    return found


def _list(value: object) -> list[Any]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []
