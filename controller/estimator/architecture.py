"""Model architecture from a Hugging Face `config.json`: every tensor the model owns, by layer.

The estimator needs two views of a model. The exact one (`Layer.linears` and `other_params`)
counts every parameter the real checkpoint holds, so `total_params` equals the count a model
card publishes; it feeds the `analytic` profile and LoRA counts. The config-level one
(`ArchDims`) keeps the raw dimensions the `unsloth` profile's calibrated formula is written in.

Families differ in ways a generic reader would get wrong: Qwen2 has q/k/v biases, Gemma has
four norms per layer, Phi-3 fuses q/k/v and gate/up, Mixtral names its experts w1/w2/w3,
DeepSeek compresses attention (MLA), GPT-OSS stores biased experts and attention sinks,
Nemotron-H runs one mixer per layer (Mamba-2, attention, an MLP or, in Nemotron 3, an MoE:
`MIXERS`).
`_FAMILIES` records those differences as data. A `model_type` outside it is refused with the
field (`SUPPORTED_MODEL_TYPES`), never read as Llama-style: GPT-NeoX, Phi-2, Falcon, OPT and
StarCoder2 lay out their blocks otherwise, and read so were counted 30-60 % over. A config
naming no `model_type` is read as Llama's (`_family_type`).
"""

from __future__ import annotations

import builtins
import json
import marshal
import re
from collections import Counter
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from functools import cache, cached_property, lru_cache
from importlib import resources
from typing import Any, NamedTuple

from controller.estimator.context import rope_context
from controller.estimator.errors import SpecError, SpecErrors, shown
from controller.estimator.frozen import assemble

# PEFT's names of the seven projections of a Llama-style block, the `all-linear` default.
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
# Other names users write for the same modules, mapped to the canonical names above.
MODULE_ALIASES = {
    "w1": "gate_proj",
    "w3": "up_proj",
    "w2": "down_proj",
    "qkv_proj": "qkv_proj",
    "gate_up_proj": "gate_up_proj",
}


@dataclass(frozen=True, slots=True)
class Linear:
    """One weight matrix (or `copies` identical ones, the experts of an MoE layer)."""

    name: str
    in_features: int
    out_features: int
    bias: bool = False
    copies: int = 1
    expert: bool = False

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


#: How the config builders make linears: the same few recur in every layer of every parse (a
#: raw config is parsed on each estimate), and building a frozen dataclass costs several
#: times a lookup. Linears are immutable values, so sharing one between models is safe;
#: `typed` keeps a bool apart from the int it equals, so each is built as it would be alone.
_linear = lru_cache(maxsize=4096, typed=True)(Linear)


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
    # views): estimates run thousands of times a second on the same few shapes.
    memo: dict[object, object] = field(default_factory=dict, compare=False, repr=False)
    # Linear modules outside the decoder layers, the LM head aside (Gemma 3n's AltUp
    # projections and per-layer model projection): PEFT's all-linear adapts them, and
    # bitsandbytes quantises them, as it does the layers' linears.
    outer_linears: tuple[Linear, ...] = ()
    # (field path, message) for each value the estimate read that the config does not state
    # (`_defaults_read`): callers warn with them, at their own field paths.
    config_warnings: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)

    @cached_property
    def layer_counts(self) -> tuple[tuple[Layer, int], ...]:
        """Each distinct layer object with how often it repeats, in first-seen order.

        `parse_config` shares one object among identical layers, so whatever walks the
        layers can price each kind once and multiply. Grouping is by identity, not equality:
        hashing a layer by value costs more than pricing it, and equal layers held apart are
        merely priced apart, with the same exact sum.
        """
        ids = list(map(id, self.layers))
        first = dict(zip(ids, self.layers, strict=True))
        return tuple((first[key], count) for key, count in Counter(ids).items())

    @cached_property
    def total_params(self) -> int:
        return (
            sum(layer.params * count for layer, count in self.layer_counts)
            + sum(lin.params for lin in self.outer_linears)
            + self.embedding_params
            + self.lm_head_params
            + self.final_norm_params
        )

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
        return frozenset(inner | {lin.name for lin in self.outer_linears})

    def lora_params_per_rank(self, targets: tuple[str, ...]) -> int:
        """Adapter parameters at rank 1 on the named modules (linear in the rank).

        `targets` holds canonical module names; `all-linear` selects every linear module
        of every block, as PEFT does (the LM head excluded).
        """
        key = ("lora", targets)
        cached = self.memo.get(key)
        if cached is not None:
            return cached  # type: ignore[return-value]
        wanted = set(targets)
        every = "all-linear" in wanted
        # An expert stack is a parameter in transformers 5 (3-D; DBRX's 2-D), no nn.Linear:
        # PEFT adapts it only where it maps the family's names onto stacks
        # (`_Family.peft_moe_pattern`). The same holds for a router that is a parameter; a
        # router that is an nn.Linear (`_Family.router_linear`) is adapted as any linear.
        fam = family_traits(self.model_type)
        stacks = bool(fam.peft_moe_pattern)
        router = stacks or fam.router_linear
        total = sum(
            lin.lora_params(1) * count
            for layer, count in self.layer_counts
            for lin in layer.linears
            if (every or lin.name in wanted)
            and (stacks or not lin.expert)
            and (router or lin.name != "router")
        )
        total += sum(
            lin.lora_params(1) for lin in self.outer_linears if every or lin.name in wanted
        )
        self.memo[key] = total
        return total


@dataclass(frozen=True)
class _Family:
    """How one `model_type` lays out its block beyond the Llama default."""

    qkv_bias: bool | None = None  # None: read `attention_bias`
    o_bias: bool | None = None
    norms_per_layer: int = 2
    qk_norm: str | None = None  # "head": q/k norm over head_dim; "full": over the projection
    qk_norm_field: str = ""  # a config flag that turns "head" q/k norms on (GLM's use_qk_norm)
    bias_field: str = "attention_bias"  # the flag of q/k/v/o biases (ERNIE: use_bias)
    fused_qkv: bool = False
    fused_gate_up: bool = False
    layernorm_bias: bool = False
    attention_sinks: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    fused_expert_gate_up: bool = False
    router_correction_bias: bool = False
    # The router is an nn.Linear (DBRX's `router.layer`), which PEFT adapts by name or under
    # all-linear like any other linear; elsewhere it is a parameter PEFT adapts only through
    # `peft_moe_pattern` (or, Llama 4's, a linear PEFT breaks on: PEFT_REFUSED_MODULES).
    router_linear: bool = False
    # transformers 5 holds an MoE's gate and up experts as one stack; DBRX keeps w1 and v1
    # apart (2-D, E·i x h each).
    fused_expert_stacks: bool = True
    tie_default: bool = False
    # PEFT (0.21) maps "all-linear" onto this family's fused expert stacks and router, as
    # it targeted their nn.Linear modules under transformers 4, by one of two name patterns
    # ("mixtral": w1/w2/w3, "qwen2_moe": gate_proj/up_proj/down_proj); other MoE families
    # keep LoRA to their real nn.Linear modules.
    peft_moe_pattern: str = ""
    gated_q: bool = False  # q_proj also projects an output gate (twice q's width)


_FAMILIES: dict[str, _Family] = {
    "llama": _Family(),
    "mistral": _Family(),
    "mixtral": _Family(peft_moe_pattern="mixtral"),
    "qwen2": _Family(qkv_bias=True, o_bias=False),
    # Qwen2-MoE is the pattern's namesake, not an entry of transformers' conversion table
    # (which PEFT reads): its LoRA stays on the nn.Linear modules, shared expert included.
    "qwen2_moe": _Family(qkv_bias=True, o_bias=False),
    "qwen3": _Family(qk_norm="head"),
    "qwen3_moe": _Family(qk_norm="head", peft_moe_pattern="qwen2_moe"),
    "gemma": _Family(tie_default=True),
    "gemma2": _Family(norms_per_layer=4, tie_default=True),
    "gemma3_text": _Family(norms_per_layer=4, qk_norm="head", tie_default=True),
    "gemma3": _Family(norms_per_layer=4, qk_norm="head", tie_default=True),
    # Gemma 3n: Gemma 3's block plus LAuReL and AltUp in every layer, per-layer inputs;
    # kv-shared layers hold no k_proj, v_proj or k_norm.
    "gemma3n_text": _Family(norms_per_layer=4, qk_norm="head", tie_default=True),
    "gemma3n": _Family(norms_per_layer=4, qk_norm="head", tie_default=True),
    "phi3": _Family(fused_qkv=True, fused_gate_up=True),
    "olmo2": _Family(qk_norm="full"),
    # DBRX: fused Wqkv, experts w1/v1/w2 and the router under ffn_config, bias-free norms.
    "dbrx": _Family(fused_qkv=True, router_linear=True, fused_expert_stacks=False),
    # Llama 4: fused expert stacks, one shared expert per MoE layer, L2 q/k norms (no weights).
    "llama4_text": _Family(fused_expert_gate_up=True),
    "llama4": _Family(fused_expert_gate_up=True),
    # ERNIE 4.5: biases by use_bias, an e_score_correction_bias per MoE layer, tied embeddings.
    # PEFT maps "all-linear" onto its expert stacks and router by the "qwen2_moe" pattern, as
    # transformers' conversion table lists it (GLM's too).
    "ernie4_5_moe": _Family(
        bias_field="use_bias",
        router_correction_bias=True,
        tie_default=True,
        peft_moe_pattern="qwen2_moe",
    ),
    # GLM-4.5/4.6: q/k/v biases, no o bias, q/k norms by use_qk_norm, DeepSeek-style routing.
    "glm4_moe": _Family(
        o_bias=False,
        qk_norm_field="use_qk_norm",
        router_correction_bias=True,
        peft_moe_pattern="qwen2_moe",
    ),
    "deepseek_v3": _Family(router_correction_bias=True, peft_moe_pattern="qwen2_moe"),
    "deepseek_v2": _Family(peft_moe_pattern="qwen2_moe"),
    # Kimi K2: DeepSeek-V3's layout (its config names the DeepseekV3 classes) at another size.
    "kimi_k2": _Family(router_correction_bias=True, peft_moe_pattern="qwen2_moe"),
    "gpt_oss": _Family(
        attention_sinks=True, router_bias=True, expert_bias=True, fused_expert_gate_up=True
    ),
    # Nemotron-H: one mixer per layer (`MIXERS`) after one RMSNorm; attention without biases
    # (its q/k/v/o are built bias-free whatever attention_bias says), a ReLU² MLP of up/down;
    # Nemotron 3's MoE routes as DeepSeek-V3 does (an fp32 router with a correction bias).
    "nemotron_h": _Family(
        qkv_bias=False, o_bias=False, norms_per_layer=1, router_correction_bias=True
    ),
    # Falcon-H1: attention (biases by attention_bias) beside a Mamba-2 mixer, then a SwiGLU
    # MLP; input_layernorm and pre_ff_layernorm; tied only where the config says so.
    "falcon_h1": _Family(),
    # Jamba: bias-free attention every attn_layer_period layers, Mamba (1) in the others;
    # an MoE (fused expert stacks, a router parameter) every expert_layer_period layers.
    "jamba": _Family(qkv_bias=False, o_bias=False, fused_expert_gate_up=True),
    # Qwen3-Next: Gated DeltaNet layers and, every full_attention_interval layers, gated full
    # attention (q_proj doubled, q/k norms over the head); Qwen-MoE experts with a gated
    # shared expert.
    "qwen3_next": _Family(
        qk_norm="head", gated_q=True, fused_expert_gate_up=True, peft_moe_pattern="qwen2_moe"
    ),
}


