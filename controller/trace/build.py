"""The real Hugging Face model, built on fake tensors, set up the way a fine-tuning job runs it.

* Built from `config.json` with `from_config` on the meta device (no initialisation cost),
  then given fake CPU storage under the trace's `FakeTensorMode`: CPU, not faked CUDA,
  because a CPU build of torch cannot run a faked-CUDA backward. Memory is device-agnostic
  at the aten level: the same ops save the same tensors.
* Which model: a hand-read family's text model with `AutoModelForCausalLM` (a multimodal
  config's `text_config`); a vision-language model (`vision_language`: the inventory's
  image-text-to-text class) or a family without a hand reading whole, with the class and
  config the generic reading builds (`inventory.build_meta_model`), so the parameters are
  what it counts. A vision tower is frozen as the generic reading keeps it (no gradient
  under full fine-tuning; `all-linear` LoRA leaves it out, a target naming its linears
  adapts them, as PEFT matches names; 4-bit linears under QLoRA, as bitsandbytes converts
  them). The step runs on text: `input_ids` of `seq_len + image_tokens` positions through
  the language model, the image positions as text tokens. The tower itself is not run: it
  is frozen, so it keeps no activations for backward, and its transient forward peak over
  the images (before the language model runs) is not traced.
* `use_cache=False` and train mode, as a trainer sets them.
* The attention implementation: `eager` and `sdpa` as asked. `flash_attention_2` and
  `flex_attention` do not exist on CPU; they are traced as `sdpa`, whose CPU kernel
  (`_scaled_dot_product_flash_attention_for_cpu`) is itself a flash kernel: it saves the
  output and a log-sum-exp, no s x s matrix, exactly what flash-attention 2 saves.
* Mixture of experts: the experts run as transformers' `grouped_mm` implementation, its
  default wherever `torch.nn.functional.grouped_mm` runs (CUDA sm80+). It sorts the
  t x k token-expert pairs by expert and multiplies each group with one grouped GEMM, so
  every tensor it allocates is t x k rows (or the expert stack itself), whatever the router
  chose: memory does not depend on the routing, which fake tensors cannot compute. (The
  `eager` implementation, a loop over the experts the router hit, is not traced; DBRX,
  which has no other, runs its loop over a uniform routing: `dbrx.py`.)
* Gradient checkpointing through transformers' own switch (non-reentrant, the default).
  `unsloth` checkpointing (which offloads the checkpoints to host memory) is traced as `on`:
  the offload is not modelled, so the checkpoints (L x tokens x hidden x 2 bytes) are
  counted on the GPU, an over-estimate of that much.
* QLoRA: every linear of the decoder blocks is replaced by `qlora.Linear4bitStorage` (the
  storage model of bitsandbytes' `Linear4bit`); embeddings, norms and the LM head stay 16-bit,
  as transformers' bitsandbytes integration leaves them (`llm_int8_skip_modules` honoured),
  unless the trainer prepares the model (`Switches.kbit_preparation`): then they go to fp32
  as PEFT's `prepare_model_for_kbit_training` casts them (the norms alone for
  `upcast-norms`), and the step runs under the trainer's mixed precision
  (`step_context`: autocast in the job's precision), as a trainer must run an fp32 head.
  An MoE's fused expert stacks (3-D parameters, not linears) are 4-bit too, through
  `qlora.quantize_experts` (see there for why and how).
* LoRA / QLoRA: PEFT's `get_peft_model` with the job's rank and targets. Under fake mode
  PEFT's `module.to(...)` would try `torch.utils.swap_tensors` on fake parameters and fail;
  `_no_swap` makes conversion assign new parameters instead, which is what it does for real
  tensors anyway. `modules_to_save` makes PEFT deep-copy those modules (the trained copy
  beside the frozen original); `_copies_share_mode` keeps the copies in the trace's fake mode.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from controller.base.errors import PermanentError
from controller.estimator import (
    Attention,
    Checkpointing,
    KbitPreparation,
    Method,
    Offloading,
    Precision,
)
from controller.estimator.settings import TrainingSettings as Settings
from controller.trace import dbrx, qlora

DTYPES = {
    Precision.BF16: torch.bfloat16,
    Precision.FP16: torch.float16,
    Precision.FP32: torch.float32,
}
# Attention implementations that exist on a CPU build of torch, and what each job setting
# traces as (see the module docstring for why flash/flex are traced as sdpa).
TRACED_ATTENTION = {
    Attention.EAGER: "eager",
    Attention.SDPA: "sdpa",
    Attention.FLASH_ATTENTION_2: "sdpa",
    Attention.FLEX_ATTENTION: "sdpa",
}
# How the experts of an MoE layer run: transformers' default on a GPU (see the docstring).
EXPERTS_IMPLEMENTATION = "grouped_mm"
# Per-layer list fields that must shrink with num_hidden_layers in a few-layer trace.
_PER_LAYER_FIELDS = ("layer_types", "mlp_layer_types")


class TraceUnsupported(PermanentError, ValueError):
    """The model or setting cannot be traced (a one-line reason for the user): permanent, since
    the same spec cannot be traced on a retry either."""


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thaw(v) for v in value]
    return value


def text_config(config: Mapping[str, Any], layers: int | None = None) -> dict[str, Any]:
    """The language model's config.json as a plain dict, optionally cut to `layers` layers.

    A multimodal config that is no vision-language model (`vision_language`) is traced as
    its text model; a vision-language one is built whole (`whole_config`).
    """
    raw = _thaw(config)
    text = raw.get("text_config")
    if isinstance(text, dict):
        outer = {k: v for k, v in raw.items() if k not in ("text_config", "vision_config")}
        raw = outer | text
        raw.pop("architectures", None)
    raw.pop("quantization_config", None)  # QLoRA storage is modelled, not loaded
    if layers is not None:
        raw["num_hidden_layers"] = layers
        for name in _PER_LAYER_FIELDS:
            if isinstance(raw.get(name), list):
                raw[name] = raw[name][:layers]
    return raw


#: Model types transformers has no class for, whose checkpoints ship another family's
#: modelling code as remote code: built as that family. Kimi K2's config names
#: `DeepseekV3ForCausalLM` and its remote code is DeepSeek-V3's, at another size.
BUILT_AS = {"kimi_k2": "deepseek_v3"}


def hf_config(config: Mapping[str, Any], attention: Attention, layers: int | None = None) -> Any:
    from transformers import AutoConfig

    raw = text_config(config, layers)
    model_type = raw.pop("model_type", None) or "llama"
    model_type = BUILT_AS.get(model_type, model_type)
    raw.pop("auto_map", None)  # remote code is never run
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        from controller.trace.inventory import auto_class_for

        auto_class_for(model_type, config)  # raises UnknownModelType, saying what to do
    try:
        cfg = AutoConfig.for_model(model_type, **raw)
    except (KeyError, ValueError) as error:
        raise TraceUnsupported(f"transformers cannot build model_type {model_type!r}") from error
    cfg._attn_implementation = TRACED_ATTENTION[attention]
    cfg.use_cache = False
    if attention is not Attention.EAGER:
        _in_kernel_dropout(cfg)
    return cfg


def vision_language(config: Mapping[str, Any]) -> bool:
    """Whether `config` is a vision-language model, as the module inventory reads one: a
    type transformers builds with its image-text-to-text class (`inventory.auto_class_for`).
    Such a model is traced whole (`whole_config`), its vision tower frozen."""
    from controller.trace.inventory import UnknownModelType, auto_class_for, mapping

    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        return False
    model_type = BUILT_AS.get(model_type, model_type)
    if model_type not in mapping("image_text_to_text"):
        return False
    try:
        return auto_class_for(model_type, config) == "image_text_to_text"
    except UnknownModelType:
        return False


def hand_read(config: Mapping[str, Any]) -> bool:
    """Whether a hand reading reads `config`'s family (`parse_config`). Such a model is
    traced as its text model, as before; any other is built whole, exactly as the generic
    reading builds it (`inventory.build_meta_model`): a composite config's own causal-LM
    class (Fuyu's, Emu3's), not its text model's alone."""
    from controller.estimator.errors import SpecError, UnreadFamily
    from controller.estimator.model import parse_config

    try:
        parse_config(config)
    except UnreadFamily:
        return False
    except SpecError:
        return True  # its family, refused for a field: the text path says why
    return True


