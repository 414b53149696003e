"""FineTuneJob (vramgate.dev/v1alpha1): one fine-tuning run whose VRAM vramgate estimates.

These models are the single source of the CRD schema (`vramgate crds` renders them) and of
the field names the spec validator (`controller.jobs.spec`) accepts. Bounds come from the
estimator's own constants, so the schema and the validator cannot disagree on a limit.

Descriptions start with the field's name and state bounds and defaults: `kubectl explain
ftj.spec.training` shows them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field
from pydantic.config import JsonDict

from controller.api.base import ApiModel
from controller.api.conditions import Condition
from controller.api.enums import (
    AdmissionPolicy,
    AttentionImpl,
    CheckpointingMode,
    EstimateCorrection,
    EstimatorProfile,
    KbitPreparationMode,
    LoadPathMode,
    LossImpl,
    OffloadingMode,
    OptimizerName,
    ParallelismMode,
    PrecisionName,
    SavableModule,
    TrainingMethod,
)
from controller.estimator import (
    MAX_BATCH,
    MAX_GPUS,
    MAX_LORA_RANK,
    MAX_SEQUENCE_LENGTH,
    Attention,
    Checkpointing,
    Optimizer,
    Parallelism,
    Precision,
    Profile,
)
from controller.estimator.codec import MAX_TEXT

KIND = "FineTuneJob"
PLURAL = "finetunejobs"
SINGULAR = "finetunejob"
SHORT_NAMES = ("ftj",)

#: The bound of spec.priority: the range Kubernetes allows user PriorityClass values.
MAX_PRIORITY = 1_000_000_000
DEFAULT_CONFIG_KEY = "config.json"
#: A DNS-1123 subdomain: what the API server accepts as most objects' names (a FineTuneJob's,
#: a ConfigMap's). With the key of a ConfigMap's data (IsConfigMapKey: not `.`, `..` nor
#: starting with `..`), a reference no ConfigMap can satisfy is refused at apply instead of
#: retried as "not found".
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
CONFIG_MAP_KEY_PATTERN = r"^\.?[-_a-zA-Z0-9][-._a-zA-Z0-9]*$"
CONFIG_MAP_MAX_LENGTH = 253
FRAMEWORK_MAX_LENGTH = 63
#: The longest status.estimate.traced the schema allows: what the estimator's codec reads.
ESTIMATE_RECORD_MAX_LENGTH = MAX_TEXT
MODEL_SOURCES = ("preset", "config", "configMapRef")

PRESERVE_UNKNOWN: JsonDict = {"x-kubernetes-preserve-unknown-fields": True}
# CEL, so that the API server refuses an ambiguous model even when the webhook is not running.
EXACTLY_ONE_MODEL: JsonDict = {
    "x-kubernetes-validations": [
        {
            "rule": " + ".join(f"(has(self.{name}) ? 1 : 0)" for name in MODEL_SOURCES) + " == 1",
            "message": "must set exactly one of " + ", ".join(MODEL_SOURCES),
        }
    ]
}

# CEL, so that the API server refuses a LoRA job without a rank even when the webhook is down.
RANK_FOR_ADAPTERS: JsonDict = {
    "x-kubernetes-validations": [
        {
            "rule": "self.method == 'Full' || (has(self.lora) && has(self.lora.rank))",
            "message": "lora.rank is required when method is LoRA or QLoRA",
        }
    ]
}


# -- spec -----------------------------------------------------------------------------------


class ConfigMapRef(ApiModel):
    name: str = Field(
        min_length=1,
        max_length=CONFIG_MAP_MAX_LENGTH,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="name of the ConfigMap, in the job's namespace, that holds the model's "
        "config.json: a DNS-1123 subdomain of at most 253 characters. Required.",
    )
    key: str = Field(
        DEFAULT_CONFIG_KEY,
        min_length=1,
        max_length=CONFIG_MAP_MAX_LENGTH,
        pattern=CONFIG_MAP_KEY_PATTERN,
        description="key of the ConfigMap entry that holds the config.json text: letters, "
        "digits, '-', '_' and '.' (not starting with '..'), at most 253 characters. "
        "Default config.json.",
    )


class ModelSource(ApiModel):
    model_config = ConfigDict(**ApiModel.model_config, json_schema_extra=EXACTLY_ONE_MODEL)

    preset: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        description="preset names a model bundled with vramgate (e.g. llama-3.1-8b; its "
        "Hugging Face repo id also works; `vramgate presets` lists them). Exactly one of "
        "preset, config and configMapRef.",
    )
    config: dict[str, Any] | None = Field(
        None,
        description="config is the model's Hugging Face config.json, inline. Exactly one of "
        "preset, config and configMapRef.",
        json_schema_extra=PRESERVE_UNKNOWN,
    )
    config_map_ref: ConfigMapRef | None = Field(
        None,
        description="configMapRef names a ConfigMap entry holding the model's config.json, "
        "for configs too large to inline. Exactly one of preset, config and configMapRef.",
    )


class LoraSpec(ApiModel):
    rank: int | None = Field(
        None,
        ge=1,
        le=MAX_LORA_RANK,
        description=f"rank is the LoRA rank r, between 1 and {MAX_LORA_RANK} (16 is a common "
        "choice). Required when method is LoRA or QLoRA; it sets the adapter's size.",
    )
    target_modules: list[str] = Field(
        ["all-linear"],
        min_length=1,
        description="targetModules are the modules that get adapters: all-linear (every "
        "linear layer of every block, as PEFT) or module names such as q_proj, v_proj. "
        "Default [all-linear].",
    )
    modules_to_save: list[SavableModule] | None = Field(
        None,
        description="modulesToSave are modules trained in full beside the adapter: "
        "embed_tokens, lm_head. Default none.",
    )


class SwitchesSpec(ApiModel):
    """The trainer's memory-relevant switches, each overriding the framework's preset
    (controller/estimator/frameworks.json holds every preset's values and their sources)."""

    loss: LossImpl | None = Field(
        None,
        description="loss is how the cross-entropy is computed: Plain (the model's own: the "
        "whole logits in 16 bits, then an fp32 copy), Chunked (over chunks of tokens: one "
        "chunk's fp32 logits at a time), Fused (a fused linear cross-entropy: no logits). "
        "Default: the framework's, else Plain.",
    )
    compile: bool | None = Field(
        None,
        description="compile says the model runs under torch.compile. Recorded, not priced: "
        "the estimate is of the eager step. Default: the framework's, else false.",
    )
    load_path: LoadPathMode | None = Field(
        None,
        description="loadPath is how each GPU comes to hold its shard: MetaSharded (never more "
        "than its shard and one wrapped unit) or WholeModelPerRank (the whole model on every "
        "GPU before sharding: a load-time peak of all the weights on each GPU). Default: the "
        "framework's, else MetaSharded.",
    )
    activation_offloading: OffloadingMode | None = Field(
        None,
        description="activationOffloading is where saved activations wait for backward: None "
        "(on the GPU) or CPU (the GPU holds one layer's). Default: the framework's, else None.",
    )
    fsdp_version: Literal[1, 2] | None = Field(
        None,
        description="fsdpVersion is the FSDP implementation, 1 or 2. Recorded; FSDP1 is priced "
        "as FSDP2. Default: the framework's, else 2.",
    )
    optimizer_in_backward: bool | None = Field(
        None,
        description="optimizerInBackward says each parameter is stepped as soon as its gradient "
        "is made, so the whole gradients are never held; needs gradientAccumulationSteps 1. "
        "Default: the framework's, else false.",
    )
    kbit_preparation: KbitPreparationMode | None = Field(
        None,
        description="kbitPreparation is what the trainer does to a QLoRA model's parameters "
        "that are not 4-bit: None (left 16-bit), UpcastNonQuantized (PEFT's "
        "prepare_model_for_kbit_training: embeddings, norms and LM head in fp32) or "
        "UpcastNorms (that, then the embeddings and LM head back to 16 bits, as TRL 0.8 to "
        "0.25 did under bf16). Either fp32 variant runs the residual stream in fp32. Applies "
        "to 4-bit models only. Default: the framework's, else None.",
    )


class TrainingSpec(ApiModel):
    framework: str | None = Field(
        None,
        max_length=FRAMEWORK_MAX_LENGTH,
        description="framework is the training framework; a known one sets the switches that "
        "change memory (huggingface, also hf, transformers, trl or accelerate; torchtune; "
        "litgpt; unsloth; axolotl; llama-factory). Any other name is kept as a label and "
        "estimated with the default switches. Optional.",
    )
    micro_batch_size: int = Field(
        1,
        ge=1,
        le=MAX_BATCH,
        description=f"microBatchSize is the number of sequences each GPU processes per "
        f"forward pass. Between 1 and {MAX_BATCH}; default 1.",
    )
    sequence_length: int = Field(
        2048,
        ge=1,
        le=MAX_SEQUENCE_LENGTH,
        description=f"sequenceLength is the number of tokens per sequence. Between 1 and "
        f"{MAX_SEQUENCE_LENGTH}, and at most the model's context length; default 2048.",
    )
    image_tokens: int = Field(
        0,
        ge=0,
        le=MAX_SEQUENCE_LENGTH,
        description=f"imageTokens is the number of sequence positions each sample's images "
        f"take in a vision-language model's language model (256 per image for Gemma 3, "
        f"(H/28)x(W/28) per image for Qwen2.5-VL), added to sequenceLength (the text tokens) "
        f"for the language model's activations; the frozen vision tower that makes them keeps "
        f"nothing for backward. Between 0 and {MAX_SEQUENCE_LENGTH}; only for a model with a "
        f"vision tower; default 0.",
    )
    gradient_checkpointing: CheckpointingMode = Field(
        Checkpointing.ON,
        description="gradientCheckpointing is how activations are kept for the backward "
        "pass: On (recomputed per layer), Off (all stored), Unsloth (offloaded to CPU). "
        "Default On.",
    )
    optimizer: OptimizerName = Field(
        Optimizer.ADAMW,
        description="optimizer is the optimizer and how it stores its states: AdamW, "
        "AdamW8bit, AdamWFp32Master, AdamWTorch, PagedAdamW32bit, SGD. Default AdamW.",
    )
    attention: AttentionImpl = Field(
        Attention.FLASH_ATTENTION_2,
        description="attention is the attention implementation: FlashAttention2, SDPA, "
        "FlexAttention, Eager (Eager stores the quadratic score matrix). "
        "Default FlashAttention2.",
    )
    precision: PrecisionName = Field(
        Precision.BF16,
        description="precision is the compute dtype of weights and activations: BF16, "
        "FP16, FP32. Default BF16.",
    )
    fused_loss: bool = Field(
        False,
        description="fusedLoss true is the older spelling of switches.loss Fused: the loss is "
        "a fused cross-entropy kernel that never materialises the logits. Default false.",
    )
    gradient_accumulation_steps: int = Field(
        1,
        ge=1,
        le=MAX_BATCH,
        description=f"gradientAccumulationSteps is the number of micro-batches per optimizer "
        f"step; it changes no memory. Between 1 and {MAX_BATCH}; default 1.",
    )
    switches: SwitchesSpec | None = Field(
        None,
        description="switches override the framework's memory-relevant switches one by one. "
        "Optional.",
    )


class EstimatorSpec(ApiModel):
    profile: EstimatorProfile = Field(
        Profile.CALIBRATED,
        description="profile is the estimation method: Calibrated (a formula fitted to traces "
        "of real training steps), Analytic (exact tensor count x 1.1, the first-principles "
        "calculator), Unsloth (Unsloth's calibrated formula, for jobs trained with Unsloth) or "
        "Trace (a training step of the real model on fake tensors: exact, but seconds per "
        "estimate and the operator needs the trace extra). Default Calibrated.",
    )


# CEL, so that the API server refuses inverted Resize bounds, and a request outside them,
# even when the webhook is down. A request outside the bounds would be admitted as asked
# before Resize ever looked at the bounds. One rule per bound, reported at the field it
# refuses and worded as the spec validator words it, so each message is true where it fires.
# The API server defaults minGPUs to 1 before it validates, so "minGPUs is set" cannot be
# told from the object: the gpus-below-minGPUs rule is skipped for minGPUs 1, where it
# would only repeat the field's own minimum (gpus: 0 was also told it lay outside a minGPUs
# and maxGPUs nobody wrote). maxGPUs has no default: its rule fires only when it is set.
# No messageExpression with the values: string() of an integer is priced past the API
# server's CEL cost budget, and it refuses the CRD.
GPU_BOUNDS_ORDERED: JsonDict = {
    "x-kubernetes-validations": [
        {
            "rule": "!has(self.maxGPUs) || !has(self.minGPUs) || self.minGPUs <= self.maxGPUs",
            "message": "must be greater than or equal to minGPUs",
            "fieldPath": ".maxGPUs",
        },
        {
            "rule": "!has(self.gpus) || !has(self.minGPUs) || self.minGPUs <= 1 || "
            "self.minGPUs <= self.gpus",
            "message": "must be greater than or equal to minGPUs",
            "fieldPath": ".gpus",
        },
        {
            "rule": "!has(self.gpus) || !has(self.maxGPUs) || self.gpus <= self.maxGPUs",
            "message": "must be less than or equal to maxGPUs",
            "fieldPath": ".gpus",
        },
    ]
}


class ResourcesSpec(ApiModel):
    model_config = ConfigDict(**ApiModel.model_config, json_schema_extra=GPU_BOUNDS_ORDERED)

    gpus: int = Field(
        1,
        ge=1,
        le=MAX_GPUS,
        description=f"gpus is the number of GPUs requested. Between 1 and {MAX_GPUS}, and "
        "between minGPUs and maxGPUs; default 1. With admissionPolicy Resize, admission may "
        "change it.",
    )
    min_gpus: int = Field(
        1,
        ge=1,
        le=MAX_GPUS,
        alias="minGPUs",
        description=f"minGPUs is the fewest GPUs admissionPolicy Resize may admit the job "
        f"on. Between 1 and {MAX_GPUS}, at most maxGPUs and gpus (so set gpus too when "
        "minGPUs is above 1); default 1.",
    )
    max_gpus: int | None = Field(
        None,
        ge=1,
        le=MAX_GPUS,
        alias="maxGPUs",
        description=f"maxGPUs is the most GPUs admissionPolicy Resize may admit the job on. "
        f"Between 1 and {MAX_GPUS}, at least minGPUs; default no bound but {MAX_GPUS}.",
    )
    gpu_selector: dict[str, str] | None = Field(
        None,
        description="gpuSelector restricts placement to nodes with these labels, e.g. "
        "nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3. Default any GPU node.",
    )


class FineTuneJobSpec(ApiModel):
    model_config = ConfigDict(**ApiModel.model_config, json_schema_extra=RANK_FOR_ADAPTERS)

    model: ModelSource = Field(
        description="model is the model being fine-tuned: exactly one of preset, config "
        "(inline config.json) and configMapRef. Required.",
    )
    method: TrainingMethod = Field(
        description="method is how the model is trained: Full (every weight), LoRA "
        "(adapters on a 16-bit base), QLoRA (adapters on a 4-bit NF4 base). Required.",
    )
    lora: LoraSpec | None = Field(
        None,
        description="lora configures the adapters; required when method is LoRA or QLoRA "
        "(its rank has no default).",
    )
    training: TrainingSpec = Field(
        default_factory=TrainingSpec,
        description="training holds the settings of one training step that decide its "
        "memory. Every field has a default.",
        json_schema_extra={"default": {}},
    )
    estimator: EstimatorSpec = Field(
        default_factory=EstimatorSpec,
        description="estimator selects how the VRAM is estimated. Default profile Calibrated.",
        json_schema_extra={"default": {}},
    )
    parallelism: ParallelismMode = Field(
        Parallelism.FSDP,
        description="parallelism is how memory spreads over GPUs: DDP (each GPU holds the "
        "whole job), FSDP (weights, gradients and optimizer states sharded; ZeRO-3 alike), "
        "DeviceMap (layers split over the GPUs of one node). Default FSDP.",
    )
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec,
        description="resources are the GPUs requested. Default 1 GPU of any product.",
        json_schema_extra={"default": {}},
    )
    admission_policy: AdmissionPolicy = Field(
        AdmissionPolicy.ENFORCE,
        description="admissionPolicy is what admission does when the requested GPU count is "
        "not the count that fits: Enforce (admit as asked or reject), Resize (admit with "
        "the count that fits), Advise (admit as asked and warn). Default Enforce.",
    )
    priority_class_name: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="priorityClassName names the PriorityClass (scheduling.k8s.io) whose value "
        "orders the admission queue: higher first, then older first, across namespaces. "
        "Default: the pod template's priorityClassName, else the cluster's globalDefault "
        "class, else 0. A class that does not exist leaves the job undecided until it does; "
        "the system classes (above 1,000,000,000) are not for jobs.",
    )
    priority: int = Field(
        0,
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description=f"priority is a raw queue priority, honoured only in the namespaces the "
        f"operator's rawPriorityNamespaces lists (an administrator's), where it takes the "
        f"place of the class's value; ignored, and said so, elsewhere. Between "
        f"-{MAX_PRIORITY:,} and {MAX_PRIORITY:,} (as user PriorityClass values); default 0.",
    )
    estimate_correction: EstimateCorrection | None = Field(
        None,
        description="estimateCorrection is what the correction the operator learned from jobs "
        "like this one (LearnedCorrection) may do to its per-GPU figure: Off (the estimate "
        "stands), RaiseOnly (never reserve less than the estimate) or Adjust (up or down). "
        "Unset: the operator's learning.policy (default adjust).",
    )
    suspend: bool = Field(
        False,
        description="suspend keeps the job from being admitted while true; it is still "
        "estimated. Default false.",
    )
    queue_name: str | None = Field(
        None,
        min_length=1,
        max_length=63,  # a label value: kueue.x-k8s.io/queue-name
        pattern=DNS_LABEL_PATTERN,
        description="queueName hands the job to Kueue: once estimated, its workload is created "
        "suspended in this LocalQueue of the job's namespace, so Kueue's quotas, fair sharing "
        "and preemption apply, and vramgate's AdmissionCheck on the LocalQueue's ClusterQueue "
        "places it by GPU memory on one node (admissionPolicy Resize: sized first, within "
        "minGPUs and maxGPUs; Advise counts as Enforce). Needs the operator's "
        "kueueAdmissionCheck. Unset: vramgate admits the job itself.",
    )
    template: dict[str, Any] | None = Field(
        None,
        description="template is the PodTemplateSpec of the trainer; the workload vramgate "
        "creates on admission runs it. Optional.",
        json_schema_extra=PRESERVE_UNKNOWN,
    )


