"""What a fine-tuning run does, as the estimator needs it, and the one validator for it.

The same `validate_settings` serves the CLI (exit 2), the admission webhook (refusal) and the
operator (`InvalidSpec`), so a bad value gets the same one-line message everywhere. It returns
*every* error with its field path, because fixing one field per round trip is slow.

Field paths are the FineTuneJob's (`training.microBatchSize`); the CLI maps them to its flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Self

from controller.estimator.errors import SpecError, shown


def _key(text: str) -> str:
    return text.lower().replace("-", "").replace("_", "").replace(" ", "")


class Choice(StrEnum):
    """An enum parsed case- and punctuation-insensitively: `QLoRA`, `qlora`, `q_lora`.

    Each member holds both its spellings: its value, the lower-case token of the estimator and
    the CLI (`qlora`), and `api`, the CamelCase word of the vramgate.dev API (`QLoRA`), from
    which `controller.api.enums` builds the CRD's enums. One list per concept, so the two
    spellings cannot drift apart. Members are listed in the API's order (its default first).
    """

    api: str

    def __new__(cls, token: str, api: str) -> Self:
        member = str.__new__(cls, token)
        member._value_ = token
        member.api = api
        return member

    @classmethod
    def parse(cls, value: object, path: str) -> Self:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            wanted = _key(value)
            for member in cls:
                if wanted in (_key(member.value), _key(member.name), _key(member.api)):
                    return member
            for alias, member_value in _ALIASES.get(cls.__name__, {}).items():
                if _key(alias) == wanted:
                    return next(member for member in cls if member.value == member_value)
        allowed = ", ".join(m.value for m in cls)
        raise SpecError(path, f"unsupported value {shown(value)}; allowed: {allowed}")


class Method(Choice):
    FULL = "full", "Full"
    LORA = "lora", "LoRA"
    QLORA = "qlora", "QLoRA"


class Checkpointing(Choice):
    ON = "on", "On"
    OFF = "off", "Off"
    UNSLOTH = "unsloth", "Unsloth"


class Optimizer(Choice):
    ADAMW = "adamw", "AdamW"
    ADAMW_8BIT = "adamw-8bit", "AdamW8bit"
    ADAMW_FP32_MASTER = "adamw-fp32-master", "AdamWFp32Master"
    ADAMW_TORCH = "adamw-torch", "AdamWTorch"
    PAGED_ADAMW_32BIT = "paged-adamw-32bit", "PagedAdamW32bit"
    SGD = "sgd", "SGD"


class Attention(Choice):
    FLASH_ATTENTION_2 = "flash_attention_2", "FlashAttention2"
    SDPA = "sdpa", "SDPA"
    FLEX_ATTENTION = "flex_attention", "FlexAttention"
    EAGER = "eager", "Eager"


class Precision(Choice):
    BF16 = "bf16", "BF16"
    FP16 = "fp16", "FP16"
    FP32 = "fp32", "FP32"


class Profile(Choice):
    CALIBRATED = "calibrated", "Calibrated"  # a formula fitted to traces (calibration.json)
    ANALYTIC = "analytic", "Analytic"
    UNSLOTH = "unsloth", "Unsloth"
    TRACE = "trace", "Trace"  # a real training step on fake tensors (needs the `trace` extra)


class Parallelism(Choice):
    DDP = "ddp", "DDP"
    FSDP = "fsdp", "FSDP"
    DEVICE_MAP = "device-map", "DeviceMap"

    @property
    def prose(self) -> str:
        """Its name in a sentence (`2 x 80GB with a device map`): the API's word, but for
        DeviceMap, which reads as a type name there."""
        return "a device map" if self is Parallelism.DEVICE_MAP else self.api


class Loss(Choice):
    """How the cross-entropy over the vocabulary is computed (`frameworks.json`, `loss`)."""

    PLAIN = "plain", "Plain"  # the model's own: whole 16-bit logits, then an fp32 upcast
    CHUNKED = "chunked", "Chunked"  # per chunk of tokens: one chunk's fp32 logits at a time
    FUSED = "fused", "Fused"  # fused linear cross-entropy: no logits materialised


class LoadPath(Choice):
    """How each rank comes to hold its shard of the weights (`frameworks.json`, `loadPath`)."""

    META_SHARDED = "meta-sharded", "MetaSharded"
    WHOLE_MODEL_PER_RANK = "whole-model-per-rank", "WholeModelPerRank"


class Offloading(Choice):
    """Where saved activations wait for backward (`frameworks.json`, `activationOffloading`)."""

    NONE = "none", "None"
    CPU = "cpu", "CPU"


class KbitPreparation(Choice):
    """What the trainer does to a 4-bit model's other parameters before training
    (`frameworks.json`, `kbitPreparation`): nothing; PEFT's `prepare_model_for_kbit_training`
    (every parameter that is not 4-bit to fp32: embeddings, norms, LM head); or that, then
    the embeddings and LM head back to 16 bits (TRL 0.8 to 0.25 under bf16), norms fp32.
    Either fp32 variant makes the residual stream fp32 (an fp32 norm's output is fp32, and
    bitsandbytes' 4-bit linear returns its input's dtype)."""

    NONE = "none", "None"
    UPCAST_NORMS = "upcast-norms", "UpcastNorms"
    UPCAST_NON_QUANTIZED = "upcast-non-quantized", "UpcastNonQuantized"


#: The FSDP versions a job may name (`Switches.fsdp_version`).
FSDP_VERSIONS = (1, 2)


@dataclass(frozen=True, slots=True)
class Switches:
    """The trainer's memory-relevant switches: what a framework preset sets
    (`controller.estimator.frameworks`), each also settable on its own. The defaults are what
    the profiles assumed before the switches existed (the model's own loss, eager, a sharded
    load, activations kept on the GPU, FSDP2, a separate optimizer step, a 4-bit model's
    other parameters left 16-bit), so an estimate without switches is unchanged."""

    loss: Loss = Loss.PLAIN
    compile: bool = False
    load_path: LoadPath = LoadPath.META_SHARDED
    activation_offloading: Offloading = Offloading.NONE
    fsdp_version: int = 2
    optimizer_in_backward: bool = False
    kbit_preparation: KbitPreparation = KbitPreparation.NONE


DEFAULT_SWITCHES = Switches()
#: Switches field -> its camelCase name under `spec.training.switches` (and the CLI's flag).
SWITCH_NAMES = {
    "loss": "loss",
    "compile": "compile",
    "load_path": "loadPath",
    "activation_offloading": "activationOffloading",
    "fsdp_version": "fsdpVersion",
    "optimizer_in_backward": "optimizerInBackward",
    "kbit_preparation": "kbitPreparation",
}


def switch_path(camel: str, switches_path: str, paths: Mapping[str, str] | None = None) -> str:
    """Where errors name one switch (`camel`, its camelCase name): its own entry in `paths`
    (`switches.loss` -> the CLI's `--loss`), else `<switches_path>.<camel>`
    (`spec.training.switches.loss`)."""
    return (paths or {}).get(f"switches.{camel}", f"{switches_path}.{camel}")


_ALIASES: dict[str, dict[str, str]] = {
    "Checkpointing": {"true": "on", "false": "off", "none": "off", "enabled": "on"},
    "Optimizer": {
        "adamw_8bit": "adamw-8bit",
        "adamw_bnb_8bit": "adamw-8bit",
        "paged_adamw_8bit": "adamw-8bit",
        "adamw_torch_fused": "adamw-torch",
        "adamw32bit": "adamw",
    },
    "Attention": {"flash": "flash_attention_2"},
    "Parallelism": {"zero3": "fsdp", "deepspeedzero3": "fsdp"},
    "Method": {"fullfinetuning": "full"},
    "Offloading": {"off": "none", "false": "none"},
}

#: A frozenset, not `(Method.LORA, Method.QLORA)`: under Python 3.11 each read of a member off
#: its class costs ~0.1 us, and `is_adapter` is asked several times an estimate.
_ADAPTER_METHODS = frozenset({Method.LORA, Method.QLORA})
DEFAULT_METHOD = Method.QLORA
DEFAULT_RANK = 16
MAX_LORA_RANK = 65_536
MAX_SEQUENCE_LENGTH = 16_777_216
MAX_BATCH = 1_000_000
#: The most GPUs one job may run on (`spec.resources.gpus`, `vramgate estimate --gpus`): far
#: above any single job today, low enough to keep the packing search bounded.
MAX_GPUS = 4096
#: The most GPUs of a job estimated with profile Trace (`spec.resources.gpus`): one rank is
#: traced at the job's world size in the operator's own process, and its time grows with the
#: world size (Llama-3.2-1B Full under FSDP, one CPU process: 19 s at 8 ranks, 226 s at
#: 4,096), so one job could hold a trace worker for minutes. 1,024 ranks is 128 nodes of 8
#: GPUs, past any fine-tune a cluster of this operator admits; a bigger job can use a
#: formula profile.
MAX_TRACE_GPUS = 1024

#: Module names PEFT can save in full beside the adapter (`modules_to_save`).
SAVABLE_MODULES = ("embed_tokens", "lm_head")


@dataclass(frozen=True, slots=True)
class TrainingSettings:
    """One micro-step of training on one data-parallel rank, and how it is set up.

    Defaults are those of the seed's worked example (QLoRA-ready, r=16 on all linear
    layers, 2,048 tokens, batch 1, checkpointing on, 32-bit AdamW, bf16, flash attention),
    so a bare estimate reproduces a figure people can check.
    """

    method: Method = DEFAULT_METHOD
    rank: int | None = DEFAULT_RANK
    targets: tuple[str, ...] = ("all-linear",)
    modules_to_save: tuple[str, ...] = ()
    batch: int = 1
    seq_len: int = 2048
    #: The sequence positions each sample's images take in the language model (a
    #: vision-language model's image tokens: 256 per image for Gemma 3, (H/28) x (W/28) per
    #: image for Qwen2.5-VL), beside `seq_len` text tokens. The language model runs on both
    #: (`lm_seq_len`); the vision tower that makes them is frozen and keeps nothing for
    #: backward. 0: text only.
    image_tokens: int = 0
    gradient_checkpointing: Checkpointing = Checkpointing.ON
    optimizer: Optimizer = Optimizer.ADAMW
    attention: Attention = Attention.FLASH_ATTENTION_2
    fused_loss: bool = False
    precision: Precision = Precision.BF16
    profile: Profile = Profile.ANALYTIC
    gradient_accumulation: int = 1
    #: The trainer's switches, resolved from `framework` and explicit overrides
    #: (`frameworks.resolve`); `fused_loss` above is the older spelling of `loss: fused`.
    switches: Switches = DEFAULT_SWITCHES
    #: The framework the job names, as given (a label where vramgate does not know it).
    framework: str | None = field(default=None, compare=False)
    extras: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_adapter(self) -> bool:
        return self.method in _ADAPTER_METHODS

    @property
    def lm_seq_len(self) -> int:
        """The positions the language model runs per sample: text tokens plus image tokens.
        Every profile prices activations, logits and the batch at this length."""
        return self.seq_len + self.image_tokens

    @property
    def tokens_said(self) -> str:
        """The tokens per sample in a sentence: `2048 tokens`, `512 text + 256 image tokens`."""
        if self.image_tokens:
            return f"{self.seq_len} text + {self.image_tokens} image tokens"
        return f"{self.seq_len} tokens"

    @property
    def loss(self) -> Loss:
        """The loss implementation: `fused_loss` (the older field) or the switches'."""
        return Loss.FUSED if self.fused_loss else self.switches.loss