def whole_config(config: Mapping[str, Any], attention: Attention, layers: int | None = None) -> Any:
    """transformers' config object of the whole model (a vision-language model's, a family
    without a hand reading), as the inventory builds it (`inventory.hf_model_config`): the
    language model cut to `layers` decoder layers (its depth and per-layer lists), a vision
    tower whole."""
    from controller.trace.inventory import hf_model_config

    cfg, _, _ = hf_model_config(config, layers)
    cfg._attn_implementation = TRACED_ATTENTION[attention]  # set on every sub-config too
    cfg.use_cache = False
    cfg.get_text_config(decoder=True).use_cache = False
    if attention is not Attention.EAGER:
        _in_kernel_dropout(cfg)
        _in_kernel_dropout(cfg.get_text_config(decoder=True))
    return cfg


def vision_tower(model: nn.Module) -> nn.Module | None:
    """The model's vision tower, found as the inventory finds it (transformers' own
    `get_encoder(modality="image")`); None for a model without one."""
    from controller.trace.inventory import _vision_path

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
    path = _vision_path(base)
    return base.get_submodule(path) if path else None


#: The config fields attention modules read their attention-probability dropout from.
ATTENTION_DROPOUT_FIELDS = ("attention_dropout", "attn_pdrop", "attn_dropout")


