"""What a TrainJob and its Trainer runtime say of its training, read for its sizing at create
(`controller.admission.trainjob`): data in, data out. Kubeflow Trainer v2.2.0's own rules
(trainer.kubeflow.org/v1alpha1), so what is read is what its pods run:

* **The trainer**: the replicated job labelled `ANCESTOR_LABEL: trainer`, its container
  `node` (the model initializer's: label and container `model-initializer`); Trainer finds
  them by label. Its pods: `spec.trainer.numNodes`, else the runtime's `mlPolicy.numNodes`
  (default 1), or without an mlPolicy the job's `parallelism` (default 1).
* **Where** (`placement`): the TrainJob's `runtimePatches` for that job's name merged into
  its pod spec as Trainer merges them (a strategic merge patch).
* **The model**: a `STORAGE_URI` in `spec.initializer.model.env`, else its `storageUri`,
  else the runtime's model initializer's `STORAGE_URI`: an `hf://` repo a bundled preset
  names (an `-Instruct` one as its base); no config is fetched on a webhook's request path.
* **torchtune**: the method from the config's name, or, where the TrainJob's own command is
  `tune run` alone, from the config Trainer picks from its args; then the overrides in
  `_OVERRIDES`. What a config sets otherwise changes with torchtune's version (the image's):
  the FineTuneJob defaults stand in, and a warning says so.

A mutating webhook sees an object before its schema is checked: any field may have any
type, and what cannot be read is said, never raised.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.api.base import GPU_RESOURCE
from controller.estimator import SpecError, load_preset

GROUP = "trainer.kubeflow.org"
CLUSTER_KIND = "ClusterTrainingRuntime"
NAMESPACED_KIND = "TrainingRuntime"
CLUSTER_PLURAL = "clustertrainingruntimes"
NAMESPACED_PLURAL = "trainingruntimes"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
#: The trainer's ancestor label, and its container (Trainer's `node` replicated job's name).
TRAINER = "trainer"
TRAINER_JOB = "node"
MODEL_JOB = "model-initializer"
#: By ancestor label: the container Trainer fills.
_CONTAINERS = {TRAINER: TRAINER_JOB, MODEL_JOB: MODEL_JOB}
STORAGE_URI = "STORAGE_URI"
HF_SCHEME = "hf://"
TORCHTUNE = "torchtune"
_TUNE_RUN = ["tune", "run"]
#: The mlPolicy under which Trainer runs torchtune's `tune run` (its Torch plugin).
TORCHTUNE_POLICY = "torch"
#: What of the trainer's pod spec places it (`placement`).
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
    """A runtime as this module reads it: its name, namespace, mlPolicy (numNodes, and
    whether it is torch's), and of its trainer's and model initializer's replicated jobs the
    name, label and parallelism, their containers' command, args, resources and STORAGE_URI,
    and where the trainer's pods may run (the operator caches this much)."""
    jobs = []
    for job in _jobs(body):
        role = _role(job)
        if role is None:
            continue
        pod = _pod(job)
        kept: dict[str, Any] = {k: pod[k] for k in _WHERE if k in pod and role == TRAINER}
        kept["containers"] = [
            {
                "name": c.get("name"),
                **{k: c[k] for k in ("command", "args", "resources") if k in c},
                "env": [e for e in _list(c.get("env")) if e.get("name") == STORAGE_URI],
            }
            for c in _list(pod.get("containers"))
            if c.get("name") == _CONTAINERS[role]
        ]
        spec: dict[str, Any] = {"template": {"spec": kept}}
        if "parallelism" in _at(job, "template", "spec"):
            spec["parallelism"] = _at(job, "template", "spec")["parallelism"]
        template = {"metadata": {"labels": {ANCESTOR_LABEL: role}}, "spec": spec}
        jobs.append({"name": job.get("name"), "template": template})
    meta = {k: v for k, v in _at(body, "metadata").items() if k in ("name", "namespace")}
    slimmed: dict[str, Any] = {"template": {"spec": {"replicatedJobs": jobs}}}
    policy = _at(body, "spec").get("mlPolicy")
    if isinstance(policy, Mapping):
        slimmed["mlPolicy"] = {
            k: {} if k == TORCHTUNE_POLICY else v
            for k, v in policy.items()
            if k in ("numNodes", TORCHTUNE_POLICY)
        }
    return {"metadata": meta, "spec": slimmed}


def trainer_container(runtime: Mapping[str, Any]) -> Mapping[str, Any]:
    """The runtime's trainer container (`node` of the job labelled trainer), or {}."""
    return _container(runtime, TRAINER)


def runtime_nodes(runtime: Mapping[str, Any]) -> tuple[object, str]:
    """The runtime's trainer pod count, and the field that says it: `spec.mlPolicy.numNodes`
    (default 1), or with no mlPolicy the trainer job's parallelism (default 1), as Trainer
    counts its pods (trainingruntime.go)."""
    policy = _at(runtime, "spec").get("mlPolicy")
    if isinstance(policy, Mapping):
        return policy.get("numNodes", 1), "spec.mlPolicy.numNodes"
    job = _trainer_job(runtime)
    path = f"spec.template.spec.replicatedJobs[{job.get('name')}].template.spec.parallelism"
    return _at(job, "template", "spec").get("parallelism", 1), path


def placement(trainjob: Mapping[str, Any], runtime: Mapping[str, Any] | None) -> dict[str, Any]:
    """The trainer's pod spec's nodeSelector, affinity and tolerations as Trainer builds them:
    the runtime's trainer job's (None: not at hand), then, in order, those of each of the
    TrainJob's `spec.runtimePatches` for a replicated job of that job's name (`node` where the
    runtime is not at hand): Trainer matches a patch by name and merges it with a strategic
    merge patch of the job template (trainingruntime.go mergeRuntimePatches). A PodSpec's
    nodeSelector is a map, merged key by key; affinity a struct, merged field by field
    (nodeAffinity, podAffinity, podAntiAffinity, and within them); lists (tolerations, the
    terms within affinity) have no patch strategy: a patch's replaces the runtime's whole.
    An empty or null value in a patch is none (the patch is Go types first: omitempty)."""
    job = _trainer_job(runtime)
    name = job.get("name", TRAINER_JOB) if runtime is not None else TRAINER_JOB
    pod = {k: v for k, v in _pod(job).items() if k in _WHERE}
    for patch in _list(_at(trainjob, "spec").get("runtimePatches")):
        patched_jobs = _at(patch, "trainingRuntimeSpec", "template", "spec").get("replicatedJobs")
        for patched in _list(patched_jobs):
            if patched.get("name") == name:
                given = _pod(patched)
                pod = _merged(pod, {k: given[k] for k in _WHERE if k in given})
    return pod


def _merged(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in patch.items():
        if value is None or value == [] or value == {}:
            continue
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


#: What the TrainJob webhook writes into a TrainJob's spec.trainer from its runtime.
FILLED = ("numNodes", "resourcesPerNode")


def refill(
    stored: Mapping[str, Any], trainer: object, spec: object
) -> tuple[list[dict[str, Any]], object]:
    """For an update of a TrainJob the webhook sized: the JSON Patch operations that put
    back the stored trainer's `FILLED` fields where the new spec.trainer (None: absent) lacks
    them, and the trainer they make; none where nothing lacks, or the spec or trainer is not
    a mapping (the schema refuses it)."""
    have = trainer if isinstance(trainer, Mapping) else {}
    missing = {k: stored[k] for k in FILLED if k in stored and have.get(k) is None}
    if not missing or not isinstance(spec, Mapping) or not isinstance(trainer, Mapping | None):
        return [], trainer
    if trainer is None:
        return [{"op": "add", "path": "/spec/trainer", "value": missing}], missing
    ops = [{"op": "add", "path": f"/spec/trainer/{k}", "value": v} for k, v in missing.items()]
    return ops, {**have, **missing}


def read(trainjob: Mapping[str, Any], runtime: Mapping[str, Any] | None) -> Reading:
    """The model, method and settings the TrainJob and its runtime (None: not at hand) say."""
    fields: dict[str, Any] = {}
    sources: list[tuple[str, str]] = []
    unread: dict[str, str] = {}
    notes: list[str] = []
    uri, where = _model_uri(trainjob, runtime)
    if uri is None:
        unread["model"] = "no model: the TrainJob has no spec.initializer.model.storageUri" + (
            "" if runtime is None else f", its runtime's {MODEL_JOB} no {STORAGE_URI}"
        )
    elif not uri:
        unread["model"] = f"no model: {where} has no value here (valueFrom)"
    else:
        preset, why = preset_of(uri)
        if preset is None:
            unread["model"] = f"model {uri} ({where}) {why}"
        else:
            fields["model"] = {"preset": preset}
            sources.append(("model", f"model {preset} from {uri} ({where}{why})"))
    trainer = _at(trainjob, "spec", "trainer")
    container = trainer_container(runtime) if runtime is not None else {}
    # Trainer's builder: the TrainJob's command and args, where set, replace the container's.
    said_command = trainer.get("command")
    raw_command = container.get("command") if said_command is None else said_command
    raw_args = container.get("args") if trainer.get("args") is None else trainer.get("args")
    command, args = _words(raw_command), _words(raw_args)
    if command is None or args is None:
        unread["method"] = "no method: the trainer's command and args must be lists of strings"
        return Reading(fields, tuple(sources), unread, tuple(notes))
    if command[:2] != _TUNE_RUN:
        unread["method"] = (
            "no method: the trainer is not torchtune (`tune run`), whose config names it"
            if raw_command is not None or runtime is not None
            else "no method: its command is its runtime's, not at hand"
        )
        return Reading(fields, tuple(sources), unread, tuple(notes))
    words = [*command, *args]
    said = _overrides(words)
    picks = command == _TUNE_RUN and said_command is not None and _torch(runtime)
    method, config = (
        _picked(_words(trainer.get("args")) or [], _nodes(trainer, runtime)) if picks
        else _configured(words)
    )  # fmt: skip
    parsed: dict[str, dict[str, Any]] = {section: {} for section in _SECTIONS}
    for key, value in said.items():
        if key not in _OVERRIDES:
            continue
        section, name, parse = _OVERRIDES[key]
        try:
            got = parse(value)
        except ValueError as error:
            notes.append(f"{key}={value}: {error}; not read")
            continue
        if got is not None:  # both max_seq_len: the smaller
            into = parsed[section]
            into[name] = min(got, into[name]) if name == "sequenceLength" and name in into else got
    quantize = parsed["method"].get("quantize")
    if method in ("LoRA", "QLoRA") and quantize is not None:  # it turns one into the other
        method = "QLoRA" if quantize else "LoRA"
    if method is None:
        unread["method"] = f"torchtune config {config or '(none)'}: no method in its name"
    else:
        fields["method"] = method
        sources.append(("method", f"method {method} (torchtune config {config})"))
    training: dict[str, Any] = {"framework": TORCHTUNE, **parsed["training"]}
    if parsed["switches"]:
        training["switches"] = parsed["switches"]
    lora = parsed["lora"]
    attn, mlp = lora.pop("attn", None), lora.pop("mlp", False)
    if attn is not None:  # MLP alone: its config's attention modules are not known
        lora["targetModules"] = attn + (_MLP if mlp else [])
    fields["training"] = training
    if lora:
        fields["lora"] = lora
    read_keys = sorted(k for k in said if k in _OVERRIDES)
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


def _model_uri(
    trainjob: Mapping[str, Any], runtime: Mapping[str, Any] | None
) -> tuple[str | None, str]:
    """The model's URI and where it is said, as Trainer's builder sets the model
    initializer's STORAGE_URI: the TrainJob's storageUri upserted, then its env over it, on
    the runtime's container. "": said without a value (valueFrom); None: not said."""
    model = _at(trainjob, "spec", "initializer", "model")
    said = [
        (_env_uri(model.get("env")), f"spec.initializer.model.env {STORAGE_URI}"),
        (model.get("storageUri"), "spec.initializer.model.storageUri"),
    ]
    if runtime is not None:
        said.append(
            (_env_uri(_container(runtime, MODEL_JOB).get("env")),
             f"the runtime's {MODEL_JOB} {STORAGE_URI}")
        )  # fmt: skip
    return next(((uri, where) for uri, where in said if isinstance(uri, str)), (None, ""))


def _env_uri(env: object) -> str | None:
    """The last STORAGE_URI of a container's env ("" where it has no value), or None."""
    found = [e for e in _list(env) if e.get("name") == STORAGE_URI]
    if not found:
        return None
    value = found[-1].get("value")
    return value if isinstance(value, str) else ""


def _torch(runtime: Mapping[str, Any] | None) -> bool:
    """Whether Trainer's Torch plugin, which turns `tune run` into a recipe and config, runs
    for the runtime (not at hand: assumed)."""
    return runtime is None or TORCHTUNE_POLICY in _at(runtime, "spec", "mlPolicy")


def _nodes(trainer: Mapping[str, Any], runtime: Mapping[str, Any] | None) -> object:
    nodes = trainer.get("numNodes")
    if nodes is None and runtime is not None:
        nodes = runtime_nodes(runtime)[0]
    return nodes


def _picked(args: list[str], nodes: object) -> tuple[str, str]:
    """The method of the config Trainer appends to `tune run` (torchtune.go
    getRecipeAndConfig): one node, `model.quantize_base` in an arg (and no
    `model.use_dora`) QLoRA, else `model.lora_attn_modules` LoRA, else full; more nodes,
    full (its multi-node config)."""
    picked = "Full"
    if type(nodes) is not int or nodes <= 1:
        if any("model.quantize_base" in a for a in args) and not any(
            "model.use_dora" in a for a in args
        ):
            picked = "QLoRA"
        elif any("model.lora_attn_modules" in a for a in args):
            picked = "LoRA"
    return picked, "chosen by Trainer from spec.trainer.args"


def _configured(words: list[str]) -> tuple[str | None, str | None]:
    """The method a `--config` names, and the config."""
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
    return method, config


def _overrides(words: Iterable[str]) -> dict[str, str]:
    """torchtune's `key=value` overrides, the last of each key."""
    said: dict[str, str] = {}
    for word in words:
        key, eq, value = word.partition("=")
        if eq and not key.startswith("-"):
            said[key] = value
    return said


def _words(value: object) -> list[str] | None:
    """A command or args: a list of strings ([] for none), or None where it is not one."""
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(w, str) for w in value):
        return list(value)
    return None


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


def _length(value: str) -> int | None:
    return None if value.lower() in ("null", "none", "~") else _int(value)


def _dtype(value: str) -> str:
    precision = {"bf16": "BF16", "fp32": "FP32", "fp16": "FP16"}.get(value.lower())
    if precision is None:
        raise ValueError("a dtype of bf16, fp16 or fp32")
    return precision


_MODULES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
_MLP = ["gate_proj", "up_proj", "down_proj"]


def _modules(value: str) -> list[str]:
    names = [n.strip(" '\"") for n in value.strip("[]").split(",") if n.strip(" '\"")]
    if not names or any(n not in _MODULES for n in names):
        raise ValueError(f"a list of {', '.join(_MODULES)}")
    return [_MODULES[n] for n in names]


_SECTIONS = ("training", "switches", "lora", "method")
#: The torchtune overrides read: each into (section, FineTuneJob field, reader; ValueError:
#: unreadable, None: unset). `switches` are training.switches; `lora` attn and mlp make
#: lora.targetModules; `method` quantize turns LoRA into QLoRA and back.
_OVERRIDES: dict[str, tuple[str, str, Callable[[str], Any]]] = {
    "batch_size": ("training", "microBatchSize", _int),
    "tokenizer.max_seq_len": ("training", "sequenceLength", _length),
    "dataset.max_seq_len": ("training", "sequenceLength", _length),
    "gradient_accumulation_steps": ("training", "gradientAccumulationSteps", _int),
    "enable_activation_checkpointing": (
        "training", "gradientCheckpointing", lambda v: "On" if _bool(v) else "Off"
    ),
    "enable_activation_offloading": (
        "switches", "activationOffloading", lambda v: "CPU" if _bool(v) else "None"
    ),
    "compile": ("switches", "compile", _bool),
    "optimizer_in_bwd": ("switches", "optimizerInBackward", _bool),
    "dtype": ("training", "precision", _dtype),
    "model.lora_rank": ("lora", "rank", _int),
    "model.lora_attn_modules": ("lora", "attn", _modules),
    "model.apply_lora_to_mlp": ("lora", "mlp", _bool),
    "model.quantize_base": ("method", "quantize", _bool),
}  # fmt: skip


def _role(job: Mapping[str, Any]) -> str | None:
    """`trainer` or `model-initializer`: a replicated job by its ancestor label, as Trainer
    finds it (builder.go, FindPodSetByAncestor)."""
    label = _at(job, "template", "metadata", "labels").get(ANCESTOR_LABEL)
    return label if isinstance(label, str) and label in _CONTAINERS else None


def _trainer_job(runtime: object) -> Mapping[str, Any]:
    """The replicated job labelled trainer (the first, as Trainer's FindPodSetByAncestor), or
    {}."""
    found: Mapping[str, Any] = next((j for j in _jobs(runtime) if _role(j) == TRAINER), {})
    return found


def _container(runtime: Mapping[str, Any], role: str) -> Mapping[str, Any]:
    for job in _jobs(runtime):
        if _role(job) == role:
            for c in _list(_pod(job).get("containers")):
                if c.get("name") == _CONTAINERS[role]:
                    found: Mapping[str, Any] = c
                    return found
    return {}


def gpus_of(resources: Mapping[str, Any]) -> dict[str, object]:
    """The nvidia.com/gpu a container's resources say, by part (limits, requests)."""
    return {
        part: _at(resources, part)[GPU_RESOURCE]
        for part in ("limits", "requests")
        if _at(resources, part).get(GPU_RESOURCE) is not None
    }


def _jobs(runtime: object) -> list[Any]:
    return _list(_at(runtime, "spec", "template", "spec").get("replicatedJobs"))


def _pod(job: Mapping[str, Any]) -> Mapping[str, Any]:
    return _at(job, "template", "spec", "template", "spec")


def _at(obj: object, *keys: str) -> Mapping[str, Any]:
    for key in keys:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    found: Mapping[str, Any] = obj if isinstance(obj, Mapping) else {}
    return found


def _list(value: object) -> list[Any]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []
