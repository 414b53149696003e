"""The calibrated profile's features for hybrid stacks: Mamba-2 or Gated DeltaNet layers
among attention, MLP and MoE layers.

A dense or MoE family's layers are all alike, so the fit charges L x (what one layer adds).
In Nemotron-H each layer is one mixer (Mamba-2, attention or an MLP), so what a layer adds
depends on its type: here the per-layer features are summed over the layers, each computed
for its own type (a Mamba-2 layer has no t·q, an MLP layer no scan), and one coefficient
vector prices them all. That stays linear, so it is fitted as the uniform families are
(`controller.trace.calibrate`), from traces that add one layer of each type to a two-layer
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

Only stacks of the layer types the fit was traced with, whose first and last layers are of
the traced types (their moments are part of the fit), are priced; any other is refused.
"""

from __future__ import annotations

from controller.estimator.analytic import DELTANET_CHUNK
from controller.estimator.architecture import Layer, ModelShape
from controller.estimator.errors import SpecError
from controller.estimator.settings import TrainingSettings
from controller.estimator.storage import Static

#: The Mamba-2 scan's terms, in both lists below (zero for a layer without the scan).
SCAN_FEATURES = ("t*D", "t*C", "t*Hs", "tp*Hs*c", "tp*Hs*N", "tp*D*N/c", "b*D*N")
#: An MoE layer's terms (Nemotron 3, Qwen3-Next), in both lists below (zero without experts).
MOE_FEATURES = ("t*k*w", "t*k*e", "t*E", "W_E", "t*l")
#: What each layer adds, summed over the layers (each by its own type).
HYBRID_LAYER_FEATURES = (
    "t*h", "t*q", "t*kv", "t*i", "t*A", "t*R", "t*n", "t", "G_layer", *SCAN_FEATURES,
    *MOE_FEATURES, "1",
)  # fmt: skip
#: What the step holds once: the loss and the first and last layers' own transients.
HYBRID_LOCAL_FEATURES = (
    "t*h", "t*q", "t*kv", "t*i", "t*A", "t*R", "t*V", "b*s2", "t*n", "t",
    "G_head", "G_embed", "G_layer", "D", *SCAN_FEATURES, *MOE_FEATURES, "1",
)  # fmt: skip
_NO_SCAN = [0] * len(SCAN_FEATURES)
_NO_MOE = [0] * len(MOE_FEATURES)

_ATTENTION = frozenset({"attention", "parallel", "attention_mlp"})
#: Layers whose mixer runs a chunked scan: Mamba-2's, or Qwen3-Next's Gated DeltaNet.
_SCANNED = frozenset({"mamba2", "parallel", "deltanet_mlp"})
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
}


def fit_family(shape: ModelShape) -> str:
    """The fit that prices a hybrid stack: its model type's, or `nemotron_3` for a
    Nemotron-H config with MoE layers (the same model type, other layers)."""
    if shape.model_type == "nemotron_h" and "moe" in (shape.dims.mixers or ()):
        return "nemotron_3"
    return shape.model_type


