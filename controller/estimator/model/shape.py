"""A parsed model: every tensor it owns by layer (`ModelShape`), its config-level dimensions
(`ArchDims`), and the figures derived from them.

The estimator needs two views of a model. The exact one (`Layer.linears` and `other_params`)
counts every parameter the real checkpoint holds, so `total_params` equals the count a model
card publishes; it feeds the `analytic` profile and LoRA counts. The config-level one
(`ArchDims`) keeps the raw dimensions the `unsloth` profile's calibrated formula is written in.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any, Generic, TypeVar, cast

from controller.estimator.model.families import family_traits


@dataclass(frozen=True, slots=True)
class Linear:
    """One weight matrix (or `copies` identical ones, the experts of an MoE layer)."""

    name: str
    in_features: int
    out_features: int
    bias: bool = False
    copies: int = 1
    expert: bool = False
    # Left in 16 bits by bitsandbytes' 4-bit loading though a linear (a shape read generically:
    # the config's `llm_int8_skip_modules`, transformers' own skips); the hand reading matches
    # a skip list by path instead (`storage._skipped_linears`).
    kept_16bit: bool = False

    @property
    def params(self) -> int:
        return (self.in_features * self.out_features + (self.out_features if self.bias else 0)) * (
            self.copies
        )

    @property
    def weight_params(self) -> int:
        return self.in_features * self.out_features * self.copies

    def lora_params(self, rank: int) -> int:
        """A LoRA adapter of rank r on in x out adds r x (in + out) (PEFT, no bias)."""
        return rank * (self.in_features + self.out_features) * self.copies


@dataclass(frozen=True)
class Layer:
    """A decoder block: its linear modules plus norms, sinks and router biases."""

    linears: tuple[Linear, ...]
    other_params: int
    attention_type: str = "full_attention"
    moe: bool = False
    other_tensors: tuple[int, ...] = ()  # other_params tensor by tensor (sizes)
    # What the block computes: an attention + MLP block (every family but the hybrids), or
    # one mixer of a hybrid stack (`MIXERS`: Nemotron-H runs one of them per layer).
    mixer: str = "attention_mlp"
    # fp32 buffers the layer holds (sizes), no parameters: DeepSeek-V3's score-correction bias
    # (`Family.router_correction_bias`). Weights on the GPU, never trained or in the optimizer.
    fp32_buffers: tuple[int, ...] = ()

    @property
    def params(self) -> int:
        return sum(lin.params for lin in self.linears) + self.other_params


@dataclass(frozen=True, slots=True)
class Quantization:
    """What a pre-quantised checkpoint's `quantization_config` says about its 4-bit base."""

    method: str
    load_in_4bit: bool
    double_quant: bool
    skip_modules: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SsmDims:
    """A Mamba-2 mixer's widths as the config states them (Nemotron-H's field names)."""

    num_heads: int
    head_dim: int
    n_groups: int
    state_size: int
    conv_kernel: int
    chunk_size: int
    conv_bias: bool
    proj_bias: bool  # in_proj's bias
    # out_proj's bias (Falcon-H1 reads `projectors_bias` for it, Nemotron-H `use_bias`) and
    # whether the mixer has its gated RMSNorm (Falcon-H1 only with `mamba_rms_norm`).
    out_bias: bool = False
    gated_norm: bool = True

    @property
    def inner(self) -> int:
        """The SSM's width (heads x head dim): the gate z, the input x and the output y."""
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise causal convolution: x, B and C (one B, C per group)."""
        return self.inner + 2 * self.n_groups * self.state_size

    @property
    def in_proj_width(self) -> int:
        """in_proj's output: z, then x/B/C (the convolution's input), then dt per head."""
        return self.inner + self.conv_dim + self.num_heads


@dataclass(frozen=True, slots=True)
class Mamba1Dims:
    """A Mamba (1) mixer's widths as the config states them (Jamba's field names)."""

    inner: int  # mamba_expand x hidden
    state_size: int
    conv_kernel: int
    dt_rank: int
    conv_bias: bool
    proj_bias: bool


@dataclass(frozen=True, slots=True)
class DeltaNetDims:
    """A Gated DeltaNet (linear attention) mixer's widths (Qwen3-Next's `linear_*` fields)."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal convolution over q, k and v."""
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class ArchDims:
    """The config-level dimensions, as the config states them (for formula profiles)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    num_experts: int
    experts_per_token: int
    moe_intermediate_size: int | None
    n_shared_experts: int
    shared_expert_intermediate_size: int | None
    # Qwen-MoE gates its shared expert by an h -> 1 linear; DeepSeek, GLM, Llama 4 do not.
    shared_expert_gate: bool
    # The dense layers' MLP width where it is not intermediate_size (Llama 4's
    # intermediate_size_mlp; its experts and shared expert are intermediate_size wide).
    dense_intermediate_size: int | None
    dense_layers: tuple[int, ...]
    moe_has_dense_mlp: bool
    q_lora_rank: int | None
    kv_lora_rank: int | None
    qk_nope_head_dim: int | None
    qk_rope_head_dim: int | None
    v_head_dim: int | None
    global_head_dim: int | None
    num_global_kv_heads: int | None
    attention_k_eq_v: bool
    layer_types: tuple[str, ...] | None
    num_kv_shared_layers: int
    use_double_wide_mlp: bool
    vocab_size_per_layer_input: int
    hidden_size_per_layer_input: int
    # Hybrid stacks (Nemotron-H): each layer's mixer (`MIXERS`), None for a stack of
    # attention + MLP blocks; the Mamba-2 widths where some mixer is one.
    mixers: tuple[str, ...] | None = None
    ssm: SsmDims | None = None
    mamba1: Mamba1Dims | None = None  # Jamba's Mamba layers
    deltanet: DeltaNetDims | None = None  # Qwen3-Next's linear-attention layers
    # Qwen3-Next's full attention gates its output: q_proj is twice q's width (q and gate).
    attention_output_gate: bool = False
    # Gemma 3n: LAuReL's rank (a low-rank residual branch per layer) and AltUp's number of
    # predicted streams (0: none).
    laurel_rank: int = 0
    altup_num_inputs: int = 0
    # Gemma 3n: each layer's activation sparsity (`activation_sparsity_pattern`; above 0 the
    # MLP cuts its gate at a Gaussian quantile, which holds one more t x MLP-width tensor).
    activation_sparsity: tuple[float, ...] = ()
    # Gemma 3n's sliding window (its config class's default 512): from this many tokens on,
    # transformers materialises the sliding layers' mask (b x s x s).
    sliding_window: int | None = None
    # Nemotron 3's MoE layers: the width its experts read and write when a latent projection
    # (fc1/fc2_latent_proj) narrows the hidden state for them; None: the hidden size.
    moe_latent_size: int | None = None

    @cached_property
    def dense_layer_set(self) -> frozenset[int]:
        """`dense_layers` for membership tests in loops over layers (a tuple would make
        them quadratic in the depth)."""
        return frozenset(self.dense_layers)


@dataclass(frozen=True)
class ModelShape:
    """A parsed model: exact tensors per layer plus the config-level dimensions."""

    model_type: str
    dims: ArchDims
    layers: tuple[Layer, ...]
    embedding_params: int
    lm_head_params: int
    final_norm_params: int
    max_position_embeddings: int | None
    quantization: Quantization | None
    # The longest sequence the positions cover: max_position_embeddings, or more under rope
    # scaling (`context.rope_context`); a longer one is warned about, not refused.
    context_length: int | None = None
    # The config.json this shape was parsed from: the `trace` profile builds the real model.
    source: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    # Derived values computed once per parsed model (LoRA counts per target set, profile
    # views): estimates run thousands of times a second on the same few shapes. Read and
    # written only through `Memo` kinds, which say what type each value has.
    memo: dict[object, object] = field(default_factory=dict, compare=False, repr=False)
    # Linear modules outside the decoder layers, the LM head aside (Gemma 3n's AltUp
    # projections and per-layer model projection): PEFT's all-linear adapts them, and
    # bitsandbytes quantises them, as it does the layers' linears.
    outer_linears: tuple[Linear, ...] = ()
    # A vision tower read generically (`model.generic`): the linears bitsandbytes quantises,
    # then every other parameter of it. Frozen, as vision-language fine-tuning recipes keep
    # the tower (no spec field trains it): weights only under full fine-tuning, and its
    # linears LoRA targets only where a target names them (never `all-linear`).
    frozen_linears: tuple[Linear, ...] = ()
    frozen_params: int = 0
    # The token mixers of a shape read generically that are not softmax attention (a state
    # space's, a recurrence's, a linear attention's, a convolution's module name): no
    # calibrated fit prices them, so calibrated hands such a job to the trace profile
    # (`controller.jobs.profiles.calibrated_hands_to_trace`). Empty for every hand reading.
    unpriced_mixers: tuple[str, ...] = ()
    # PEFT adapts the expert stacks and the router of a shape read generically under
    # all-linear (its transformers-5 conversion of MoE targets, `ExpertStack.adapted`), as
    # `Family.peft_moe_pattern` says of the hand-read families whose stacks it adapts.
    peft_adapts_stacks: bool = False
    # (field path, message) for each value the estimate read that the config does not state
    # (`defaults_read`): callers warn with them, at their own field paths.
    config_warnings: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)

    @property
    def has_vision_tower(self) -> bool:
        """Whether the model has a vision tower: one read generically (`frozen_linears`,
        `frozen_params`), or one a hand-read multimodal config states (`vision_config`)
        beside the text model the hand reading reads."""
        if self.frozen_linears or self.frozen_params:
            return True
        return isinstance(self.source, Mapping) and isinstance(
            self.source.get("vision_config"), Mapping
        )

    @cached_property
    def layer_counts(self) -> tuple[tuple[Layer, int], ...]:
        """Each distinct layer object with how often it repeats, in first-seen order.

        `parse_config` shares one object among identical layers, so whatever walks the
        layers can price each kind once and multiply. Grouping is by identity, not equality:
        hashing a layer by value costs more than pricing it, and equal layers held apart are
        merely priced apart, with the same exact sum.
        """
        return count_layers(self.layers)

    @cached_property
    def total_params(self) -> int:
        return (
            sum(layer.params * count for layer, count in self.layer_counts)
            + sum(lin.params for lin in self.outer_linears)
            + sum(lin.params for lin in self.frozen_linears)
            + self.frozen_params
            + self.embedding_params
            + self.lm_head_params
            + self.final_norm_params
        )

    @cached_property
    def buffer_bytes(self) -> int:
        """The layers' fp32 buffers (`Layer.fp32_buffers`): on the GPU beside the weights,
        outside `total_params`."""
        return 4 * sum(sum(layer.fp32_buffers) * count for layer, count in self.layer_counts)

    @property
    def hidden_size(self) -> int:
        return self.dims.hidden_size

    @property
    def num_layers(self) -> int:
        return self.dims.num_layers

    @property
    def vocab_size(self) -> int:
        return self.dims.vocab_size

    @cached_property
    def module_names(self) -> frozenset[str]:
        inner = {lin.name for layer, _ in self.layer_counts for lin in layer.linears}
        outer = {lin.name for lin in (*self.outer_linears, *self.frozen_linears)}
        return frozenset(inner | outer)

    def lora_params_per_rank(self, targets: tuple[str, ...]) -> int:
        """Adapter parameters at rank 1 on the named modules (linear in the rank).

        `targets` holds canonical module names; `all-linear` selects every linear module
        of every block, as PEFT does (the LM head excluded).
        """
        cached = _LORA_PER_RANK.get(self, targets)
        if cached is not None:
            return cached
        wanted = set(targets)
        every = "all-linear" in wanted
        # An expert stack is a parameter in transformers 5 (3-D; DBRX's 2-D), no nn.Linear:
        # PEFT adapts it only where it maps the family's names onto stacks
        # (`Family.peft_moe_pattern`). The same holds for a router that is a parameter; a
        # router that is an nn.Linear (`Family.router_linear`) is adapted as any linear.
        fam = family_traits(self.model_type)
        stacks = bool(fam.peft_moe_pattern) or self.peft_adapts_stacks
        router = stacks or fam.router_linear
        # PEFT's conversion for a generic shape adapts a fused gate_up stack at twice the
        # rank (gate's and up's, as storage's `_expert_stacks` prices them)
        fused = 2 if self.peft_adapts_stacks else 1
        total = sum(
            lin.lora_params(1) * count * (fused if lin.expert and lin.name == "gate_up_proj" else 1)
            for layer, count in self.layer_counts
            for lin in layer.linears
            if (every or lin.name in wanted)
            and (stacks or not lin.expert)
            and (router or lin.name != "router")
        )
        total += sum(
            lin.lora_params(1) for lin in self.outer_linears if every or lin.name in wanted
        )
        total += sum(lin.lora_params(1) for lin in self.frozen_linears if lin.name in wanted)
        return _LORA_PER_RANK.put(self, total, targets)


def count_layers(layers: tuple[Layer, ...]) -> tuple[tuple[Layer, int], ...]:
    """`ModelShape.layer_counts` of `layers`: each distinct object with how often it repeats,
    in first-seen order (for a reading that keeps the counts with the layers it shares)."""
    ids = list(map(id, layers))
    first = dict(zip(ids, layers, strict=True))
    return tuple((first[key], count) for key, count in Counter(ids).items())


_V = TypeVar("_V")


class Memo(Generic[_V]):
    """One kind of value derived from a shape and kept in the shape's `memo`, typed: `get`
    returns what `put` kept, as the kind's type, so no caller casts.

    The modules that derive values from a shape declare their kinds (storage's static bytes,
    the unsloth view, ...), so the shape, below them, need not know their types. A value is
    kept under the kind's name, or a tuple of the name and the key's parts; the memo is the
    shape's own (a copy by `dataclasses.replace` shares it, as the copy's values are the
    same but for what the copy changes: pass `memo={}` with those).
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def get(self, shape: ModelShape, *key: Hashable) -> _V | None:
        """The value kept for `key`, None before one is."""
        return cast("_V | None", shape.memo.get((self.name, *key) if key else self.name))

    def put(self, shape: ModelShape, value: _V, *key: Hashable) -> _V:
        """Keep `value` for `key`, and return it."""
        shape.memo[(self.name, *key) if key else self.name] = value
        return value


