"""The module inventory of any model transformers builds, read from the built model.

    inv = read_inventory(config_json)            # the config's own depth
    inv = read_inventory(config_json, layers=2)  # cut to two decoder layers (cheaper)

The model is built with transformers' auto class on the meta device (no storage, no
initialisation: a whole DeepSeek-V3 builds in about 0.1 s), `AutoModelForCausalLM`, or
`AutoModelForImageTextToText` for a vision-language model type, so every family transformers
builds is read the same way and nothing about a family is written here. What is read:

* every parameter, counted once (tied and shared parameters where they first appear), split
  into the decoder layers and the parts outside them (embeddings, head, final norm, a vision
  tower, a projector); at the config's own depth `params` is what transformers reports;
* the decoder layers grouped into kinds built alike (DeepSeek-V3: 3 dense, 58 MoE), each with
  its linears (name, in and out features), norms, experts (fused 3-D parameters or a module
  list) and attention heads, KV heads and head width as the attention module holds them;
* which linears PEFT's `all-linear` adapts (PEFT's own `_maybe_include_all_linear_layers`) and
  which bitsandbytes' 4-bit loading leaves in 16 bits (transformers' own
  `get_modules_to_not_convert` and `should_convert_module`, the rules its loader applies).

A cut build (`layers=n`) shortens every per-layer list of the text config with the depth; its
counts are those of the cut model. Building the whole depth is cheap on meta and is the only
generic way to learn layers that are not alike (dense before MoE, Mamba among attention,
cross-attention at listed indices), so the default reads the config's own depth.

A `model_type` transformers does not know (its code would come with the checkpoint, as
`trust_remote_code`, which vramgate never runs) is refused in one line that says how to
describe the model instead. The result is plain data (`controller.estimator.model.inventory`).

    python -m controller.trace.inventory qwen2 --layers 2    # a type's default config
    python -m controller.trace.inventory path/to/config.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import re
import sys
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

import torch
from torch import nn

from controller.estimator.model import MAX_DIMENSION, MAX_LAYERS
from controller.estimator.model.inventory import (
    AttentionShape,
    ExpertStack,
    LayerKind,
    LinearGroup,
    ModelInventory,
    NormModule,
    Part,
    pattern,
)
from controller.trace.build import BUILT_AS, TraceUnsupported, _from_config, _thaw

__all__ = [
    "AUTO_CLASSES",
    "UnknownModelType",
    "build_meta_model",
    "check_model_type",
    "inventory_of",
    "read_inventory",
]

#: The auto classes a fine-tuned model is built with, by the name the inventory records.
AUTO_CLASSES = {
    "causal_lm": "AutoModelForCausalLM",
    "image_text_to_text": "AutoModelForImageTextToText",
}
_MAPPINGS = {
    "causal_lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "image_text_to_text": "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
}
_DESCRIBE = (
    "describe the model with a config.json whose model_type transformers knows (the family "
    "its code derives from, with the same dimensions) or a vramgate preset (vramgate presets)"
)


class UnknownModelType(TraceUnsupported):
    """A `model_type` the installed transformers cannot build: permanent for this install."""


class ConfigFieldError(TraceUnsupported):
    """One config field transformers (or the bounds below) refuses: `field` is its name in the
    config (`text_config.hidden_size` for a nested one), so the error can name it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


#: Bounds on what a config may state before anything is built, the hand reading's own
#: (`controller.estimator.model.read`): building walks every layer (a config of 10^8 layers
#: would hold a worker for hours), and widths multiply into parameter counts.
_DEPTH_FIELDS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers")
_WIDTH_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "n_embd",
    "n_head",
    "d_model",
    "moe_intermediate_size",
)
_EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
#: Experts: above the hand reading's MAX_EXPERTS, since Doge states 16,384 (tiny experts kept
#: as embeddings, not modules).
MAX_GENERIC_EXPERTS = 65_536
_FIELD_IN_ERROR = re.compile(r"field '(\w+)'")


def mapping(auto: str) -> dict[str, str]:
    """model_type -> class name of transformers' auto mapping for `auto`."""
    from transformers.models.auto import modeling_auto

    return dict(getattr(modeling_auto, _MAPPINGS[auto]))