# Field paths of each setting in a FineTuneJob spec.
PATHS = {
    "method": "method",
    "rank": "lora.rank",
    "targets": "lora.targetModules",
    "modules_to_save": "lora.modulesToSave",
    "batch": "training.microBatchSize",
    "seq_len": "training.sequenceLength",
    "image_tokens": "training.imageTokens",
    "gradient_checkpointing": "training.gradientCheckpointing",
    "optimizer": "training.optimizer",
    "attention": "training.attention",
    "fused_loss": "training.fusedLoss",
    "precision": "training.precision",
    "profile": "estimator.profile",
    "gradient_accumulation": "training.gradientAccumulationSteps",
    "framework": "training.framework",
    "switches": "training.switches",
}


def int_in_range(value: object, path: str, low: int, high: int, errors: list[SpecError]) -> int:
    """`value` if it is an integer (a bool is not) between `low` and `high`; otherwise `low`,
    with the error appended to `errors`. The one integer check of every spec and flag, so that
    callers collecting every error go on with a number in range and say the same thing."""
    if isinstance(value, bool) or not isinstance(value, int):
        errors.append(SpecError(path, f"must be an integer, got {shown(value)}"))
        return low
    if value < low:
        errors.append(SpecError(path, f"must be greater than or equal to {low}, got {value}"))
        return low
    if value > high:
        errors.append(SpecError(path, f"must be less than or equal to {high}, got {value}"))
        return low
    return value