#: `ModelShape.lora_params_per_rank` by target set.
_LORA_PER_RANK: Memo[int] = Memo("lora")


#: The mixers of a hybrid stack: Mamba-2 (selective state space), attention alone, an MLP
#: alone (Nemotron-H), or all three in one layer (Falcon-H1: attention and Mamba-2 side by
#: side on the same normed input, then a gated MLP), or Jamba's blocks: attention or Mamba
#: (1), each followed by an MLP or MoE as the standard block is.
MIXERS = (
    "mamba2",
    "attention",
    "mlp",
    "parallel",
    "attention_mlp",
    "mamba1_mlp",
    "deltanet_mlp",  # Qwen3-Next: Gated DeltaNet (linear attention), then its MoE or MLP
    "moe",  # Nemotron 3: an MoE alone (ReLU² experts of up and down, a shared expert)
)


#: The roots a text model's modules sit under, by loader and class (a causal LM, a
#: multimodal model's language model in transformers 4 and 5, a PEFT-wrapped model): a skip
#: entry written from any of them names the same module.
TEXT_ROOTS = (
    "model.",
    "model.model.",
    "language_model.",
    "language_model.model.",
    "model.language_model.",
    "model.language_model.model.",
    "",
)
_BOUNDARY = r"(?:(?<=\.)|(?=\.|$))"