def _in_kernel_dropout(cfg: Any) -> None:
    """Trace attention dropout (StarCoder2's 0.1) as the job's GPU kernel runs it: CUDA's
    flash and memory-efficient sdpa backends and flash-attention 2 drop probabilities inside
    the kernel from a saved RNG seed and offset, holding no s x s tensor; the CPU sdpa the
    trace runs has no such kernel and, with dropout, falls back to the math path, which
    materialises the scores, their softmax, the dropout mask and the dropped probabilities
    for every head (1.8 GiB more than the GPU holds at 2,048 tokens for StarCoder2-7B).
    Dropout elsewhere (residual, embedding: a mask of the hidden size) stays traced."""
    for name in ATTENTION_DROPOUT_FIELDS:
        value = getattr(cfg, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            setattr(cfg, name, 0.0)


def is_moe(cfg: Any) -> bool:
    cfg = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    for name in ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"):
        if (getattr(cfg, name, None) or 0) > 1:
            return True
    ffn = getattr(cfg, "ffn_config", None)  # DBRX
    return (getattr(ffn, "moe_num_experts", None) or 0) > 1


def _materialize(model: nn.Module) -> nn.Module:
    """Give every meta parameter and buffer fake CPU storage (ties kept: one tensor each)."""
    made: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in made:
                data = torch.empty(param.shape, dtype=param.dtype, device="cpu")
                made[id(param)] = nn.Parameter(data, requires_grad=param.requires_grad)
            module._parameters[name] = made[id(param)]  # type: ignore[assignment]
        for name, buf in list(module._buffers.items()):
            if buf is not None:
                if id(buf) not in made:
                    made[id(buf)] = torch.empty(buf.shape, dtype=buf.dtype, device="cpu")
                module._buffers[name] = made[id(buf)]
    return model


@contextlib.contextmanager
def _no_swap() -> Iterator[None]:
    """`module.to()` assigns converted parameters instead of swapping fake tensors."""
    original = nn.Module._apply

    def apply(self: nn.Module, fn: Any, recurse: bool = True) -> nn.Module:
        if recurse:
            for child in self.children():
                apply(child, fn)
        for key, param in list(self._parameters.items()):
            if param is None:
                continue
            with torch.no_grad():
                new = fn(param)
            if new is not param:
                self._parameters[key] = nn.Parameter(new, requires_grad=param.requires_grad)
        for key, buf in list(self._buffers.items()):
            if buf is not None:
                self._buffers[key] = fn(buf)
        return self

    nn.Module._apply = apply  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module._apply = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _copies_share_mode() -> Iterator[None]:
    """`copy.deepcopy` of a fake tensor gives a fake tensor of the same fake mode.

    `Tensor.__deepcopy__` copies the storage (a new one: the copy is counted) and then
    deep-copies the tensor's `__dict__`, which holds its `fake_mode`: the copy would belong
    to a new mode, and the first op mixing it with the trace's tensors fails ("Mixing fake
    modes NYI"). A mode is the context tensors live in, not data: copying returns it as is.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    had = "__deepcopy__" in FakeTensorMode.__dict__
    original = FakeTensorMode.__dict__.get("__deepcopy__")
    FakeTensorMode.__deepcopy__ = lambda self, memo: self  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if had:
            FakeTensorMode.__deepcopy__ = original  # type: ignore[attr-defined]
        else:
            del FakeTensorMode.__deepcopy__  # type: ignore[attr-defined]


def build_model(config: Mapping[str, Any], settings: Settings, layers: int | None = None) -> Any:
    """The model as the job trains it; call inside the trace's FakeTensorMode."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.utils import logging as hf_logging

    switches = settings.switches
    if switches.activation_offloading is not Offloading.NONE:
        raise TraceUnsupported(
            "activation offloading is not traced; use the calibrated, analytic or unsloth profile"
        )
    hf_logging.set_verbosity_error()
    if vision_language(config):
        cfg = whole_config(config, settings.attention, layers)
        auto: Any = AutoModelForImageTextToText
    elif not hand_read(config):
        cfg = whole_config(config, settings.attention, layers)
        auto = AutoModelForCausalLM
    else:
        cfg = hf_config(config, settings.attention, layers)
        auto = AutoModelForCausalLM
    with _no_swap():  # a class that casts a part while it builds it (Apertus 1.5's tower)
        model = _from_config(auto, cfg, DTYPES[settings.precision])
    if is_moe(cfg):
        _set_experts_implementation(model)
    model = _materialize(model)
    tower = vision_tower(model)
    model.config.use_cache = False  # type: ignore[union-attr]
    model.train()
    quantized = settings.method is Method.QLORA or (
        settings.method is Method.LORA and qlora.is_prequantized(config)
    )
    if quantized:
        skip, double = qlora.skip_modules(config), qlora.double_quant(config)
        qlora.quantize_linears(model, skip, DTYPES[settings.precision], double)
        _refuse_clamped_4bit(model)
        # What a quantised load sets: modelling code that reads a linear's weight directly
        # (Jamba's dt_proj) calls the module instead when it is there.
        model.config._is_quantized = True  # type: ignore[union-attr]
        if switches.kbit_preparation is not KbitPreparation.NONE:
            norms_only = switches.kbit_preparation is KbitPreparation.UPCAST_NORMS
            qlora.prepare_for_kbit(model, norms_only)
    frozen = model if settings.is_adapter else tower
    for param in frozen.parameters() if frozen is not None else ():
        param.requires_grad_(False)
    if settings.gradient_checkpointing is not Checkpointing.OFF:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable()  # type: ignore[operator]
    if settings.is_adapter:
        model = _apply_lora(model, settings, quantized, _tower_path(model, tower))
    if quantized:
        double = qlora.double_quant(config)
        qlora.quantize_experts(model, DTYPES[settings.precision], double, skip=tower)
    return model


def _tower_path(model: nn.Module, tower: nn.Module | None) -> str | None:
    return next((name for name, m in model.named_modules() if m is tower), None) if tower else None


def step_context(
    settings: Settings, config: Mapping[str, Any]
) -> contextlib.AbstractContextManager[Any]:
    """What the step runs under: the trainer's mixed precision (autocast in the job's 16-bit
    dtype) when its preparation left fp32 parameters, as TRL and the PEFT QLoRA examples run
    with `bf16`/`fp16` (TRL's SFTConfig sets bf16 by default): matmuls, the LM head's
    included, in 16 bits, the rest in the dtypes the parameters and inputs give; otherwise
    nothing, as before (a 16-bit model runs as it is)."""
    quantized = settings.method is Method.QLORA or (
        settings.method is Method.LORA and qlora.is_prequantized(config)
    )
    kbit = settings.switches.kbit_preparation is not KbitPreparation.NONE
    if not (kbit and quantized) or settings.precision is Precision.FP32:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=DTYPES[settings.precision])