# -- status ---------------------------------------------------------------------------------


class PerGpuLevels(ApiModel):
    allocated_bytes: int = Field(
        ge=0,
        description="allocatedBytes is what tensors hold on each GPU at the step's peak "
        "(torch.cuda.max_memory_allocated).",
    )
    reserved_bytes: int = Field(
        ge=0,
        description="reservedBytes is what PyTorch's caching allocator reserves on each GPU "
        "(torch.cuda.max_memory_reserved): the tensors plus the allocator's cached blocks.",
    )
    nvml_bytes: int = Field(
        ge=0,
        description="nvmlBytes is what NVML (nvidia-smi) shows for each GPU's process: the "
        "reservation plus the CUDA context and NCCL's buffers. It equals perGpuBytes, the "
        "figure admission reserves.",
    )


class CorrectionStatus(ApiModel):
    """`controller.learning.Correction`, as status keeps it."""

    estimate_bytes: int = Field(
        ge=0, description="estimateBytes is the estimator's per-GPU figure, in bytes."
    )
    per_gpu_bytes: int = Field(
        ge=0,
        description="perGpuBytes is the figure admission decides on: estimateBytes x "
        "factorPercent / 100, rounded up.",
    )
    factor_percent: int = Field(ge=1, description="factorPercent is the factor, in percent.")
    source: str = Field(
        description="source is where the factor came from: Learned, Pinned, OutOfMemory, "
        "TooFewSamples or Off."
    )
    key: str | None = Field(
        None, description="key is the LearnedCorrection key the factor came from."
    )
    samples: int = Field(ge=0, description="samples is how many jobs that key learned from.")
    percentile: int = Field(ge=1, description="percentile is the percentile of the ratios used.")
    message: str = Field(description="message says the correction in one line.")


