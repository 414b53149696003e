"""The `calibrated` profile: a fast formula whose coefficients are fitted to traces.

The static part is exact (`storage.static_bytes`: weights, adapters, gradients, optimizer
state and step scratch, tensor by tensor as the trace allocates them). What depends on the
step's data flow is fitted. A moment of the step is a module of the first or last decoder
layer in forward or backward ("backward/last/mlp.down_proj", checkpointing's recomputation
included), the loss ("forward/tail", "backward/tail") or the optimizer step; the bytes live
there beyond the static part are

    dynamic(L) = L x (a . per_layer) + (b . once)

    per_layer: t·h, t·q, t·kv, t·i, t·A, t·R, b·n·s², t·n, t, G_layer, 1
    once:      t·h, t·q, t·kv, t·i, t·A, t·R, t·V, b·n·s², b·s², t·n, t·d, t, s,
               G_head, G_embed, G_layer, D, 1

(t = batch x sequence tokens, h hidden, q = heads x head dim d, kv = k/v width, i = MLP
width, n heads, V vocabulary, A = adapted in_features per layer (PEFT's fp32 input copies),
R = rank x adapted linears per layer, b·n·s² eager attention scores, b·s² a materialised
mask, G_layer gradient bytes of one layer, G_head of the LM head (or the embedding tied to
it) and final norm, present from the loss on, G_embed of an untied embedding, computed last;
D a dequantised 4-bit weight). `a` is fitted to the difference of traces at 2 and 3 layers
(what one layer adds), `b` to what is left at 0 layers, so depth extrapolates as `trace`
does.
One (a, b) per architecture family x method x checkpointing x attention (sdpa, also used for
flash/flex, or eager) x moment; the estimate is the largest moment. Only moments that decide
some sample at 2, 3, 32 or 80 layers (to within 0.2 %) are kept.

`python -m controller.trace.calibrate` regenerates `calibration.json` from traces of shrunk
variants of each family (minutes on 2 cores). Known limits, recorded in the file's `scope`:
fitted on bf16, all-linear LoRA, AdamW; other optimizers change only the exact static part;
fp32 training doubles the fitted 16-bit terms (an approximation); a fused loss drops t·V
(not fitted); mixture-of-experts layers are charged as a dense MLP of `experts_per_token x
expert width` (no trace exists for them: fake tensors cannot route tokens by value).
"""

from __future__ import annotations

import json
from fractions import Fraction
from functools import cache
from importlib import resources
from operator import mul
from typing import Any

from controller.estimator import overheads
from controller.estimator.architecture import ModelShape
from controller.estimator.errors import SpecError
from controller.estimator.result import Estimate
from controller.estimator.settings import (
    Attention,
    Checkpointing,
    Precision,
    TrainingSettings,
)
from controller.estimator.storage import Static, static_bytes

DATA_FILE = "calibration.json"
#: What each decoder layer adds (multiplied by L) and what the step holds once.
LAYER_FEATURES = ("t*h", "t*q", "t*kv", "t*i", "t*A", "t*R", "b*n*s2", "t*n", "t", "G_layer", "1")
LOCAL_FEATURES = (
    "t*h", "t*q", "t*kv", "t*i", "t*A", "t*R", "t*V", "b*n*s2", "b*s2",
    "t*n", "t*d", "t", "s", "G_head", "G_embed", "G_layer", "D", "1",
)  # fmt: skip
OPTIMIZER_KEY = "optimizer/step"
#: Families the data file has no coefficients for are read as this one (as the parser reads
#: an unknown model_type as Llama-style); MoE types map to their dense relative.
DEFAULT_FAMILY = "llama"
FAMILY_ALIASES = {
    "mixtral": "mistral",
    "qwen2_moe": "qwen2",
    "qwen3_moe": "qwen3",
    "gemma3": "gemma3_text",
    "gemma": "gemma2",
    "deepseek_v3": "llama",
    "deepseek_v2": "llama",
    "gpt_oss": "llama",
}


@cache
def calibration() -> dict[str, Any]:
    """The fitted coefficients (package data), read once per process."""
    text = resources.files("controller.estimator").joinpath(DATA_FILE).read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def family_of(model_type: str) -> str:
    families = calibration()["families"]
    name = FAMILY_ALIASES.get(model_type, model_type)
    return name if name in families else DEFAULT_FAMILY


def _dims(shape: ModelShape) -> tuple[int, int, int, int, int]:
    """(q width, kv width, MLP width, heads, head dim) of the model's layers, as traced."""
    d = shape.dims
    head_dim = d.head_dim or d.hidden_size // d.num_heads
    q, kv = d.num_heads * head_dim, d.num_kv_heads * head_dim
    if d.num_experts > 1:
        routed = (d.moe_intermediate_size or d.intermediate_size) * d.experts_per_token
        shared = (d.shared_expert_intermediate_size or d.moe_intermediate_size or 0) * (
            d.n_shared_experts
        )
        mlp = max(routed + shared, d.intermediate_size if d.dense_layers else 0)
    else:
        mlp = d.intermediate_size
    return q, kv, mlp, d.num_heads, head_dim