#: Linears whose weights Gemma 3n's AltUp clamps while training (`weight.data.clamp_`,
#: `weight.clamp`). A 4-bit weight is packed bytes, here as in bitsandbytes' `Params4bit`,
#: and clamping bytes to floats fails: such a job would fail on the GPU as it fails here.
_CLAMPED = ("prediction_coefs", "correction_coefs")


def _refuse_clamped_4bit(model: Any) -> None:
    for name, module in model.named_modules():
        if name.rpartition(".")[2] in _CLAMPED and isinstance(module, qlora.Linear4bitStorage):
            raise TraceUnsupported(
                "Gemma 3n's AltUp clamps the weights of prediction_coefs and correction_coefs "
                "while training, which a 4-bit weight cannot take (bitsandbytes' neither): "
                "list both in quantization_config.llm_int8_skip_modules"
            )


def _set_experts_implementation(model: Any) -> None:
    """`grouped_mm` where the model's experts take an implementation; Llama 4's do not (its
    experts run every token through every expert as one batched matmul, E x t rows, which
    does not depend on the routing either, so it is traced as it is)."""
    try:
        model.set_experts_implementation(EXPERTS_IMPLEMENTATION)
    except ValueError as error:
        if "does not support setting experts implementation" not in str(error):
            raise
        if dbrx.uniform_routing(model):  # DBRX's loop over a uniform routing (dbrx.py)
            return
        if getattr(model.config, "model_type", "") not in _DENSE_EXPERTS:
            raise TraceUnsupported(
                f"{model.config.model_type}'s experts loop over the experts the router picked, "
                "which fake tensors cannot trace; use --profile calibrated or analytic"
            ) from error


