"""The calibrated profile's features for hybrid stacks of Mamba-2, attention and MLP layers.

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

Only stacks of the layer types the fit was traced with, whose first and last layers are of
the traced types (their moments are part of the fit), are priced; any other is refused.
"""

from __future__ import annotations

from controller.estimator.architecture import Layer, ModelShape
from controller.estimator.errors import SpecError
from controller.estimator.settings import TrainingSettings
from controller.estimator.storage import Static

#: The Mamba-2 scan's terms, in both lists below (zero for a layer without the scan).
SCAN_FEATURES = ("t*D", "t*C", "t*Hs", "tp*Hs*c", "tp*Hs*N", "tp*D*N/c", "b*D*N")
#: What each layer adds, summed over the layers (each by its own type).
HYBRID_LAYER_FEATURES = (
    "t*h", "t*q", "t*kv", "t*i", "t*A", "t*R", "t*n", "t", "G_layer", *SCAN_FEATURES, "1",
)  # fmt: skip
#: What the step holds once: the loss and the first and last layers' own transients.
HYBRID_LOCAL_FEATURES = (
    "t*h", "t*q", "t*kv", "t*i", "t*A", "t*R", "t*V", "b*s2", "t*n", "t",
    "G_head", "G_embed", "G_layer", "D", *SCAN_FEATURES, "1",
)  # fmt: skip
_NO_SCAN = [0] * len(SCAN_FEATURES)

_ATTENTION = frozenset({"attention", "parallel", "attention_mlp"})
_MAMBA2 = frozenset({"mamba2", "parallel"})
_MLP_NAMES = ("up_proj", "gate_proj")

#: The stacks each fitted family is traced with: (first layer, last layer, the layer types
#: added between them). Nemotron-H's published stacks (8B to 56B, Nano 9B and 12B v2) all
#: begin with a Mamba-2 layer and end with an MLP layer.
STACKS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "nemotron_h": ("mamba2", "mlp", ("mamba2", "attention", "mlp")),
    "falcon_h1": ("parallel", "parallel", ("parallel",)),
}


def check_stack(shape: ModelShape, field: str) -> None:
    """Refuse a stack the fit was not traced with: a layer type it never traced (Nemotron
    3's MoE layers), or other first and last layers (their moments are not in the fit)."""
    first, last, middle = STACKS[shape.model_type]
    mixers = shape.dims.mixers or ()
    traced = {first, last, *middle}
    unfitted = sorted(set(mixers) - traced)
    if unfitted:
        raise SpecError(
            field,
            f"calibrated fits {shape.model_type} stacks of {', '.join(sorted(traced))} layers, "
            f"this one has {', '.join(unfitted)} layers too; use the analytic, unsloth or "
            "trace profile",
        )
    if not mixers or mixers[0] != first or mixers[-1] != last:
        raise SpecError(
            field,
            f"calibrated fits {shape.model_type} stacks whose first layer is {first} and "
            f"last is {last}, this one runs {mixers[0] if mixers else 'none'} ... "
            f"{mixers[-1] if mixers else 'none'}; use the analytic, unsloth or trace profile",
        )


def _mlp_width(layer: Layer) -> int:
    """The MLP width of a layer (0: it has none)."""
    for lin in layer.linears:
        if lin.name in _MLP_NAMES:
            return lin.out_features
    return 0


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
    ssm = d.ssm
    scan = _NO_SCAN
    if ssm is not None:
        c = ssm.chunk_size
        tp = b * -(-s // c) * c
        heads, state = ssm.num_heads, ssm.state_size
        scan = [t * ssm.inner, t * ssm.conv_dim, t * heads, tp * heads * c,
                tp * heads * state, tp * ssm.inner * state // c, b * ssm.inner * state]  # fmt: skip
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
        mamba = layer.mixer in _MAMBA2
        vector = [t * h, t * q if attn else 0, t * kv if attn else 0, t * _mlp_width(layer),
                  t * inputs, t * ranks, t * n if attn else 0, t, grads,
                  *(scan if mamba else _NO_SCAN), 1]  # fmt: skip
        for i, value in enumerate(vector):
            summed[i] += value * count
    end_layers = [layer for layer, _ in ends.values()]
    attn_end = any(layer.mixer in _ATTENTION for layer in end_layers)
    mamba_end = any(layer.mixer in _MAMBA2 for layer in end_layers)
    end_inputs = sum(parts[1] for _, parts in ends.values())
    end_ranks = sum(parts[2] for _, parts in ends.values())
    end_grads = sum(parts[0] for _, parts in ends.values())
    logits = 0 if settings.fused_loss else t * shape.vocab_size
    once = [t * h, t * q if attn_end else 0, t * kv if attn_end else 0,
            t * max(map(_mlp_width, end_layers)), t * end_inputs, t * end_ranks, logits,
            b * s * s, t * n if attn_end else 0, t, static.head_gradients,
            static.embed_gradients, end_grads, static.dequantized,
            *(scan if mamba_end else _NO_SCAN), 1]  # fmt: skip
    return summed, once
