"""What a model transformers builds holds, module by module, as plain data.

`controller.trace.inventory` reads a `ModelInventory` from the model transformers builds on
the meta device; nothing here imports torch, so the pure estimator can read one (from a cache
or from the API) without the trace extra. Names are module paths as `named_modules()` gives
them; in a group every run of digits that is a path component (a layer's or an expert's index)
reads `*`, so one group stands for the same module in every layer or expert.

    inv.params                       # every parameter of the built model, counted once
    inv.layer_params + inv.outside_params == inv.params
    inv.kinds[0].indices             # the decoder layers built alike (same tensors, same shapes)
    inv.all_linear                   # the modules PEFT's `target_modules="all-linear"` adapts
    inv.kept_16bit                   # the linears bitsandbytes' 4-bit loading leaves unquantised
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: A path component that is an index into a module list (a layer, an expert).
_INDEX = re.compile(r"(?<![^.])\d+(?![^.])")


def pattern(name: str) -> str:
    """`name` with every index component as `*`: `model.layers.3.mlp.experts.0.up_proj` reads
    `model.layers.*.mlp.experts.*.up_proj`."""
    return _INDEX.sub("*", name)


@dataclass(frozen=True, slots=True)
class LinearGroup:
    """`count` linear modules of one name pattern and shape (`nn.Linear`, or GPT-2's `Conv1D`,
    whose weight is stored transposed: in/out here are what it maps).

    `all_linear`: PEFT's `all-linear` adapts them (every linear but the output embedding).
    `quantized_4bit`: bitsandbytes' 4-bit loading replaces them (exactly `nn.Linear` or
    `Conv1D`, not a subclass, and not skipped: the output embedding, tied weights, the last
    parameter, the class's `_keep_in_fp32_modules`, `llm_int8_skip_modules`)."""

    name: str
    in_features: int
    out_features: int
    bias: bool
    count: int
    all_linear: bool
    quantized_4bit: bool

    @property
    def params(self) -> int:
        return (self.in_features + int(self.bias)) * self.out_features * self.count

    def lora_params(self, rank: int) -> int:
        """PEFT's LoRA on each: A (r x in) and B (out x r), no bias."""
        return rank * (self.in_features + self.out_features) * self.count


@dataclass(frozen=True, slots=True)
class ExpertStack:
    """The experts of an MoE block: `count` experts, either fused into 3-D parameters
    (`tensors`: name and shape, the expert dimension first; transformers 5 fuses most) or a
    module list of experts whose linears are in the layer's `linears` as `<name>.*.<linear>`."""

    name: str
    count: int
    tensors: tuple[tuple[str, tuple[int, ...]], ...]
    params: int
    #: The stack's tensors PEFT's `all-linear` adapts: on a transformers 5 MoE whose experts
    #: were linears in transformers 4, PEFT maps all-linear onto the fused stacks (and the
    #: router) as parameter targets (its `convert_peft_config_for_transformers`).
    adapted: tuple[str, ...] = ()
    #: (in, out) of the block's router where PEFT adapts it too (a module, not a linear).
    router: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class NormModule:
    """A normalisation module (LayerNorm, RMSNorm and the families' own) and its parameters."""

    name: str
    params: int


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """The attention module of a layer as built: query heads, key/value heads and the width of
    one query/key head (`value_head_dim` where it differs: DeepSeek's MLA)."""

    name: str
    heads: int | None
    kv_heads: int | None
    head_dim: int | None
    value_head_dim: int | None = None


@dataclass(frozen=True, slots=True)
class LayerKind:
    """Decoder layers built alike: the same parameters (names and shapes) at `indices`.

    `params` is one layer's own parameters (a parameter shared with an earlier layer, as in
    Zamba's shared blocks, counts where it first appears). Names are relative to the layer."""

    indices: tuple[int, ...]
    params: int
    linears: tuple[LinearGroup, ...]
    norms: tuple[NormModule, ...]
    experts: tuple[ExpertStack, ...]
    attention: AttentionShape | None

    @property
    def total_params(self) -> int:
        return self.params * len(self.indices)


@dataclass(frozen=True, slots=True)
class Part:
    """Parameters outside the decoder layers, by the module that holds them."""

    name: str
    params: int


@dataclass(frozen=True, slots=True)
class ModelInventory:
    """A built model's modules and parameter counts (see the module docstring).

    `layers` is how many decoder layers were built (the config's own depth unless the build
    was cut), `config_layers` the depth the config states. Every count is of the model as
    built: at its own depth, `params` is what transformers reports for the checkpoint."""

    model_type: str
    model_class: str
    auto_class: str
    layers: int
    config_layers: int
    layers_path: str
    hidden_size: int | None
    vocab_size: int | None
    heads: int | None
    kv_heads: int | None
    head_dim: int | None
    tied_embeddings: bool
    params: int
    embedding_params: int
    head_params: int
    vision_params: int
    vision_path: str | None
    outside: tuple[Part, ...]
    kinds: tuple[LayerKind, ...]
    linears: tuple[LinearGroup, ...]

    @property
    def layer_params(self) -> int:
        return sum(kind.total_params for kind in self.kinds)

    @property
    def outside_params(self) -> int:
        return sum(part.params for part in self.outside)

    @property
    def all_linear(self) -> tuple[str, ...]:
        """The module patterns PEFT's `all-linear` adapts."""
        return tuple(sorted({g.name for g in self.linears if g.all_linear}))

    @property
    def kept_16bit(self) -> tuple[str, ...]:
        """The linear patterns bitsandbytes' 4-bit loading leaves in 16 bits."""
        return tuple(sorted({g.name for g in self.linears if not g.quantized_4bit}))

    def kind_of(self, index: int) -> LayerKind:
        for kind in self.kinds:
            if index in kind.indices:
                return kind
        raise IndexError(f"no decoder layer {index} in a {self.layers}-layer build")
