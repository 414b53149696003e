"""A `ModelShape` read generically from a built model's inventory, for the families the
hand-written parser does not read.

    shape = shape_from_inventory(read_inventory(config), config)   # the trace extra builds it

`parse_config` reads 28 families by hand, each byte-exact; any other `model_type` it refuses.
transformers builds many more, and what the formula profiles need of one is in the module
inventory of the model it builds (`controller.estimator.model.inventory`): every linear of
every layer with its name, shape and bias, the norms and other tensors, fused expert stacks,
attention heads, the embeddings and head, a vision tower. This module turns that inventory
into the same `ModelShape` the parser gives, so `analytic`, `unsloth` and `calibrated` price
it as they price a hand-read family:

* each decoder layer's linears keep their module's last name (`query_key_value`, `fc1`,
  `dense_h_to_4h`): LoRA targets match them as PEFT matches a target, by the name's suffix;
  a linear PEFT's `all-linear` adapts or bitsandbytes quantises is one here, the others (an
  MoE router kept in 16 bits) are read as the layer's `router`, never quantised;
* a fused expert stack (a 3-D parameter) is an expert linear of `copies` experts; a module
  list of experts keeps its linears as linears (PEFT adapts them and bitsandbytes quantises
  them as any other);
* the linears outside the layers that PEFT's `all-linear` adapts (a projector's) are
  `outer_linears`; a vision tower is frozen, as vision-language fine-tuning recipes keep it
  and no spec field says otherwise (`frozen_linears`, the linears bitsandbytes quantises, and
  `frozen_params`, the rest of it: weights only, LoRA only on linears a target names); all
  else outside the layers (norms, position embeddings) is counted with the final norm, so
  the total is the inventory's exactly.

The shape is built from the model at its own depth (a cut inventory would count fewer
layers); it carries a note (`config_warnings`) that says it was read generically.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from controller.estimator.context import rope_context
from controller.estimator.errors import SpecError
from controller.estimator.frozen import assemble
from controller.estimator.model.inventory import LayerKind, ModelInventory
from controller.estimator.model.read import (
    TOP_K_FIELDS,
    Reader,
    read_quantization,
)
from controller.estimator.model.shape import (
    ArchDims,
    Layer,
    Linear,
    ModelShape,
    Quantization,
    count_layers,
)

#: The `calibrated` fit that prices a generic shape, the closest fitted family by structure:
#: a dense stack as Llama's (attention + gated MLP); one with routed experts as GPT-OSS's, the
#: fitted MoE whose expert stacks PEFT leaves alone, as it leaves most generic shapes'
#: (Qwen3-MoE's fit prices LoRA on the stacks: 14x the traced activations of a 2-layer
#: Granite-MoE); and one whose stacks PEFT does adapt (OLMoE's: `peft_adapts_stacks`), under a
#: LoRA whose targets reach them, as Qwen3-MoE's, whose fit holds the dequantised stacks with
#: their LoRA update folded in at each layer's backward (OLMoE-1B-7B at 2,048 tokens, the
#: allocated level against the trace: LoRA -4.3 % and QLoRA -8.1 % with GPT-OSS's fit,
#: +0.0 % and +0.2 % with Qwen3-MoE's).
GENERIC_FITS = {"dense": "llama", "moe": "gpt_oss", "moe_adapted_stacks": "qwen3_moe"}
#: The note every generic shape carries, at the config's path: what read it, how it is priced.
GENERIC_NOTE = (
    "{model_type} is read generically from the model transformers builds (its modules and "
    "parameters as built), not by a hand-written reading of its family; the calibrated "
    "profile prices it with the {fit} fit (the closest fitted structure, not fitted to "
    "{model_type}: the trace profile measures it)"
)

#: The note of a shape whose layers mix tokens by something no calibrated fit has seen: the
#: profile hands its jobs to the trace instead of pricing them as attention.
HANDOFF_NOTE = (
    "{model_type} is read generically from the model transformers builds, and its "
    "{mixers} layers mix tokens without softmax attention (a state space, a recurrence, a "
    "linear attention or a convolution), which no calibrated fit prices: the calibrated "
    "profile hands its jobs to the trace profile (analytic and unsloth price those layers "
    "as attention)"
)

#: The first path component of a layer's MLP (or MoE) module: never its token mixer.
MLP_ROOTS = frozenset({"mlp", "feed_forward", "ffn", "mlp_block", "block_sparse_moe", "moe"})

#: The note of a shape with a vision tower: what of it is trained (no spec field says).
VISION_NOTE = (
    "the vision tower is frozen (weights only, as vision-language fine-tuning recipes keep "
    "it): full fine-tuning trains the language model, and LoRA adapts the tower's linears "
    "only where lora.targetModules names them (all-linear leaves them out)"
)


def _fit_kind(experts: int, peft_adapts_stacks: bool) -> str:
    if experts <= 1:
        return "dense"
    return "moe_adapted_stacks" if peft_adapts_stacks else "moe"


def generic_fit(shape: ModelShape, targets: tuple[str, ...] | None = None) -> str:
    """The calibrated fit a generic shape is priced with (`GENERIC_FITS`). `targets`, a
    LoRA job's (canonical) modules: its stacks are adapted only where they reach them
    (`all-linear`, or an expert linear by name); None for a job with no adapters."""
    experts = shape.dims.num_experts
    if experts <= 1 or not shape.peft_adapts_stacks or targets is None:
        return GENERIC_FITS[_fit_kind(experts, False)]
    reached = "all-linear" in targets or any(
        lin.expert and lin.name in targets
        for layer, _ in shape.layer_counts
        for lin in layer.linears
    )
    return GENERIC_FITS[_fit_kind(experts, reached)]


def unpriced_mixer(kind: LayerKind) -> str | None:
    """The module that mixes tokens in layers of `kind` where it is not softmax attention
    with heads (the inventory finds no attention module, or one without heads: RWKV's time
    mix), named by its path's first component; None for attention, which the fits price."""
    if kind.attention is not None and kind.attention.heads:
        return None
    if kind.attention is not None:
        return kind.attention.name
    roots = [group.name.split(".", 1)[0] for group in kind.linears]
    return next((root for root in roots if root not in MLP_ROOTS), "non-attention")


