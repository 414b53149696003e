"""Every tensor of a layer, as transformers builds it for the family: attention (MLA
included), the MLP or the experts, a hybrid's mixers (Mamba-2, Mamba (1), Gated DeltaNet),
and the linears outside the layers.
"""

from __future__ import annotations

from functools import lru_cache

from controller.estimator.frozen import assemble
from controller.estimator.model.families import Family
from controller.estimator.model.read import Reader
from controller.estimator.model.shape import (
    ArchDims,
    DeltaNetDims,
    Layer,
    Linear,
    Mamba1Dims,
    SsmDims,
    layer_attention_dims,
    layer_mlp_size,
)

#: How the config builders make linears: the same few recur in every layer of every parse (a
#: raw config is parsed on each estimate), and building a frozen dataclass costs several
#: times a lookup. Linears are immutable values, so sharing one between models is safe;
#: `typed` keeps a bool apart from the int it equals, so each is built as it would be alone.
_linear = lru_cache(maxsize=4096, typed=True)(Linear)


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
    dims: ArchDims, fam: Family, r: Reader, index: int
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


def _dense_mlp(h: int, inter: int, fam: Family, bias: bool, copies: int = 1) -> list[Linear]:
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


def _moe_mlp(dims: ArchDims, fam: Family) -> tuple[list[Linear], list[int]]:
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
    # ERNIE's correction bias is a parameter; the others' a buffer (`_buffers`)
    other = [e] if fam.router_correction_bias and fam.correction_bias_parameter else []
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
    fam: Family,
    r: Reader,
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
    return _assembled(
        linears, other, attention_type, moe, "attention_mlp", _buffers(dims, fam, moe)
    )


def _layers(
    dims: ArchDims, fam: Family, r: Reader, mlp_bias: bool
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


def _buffers(dims: ArchDims, fam: Family, moe: bool) -> tuple[int, ...]:
    """An MoE layer's fp32 score-correction bias where transformers 5 registers it as a
    buffer (`nn.Buffer` in DeepseekV3TopkRouter, Glm4MoeTopkRouter, NemotronHTopkRouter),
    one per routed expert: on the GPU, but no parameter (`num_parameters` leaves it out)."""
    if moe and fam.router_correction_bias and not fam.correction_bias_parameter:
        return (dims.num_experts,)
    return ()


def _assembled(
    linears: list[Linear],
    other: list[int],
    attention_type: str,
    moe: bool,
    mixer: str,
    buffers: tuple[int, ...] = (),
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
            "fp32_buffers": buffers,
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
    for them, an fp32 router (a parameter) with its fp32 score-correction bias (a buffer:
    `_buffers`), and one shared expert, an MLP of up and down."""
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
    return linears, []


def _jamba_layer(
    dims: ArchDims, fam: Family, r: Reader, index: int, moe: bool, mlp_bias: bool
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
    return _assembled(linears, other, kind, moe, kind, _buffers(dims, fam, moe))


def _hybrid_layers(
    dims: ArchDims, fam: Family, r: Reader, mlp_bias: bool
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
        moe = kind == "moe"
        built[kind] = _assembled(
            linears, other, attention_type, moe, kind, _buffers(dims, fam, moe)
        )
    layers = tuple(built[kind] for kind in mixers)
    return layers, tuple((layer, mixers.count(kind)) for kind, layer in built.items())


def build_layers(
    dims: ArchDims, fam: Family, r: Reader, mlp_bias: bool
) -> tuple[tuple[Layer, ...], tuple[tuple[Layer, int], ...]]:
    """Every layer, and each distinct one with its count in first-seen order.

    Most layers are identical; each distinct one is built once, at its first index, and
    shared. Parsing is on the hot path of raw-config estimates, so the shape is handed its
    `layer_counts` (each distinct layer with its count) instead of grouping them again.
    """
    if dims.mixers is not None:
        return _hybrid_layers(dims, fam, r, mlp_bias)
    if dims.layer_types is None and not dims.num_kv_shared_layers and dims.num_experts <= 1:
        n = dims.num_layers
        layer = _layer(dims, fam, r, 0, "full_attention", False, mlp_bias)
        return (layer,) * n, ((layer, n),)
    return _layers(dims, fam, r, mlp_bias)


def outer_linears(dims: ArchDims) -> tuple[Linear, ...]:
    """The linear modules outside the decoder layers, the LM head aside: Gemma 3n's
    per-layer model projection and its AltUp projections, one in and one out per extra
    stream."""
    h, n = dims.hidden_size, dims.num_layers
    outer: list[Linear] = []
    if dims.hidden_size_per_layer_input:
        outer.append(_linear("per_layer_model_projection", h, n * dims.hidden_size_per_layer_input))
    if dims.altup_num_inputs > 1:
        extra = dims.altup_num_inputs - 1
        outer += [_linear("altup_projections", h, h)] * extra
        outer += [_linear("altup_unembed_projections", h, h)] * extra
    return tuple(outer)
