"""The calibrated profile's features for stacks of unlike layers: Mamba-2 or Gated DeltaNet
layers among attention, MLP and MoE layers, and Gemma 3n's.

A dense or MoE family's layers are all alike, so the fit charges L x (what one layer adds).
In Nemotron-H each layer is one mixer (Mamba-2, attention or an MLP), so what a layer adds
depends on its type: here the per-layer features are summed over the layers, each computed
for its own type (a Mamba-2 layer has no t·q, an MLP layer no scan), and one coefficient
vector prices them all. That stays linear, so it is fitted as the uniform families are
(`controller.calibration.calibrate`), from traces that add one layer of each type to a two-layer
stack. Falcon-H1 runs attention and Mamba-2 side by side in every layer: one type.

The Mamba-2 terms are the tensors transformers' chunked scan holds for backward (its torch
path; the fused CUDA kernel holds less, so the fit errs high there): the gate and output
(t·D, D the SSM width), the convolution's channels (t·C), per-head terms (t·Hs), the
within-chunk score and decay tensors (t·Hs·c for chunks of c tokens), B and C repeated to
the heads (t·Hs·N, state size N) and the chunk states (t·D·N / c), with the state each
sequence starts from (b·D·N); the scan pads the sequence to whole chunks, so the chunked
terms use the padded tokens tp.

The scan is some fifty tensor operations between two modules, so its traces are cut op by
op in forward and in checkpointing's recomputation, each op named by the model's line that
runs it (`StorageTracker.split_ops`): each op's peak is linear in these features, a coarser
region's is not (its peak moves between ops as widths change). The fit is traced at two
chunks or more, as at real lengths: a one-chunk scan skips copies a longer one makes.

Nemotron 3 adds MoE layers (an MoE alone as the mixer: ReLU² expert stacks run as
transformers' `grouped_mm`, a router, one shared expert): its stacks are fitted apart, as
`nemotron_3` (`fit_family`), with the uniform MoE fit's terms per MoE layer (t·k·w for the
t x k routed rows of width w, the latent width where `moe_latent_size` narrows them, else
hidden; t·k·e for the experts' inner width e; t·E for the router's scores; W_E, the layer's
expert stacks in 16 bits) and t·l for the latent projection's output; the shared expert is
the layer's MLP width (t·i).

Qwen3-Next runs a Gated DeltaNet (linear attention) or gated attention in each layer, each
with an MoE: the DeltaNet is transformers' chunked torch path of the gated delta rule, which
holds the tensors Mamba-2's scan does in other widths, so it takes the scan's terms in its own
(`_scan_terms`), and every layer the MoE terms; a stack with dense MLP layers is refused.

Gemma 3n's layers are all attention + MLP, but not alike (`layer_kinds`): its first layers'
MLPs cut their gate at a Gaussian quantile (activation sparsity: one more t x MLP-width
tensor, t·x), its last layers reuse an earlier layer's k/v (no t·kv, no k/v LoRA inputs),
and every layer carries AltUp's streams of the hidden state (t·h·a), LAuReL's low-rank branch
(t·lr) and its per-layer input (t·p, whose table and projection, trained in a full fine-tune,
grow with the depth: G_p per layer). transformers materialises the sliding layers' mask
(b·s²) from the window's length on.

Jamba runs a Mamba (1) mixer or attention in each layer, each before a dense MLP or an MoE,
so its layers are of four kinds (`layer_kinds`; its published models have no attention layer
with experts). transformers' torch path of the Mamba-1 scan discretises the whole sequence at
once in fp32 (exp(A·dt), dt·B, dt·B·u: t·D·N each, D the inner width, N the state) and then
loops token by token, keeping each token's state for backward (t·D·N again, and b·D·N for the
first): those map onto the scan's terms, with the x projection's dt, B and C (t·(r + 2N), r
the dt rank) as the channels and no chunks (`_scan_terms`).

Only stacks of the layer types the fit was traced with, whose first and last layers are of
the traced types (their moments are part of the fit), are priced; any other is refused.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from controller.estimator.analytic import DELTANET_CHUNK
from controller.estimator.errors import SpecError
from controller.estimator.model import Layer, Memo, ModelShape
from controller.estimator.settings import Loss, Method, Precision, TrainingSettings
from controller.estimator.storage import Static

#: The Mamba-2 scan's terms, in both lists below (zero for a layer without the scan).
SCAN_FEATURES = ("t*D", "t*C", "t*Hs", "tp*Hs*c", "tp*Hs*N", "tp*D*N/c", "b*D*N")
#: An MoE layer's terms (Nemotron 3, Qwen3-Next), in both lists below (zero without experts).
MOE_FEATURES = ("t*k*w", "t*k*e", "t*E", "W_E", "t*l")
#: Gemma 3n's terms, in both lists below (zero for the other families): AltUp's streams of
#: the hidden state (t·h·a, a streams), an activation-sparse MLP's cut gate (t·x, x the MLP
#: width of such a layer), the per-layer input (t·p) and LAuReL's low-rank branch (t·lr),
#: and G_p, the gradients of a layer's share of the per-layer inputs' table and projection
#: (a full fine-tune's: they grow with the depth, so they are not the embedding's G_embed).
ALTUP_FEATURES = ("t*h*a", "t*x", "t*p", "t*lr", "G_p")
#: What each layer adds, summed over the layers (each by its own type).
HYBRID_LAYER_FEATURES = (
    "t*h", "t*q", "t*kv", "t*i", "t*A", "t*R", "t*n", "t", "G_layer", *SCAN_FEATURES,
    *MOE_FEATURES, *ALTUP_FEATURES, "1",
)  # fmt: skip
#: What the step holds once: the loss and the first and last layers' own transients.
HYBRID_LOCAL_FEATURES = (
    "t*h", "t*q", "t*kv", "t*i", "t*A", "t*R", "t*V", "b*s2", "t*n", "t",
    "G_head", "G_embed", "G_layer", "D", *SCAN_FEATURES, *MOE_FEATURES, *ALTUP_FEATURES, "1",
)  # fmt: skip
_NO_SCAN = [0] * len(SCAN_FEATURES)

_ATTENTION = frozenset({"attention", "parallel", "attention_mlp"})
#: Layers whose mixer runs a scan: Mamba-2's, Qwen3-Next's Gated DeltaNet, Jamba's Mamba-1.
_SCANNED = frozenset({"mamba2", "parallel", "deltanet_mlp", "mamba1_mlp"})
_MLP_NAMES = ("up_proj", "gate_proj")

#: The stacks each fitted family is traced with: (first layer, last layer, the layer types
#: added between them). Nemotron-H's published stacks (8B to 56B, Nano 9B and 12B v2) all
#: begin with a Mamba-2 layer and end with an MLP layer.
STACKS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "nemotron_h": ("mamba2", "mlp", ("mamba2", "attention", "mlp")),
    # Nemotron 3 (Nano 30B-A3B): Mamba-2 first, an MoE layer last, no MLP layer.
    "nemotron_3": ("mamba2", "moe", ("mamba2", "attention", "moe")),
    "falcon_h1": ("parallel", "parallel", ("parallel",)),
    # Qwen3-Next: three Gated DeltaNet layers to one gated-attention layer, each with an MoE.
    "qwen3_next": ("deltanet_mlp", "attention_mlp", ("deltanet_mlp", "attention_mlp")),
    # Gemma 3n (E2B, E4B): activation-sparse layers first, kv-shared layers last.
    "gemma3n": ("sparse", "shared", ("sparse", "dense", "shared")),
    # Jamba (v0.1, 1.5 Mini and Large): a dense Mamba layer first, an MoE one last, dense
    # attention layers between (attention never has experts there).
    "jamba": ("mamba_dense", "mamba_moe", ("mamba_dense", "mamba_moe", "attention_dense")),
}


def fit_family(shape: ModelShape) -> str:
    """The fit that prices a hybrid stack: its model type's, `nemotron_3` for a Nemotron-H
    config with MoE layers (the same model type, other layers), `gemma3n` for Gemma 3n's
    text model under either model type."""
    if shape.model_type == "nemotron_h" and "moe" in (shape.dims.mixers or ()):
        return "nemotron_3"
    if shape.dims.altup_num_inputs:
        return "gemma3n"
    return shape.model_type


def layer_kinds(shape: ModelShape) -> tuple[str, ...] | None:
    """Each layer's type as the fit tells them apart, None for a stack of alike layers: a
    hybrid's mixers; Gemma 3n's layers with activation sparsity ("sparse"), without
    ("dense") and kv-shared ("shared", no k/v of their own; "sparse_shared" is no published
    model's and was never traced); Jamba's mixer with its MLP ("mamba_moe": a Mamba layer
    with experts; "attention_moe" is no published model's)."""
    d = shape.dims
    if d.mamba1 is not None:
        assert d.mixers is not None  # read for every Jamba config
        return _jamba_kinds(d.mixers, d.dense_layers, d.num_experts > 1)
    if d.mixers is not None:
        return d.mixers
    if not d.altup_num_inputs:
        return None
    return _gemma3n_kinds(d.activation_sparsity, d.num_kv_shared_layers)


@lru_cache(maxsize=256)
def _jamba_kinds(mixers: tuple[str, ...], dense: tuple[int, ...], experts: bool) -> tuple[str, ...]:
    """`layer_kinds` of a Jamba stack, once per layout (every estimate asks): its mixer and
    whether it has experts, as the parser builds its layers (`model.tensors._hybrid_layers`)."""
    return tuple(
        f"{'attention' if mixer == 'attention_mlp' else 'mamba'}_"
        f"{'moe' if experts and i not in dense else 'dense'}"
        for i, mixer in enumerate(mixers)
    )


#: Gemma 3n's layer kinds by (activation-sparse, kv-shared).
_GEMMA3N_KIND = {
    (True, False): "sparse",
    (False, False): "dense",
    (False, True): "shared",
    (True, True): "sparse_shared",
}


@lru_cache(maxsize=256)
def _gemma3n_kinds(sparsity: tuple[float, ...], kv_shared: int) -> tuple[str, ...]:
    """`layer_kinds` of a Gemma 3n stack, once per layout (every estimate asks). The last
    `kv_shared` layers share, unless that is every layer (`is_kv_shared_layer`)."""
    first_shared = len(sparsity) - kv_shared if 0 < kv_shared < len(sparsity) else len(sparsity)
    return tuple(
        _GEMMA3N_KIND[value > 0, index >= first_shared] for index, value in enumerate(sparsity)
    )


@lru_cache(maxsize=256)
def _sparse_flags(sparsity: tuple[float, ...]) -> tuple[bool, ...]:
    """Which layers are activation-sparse, once per layout (`_build_stack` groups by it)."""
    return tuple(value > 0 for value in sparsity)


#: Why `check_stack` refuses a shape ("" where it does not).
_REFUSAL: Memo[str] = Memo("hybrid-refusal")


def check_stack(shape: ModelShape, field: str) -> None:
    """Refuse a stack the fit was not traced with: a layer type it never traced, or other
    first and last layers (their moments are not in the fit). Decided once per shape
    (every estimate asks); each refusal is a new error, so no traceback grows."""
    refusal = _REFUSAL.get(shape)
    if refusal is None:
        refusal = _REFUSAL.put(shape, _refusal(shape) or "")
    if refusal:
        raise SpecError(field, refusal)


def _refusal(shape: ModelShape) -> str | None:
    """Why `check_stack` refuses the stack, None if it does not."""
    family = fit_family(shape)
    first, last, middle = STACKS[family]
    kinds = layer_kinds(shape) or ()
    traced = {first, last, *middle}
    unfitted = sorted(set(kinds) - traced)
    if unfitted:
        return (
            f"calibrated fits {family} stacks of {', '.join(sorted(traced))} layers, "
            f"this one has {', '.join(unfitted)} layers too; use the analytic, unsloth or "
            "trace profile"
        )
    if family == "gemma3n" and shape.lm_head_params:
        return (
            "calibrated fits gemma3n with its LM head tied to the embedding, as Google's "
            "models are; this one unties it (tie_word_embeddings false): use the analytic, "
            "unsloth or trace profile"
        )
    if family == "qwen3_next" and not all(layer.moe for layer in shape.layers):
        return (
            "calibrated fits qwen3_next stacks with experts in every layer, this one has "
            "dense MLP layers (mlp_only_layers or decoder_sparse_step); use the analytic, "
            "unsloth or trace profile"
        )
    if not kinds or kinds[0] != first or kinds[-1] != last:
        return (
            f"calibrated fits {family} stacks whose first layer is {first} and "
            f"last is {last}, this one runs {kinds[0] if kinds else 'none'} ... "
            f"{kinds[-1] if kinds else 'none'}; use the analytic, unsloth or trace profile"
        )
    return None


def _mlp_width(layer: Layer) -> int:
    """The MLP width of a layer (an MoE layer's: its shared expert's; 0: it has none)."""
    for lin in layer.linears:
        if lin.name in _MLP_NAMES and not lin.expert:
            return lin.out_features
    return 0


def _scan_terms(shape: ModelShape, b: int, s: int) -> list[int]:
    """SCAN_FEATURES of a scanning layer. A Gated DeltaNet's map onto Mamba-2's: its value
    width as D, its convolution's channels as C, its value heads as Hs, the key head width as
    N (keys are repeated to the value heads, and each head's state is key x value wide) and
    chunks of DELTANET_CHUNK tokens. A Mamba-1 scan's (the module docstring): its inner width
    as D, x_proj's output (dt, B, C) as C, no heads and no chunks, and its whole-sequence
    tensors (t·D·N) in the place of B and C repeated to the heads."""
    d = shape.dims
    t = b * s
    if d.mamba1 is not None:
        m = d.mamba1
        return [t * m.inner, t * (m.dt_rank + 2 * m.state_size), 0, 0,
                t * m.inner * m.state_size, 0, b * m.inner * m.state_size]  # fmt: skip
    if d.ssm is not None:
        ssm = d.ssm
        c, heads, state, inner, conv = (ssm.chunk_size, ssm.num_heads, ssm.state_size,
                                        ssm.inner, ssm.conv_dim)  # fmt: skip
    elif d.deltanet is not None:
        g = d.deltanet
        c, heads, state, inner, conv = (DELTANET_CHUNK, g.num_v_heads, g.head_k_dim,
                                        g.value_dim, g.conv_dim)  # fmt: skip
    else:
        return _NO_SCAN
    tp = b * -(-s // c) * c
    return [t * inner, t * conv, t * heads, tp * heads * c, tp * heads * state,
            tp * inner * state // c, b * inner * state]  # fmt: skip


def _moe_widths(layer: Layer, shape: ModelShape) -> tuple[list[int], int]:
    """(MOE_FEATURES of one layer per token, its expert stacks W_E): zeros without experts."""
    experts = [lin for lin in layer.linears if lin.expert]
    if not experts:
        return [0] * len(MOE_FEATURES), 0
    d = shape.dims
    k = d.experts_per_token
    width = d.moe_latent_size or d.hidden_size
    inner = d.moe_intermediate_size or d.intermediate_size
    stacks = 2 * sum(lin.weight_params for lin in experts)
    return [k * width, k * inner, d.num_experts, 0, d.moe_latent_size or 0], stacks


def _per_layer_input_gradients(shape: ModelShape, settings: TrainingSettings) -> tuple[int, int]:
    """(a layer's share of the gradients of Gemma 3n's per-layer inputs: its slice of the
    table and of the projection to them, the whole table's gradients): what a full
    fine-tune trains there."""
    d = shape.dims
    if settings.method is not Method.FULL or not d.altup_num_inputs:
        return 0, 0  # Gemma 3n's alone (another family's config may carry the field)
    elem = 4 if settings.precision is Precision.FP32 else 2
    p, vocab = d.hidden_size_per_layer_input, d.vocab_size_per_layer_input
    return (vocab + d.hidden_size) * p * elem, len(shape.layers) * vocab * p * elem


def _altup_widths(shape: ModelShape, mlp: int, sparse: bool) -> list[int]:
    """ALTUP_FEATURES of one layer per token, G_p aside (zeros but in Gemma 3n)."""
    d = shape.dims
    if not d.altup_num_inputs:
        return [0] * len(ALTUP_FEATURES)
    h, p, rank = d.hidden_size, d.hidden_size_per_layer_input, d.laurel_rank
    return [h * d.altup_num_inputs, mlp if sparse else 0, p, rank, 0]


def _has_kv(layer: Layer) -> bool:
    """Whether an attention layer computes its own k/v (Gemma 3n's kv-shared layers do not)."""
    return any(lin.name == "k_proj" for lin in layer.linears)


#: Where `features` fills in what the settings decide, in HYBRID_LAYER_FEATURES ...
_LAYER = {name: i for i, name in enumerate(HYBRID_LAYER_FEATURES)}
_L_INPUTS, _L_RANKS, _L_GRADS, _L_SCAN, _L_G_P = (
    _LAYER["t*A"], _LAYER["t*R"], _LAYER["G_layer"], _LAYER[SCAN_FEATURES[0]], _LAYER["G_p"]
)  # fmt: skip
#: ... and in HYBRID_LOCAL_FEATURES.
_LOCAL = {name: i for i, name in enumerate(HYBRID_LOCAL_FEATURES)}
_O_INPUTS, _O_RANKS, _O_LOGITS, _O_MASK, _O_HEAD, _O_EMBED, _O_GRADS, _O_DEQUANT, _O_SCAN = (
    _LOCAL[name]
    for name in ("t*A", "t*R", "t*V", "b*s2", "G_head", "G_embed", "G_layer", "D", SCAN_FEATURES[0])
)
_SCAN_SPAN = len(SCAN_FEATURES)
#: Where the layers' summed gradient bytes sit in HYBRID_LAYER_FEATURES: the calibrated
#: profile shards them under FSDP (`calibrated._holds_layer_gradients`).
LAYER_GRADIENTS = _L_GRADS


@dataclass(frozen=True, slots=True)
class _Stack:
    """What `features` needs of a stack that no training setting changes, summed over its
    layers once per shape. Every feature is t times a width, a constant, the scan's terms
    (alike in every scanning layer), or a layer's static parts, so an estimate multiplies a
    few sums instead of building each group of layers' vector (exact: integers)."""

    per_token: tuple[int, ...]  # HYBRID_LAYER_FEATURES' widths, summed over the layers
    constant: tuple[int, ...]  # their constants: the expert stacks, the "1"
    scanned: int  # layers that run the scan
    altup_layers: int  # layers that carry G_p (Gemma 3n's: every one)
    parts: tuple[tuple[int, int], ...]  # (index in `Static.layer_parts`, how many layers)
    end_per_token: tuple[int, ...]  # HYBRID_LOCAL_FEATURES' widths, the end layers' largest
    end_constant: tuple[int, ...]
    end_scanned: bool  # whether the first or the last layer runs the scan
    end_parts: tuple[int, ...]  # the first and the last layer's indexes in `layer_parts`


def _by_name(
    index: dict[str, int], widths: dict[str, int], moe: list[int], altup: list[int]
) -> list[int]:
    """A per-token width vector in `index`'s order: the named widths, the MoE and AltUp
    terms in their places, zero elsewhere (the settings' and the scan's, filled per job)."""
    vector = [0] * len(index)
    for name, width in widths.items():
        vector[index[name]] = width
    for names, values in ((MOE_FEATURES, moe), (ALTUP_FEATURES, altup)):
        for name, width in zip(names, values, strict=True):
            vector[index[name]] = width
    return vector


_STACK: Memo[_Stack] = Memo("hybrid-stack")


def _stack(shape: ModelShape) -> _Stack:
    """The shape's `_Stack`, built on its first estimate."""
    cached = _STACK.get(shape)
    if cached is not None:
        return cached
    return _STACK.put(shape, _build_stack(shape))


def _build_stack(shape: ModelShape) -> _Stack:
    """What `_stack` keeps: each layer's widths by name, summed over its group."""
    d = shape.dims
    h = d.hidden_size
    head_dim = d.head_dim or h // d.num_heads
    q, kv, n = d.num_heads * head_dim, d.num_kv_heads * head_dim, d.num_heads
    index = {id(layer): i for i, (layer, _) in enumerate(shape.layer_counts)}
    # Groups of alike layers: (layer, whether its MLP is activation-sparse, how many). Gemma
    # 3n's sparse and dense layers can be one Layer (the same tensors): told apart by index.
    sparsity = d.activation_sparsity
    flags = _sparse_flags(sparsity) if sparsity else (False,) * len(shape.layers)
    if sparsity:
        layer_of = {id(layer): layer for layer in shape.layers}
        counted = Counter(zip(map(id, shape.layers), flags, strict=True))
        groups = [(layer_of[key], sparse, count) for (key, sparse), count in counted.items()]
    else:
        groups = [(layer, False, count) for layer, count in shape.layer_counts]

    per_token = [0] * len(HYBRID_LAYER_FEATURES)
    stacks = 0
    for layer, sparse, count in groups:
        attn = layer.mixer in _ATTENTION
        mlp = _mlp_width(layer)
        moe, layer_stacks = _moe_widths(layer, shape)
        widths = _by_name(
            _LAYER,
            {"t*h": h, "t*q": q if attn else 0, "t*kv": kv if attn and _has_kv(layer) else 0,
             "t*i": mlp, "t*n": n if attn else 0, "t": 1},
            moe, _altup_widths(shape, mlp, sparse),
        )  # fmt: skip
        per_token = [total + w * count for total, w in zip(per_token, widths, strict=True)]
        stacks += layer_stacks * count
    constant = [0] * len(HYBRID_LAYER_FEATURES)
    constant[_LAYER["W_E"]], constant[_LAYER["1"]] = stacks, len(shape.layers)

    ends = [(shape.layers[i], flags[i]) for i in sorted({0, len(shape.layers) - 1})]
    end_layers = [layer for layer, _ in ends]
    attn_end = any(layer.mixer in _ATTENTION for layer in end_layers)
    kv_end = any(layer.mixer in _ATTENTION and _has_kv(layer) for layer in end_layers)
    # The end layers' transients are the larger of theirs, feature by feature.
    moes = [_moe_widths(layer, shape) for layer in end_layers]
    end_moe = [max(column) for column in zip(*(moe for moe, _ in moes), strict=True)]
    end_altup = [
        max(column)
        for column in zip(
            *(_altup_widths(shape, _mlp_width(lay), sparse) for lay, sparse in ends), strict=True
        )
    ]
    end_per_token = _by_name(
        _LOCAL,
        {"t*h": h, "t*q": q if attn_end else 0, "t*kv": kv if kv_end else 0,
         "t*i": max(map(_mlp_width, end_layers)), "t*n": n if attn_end else 0, "t": 1},
        end_moe, end_altup,
    )  # fmt: skip
    end_constant = [0] * len(HYBRID_LOCAL_FEATURES)
    end_constant[_LOCAL["W_E"]] = max(stacks for _, stacks in moes)
    end_constant[_LOCAL["1"]] = 1
    return _Stack(
        per_token=tuple(per_token),
        constant=tuple(constant),
        scanned=sum(count for layer, _, count in groups if layer.mixer in _SCANNED),
        altup_layers=len(shape.layers) if d.altup_num_inputs else 0,
        parts=tuple((index[id(layer)], count) for layer, _, count in groups),
        end_per_token=tuple(end_per_token),
        end_constant=tuple(end_constant),
        end_scanned=any(layer.mixer in _SCANNED for layer in end_layers),
        end_parts=tuple(index[id(layer)] for layer in end_layers),
    )


def features(
    shape: ModelShape, settings: TrainingSettings, static: Static
) -> tuple[list[int], list[int]]:
    """(per-layer features summed over the layers, once-per-step features), in the order of
    HYBRID_LAYER_FEATURES and HYBRID_LOCAL_FEATURES."""
    stack = _stack(shape)
    b, s = settings.batch, settings.lm_seq_len
    t = b * s
    scan = _scan_terms(shape, b, s)
    # `layer_parts` ends with the outer linears' (Gemma 3n's AltUp and per-layer input
    # projections): no layer's, and no feature's (the fit's coefficients absorb them).
    layer_parts = static.layer_parts
    grads = inputs = ranks = 0
    for i, count in stack.parts:
        part = layer_parts[i]
        grads += part[0] * count
        inputs += part[1] * count
        ranks += part[2] * count
    g_p, table = _per_layer_input_gradients(shape, settings)
    summed = [t * w + c for w, c in zip(stack.per_token, stack.constant, strict=True)]
    summed[_L_INPUTS], summed[_L_RANKS], summed[_L_GRADS] = t * inputs, t * ranks, grads
    summed[_L_G_P] = g_p * stack.altup_layers
    if stack.scanned:
        summed[_L_SCAN : _L_SCAN + _SCAN_SPAN] = [v * stack.scanned for v in scan]

    end_grads = end_inputs = end_ranks = 0
    for i in stack.end_parts:
        part = layer_parts[i]
        end_grads += part[0]
        end_inputs += part[1]
        end_ranks += part[2]
    # Gemma 3n: transformers materialises the sliding layers' mask from the window's length
    # on (the full layers' causal mask is sdpa's is_causal); the others as traced.
    window = shape.dims.sliding_window
    mask = 0 if window is not None and s < window else b * s * s
    # The per-layer inputs' table is part of the embedding (`storage`: the LM head's when
    # tied, else the embedding's), but its gradients are G_p's, layer by layer.
    head, embed = static.head_gradients, static.embed_gradients
    if shape.lm_head_params:
        embed -= table
    else:
        head -= table
    once = [t * w + c for w, c in zip(stack.end_per_token, stack.end_constant, strict=True)]
    once[_O_INPUTS], once[_O_RANKS] = t * end_inputs, t * end_ranks
    once[_O_LOGITS] = 0 if settings.loss is Loss.FUSED else t * shape.vocab_size
    once[_O_MASK], once[_O_HEAD], once[_O_EMBED] = mask, head, embed
    once[_O_GRADS], once[_O_DEQUANT] = end_grads, static.dequantized
    if stack.end_scanned:
        once[_O_SCAN : _O_SCAN + _SCAN_SPAN] = scan
    return summed, once
