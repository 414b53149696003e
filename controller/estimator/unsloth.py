"""The `unsloth` profile: seed 1 (`unsloth-vram-estimation.md`), term by term.

    Total = Weights + LoRA adapters + Optimizer + Gradients + Activations + CUDA overhead

This is a calibrated formula, not a tensor count, and it is reproduced exactly, including
its approximations: weights count two norms per layer and no biases or final norm; attention
is `(H + K + K + H) · H` unless the config carries per-layer shape fields (`layer_types`,
`head_dim`, `global_head_dim`, ...), in which case each layer's own q/k/v widths are used;
MLA (DeepSeek) uses its low-rank projection shapes. Byte figures agree with the reference
implementation exactly; fractions are floored once per component, as it does.

Where seed 1 is silent this profile extends it, each noted where it happens: the optimizer
names outside its table, `modules_to_save`, and a family read generically (no hand reading
of its dimensions: `_generic_view`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from controller.base.units import GIB
from controller.estimator.model import (
    ArchDims,
    Memo,
    ModelShape,
    is_kv_shared_layer,
    layer_attention_dims,
    layer_mlp_size,
    skip_module_matches_text,
)
from controller.estimator.model.families import FAMILIES
from controller.estimator.module_paths import name_part, part_path
from controller.estimator.result import Estimate
from controller.estimator.settings import (
    Attention,
    Checkpointing,
    Method,
    Offloading,
    Optimizer,
    TrainingSettings,
)
from controller.estimator.storage import static_bytes

NF4_FACTOR = Fraction(16, 5)  # 3.2: BNB NF4 blockwise scales
NF4_DOUBLE_QUANT_FACTOR = Fraction(18, 5)  # 3.6 with bnb_4bit_use_double_quant
CUDA_OVERHEAD_BYTES = int(Fraction(14, 10) * GIB)  # "1.4 GB", calibrated on an RTX 5070 Ti
ACTIVATION_FACTOR = Fraction(5, 4)
NON_FLASH_FACTOR = 12
GRADIENT_FLOOR = Fraction(15, 100)
LINEAR_MEMORY_ATTENTION = (Attention.FLASH_ATTENTION_2, Attention.SDPA, Attention.FLEX_ATTENTION)

# Seed 1's calibrated table (bytes per trainable parameter). It has no plain 32-bit AdamW and
# no master-weight variant; those two are extensions: `adamw` holds the same full FP32 states
# as paged_adamw_32bit, and `adamw-fp32-master` adds seed 2's 4-byte FP32 master copy.
OPTIMIZER_BYTES = {
    Optimizer.ADAMW_8BIT: 4,
    Optimizer.ADAMW_TORCH: 6,
    Optimizer.PAGED_ADAMW_32BIT: 8,
    Optimizer.SGD: 4,
    Optimizer.ADAMW: 8,
    Optimizer.ADAMW_FP32_MASTER: 12,
}

# Layers whose activations are live at once, (full fine-tuning, LoRA); None means all layers.
GC_LAYERS: dict[Checkpointing, tuple[Fraction, Fraction] | None] = {
    Checkpointing.OFF: None,
    Checkpointing.ON: (Fraction(2), Fraction(1)),
    Checkpointing.UNSLOTH: (Fraction(3, 2), Fraction(1)),
}

SEVEN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_ATTENTION = frozenset(SEVEN_MODULES[:4])
_MLP = frozenset(SEVEN_MODULES[4:])
# Model-specific module names and the table row each one is charged as.
_TABLE_NAME = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "q_b_proj": ("q_proj",),
    "kv_a_proj_with_mqa": ("k_proj",),
    "kv_b_proj": ("v_proj",),
}


@dataclass(frozen=True)
class _View:
    """Everything about one model this profile needs, computed once per parsed model."""

    quantizable: int
    non_quantizable: int
    skipped: int
    # Distinct per-layer (q+k+v width, MLP width) pairs and how many layers have each.
    layer_size_counts: tuple[tuple[tuple[int, int], int], ...]
    # Of the weights, a vision tower read generically: frozen, never trained (VISION_NOTE).
    frozen: int = 0


def _structured(d: ArchDims) -> bool:
    if d.q_lora_rank is not None:
        return False
    return bool(
        d.layer_types
        or d.head_dim is not None
        or d.global_head_dim is not None
        or d.num_global_kv_heads is not None
        or d.attention_k_eq_v
        or d.num_kv_shared_layers > 0
        or d.use_double_wide_mlp
    )


def _kv(d: ArchDims) -> int:
    return (d.hidden_size // d.num_heads) * d.num_kv_heads


def _routed_size(d: ArchDims) -> int:
    return d.moe_intermediate_size if d.moe_intermediate_size is not None else d.intermediate_size


def _shared_size(d: ArchDims) -> int:
    return d.shared_expert_intermediate_size or _routed_size(d)


def _is_moe_layer(d: ArchDims, i: int) -> bool:
    return d.num_experts > 1 and i not in d.dense_layer_set


def _linear_dims(d: ArchDims, i: int) -> dict[str, tuple[int, int]]:
    """(in, out) of the seven projections of layer i, as the formula sees them."""
    h = d.hidden_size
    if _structured(d):
        q, kv, has_k, has_v = layer_attention_dims(d, i)
        mlp = layer_mlp_size(d, i)
    else:
        q, kv, has_k, has_v, mlp = h, _kv(d), True, True, _routed_size(d)
    # Qwen3-Next's q_proj also projects the output gate: twice q's width
    dims = {"q_proj": (h, 2 * q if d.attention_output_gate else q), "o_proj": (q, h)}
    if has_k:
        dims["k_proj"] = (h, kv)
    if has_v:
        dims["v_proj"] = (h, kv)
    dims |= {"gate_proj": (h, mlp), "up_proj": (h, mlp), "down_proj": (mlp, h)}
    return dims


def _mla_attention_elements(d: ArchDims) -> int:
    h, nh = d.hidden_size, d.num_heads
    nope, rope, v = d.qk_nope_head_dim or 0, d.qk_rope_head_dim or 0, d.v_head_dim or 0
    q_rank, kv_rank = d.q_lora_rank or 0, d.kv_lora_rank or 0
    return (
        h * q_rank
        + q_rank * nh * (nope + rope)
        + h * (kv_rank + rope)
        + kv_rank * nh * (nope + v)
        + nh * v * h
        + q_rank
        + kv_rank
    )


def _routed_elements(d: ArchDims) -> int:
    """Seed 1's MoE term: the routed experts and the router (`E × H`)."""
    h, e = d.hidden_size, d.num_experts
    return h * _routed_size(d) * 3 * e + e * h