#: `TrainingSettings.extras` key of an attention implementation outside `Attention`.
UNKNOWN_ATTENTION = "attention"


def build_settings(
    values: dict[str, object],
    paths: dict[str, str] | None = None,
    *,
    any_attention: bool = False,
    api: bool = False,
) -> tuple[TrainingSettings | None, list[SpecError]]:
    """Build settings from loosely typed values (CLI flags, a CRD spec); collect every error.

    `values` uses the TrainingSettings field names; missing keys take the defaults.
    `paths` overrides the field path shown in errors (the CLI passes its flag names; a
    switch's own, `switches.<camelCase name>`, see `switch_path`).
    `any_attention`: an attention implementation outside the known four is estimated on
    the quadratic (non-flash) path, as seed 1 prices "none of flash_attention_2, sdpa, or
    flex_attention", and recorded in `extras` for `context_warnings` to warn about; without
    it (a CRD spec, whose schema enumerates the four) it is an error.
    """
    where = PATHS | (paths or {})
    errors: list[SpecError] = []
    parsed: dict[str, object] = {}
    choices: dict[str, type[Choice]] = {
        "method": Method,
        "gradient_checkpointing": Checkpointing,
        "optimizer": Optimizer,
        "attention": Attention,
        "precision": Precision,
        "profile": Profile,
    }
    extras: dict[str, str] = {}
    for name, enum in choices.items():
        if values.get(name) is None:
            continue
        try:
            parsed[name] = enum.parse(values[name], where[name])
        except SpecError as error:
            raw = values[name]
            if name == "attention" and any_attention and isinstance(raw, str) and raw.strip():
                parsed[name] = Attention.EAGER
                extras[UNKNOWN_ATTENTION] = raw.strip()
            else:
                errors.append(error)

    limits = {
        "batch": (1, MAX_BATCH),
        "seq_len": (1, MAX_SEQUENCE_LENGTH),
        "image_tokens": (0, MAX_SEQUENCE_LENGTH),
        "gradient_accumulation": (1, MAX_BATCH),
    }
    for name, (low, high) in limits.items():
        if values.get(name) is None:
            continue
        parsed[name] = int_in_range(values[name], where[name], low, high, errors)

    method = parsed.get("method", DEFAULT_METHOD)
    adapter = method in (Method.LORA, Method.QLORA)
    rank = values.get("rank", DEFAULT_RANK)
    if adapter:
        if rank is None:
            errors.append(SpecError(where["rank"], "is required when method is LoRA or QLoRA"))
        else:
            parsed["rank"] = int_in_range(rank, where["rank"], 1, MAX_LORA_RANK, errors)
    else:
        parsed["rank"] = None

    for name in ("targets", "modules_to_save"):
        raw = values.get(name)
        if raw is None:
            continue
        names = _name_list(raw)
        if names is None:
            errors.append(SpecError(where[name], "must be a list of module names"))
            continue
        if name == "targets" and not names:
            errors.append(SpecError(where[name], "must name at least one module (or all-linear)"))
            continue
        if name == "modules_to_save":
            unknown = [n for n in names if n not in SAVABLE_MODULES]
            if unknown:
                errors.append(
                    SpecError(
                        where[name],
                        f"unsupported module {unknown[0]!r}; allowed: "
                        + ", ".join(SAVABLE_MODULES),
                    )
                )
                continue
            if not adapter:
                errors.append(SpecError(where[name], "applies only when method is lora or qlora"))
                continue
            # Once each, in the order given: a repeat trains no second copy, as a repeated
            # target gets no second adapter (`canonical_targets`).
            names = list(dict.fromkeys(names))
        parsed[name] = tuple(names)

    fused = values.get("fused_loss")
    if fused is not None and not isinstance(fused, bool):
        errors.append(SpecError(where["fused_loss"], f"must be true or false, got {fused!r}"))
        fused = None
    _trainer(values, where, parsed, extras, errors, fused is True, api=api)

    if errors:
        return None, errors
    if extras:
        parsed["extras"] = extras
    return TrainingSettings(**parsed), []  # type: ignore[arg-type]