def _leaf(name: str) -> str:
    return name.rpartition(".")[2]


def _layer(kind: LayerKind) -> tuple[Layer, int | None, int | None]:
    """One kind of layer as a `Layer`, with its dense MLP width and its experts' width
    (None where it has none)."""
    attention = kind.attention.name + "." if kind.attention else None
    linears: list[Linear] = []
    counted = 0
    mlp_width: int | None = None
    for group in kind.linears:
        name = _leaf(group.name)
        if not (group.all_linear or group.quantized_4bit):
            name = "router"  # neither adapted nor quantised: priced as a router
        linears.append(
            Linear(
                name,
                group.in_features,
                group.out_features,
                group.bias,
                group.count,
                False,
                kept_16bit=not group.quantized_4bit,
            )
        )
        counted += group.params
        in_attention = attention is not None and group.name.startswith(attention)
        # the MLP's output projection maps its width back to the hidden size
        mlp_out = group.count == 1 and group.in_features > group.out_features
        if not in_attention and mlp_out and name != "router":
            mlp_width = max(mlp_width or 0, group.in_features)
    expert_width: int | None = None
    for stack in kind.experts:
        for tensor, dims in stack.tensors:
            if len(dims) != 3:
                continue  # a bias or a 2-D stack (DBRX's): one of the layer's other tensors
            copies, out, inp = dims  # transformers 5's stacks: (experts, out, in)
            linears.append(Linear(_leaf(tensor), inp, out, False, copies, True))
            counted += math.prod(dims)
            if "down" in tensor or "w2" in tensor:
                expert_width = max(expert_width or 0, min(inp, out))
        if stack.router is not None:  # a router PEFT adapts: priced as a router linear
            fan_in, fan_out = stack.router
            linears.append(Linear("router", fan_in, fan_out, False, 1, False))
            counted += fan_in * fan_out
        if expert_width is None:
            expert_width = mlp_width
    other = kind.params - counted
    norms = tuple(n.params for n in kind.norms if n.params)
    rest = other - sum(norms)
    tensors = (*norms, rest) if rest > 0 else norms
    if rest < 0:
        tensors = (other,) if other > 0 else ()
    layer = Layer(
        linears=tuple(linears),
        other_params=other,
        moe=bool(kind.experts),
        other_tensors=tensors,
    )
    return layer, mlp_width, expert_width