class ReplacedSample(ApiModel):
    """The sample a job filed while it ran, which its end's sample replaces."""

    observed_bytes: int = Field(ge=0, description="observedBytes of the sample replaced.")
    predicted_bytes: int = Field(ge=1, description="predictedBytes of the sample replaced.")
    time: datetime = Field(description="time of the sample replaced.")


class LearnedSample(ApiModel):
    """What a job taught: written with the status that ends it, or while it runs once its
    peak is steady, then filed under its LearnedCorrection keys by the operator's leader
    (`controller.admission.learned`)."""

    key: str = Field(description="key is the job's finest LearnedCorrection key.")
    kind: Literal["Steady", "OutOfMemory"] = Field(
        description="kind is Steady (the job ran to its end, or ran with its peak steady "
        "for the operator's learningSteadySeconds: its peak is its need) or OutOfMemory (it "
        "died of GPU OOM: it needed more than it had)."
    )
    observed_bytes: int = Field(
        ge=0, description="observedBytes is the job's highest observed per-GPU peak, in bytes."
    )
    predicted_bytes: int = Field(
        ge=1,
        description="predictedBytes is the estimator's own per-GPU figure (NVML level) at the "
        "GPUs admitted, in bytes.",
    )
    reserved_bytes: int = Field(
        ge=0, description="reservedBytes is what admission reserved per GPU, in bytes."
    )
    time: datetime = Field(
        description="time is when the job ended, or when its running peak was found steady."
    )
    running: bool = Field(
        False,
        description="running is true for a sample taken while the job ran (its peak steady): "
        "the sample of its end replaces it.",
    )
    revision: int = Field(
        0,
        ge=0,
        le=1,
        description="revision is 0 for a job's first sample and 1 for the sample its end "
        "filed in place of the running one (counted as <uid>/1).",
    )
    replaces: ReplacedSample | None = Field(
        None,
        description="replaces is the running sample this one takes the place of: the leader "
        "takes it out of the keys that counted it.",
    )