def auto_class_for(model_type: str, config: Mapping[str, Any]) -> str:
    """The auto class a job builds `model_type` with: image-text-to-text for a vision-language
    type (one only that mapping has, or one both have whose config carries a vision tower),
    the causal-LM class otherwise. Refuses a type neither mapping has."""
    from transformers import CONFIG_MAPPING

    in_vlm = model_type in mapping("image_text_to_text")
    if in_vlm and (model_type not in mapping("causal_lm") or "vision_config" in config):
        return "image_text_to_text"
    if model_type in mapping("causal_lm"):
        return "causal_lm"
    if model_type not in CONFIG_MAPPING:
        raise UnknownModelType(
            f"model_type {model_type!r} is not one the installed transformers builds (its code "
            f"would come with the checkpoint as trust_remote_code, which vramgate never runs); "
            f"{_DESCRIBE}"
        )
    raise UnknownModelType(
        f"model_type {model_type!r} is not a causal or image-text-to-text language model in "
        f"transformers, so it cannot be fine-tuned as one; {_DESCRIBE}"
    )


def check_model_type(config: Mapping[str, Any]) -> str:
    """The model_type `config` is built as, or `UnknownModelType` in one line: a lookup in
    transformers' mappings, no config object or model built (cheap enough for the webhook,
    which refuses at apply time what the operator could only refuse later)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        # Every reading here follows from the type: a guessed one would be a wrong answer.
        raise UnknownModelType(f"the config states no model_type; {_DESCRIBE}")
    model_type = BUILT_AS.get(model_type, model_type)
    auto_class_for(model_type, config)
    return model_type


def _skip_modules(config: Mapping[str, Any]) -> list[str] | None:
    qc = config.get("quantization_config")
    if isinstance(qc, Mapping) and qc.get("llm_int8_skip_modules"):
        return list(qc["llm_int8_skip_modules"])
    return None


def hf_model_config(
    config: Mapping[str, Any], layers: int | None = None
) -> tuple[Any, str, int | None]:
    """(transformers' config object for `config`, its model_type, the depth it states), cut to
    `layers` decoder layers when given. Remote code (`auto_map`) is never run; a pre-quantised
    checkpoint's quantization_config is dropped (its skip list is read apart)."""
    from transformers import AutoConfig

    raw = _thaw(config)
    model_type = check_model_type(raw)  # refuses an unknown type before building anything
    for key in ("model_type", "auto_map", "quantization_config"):
        raw.pop(key, None)
    _check_bounds(raw)
    try:
        cfg = AutoConfig.for_model(model_type, **raw)
    except Exception as error:
        if found := _FIELD_IN_ERROR.search(str(error)):
            raise ConfigFieldError(found.group(1), _reason(error)) from error
        raise
    depth = config_layers(cfg)
    if depth is not None and not 1 <= depth <= MAX_LAYERS:
        raise ConfigFieldError(
            "num_hidden_layers", f"must be between 1 and {MAX_LAYERS} layers, got {depth}"
        )
    if layers is not None and depth is not None and layers < depth:
        cfg = cut_layers(cfg, layers)
    return cfg, model_type, depth


def _check_bounds(raw: Mapping[str, Any]) -> None:
    """Refuse a depth, width or expert count outside the hand reading's bounds, in the config
    or its `text_config`, before transformers builds anything from it."""
    nested = raw.get("text_config")
    for where, fields in (("", raw), ("text_config.", nested if isinstance(nested, dict) else {})):
        for names, low, high in (
            (_DEPTH_FIELDS, 1, MAX_LAYERS),
            (_WIDTH_FIELDS, 0, MAX_DIMENSION),  # 0: a field some configs leave unset
            (_EXPERT_FIELDS, 0, MAX_GENERIC_EXPERTS),
        ):
            for name in names:
                value = fields.get(name)
                if value is None or isinstance(value, bool) or not isinstance(value, int):
                    continue  # transformers' own validation names a value of the wrong type
                if not low <= value <= high:
                    raise ConfigFieldError(
                        where + name, f"must be between {low} and {high}, got {value}"
                    )


def _reason(error: BaseException) -> str:
    """transformers' message in one line: its first two lines (the field, then what is wrong)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"transformers refuses it ({type(error).__name__}: {' '.join(lines[:2])[:240]})"


#: Where a text config keeps its decoder's depth: an encoder-decoder's causal-LM class builds
#: only the decoder (`decoder_layers`, T5's `num_decoder_layers`); LongCat-Flash builds
#: `num_layers` blocks of two sublayers each (its `num_hidden_layers` counts sublayers).
_DEPTHS = ("decoder_layers", "num_decoder_layers", "num_layers", "num_hidden_layers")
#: Further depth fields cut with it where they state the same depth (xLSTM's `num_blocks`).
_ALIASES = ("num_hidden_layers", "num_blocks")


def _text(cfg: Any) -> Any:
    """The config object holding the decoder's fields: the text sub-config of a composite one,
    else `cfg` itself (an older composite's `get_text_config` answers a filtered copy)."""
    text = cfg.get_text_config(decoder=True)
    return text if any(v is text for v in vars(cfg).values()) else cfg


def config_layers(cfg: Any) -> int | None:
    """The decoder depth the (text) config states, under whichever name it keeps it."""
    text = _text(cfg)
    for name in _DEPTHS:
        with contextlib.suppress(NotImplementedError):  # ProphetNet refuses num_hidden_layers
            depth = getattr(text, name, None)
            if isinstance(depth, int) and not isinstance(depth, bool):
                return depth
    return None


def cut_layers(cfg: Any, layers: int) -> Any:
    """A copy of `cfg` with `layers` decoder layers: the depth and every per-layer list of the
    text config (a list as long as the depth: layer types, MLP types, per-layer widths)."""
    cfg = copy.deepcopy(cfg)
    text = _text(cfg)
    depth = config_layers(cfg)
    for name in dict.fromkeys(_DEPTHS + _ALIASES):
        with contextlib.suppress(NotImplementedError):
            if getattr(text, name, None) == depth:
                setattr(text, name, layers)
    for key, value in list(vars(text).items()):
        if isinstance(value, list | tuple) and len(value) == depth:
            setattr(text, key, type(value)(value[:layers]))
    return cfg


def build_meta_model(
    config: Mapping[str, Any], layers: int | None = None, auto: str | None = None
) -> tuple[Any, str, str, int | None]:
    """(the model on the meta device, its model_type, the auto class used, the depth the config
    states). Whatever transformers raises on the config is a one-line `TraceUnsupported`."""
    import transformers
    from transformers.utils import logging as hf_logging

    cfg, model_type, depth = _guarded(hf_model_config, config, layers)
    auto = auto or auto_class_for(model_type, config)
    cfg._attn_implementation = "eager"  # every model has it; the modules do not depend on it
    cfg.use_cache = False
    hf_logging.set_verbosity_error()
    model_cls = getattr(transformers, AUTO_CLASSES[auto])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _guarded(_from_config, model_cls, cfg, torch.bfloat16)
    return model, model_type, auto, depth


def _guarded(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except TraceUnsupported:
        raise
    except Exception as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        reason = " ".join(lines[:2])[:240]
        raise TraceUnsupported(
            f"transformers cannot build this config ({type(error).__name__}: {reason})"
        ) from error


def read_inventory(
    config: Mapping[str, Any], layers: int | None = None, auto: str | None = None
) -> ModelInventory:
    """The inventory of the model `config` describes, built at its own depth or cut to `layers`
    decoder layers; `auto` picks the auto class ("causal_lm", "image_text_to_text")."""
    model, model_type, auto, depth = build_meta_model(config, layers, auto)
    return _guarded(inventory_of, model, model_type, auto, depth, _skip_modules(config))


# -- reading the built model ------------------------------------------------------------------


def inventory_of(
    model: Any,
    model_type: str,
    auto: str,
    config_depth: int | None = None,
    skip_modules: list[str] | None = None,
) -> ModelInventory:
    """The inventory of a built model (any device: only names and shapes are read)."""
    vision_path = _vision_path(model)
    layers_path, layer_list = _decoder_layers(model, vision_path)
    params = _named_once(model, layers_path, layer_list)
    all_linear = _peft_all_linear(model)
    quantized = _bnb_4bit_linears(model, skip_modules)
    text = model.config.get_text_config(decoder=True)
    stacks = _peft_moe_targets(model)
    kinds = _kinds(layers_path, layer_list, text, params, all_linear, quantized, stacks)
    outside = _outside(params, layers_path, len(layer_list))
    embedding, head = _embedding_params(model, params)
    in_layers = {id(p) for layer in layer_list for p in layer.parameters()}
    embeddings = _module_params(model, "get_input_embeddings") | _module_params(
        model, "get_output_embeddings"
    )
    hidden = _int(text, "hidden_size")
    built = next((kind.attention for kind in kinds if kind.attention), None)
    heads = (built and built.heads) or _int(text, "num_attention_heads")
    kv_heads = (built and built.kv_heads) or _int(text, "num_key_value_heads") or heads
    head_dim = (built and built.head_dim) or _int(text, "head_dim")
    head_dim = head_dim or (hidden // heads if hidden and heads else None)
    return ModelInventory(
        model_type=model_type,
        model_class=type(model).__name__,
        auto_class=auto,
        layers=len(layer_list),
        config_layers=config_depth if config_depth is not None else len(layer_list),
        layers_path=layers_path,
        hidden_size=hidden,
        vocab_size=_int(text, "vocab_size") or _int(model.config, "vocab_size"),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        tied_embeddings=_tied(model),
        params=sum(p.numel() for p in params.values()),
        embedding_params=embedding,
        head_params=head,
        vision_params=_under(params, vision_path, embeddings) if vision_path else 0,
        vision_path=vision_path,
        outside=outside,
        kinds=kinds,
        linears=_groups(
            (name, module, name in all_linear, name in quantized)
            for name, module in model.named_modules()
            if not _copy_of_layers(name, module, layers_path, in_layers)
        ),
    )


def _named_once(
    model: nn.Module, layers_path: str, layer_list: list[nn.Module]
) -> dict[str, nn.Parameter]:
    """Every parameter once, under its first name, except that one the decoder layers hold is
    named under the first layer holding it: DiffusionGemma's decoder layers share their
    weights with its encoder's language model, which transformers registers first, and a
    layer's parameters are what the generic reading prices as that layer (the encoder's
    copy is no second parameter)."""
    owner: dict[int, str] = {}
    for index, layer in enumerate(layer_list):
        for name, param in layer.named_parameters():
            owner.setdefault(id(param), f"{layers_path}.{index}.{name}")
    return {owner.get(id(param), name): param for name, param in model.named_parameters()}


def _copy_of_layers(name: str, module: nn.Module, layers_path: str, in_layers: set[int]) -> bool:
    """A linear outside the decoder layers whose weight a decoder layer holds (the encoder's
    view of DiffusionGemma's shared layers): listed once, where the layer holds it."""
    weight = getattr(module, "weight", None)
    inside = bool(layers_path) and name.startswith(layers_path + ".")
    return not inside and weight is not None and id(weight) in in_layers


def _int(cfg: Any, name: str) -> int | None:
    value = getattr(cfg, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _under(
    params: Mapping[str, nn.Parameter], prefix: str, besides: AbstractSet[int] = frozenset()
) -> int:
    """The parameters named under `prefix`, less those in `besides` (the embeddings, which a
    T5Gemma 2 encoder holds and its decoder and head share: counted as the embeddings)."""
    return sum(
        p.numel()
        for name, p in params.items()
        if name.startswith(prefix + ".") and id(p) not in besides
    )


def _path_of(model: nn.Module, target: nn.Module) -> str | None:
    return next((name for name, module in model.named_modules() if module is target), None)


def _vision_path(model: Any) -> str | None:
    """Where the vision tower sits: transformers' own lookup (`get_encoder("image")`), when it
    finds a module of its own (it answers the model itself where there is none)."""
    try:
        encoder = model.get_encoder(modality="image")
    except (TypeError, ValueError, AttributeError):
        return None  # encoder-decoder classes take no modality
    if encoder is None or encoder is model or encoder is getattr(model, "base_model", None):
        return None
    path = _path_of(model, encoder)
    return path or None


def _decoder_layers(model: Any, vision_path: str | None) -> tuple[str, list[nn.Module]]:
    """The module list of the decoder's layers: under transformers' `get_decoder()` (anywhere
    if nothing is), outside the vision tower, of the lists as long as the config's depth the
    one holding the most parameters (a list of experts is lighter); failing that, the heaviest
    list. ("", []) for a model with no list of layers."""
    try:
        decoder = model.get_decoder()
    except Exception:
        decoder = model
    root = _path_of(model, decoder) or ""
    depth = config_layers(model.config)
    lists = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList)
        and len(module) > 0
        and not (vision_path and (name + ".").startswith(vision_path + "."))
    ]
    under = [(name, module) for name, module in lists if name.startswith(root + ".")]
    lists = under if root and under else lists  # `get_decoder` is a best effort
    exact = [(name, module) for name, module in lists if len(module) == depth]
    pool = exact or lists
    if not pool:
        return "", []

    def weight(item: tuple[str, nn.ModuleList]) -> tuple[int, int]:
        return sum(p.numel() for p in item[1].parameters()), -item[0].count(".")

    name, module = max(pool, key=weight)
    return name, list(module)


def _peft_all_linear(model: Any) -> set[str]:
    """The module names PEFT's `target_modules="all-linear"` resolves to on this model."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import _maybe_include_all_linear_layers

    lora = LoraConfig(target_modules="all-linear", task_type="CAUSAL_LM")
    resolved: Any = _maybe_include_all_linear_layers(lora, model)
    return set(resolved.target_modules)


def _bnb_4bit_linears(model: Any, skip_modules: list[str] | None) -> set[str]:
    """The linears bitsandbytes' 4-bit loading replaces, by transformers' own rules: its
    default skips (`get_keys_to_not_convert`: tied weights, the last parameter, the output
    embedding) unless the config lists `llm_int8_skip_modules`, plus the class's
    `_keep_in_fp32_modules`; then exactly `nn.Linear` or `Conv1D` (`replace_with_bnb_linear`)."""
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import HfQuantizer
    from transformers.quantizers.quantizers_utils import should_convert_module

    keep = getattr(model, "_keep_in_fp32_modules", None)
    skipped = HfQuantizer.get_modules_to_not_convert(model, skip_modules, keep)
    return {
        name
        for name, module in model.named_modules()
        if (type(module) is nn.Linear or isinstance(module, Conv1D))
        and should_convert_module(name, skipped)
    }


def _linear_shape(module: nn.Module) -> tuple[int, int, bool] | None:
    """(in, out, bias) from the weight as built: a module's `in_features` is whatever its
    class passed (Inkling's vision tower passes 0-d tensors), its weight's shape ints."""
    from transformers.pytorch_utils import Conv1D

    if isinstance(module, nn.Linear):
        out_features, in_features = module.weight.shape
        return int(in_features), int(out_features), module.bias is not None
    if isinstance(module, Conv1D):  # weight stored (in, out)
        return module.weight.shape[0], module.weight.shape[1], module.bias is not None
    return None


def _groups(items: Iterable[tuple[str, nn.Module, bool, bool]]) -> tuple[LinearGroup, ...]:
    """Linears grouped by name pattern, shape and what PEFT and bitsandbytes do with them."""
    counts: Counter[tuple[str, int, int, bool, bool, bool]] = Counter()
    for name, module, adapted, quantized in items:
        shape = _linear_shape(module)
        if shape is not None:
            counts[(pattern(name), *shape, adapted, quantized)] += 1
    return tuple(
        LinearGroup(name, i, o, bias, count, adapted, quantized)
        for (name, i, o, bias, adapted, quantized), count in counts.items()
    )


_NORM = re.compile(r"(Norm|LayerNorm|RMSNorm)\d*$")


def _is_norm(module: nn.Module) -> bool:
    norms = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)
    return isinstance(module, norms) or bool(_NORM.search(type(module).__name__))


def _kinds(
    path: str,
    layers: list[nn.Module],
    text: Any,
    params: Mapping[str, nn.Parameter],
    all_linear: set[str],
    quantized: set[str],
    stacks: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset()),
) -> tuple[LayerKind, ...]:
    """The layers grouped by what they own (parameter names and shapes) and hold (linears)."""
    found: dict[Any, tuple[list[int], LayerKind]] = {}
    for index, layer in enumerate(layers):
        prefix = f"{path}.{index}."
        own = {n[len(prefix) :]: p for n, p in params.items() if n.startswith(prefix)}
        linears = _groups(
            (name, module, prefix + name in all_linear, prefix + name in quantized)
            for name, module in layer.named_modules()
        )
        key = (tuple((n, tuple(p.shape)) for n, p in own.items()), linears)
        if key not in found:
            kind = LayerKind(
                indices=(),
                params=sum(p.numel() for p in own.values()),
                linears=linears,
                norms=tuple(
                    NormModule(name, sum(p.numel() for p in module.parameters()))
                    for name, module in layer.named_modules()
                    if name and _is_norm(module)
                ),
                experts=_experts(layer, text, stacks),
                attention=_attention(layer),
            )
            found[key] = ([], kind)
        found[key][0].append(index)
    return tuple(
        LayerKind(tuple(indices), k.params, k.linears, k.norms, k.experts, k.attention)
        for indices, k in found.values()
    )


def _peft_moe_targets(model: Any) -> tuple[frozenset[str], frozenset[str]]:
    """(stack tensors, modules) PEFT's `all-linear` adapts beyond the linears it resolves:
    on a transformers 5 MoE whose experts and router were linears in transformers 4 (OLMoE,
    Mixtral's layout), `get_peft_model` converts the config (PEFT's
    `convert_peft_config_for_transformers`) into parameter targets on the fused stacks
    (gate_up at twice the rank) and the router's weight. Empty where it does not
    or where this PEFT has no such conversion."""
    from peft import LoraConfig

    try:
        from peft.utils.transformers_weight_conversion import (
            convert_peft_config_for_transformers,
        )
    except ImportError:
        return frozenset(), frozenset()
    lora = LoraConfig(target_modules="all-linear", task_type="CAUSAL_LM")
    try:
        convert_peft_config_for_transformers(lora, model, None)
    except Exception:  # PEFT refuses to convert: it adapts the linears alone, as resolved
        return frozenset(), frozenset()
    targets = set(lora.target_parameters or ())
    # a stack's own tensor (`down_proj`), or a module's parameter (the router's `gate.weight`)
    tensors = frozenset(name for name in targets if "." not in name)
    modules = frozenset(name.rpartition(".")[0] for name in targets if "." in name)
    return (tensors, modules) if tensors else (frozenset(), frozenset())


def _experts(
    layer: nn.Module,
    cfg: Any,
    targets: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset()),
) -> tuple[ExpertStack, ...]:
    """The layer's experts: a module list named `experts`, or a module of fused experts
    (transformers 5 names their classes `...Experts`) whose expert count is the first
    dimension of its 3-D parameters, or, where it stacks them in 2-D (DBRX), the config's.
    Other 3-D parameters (a convolution's, Zamba's per-head projections) are not experts.
    `targets` is what PEFT adapts of them (`_peft_moe_targets`)."""
    stacks: list[ExpertStack] = []
    for name, module in layer.named_modules():
        if any(name.startswith(s.name + ".") for s in stacks):
            continue
        if not (type(module).__name__.endswith("Experts") or _last(name) == "experts"):
            continue
        params = dict(module.named_parameters())
        total = sum(p.numel() for p in params.values())
        if isinstance(module, nn.ModuleList):
            stacks.append(ExpertStack(name, len(module), (), total))
            continue
        fused = [p for p in params.values() if p.dim() == 3]
        count = fused[0].shape[0] if fused else _expert_count(cfg)
        if params and count:
            tensors = tuple((n, tuple(p.shape)) for n, p in params.items())
            adapted = tuple(n for n, _ in tensors if n in targets[0])
            router = _adapted_router(layer, name, targets[1]) if adapted else None
            stacks.append(ExpertStack(name, count, tensors, total, adapted, router))
    return tuple(stacks)


def _adapted_router(
    layer: nn.Module, experts: str, names: frozenset[str]
) -> tuple[int, int] | None:
    """(in, out) of the router beside `experts` that PEFT adapts as a module (OLMoE's
    `mlp.gate`, a weight of experts x hidden in a module of its own), or None."""
    parent = experts.rpartition(".")[0]
    for name, module in layer.named_modules():
        if name.rpartition(".")[0] != parent or _last(name) not in names:
            continue
        weight = getattr(module, "weight", None)
        if not isinstance(module, nn.Linear) and weight is not None and weight.dim() == 2:
            return int(weight.shape[1]), int(weight.shape[0])
    return None


def _expert_count(cfg: Any) -> int | None:
    """The experts per MoE layer the config states (the fields `build.is_moe` reads)."""
    for name in ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"):
        if count := _first_int(cfg, name):
            return count
    return _first_int(getattr(cfg, "ffn_config", None), "moe_num_experts")


def _last(name: str) -> str:
    return name.rpartition(".")[2]


def _attention(layer: nn.Module) -> AttentionShape | None:
    """The layer's attention as built: the first module (by class name an attention) that
    keeps its head width, with its heads, KV heads and head width (its config's where the
    module keeps none); the first attention module by name where none keeps its width."""
    found = None
    for name, module in layer.named_modules():
        cls = type(module).__name__
        if not name or ("Attention" not in cls and "Attn" not in cls) or _is_norm(module):
            continue
        shape = _attention_shape(name, module)
        if shape.head_dim is not None:
            return shape
        found = found or shape
    return found


def _attention_shape(name: str, module: nn.Module) -> AttentionShape:
    cfg = getattr(module, "config", None)
    heads = _first_int(module, *_HEADS) or _first_int(cfg, "num_attention_heads")
    groups = _first_int(module, "num_key_value_groups")
    kv = _first_int(module, *_KV_HEADS)
    if kv is None and heads and groups:
        kv = heads // groups
    kv = kv or _first_int(cfg, "num_key_value_heads") or heads
    head_dim = _first_int(module, *_HEAD_DIM) or _first_int(cfg, "head_dim")
    return AttentionShape(name, heads, kv, head_dim, _first_int(module, "v_head_dim"))


#: What attention modules call their heads, KV heads and head width (Llama's, GPT-2's,
#: Falcon's, GPT-BigCode's, BERT's, DeepSeek MLA's query/key width).
_HEADS = ("num_heads", "num_attention_heads", "n_heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "kv_heads", "n_kv_heads")
_HEAD_DIM = ("head_dim", "head_size", "attention_head_size", "qk_head_dim")


def _first_int(obj: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(obj, name, None) if obj is not None else None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _outside(params: Mapping[str, nn.Parameter], layers_path: str, count: int) -> tuple[Part, ...]:
    """Parameters outside the decoder layers, by the module that holds them: the sibling of the
    layer list (`model.norm`, `model.embed_tokens`) or, further out, the branch that leaves
    its path (`lm_head`, `model.vision_tower`, `model.multi_modal_projector`)."""
    anchor = layers_path.split(".")[:-1] if layers_path else []
    inside = tuple(f"{layers_path}.{i}." for i in range(count))
    parts: Counter[str] = Counter()
    for name, param in params.items():
        if inside and name.startswith(inside):
            continue
        parts_of = name.split(".")
        k = 0
        while k < len(anchor) and k < len(parts_of) - 1 and parts_of[k] == anchor[k]:
            k += 1
        parts[".".join(parts_of[: k + 1])] += param.numel()
    return tuple(Part(name, n) for name, n in parts.items())


def _embedding_params(model: Any, params: Mapping[str, nn.Parameter]) -> tuple[int, int]:
    """(input embedding parameters, output embedding parameters not shared with them)."""
    counted = {id(p): p.numel() for p in params.values()}
    embed = _module_params(model, "get_input_embeddings")
    head = _module_params(model, "get_output_embeddings") - embed
    return sum(counted.get(i, 0) for i in embed), sum(counted.get(i, 0) for i in head)


def _module_params(model: Any, getter: str) -> set[int]:
    try:
        module = getattr(model, getter)()
    except (NotImplementedError, AttributeError):
        return set()
    return {id(p) for p in module.parameters()} if isinstance(module, nn.Module) else set()


def _tied(model: Any) -> bool:
    embed = _module_params(model, "get_input_embeddings")
    head = _module_params(model, "get_output_embeddings")
    return bool(embed & head)


# -- the command line -------------------------------------------------------------------------


def _config_from(arg: str) -> dict[str, Any]:
    """A config.json path, a vramgate preset, or a model_type (its default config)."""
    path = Path(arg)
    if path.is_file():
        data = json.loads(path.read_text())
        inner = data.get("config")  # a preset file: its config under "config"
        return dict(inner if isinstance(inner, dict) and "repo" in data else data)
    from controller.estimator.errors import SpecError
    from controller.estimator.presets import load_preset

    with contextlib.suppress(SpecError):
        return dict(load_preset(arg).config)
    from transformers import AutoConfig

    if arg not in mapping("causal_lm") and arg not in mapping("image_text_to_text"):
        auto_class_for(arg, {})  # the refusal, in its words
    return dict(AutoConfig.for_model(arg).to_dict())


def _lines(inv: ModelInventory) -> Iterator[str]:
    yield (
        f"{inv.model_type} ({inv.model_class}, {AUTO_CLASSES[inv.auto_class]}): "
        f"{inv.params:,} parameters, {inv.layers} of {inv.config_layers} layers built"
    )
    yield (
        f"  hidden {inv.hidden_size}, vocab {inv.vocab_size}, heads {inv.heads}, "
        f"kv heads {inv.kv_heads}, head_dim {inv.head_dim}, tied {inv.tied_embeddings}"
    )
    yield f"  outside the layers ({inv.outside_params:,}):"
    for part in inv.outside:
        yield f"    {part.name}: {part.params:,}"
    for kind in inv.kinds:
        shown = ",".join(map(str, kind.indices[:8])) + ("..." if len(kind.indices) > 8 else "")
        yield f"  {inv.layers_path}.[{shown}] ({len(kind.indices)} x {kind.params:,}):"
        if kind.attention:
            a = kind.attention
            yield f"    {a.name}: heads {a.heads}, kv {a.kv_heads}, head_dim {a.head_dim}"
        for e in kind.experts:
            yield f"    {e.name}: {e.count} experts, {e.params:,} parameters"
        for g in kind.linears:
            flags = ("" if g.all_linear else " not-all-linear") + (
                "" if g.quantized_4bit else " 16-bit-under-4bit"
            )
            yield f"    {g.name} x{g.count}: {g.in_features} -> {g.out_features}{flags}"
        if kind.norms:
            yield "    norms: " + ", ".join(n.name for n in kind.norms)
    yield "  all-linear: " + ", ".join(inv.all_linear)
    yield "  kept 16-bit under 4-bit: " + ", ".join(inv.kept_16bit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m controller.trace.inventory", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("model", help="a config.json path, a vramgate preset or a model_type")
    parser.add_argument("--layers", type=int, default=None, help="cut to this many layers")
    parser.add_argument("--auto", choices=sorted(AUTO_CLASSES), default=None)
    parser.add_argument("--json", action="store_true", help="print the inventory as JSON")
    args = parser.parse_args(argv)
    try:
        inv = read_inventory(_config_from(args.model), args.layers, args.auto)
    except TraceUnsupported as error:
        print(f"vramgate: {error}", file=sys.stderr)
        return 2
    if args.json:
        from dataclasses import asdict

        print(json.dumps(asdict(inv), indent=1))
    else:
        print("\n".join(_lines(inv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
