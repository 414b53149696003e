"""The model families the parser reads, as data: how each `model_type` lays out its block.

Families differ in ways a generic reader would get wrong: Qwen2 has q/k/v biases, Gemma has
four norms per layer, Phi-3 fuses q/k/v and gate/up, Mixtral names its experts w1/w2/w3,
DeepSeek compresses attention (MLA), GPT-OSS stores biased experts and attention sinks,
Nemotron-H runs one mixer per layer (Mamba-2, attention, an MLP or, in Nemotron 3, an MoE:
`shape.MIXERS`). `FAMILIES` records those differences as data. A `model_type` outside it is
refused with the field (`SUPPORTED_MODEL_TYPES`), never read as Llama-style: GPT-NeoX,
Phi-2, Falcon, OPT and StarCoder2 lay out their blocks otherwise, and read so were counted
30-60 % over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

#: How a hybrid's config lists its layers' mixers (`shape.MIXERS`), which also says whose
#: mixer widths it states: "pattern" (Nemotron-H: one character or name a layer, which
#: counts the layers; Mamba-2 widths), "parallel" (Falcon-H1: attention beside Mamba-2 in
#: every layer), "periodic" (Jamba: attention every `Family.attention_period`, Mamba (1) in
#: the others), "interval" (Qwen3-Next: `layer_types`, else full attention every
#: full_attention_interval layers; Gated DeltaNet in the others); "" for a stack of
#: attention + MLP blocks.
Stack = Literal["", "pattern", "parallel", "periodic", "interval"]


class Period(NamedTuple):
    """Layers of one kind recur: layer i is one when i % period == offset, each read from its
    field with its config class's default (Jamba's attention and MoE layers)."""

    period_field: str
    period_default: int
    offset_field: str
    offset_default: int


class ClassExperts(NamedTuple):
    """Where a family's config class states its experts: the number and top-k fields with the
    class's defaults, read there and not under every family's spellings
    (`read.EXPERT_COUNT_FIELDS`). `widths` names the experts' and the shared expert's width
    fields (with defaults) where an MoE layer holds exactly one shared expert, whatever
    n_shared_experts says (Nemotron 3)."""

    number: tuple[str, int]
    top_k: tuple[str, int]
    widths: tuple[tuple[str, int], tuple[str, int]] | None = None


@dataclass(frozen=True)
class Family:
    """How one `model_type` lays out its block beyond the Llama default, and where its config
    states what sets it apart."""

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
    # An fp32 e_score_correction_bias per MoE layer (DeepSeek-V3-style routing). transformers
    # 5 registers it as a buffer (nn.Buffer: on the GPU, never a parameter, never trained),
    # except ERNIE 4.5's, an nn.Parameter (`correction_bias_parameter`).
    router_correction_bias: bool = False
    correction_bias_parameter: bool = False
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
    # Hybrid stacks: how the mixers are listed (`Stack`); Jamba's attention and MoE layers
    # by period.
    stack: Stack = ""
    attention_period: Period | None = None
    expert_period: Period | None = None
    # Expert fields shape only a stack's MoE mixers (Nemotron 3's "moe"); without one they are
    # class defaults that shape nothing (Nemotron-H, Falcon-H1).
    experts_in_mixers: bool = False
    experts: ClassExperts | None = None
    # Qwen-MoE gates its shared expert by an h -> 1 linear; Nemotron 3's has no gate.
    shared_expert_gate: bool = True
    # The LM head is its own whatever tie_word_embeddings says (Nemotron-H's causal LM
    # declares no tied weights).
    never_tied: bool = False
    # Gemma 3n's additions are read: LAuReL and AltUp in every layer, activation sparsity per
    # layer, the sliding window (its mask).
    laurel_altup: bool = False


FAMILIES: dict[str, Family] = {
    "llama": Family(),
    "mistral": Family(),
    "mixtral": Family(peft_moe_pattern="mixtral"),
    "qwen2": Family(qkv_bias=True, o_bias=False),
    # Qwen2-MoE is the pattern's namesake, not an entry of transformers' conversion table
    # (which PEFT reads): its LoRA stays on the nn.Linear modules, shared expert included.
    "qwen2_moe": Family(qkv_bias=True, o_bias=False),
    "qwen3": Family(qk_norm="head"),
    "qwen3_moe": Family(qk_norm="head", peft_moe_pattern="qwen2_moe"),
    "gemma": Family(tie_default=True),
    "gemma2": Family(norms_per_layer=4, tie_default=True),
    "gemma3_text": Family(norms_per_layer=4, qk_norm="head", tie_default=True),
    "gemma3": Family(norms_per_layer=4, qk_norm="head", tie_default=True),
    # Gemma 3n: Gemma 3's block plus LAuReL and AltUp in every layer, per-layer inputs;
    # kv-shared layers hold no k_proj, v_proj or k_norm.
    "gemma3n_text": Family(norms_per_layer=4, qk_norm="head", tie_default=True, laurel_altup=True),
    "gemma3n": Family(norms_per_layer=4, qk_norm="head", tie_default=True, laurel_altup=True),
    "phi3": Family(fused_qkv=True, fused_gate_up=True),
    "olmo2": Family(qk_norm="full"),
    # DBRX: fused Wqkv, experts w1/v1/w2 and the router under ffn_config, bias-free norms.
    "dbrx": Family(fused_qkv=True, router_linear=True, fused_expert_stacks=False),
    # Llama 4: fused expert stacks, one shared expert per MoE layer, L2 q/k norms (no weights).
    "llama4_text": Family(fused_expert_gate_up=True),
    "llama4": Family(fused_expert_gate_up=True),
    # ERNIE 4.5: biases by use_bias, an e_score_correction_bias per MoE layer, tied embeddings.
    # PEFT maps "all-linear" onto its expert stacks and router by the "qwen2_moe" pattern, as
    # transformers' conversion table lists it (GLM's too).
    "ernie4_5_moe": Family(
        bias_field="use_bias",
        router_correction_bias=True,
        correction_bias_parameter=True,
        tie_default=True,
        peft_moe_pattern="qwen2_moe",
    ),
    # GLM-4.5/4.6: q/k/v biases, no o bias, q/k norms by use_qk_norm, DeepSeek-style routing.
    "glm4_moe": Family(
        o_bias=False,
        qk_norm_field="use_qk_norm",
        router_correction_bias=True,
        peft_moe_pattern="qwen2_moe",
    ),
    "deepseek_v3": Family(router_correction_bias=True, peft_moe_pattern="qwen2_moe"),
    "deepseek_v2": Family(peft_moe_pattern="qwen2_moe"),
    # Kimi K2: DeepSeek-V3's layout (its config names the DeepseekV3 classes) at another size.
    "kimi_k2": Family(router_correction_bias=True, peft_moe_pattern="qwen2_moe"),
    "gpt_oss": Family(
        attention_sinks=True, router_bias=True, expert_bias=True, fused_expert_gate_up=True
    ),
    # Nemotron-H: one mixer per layer (`MIXERS`) after one RMSNorm; attention without biases
    # (its q/k/v/o are built bias-free whatever attention_bias says), a ReLU² MLP of up/down;
    # Nemotron 3's MoE routes as DeepSeek-V3 does (an fp32 router with a correction bias).
    "nemotron_h": Family(
        qkv_bias=False,
        o_bias=False,
        norms_per_layer=1,
        router_correction_bias=True,
        stack="pattern",
        experts_in_mixers=True,
        experts=ClassExperts(
            number=("n_routed_experts", 8),
            top_k=("num_experts_per_tok", 2),
            widths=(("moe_intermediate_size", 7688), ("moe_shared_expert_intermediate_size", 7688)),
        ),
        shared_expert_gate=False,
        never_tied=True,
    ),
    # Falcon-H1: attention (biases by attention_bias) beside a Mamba-2 mixer, then a SwiGLU
    # MLP; input_layernorm and pre_ff_layernorm; tied only where the config says so.
    "falcon_h1": Family(stack="parallel", experts_in_mixers=True),
    # Jamba: bias-free attention every attn_layer_period layers, Mamba (1) in the others;
    # an MoE (fused expert stacks, a router parameter) every expert_layer_period layers.
    "jamba": Family(
        qkv_bias=False,
        o_bias=False,
        fused_expert_gate_up=True,
        stack="periodic",
        attention_period=Period("attn_layer_period", 8, "attn_layer_offset", 4),
        expert_period=Period("expert_layer_period", 2, "expert_layer_offset", 1),
        experts=ClassExperts(number=("num_experts", 16), top_k=("num_experts_per_tok", 2)),
    ),
    # Qwen3-Next: Gated DeltaNet layers and, every full_attention_interval layers, gated full
    # attention (q_proj doubled, q/k norms over the head); Qwen-MoE experts with a gated
    # shared expert.
    "qwen3_next": Family(
        qk_norm="head",
        gated_q=True,
        fused_expert_gate_up=True,
        peft_moe_pattern="qwen2_moe",
        stack="interval",
    ),
}


#: The `model_type`s the parser reads, each by its own layout: any other is refused, never
#: read as a Llama-style block (GPT-NeoX, Phi-2, Falcon, OPT, StarCoder2 are not one).
SUPPORTED_MODEL_TYPES = tuple(sorted(FAMILIES))


#: The traits of a family read generically (`model.generic`): its shape lists every module as
#: built, so nothing is set apart beyond what the shape holds.
GENERIC = Family()


def family_traits(model_type: str) -> Family:
    """What sets `model_type`'s layout apart: one of `SUPPORTED_MODEL_TYPES`, the types
    `parse_config` reads by hand; any other type's shape is read generically from the built
    model (`model.generic`), whose modules need no traits (`GENERIC`)."""
    return FAMILIES.get(model_type, GENERIC)


#: Hybrid families, whose stacks the parser builds layer type by layer type: their fields
#: are read, not refused as layers that are not attention.
HYBRID_FAMILIES = frozenset(name for name, family in FAMILIES.items() if family.stack)