def _trainer(
    values: dict[str, object],
    where: dict[str, str],
    parsed: dict[str, object],
    extras: dict[str, str],
    errors: list[SpecError],
    fused_loss: bool,
    *,
    api: bool,
) -> None:
    """The trainer's switches: the framework's preset, `fusedLoss`, then explicit switches
    (`frameworks.resolve`), into `parsed`; an unknown framework name into `extras`."""
    from controller.estimator import frameworks  # it imports this module

    framework = values.get("framework")
    if framework is not None and not isinstance(framework, str):
        errors.append(SpecError(where["framework"], f"must be a string, got {shown(framework)}"))
        framework = None
    resolved, trainer_errors = frameworks.resolve(
        framework,
        values.get("switches"),
        framework_path=where["framework"],
        switches_path=where["switches"],
        fused_loss=fused_loss,
        fused_loss_path=where["fused_loss"],
        api=api,
        switch_paths=where,
    )
    errors += trainer_errors
    switches = resolved.switches
    accumulation = parsed.get("gradient_accumulation", 1)
    if switches.optimizer_in_backward and isinstance(accumulation, int) and accumulation > 1:
        errors.append(
            SpecError(
                switch_path("optimizerInBackward", where["switches"], where),
                f"needs gradient accumulation 1 (each parameter is stepped as its gradient is "
                f"made), got {where['gradient_accumulation']} {accumulation}",
            )
        )
    if switches is not DEFAULT_SWITCHES:
        parsed["switches"] = switches
    if resolved.label is not None:
        parsed["framework"] = resolved.preset or resolved.label
        if resolved.preset is None:
            extras[frameworks.UNKNOWN_FRAMEWORK] = resolved.label


def _name_list(raw: object) -> list[str] | None:
    """Names from `a,b` (a flag) or a list of strings (a spec); None for anything else (a
    mapping is not a list, though it iterates as its keys)."""
    if isinstance(raw, str):
        return [part.strip() for part in raw.split(",") if part.strip()]
    if isinstance(raw, list | tuple) and all(isinstance(x, str) for x in raw):
        return [x.strip() for x in raw if x.strip()]
    return None