class EstimateStatus(ApiModel):
    model: str = Field(
        description="model is what was estimated: the preset name, inline, or "
        "configmaps/<name>[<key>].",
    )
    profile: str = Field(description="profile is the estimator profile used: analytic, unsloth.")
    components: dict[str, int] = Field(
        description="components maps each part of the estimate (weights, gradients, "
        "optimizer, activations, logits, overhead, ...) to bytes; they sum to totalBytes.",
    )
    total_bytes: int = Field(
        ge=0, description="totalBytes is the training memory of one replica, in bytes."
    )
    per_gpu_bytes: int = Field(
        ge=0,
        description="perGpuBytes is the memory each GPU needs with the job's parallelism "
        "on `gpus` GPUs, in bytes.",
    )
    gpus: int = Field(ge=1, description="gpus is the GPU count perGpuBytes is for.")
    parallelism: ParallelismMode = Field(
        description="parallelism is the parallelism perGpuBytes assumes."
    )
    total_params: int = Field(ge=0, description="totalParams is the model's parameter count.")
    trainable_params: int = Field(
        ge=0, description="trainableParams is the number of parameters that get gradients."
    )
    total_gib: str = Field(
        alias="total",
        description="total is totalBytes in GiB, for people (7.25 GiB): the job on one GPU, "
        "not a sum over its GPUs.",
    )
    per_gpu_gib: str = Field(
        alias="perGpu", description="perGpu is perGpuBytes in GiB, for people."
    )
    per_gpu_levels: PerGpuLevels | None = Field(
        default=None,
        description="perGpuLevels is perGpuBytes at the three levels people measure it: "
        "allocated, reserved and NVML.",
    )
    correction: CorrectionStatus | None = Field(
        default=None,
        description="correction is what admission learned from jobs like this one and "
        "applies to perGpuBytes (the estimator's own figure): the factor, where it came from, "
        "and the figure reserved. Absent when learning has nothing to say (off, too few jobs).",
    )
    config: str | None = Field(
        default=None,
        max_length=63,
        description="config names the configuration the estimate was made of: 12 hex digits "
        "of the SHA-256 of the spec's model, method, lora, training, parallelism and "
        "estimator, defaults filled (a ConfigMap's model as the config.json it held). Jobs of "
        "one configuration learn their correction together (LearnedCorrection spec.config).",
    )
    digest: str | None = Field(
        default=None,
        min_length=64,
        max_length=64,
        pattern=r"^[0-9a-f]{64}$",
        description="digest is the sha256 (hex) of what a traced estimate was computed from: "
        "the spec's fields that change it, the model config read from its ConfigMap, and "
        "vramgate's version with a hash of its estimator's code. Set with traced; while it "
        "matches, no operator replica traces the job again.",
    )
    traced: str | None = Field(
        default=None,
        max_length=ESTIMATE_RECORD_MAX_LENGTH,
        description="traced is the traced estimate itself, as vramgate reads it back "
        "(versioned JSON text, with the trace libraries' versions): present for profile "
        "Trace only. A value that does not read back (edited, or written by another version) "
        "is ignored and the job traced again, as by an operator whose trace libraries differ.",
    )