@lru_cache(maxsize=1024)
def _skip_pattern(entry: str) -> re.Pattern[str] | None:
    try:
        return re.compile(rf"(?:{entry}){_BOUNDARY}")
    except re.error:
        return None  # not a regular expression: only the suffix rule applies


def skip_module_matches(entry: str, name: str) -> bool:
    """Whether `llm_int8_skip_modules` entry `entry` keeps module `name` out of 4-bit, by
    the rule of transformers' bitsandbytes integration (`should_convert_module`): the entry
    matches from the start of the name up to a module boundary, as a regular expression
    (`model.layers.1` is layer 1 and everything in it, not layer 11), or is a suffix of the
    name (`q_proj` is that module in every layer, `mlp.shared_expert` every shared expert)."""
    if name.endswith(entry):
        return True
    pattern = _skip_pattern(entry)
    return pattern is not None and pattern.match(name) is not None


def skip_module_matches_text(entry: str, name: str) -> bool:
    """`skip_module_matches` for a text-model module named from its decoder stack
    (`layers.3.mlp.experts`), under whichever of `TEXT_ROOTS` the entry was written for."""
    return any(skip_module_matches(entry, root + name) for root in TEXT_ROOTS)


def is_kv_shared_layer(dims: ArchDims, index: int) -> bool:
    """The last `num_kv_shared_layers` layers reuse an earlier layer's k/v (Gemma 3n/4)."""
    first_shared = dims.num_layers - dims.num_kv_shared_layers
    return dims.num_kv_shared_layers > 0 and index >= first_shared > 0


def layer_attention_dims(dims: ArchDims, index: int) -> tuple[int, int, bool, bool]:
    """(q width, k/v width, has k_proj, has v_proj) of one layer, from the per-layer fields."""
    attention_type = dims.layer_types[index] if dims.layer_types else "full_attention"
    sliding = attention_type == "sliding_attention"
    base_head = dims.head_dim or dims.hidden_size // dims.num_heads
    head_dim = dims.global_head_dim if (not sliding and dims.global_head_dim) else base_head
    k_eq_v = dims.attention_k_eq_v and not sliding
    kv_heads = dims.num_global_kv_heads if (k_eq_v and dims.num_global_kv_heads) else None
    kv_heads = kv_heads or dims.num_kv_heads
    has_k = not is_kv_shared_layer(dims, index)
    return dims.num_heads * head_dim, kv_heads * head_dim, has_k, has_k and not k_eq_v


def layer_mlp_size(dims: ArchDims, index: int) -> int:
    """Dense MLP width of one layer: doubled on kv-shared layers with `use_double_wide_mlp`."""
    width = dims.dense_intermediate_size or dims.intermediate_size
    if dims.use_double_wide_mlp and is_kv_shared_layer(dims, index):
        return width * 2
    return width