def check_stack(shape: ModelShape, field: str) -> None:
    """Refuse a stack the fit was not traced with: a layer type it never traced, or other
    first and last layers (their moments are not in the fit)."""
    family = fit_family(shape)
    first, last, middle = STACKS[family]
    mixers = shape.dims.mixers or ()
    traced = {first, last, *middle}
    unfitted = sorted(set(mixers) - traced)
    if unfitted:
        raise SpecError(
            field,
            f"calibrated fits {family} stacks of {', '.join(sorted(traced))} layers, "
            f"this one has {', '.join(unfitted)} layers too; use the analytic, unsloth or "
            "trace profile",
        )
    if family == "qwen3_next" and not all(layer.moe for layer in shape.layers):
        raise SpecError(
            field,
            "calibrated fits qwen3_next stacks with experts in every layer, this one has "
            "dense MLP layers (mlp_only_layers or decoder_sparse_step); use the analytic, "
            "unsloth or trace profile",
        )
    if not mixers or mixers[0] != first or mixers[-1] != last:
        raise SpecError(
            field,
            f"calibrated fits {family} stacks whose first layer is {first} and "
            f"last is {last}, this one runs {mixers[0] if mixers else 'none'} ... "
            f"{mixers[-1] if mixers else 'none'}; use the analytic, unsloth or trace profile",
        )


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
    chunks of DELTANET_CHUNK tokens."""
    d = shape.dims
    t = b * s
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


def _moe_terms(layer: Layer, shape: ModelShape, t: int) -> list[int]:
    """MOE_FEATURES of one layer (zeros without experts)."""
    experts = [lin for lin in layer.linears if lin.expert]
    if not experts:
        return _NO_MOE
    d = shape.dims
    pairs = t * d.experts_per_token
    width = d.moe_latent_size or d.hidden_size
    inner = d.moe_intermediate_size or d.intermediate_size
    stacks = 2 * sum(lin.weight_params for lin in experts)
    return [pairs * width, pairs * inner, t * d.num_experts, stacks, t * (d.moe_latent_size or 0)]


def features(
    shape: ModelShape, settings: TrainingSettings, static: Static
) -> tuple[list[int], list[int]]:
    """(per-layer features summed over the layers, once-per-step features), in the order of
    HYBRID_LAYER_FEATURES and HYBRID_LOCAL_FEATURES."""
    d = shape.dims
    b, s = settings.batch, settings.seq_len
    t, h = b * s, d.hidden_size
    head_dim = d.head_dim or h // d.num_heads
    q, kv, n = d.num_heads * head_dim, d.num_kv_heads * head_dim, d.num_heads
    scan = _scan_terms(shape, b, s)
    summed = [0] * len(HYBRID_LAYER_FEATURES)
    ends: dict[int, tuple[Layer, tuple[int, int, int]]] = {}
    by_id = dict(
        zip(map(id, (lay for lay, _ in shape.layer_counts)), static.layer_parts, strict=False)
    )
    for index in {0, len(shape.layers) - 1}:
        layer = shape.layers[index]
        ends[index] = (layer, by_id[id(layer)])
    for (layer, count), (grads, inputs, ranks) in zip(
        shape.layer_counts, static.layer_parts, strict=False
    ):
        attn = layer.mixer in _ATTENTION
        scanned = layer.mixer in _SCANNED
        vector = [t * h, t * q if attn else 0, t * kv if attn else 0, t * _mlp_width(layer),
                  t * inputs, t * ranks, t * n if attn else 0, t, grads,
                  *(scan if scanned else _NO_SCAN), *_moe_terms(layer, shape, t), 1]  # fmt: skip
        for i, value in enumerate(vector):
            summed[i] += value * count
    end_layers = [layer for layer, _ in ends.values()]
    attn_end = any(layer.mixer in _ATTENTION for layer in end_layers)
    scanned_end = any(layer.mixer in _SCANNED for layer in end_layers)
    end_inputs = sum(parts[1] for _, parts in ends.values())
    end_ranks = sum(parts[2] for _, parts in ends.values())
    end_grads = sum(parts[0] for _, parts in ends.values())
    logits = 0 if settings.fused_loss else t * shape.vocab_size
    end_terms = [_moe_terms(layer, shape, t) for layer in end_layers]
    end_moe = [max(terms) for terms in zip(*end_terms, strict=True)]
    once = [t * h, t * q if attn_end else 0, t * kv if attn_end else 0,
            t * max(map(_mlp_width, end_layers)), t * end_inputs, t * end_ranks, logits,
            b * s * s, t * n if attn_end else 0, t, static.head_gradients,
            static.embed_gradients, end_grads, static.dequantized,
            *(scan if scanned_end else _NO_SCAN), *end_moe, 1]  # fmt: skip
    return summed, once