def _text(config: Mapping[str, Any]) -> Mapping[str, Any]:
    nested = config.get("text_config")
    if isinstance(nested, Mapping):
        return {k: v for k, v in config.items() if k != "text_config"} | dict(nested)
    return config


#: Inventories whose `GenericLayout` is kept (`generic_layout`): as many models as the
#: operator keeps generic shapes of (`controller.jobs.profiles.GENERIC_SHAPES`).
GENERIC_LAYOUTS = 64


@dataclass(frozen=True, slots=True)
class GenericLayout:
    """What a generic shape takes from the inventory alone, derived once per inventory
    (`generic_layout`), so a shape read again for another config of the same model (another
    quantization_config, context length or source) costs the config's fields, not the
    layers' reading. Its layers are shared by every shape read from it, which the estimator
    prices by identity as it prices a hand-read shape's (`ModelShape.layer_counts`)."""

    layers: tuple[Layer, ...]
    #: What ModelShape's cached properties of these layers compute, kept with them.
    layer_counts: tuple[tuple[Layer, int], ...]
    total_params: int
    #: ArchDims' fields but `intermediate_size` (where no MLP width was read, the config's)
    #: and `experts_per_token` (the config's): read-only.
    dims: Mapping[str, Any]
    #: The widest dense MLP, else the widest experts, None where no layer shows one.
    mlp_width: int | None
    outer_linears: tuple[Linear, ...]
    frozen_linears: tuple[Linear, ...]
    frozen_params: int
    final_norm_params: int
    unpriced_mixers: tuple[str, ...]
    peft_adapts_stacks: bool
    #: `GENERIC_NOTE` or `HANDOFF_NOTE` for this model.
    note: str