def _shared_elements(d: ArchDims) -> int:
    """Shared experts (an extension of seed 1): three projections each, and the h -> 1 gate
    only where the model has one (Qwen-MoE's `shared_expert_gate`; DeepSeek has none): one
    tensor count (`model/tensors.py`), whichever profile prices it."""
    if not d.n_shared_experts:
        return 0
    gate = d.n_shared_experts * d.hidden_size if d.shared_expert_gate else 0
    return d.hidden_size * _shared_size(d) * 3 * d.n_shared_experts + gate


def _hybrid_dims(d: ArchDims, index: int) -> dict[str, tuple[int, int]]:
    """(in, out) of the linears of layer i of a hybrid stack (Nemotron-H: one mixer a layer).

    Seed 1 writes its formula for attention + MLP blocks; a hybrid layer is priced by the same
    terms over the modules it has (an extension): attention's four projections at their
    real widths, the MLP's up and down (no gate), the Mamba-2 mixer's in_proj and out_proj.
    """
    h = d.hidden_size
    mixer = (d.mixers or ())[index]
    if mixer == "attention":
        q, kv, _, _ = layer_attention_dims(d, index)
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    i = d.intermediate_size
    if mixer == "mlp":
        return {"up_proj": (h, i), "down_proj": (i, h)}
    if mixer == "moe":  # Nemotron 3: the MoE's nn.Linear modules (`_nemotron_moe_modules`)
        shared = _shared_size(d)
        linears = {"up_proj": (h, shared), "down_proj": (shared, h)}
        if d.moe_latent_size:
            w = d.moe_latent_size
            linears |= {"fc1_latent_proj": (h, w), "fc2_latent_proj": (w, h)}
        return linears
    ssm = d.ssm
    assert ssm is not None  # parsed whenever a layer is Mamba-2
    mamba = {"in_proj": (h, ssm.in_proj_width), "out_proj": (ssm.inner, h)}
    if mixer == "parallel":  # Falcon-H1: attention beside Mamba-2, then a gated MLP
        q, kv, _, _ = layer_attention_dims(d, index)
        attention = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
        mlp = {"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        return mamba | attention | mlp
    return mamba


#: Jamba's blocks: attention or Mamba (1), then the MLP or MoE of the standard block, which
#: seed 1's terms price as they are (the Mamba mixer takes attention's place).
_BLOCKS = ("attention_mlp", "mamba1_mlp", "deltanet_mlp")


def _one_mixer(d: ArchDims, i: int) -> bool:
    """Whether layer i is a hybrid layer priced module by module (`_hybrid_dims`) rather
    than as the standard attention + MLP block (Jamba's included, see `_BLOCKS`)."""
    return d.mixers is not None and d.mixers[i] not in _BLOCKS


def _mamba1_dims(d: ArchDims) -> dict[str, tuple[int, int]]:
    """(in, out) of a Jamba Mamba (1) mixer's linears."""
    m = d.mamba1
    assert m is not None  # parsed for every Jamba config
    h = d.hidden_size
    return {
        "in_proj": (h, 2 * m.inner),
        "x_proj": (m.inner, m.dt_rank + 2 * m.state_size),
        "dt_proj": (m.dt_rank, m.inner),
        "out_proj": (m.inner, h),
    }


def _deltanet_dims(d: ArchDims) -> dict[str, tuple[int, int]]:
    """(in, out) of a Qwen3-Next Gated DeltaNet mixer's linears."""
    g = d.deltanet
    assert g is not None  # parsed for every Qwen3-Next config
    h = d.hidden_size
    return {
        "in_proj_qkvz": (h, 2 * g.key_dim + 2 * g.value_dim),
        "in_proj_ba": (h, 2 * g.num_v_heads),
        "out_proj": (g.value_dim, h),
    }


def _mixer_dims(d: ArchDims) -> dict[str, tuple[int, int]]:
    """The linears of the mixer that takes attention's place in a Jamba or Qwen3-Next block."""
    return _deltanet_dims(d) if d.deltanet is not None else _mamba1_dims(d)


def _mixer_extras(d: ArchDims) -> int:
    """A Mamba mixer's parameters outside its linears (Mamba-2: conv1d, dt_bias, A_log, D,
    gated norm; Mamba 1: conv1d, A_log, D, dt/B/C norms): not quantised, and charged 16-bit
    with the norms (an extension of seed 1)."""
    g = d.deltanet
    if g is not None:  # conv1d (no bias), dt_bias, A_log, the gated norm over a value head
        return g.conv_dim * g.conv_kernel + 2 * g.num_v_heads + g.head_v_dim
    m = d.mamba1
    if m is not None:
        conv = m.inner * m.conv_kernel + (m.inner if m.conv_bias else 0)
        return conv + m.inner * m.state_size + m.inner + m.dt_rank + 2 * m.state_size
    ssm = d.ssm
    if ssm is None:
        return 0
    conv = ssm.conv_dim * ssm.conv_kernel + (ssm.conv_dim if ssm.conv_bias else 0)
    return conv + 3 * ssm.num_heads + (ssm.inner if ssm.gated_norm else 0)


def _layer_modules(d: ArchDims, i: int, model_type: str) -> dict[str, int]:
    """Quantizable elements of layer i by module path (for `llm_int8_skip_modules`), where
    `module_paths` puts each module (Nemotron-H: all at `mixer`; Falcon-H1: `mamba`,
    `self_attn`, `feed_forward`; Jamba's Mamba at `mamba`, Qwen3-Next's DeltaNet at
    `linear_attn`)."""
    if d.mixers is not None and d.mixers[i] == "moe":
        return _nemotron_moe_modules(d, i, model_type)
    if _one_mixer(d, i):
        return {
            f"{part_path(model_type, d, name_part(n))}.{n}": a * b
            for n, (a, b) in _hybrid_dims(d, i).items()
        }
    if d.mixers is not None and d.mixers[i] in ("mamba1_mlp", "deltanet_mlp"):
        block = _block_modules(d, i)
        where = part_path(model_type, d, "mixer")
        mixer = {f"{where}.{n}": a * b for n, (a, b) in _mixer_dims(d).items()}
        return mixer | {k: v for k, v in block.items() if not k.startswith("self_attn")}
    return _block_modules(d, i)


def _nemotron_moe_modules(d: ArchDims, i: int, model_type: str) -> dict[str, int]:
    """Nemotron 3 MoE layer i's elements by path: seed 1's MoE term over its expert stacks
    of up and down (two projections, no gate) with the router (`E × H`) at `mixer.experts`,
    then, beyond seed 1's table (which has neither), its one shared expert and its latent
    projections."""
    h, e, w = d.hidden_size, d.num_experts, d.moe_latent_size or d.hidden_size
    modules = {part_path(model_type, d, "experts"): w * _routed_size(d) * 2 * e + e * h}
    for name, (a, b) in _hybrid_dims(d, i).items():
        part = "shared" if name in ("up_proj", "down_proj") else "mixer"
        modules[f"{part_path(model_type, d, part)}.{name}"] = a * b
    return modules


def _block_modules(d: ArchDims, i: int) -> dict[str, int]:
    """`_layer_modules` of a standard attention + MLP (or MoE) block."""
    dims = _linear_dims(d, i)
    modules: dict[str, int] = {}
    if d.q_lora_rank is not None:
        modules["self_attn"] = _mla_attention_elements(d)
    elif not _structured(d):
        kv = _kv(d)
        h = d.hidden_size
        modules |= {"self_attn.q_proj": h * h, "self_attn.k_proj": h * kv}
        modules |= {"self_attn.v_proj": h * kv, "self_attn.o_proj": h * h}
    else:
        modules |= {f"self_attn.{n}": a * b for n, (a, b) in dims.items() if n in _ATTENTION}
    dense = {f"mlp.{n}": a * b for n, (a, b) in dims.items() if n in _MLP}
    if not _structured(d):
        inter = d.dense_intermediate_size or d.intermediate_size
        h = d.hidden_size
        dense = {"mlp.gate_proj": h * inter, "mlp.up_proj": h * inter, "mlp.down_proj": inter * h}
    if _is_moe_layer(d, i):
        modules["mlp.experts"] = _routed_elements(d)
        shared = _shared_elements(d)
        if shared:
            modules["mlp.shared_expert"] = shared
        if d.moe_has_dense_mlp:
            modules |= dense
    else:
        modules |= dense
    if d.hidden_size_per_layer_input:
        pli = d.hidden_size_per_layer_input
        modules["per_layer_input_gate"] = d.hidden_size * pli
        modules["per_layer_projection"] = pli * d.hidden_size
    h = d.hidden_size
    if d.laurel_rank:  # Gemma 3n's LAuReL and AltUp linears: quantised with the layer's
        modules["laurel.linear_left"] = h * d.laurel_rank
        modules["laurel.linear_right"] = d.laurel_rank * h
    if d.altup_num_inputs:
        n = d.altup_num_inputs
        modules["altup.correction_coefs"] = n * n
        modules["altup.prediction_coefs"] = n * n * n
        modules["altup.modality_router"] = h * n
    return modules


def _layer_key(d: ArchDims, i: int) -> tuple[object, ...]:
    """What makes one layer's shapes differ from another's; equal keys, equal layers."""
    if d.mixers is not None:
        return (d.mixers[i], _is_moe_layer(d, i))
    layer_type = d.layer_types[i] if d.layer_types else None
    return (layer_type, is_kv_shared_layer(d, i), _is_moe_layer(d, i))


_VIEW: Memo[_View] = Memo("unsloth")


def _view(shape: ModelShape) -> _View:
    cached = _VIEW.get(shape)
    if cached is not None:
        return cached
    if shape.model_type not in FAMILIES:
        return _VIEW.put(shape, _generic_view(shape))
    d = shape.dims
    h, n = d.hidden_size, d.num_layers
    by_key: dict[tuple[object, ...], dict[str, int]] = {}
    layers = []
    for i in range(n):
        key = _layer_key(d, i)
        if key not in by_key:
            by_key[key] = _layer_modules(d, i, shape.model_type)
        layers.append(by_key[key])
    quantizable = sum(sum(modules.values()) for modules in layers)
    pli = d.hidden_size_per_layer_input
    if pli:
        quantizable += h * n * pli
    if d.altup_num_inputs > 1:  # Gemma 3n's AltUp projections in and out, outside the layers
        quantizable += 2 * (d.altup_num_inputs - 1) * h * h
    # Gemma 3n's post_laurel_norm, AltUp's correct_output_scale and router_norm per layer
    norms = (bool(d.laurel_rank) + 2 * bool(d.altup_num_inputs)) * h * n
    embed = d.vocab_size * h + d.vocab_size_per_layer_input * pli * n + (h * n + pli if pli else 0)
    lm_head = 0 if d.tie_word_embeddings else d.vocab_size * h
    mixers = d.mixers or ()
    mamba_layers = sum(map(mixers.count, ("mamba2", "parallel", "mamba1_mlp", "deltanet_mlp")))
    extras = _mixer_extras(d) * mamba_layers
    skip = shape.quantization.skip_modules if shape.quantization else ()
    view = _View(
        quantizable=quantizable,
        non_quantizable=2 * h * n + embed + lm_head + extras + norms,
        skipped=min(_skipped_elements(skip, _module_elements(d, layers)), quantizable)
        if skip
        else 0,
        layer_size_counts=tuple(Counter(_activation_sizes(d, i) for i in range(n)).items()),
    )
    return _VIEW.put(shape, view)


def _generic_view(shape: ModelShape) -> _View:
    """A family read generically (an extension of seed 1, which writes its terms in the
    dimensions of the families it names): the weights split as the built model's own
    inventory splits them, the linears and expert stacks QLoRA holds in 4 bits (as
    `storage` and the trace hold them: not a router, nor a linear bitsandbytes keeps 16-bit)
    against every other parameter (norms, biases, embeddings, head: the count is exact,
    where seed 1's Llama terms would count a Granite-MoE's 2.56 B as 1.20 B); the
    activation term is seed 1's over each layer's attention and MLP widths as the generic
    dimensions give them (`_activation_sizes`). A layer that mixes tokens without attention
    (a state space's) is priced as attention, as the analytic profile prices it; the trace
    profile measures it."""
    quantizable = sum(
        lin.weight_params * count
        for layer, count in shape.layer_counts
        for lin in layer.linears
        if not (lin.kept_16bit or lin.name == "router")
    )
    quantizable += sum(
        lin.weight_params
        for lin in (*shape.outer_linears, *shape.frozen_linears)
        if not lin.kept_16bit
    )
    d = shape.dims
    return _View(
        quantizable=quantizable,
        non_quantizable=shape.total_params - quantizable,
        skipped=0,  # the inventory's own split keeps what bitsandbytes keeps 16-bit
        frozen=sum(lin.params for lin in shape.frozen_linears) + shape.frozen_params,
        layer_size_counts=tuple(
            Counter(_activation_sizes(d, i) for i in range(d.num_layers)).items()
        ),
    )


def _module_elements(d: ArchDims, layers: list[dict[str, int]]) -> dict[str, int]:
    """Elements by module path, with per-layer and per-block aggregates, for skip matching."""
    elements: dict[str, int] = {}
    for i, modules in enumerate(layers):
        elements[f"layers.{i}"] = sum(modules.values())
        for group in ("self_attn", "mlp", "mixer", "mamba", "feed_forward", "linear_attn",
                      "laurel", "altup"):  # fmt: skip
            elements[f"layers.{i}.{group}"] = sum(
                v for k, v in modules.items() if k == group or k.startswith(group + ".")
            )
        elements |= {f"layers.{i}.{k}": v for k, v in modules.items()}
    if d.hidden_size_per_layer_input:
        elements["per_layer_model_projection"] = (
            d.hidden_size * d.num_layers * d.hidden_size_per_layer_input
        )
    if d.altup_num_inputs > 1:
        extra = d.altup_num_inputs - 1
        elements["altup_projections"] = extra * d.hidden_size * d.hidden_size
        elements["altup_unembed_projections"] = extra * d.hidden_size * d.hidden_size
    return elements


# Qwen-MoE calls its shared expert `mlp.shared_expert`, DeepSeek and GLM `mlp.shared_experts`.
_SHARED = ".mlp.shared_expert"


def _skipped_elements(skip_modules: tuple[str, ...], elements: dict[str, int]) -> int:
    """Quantizable elements that `llm_int8_skip_modules` keeps in 16-bit.

    Entries match as transformers' bitsandbytes integration matches them
    (`model.skip_module_matches`: a bare name in every layer, a dotted path by suffix
    or from the model's root, under any text-model root); other roots (vision towers) and
    non-quantizable names (embeddings) match nothing. A module inside another matched module
    counts once.
    """
    matched: set[str] = set()
    entries = [raw.strip() for raw in skip_modules if raw.strip(". ")]
    for key in elements:
        names = [key, key + "s"] if key.endswith(_SHARED) else [key]
        if any(skip_module_matches_text(e, n) for e in entries for n in names):
            matched.add(key)
    outermost = {m for m in matched if not any(m.startswith(p + ".") for p in matched if p != m)}
    return sum(elements[m] for m in outermost)


def _activation_sizes(d: ArchDims, i: int) -> tuple[int, int]:
    if d.mixers is not None and d.mixers[i] == "mamba1_mlp":
        # Jamba's Mamba layer: in_proj's output (x and z) and the convolution's take the
        # q/k/v term's place, as in_proj's take it in a Mamba-2 layer; its MLP or MoE is
        # the standard block's (an extension).
        m = d.mamba1
        assert m is not None
        return 3 * m.inner, _standard_activation_sizes(d, i)[1]
    if d.mixers is not None and d.mixers[i] == "deltanet_mlp":
        # Qwen3-Next's linear attention: its projections' outputs and the convolution's
        # take the q/k/v term's place (an extension)
        g = d.deltanet
        assert g is not None
        widths = 2 * g.key_dim + 2 * g.value_dim + 2 * g.num_v_heads + g.conv_dim
        return widths, _standard_activation_sizes(d, i)[1]
    if d.mixers is not None and d.mixers[i] == "attention_mlp":
        return _standard_activation_sizes(d, i)
    if d.mixers is not None:
        # A hybrid layer (extension): the formula's q/k/v term is what the mixer projects
        # into (attention's q + 2 kv; Mamba-2's in_proj output and the convolution's
        # output), its 2·mlp term the MLP's two i-wide tensors (up's output, ReLU²'s).
        mixer = d.mixers[i]
        if mixer == "attention":
            q, kv, _, _ = layer_attention_dims(d, i)
            return q + 2 * kv, 0
        if mixer == "mlp":
            return 0, d.intermediate_size
        if mixer == "moe":  # as seed 1 prices an MoE block's MLP term: one expert's width
            return 0, _routed_size(d)
        assert d.ssm is not None
        mamba = d.ssm.in_proj_width + d.ssm.conv_dim
        if mixer == "parallel":  # Falcon-H1: both mixers' projections, then a gated MLP
            q, kv, _, _ = layer_attention_dims(d, i)
            return q + 2 * kv + mamba, d.intermediate_size
        return mamba, 0
    return _standard_activation_sizes(d, i)


def _standard_activation_sizes(d: ArchDims, i: int) -> tuple[int, int]:
    if _structured(d):
        # H + K + K on every layer, as seed 1 writes it: a kv-shared layer (or one whose k is
        # its v) holds no k/v weights, but the k/v it attends with are live all the same.
        q, kv, _, _ = layer_attention_dims(d, i)
        qkv = q + 2 * kv
        if _is_moe_layer(d, i):
            mlp = _routed_size(d) + (layer_mlp_size(d, i) if d.moe_has_dense_mlp else 0)
        else:
            mlp = layer_mlp_size(d, i)
        return qkv, mlp
    mlp = _routed_size(d)
    if _is_moe_layer(d, i) and d.moe_has_dense_mlp:
        mlp += d.intermediate_size
    return d.hidden_size + 2 * _kv(d), mlp


def _table_rows(targets: tuple[str, ...]) -> frozenset[str]:
    if "all-linear" in targets:
        return frozenset(SEVEN_MODULES)
    rows: set[str] = set()
    for name in targets:
        rows |= set(_TABLE_NAME.get(name, (name,)))
    return frozenset(rows) & frozenset(SEVEN_MODULES)


def _lora_mlp(h: int, size: int, rows: frozenset[str], copies: int) -> int:
    per = {"gate_proj": h + size, "up_proj": h + size, "down_proj": size + h}
    return sum(v for k, v in per.items() if k in rows) * copies


#: `lora_params_per_rank` by target set.
_LORA: Memo[int] = Memo("unsloth-lora")


def lora_params_per_rank(shape: ModelShape, targets: tuple[str, ...]) -> int:
    """Seed 1's LoRA table at rank 1: A (in × r) + B (r × out) per selected module per layer."""
    cached = _LORA.get(shape, targets)
    if cached is not None:
        return cached
    if shape.model_type not in FAMILIES:  # read generically: PEFT's own count (an extension)
        return _LORA.put(shape, shape.lora_params_per_rank(targets), targets)
    d = shape.dims
    if d.mamba1 is not None or d.deltanet is not None:
        # Jamba, Qwen3-Next: seed 1's table over the standard blocks with attention only
        # where a layer has it, plus the other mixers' linears (all-linear: all of them, as
        # PEFT puts them).
        n_mixer = sum(kind != "attention_mlp" for kind in d.mixers or ())
        mixer = sum(
            a + b
            for name, (a, b) in _mixer_dims(d).items()
            if "all-linear" in targets or name in targets
        )
        total = _block_lora(d, targets) + mixer * n_mixer
        if not _structured(d):  # the structured table skips attention where there is none
            total -= _lora_attention(d, _table_rows(targets)) * n_mixer
        return _LORA.put(shape, total, targets)
    if d.mixers is not None:
        # A hybrid stack: each layer's own modules, by name (all-linear, which PEFT refuses
        # on Mamba models, never reaches here: `canonical_targets`).
        every = "all-linear" in targets
        total = sum(
            a + b
            for i in range(d.num_layers)
            for name, (a, b) in _hybrid_dims(d, i).items()
            if every or name in targets
        )
        return _LORA.put(shape, total, targets)
    return _LORA.put(shape, _block_lora(d, targets), targets)


def _block_lora(d: ArchDims, targets: tuple[str, ...]) -> int:
    """Seed 1's LoRA table at rank 1 over standard attention + MLP (or MoE) blocks."""
    rows = _table_rows(targets)
    h, n = d.hidden_size, d.num_layers
    moe = d.num_experts > 1
    n_moe = n - len(d.dense_layers) if moe else 0
    moe_mlp = 0
    if moe:
        moe_mlp = _lora_mlp(h, _routed_size(d), rows, d.num_experts) + _lora_mlp(
            h, _shared_size(d), rows, d.n_shared_experts
        )
    if _structured(d):
        attention = 0
        dense_per_layer = []
        for i in range(n):
            dims = _linear_dims(d, i)
            if d.mixers is None or d.mixers[i] == "attention_mlp":
                attention += sum(
                    a + b for k, (a, b) in dims.items() if k in rows and k in _ATTENTION
                )
            dense_per_layer.append(sum(a + b for k, (a, b) in dims.items() if k in rows & _MLP))
        if not moe:
            mlp = sum(dense_per_layer)
        elif d.moe_has_dense_mlp:
            mlp = sum(dense_per_layer) + moe_mlp * n_moe
        else:
            mlp = moe_mlp * n_moe + sum(
                v for i, v in enumerate(dense_per_layer) if i in d.dense_layer_set
            )
    else:
        attention = _lora_attention(d, rows) * n
        dense = _lora_mlp(h, d.dense_intermediate_size or d.intermediate_size, rows, 1)
        if not moe:
            mlp = dense * n
        else:
            mlp = moe_mlp * n_moe + dense * (n if d.moe_has_dense_mlp else len(d.dense_layers))
    # `all-linear` is the seven projections of seed 1's table, nothing else (the per-layer
    # input modules of Gemma 3n/4 included): "all known text linear modules in the table".
    return attention + mlp


def _lora_attention(d: ArchDims, rows: frozenset[str]) -> int:
    h = d.hidden_size
    if d.q_lora_rank is not None:
        nh = d.num_heads
        nope, rope, v = d.qk_nope_head_dim or 0, d.qk_rope_head_dim or 0, d.v_head_dim or 0
        kv_rank = d.kv_lora_rank or 0
        dims = {
            "q_proj": (d.q_lora_rank, nh * (nope + rope)),
            "k_proj": (h, kv_rank + rope),
            "v_proj": (kv_rank, nh * (nope + v)),
            "o_proj": (nh * v, h),
        }
    else:
        kv = _kv(d)
        dims = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h)}
    return sum(a + b for k, (a, b) in dims.items() if k in rows)