class NodePlacement(ApiModel):
    node: str = Field(description="node is the node the GPUs are on.")
    gpu_indices: list[int] = Field(
        description="gpuIndices are the NVML indices of the GPUs reserved on the node, in the "
        "order the workload sees them.",
    )
    gpu_uuids: list[str] = Field(
        alias="gpuUUIDs",
        description="gpuUUIDs are the UUIDs of the GPUs (or MIG devices) reserved on the node, "
        "in the same order.",
    )


class Placement(ApiModel):
    nodes: list[NodePlacement] = Field(
        description="nodes are the nodes and GPUs the job's workload runs on: one for a "
        "single-node job, k with the same GPU count each for DDP or FSDP across nodes.",
    )
    requested_gpus: int = Field(
        ge=1,
        alias="requestedGPUs",
        description="requestedGPUs is spec.resources.gpus at admission.",
    )
    admitted_gpus: int = Field(
        ge=1,
        alias="admittedGPUs",
        description="admittedGPUs is the GPU count admitted; differs from requestedGPUs "
        "only with admissionPolicy Resize.",
    )
    per_gpu_bytes: int = Field(
        ge=0,
        description="perGpuBytes is the memory reserved on each GPU of nodes, in bytes: the "
        "estimate's per-GPU figure at admittedGPUs. The reservation ledger is these fields.",
    )