#: The `model_type`s the parser reads, each by its own layout: any other is refused, never
#: read as a Llama-style block (GPT-NeoX, Phi-2, Falcon, OPT, StarCoder2 are not one).
SUPPORTED_MODEL_TYPES = tuple(sorted(_FAMILIES))


def family_traits(model_type: str) -> _Family:
    """What sets `model_type`'s layout apart: one of `SUPPORTED_MODEL_TYPES`, the only types
    `parse_config` builds a shape of."""
    return _FAMILIES[model_type]


_EXPERT_COUNT_FIELDS = (
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "moe_num_experts",
    "ffn_config.moe_num_experts",  # DBRX
)
_TOP_K_FIELDS = (
    "num_experts_per_tok",
    "num_experts_per_token",
    "experts_per_token",
    "top_k_experts",
    "moe_topk",
    "moe_k",  # ERNIE 4.5
    "ffn_config.moe_top_k",  # DBRX
)
_SHARED_COUNT_FIELDS = ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts")
# Fields about experts the parser reads somewhere (shape) besides the two lists above.
_MOE_SHAPE_FIELDS = frozenset(
    {
        "moe_use_aux_free",
        *_SHARED_COUNT_FIELDS,
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "moe_layer_freq",
        "moe_layers",
        "interleave_moe_layer_step",
        "moe_layer_start_index",
        "moe_layer_end_index",
        "moe_layer_interval",
        "enable_moe_block",
        "expert_layer_period",  # Jamba
        "expert_layer_offset",
    }
)
# Fields about experts that change no tensor shape: routing and loss hyperparameters, flags,
# capacity limits. Any other field naming experts or MoE with an integer or a list is a
# layout the parser does not know, and refused rather than estimated as a dense model.
_MOE_IGNORED_FIELDS = frozenset(
    {
        "moe_capacity",  # ERNIE: tokens per expert at inference, not a shape
        "moe_jitter_eps",
        "moe_loss_weight",
        "moe_aux_loss_coeff",
        "moe_z_loss_coeff",
        "moe_normalize_expert_weights",
        "moe_router_topk_scaling_factor",
        "moe_shared_expert_overlap",
        "moe_group_topk",
        "moe_group_size",
        "num_expert_group",
        "topk_group",
        "n_group",
        "moe_norm_min",
        "expert_capacity",
        "ep_size",
    }
)
# Nested objects that hold a family's MoE fields (searched by the same rule).
_MOE_NESTED = ("ffn_config", "moe_config")
_KNOWN_EXPERT_FIELDS = frozenset({*_EXPERT_COUNT_FIELDS, *_TOP_K_FIELDS, *_MOE_SHAPE_FIELDS})
_EXPERT_FIELDS_TEXT = ", ".join(_EXPERT_COUNT_FIELDS)
# Fields that say some layers are not attention (Mamba / SSM, linear attention): the parser
# builds no such layer yet, so a config carrying one is refused, not estimated as all-attention.
_NON_ATTENTION_FIELDS = (
    "hybrid_override_pattern",  # Nemotron-H
    "attn_layer_period",  # Jamba
    "full_attention_interval",  # Qwen3-Next
    "linear_num_key_heads",
    "mamba_d_state",  # Falcon-H1
    "mamba_d_ssm",
    "ssm_state_size",
    "mamba_num_heads",
)
# Hybrid families whose stacks the parser builds layer type by layer type: their fields are
# read, not refused. Jamba, Qwen3-Next and Falcon-H1 are still refused by the fields above.
HYBRID_FAMILIES = frozenset({"nemotron_h", "falcon_h1", "jamba", "qwen3_next"})
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
# Nemotron-H's layer list, in each spelling its configs use: `hybrid_override_pattern` (one
# character a layer), or transformers 5's `layers_block_type` (alias `layer_types`), whose
# "linear_attention" is the Mamba-2 mixer; the remote code's older names too.
_NEMOTRON_PATTERN = {"M": "mamba2", "*": "attention", "-": "mlp", "E": "moe"}
_NEMOTRON_BLOCKS = {
    "mamba": "mamba2",
    "linear_attention": "mamba2",
    "attention": "attention",
    "full_attention": "attention",
    "mlp": "mlp",
    "moe": "moe",
}
# Gemma 3n's text model types: LAuReL and AltUp are read for these only.
_GEMMA3N = ("gemma3n_text", "gemma3n")
# PEFT (0.21, `_check_lora_target_modules_mamba`) raises on LoRA over these modules of these
# model types, "all-linear" included (it selects out_proj), whatever the target list says.
PEFT_MAMBA_TYPES = frozenset({"falcon_h1", "mamba", "mamba2", "falcon_mamba", "nemotron_h"})
PEFT_MAMBA_REFUSED = ("out_proj", "conv1d")
# Llama 4's router is an nn.Linear whose forward returns a tuple (scores, logits): PEFT 0.21
# wraps it (by name, or under "all-linear"), and its LoRA layer fails on the tuple in the
# first forward, so such a job fails in training.
PEFT_LLAMA4_TYPES = frozenset({"llama4", "llama4_text"})
#: What LoRA may not target, by model type ("all-linear" selects these too, so it is refused
#: with them), and why, for the one-line refusal.
PEFT_REFUSED_MODULES: dict[str, tuple[tuple[str, ...], str]] = {
    **dict.fromkeys(PEFT_MAMBA_TYPES, (PEFT_MAMBA_REFUSED, "PEFT refuses LoRA on {modules} "
                                       "of {model_type}'s Mamba mixers")),
    **dict.fromkeys(PEFT_LLAMA4_TYPES, (("router",), "PEFT's LoRA layer fails on the tuple "
                                        "that {model_type}'s {modules} (an nn.Linear) returns")),
}  # fmt: skip
#: The names transformers gives a family's linears where they are not the canonical ones
#: `module_names` holds (DBRX: its fused attention `Wqkv` and `out_proj`, and its router
#: module's linear, `layer`): PEFT matches those, so a job's targets may say them, and the
#: trace hands them to PEFT.
PEFT_NAMES: dict[str, dict[str, str]] = {
    "dbrx": {"qkv_proj": "Wqkv", "o_proj": "out_proj", "router": "layer"},
}


def peft_name(model_type: str, module: str) -> str:
    """What PEFT calls the canonical `module` of `model_type`'s models."""
    return PEFT_NAMES.get(model_type, {}).get(module, module)


def peft_adaptable_modules(shape: ModelShape) -> tuple[str, ...]:
    """The names LoRA can target on this model, as PEFT matches them: modules PEFT neither
    refuses nor fails on, that select some linear (not only expert stacks it does not
    adapt)."""
    refused = set(PEFT_REFUSED_MODULES.get(shape.model_type, ((), ""))[0])
    return tuple(
        sorted(
            peft_name(shape.model_type, name)
            for name in shape.module_names - refused
            if shape.lora_params_per_rank((name,)) > 0
        )
    )
# Layer types the parser builds (`layer_types`); any other is refused.
KNOWN_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")

# Upper bounds on config fields, each far above any released model (126 layers, 384 experts,
# widths of tens of thousands, vocabularies of 262,144): parsing and pricing walk the layers,
# and products of widths must stay within exact integers and finite floats.
MAX_LAYERS = 4096
MAX_EXPERTS = 4096
MAX_DIMENSION = 2**24