def _activations(shape: ModelShape, view: _View, s: TrainingSettings) -> int:
    """Seed 1's activation term. Layers of equal shape are computed once (same floors)."""
    tokens = s.lm_seq_len * s.batch
    # (S·B·qkv + S·B·2 + S·B·2·mlp) × 2 × 1.25, floored per layer.
    per_shape = [
        (
            (tokens * (qkv + 2 + 2 * mlp) * 2 * ACTIVATION_FACTOR.numerator)
            // ACTIVATION_FACTOR.denominator,
            count,
        )
        for (qkv, mlp), count in view.layer_size_counts
    ]
    checkpointing = s.gradient_checkpointing
    if s.switches.activation_offloading is Offloading.CPU:
        # Extension: activations offloaded to CPU are priced as seed 1's Unsloth
        # checkpointing, which is Unsloth's offloading of the checkpointed activations.
        checkpointing = Checkpointing.UNSLOTH
    multipliers = GC_LAYERS[checkpointing]
    if multipliers is None:
        effective = Fraction(shape.num_layers)
        linear = sum(n_bytes * count for n_bytes, count in per_shape)
    else:
        effective = multipliers[1] if s.is_adapter else multipliers[0]
        largest = max(n_bytes for n_bytes, _ in per_shape)
        linear = largest * effective.numerator // effective.denominator
    if s.attention in LINEAR_MEMORY_ATTENTION:
        return linear
    scores = s.batch * shape.dims.num_heads * s.lm_seq_len * s.lm_seq_len * 2 * NON_FLASH_FACTOR
    return max(linear, scores * effective.numerator // effective.denominator)


#: `_weights` by method.
_WEIGHTS: Memo[int] = Memo("unsloth-weights")


def _weights(shape: ModelShape, view: _View, method: Method) -> int:
    cached = _WEIGHTS.get(shape, method)
    if cached is not None:
        return cached
    if method is Method.QLORA:
        quant = shape.quantization
        factor = NF4_DOUBLE_QUANT_FACTOR if quant and quant.double_quant else NF4_FACTOR
        sixteen_bit = (view.skipped + view.non_quantizable) * 2
        quantized = Fraction((view.quantizable - view.skipped) * 2) / factor
        weights = int(quantized + sixteen_bit)
    else:
        weights = (view.quantizable + view.non_quantizable) * 2
    return _WEIGHTS.put(shape, weights, method)


def estimate(shape: ModelShape, settings: TrainingSettings) -> Estimate:
    """Seed 1's estimate; `targets` must already be canonical (see `canonical_targets`)."""
    view = _view(shape)
    weights = _weights(shape, view, settings.method)

    if settings.is_adapter:
        lora = (settings.rank or 0) * lora_params_per_rank(shape, settings.targets)
        # Extension: modules_to_save train a full copy of the embeddings / LM head (PEFT),
        # charged like adapter parameters.
        for module in settings.modules_to_save:
            if shape.model_type not in FAMILIES:  # read generically: the module's own count
                lora += shape.embedding_params if module == "embed_tokens" else shape.lm_head_params
            elif module == "embed_tokens" or not shape.dims.tie_word_embeddings:
                lora += shape.dims.vocab_size * shape.dims.hidden_size
        trainable = lora
        lora_bytes = lora * 2
    else:
        trainable = view.quantizable + view.non_quantizable - view.frozen
        lora_bytes = 0

    optimizer = trainable * OPTIMIZER_BYTES[settings.optimizer]
    activations = _activations(shape, view, settings)
    gradient_floor = weights * GRADIENT_FLOOR.numerator // GRADIENT_FLOOR.denominator
    if settings.is_adapter:
        gradient_floor = min(gradient_floor, max(activations, optimizer))
    gradients = max(trainable * 2, gradient_floor)
    if settings.switches.optimizer_in_backward:
        # Extension: each parameter is stepped as its gradient is made, so one parameter's
        # gradient is held at a time (exact, from `storage`), and seed 1's floor, a
        # calibration of whole-gradient residency, does not apply.
        gradients = static_bytes(shape, settings).largest_gradient

    components = {
        "weights": weights,
        "lora_adapters": lora_bytes,
        "optimizer": optimizer,
        "gradients": gradients,
        "activations": activations,
        "cuda_overhead": CUDA_OVERHEAD_BYTES,
    }
    return Estimate(
        profile="unsloth",
        components=components,
        total_params=view.quantizable + view.non_quantizable,
        trainable_params=trainable,
        sharded_bytes=weights + lora_bytes + optimizer + gradients,
        replicated_bytes=activations + CUDA_OVERHEAD_BYTES,
    )