@lru_cache(maxsize=GENERIC_LAYOUTS)
def generic_layout(inventory: ModelInventory) -> GenericLayout | None:
    """The layout of the model `inventory` was read from, None where it builds without a
    hidden size, attention heads, vocabulary or decoder layers (`shape_from_inventory` says
    so at the config's path). Kept by the inventory's value (a frozen dataclass of tuples):
    an inventory read again finds the layout of an equal one."""
    inv = inventory
    hidden, heads = inv.hidden_size, inv.heads
    unpriced = tuple(sorted({m for kind in inv.kinds if (m := unpriced_mixer(kind)) is not None}))
    if not heads and unpriced:
        # no attention anywhere (Mamba, RWKV, xLSTM): calibrated hands these jobs to the trace;
        # the other formula profiles, which price every layer as attention, see one head
        heads = 1
    if not hidden or not heads or not inv.vocab_size or not inv.layers:
        return None
    by_index: dict[int, Layer] = {}
    mlp_widths: list[int] = []
    expert_widths: list[int] = []
    experts = 0
    for kind in inv.kinds:
        layer, mlp, expert = _layer(kind)
        for index in kind.indices:
            by_index[index] = layer
        if mlp and not kind.experts:
            mlp_widths.append(mlp)
        if kind.experts:
            experts = max(experts, max(stack.count for stack in kind.experts))
            if expert:
                expert_widths.append(expert)
    layers = tuple(by_index[i] for i in range(inv.layers))
    mlp_width = max(mlp_widths) if mlp_widths else (max(expert_widths) if expert_widths else None)
    dense = tuple(i for i, layer in enumerate(layers) if not layer.moe) if experts > 1 else ()

    outer: list[Linear] = []
    frozen: list[Linear] = []  # the vision tower's: see ModelShape.frozen_linears
    layer_prefix = inv.layers_path + "."
    vision_prefix = inv.vision_path + "." if inv.vision_path else None
    for group in inv.linears:
        if group.name.startswith(layer_prefix) or not group.quantized_4bit:
            continue  # kept 16-bit and never a LoRA target of ours: counted as frozen
        linear = Linear(
            _leaf(group.name), group.in_features, group.out_features, group.bias, group.count
        )
        if vision_prefix and group.name.startswith(vision_prefix):
            frozen.append(linear)
        elif group.all_linear:
            outer.append(linear)
    outer_params = sum(lin.params for lin in outer)
    rest = (
        inv.outside_params
        - inv.embedding_params
        - inv.head_params
        - outer_params
        - inv.vision_params
    )
    dims = {
        "hidden_size": hidden,
        "num_layers": inv.layers,
        "num_heads": heads,
        "num_kv_heads": inv.kv_heads or heads,
        "head_dim": inv.head_dim,
        "vocab_size": inv.vocab_size,
        "tie_word_embeddings": inv.tied_embeddings,
        "num_experts": experts if experts > 1 else 0,
        "moe_intermediate_size": max(expert_widths) if expert_widths else None,
        "n_shared_experts": 0,
        "shared_expert_intermediate_size": None,
        "shared_expert_gate": False,
        "dense_intermediate_size": None,
        "dense_layers": dense,
        "moe_has_dense_mlp": False,
        "q_lora_rank": None,
        "kv_lora_rank": None,
        "qk_nope_head_dim": None,
        "qk_rope_head_dim": None,
        "v_head_dim": None,
        "global_head_dim": None,
        "num_global_kv_heads": None,
        "attention_k_eq_v": False,
        "layer_types": None,
        "num_kv_shared_layers": 0,
        "use_double_wide_mlp": False,
        "vocab_size_per_layer_input": 0,
        "hidden_size_per_layer_input": 0,
        "mixers": None,
        "ssm": None,
        "mamba1": None,
        "deltanet": None,
        "attention_output_gate": False,
        "laurel_rank": 0,
        "altup_num_inputs": 0,
        "activation_sparsity": (),
        "sliding_window": None,
        "moe_latent_size": None,
    }
    adapts_stacks = any(stack.adapted for kind in inv.kinds for stack in kind.experts)
    fit = GENERIC_FITS[_fit_kind(experts, False)]
    if experts > 1 and adapts_stacks:  # `generic_fit`: by the job's targets
        adapted = GENERIC_FITS["moe_adapted_stacks"]
        fit = f"{adapted} fit where a LoRA reaches its expert stacks, else the {fit}"
    counts = count_layers(layers)
    frozen_params = inv.vision_params - sum(lin.params for lin in frozen)
    final_norm_params = max(rest, 0)
    total_params = (  # `ModelShape.total_params`'s sum
        sum(layer.params * count for layer, count in counts)
        + outer_params
        + sum(lin.params for lin in frozen)
        + frozen_params
        + inv.embedding_params
        + inv.head_params
        + final_norm_params
    )
    return GenericLayout(
        layers=layers,
        layer_counts=counts,
        total_params=total_params,
        dims=MappingProxyType(dims),
        mlp_width=mlp_width,
        outer_linears=tuple(outer),
        frozen_linears=tuple(frozen),
        frozen_params=frozen_params,
        final_norm_params=final_norm_params,
        unpriced_mixers=unpriced,
        peft_adapts_stacks=adapts_stacks,
        note=(
            HANDOFF_NOTE.format(model_type=inv.model_type, mixers=", ".join(unpriced))
            if unpriced
            else GENERIC_NOTE.format(model_type=inv.model_type, fit=fit)
        ),
    )