class _Reader:
    """Typed access to config fields with one-line errors naming the field."""

    def __init__(self, config: Mapping[str, Any], prefix: str) -> None:
        self.config = config
        self.prefix = prefix

    def path(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def get(self, name: str) -> Any:
        """The field's value; a dotted name reads a nested object (DBRX's `ffn_config.x`)."""
        if "." not in name:
            return self.config.get(name)
        value: Any = self.config
        for part in name.split("."):
            if not isinstance(value, Mapping):
                return None
            value = value.get(part)
        return value

    def has(self, name: str) -> bool:
        return self.get(name) is not None

    def int(
        self,
        *names: str,
        default: int | None = None,
        minimum: int = 1,
        maximum: int | None = MAX_DIMENSION,
    ) -> int | None:
        get = self.get
        for name in names:
            value = get(name)
            if value is None:
                continue
            # The common case in one test (`type` is exact, so a bool never passes here).
            if type(value) is int and minimum <= value and (maximum is None or value <= maximum):
                return value
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecError(self.path(name), f"must be an integer, got {shown(value)}")
            if value < minimum:
                raise SpecError(
                    self.path(name), f"must be greater than or equal to {minimum}, got {value}"
                )
            if maximum is not None and value > maximum:
                raise SpecError(
                    self.path(name), f"must be less than or equal to {maximum}, got {value}"
                )
            return value
        return default

    def dim(self, name: str) -> builtins.int | None:
        """`int(name)` with its defaults, by a faster path for a width in range: most of a
        config's fields are read this way, on every raw-config estimate."""
        value = self.config.get(name)
        if value is None or (type(value) is builtins.int and 1 <= value <= MAX_DIMENSION):
            return value
        return self.int(name)

    # `builtins.int`: inside the class, `int` is the method above.
    def required_int(self, *names: str, maximum: builtins.int = MAX_DIMENSION) -> builtins.int:
        value = self.int(*names, maximum=maximum)
        if value is None:
            raise SpecError(self.path(names[0]), "is required in a model config")
        return value

    def bool(self, name: str, default: bool) -> bool:
        value = self.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise SpecError(self.path(name), f"must be true or false, got {shown(value)}")
        return value


#: Fields read under several names: a class default under one name must not outrank the
#: config's value under another (Qwen3-MoE's class says num_experts; a config saying
#: num_local_experts means that).
_ALIASES = (
    ("hidden_size", "n_embd", "d_model"),
    ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    ("num_attention_heads", "n_head", "n_heads"),
    ("num_key_value_heads", "num_kv_heads"),
    ("intermediate_size", "ffn_hidden_size", "n_inner"),
    _EXPERT_COUNT_FIELDS,
    _TOP_K_FIELDS,
    _SHARED_COUNT_FIELDS,
)


@cache
def _model_defaults() -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """By model_type, the constructor defaults of its transformers config class; and by
    wrapper model_type, the class transformers builds a `text_config` naming no model_type
    with (Mistral 3's: a MistralConfig), whose defaults then apply."""
    text = resources.files("controller.estimator").joinpath("model_defaults.json").read_text()
    data = json.loads(text)
    classes = {k: v for k, v in data.items() if not k.startswith("_")}
    return classes, data["_text_config_types"]


class _Defaulted(NamedTuple):
    """The fields of a config that its class's defaults filled in, that class, and whether
    the fields are a nested `text_config`'s."""

    model_type: str
    fields: Set[str]
    nested: bool = False


def _text_config(
    config: Mapping[str, Any], prefix: str
) -> tuple[Mapping[str, Any], str, _Defaulted]:
    """The language model's fields, with the config class's defaults filled in, its path, and
    which fields a default filled in.

    Multimodal configs nest the language model under `text_config` (Gemma 3, Llava...);
    fields the nested config omits fall back to the outer one (e.g. tie_word_embeddings),
    then to the defaults of its `model_type`'s config class.
    """
    text = config.get("text_config")
    if text is None:
        merged, path = dict(config), prefix
    elif not isinstance(text, Mapping):
        raise SpecError(f"{prefix}.text_config" if prefix else "text_config", "must be an object")
    else:
        merged = {k: v for k, v in config.items() if k != "text_config"} | dict(text)
        path = f"{prefix}.text_config" if prefix else "text_config"
    classes, text_types = _model_defaults()
    model_type = str(merged.get("model_type", ""))
    if text is not None and "model_type" not in text:
        model_type = text_types.get(model_type, model_type)
    defaults = classes.get(model_type, {})
    for names in _ALIASES if defaults else ():
        if any(name in merged for name in names):  # the config's own name wins, whichever
            defaults = {k: v for k, v in defaults.items() if k not in names}
    filled = defaults.keys() - merged.keys()
    return defaults | merged, path, _Defaulted(model_type, filled, text is not None)


#: The dimensions every estimate is built on, each under the names configs write it: a config
#: must state them. transformers' `save_pretrained` always writes them at a config's top
#: level (it leaves out only what equals the base config class's defaults, which hold none
#: of them), so only a hand-written config lacks one, and its class's default would stand in
#: another model's size (`{"model_type": "llama"}` read as Llama-2-7B). A nested
#: `text_config` is the exception: transformers 4 wrote it without what equals its class's
#: defaults (llava-1.5-7b's holds none of these, Gemma 3 4B's no heads nor vocabulary), so
#: there the class's defaults are read, as transformers loads them, and said
#: (`_defaults_read`).
REQUIRED_DIMENSIONS: tuple[tuple[str, ...], ...] = (
    ("hidden_size", "n_embd", "d_model"),
    ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    ("num_attention_heads", "n_head", "n_heads"),
    ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_config.ffn_hidden_size"),
    ("vocab_size",),
)
#: Class defaults read without a warning: transformers' own save leaves tie_word_embeddings
#: out wherever it equals the class's default, so real configs omit it; the context length
#: decides only a warning of its own; sliding_window shapes only Gemma 3n (no class here);
#: ERNIE's moe_layer_end_index -1 is no size but "to the last layer" (its published config
#: leaves it out).
_QUIET_DEFAULTS = frozenset(
    {"tie_word_embeddings", "max_position_embeddings", "sliding_window", "moe_layer_end_index"}
)
_KV_HEAD_FIELDS = ("num_key_value_heads", "num_kv_heads", "attn_config.kv_n_heads")


def _missing_dimensions(r: _Reader, defaulted: _Defaulted, model_type: str) -> list[SpecError]:
    """One error for each of `REQUIRED_DIMENSIONS` the config does not state (in a nested
    text_config, its class's default stands in), naming the default it was not read as; and
    where one is missing, the errors of those it states, so that one answer lists them all.
    None missing, nothing: `_read_dims` reads them, and says what is wrong in its order."""
    errors, missing = [], False
    for names in REQUIRED_DIMENSIONS:
        if model_type == "nemotron_h" and names[0] == "num_hidden_layers":
            continue  # its layer pattern counts the layers (`_nemotron_mixers`)
        stated = [n for n in names if r.get(n) is not None and n not in defaulted.fields]
        if stated:
            # intermediate_size may list [text, vision] widths: `_read_dims` checks those
            if not isinstance(r.get(stated[0]), list):
                bound = MAX_LAYERS if names[0] == "num_hidden_layers" else MAX_DIMENSION
                try:
                    r.int(stated[0], maximum=bound)
                except SpecError as error:
                    errors.append(error)
            continue
        if defaulted.nested and names[0] in defaulted.fields:
            continue
        missing = True
        message = "is required in a model config: the estimate depends on it"
        if names[0] in defaulted.fields:
            default = json.dumps(r.get(names[0]))
            message += f" (transformers' {defaulted.model_type} default, {default}, may be "
            message += "another model's)"
        errors.append(SpecError(r.path(names[0]), message))
    return errors if missing else []


def _defaults_read(
    r: _Reader, defaulted: _Defaulted, dims: ArchDims
) -> tuple[tuple[str, str], ...]:
    """What the estimate read that the config does not state, where it changes the estimate:
    its class's defaults (in one line), and key/value heads taken to be the attention heads
    (so no grouped-query attention), as transformers reads a config without them."""
    notes = []
    order = _model_defaults()[0].get(defaulted.model_type, {})
    used = [name for name in order if name in defaulted.fields and name not in _QUIET_DEFAULTS]
    if used:
        values = ", ".join(f"{name}={json.dumps(r.get(name))}" for name in used)
        notes.append(
            (
                r.prefix or "config",
                f"estimated with the defaults of transformers' {defaulted.model_type} config "
                f"class for what the config leaves out ({values}), as transformers loads it; "
                "set them in the config if the model's differ",
            )
        )
    stated_kv = any(r.get(name) is not None for name in _KV_HEAD_FIELDS)
    if not stated_kv and dims.kv_lora_rank is None and dims.num_heads > 1:
        notes.append(
            (
                r.path("num_key_value_heads"),
                f"not in the config, so estimated as num_attention_heads ({dims.num_heads}): "
                "keys and values for every head, as transformers reads it; set it if the "
                "model shares them among heads (grouped-query attention)",
            )
        )
    return tuple(notes)


def _quantization(
    config: Mapping[str, Any], text: Mapping[str, Any], prefix: str
) -> Quantization | None:
    qc = config.get("quantization_config") or text.get("quantization_config")
    if qc is None:
        return None
    path = f"{prefix}.quantization_config" if prefix else "quantization_config"
    if not isinstance(qc, Mapping):
        raise SpecError(path, "must be an object")
    skip = qc.get("llm_int8_skip_modules") or ()
    if not isinstance(skip, list | tuple) or not all(isinstance(s, str) for s in skip):
        raise SpecError(f"{path}.llm_int8_skip_modules", "must be a list of module names")
    method = str(qc.get("quant_method", "bitsandbytes"))
    flags = _Reader(qc, path)  # strict: bool("no") would read as a 4-bit checkpoint
    return Quantization(
        method=method,
        load_in_4bit=flags.bool("load_in_4bit", False),
        double_quant=flags.bool("bnb_4bit_use_double_quant", False),
        skip_modules=tuple(skip),
    )


def _layer_list(r: _Reader, name: str, num_layers: int) -> list[int]:
    """A list of layer indices (`moe_layers`, `mlp_only_layers`), each in [0, num_layers)."""
    raw = r.get(name) or []
    if not isinstance(raw, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in raw
    ):
        raise SpecError(r.path(name), "must be a list of layer indices")
    if any(i < 0 or i >= num_layers for i in raw):
        raise SpecError(r.path(name), f"indices must be in [0, {num_layers})")
    return raw


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


def _dense_layer_indices(r: _Reader, num_layers: int, num_experts: int) -> tuple[int, ...]:
    """Which layers of an MoE model keep a dense MLP. Position matters (DeepSeek, Qwen-MoE,
    Llama 4's interleaving, ERNIE's start/interval/end)."""
    if num_experts <= 1:
        return ()
    if r.config.get("model_type") == "jamba":
        period, offset = _period(r, "expert_layer_period", 2, "expert_layer_offset", 1)
        return tuple(i for i in range(num_layers) if i % period != offset)
    mlp_types = r.config.get("mlp_layer_types")
    if mlp_types:
        # Entry i is layer i's MLP; a shorter list leaves the layers after it MoE and a longer
        # one's extra entries name no layer, as seed 1's reference reads them.
        if not isinstance(mlp_types, list) or not all(isinstance(t, str) for t in mlp_types):
            raise SpecError(r.path("mlp_layer_types"), "must be a list of strings")
        return tuple(i for i, t in enumerate(mlp_types[:num_layers]) if t.lower() == "dense")
    if r.has("moe_layers"):  # Llama 4: the MoE layers by index
        moe = set(_layer_list(r, "moe_layers", num_layers))
        return tuple(i for i in range(num_layers) if i not in moe)
    if r.has("interleave_moe_layer_step"):  # Llama 4 without moe_layers, as its config class
        interleave = r.int("interleave_moe_layer_step") or 1
        return tuple(i for i in range(num_layers) if (i + 1) % interleave != 0)
    if r.has("moe_layer_start_index") or r.has("moe_layer_interval"):
        # ERNIE 4.5: MoE where (i + 1) % interval == 0 within [start, end]; end -1: the last.
        start = r.int("moe_layer_start_index", default=0, minimum=0, maximum=MAX_LAYERS) or 0
        interval = r.int("moe_layer_interval", default=1) or 1
        end = r.int("moe_layer_end_index", default=-1, minimum=-1, maximum=None)
        last = num_layers - 1 if end is None or end == -1 else min(end, num_layers - 1)
        return tuple(
            i for i in range(num_layers) if not (start <= i <= last and (i + 1) % interval == 0)
        )
    first_k = r.int("first_k_dense_replace", minimum=0)
    if first_k is not None:
        if first_k > num_layers:
            raise SpecError(
                r.path("first_k_dense_replace"),
                f"must not exceed num_hidden_layers ({num_layers}), got {first_k}",
            )
        freq = r.int("moe_layer_freq", default=1) or 1
        if freq == 1:  # what the expression below gives, without a loop over the layers
            return tuple(range(first_k))
        return tuple(i for i in range(num_layers) if i < first_k or (i - first_k) % freq != 0)
    step = r.int("decoder_sparse_step", minimum=0)
    only = _layer_list(r, "mlp_only_layers", num_layers)
    if step:
        dense = set(only)
        return tuple(i for i in range(num_layers) if i in dense or (i + 1) % step != 0)
    return tuple(sorted(set(only)))


def _check_expert_fields(r: _Reader) -> None:
    """Refuse an MoE layout the parser would misread as something else: any field naming
    experts or MoE that it neither reads nor knows to leave shapes alone, holding a count
    (an integer above 1) or a list or object."""
    scopes: list[tuple[str, Mapping[str, Any]]] = [("", r.config)]
    scopes += [
        (f"{name}.", r.config[name])
        for name in _MOE_NESTED
        if isinstance(r.config.get(name), Mapping)
    ]
    for prefix, fields in scopes:
        for key, value in fields.items():
            low = key.lower()
            if "expert" not in low and "moe" not in low:
                continue
            name = prefix + key
            if name in _KNOWN_EXPERT_FIELDS or key in _MOE_IGNORED_FIELDS:
                continue
            if isinstance(value, bool) or value is None or isinstance(value, float | str):
                continue
            if isinstance(value, int) and value <= 1:
                continue
            raise SpecError(
                r.path(name),
                "is an expert field vramgate does not understand, so the model cannot be "
                f"estimated as what it is; expert counts are read from {_EXPERT_FIELDS_TEXT}",
            )


def _scalar(r: _Reader, names: tuple[str, ...], pick: str, **limits: Any) -> int | None:
    """`r.int(*names)`, also accepting a list: ERNIE-VL states experts and their width as
    [text, vision] pairs (the text model's is the first: `pick="first"`), Hunyuan its top-k
    per layer (the largest bounds the activations: `pick="max"`)."""
    for name in names:
        value = r.get(name)
        if isinstance(value, list):
            if not value or any(
                isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_DIMENSION
                for v in value
            ):
                raise SpecError(r.path(name), f"must be integers from 0 to {MAX_DIMENSION}")
            chosen = value[0] if pick == "first" else max(value)
            maximum = limits.get("maximum", MAX_DIMENSION)
            if maximum is not None and chosen > maximum:
                raise SpecError(
                    r.path(name), f"must be less than or equal to {maximum}, got {chosen}"
                )
            return int(chosen)
        if value is not None:
            return r.int(name, **limits)
    return limits.get("default")


def _nemotron_mixers(r: _Reader) -> tuple[str, ...]:
    """Nemotron-H's mixer per layer, from whichever field states them (transformers 5's
    `layers_block_type` wins over the older `hybrid_override_pattern`, as its config class
    reads them), MoE layers ("E", "moe": Nemotron 3) included."""
    for name in ("layers_block_type", "layer_types"):
        blocks = r.get(name)
        if blocks is None:
            continue
        if (
            not isinstance(blocks, list)
            or not blocks
            or not all(isinstance(b, str) for b in blocks)
        ):
            raise SpecError(r.path(name), "must be a non-empty list of layer types")
        path, items, table = r.path(name), blocks, _NEMOTRON_BLOCKS
        break
    else:
        pattern = r.get("hybrid_override_pattern")
        path = r.path("hybrid_override_pattern")
        if pattern is None:
            raise SpecError(path, "is required in a nemotron_h config (or layers_block_type)")
        if not isinstance(pattern, str) or not pattern:
            raise SpecError(
                path, f"must be a non-empty string of M, E, * and -, got {shown(pattern)}"
            )
        items, table = list(pattern), _NEMOTRON_PATTERN
    if len(items) > MAX_LAYERS:
        raise SpecError(path, f"must list at most {MAX_LAYERS} layers, got {len(items)}")
    mixers = []
    for i, item in enumerate(items):
        mixer = table.get(item)
        if mixer is None:
            known = ", ".join(repr(k) for k in table)
            raise SpecError(
                f"{path}[{i}]", f"{shown(item)} is an unknown layer type; allowed: {known}"
            )
        mixers.append(mixer)
    stated = r.int("num_hidden_layers", maximum=MAX_LAYERS)
    if stated is not None and stated != len(mixers):
        raise SpecError(path, f"must give one layer type per layer ({stated}), got {len(mixers)}")
    return tuple(mixers)


def _ssm_dims(r: _Reader) -> SsmDims:
    """Nemotron-H's Mamba-2 widths, with its config class's defaults; the `mamba_*` spellings
    win where both are given, as the class's `__post_init__` reads them."""
    heads = r.int("mamba_num_heads", default=128) or 128
    groups = r.int("mamba_n_groups", "n_groups", default=8) or 8
    if heads % groups:
        raise SpecError(r.path("n_groups"), f"must divide mamba_num_heads ({heads}), got {groups}")
    conv_bias = r.get("mamba_conv_bias")
    return SsmDims(
        num_heads=heads,
        head_dim=r.int("mamba_head_dim", default=64) or 64,
        n_groups=groups,
        state_size=r.int("ssm_state_size", default=128) or 128,
        conv_kernel=r.int("mamba_d_conv", "conv_kernel", default=4) or 4,
        chunk_size=r.int("mamba_chunk_size", "chunk_size", default=128) or 128,
        conv_bias=r.bool("mamba_conv_bias" if conv_bias is not None else "use_conv_bias", True),
        proj_bias=r.bool("use_bias", False),
        out_bias=r.bool("use_bias", False),
    )


def _falcon_ssm_dims(r: _Reader, hidden: int) -> SsmDims:
    """Falcon-H1's Mamba-2 widths, with its config class's defaults: the SSM width is
    `mamba_d_ssm` (1024 when absent; null: mamba_expand x hidden), its head dim
    `mamba_d_head` ("auto": the width over the heads), and the two must agree."""
    heads = r.int("mamba_n_heads", default=128) or 128
    if "mamba_d_ssm" in r.config and r.config["mamba_d_ssm"] is None:
        inner = (r.int("mamba_expand", default=2) or 2) * hidden
    else:
        inner = r.int("mamba_d_ssm", default=1024) or 1024
    raw_head = r.get("mamba_d_head")
    if raw_head is None or raw_head == "auto":
        if inner % heads:
            raise SpecError(
                r.path("mamba_n_heads"), f"must divide the SSM width ({inner}), got {heads}"
            )
        head_dim = inner // heads
    else:
        head_dim = r.int("mamba_d_head") or 1
        if head_dim * heads != inner:
            raise SpecError(
                r.path("mamba_d_head"),
                f"times mamba_n_heads ({heads}) must be the SSM width ({inner}), got {head_dim}",
            )
    groups = r.int("mamba_n_groups", default=1) or 1
    if heads % groups:
        raise SpecError(
            r.path("mamba_n_groups"), f"must divide mamba_n_heads ({heads}), got {groups}"
        )
    return SsmDims(
        num_heads=heads,
        head_dim=head_dim,
        n_groups=groups,
        state_size=r.int("mamba_d_state", default=256) or 256,
        conv_kernel=r.int("mamba_d_conv", default=4) or 4,
        chunk_size=r.int("mamba_chunk_size", default=256) or 256,
        conv_bias=r.bool("mamba_conv_bias", True),
        proj_bias=r.bool("mamba_proj_bias", False),
        out_bias=r.bool("projectors_bias", False),
        gated_norm=r.bool("mamba_rms_norm", False),
    )


def _period(
    r: _Reader, period_name: str, period_default: int, offset_name: str, offset_default: int
) -> tuple[int, int]:
    """Jamba's (period, offset) of a layer kind: layer i is of that kind when i % period ==
    offset; the offset must be below the period, as its config class checks."""
    period = r.int(period_name, default=period_default) or period_default
    offset = r.int(offset_name, default=offset_default, minimum=0, maximum=MAX_LAYERS)
    offset = offset_default if offset is None else offset
    if offset >= period:
        raise SpecError(
            r.path(offset_name), f"must be less than {period_name} ({period}), got {offset}"
        )
    return period, offset


def _qwen3_next_mixers(r: _Reader, layers: int) -> tuple[str, ...]:
    """Qwen3-Next's layers: `layer_types` ("linear_attention" / "full_attention"), else full
    attention every `full_attention_interval` layers (4), as its config class builds them."""
    types = r.get("layer_types")
    if types is None:
        interval = r.int("full_attention_interval", default=4) or 4
        return tuple(
            "deltanet_mlp" if (i + 1) % interval else "attention_mlp" for i in range(layers)
        )
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise SpecError(r.path("layer_types"), "must be a list of strings")
    if len(types) != layers:
        raise SpecError(
            r.path("layer_types"), f"must list one type per layer ({layers}), got {len(types)}"
        )
    table = {"linear_attention": "deltanet_mlp", "full_attention": "attention_mlp"}
    for i, kind in enumerate(types):
        if kind not in table:
            raise SpecError(
                f"{r.path('layer_types')}[{i}]",
                f"unknown layer type {shown(kind)}; allowed: {', '.join(table)}",
            )
    return tuple(table[kind] for kind in types)


def _deltanet_dims(r: _Reader) -> DeltaNetDims:
    """Qwen3-Next's Gated DeltaNet widths, with its config class's defaults; the value heads
    are grouped over the key heads, so their count must divide."""
    k_heads = r.int("linear_num_key_heads", default=16) or 16
    v_heads = r.int("linear_num_value_heads", default=32) or 32
    if v_heads % k_heads:
        raise SpecError(
            r.path("linear_num_value_heads"),
            f"must be a multiple of linear_num_key_heads ({k_heads}), got {v_heads}",
        )
    return DeltaNetDims(
        num_k_heads=k_heads,
        num_v_heads=v_heads,
        head_k_dim=r.int("linear_key_head_dim", default=128) or 128,
        head_v_dim=r.int("linear_value_head_dim", default=128) or 128,
        conv_kernel=r.int("linear_conv_kernel_dim", default=4) or 4,
    )


def _mamba1_dims(r: _Reader, hidden: int) -> Mamba1Dims:
    """Jamba's Mamba widths with its config class's defaults (`mamba_dt_rank` "auto":
    ceil(hidden / 16))."""
    rank = r.get("mamba_dt_rank")
    dt_rank = -(-hidden // 16) if rank is None or rank == "auto" else r.int("mamba_dt_rank")
    return Mamba1Dims(
        inner=(r.int("mamba_expand", default=2) or 2) * hidden,
        state_size=r.int("mamba_d_state", default=16) or 16,
        conv_kernel=r.int("mamba_d_conv", default=4) or 4,
        dt_rank=dt_rank or 1,
        conv_bias=r.bool("mamba_conv_bias", True),
        proj_bias=r.bool("mamba_proj_bias", False),
    )


def _read_dims(r: _Reader, tie_default: bool, model_type: str = "") -> ArchDims:
    hidden = r.required_int("hidden_size", "n_embd", "d_model")
    hybrid = model_type in HYBRID_FAMILIES
    mixers = _nemotron_mixers(r) if model_type == "nemotron_h" else None
    layers = (
        len(mixers)
        if mixers is not None
        else r.required_int(
            "num_hidden_layers", "n_layer", "num_layers", "n_layers", maximum=MAX_LAYERS
        )
    )
    if model_type == "falcon_h1":
        mixers = ("parallel",) * layers  # every layer the same (`layers_block_type`: "hybrid")
    elif model_type == "jamba":
        period, offset = _period(r, "attn_layer_period", 8, "attn_layer_offset", 4)
        mixers = tuple(
            "attention_mlp" if i % period == offset else "mamba1_mlp" for i in range(layers)
        )
    elif model_type == "qwen3_next":
        mixers = _qwen3_next_mixers(r, layers)
    heads = r.required_int("num_attention_heads", "n_head", "n_heads")
    kv_heads = (
        r.int("num_key_value_heads", "num_kv_heads", "attn_config.kv_n_heads", default=heads)
        or heads
    )
    if heads % kv_heads:
        raise SpecError(
            r.path("num_key_value_heads"),
            f"must divide num_attention_heads ({heads}), got {kv_heads}",
        )
    # Absent, it is hidden_size // num_attention_heads (floored), as transformers' families
    # derive it (`getattr(config, "head_dim", hidden_size // num_attention_heads)`).
    head_dim = r.dim("head_dim")
    inter_raw = r.config.get("intermediate_size")
    if isinstance(inter_raw, list):
        if not inter_raw or any(
            isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= MAX_DIMENSION
            for x in inter_raw
        ):
            raise SpecError(
                r.path("intermediate_size"), f"must be integers from 1 to {MAX_DIMENSION}"
            )
        intermediate = inter_raw[0]
    else:
        intermediate = (
            r.int("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_config.ffn_hidden_size")
            or 4 * hidden
        )
    vocab = r.required_int("vocab_size")

    limits = {"minimum": 0, "maximum": MAX_EXPERTS}
    nemotron_moe = mixers is not None and "moe" in mixers
    if nemotron_moe:
        # Nemotron 3: its config class's names and defaults; the fields shape the MoE layers
        # only (dense Nemotron-H configs carry them too, as class defaults, and are read as
        # one expert below).
        num_experts = r.int("n_routed_experts", default=8, minimum=1, maximum=MAX_EXPERTS) or 1
        top_k = r.int("num_experts_per_tok", default=2, minimum=1, maximum=MAX_EXPERTS) or 1
    elif model_type in ("nemotron_h", "falcon_h1"):
        # Expert fields without an MoE layer (Nemotron-H's class defaults) shape nothing.
        num_experts, top_k = 1, 1
    elif model_type == "jamba":
        _check_expert_fields(r)
        num_experts = r.int("num_experts", default=16, minimum=1, maximum=MAX_EXPERTS) or 1
        top_k = r.int("num_experts_per_tok", default=2, minimum=1, maximum=MAX_EXPERTS) or 1
    else:
        _check_expert_fields(r)
        for name in () if hybrid else _NON_ATTENTION_FIELDS:
            if r.config.get(name) is not None:
                raise SpecError(
                    r.path(name),
                    "describes layers that are not attention (Mamba or linear attention), "
                    "which vramgate does not estimate for this model type yet; of the hybrid "
                    f"families it builds {', '.join(sorted(HYBRID_FAMILIES))}",
                )
        num_experts = _scalar(r, _EXPERT_COUNT_FIELDS, "first", default=1, **limits) or 1
        top_k = (
            _scalar(r, _TOP_K_FIELDS, "max", default=1 if num_experts == 1 else 2, **limits) or 1
        )
    if num_experts > 1 and top_k > num_experts:
        raise SpecError(
            r.path("num_experts_per_tok"),
            f"must not exceed the number of experts ({num_experts}), got {top_k}",
        )
    shared_size = r.dim("shared_expert_intermediate_size")
    n_shared = _scalar(r, _SHARED_COUNT_FIELDS, "first", default=0, **limits) or 0
    moe_size = None
    if model_type == "nemotron_h":
        # One shared expert in every MoE layer, whatever n_shared_experts says (transformers
        # builds one MLP of moe_shared_expert_intermediate_size), with no gate.
        n_shared = 1 if nemotron_moe else 0
        shared_size = (
            r.int("moe_shared_expert_intermediate_size", default=7688) if nemotron_moe else None
        )
        moe_size = r.int("moe_intermediate_size", default=7688) if nemotron_moe else None
    if shared_size and n_shared == 0:
        n_shared = 1
    dense_size = r.dim("intermediate_size_mlp")
    if dense_size and num_experts > 1 and n_shared == 0:
        n_shared = 1  # Llama 4: one shared expert in every MoE layer

    layer_types = None if hybrid else r.config.get("layer_types")  # hybrid: the mixers
    if layer_types is not None:
        if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
            raise SpecError(r.path("layer_types"), "must be a list of strings")
        if len(layer_types) != layers:
            raise SpecError(
                r.path("layer_types"),
                f"must list one type per layer ({layers}), got {len(layer_types)}",
            )
        for i, kind in enumerate(layer_types):
            if kind not in KNOWN_LAYER_TYPES:
                raise SpecError(
                    f"{r.path('layer_types')}[{i}]",
                    f"unknown layer type {shown(kind)}; allowed: {', '.join(KNOWN_LAYER_TYPES)}",
                )
    # Equal to the layer count, no layer shares (`is_kv_shared_layer`: there is no earlier
    # layer to share with), as seed 1's reference and Gemma's modelling read it.
    kv_shared = r.int("num_kv_shared_layers", default=0, minimum=0) or 0
    if kv_shared > layers:
        raise SpecError(
            r.path("num_kv_shared_layers"),
            f"must be less than or equal to num_hidden_layers ({layers}), got {kv_shared}",
        )
    kv_lora = r.dim("kv_lora_rank")
    if kv_lora is not None:
        for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            r.required_int(name)

    # Read in this order (the dict's), so a config with several bad fields reports the same
    # one first as ever; `assemble`: see frozen.py.
    return assemble(
        ArchDims,
        {
            "hidden_size": hidden,
            "num_layers": layers,
            "num_heads": heads,
            "num_kv_heads": kv_heads,
            "head_dim": head_dim,
            "intermediate_size": intermediate,
            "vocab_size": vocab,
            "num_experts": num_experts,
            "experts_per_token": top_k,
            "moe_intermediate_size": (
                moe_size
                if model_type == "nemotron_h"
                else _scalar(r, ("moe_intermediate_size", "ffn_config.ffn_hidden_size"), "first")
            ),
            "n_shared_experts": n_shared,
            "shared_expert_intermediate_size": shared_size,
            "shared_expert_gate": bool(shared_size) and model_type != "nemotron_h",
            "dense_intermediate_size": dense_size,
            "dense_layers": _dense_layer_indices(r, layers, num_experts),
            "moe_has_dense_mlp": r.bool("enable_moe_block", False),
            "q_lora_rank": r.dim("q_lora_rank"),
            "kv_lora_rank": kv_lora,
            "qk_nope_head_dim": r.dim("qk_nope_head_dim"),
            "qk_rope_head_dim": r.dim("qk_rope_head_dim"),
            "v_head_dim": r.dim("v_head_dim"),
            "global_head_dim": r.dim("global_head_dim"),
            "num_global_kv_heads": r.dim("num_global_key_value_heads"),
            "attention_k_eq_v": r.bool("attention_k_eq_v", False),
            "layer_types": tuple(layer_types) if layer_types is not None else None,
            "num_kv_shared_layers": kv_shared,
            "use_double_wide_mlp": r.bool("use_double_wide_mlp", False),
            "vocab_size_per_layer_input": (
                r.int("vocab_size_per_layer_input", default=0, minimum=0) or 0
            ),
            "hidden_size_per_layer_input": (
                r.int("hidden_size_per_layer_input", default=0, minimum=0) or 0
            ),
            # Read last, as ever. Nemotron-H never ties (its causal LM declares no tied
            # weights, so transformers builds an lm_head of its own whatever the flag says).
            "tie_word_embeddings": r.bool("tie_word_embeddings", tie_default)
            and model_type != "nemotron_h",
            "mixers": mixers,
            "ssm": (
                _falcon_ssm_dims(r, hidden)
                if model_type == "falcon_h1"
                else _ssm_dims(r)
                if mixers is not None and "mamba2" in mixers
                else None
            ),
            "mamba1": _mamba1_dims(r, hidden) if model_type == "jamba" else None,
            "deltanet": _deltanet_dims(r) if model_type == "qwen3_next" else None,
            "laurel_rank": r.int("laurel_rank", default=64) or 0 if model_type in _GEMMA3N else 0,
            "altup_num_inputs": (
                r.int("altup_num_inputs", default=4) or 0 if model_type in _GEMMA3N else 0
            ),
            "activation_sparsity": (
                _activation_sparsity(r, layers) if model_type in _GEMMA3N else ()
            ),
            "sliding_window": (
                r.int("sliding_window", default=_GEMMA3N_WINDOW) if model_type in _GEMMA3N else None
            ),
            "attention_output_gate": model_type == "qwen3_next",
            "moe_latent_size": r.dim("moe_latent_size") if nemotron_moe else None,
        },
    )


#: Gemma 3n's default when the config leaves `activation_sparsity_pattern` out (its config
#: class's): the first ten layers at 0.95 in a model of more than ten, none otherwise.
_SPARSE_LAYERS, _SPARSITY = 10, 0.95
_GEMMA3N_WINDOW = 512


def _activation_sparsity(r: _Reader, layers: int) -> tuple[float, ...]:
    """Gemma 3n's `activation_sparsity_pattern`: one number in [0, 1] per layer (at 1 the
    Gaussian cut is infinite and the gate all zeros, as transformers runs it)."""
    pattern = r.get("activation_sparsity_pattern")
    if pattern is None:
        sparse = _SPARSE_LAYERS if layers > _SPARSE_LAYERS else 0
        return (_SPARSITY,) * sparse + (0.0,) * (layers - sparse)
    field = r.path("activation_sparsity_pattern")
    if not isinstance(pattern, list) or len(pattern) != layers:
        raise SpecError(
            field, f"must be a list of one number per layer ({layers}), got {shown(pattern)}"
        )
    for i, value in enumerate(pattern):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise SpecError(f"{field}[{i}]", f"must be a number in [0, 1], got {shown(value)}")
    return tuple(float(value) for value in pattern)


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


def _mla_linears(dims: ArchDims, bias: bool) -> tuple[list[Linear], list[int]]:
    """DeepSeek multi-head latent attention: low-rank q and compressed k/v with their norms."""
    h, nh = dims.hidden_size, dims.num_heads
    nope, rope, v = dims.qk_nope_head_dim or 0, dims.qk_rope_head_dim or 0, dims.v_head_dim or 0
    kv_rank = dims.kv_lora_rank or 0
    linears: list[Linear] = []
    norms = [kv_rank]
    if dims.q_lora_rank:
        linears += [
            _linear("q_a_proj", h, dims.q_lora_rank, bias),
            _linear("q_b_proj", dims.q_lora_rank, nh * (nope + rope)),
        ]
        norms.append(dims.q_lora_rank)
    else:
        linears.append(_linear("q_proj", h, nh * (nope + rope)))
    linears += [
        _linear("kv_a_proj_with_mqa", h, kv_rank + rope, bias),
        _linear("kv_b_proj", kv_rank, nh * (nope + v)),
        _linear("o_proj", nh * v, h, bias),
    ]
    return linears, norms


def _attention(
    dims: ArchDims, fam: _Family, r: _Reader, index: int
) -> tuple[list[Linear], list[int]]:
    if dims.kv_lora_rank is not None:
        return _mla_linears(dims, r.bool("attention_bias", False))
    h = dims.hidden_size
    q_width, kv_width, has_k, has_v = layer_attention_dims(dims, index)
    attention_bias = r.bool(fam.bias_field, False)
    qkv_bias = fam.qkv_bias if fam.qkv_bias is not None else attention_bias
    o_bias = fam.o_bias if fam.o_bias is not None else attention_bias
    if fam.fused_qkv:
        linears = [_linear("qkv_proj", h, q_width + 2 * kv_width, qkv_bias)]
    else:
        linears = [_linear("q_proj", h, 2 * q_width if fam.gated_q else q_width, qkv_bias)]
        if has_k:
            linears.append(_linear("k_proj", h, kv_width, qkv_bias))
        if has_v:
            linears.append(_linear("v_proj", h, kv_width, qkv_bias))
    linears.append(_linear("o_proj", q_width, h, o_bias))
    head_dim = q_width // dims.num_heads
    other: list[int] = []
    if fam.qk_norm == "head" or (fam.qk_norm_field and r.bool(fam.qk_norm_field, False)):
        other += [head_dim, head_dim] if has_k else [head_dim]  # k_norm goes with k_proj
    elif fam.qk_norm == "full":
        other += [q_width, kv_width]
    if fam.attention_sinks:
        other.append(dims.num_heads)
    return linears, other


def _dense_mlp(h: int, inter: int, fam: _Family, bias: bool, copies: int = 1) -> list[Linear]:
    expert = copies > 1
    if fam.fused_gate_up:
        return [
            _linear("gate_up_proj", h, 2 * inter, bias, copies, expert),
            _linear("down_proj", inter, h, bias, copies, expert),
        ]
    return [
        _linear("gate_proj", h, inter, bias, copies, expert),
        _linear("up_proj", h, inter, bias, copies, expert),
        _linear("down_proj", inter, h, bias, copies, expert),
    ]


def _moe_mlp(dims: ArchDims, fam: _Family) -> tuple[list[Linear], list[int]]:
    h, e = dims.hidden_size, dims.num_experts
    expert_inter = dims.moe_intermediate_size or dims.intermediate_size
    if fam.fused_expert_gate_up:
        linears = [
            _linear("gate_up_proj", h, 2 * expert_inter, fam.expert_bias, e, True),
            _linear("down_proj", expert_inter, h, fam.expert_bias, e, True),
        ]
    else:
        linears = [
            _linear("gate_proj", h, expert_inter, fam.expert_bias, e, True),
            _linear("up_proj", h, expert_inter, fam.expert_bias, e, True),
            _linear("down_proj", expert_inter, h, fam.expert_bias, e, True),
        ]
    linears.append(_linear("router", h, e, fam.router_bias))
    other = [e] if fam.router_correction_bias else []
    if dims.n_shared_experts:
        if dims.shared_expert_intermediate_size:
            # Qwen-MoE: one shared expert of its own width, gated by a h -> 1 linear.
            linears += _dense_mlp(h, dims.shared_expert_intermediate_size, fam, False)
            if dims.shared_expert_gate:
                linears.append(_linear("shared_expert_gate", h, 1))
        else:
            # DeepSeek: the shared experts run as one MLP n_shared times as wide.
            linears += _dense_mlp(h, expert_inter * dims.n_shared_experts, fam, False)
    return linears, other


def _layer(
    dims: ArchDims,
    fam: _Family,
    r: _Reader,
    index: int,
    attention_type: str,
    moe: bool,
    mlp_bias: bool,
) -> Layer:
    h = dims.hidden_size
    linears, other = _attention(dims, fam, r, index)
    other += [h] * (fam.norms_per_layer * (2 if fam.layernorm_bias else 1))
    if moe:
        moe_linears, moe_other = _moe_mlp(dims, fam)
        linears += moe_linears
        other += moe_other
        if dims.moe_has_dense_mlp:
            linears += _dense_mlp(h, layer_mlp_size(dims, index), fam, mlp_bias)
    else:
        linears += _dense_mlp(h, layer_mlp_size(dims, index), fam, mlp_bias)
    if dims.hidden_size_per_layer_input:
        pli = dims.hidden_size_per_layer_input
        linears += [
            _linear("per_layer_input_gate", h, pli),
            _linear("per_layer_projection", pli, h),
        ]
        other.append(h)  # post_per_layer_input_norm
    if dims.laurel_rank:
        rank = dims.laurel_rank
        linears += [_linear("linear_left", h, rank), _linear("linear_right", rank, h)]
        other.append(h)  # post_laurel_norm
    if dims.altup_num_inputs:
        n = dims.altup_num_inputs
        linears += [
            _linear("correction_coefs", n, n),
            _linear("prediction_coefs", n, n * n),
            _linear("modality_router", h, n),
        ]
        other += [h, h]  # correct_output_scale, router_norm
    return _assembled(linears, other, attention_type, moe, "attention_mlp")


def _layers(
    dims: ArchDims, fam: _Family, r: _Reader, mlp_bias: bool
) -> tuple[tuple[Layer, ...], tuple[tuple[Layer, int], ...]]:
    """Every layer, and each distinct one with its count in first-seen order.

    A layer's kind is its (attention type, kv-shared, MoE); layers of one kind share the
    object built at the kind's first index. Kinds are coded as small integers (4 x the
    attention type's number, + 2 when kv-shared, + 1 when MoE), so grouping thousands of
    layers stays in C-level list and dict operations.
    """
    n = dims.num_layers
    types = dims.layer_types or None
    if types is None:
        codes = [0] * n
    else:
        numbers = {name: 4 * k for k, name in enumerate(dict.fromkeys(types))}
        codes = list(map(numbers.__getitem__, types))
    first_shared = n - dims.num_kv_shared_layers  # is_kv_shared_layer's test
    if dims.num_kv_shared_layers and first_shared > 0:
        codes[first_shared:] = [code + 2 for code in codes[first_shared:]]
    if dims.num_experts > 1:
        codes = [code + 1 for code in codes]
        for i in dims.dense_layers:
            codes[i] &= -2  # dense: the MoE bit cleared
    built: dict[int, Layer] = {}
    for code in dict.fromkeys(codes):
        first = codes.index(code)
        attention_type = types[first] if types is not None else "full_attention"
        built[code] = _layer(dims, fam, r, first, attention_type, bool(code & 1), mlp_bias)
    layers = tuple(map(built.__getitem__, codes))
    return layers, tuple((layer, codes.count(code)) for code, layer in built.items())


def _assembled(
    linears: list[Linear], other: list[int], attention_type: str, moe: bool, mixer: str
) -> Layer:
    """One layer from its linears and its other tensors (`assemble`: see frozen.py)."""
    return assemble(
        Layer,
        {
            "linears": tuple(linears),
            "other_params": sum(other),
            "attention_type": attention_type,
            "moe": moe,
            "other_tensors": tuple(other),
            "mixer": mixer,
        },
    )


def _mamba2(ssm: SsmDims, h: int) -> tuple[list[Linear], list[int]]:
    """A Mamba-2 mixer as transformers builds it: in_proj (z, x/B/C, dt) and out_proj are
    the linears; the depthwise conv1d (conv_dim x kernel, + bias), dt_bias, A_log, D (one
    per head) and the gated RMSNorm over the SSM width are parameters of their own."""
    linears = [
        _linear("in_proj", h, ssm.in_proj_width, ssm.proj_bias),
        _linear("out_proj", ssm.inner, h, ssm.out_bias),
    ]
    other = [ssm.conv_dim * ssm.conv_kernel]
    if ssm.conv_bias:
        other.append(ssm.conv_dim)
    other += [ssm.num_heads, ssm.num_heads, ssm.num_heads]
    if ssm.gated_norm:
        other.append(ssm.inner)
    return linears, other


def _mamba1(m: Mamba1Dims, h: int) -> tuple[list[Linear], list[int]]:
    """A Mamba (1) mixer as transformers builds Jamba's: in_proj (x and the gate z), x_proj
    (dt, B, C), dt_proj (biased), out_proj are the linears; the depthwise conv1d (+ bias),
    A_log (inner x state), D and the dt/B/C RMSNorms are parameters of their own."""
    linears = [
        _linear("in_proj", h, 2 * m.inner, m.proj_bias),
        _linear("x_proj", m.inner, m.dt_rank + 2 * m.state_size),
        _linear("dt_proj", m.dt_rank, m.inner, True),
        _linear("out_proj", m.inner, h, m.proj_bias),
    ]
    other = [m.inner * m.conv_kernel]
    if m.conv_bias:
        other.append(m.inner)
    other += [m.inner * m.state_size, m.inner, m.dt_rank, m.state_size, m.state_size]
    return linears, other


def _deltanet(g: DeltaNetDims, h: int) -> tuple[list[Linear], list[int]]:
    """A Gated DeltaNet mixer as transformers builds Qwen3-Next's: in_proj_qkvz (q, k, v and
    the output gate z), in_proj_ba (beta and the decay's a, one each per value head) and
    out_proj are the linears; the bias-free depthwise conv1d over q/k/v, dt_bias and A_log
    (per value head) and the gated RMSNorm over a value head are parameters of their own."""
    linears = [
        _linear("in_proj_qkvz", h, 2 * g.key_dim + 2 * g.value_dim),
        _linear("in_proj_ba", h, 2 * g.num_v_heads),
        _linear("out_proj", g.value_dim, h),
    ]
    other = [g.conv_dim * g.conv_kernel, g.num_v_heads, g.num_v_heads, g.head_v_dim]
    return linears, other


def _nemotron_moe(dims: ArchDims, mlp_bias: bool) -> tuple[list[Linear], list[int]]:
    """A Nemotron 3 MoE mixer as transformers builds it: expert stacks of up and down only
    (ReLU², no gate) over the latent width where fc1/fc2_latent_proj narrow the hidden state
    for them, an fp32 router (a parameter) with its fp32 score-correction bias (a buffer,
    counted as DeepSeek-V3's is), and one shared expert, an MLP of up and down."""
    h, e = dims.hidden_size, dims.num_experts
    inner = dims.moe_intermediate_size or dims.intermediate_size
    width = dims.moe_latent_size or h
    linears = []
    if dims.moe_latent_size:
        linears += [
            _linear("fc1_latent_proj", h, width, mlp_bias),
            _linear("fc2_latent_proj", width, h, mlp_bias),
        ]
    linears += [
        _linear("up_proj", width, inner, False, e, True),
        _linear("down_proj", inner, width, False, e, True),
        _linear("router", h, e),
    ]
    shared = dims.shared_expert_intermediate_size or inner
    linears += [_linear("up_proj", h, shared, mlp_bias), _linear("down_proj", shared, h, mlp_bias)]
    return linears, [e]


def _jamba_layer(
    dims: ArchDims, fam: _Family, r: _Reader, index: int, moe: bool, mlp_bias: bool
) -> Layer:
    """A Jamba or Qwen3-Next layer: attention (the standard block) or a Mamba (1) / Gated
    DeltaNet mixer in its place, then an MLP or an MoE."""
    if dims.mixers is not None and dims.mixers[index] == "attention_mlp":
        return _layer(dims, fam, r, index, "full_attention", moe, mlp_bias)
    h = dims.hidden_size
    if dims.deltanet is not None:
        kind = "deltanet_mlp"
        linears, other = _deltanet(dims.deltanet, h)
    else:
        assert dims.mamba1 is not None  # read for every Jamba config
        kind = "mamba1_mlp"
        linears, other = _mamba1(dims.mamba1, h)
    if moe:
        moe_linears, moe_other = _moe_mlp(dims, fam)
        linears += moe_linears
        other += moe_other
    else:
        linears += _dense_mlp(h, dims.intermediate_size, fam, mlp_bias)
    other += [h, h]  # input_layernorm, pre_ff_layernorm
    return _assembled(linears, other, kind, moe, kind)


def _hybrid_layers(
    dims: ArchDims, fam: _Family, r: _Reader, mlp_bias: bool
) -> tuple[tuple[Layer, ...], tuple[tuple[Layer, int], ...]]:
    """A hybrid stack's layers (`dims.mixers`), one shared object per mixer, each a norm and
    its mixer alone: Nemotron-H's attention layers have no MLP and its MLP layers no
    attention (an MLP of up_proj and down_proj, no gate: ReLU²)."""
    mixers = dims.mixers or ()
    h, inter = dims.hidden_size, dims.intermediate_size
    if dims.mamba1 is not None or dims.deltanet is not None:
        # Jamba, Qwen3-Next: a layer's kind is its mixer and whether it is MoE
        dense = frozenset(dims.dense_layers)  # not the cached property: parsing keeps the
        # shape's __dict__ to its fields (tests/unit/estimator/test_estimator_speed.py)
        keys = [(kind, dims.num_experts > 1 and i not in dense) for i, kind in enumerate(mixers)]
        by_key = {
            key: _jamba_layer(dims, fam, r, keys.index(key), key[1], mlp_bias)
            for key in dict.fromkeys(keys)
        }
        layers = tuple(by_key[key] for key in keys)
        return layers, tuple((layer, keys.count(key)) for key, layer in by_key.items())
    built: dict[str, Layer] = {}
    for kind in dict.fromkeys(mixers):
        if kind == "attention":
            linears, other = _attention(dims, fam, r, mixers.index(kind))
        elif kind == "mlp":
            linears = [
                _linear("up_proj", h, inter, mlp_bias),
                _linear("down_proj", inter, h, mlp_bias),
            ]
            other = []
        elif kind == "moe":
            linears, other = _nemotron_moe(dims, mlp_bias)
        elif kind == "parallel":
            assert dims.ssm is not None  # read for every Falcon-H1 config
            linears, other = _mamba2(dims.ssm, h)
            attention, attention_other = _attention(dims, fam, r, mixers.index(kind))
            linears += attention + _dense_mlp(h, inter, fam, mlp_bias)
            other += [*attention_other, h]  # + pre_ff_layernorm
        else:
            assert dims.ssm is not None  # read whenever a mixer is mamba2
            linears, other = _mamba2(dims.ssm, h)
        other = [*other, h]  # the block's (input) norm
        attention_type = "full_attention" if kind in ("attention", "parallel") else kind
        built[kind] = _assembled(linears, other, attention_type, kind == "moe", kind)
    layers = tuple(built[kind] for kind in mixers)
    return layers, tuple((layer, mixers.count(kind)) for kind, layer in built.items())


#: Parsed shapes kept by content (`parse_config`): enough for every model a cluster trains at
#: once. A config beyond the bounds (real ones are 1-10 KB with a few dozen objects and
#: lists) is parsed every time, so hostile specs cannot pin much memory here: a kept config
#: holds at most about 10x its marshalled size in strings and numbers, plus its containers
#: (an empty `{}` is 2 bytes marshalled, 64 as an object, hence their own bound).
PARSED_CONFIGS = 128
PARSED_CONFIG_MAX_BYTES = 16 * 1024
PARSED_CONFIG_MAX_CONTAINERS = 512


def parse_config(config: Mapping[str, Any], prefix: str = "") -> ModelShape:
    """Read a Hugging Face config.json (as a dict) into a `ModelShape`.

    `prefix` is the field path of the config in the caller's spec (e.g. `spec.model.config`),
    so errors point at the field the user wrote. Raises `SpecError` on missing or
    contradictory fields.

    The operator and `vramgate plan` see the same config in many jobs (one ConfigMap, one
    inline config copied into every manifest), and parsing costs several times the estimate
    itself, so a shape is kept by the config's exact content and shared: `marshal` writes
    the value with its types (1, 1.0 and true stay three different configs) and without
    object references (format 2), so equal bytes mean an equal config, and the shape is
    parsed from a copy of its own, which the caller's later changes do not reach. Shapes
    are immutable; their `memo` only caches what the shape determines, and their `source`
    (the copy) is shared by every caller of that config: read it, never change it (the
    trace copies what it changes). Anything marshal cannot write (a mapping
    that is not a plain dict, values YAML decoded into dates) is parsed as it is.
    """
    try:
        blob = marshal.dumps(config, 2)  # type: ignore[arg-type]  # any value; ValueError if not
    except ValueError:  # not plain JSON data, or nested too deeply for marshal
        return _parse_config(config, prefix)
    if len(blob) > PARSED_CONFIG_MAX_BYTES or _containers(blob) > PARSED_CONFIG_MAX_CONTAINERS:
        return _parse_config(config, prefix)
    return _parse_marshalled(blob, prefix)


def _containers(blob: bytes) -> int:
    """At least the number of dicts, lists and tuples marshalled in `blob` (their type codes;
    the same bytes inside strings count too, which only keeps a config out of the cache)."""
    return blob.count(b"{") + blob.count(b"[") + blob.count(b"(")


@lru_cache(maxsize=PARSED_CONFIGS)
def _parse_marshalled(blob: bytes, prefix: str) -> ModelShape:
    """A shape by its config's marshalled bytes (errors are raised, not cached)."""
    return _parse_config(marshal.loads(blob), prefix)


def _parse_config(config: Mapping[str, Any], prefix: str) -> ModelShape:
    """`parse_config` without the cache."""
    if not isinstance(config, Mapping):
        raise SpecError(prefix or "config", "must be a JSON object (a Hugging Face config.json)")
    text, text_prefix, defaulted = _text_config(config, prefix)
    r = _Reader(text, text_prefix)
    try:
        return _parse_text(config, prefix, text, r, defaulted)
    except SpecError as error:
        if type(error) is SpecError and error.field in {r.path(f) for f in defaulted.fields}:
            # A value the user never wrote: say where it came from, or the refusal reads as
            # nonsense ("got 32" of a config without the field).
            raise SpecError(
                error.field,
                f"{error.message} (not in the config: the default of transformers' "
                f"{defaulted.model_type} config class; set it in the config)",
            ) from None
        raise


def _family_type(config: Mapping[str, Any], prefix: str) -> str:
    """The `model_type` whose layout the parser reads: the text_config's own, else the
    config's; a wrapper whose text_config names none is read as the text model transformers
    builds it with (`_text_config_types`: Mistral 3's is a Mistral), unless the wrapper is a
    family of its own (Gemma 3, Llama 4). Any other type is refused with the field: read as
    a Llama-style block, GPT-NeoX came out at 9.0B parameters instead of 6.9B. A config
    naming no model_type (hand-written; transformers always writes one) is read as Llama's,
    as the trace builds it and the operator labels it."""
    nested = config.get("text_config")
    own = nested.get("model_type") if isinstance(nested, Mapping) else None
    if own:
        model_type, field = own, "text_config.model_type"
    else:
        model_type, field = config.get("model_type"), "model_type"
    if not model_type:
        return "llama"
    path = f"{prefix}.{field}" if prefix else field
    if not isinstance(model_type, str):
        raise SpecError(path, f"must be a string, got {shown(model_type)}")
    if model_type in _FAMILIES:
        return model_type
    if nested is not None and not own and model_type in _model_defaults()[1]:
        return _model_defaults()[1][model_type]
    raise SpecError(
        path,
        f"{shown(model_type)} is not a model family vramgate reads (its layers may differ "
        "from the Llama-style block, so it is not estimated as one); supported: "
        f"{', '.join(SUPPORTED_MODEL_TYPES)}, or a multimodal config whose text_config is one "
        "of them (or use a preset: `vramgate presets`)",
    )


def _parse_text(
    config: Mapping[str, Any],
    prefix: str,
    text: Mapping[str, Any],
    r: _Reader,
    defaulted: _Defaulted,
) -> ModelShape:
    """The shape of the language model whose fields (class defaults filled in) `r` reads."""
    model_type = _family_type(config, prefix)
    missing = _missing_dimensions(r, defaulted, model_type)
    if missing:
        raise SpecErrors(missing)
    fam = family_traits(model_type)
    dims = _read_dims(r, fam.tie_default, model_type)
    tie = dims.tie_word_embeddings
    mlp_bias = r.bool("mlp_bias", False)
    h = dims.hidden_size
    norm = 2 * h if fam.layernorm_bias else h

    # Most layers are identical; build each distinct one once, at its first index, and share
    # it. Parsing is on the hot path of raw-config estimates, so the shape is handed its
    # `layer_counts` (each distinct layer with its count) instead of grouping them again.
    n = dims.num_layers
    layers: tuple[Layer, ...]
    runs: tuple[tuple[Layer, int], ...]
    if dims.mixers is not None:
        layers, runs = _hybrid_layers(dims, fam, r, mlp_bias)
    elif dims.layer_types is None and not dims.num_kv_shared_layers and dims.num_experts <= 1:
        layer = _layer(dims, fam, r, 0, "full_attention", False, mlp_bias)
        layers, runs = (layer,) * n, ((layer, n),)
    else:
        layers, runs = _layers(dims, fam, r, mlp_bias)

    embedding = dims.vocab_size * h
    outer: list[Linear] = []
    if dims.hidden_size_per_layer_input:
        pli = dims.hidden_size_per_layer_input
        embedding += dims.vocab_size_per_layer_input * pli * n  # embed_tokens_per_layer
        embedding += pli  # per_layer_projection_norm
        outer.append(_linear("per_layer_model_projection", h, n * pli))
    if dims.altup_num_inputs > 1:  # one projection in and one out per extra AltUp stream
        extra = dims.altup_num_inputs - 1
        outer += [_linear("altup_projections", h, h)] * extra
        outer += [_linear("altup_unembed_projections", h, h)] * extra
    # Only compared with the sequence length, so no upper bound.
    max_pos = r.int(
        "max_position_embeddings",
        "n_positions",
        "max_sequence_length",
        "max_seq_len",
        maximum=None,
    )
    return assemble(
        ModelShape,
        {
            "model_type": model_type,
            "dims": dims,
            "layers": layers,
            "embedding_params": embedding,
            "lm_head_params": 0 if tie else dims.vocab_size * h,
            "final_norm_params": norm,
            "max_position_embeddings": max_pos,
            "context_length": rope_context(text, r.prefix, max_pos),  # read before
            "quantization": _quantization(config, text, prefix),
            "source": config,
            "memo": {},
            "outer_linears": tuple(outer),
            "config_warnings": _defaults_read(r, defaulted, dims),
            # What the `layer_counts` cached property would compute (one object per distinct
            # key, counted), where it keeps it; `dataclasses.replace` builds a shape without.
            "layer_counts": runs,
        },
    )


def canonical_targets(targets: Sequence[str], shape: ModelShape, path: str) -> tuple[str, ...]:
    """Map user-written LoRA target names to the model's module names; reject unknown ones.

    Accepts `all-linear` (PEFT's spelling, also `all_linear`), PEFT module names, and the
    Mixtral aliases w1/w2/w3. On Phi-3's fused modules, q/k/v select `qkv_proj` and gate/up
    select `gate_up_proj`, which is where PEFT would put those adapters. Where transformers
    names a module otherwise (`PEFT_NAMES`: DBRX's `Wqkv`), that name, the one PEFT matches,
    is accepted too (the trace hands PEFT that one). Idempotent: its output is its input's
    canonical form, which it accepts again.
    """
    out: list[str] = []
    refused, why = PEFT_REFUSED_MODULES.get(shape.model_type, ((), ""))
    canonical = {real: name for name, real in PEFT_NAMES.get(shape.model_type, {}).items()}
    for raw in targets:
        name = raw.strip().lower().replace("_", "-") if "all" in raw.lower() else raw.strip()
        if refused and (name == "all-linear" or name in refused):
            many = len(refused) > 1
            if name == "all-linear":
                what = f"all-linear selects {'them' if many else 'it'}"
            else:
                what = f"{name!r} is one of them" if many else f"{name!r} names it"
            reason = why.format(modules=" and ".join(refused), model_type=shape.model_type)
            raise SpecError(
                path,
                f"{reason}, and {what}, so the job would fail; name the targets instead, e.g. "
                f"{', '.join(peft_adaptable_modules(shape))}",
            )
        if name == "all-linear":
            return ("all-linear",)
        name = canonical.get(name, name)  # the model's own name (DBRX's Wqkv) is accepted
        name = MODULE_ALIASES.get(name, name)
        if name not in shape.module_names:
            if name in ("q_proj", "k_proj", "v_proj") and "qkv_proj" in shape.module_names:
                name = "qkv_proj"
            elif name in ("gate_proj", "up_proj") and "gate_up_proj" in shape.module_names:
                name = "gate_up_proj"
            else:
                allowed = ", ".join(["all-linear", *sorted(shape.module_names)])
                raise SpecError(path, f"unknown module {raw!r} for this model; allowed: {allowed}")
        if name not in out:
            out.append(name)
    if not out:
        raise SpecError(path, "must name at least one module (or all-linear)")
    chosen = tuple(sorted(out))
    if shape.lora_params_per_rank(chosen) == 0:  # only expert stacks PEFT does not adapt
        raise SpecError(
            path,
            f"{', '.join(chosen)} {'selects' if len(chosen) == 1 else 'select'} no module PEFT "
            f"adapts on this model (its expert stacks are parameters, not linears); adaptable "
            f"by name: "
            f"{', '.join(peft_adaptable_modules(shape))}",
        )
    return chosen