#: Model types whose experts run every token through every expert (routing-free memory).
_DENSE_EXPERTS = ("llama4_text", "llama4")


_FLASH_LIKE = "vramgate_uncapped"  # no "sdpa" in the name: transformers would check it


def _register_flash_like() -> None:
    """sdpa without soft-capping, as an attention implementation of its own.

    Gemma 2 caps its attention scores; its class refuses PyTorch's sdpa for that, but the job
    runs flash-attention 2, which applies the cap inside the kernel and saves what sdpa saves
    (output and log-sum-exp). Dropping the cap keeps every tensor the same size.
    """
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attention(module: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("softcap", None)
        return sdpa_attention_forward(module, *args, **kwargs)

    AttentionInterface.register(_FLASH_LIKE, attention)
    AttentionMaskInterface.register(_FLASH_LIKE, sdpa_mask)


def _from_config(auto: Any, cfg: Any, dtype: torch.dtype) -> Any:
    """`from_config` on the meta device; sdpa through `_register_flash_like` for models that
    refuse it (see there)."""
    try:
        with torch.device("meta"):
            return auto.from_config(cfg, dtype=dtype)
    except ValueError as error:
        if cfg._attn_implementation != "sdpa" or "does not support" not in str(error):
            raise
    _register_flash_like()
    cfg._attn_implementation = _FLASH_LIKE
    try:
        with torch.device("meta"):
            return auto.from_config(cfg, dtype=dtype, attn_implementation=_FLASH_LIKE)
    except KeyError:
        # Its attention comes from a table of its own (GPT-Neo's, GIT's) without sdpa:
        # traced eager, as such a job runs without flash-attention (an s x s score matrix).
        cfg._attn_implementation = "eager"
        with torch.device("meta"):
            return auto.from_config(cfg, dtype=dtype, attn_implementation="eager")


def _apply_lora(model: Any, settings: Settings, quantized: bool, tower: str | None) -> Any:
    """PEFT's LoRA with the job's rank and targets. `tower`: the vision tower's path, which
    `all-linear` leaves out (PEFT's own would adapt it; the tower is frozen, as the generic
    reading keeps it); a target naming its linears adapts them, by PEFT's name matching."""
    from peft import LoraConfig, get_peft_model

    from controller.estimator.model import peft_name

    model_type = getattr(model.config, "model_type", "")
    targets: str | list[str] = (
        "all-linear"
        if "all-linear" in settings.targets
        else [peft_name(model_type, name) for name in settings.targets]
    )
    lora = LoraConfig(
        r=settings.rank or 16,
        lora_alpha=settings.rank or 16,
        lora_dropout=0.0,  # PEFT's default; dropout > 0 would save a masked input copy
        target_modules=targets,
        exclude_modules=rf"{re.escape(tower)}\..*" if tower and targets == "all-linear" else None,
        modules_to_save=list(settings.modules_to_save) or None,
        task_type="CAUSAL_LM",
    )
    with _no_swap(), _copies_share_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(model, lora)
    if quantized:
        qlora.use_bnb_lora_forward(model)
    return model