#: The layouts of the inventories last read, by identity: the operator reads a shape again
#: from the very inventory object it keeps, and hashing a large model's inventory by value
#: (`generic_layout`'s key) costs a few microseconds a call. Each entry holds its inventory,
#: so an id is not reused while kept; cleared when full.
_BY_IDENTITY: dict[int, tuple[ModelInventory, GenericLayout | None]] = {}


def _layout_of(inventory: ModelInventory) -> GenericLayout | None:
    hit = _BY_IDENTITY.get(id(inventory))
    if hit is not None and hit[0] is inventory:
        return hit[1]
    layout = generic_layout(inventory)
    if len(_BY_IDENTITY) >= GENERIC_LAYOUTS:
        _BY_IDENTITY.clear()
    _BY_IDENTITY[id(inventory)] = (inventory, layout)
    return layout


def shape_from_inventory(
    inventory: ModelInventory, config: Mapping[str, Any], prefix: str = ""
) -> ModelShape:
    """The `ModelShape` of the model `inventory` was read from (at the config's own depth),
    for `config` (its quantization_config, context length and source): the inventory's
    `generic_layout` and what the config says."""
    inv = inventory
    if inv.layers != inv.config_layers:
        raise ValueError(
            f"the inventory was built with {inv.layers} of {inv.config_layers} layers; a shape "
            "needs the model at its own depth"
        )
    where = prefix or "config"
    layout = _layout_of(inv)
    if layout is None:
        raise SpecError(
            where,
            f"{inv.model_type} builds without a hidden size, attention heads, vocabulary or "
            "decoder layers that vramgate can read, so the formula profiles cannot price it "
            "(the trace profile can)",
        )
    text = _text(config)
    r = Reader(text, prefix)
    intermediate = (
        layout.mlp_width
        or _config_int(r, "intermediate_size", "ffn_hidden_size", "n_inner")
        or 4 * layout.dims["hidden_size"]
    )
    experts = layout.dims["num_experts"]
    top_k = (_config_int(r, *TOP_K_FIELDS) or 1) if experts else 0
    dims = assemble(  # ArchDims(...), faster: see frozen.py
        ArchDims,
        {**layout.dims, "intermediate_size": intermediate, "experts_per_token": top_k},
    )
    max_pos = _config_int(
        r, "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"
    )
    return assemble(
        ModelShape,
        {
            "model_type": inv.model_type,
            "dims": dims,
            "layers": layout.layers,
            "embedding_params": inv.embedding_params,
            "lm_head_params": inv.head_params,
            "final_norm_params": layout.final_norm_params,
            "max_position_embeddings": max_pos,
            "context_length": rope_context(text, prefix, max_pos),
            "quantization": _applied(read_quantization(config, text, prefix)),
            "source": config,
            "memo": {},
            "outer_linears": layout.outer_linears,
            "frozen_linears": layout.frozen_linears,
            "frozen_params": layout.frozen_params,
            "unpriced_mixers": layout.unpriced_mixers,
            "peft_adapts_stacks": layout.peft_adapts_stacks,
            "config_warnings": (
                (where, layout.note),
                *([(where, VISION_NOTE)] if inv.vision_path else []),
            ),
            # What the cached properties would compute, kept with the layout (a shape built
            # by `dataclasses.replace` computes them again: test_generic_shape compares).
            "layer_counts": layout.layer_counts,
            "total_params": layout.total_params,
        },
    )


def _applied(quantization: Quantization | None) -> Quantization | None:
    """The checkpoint's quantization with its skip list already applied: the inventory was
    read with it (bitsandbytes' own rules mark each linear `quantized_4bit`, which the
    layers' linears carry as `kept_16bit`), so storage does not match it again by the hand
    reading's module paths, which a generic shape's linears do not follow."""
    if quantization is None or not quantization.skip_modules:
        return quantization
    return replace(quantization, skip_modules=())


def _config_int(r: Reader, *names: str) -> int | None:
    try:
        return r.int(*names, maximum=None)
    except SpecError:
        return None