def features(
    shape: ModelShape, settings: TrainingSettings, static: Static
) -> tuple[list[int], list[int]]:
    """(per-layer, once-per-step) feature vectors of one job, in the order of
    LAYER_FEATURES and LOCAL_FEATURES."""
    b, s = settings.batch, settings.seq_len
    t = b * s
    layers, h, vocab = shape.num_layers, shape.hidden_size, shape.vocab_size
    q, kv, mlp, heads, head_dim = _dims(shape)
    scores = b * heads * s * s if settings.attention is Attention.EAGER else 0
    adapted, ranks = static.lora_inputs // layers, static.lora_ranks // layers
    g_layer = static.layer_gradients
    logits = 0 if settings.fused_loss else t * vocab
    per_layer = [t * h, t * q, t * kv, t * mlp, t * adapted, t * ranks, scores, t * heads, t,
                 g_layer, 1]  # fmt: skip
    once = [t * h, t * q, t * kv, t * mlp, t * adapted, t * ranks, logits, scores, b * s * s,
            t * heads, t * head_dim, t, s, static.head_gradients, static.embed_gradients, g_layer,
            static.dequantized, 1]  # fmt: skip
    return per_layer, once


def dynamic_bytes(
    layers: int, per_layer: list[int], once: list[int], coefficients: list[list[float]]
) -> float:
    """A moment's bytes beyond the static part: L x (per-layer fit) + (once fit)."""
    layer_coefs, local_coefs = coefficients
    return layers * sum(map(mul, layer_coefs, per_layer)) + sum(map(mul, local_coefs, once))


def _coefficients(
    shape: ModelShape, settings: TrainingSettings
) -> dict[str, list[list[float]]]:
    family = calibration()["families"][family_of(shape.model_type)]
    gc = "off" if settings.gradient_checkpointing is Checkpointing.OFF else "on"
    attention = "eager" if settings.attention is Attention.EAGER else "sdpa"
    try:
        keys: dict[str, list[list[float]]] = family[settings.method.value][gc][attention]
    except KeyError:
        raise SpecError(
            "estimator.profile",
            f"calibrated has no coefficients for {settings.method.value}, checkpointing {gc}, "
            f"{attention} attention; regenerate calibration.json",
        ) from None
    return keys


def estimate(shape: ModelShape, settings: TrainingSettings) -> Estimate:
    """The largest fitted moment of the step, plus the constants the trace adds."""
    static = static_bytes(shape, settings)
    per_layer, once = features(shape, settings, static)
    layers = shape.num_layers
    widen = 2 if settings.precision is Precision.FP32 else 1
    accumulating = settings.gradient_accumulation > 1
    best_key, best, best_dynamic = "", -1, 0
    for key, coefs in _coefficients(shape, settings).items():
        dynamic = max(0, round(dynamic_bytes(layers, per_layer, once, coefs))) * widen
        base = static.weights + static.optimizer
        if key == OPTIMIZER_KEY:
            base += static.gradients + static.optimizer_scratch
        elif accumulating:
            base += static.gradients  # the previous micro-batch's gradients are held
        if base + dynamic > best:
            best_key, best, best_dynamic = key, base + dynamic, dynamic
    at_step = best_key == OPTIMIZER_KEY
    gradients = static.gradients if at_step or accumulating else 0
    components = {
        "weights": static.weights,
        "gradients": gradients,
        "optimizer": static.optimizer,
        "optimizer_scratch": static.optimizer_scratch if at_step else 0,
        "activations": best_dynamic,
        "cuda_context": overheads.CUDA_CONTEXT_BYTES,
        "cublas_workspace": overheads.CUBLAS_WORKSPACE_BYTES,
        "allocator_slack": overheads.slack_bytes(best),
    }
    replicated = best_dynamic + sum(components[k] for k in overheads.EXTRAS)
    return Estimate(
        profile="calibrated",
        components=components,
        total_params=static.total_params,
        trainable_params=static.trainable_params,
        sharded_bytes=sum(components.values()) - replicated,
        replicated_bytes=replicated,
        usable_fraction=Fraction(1),
    )


def peak_bytes(shape: ModelShape, settings: TrainingSettings) -> int:
    """The fitted peak of tensor bytes alone (what the trace's `peak_bytes` measures)."""
    est = estimate(shape, settings)
    return est.total_bytes - sum(est.components[k] for k in overheads.EXTRAS)