class WorkloadRef(ApiModel):
    api_version: str = Field(description="apiVersion of the workload, e.g. batch/v1.")
    kind: str = Field(description="kind of the workload, e.g. Job.")
    name: str = Field(description="name of the workload, in the job's namespace.")
    uid: str | None = Field(None, description="uid of the workload.")


class ObservedGpu(ApiModel):
    node: str = Field(description="node is the node the GPU is on.")
    index: int = Field(ge=0, description="index is the GPU's NVML index on the node (0 or more).")
    uuid: str = Field(
        min_length=1, description="uuid is the GPU's (or MIG device's) UUID; the list's key."
    )
    peak_bytes: int = Field(
        ge=0,
        description="peakBytes is the most GPU memory the job's pods were seen using on this "
        "GPU at once while the job ran, in bytes (0 or more): the sum of their processes' "
        "usage as the node agent reported it. Only ever increases.",
    )


class ObservedStatus(ApiModel):
    peak_bytes: int = Field(
        ge=0,
        description="peakBytes is the largest gpus[].peakBytes, in bytes (0 or more): compare "
        "it with placement.perGpuBytes to see how close the estimate came.",
    )
    peak_gib: str = Field(alias="peak", description="peak is peakBytes in GiB, for people.")
    peak_since: datetime | None = Field(
        None,
        description="peakSince is when peakBytes last grew by more than the write threshold "
        "(or was first seen): a running job whose peak has not grown for the operator's "
        "learningSteadySeconds teaches admission at once.",
    )
    gpus: list[ObservedGpu] = Field(
        description="gpus are the GPUs the job's pods were seen on, each with its peak. "
        "Written when a peak grows by more than 256 MiB or 5 % (whichever is larger), at the "
        "first observation, and with every other status write, so a heartbeat alone does not "
        "cost a write; the figure is therefore at most that much behind while the job runs.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["uuid"],
        },
    )
    image_digest: str | None = Field(
        None,
        max_length=135,
        description="imageDigest is the digest of the trainer image the job's pods run "
        "(sha256:<hex>), as the first of them to report it said (the trainer container's "
        "status.containerStatuses[].imageID); absent until a pod reports one. The job's "
        "learned sample is filed under it, and a job whose template names the same image "
        "by tag is admitted as a job of the digest reported last. Written once.",
    )
    image_digest_time: datetime | None = Field(
        None,
        description="imageDigestTime is when the operator first read imageDigest off the "
        "job's pods: of the jobs of one template image, the latest says what its tag is now.",
    )


class FineTuneJobStatus(ApiModel):
    estimate: EstimateStatus | None = Field(
        None,
        description="estimate is the VRAM estimate of the spec at observedGeneration; absent "
        "while the spec is invalid.",
    )
    placement: Placement | None = Field(
        None, description="placement is where admission put the job's workload."
    )
    conditions: list[Condition] | None = Field(
        None,
        description="conditions are Estimated and Admitted, as metav1.Condition.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    observed_generation: int | None = Field(
        None,
        ge=0,
        description="observedGeneration is the metadata.generation status was computed for.",
    )
    workload_ref: WorkloadRef | None = Field(
        None, description="workloadRef names the workload created when the job was admitted."
    )
    queue_name: str | None = Field(
        None,
        description="queueName is the Kueue LocalQueue the job was handed to (spec.queueName "
        "when it was): its GPU memory is then held by its Kueue Workload, not by the job; "
        "removed when it is taken back (suspended, or edited while it waits in Kueue).",
    )
    learned_sample: LearnedSample | None = Field(
        None,
        description="learnedSample is what the job taught admission once it ended (its peak "
        "over its prediction, or its GPU OOM): set with the status that ends it, so that the "
        "operator counts it exactly once and can rebuild a LearnedCorrection from it.",
    )
    observed: ObservedStatus | None = Field(
        None,
        description="observed is the GPU memory the job's pods were seen using while it ran "
        "(from the node agents' per-pod figures in GPUNode status): each GPU's peak and the "
        "largest. Absent until the agent first sees the job's processes; kept once the job "
        "finishes; removed when the job is suspended (its GPUs are released).",
    )
