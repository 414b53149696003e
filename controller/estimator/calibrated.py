"""The `calibrated` profile: a fast formula whose coefficients are fitted to traces.

The static part is exact (`storage.static_bytes`: weights, adapters, gradients, optimizer
state and step scratch, tensor by tensor as the trace allocates them). What depends on the
step's data flow is fitted. A moment of the step is a module of the first or last decoder
layer in forward or backward ("backward/last/mlp.down_proj", checkpointing's recomputation
included), the loss ("forward/tail", "backward/tail") or the optimizer step; the bytes live
there beyond the static part are

    dynamic(L) = L x (a . per_layer) + (b . once)

    per_layer: t·h, t·q, t·kv, t·i, t·A, t·R, b·n·s², t·n, t, G_layer, t·k·h, t·k·e,
               t·E, W_E, t·r, 1
    once:      t·h, t·q, t·kv, t·i, t·A, t·R, t·V, b·n·s², b·s², t·n, t·d, t, s,
               G_head, G_embed, G_layer, D, t·k·h, t·k·e, t·E, W_E, t·r, 1

(t = batch x sequence tokens, h hidden, q = heads x head dim d, kv = k/v width, i = MLP
width, n heads, V vocabulary, A = adapted in_features per layer (PEFT's fp32 input copies),
R = rank x adapted linears per layer, b·n·s² eager attention scores, b·s² a materialised
mask, G_layer gradient bytes of one layer, G_head of the LM head (or the embedding tied to
it) and final norm, present from the loss on, G_embed of an untied embedding, computed last;
D a dequantised 4-bit weight; in an MoE layer, t·k token-expert pairs of k experts each of
width e, E experts whose router scores every token, W_E the 16-bit bytes of the layer's
expert stacks, which PEFT's LoRA folds into a new stack and QLoRA dequantises; i is then
the width of the shared expert, if any; with multi-head latent attention, q = n x (nope +
rope head dims), kv = n x (nope + v head dims) and r = q rank + kv rank + rope head dim, the
latent widths). `a` is fitted to the difference of traces at 2 and 3 layers
(what one layer adds), `b` to what is left at 0 layers, so depth extrapolates as `trace`
does.
One (a, b) per architecture family x method x checkpointing x attention (sdpa, also used for
flash/flex, or eager) x moment; the estimate is the largest moment. Only moments that decide
some sample at 2, 3, 32 or 80 layers (to within 0.2 %) are kept.

Data parallelism (`Estimate.fsdp_moments`, `Estimate.ddp_bytes`): what a rank of an FSDP2
job holds beyond its shards is structural, not fitted: FSDP2's schedule says which
parameters and gradients are unsharded at each moment (`_fsdp_unsharded`, `_fsdp_only`), and
their bytes are exact (`Static.root_weights`, `Static.layer_weights`, the gradients'); the
fitted part of every moment (activations, buffers) is the single-GPU fit's, each GPU's own.
A DDP rank holds the single-GPU job plus its gradient buckets (`Static.gradients`).
Assumed: FSDP2 defaults (reshard after forward, implicit prefetch, no mixed-precision
policy: parameters gathered in their own dtypes), DDP without gradient_as_bucket_view.
`python -m benchmarks.per_gpu_vs_trace` checks both against
`controller.trace.distributed.trace_distributed_run` at 1 to 64 ranks, per moment. The
caching allocator's reserve on such a rank is its own share (`allocator_share` with the
parallelism, measured on ranks traced at their world size), not the single-GPU one.

`python -m controller.calibration.calibrate` regenerates `calibration.json` from traces of shrunk
variants of each family (about half an hour on 2 cores). Known limits, recorded in the
file's `scope`: fitted on bf16, all-linear LoRA, AdamW; other optimizers change only the
exact static part; fp32 training doubles the fitted 16-bit terms (an approximation); the
trainer's switches (`frameworks.json`) adjust the fitted moments (`_Switched`: a fused loss
drops t·V, a chunked one keeps part of it, offloaded activations keep one layer's, and the
last layer's backward the plain-loss fits did not keep is built from theirs), checked
against traces of those switches, not fitted to them; an MoE model's dense layers
(DeepSeek's first three) are charged as MoE layers (their MLP is about as wide as the routed
experts and the shared one together).

Stacks whose layers are not alike (Nemotron-H's Mamba-2, attention and MLP layers;
Nemotron 3's Mamba-2, attention and MoE layers; Falcon-H1's attention beside Mamba-2;
Qwen3-Next's Gated DeltaNet and gated attention, each with an MoE; Gemma 3n's
activation-sparse, dense and kv-shared layers, each with AltUp, LAuReL and a per-layer
input; Jamba's Mamba-1 and attention layers, each dense or MoE) are priced from a section of
their own in the file (`hybrid`, written by `python -m controller.calibration.calibrate_hybrid`):
the per-layer features summed over the layers, each by its own type, with the scans', the
MoE layers' and Gemma 3n's terms (`hybrid_fit.py`). A hybrid the file has no fit for is
refused (UNFITTED_HYBRID), and so are stacks of layer types or ends a fit never traced
(`hybrid_fit.check_stack`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction
from functools import cache
from importlib import resources
from operator import mul
from typing import Any

from controller.estimator import frameworks, hybrid_fit, overheads
from controller.estimator.errors import SpecError
from controller.estimator.frozen import assemble
from controller.estimator.model import ModelShape
from controller.estimator.model.families import FAMILIES
from controller.estimator.model.generic import generic_fit
from controller.estimator.result import NCCL_BYTES, Estimate
from controller.estimator.settings import (
    DEFAULT_SWITCHES,
    Attention,
    Checkpointing,
    KbitPreparation,
    Loss,
    Method,
    Offloading,
    Optimizer,
    Parallelism,
    Precision,
    TrainingSettings,
)
from controller.estimator.storage import Static, block, static_bytes, upcast_bytes

DATA_FILE = "calibration.json"
#: What each decoder layer adds (multiplied by L) and what the step holds once.
LAYER_FEATURES = (
    "t*h", "t*q", "t*kv", "t*i", "t*A", "t*R", "b*n*s2", "t*n", "t", "G_layer",
    "t*k*h", "t*k*e", "t*E", "W_E", "t*r", "1",
)  # fmt: skip
LOCAL_FEATURES = (
    "t*h", "t*q", "t*kv", "t*i", "t*A", "t*R", "t*V", "b*n*s2", "b*s2",
    "t*n", "t*d", "t", "s", "G_head", "G_embed", "G_layer", "D",
    "t*k*h", "t*k*e", "t*E", "W_E", "t*r", "1",
)  # fmt: skip
OPTIMIZER_KEY = "optimizer/step"
#: Families the parser reads that the data file has no coefficients for are priced as this
#: one (as the parser reads a config naming no model_type as Llama's; it refuses a type it
#: does not know); close relatives map to the family fitted.
DEFAULT_FAMILY = "llama"
FAMILY_ALIASES = {
    "qwen2_moe": "qwen3_moe",
    "gemma3": "gemma3_text",
    "gemma": "gemma2",
    "deepseek_v2": "deepseek_v3",
    # Not fitted: read as the fitted family of the closest layout. Kimi K2 is DeepSeek-V3's
    # code at another size (the trace builds it as that class, `trace.build.BUILT_AS`, and
    # tests/unit/estimator/test_calibrated.py holds it to the trace at its real widths); DBRX
    # Mixtral's (routed experts only; its expert loop cannot be traced); Llama 4 GQA with
    # routed and one shared expert, as Qwen-MoE (PEFT's all-linear LoRA breaks on its
    # router): approximations, not held to the 5 % of the fitted families.
    "kimi_k2": "deepseek_v3",
    "dbrx": "mixtral",
    "llama4_text": "qwen3_moe",
    "llama4": "qwen3_moe",
}


# Enum members bound once: under Python 3.11 reading one off its class costs ~0.1 us.
_OFF, _EAGER, _FP32 = Checkpointing.OFF, Attention.EAGER, Precision.FP32
_FUSED, _CHUNKED, _PLAIN, _CPU = Loss.FUSED, Loss.CHUNKED, Loss.PLAIN, Offloading.CPU
_ON, _ADAMW, _NO_OFFLOAD = Checkpointing.ON, Optimizer.ADAMW, Offloading.NONE
_FP32_BYTES = 4
#: The logits feature's place in the once-per-step vector, uniform and hybrid.
_LOGITS = LOCAL_FEATURES.index("t*V")
#: Bytes per logit a chunked loss holds for every chunk until backward: the fp32 output of
#: each chunk's log-softmax, which autograd saves (eager mode; the trace measures it,
#: tests/unit/trace/test_trace_loss.py).
SAVED_LOGIT_BYTES = 4


def _per_token(names: tuple[str, ...]) -> tuple[bool, ...]:
    """Which per-layer features are a layer's per-token activations (`t*...`, `b*...`), as
    against its static parts (gradients, expert stacks, constants)."""
    return tuple(name.startswith(("t", "b")) for name in names)


_LAYER_ACTIVATIONS = _per_token(LAYER_FEATURES)


#: How a trainer's k-bit preparation widens the once-per-step features (`_upcast`): the
#: hidden-wide tensors of the layer being worked on (the fp32 residual, its normed copy, the
#: 4-bit projections' outputs) twice; the MLP-wide ones half again (gate, up, activation and
#: product fp32, the copy bitsandbytes casts for the down projection 16-bit); attention's
#: core, LoRA's rank-wide tensors and its input copies (16-bit under autocast where the
#: fits saw PEFT's fp32 copies) as they were. Checked against traces of the switch
#: (Mistral-7B with attention-only LoRA, Llama-3.1-8B, Qwen2.5-0.5B and -7B all-linear):
#: the traced increase +1 % to +8 %; t·h alone twice, t·i as it was, missed it by up to
#: 14 %.
_ONCE_WIDEN = {"t*h": 2.0, "t*i": 1.5}


def _widened(names: tuple[str, ...], once: bool = False) -> tuple[float, ...]:
    """Per feature, how a trainer's k-bit preparation widens it (`_upcast`): per layer, the
    per-token activations (`t*...`: what a layer saves, its checkpoint first) twice, but
    not the logits (`t*V`: 16-bit under the trainer's autocast), eager scores or a mask
    (`b*...`) or the per-token constants (`t`); once per step, `_ONCE_WIDEN`."""
    if once:
        return tuple(_ONCE_WIDEN.get(name, 1.0) for name in names)
    return tuple(2.0 if name.startswith("t*") and name != "t*V" else 1.0 for name in names)


_WIDE_LAYER, _WIDE_LOCAL = _widened(LAYER_FEATURES), _widened(LOCAL_FEATURES, True)
_WIDE_HYBRID_LAYER = _widened(hybrid_fit.HYBRID_LAYER_FEATURES)
_WIDE_HYBRID_LOCAL = _widened(hybrid_fit.HYBRID_LOCAL_FEATURES, True)
_HYBRID_ACTIVATIONS = _per_token(hybrid_fit.HYBRID_LAYER_FEATURES)
_HYBRID_LOGITS = hybrid_fit.HYBRID_LOCAL_FEATURES.index("t*V")
_HEAD = LOCAL_FEATURES.index("G_head")
_HYBRID_HEAD = hybrid_fit.HYBRID_LOCAL_FEATURES.index("G_head")
#: The moment of the loss's backward.
LOSS_BACKWARD_KEY = "backward/tail"
#: The moment `_Switched.last_layer_backward` builds for a chunked or fused loss.
LAST_LAYER_KEY = "backward/last (from the loss's and the first layer's fits)"


def chunked_logit_bytes(per_logit: float) -> float:
    """A moment's bytes per logit under a chunked loss, from the plain loss's fitted
    `per_logit` (about 12 at the loss's backward: the fp32 copy, its saved log-softmax, the
    gradients in fp32 and 16 bits): what each chunk's cross-entropy saves for backward is
    held for every chunk (`SAVED_LOGIT_BYTES`), the rest for one chunk of the tokens at a
    time (`frameworks.loss_chunks`). At 12 that is 4 + 8/8 = 5, which is what the traced
    chunked loss holds at the loss's backward."""
    whole = min(per_logit, SAVED_LOGIT_BYTES) if per_logit > 0 else per_logit
    return whole + (per_logit - whole) / frameworks.loss_chunks()


@cache
def calibration() -> dict[str, Any]:
    """The fitted coefficients (package data), read once per process."""
    text = resources.files("controller.estimator").joinpath(DATA_FILE).read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def _fit_of(shape: ModelShape, settings: TrainingSettings) -> str:
    """The fitted family that prices `shape`: `family_of` its type for a hand-read family,
    the closest fitted structure for one read generically (`model.generic.GENERIC_FITS`,
    which looks at whether the job's adapters reach an MoE's expert stacks)."""
    if shape.model_type in FAMILIES:
        return family_of(shape.model_type)
    return generic_fit(shape, settings.targets if settings.is_adapter else None)


def family_of(model_type: str) -> str:
    """The fitted family whose coefficients price `model_type`: its own when the data file
    has them, else its alias's, else the default."""
    families = calibration()["families"]
    if model_type in families:
        return model_type
    name = FAMILY_ALIASES.get(model_type, model_type)
    return name if name in families else DEFAULT_FAMILY


def _dims(shape: ModelShape) -> tuple[int, int, int, int, int, int]:
    """(q width, kv width, dense MLP width, heads, head dim, latent width) of the model's
    layers: an MoE layer's dense MLP is its shared expert (Qwen's of its own width,
    DeepSeek's n_shared experts wide), if any; latent attention's widths as in the module
    docstring."""
    d = shape.dims
    head_dim = d.head_dim or d.hidden_size // d.num_heads
    q, kv = d.num_heads * head_dim, d.num_kv_heads * head_dim
    latent = 0
    if d.kv_lora_rank is not None:
        nope, rope = d.qk_nope_head_dim or 0, d.qk_rope_head_dim or 0
        q, kv = d.num_heads * (nope + rope), d.num_heads * (nope + (d.v_head_dim or 0))
        latent = (d.q_lora_rank or 0) + d.kv_lora_rank + rope
    if d.num_experts > 1:
        mlp = d.shared_expert_intermediate_size or (
            (d.moe_intermediate_size or d.intermediate_size) * d.n_shared_experts
        )
    else:
        mlp = d.intermediate_size
    return q, kv, mlp, d.num_heads, head_dim, latent


def _moe(shape: ModelShape, t: int, static: Static) -> list[int]:
    """t·k·h, t·k·e, t·E, W_E of an MoE model's layers (zeros for a dense model)."""
    d = shape.dims
    if d.num_experts <= 1:
        return [0, 0, 0, 0]
    pairs = t * d.experts_per_token
    width = d.moe_intermediate_size or d.intermediate_size
    return [pairs * d.hidden_size, pairs * width, t * d.num_experts, static.expert_stacks]


def features(
    shape: ModelShape, settings: TrainingSettings, static: Static
) -> tuple[list[int], list[int]]:
    """(per-layer, once-per-step) feature vectors of one job, in the order of
    LAYER_FEATURES and LOCAL_FEATURES."""
    b, s = settings.batch, settings.lm_seq_len
    t = b * s
    layers, h, vocab = shape.num_layers, shape.hidden_size, shape.vocab_size
    q, kv, mlp, heads, head_dim, latent = _dims(shape)
    scores = b * heads * s * s if settings.attention is _EAGER else 0
    adapted, ranks = static.lora_inputs // layers, static.lora_ranks // layers
    g_layer = static.layer_gradients
    logits = 0 if settings.loss is _FUSED else t * vocab
    moe = _moe(shape, t, static)
    per_layer = [t * h, t * q, t * kv, t * mlp, t * adapted, t * ranks, scores, t * heads, t,
                 g_layer, *moe, t * latent, 1]  # fmt: skip
    once = [t * h, t * q, t * kv, t * mlp, t * adapted, t * ranks, logits, scores, b * s * s,
            t * heads, t * head_dim, t, s, static.head_gradients, static.embed_gradients, g_layer,
            static.dequantized, *moe, t * latent, 1]  # fmt: skip
    return per_layer, once


def dynamic_bytes(
    layers: int, per_layer: list[int], once: list[int], coefficients: list[list[float]]
) -> float:
    """A moment's bytes beyond the static part: L x (per-layer fit) + (once fit)."""
    layer_coefs, local_coefs = coefficients
    total: float = layers * sum(map(mul, layer_coefs, per_layer)) + sum(map(mul, local_coefs, once))
    return total


#: One moment's fit as `estimate` walks it: (key, at the optimizer step, a, b, whether the
#: moment holds the decoder layers' gradients: `_holds_layer_gradients`, and how many of the
#: root's and of a block's parameters FSDP2 holds unsharded then: `_fsdp_unsharded`).
_Moment = tuple[str, bool, tuple[float, ...], tuple[float, ...], bool, int, int]


def _fsdp_unsharded(key: str) -> tuple[int, int]:
    """(root copies, block copies) each rank of an FSDP2 job holds unsharded at a moment,
    beyond its shards. Structural, from FSDP2's schedule (`fully_shard` on every block, then
    on the root; `reshard_after_forward=True`, implicit prefetch), and what the distributed
    trace (`controller.trace.distributed`) shows at every moment of the step:

    * the root's parameters (embedding, final norm, LM head) are all-gathered as forward
      starts, resharded after forward and gathered again as backward starts, then held to
      its end: one copy at every moment but the optimizer step's, two at forward's start
      (the all-gather output and the parameters copied out of it) with the first block's;
      at the loss's backward an untied root's all-gather output is still held beside its
      copies, and the last block not yet gathered (`_UNTIED_TAIL`: read off the
      distributed trace, where a tied root's output is already freed and the last block
      gathered; priced as the larger of the two, where a block outweighs the root);
    * a block's parameters are all-gathered before it runs and resharded after it: in a
      block, in forward and in backward, that block's and the next one's (forward's
      all-gather of the next block, backward's prefetch of the previous one), two; after
      the last block of forward, through the loss and into the last block's backward, one
      (the last block, not resharded: backward needs it first); in backward's first layer
      (the last one backward runs) one, there is none left to prefetch;
    * gradients: the block's unsharded ones and the reduce-scatter input still held are
      already in the fits' replicated part (the layer being worked on and the one before,
      `_holds_layer_gradients`), the root's whole until backward ends (G_head, G_embed);
    * the optimizer step works on the shards alone.

    Two moments of FSDP2's own, which no single-GPU fit keeps (`_fsdp_only`): forward's
    start, and the embedding's backward at the end of backward.
    """
    if key == OPTIMIZER_KEY:
        return 0, 0
    if key.endswith("/tail") or "/tail/" in key or key.startswith("backward/first/"):
        return 1, 1
    return 1, 2


#: The loss's backward, where an untied root holds two copies and no block (`_fsdp_unsharded`).
_UNTIED_TAIL = "backward/tail"

#: The moments only an FSDP2 rank has, in the order `_fsdp_only` gives them.
FSDP_ONLY_KEYS = ("forward/head", "backward/embedding", "backward/layer")


def _fsdp_only(
    shape: ModelShape, settings: TrainingSettings, static: Static, base: int
) -> tuple[tuple[int, int], ...]:
    """(sharded, replicated) of the moments where an FSDP2 rank holds the most that a
    single GPU does not, each structural (`controller.calibration.check_distributed`
    holds them to the distributed trace):

    * forward's start: the root's all-gather output and the parameters copied out of it
      (two root copies) and the first block gathered, over the embedding's output and the
      batch (input ids, mask, labels: int64);
    * full fine-tuning, backward's end (the embedding's backward): the root's parameters
      and its gradients whole (LM head, final norm, an untied embedding's: FSDP2
      reduce-scatters the root's when backward ends), the first block's gradients waiting
      for their reduce-scatter, every other block's sharded; a tied embedding's backward
      makes a new gradient of the embedding's size and their sum, two more copies;
    * full fine-tuning, a block's backward: the root's parameters, the block and the
      prefetched one, the LM head's gradients (whole until backward ends), the block's own
      gradients and the previous block's awaiting their reduce-scatter; the blocks done
      sharded. (The block's activations and working buffers, tens of MiB, are left out.)
    """
    t = settings.batch * settings.lm_seq_len
    elem = 4 if settings.precision is _FP32 else 2
    root, block = static.root_weights, static.layer_weights
    batch = 3 * -(-t * 8 // 512) * 512
    head = (base, 2 * root + block + t * shape.hidden_size * elem + batch)
    if settings.is_adapter:
        return (head,)
    root_grads = static.head_gradients + static.embed_gradients
    layers = static.gradients - root_grads
    tied = 2 * static.head_gradients if not static.embed_gradients else 0
    end = (base + layers, root + root_grads + static.layer_gradients + tied)
    g_layer = static.layer_gradients
    inner = (base + layers - 2 * g_layer, root + 2 * block + static.head_gradients + 2 * g_layer)
    return head, end, inner


def _holds_layer_gradients(key: str) -> bool:
    """Whether a moment comes after backward has made the decoder layers' gradients: the
    first layer's backward, which follows every other layer's. FSDP shards them (each layer's
    are reduce-scattered once its backward is done), so each GPU holds 1/n of them; the rest
    of the moment's fitted dynamic part is each GPU's own: activations, working buffers, the
    gradients of the layer being worked on and of the one still being reduce-scattered, and
    the head's and the embedding's, which FSDP's root unit (the layers are the units it
    wraps) reduce-scatters only when backward ends. The fits have gradient terms of their
    own (G_layer, G_head), but where features are nearly proportional (an MoE layer's
    gradients and its expert stacks, W_E) least squares trades one for the other, so the
    split goes by place, never by a fitted coefficient."""
    return key.startswith("backward/first/")


@cache
def allocator_share(
    method: Method, gc: str, parallelism: str = "", real_size: bool = False
) -> tuple[int, int]:
    """What the caching allocator reserves beyond the tensor peak, as a share of what that
    peak holds beyond the weights (the weights are allocated once, each in a segment of its
    own size; the step's transient tensors leave the cached blocks): the median of traced runs
    replayed through the allocator model (`allocator` in the data file,
    `controller.calibration.calibrate_allocator`), per method and checkpointing; the flat
    `overheads.ALLOCATOR_SLACK` of the whole peak for a file without that section (weights
    included, as it was charged before). As (numerator, denominator): the estimate
    multiplies in integers.

    `parallelism` "fsdp" or "ddp": the share one rank of that parallelism on two or more
    GPUs was traced to reserve beyond what it holds past its own weights (`parallel` in the
    section; FSDP2's collectives allocate on streams of their own, whose cached blocks the
    compute stream does not reuse); (-1, 1) where the file has none, and the single-GPU
    share stands.

    `real_size`: the one-GPU share of hand-read models of 3 to 30 B traced at their whole
    depth with checkpointing on (`real_size` in the section), charged to a family read
    generically; the small models' share where the file has none (checkpointing off, and
    full fine-tuning, which goes by `backward_share`). A dense model's adapters go by
    `adapter_reserve` instead (set up otherwise than its runs, the larger of the two): this
    share alone is an MoE's and a hybrid stack's. With checkpointing on, real-size
    adapters reserve more of what they hold beyond the weights than a 0.5-1 B model's (29-31
    % against 24 %): with the small models' share the generic reading was up to 10 % under
    the trace for QLoRA. With it off they reserved less (5-6 % against 10 %), and the
    generic reading, measured, went further under: it keeps the small models' share there.
    A rank of FSDP2 or DDP keeps its `parallel` share whatever the family."""
    section = calibration().get("allocator", {})
    if parallelism:
        section = section.get("parallel", {}).get(parallelism, {})
    elif (
        real_size
        and gc == "on"
        and f"{method.value}/on" in section.get("real_size", {}).get("groups", {})
    ):
        section = section["real_size"]
    entry = section.get("groups", {}).get(f"{method.value}/{gc}")
    if entry is None:
        return -1, 1
    share = Fraction(str(entry["share"]))
    return share.numerator, share.denominator


@cache
def backward_share(gc: str) -> tuple[int, int] | None:
    """What a real-size full fine-tuning reserves, as a share of what its backward holds
    beyond the weights, the optimizer state and the gradients as the generic reading prices
    it (`backward_transient`): the `real_size` section's `backward` group, charged to a
    family read generically on one GPU. None where the file has none (checkpointing off:
    not measured).

    Full fine-tuning peaks at the optimizer step, and what the allocator cannot reuse there
    is what the backward cached: activation blocks smaller than the step's states and
    scratch. It grows with the batch as the activations do, while the step's own tensors do
    not: traced at real size with checkpointing on, the reserve was 0.5-21 % of what the
    step holds beyond the weights at batch 1 and up to 53 % at batch 4, so no share of that
    is right at both. An MoE set up as the real-size runs were goes by `moe_full_reserve`
    instead (the fit that prices it has a backward that does not follow the batch); any
    other is charged at least the small models' share of the peak (`estimate`)."""
    entry = calibration().get("allocator", {}).get("real_size", {}).get("backward", {})
    found = entry.get(f"full/{gc}") if gc == "on" else None
    if found is None:
        return None
    share = Fraction(str(found["share"]))
    return share.numerator, share.denominator


@cache
def adapter_reserve(gc: str) -> tuple[float, float, float] | None:
    """What a real-size LoRA or QLoRA of a dense family reserves beyond its tensor peak, as
    (bytes per logit, per parameter of the model, per token x hidden unit): the `real_size`
    section's `adapters` fit, charged to a family read generically on one GPU with
    checkpointing on and a dense, not a hybrid, stack; set up otherwise than its runs were
    (`_as_fitted`, `modules_to_save`, a rank above `ADAPTER_FIT_MAX_RANK`), the larger of it
    and `allocator_share`: its terms do not depend on what differs, the share grows with the
    states. None where the file has none.

    A share of the peak cannot follow it. That peak is the loss (the 16-bit logits and two
    fp32 copies); the reserved one comes later, when the backward has cached a block of
    each size it made (the logits' chain, the recomputed layers' hidden-state sized
    tensors) and the optimizer step adds the adapters' states beside them. Traced at 3-14 B,
    the 15 dense models reserved 20-66 % of what the peak holds beyond the weights, the
    most where a small vocabulary sits beside many wide layers, and one share (their median
    with the MoE's runs: `allocator_share`) left Granite-3.3-8B, Phi-2 and Pythia-6.9B
    QLoRA 5-8 % under the trace's NVML figure. The rank enters only through the adapters'
    parameters: traced, Granite-3.3-8B LoRA reserved 1,372 MiB at rank 16 and 1,299 at 64."""
    if gc != "on":
        return None
    entry = calibration().get("allocator", {}).get("real_size", {}).get("adapters", {})
    found = entry.get("on")
    if found is None:
        return None
    return (
        float(found["per_logit"]),
        float(found["per_model_param"]),
        float(found["per_token_hidden"]),
    )


def _as_fitted(settings: TrainingSettings, widen: int, accumulating: bool, upcast: int) -> bool:
    """Whether a job is set up as the real-size runs the fits (`adapter_reserve`,
    `moe_full_reserve`) were traced with: checkpointing on (not Unsloth's), the plain loss,
    16-bit training, AdamW, no gradient accumulation, and no switch that changes one GPU's
    step. FSDP's version and the load path do not (a framework preset that sets only those,
    as Hugging Face's, Axolotl's and LLaMA-Factory's do, is as fitted), nor does `compile`
    (not priced: every estimate is of the eager step) or a k-bit preparation that upcasts
    nothing (`upcast`: its bytes)."""
    switches = settings.switches
    return (
        settings.gradient_checkpointing is _ON
        and settings.loss is _PLAIN
        and widen == 1
        and settings.optimizer is _ADAMW
        and not accumulating
        and not upcast
        and (
            switches is DEFAULT_SWITCHES
            or not (
                switches.optimizer_in_backward or switches.activation_offloading is not _NO_OFFLOAD
            )
        )
    )


@cache
def moe_full_reserve(gc: str) -> float | None:
    """What a real-size MoE's full fine-tuning reserves beyond its tensor peak, in bytes per
    logit: the `real_size` section's `moe_full` fit over hand-read MoEs, charged to an MoE
    read generically on one GPU set up as they were traced (`_as_fitted`; elsewhere its
    backward's share, at least the small models' share of the peak). None where the file
    has none.

    The generic MoE is priced with the gpt_oss fit, whose backward grows 1.3 x from batch 1
    to 4 where the traced MoEs' reserve grew 5-9 x, its logits 4 x: a share of that
    backward under-charged Granite-3.1-3B-A800M at batch 4 (-8.8 %), and a share of the
    peak, which holds the optimizer state, over-charged both generic MoEs at batch 1 (+11
    to +12 %). Not the larger of the fit and the backward's share: Mixtral-8x7B reserved 409
    MiB at batch 1, below the fit's 673, where its backward's share is 4.9 GiB."""
    if gc != "on":
        return None
    found = calibration().get("allocator", {}).get("real_size", {}).get("moe_full", {}).get("on")
    return None if found is None else float(found["per_logit"])


#: The highest LoRA rank `adapter_reserve` is charged alone at: its runs had rank 16, and at
#: 64 the traced reserve was the same within 400 MiB (four generic families); above, the
#: larger of it and the share, which grows with the adapters' states.
ADAPTER_FIT_MAX_RANK = 64


#: A model type no hand reading reads: `backward_transient` prices a hand-read model with it
#: as the generic reading would (the fit `GENERIC_FITS` names, not its family's).
AS_GENERIC = "vramgate-generic"


def backward_transient(shape: ModelShape, settings: TrainingSettings) -> int:
    """The most a fitted moment before the optimizer step holds beyond the weights, the
    optimizer state and the gradients it keeps (`Estimate.moments` without the constants),
    with the shape priced as the generic reading prices it: the activations and working
    memory the backward leaves cached, by the fit a generic family is priced with (the
    dense one keeps the loss's backward). For the allocator's calibration on hand-read
    models; `estimate` reads the same from its own splits. Which moments a fit keeps is the
    fit's: after `calibrate` refits one, `calibrate_allocator --real-size` measures again."""
    # Full fine-tuning only: a hand-read MoE's adapters would not be priced as read
    # generically (whether PEFT adapts its expert stacks comes from the generic reading).
    if settings.method is not Method.FULL:
        raise ValueError("backward_transient: full fine-tuning only")
    if shape.model_type in FAMILIES:
        shape = replace(shape, model_type=AS_GENERIC)
    est = estimate(shape, settings)
    hybrid = _hybrid_family(shape)
    gc = "off" if settings.gradient_checkpointing is _OFF else "on"
    attention = "eager" if settings.attention is _EAGER else "sdpa"
    family = hybrid or _fit_of(shape, settings)
    moments = _moments(family, settings.method, gc, attention, "hybrid" if hybrid else "")
    return max(
        # (a built last-layer moment, appended after the fitted ones, is left out, as there)
        (r - est.fixed_bytes for m, (_, r) in zip(moments, est.moments, strict=False) if not m[1]),
        default=0,
    )


@cache
def _moments(
    family: str, method: Method, gc: str, attention: str, section: str = ""
) -> tuple[_Moment, ...]:
    """The fitted moments of a family (`family_of`) under the settings the fit depends on,
    as a table built once per process: the data file's nested lookups cost more than the
    fit's arithmetic. Keyed by the fitted family, so the table stays as small as the file.
    `section` "hybrid": the hybrid stacks' fit (`hybrid_fit.py`), sdpa only."""
    data = calibration()[section] if section else calibration()
    try:
        by_method = data["families"][family][method.value]
        keys: dict[str, list[list[float]]] = by_method[gc][attention]
    except KeyError:
        if section:
            raise SpecError(
                "estimator.profile",
                f"calibrated fits {family} with sdpa attention (flash and flex run as sdpa) "
                f"only, not {attention}; use the analytic, unsloth or trace profile",
            ) from None
        raise SpecError(
            "estimator.profile",
            f"calibrated has no coefficients for {method.value}, checkpointing {gc}, "
            f"{attention} attention; regenerate calibration.json",
        ) from None
    return tuple(
        (
            key,
            key == OPTIMIZER_KEY,
            tuple(layer),
            tuple(local),
            _holds_layer_gradients(key),
            *_fsdp_unsharded(key),
        )
        for key, (layer, local) in keys.items()
    )


#: Hybrid stacks are refused unless the data file has a `hybrid` section for their family
#: (`controller.calibration.calibrate_hybrid`, `hybrid_fit.py`): Nemotron-H, Nemotron 3, Falcon-H1,
#: Qwen3-Next, Gemma 3n and Jamba have one (a file fitted before one of them was has not).
#: Measured before those fits existed: the nearest uniform fit (Llama's) priced shrunk
#: Nemotron-H variants 13-36 % under the trace, Gemma 3n 34-43 % under (AltUp's streams and
#: LAuReL are no feature of it), and Qwen3-Next read as Qwen3-MoE 9-33 % under. Refused,
#: never under-estimated.
UNFITTED_HYBRID = (
    "calibrated has no fit for hybrid layers of this family in its data file, so it would "
    "under-estimate this model; use the analytic, unsloth or trace profile"
)


def _hybrid_family(shape: ModelShape) -> str:
    """The `hybrid` section's fit that prices a hybrid stack (`hybrid_fit.fit_family`;
    refused when there is none or the stack is not one it was traced with), "" for the rest."""
    if hybrid_fit.layer_kinds(shape) is None:
        return ""
    family = hybrid_fit.fit_family(shape)
    if family not in calibration().get("hybrid", {}).get("families", {}):
        raise SpecError("estimator.profile", UNFITTED_HYBRID)
    hybrid_fit.check_stack(shape, "estimator.profile")
    return family


def estimate(shape: ModelShape, settings: TrainingSettings) -> Estimate:
    """The largest fitted moment of the step, plus the constants the trace adds."""
    hybrid = _hybrid_family(shape)
    static = static_bytes(shape, settings)
    if hybrid:  # per-layer features summed over the layers, each by its own type
        per_layer, once = hybrid_fit.features(shape, settings, static)
        layers = 1
    else:
        per_layer, once = features(shape, settings, static)
        layers = shape.num_layers
    widen = 2 if settings.precision is _FP32 else 1
    accumulating = settings.gradient_accumulation > 1
    switched = settings.switches is not DEFAULT_SWITCHES
    upcast = upcast_bytes(shape, settings) if switched else 0
    if upcast:
        per_layer, once = _upcast(per_layer, once, hybrid != "")
    weights = static.weights + upcast
    # A paged optimizer's state lives outside the caching allocator (`Estimate.paged_bytes`):
    # resident, no reserve on it.
    paged = static.paged_optimizer
    base = weights + static.optimizer
    at_step_base = base + static.gradients + static.optimizer_scratch
    if accumulating:
        base += static.gradients  # the previous micro-batch's gradients are held
    best_key, best, best_dynamic = "", -1, 0
    gc = "off" if settings.gradient_checkpointing is _OFF else "on"
    # A family read generically has no pinned figures: it is charged the real-size share
    # (full fine-tuning: `backward_share`, an MoE's `moe_full_reserve`; a dense model's
    # adapters: `adapter_reserve`).
    generic = shape.model_type not in FAMILIES
    share = allocator_share(settings.method, gc, "", generic)
    fsdp_share = allocator_share(settings.method, gc, "fsdp")
    ddp_share = allocator_share(settings.method, gc, "ddp")
    attention = "eager" if settings.attention is _EAGER else "sdpa"
    family = hybrid or _fit_of(shape, settings)
    moments = _moments(family, settings.method, gc, attention, "hybrid" if hybrid else "")
    # The decoder layers' gradients the first layer's backward holds, sharded under FSDP:
    # all but two layers' worth (`_holds_layer_gradients`; the hybrid fit's features sum
    # the layers).
    g_layers = per_layer[hybrid_fit.LAYER_GRADIENTS] if hybrid else layers * static.layer_gradients
    layer_gradients = max(0, g_layers - 2 * static.layer_gradients)
    splits = []  # (sharded, replicated) of each moment, for the per-GPU need
    fsdp = []  # the same under FSDP2 on n >= 2 GPUs: plus what it holds unsharded
    root, block = static.root_weights, static.layer_weights
    untied = shape.lm_head_params > 0
    best_split = (0, 0)
    last_layer_fsdp: tuple[int, int] | None = None
    in_backward = switched and settings.switches.optimizer_in_backward
    if in_backward:  # one parameter's gradient and step scratch at a time
        at_step_base = base + static.largest_gradient + static.largest_scratch
    adjust = _Switched(settings, shape, per_layer, once, layers, hybrid != "") if switched else None
    for key, at_optimizer, layer_coefs, local_coefs, holds, roots, blocks in moments:
        # `dynamic_bytes`, inline: the same float operations in the same order.
        fitted = layers * sum(map(mul, layer_coefs, per_layer)) + sum(map(mul, local_coefs, once))
        if adjust is not None:
            fitted = adjust.fitted(key, fitted, layer_coefs, local_coefs)
        dynamic = max(0, round(fitted)) * widen
        static_part = at_step_base if at_optimizer else base
        # A fit that prices the moment under the gradients it must hold (far outside its
        # samples) says nothing of what else is there: all of it stays each GPU's own.
        moved = layer_gradients if holds and layer_gradients <= dynamic else 0
        if in_backward and moved:
            dynamic, moved = dynamic - moved, 0  # stepped and freed as they were made
        total = static_part + dynamic
        splits.append((static_part + moved, dynamic - moved))
        gathered = roots * root + blocks * block
        if untied and key == _UNTIED_TAIL:
            gathered = root + max(root, block)
        fsdp.append((static_part + moved, dynamic - moved + gathered))
        if total > best:
            best_key, best, best_dynamic, best_split = key, total, dynamic, splits[-1]
        if adjust is not None:
            adjust.observe(key, layer_coefs, dynamic - moved)
    if adjust is not None and adjust.smaller_loss and adjust.first_layer < 0 and gc == "off":
        # Without checkpointing the fits keep no layer's backward: a layer's working set is
        # the checkpointed fit's (its recomputation is the activations this one saved).
        section = "hybrid" if hybrid else ""
        for key, _, layer_coefs, local_coefs, holds, _, _ in _moments(
            family, settings.method, "on", attention, section
        ):
            if key.startswith("backward/first/"):
                fitted = layers * sum(map(mul, layer_coefs, per_layer))
                fitted += sum(map(mul, local_coefs, once))
                fitted = adjust.fitted(key, fitted, layer_coefs, local_coefs)
                dynamic = max(0, round(fitted)) * widen
                moved = layer_gradients if holds and layer_gradients <= dynamic else 0
                adjust.observe(key, layer_coefs, dynamic - moved)
    if adjust is not None and (dynamic := adjust.last_layer_backward(widen)) is not None:
        splits.append((base, dynamic))
        # under FSDP2 the last layer's backward holds the root, that block and the prefetched
        # one unsharded (what the fitted last-layer moments add: `_moments`)
        last_layer_fsdp = (base, dynamic + root + 2 * block)
        if base + dynamic > best:
            best_key, best, best_dynamic, best_split = (
                LAST_LAYER_KEY,
                base + dynamic,
                dynamic,
                splits[-1],
            )
    at_step = best_key == OPTIMIZER_KEY
    gradients = static.gradients if at_step or accumulating else 0
    scratch = static.optimizer_scratch if at_step else 0
    if in_backward and at_step:
        gradients, scratch = static.largest_gradient, static.largest_scratch
    backward = backward_share(gc) if generic and settings.method is Method.FULL else None
    # The fits are charged alone to jobs set up as their runs were (`adapter_reserve`,
    # `moe_full_reserve`); outside them the shares, which grow with what the step holds.
    as_fitted = generic and _as_fitted(settings, widen, accumulating, upcast)
    dense_adapters = generic and settings.is_adapter and not hybrid and shape.dims.num_experts <= 1
    adapters = adapter_reserve(gc) if dense_adapters else None
    # Set up otherwise, the larger of the fit and the share: neither was measured there.
    adapters_fitted = (
        as_fitted and not settings.modules_to_save and (settings.rank or 0) <= ADAPTER_FIT_MAX_RANK
    )
    if backward is not None and best > weights + paged:  # the backward's cache, as a share
        transient = max(
            (r for m, (_, r) in zip(moments, splits, strict=False) if not m[1]), default=0
        )
        slack = transient * backward[0] // backward[1]
        moe = shape.dims.num_experts > 1
        per_logit = moe_full_reserve(gc) if moe and as_fitted and not hybrid else None
        if per_logit is not None:  # its reserve follows its logits, not its fit's backward
            logits = settings.batch * settings.lm_seq_len * shape.vocab_size
            slack = max(0, round(per_logit * logits))
        elif moe and share[0] >= 0:
            # An MoE read generically is priced with the gpt_oss fit, whose backward grows
            # 1.3 x from batch 1 to 4 where four hand-read MoEs' traced reserve grew 5-9 x:
            # never less than the small models' share of the peak.
            slack = max(slack, (best - weights - paged) * share[0] // share[1])
        share = (slack, best - weights - paged)  # of the peak's, for the per-GPU figures
    elif adapters is not None and best > weights + paged:
        # The reserve comes after the peak, from blocks sized by the logits and the hidden
        # states, not by what the peak holds; as a share of the peak's beyond-weights for
        # the per-GPU figures (a device map charges each GPU its part of it).
        per_logit, per_parameter, per_hidden = adapters
        tokens = settings.batch * settings.lm_seq_len
        slack = max(
            0,
            round(
                per_logit * tokens * shape.vocab_size
                + per_parameter * static.total_params
                + per_hidden * tokens * shape.hidden_size
            ),
        )
        if not adapters_fitted and share[0] >= 0:
            slack = max(slack, (best - weights - paged) * share[0] // share[1])
        share = (slack, best - weights - paged)
    elif share[0] < 0:  # no measured share: the flat slack on the whole peak
        slack = overheads.slack_bytes(best)
    else:
        slack = max(0, best - weights - paged) * share[0] // share[1]
    components = {
        "weights": weights,
        "gradients": gradients,
        "optimizer": static.optimizer,
        "optimizer_scratch": scratch,
        "activations": best_dynamic,
        "cuda_context": overheads.CUDA_CONTEXT_BYTES,
        "cublas_workspace": overheads.CUBLAS_WORKSPACE_BYTES,
        "allocator_slack": slack,
    }
    fixed = sum(components[k] for k in overheads.PER_GPU_EXTRAS)
    fsdp.extend(_fsdp_only(shape, settings, static, base))
    if adjust is not None and last_layer_fsdp is not None:
        fsdp.append(last_layer_fsdp)
    sharded, replicated = best_split
    # DDP's gradient buckets: one flat copy of the trainable parameters' gradients
    # (gradient_as_bucket_view=False, DDP's default), in the gradients' dtypes. And where
    # the embedding's backward (every gradient made, a tied embedding's new gradient and
    # the sum: `_fsdp_only`) holds more than the fitted peak, the difference: the fits keep
    # it only where it decides a single-GPU sample, and a single GPU's figure stays theirs.
    buckets = static.gradients
    if not settings.is_adapter:
        tied = 2 * static.head_gradients if not static.embed_gradients else 0
        buckets += max(0, base + static.gradients + tied - best)
    return assemble(  # Estimate(...), faster: see frozen.py
        Estimate,
        {
            "profile": "calibrated",
            "components": components,
            "total_params": static.total_params,
            "trainable_params": static.trainable_params,
            "sharded_bytes": sharded,
            "replicated_bytes": replicated + fixed,
            "margin": Fraction(best + slack, best) if best > 0 else overheads.SLACK_MARGIN,
            "reserve_share": share if share[0] >= 0 else (),
            "fsdp_reserve_share": fsdp_share if fsdp_share[0] >= 0 else (),
            "ddp_reserve_share": ddp_share if ddp_share[0] >= 0 else (),
            "resident_bytes": weights + paged,
            "paged_bytes": paged,
            "head_bytes": 0,
            "fixed_bytes": fixed,
            "moments": tuple((s, r + fixed) for s, r in splits),
            "traced_per_gpu": (),
            "traced_allocated": (),
            "correction_percent": 100,
            "load_moment": 0,
            "comm_bytes": NCCL_BYTES,
            "fsdp_moments": tuple((s, r + fixed) for s, r in fsdp),
            "ddp_bytes": buckets,
        },
    )


def _upcast(per_layer: list[int], once: list[int], hybrid: bool) -> tuple[list[int], list[int]]:
    """The features of a step whose 4-bit model the trainer prepared in fp32
    (`Switches.kbit_preparation`): its fp32 norms make the residual stream fp32, and
    bitsandbytes' 4-bit linear returns its input's dtype, so the checkpoints and a layer's
    per-token working set (projections, MLP) hold 4 bytes where the fits (of 16-bit steps)
    saw 2 (`_widened`); the logits stay 16-bit under the trainer's autocast. An
    approximation checked against traces of the switch (`_ONCE_WIDEN`;
    tests/unit/trace/test_trace_kbit.py), not fitted. Its weights are
    `storage.upcast_bytes`."""
    wide_layer = _WIDE_HYBRID_LAYER if hybrid else _WIDE_LAYER
    wide_local = _WIDE_HYBRID_LOCAL if hybrid else _WIDE_LOCAL
    return (
        [round(v * w) for v, w in zip(per_layer, wide_layer, strict=True)],
        [round(v * w) for v, w in zip(once, wide_local, strict=True)],
    )


class _Switched:
    """How the trainer's switches change a moment's fitted bytes (the fits are of the plain
    loss, activations on the GPU): a chunked loss holds every chunk's saved log-softmax and
    one chunk of the rest (`chunked_logit_bytes`), and at its backward the LM head's
    gradient; activations offloaded to CPU leave one layer's per-token activation terms of
    L on the GPU; under a chunked or fused loss the last layer's backward, which no fit
    kept, is built (`last_layer_backward`). A fused loss is the logits feature at 0
    (`features`); an optimizer in backward is the static part and the layers' gradients
    (`estimate`)."""

    def __init__(
        self,
        settings: TrainingSettings,
        shape: ModelShape,
        per_layer: list[int],
        once: list[int],
        layers: int,
        hybrid: bool,
    ) -> None:
        self.logits_at = _HYBRID_LOGITS if hybrid else _LOGITS
        self.logits = once[self.logits_at] if settings.loss is _CHUNKED else 0
        # Chunk by chunk, the LM head's backward runs while the other chunks' saved
        # log-softmax are still held, so its gradient joins them (the trace shows it).
        self.head = once[_HYBRID_HEAD if hybrid else _HEAD] if self.logits else 0
        offloaded = settings.switches.activation_offloading is _CPU
        mask = _HYBRID_ACTIVATIONS if hybrid else _LAYER_ACTIVATIONS
        # `layers` x the per-layer activation terms are every layer's; one layer's stays.
        self.per_token = [v if a else 0 for v, a in zip(per_layer, mask, strict=True)]
        total_layers = max(shape.num_layers, 1)
        self.dropped = layers * (total_layers - 1) / total_layers if offloaded else 0.0
        self.layers, self.rest = layers, (total_layers - 1) / total_layers
        self.offloaded = offloaded
        self.smaller_loss = settings.loss is not Loss.PLAIN
        self.tail_activations: float | None = None
        self.first_layer = -1
        self.has_last = False
        # PEFT's fp32 LM head under the trainer's autocast: the 16-bit copy of its weight
        # that the head's matmul saves, held from its forward to the loss's backward.
        full = settings.switches.kbit_preparation is KbitPreparation.UPCAST_NON_QUANTIZED
        elem = 4 if settings.precision is _FP32 else 2
        quantized = upcast_bytes(shape, settings) > 0
        self.head_copy = (
            block(shape.vocab_size * shape.hidden_size * elem) if full and quantized else 0
        )
        # Under that preparation with checkpointing, every layer's checkpoint is fp32: the
        # other layers' while the last one runs its backward (`last_layer_backward`).
        checkpointed = settings.gradient_checkpointing is not _OFF
        tokens = settings.batch * settings.lm_seq_len
        self.checkpoints = (
            (shape.num_layers - 1) * tokens * shape.hidden_size * _FP32_BYTES
            if quantized and checkpointed
            else 0
        )

    def observe(self, key: str, layer_coefs: tuple[float, ...], own: int) -> None:
        """Note what `last_layer_backward` builds on: the loss's backward's per-layer
        activations, and the most a first-layer backward moment holds beyond the decoder
        layers' gradients (`own`)."""
        if not (self.smaller_loss or self.checkpoints):
            return
        if key == LOSS_BACKWARD_KEY:
            activations = self.layers * sum(map(mul, layer_coefs, self.per_token))
            self.tail_activations = max(activations, 0.0)
        elif key.startswith("backward/first/"):
            self.first_layer = max(self.first_layer, own)
        elif key.startswith("backward/last/"):  # the fit has that moment itself
            self.has_last = True

    def last_layer_backward(self, widen: int) -> int | None:
        """The last decoder layer's backward under a chunked or fused loss, which the fits
        (made with the plain loss, whose backward held more) did not keep: every other
        layer's saved activations (the loss's backward's, one layer's aside; none when they
        are offloaded) and the working set of a layer's backward (the first layer's moment,
        without the gradients the layers before it made). Without it a fused loss was
        priced 5 % under the trace (Qwen2.5-0.5B QLoRA, 4,096 tokens)."""
        built = None
        if self.tail_activations is not None and self.first_layer >= 0 and not self.has_last:
            others = 0.0 if self.offloaded else self.tail_activations * self.rest
            built = self.first_layer + round(others) * widen
        if self.checkpoints and self.first_layer >= 0 and not (self.offloaded or self.has_last):
            # A k-bit preparation's fp32 checkpoints: the last layer's backward holds the
            # other layers' (t x h x 4 bytes each) beside a layer's working set, a moment
            # that may decide now although no 16-bit fit kept it (Mixtral's: 10 % above
            # its trace, the first layer's working set being the larger; where the fit
            # kept that moment, its widened features price it, within 3 %).
            held = self.first_layer + self.checkpoints
            built = held if built is None else max(built, held)
        return built

    def fitted(
        self,
        key: str,
        fitted: float,
        layer_coefs: tuple[float, ...],
        local_coefs: tuple[float, ...],
    ) -> float:
        if self.logits:
            per_logit = local_coefs[self.logits_at]
            fitted += (chunked_logit_bytes(per_logit) - per_logit) * self.logits
            if key == LOSS_BACKWARD_KEY:
                fitted += self.head
        if self.dropped:
            activations = sum(map(mul, layer_coefs, self.per_token))
            fitted -= self.dropped * max(activations, 0.0)
        if self.head_copy and key == LOSS_BACKWARD_KEY:
            fitted += self.head_copy
        return fitted


def phase_bytes(
    shape: ModelShape, settings: TrainingSettings, gpus: int, parallelism: Parallelism
) -> dict[str, int]:
    """Tensor bytes each of `gpus` GPUs holds at each phase's largest fitted moment
    ("backward", "optimizer"; under FSDP "forward" too: forward's start), without the
    constants and the
    margin: what the distributed trace's phase peaks measure. For checks
    (benchmarks/per_gpu_vs_trace.py), not the hot path."""
    est = estimate(shape, settings)
    hybrid = _hybrid_family(shape)
    gc = "off" if settings.gradient_checkpointing is _OFF else "on"
    attention = "eager" if settings.attention is _EAGER else "sdpa"
    family = hybrid or _fit_of(shape, settings)
    section = "hybrid" if hybrid else ""
    keys = [m[0] for m in _moments(family, settings.method, gc, attention, section)]
    n = max(gpus, 1)
    if n == 1:
        pairs, n = est.moments, 1
    elif parallelism is Parallelism.FSDP:
        pairs = est.fsdp_moments
        keys += FSDP_ONLY_KEYS[: len(pairs) - len(keys)]
    else:
        # DDP: the single-GPU moments plus the buckets, and the embedding's backward where
        # it is above them (`ddp_bytes`).
        buckets, pairs = est.ddp_bytes, est.moments
        if not settings.is_adapter:
            static = static_bytes(shape, settings)
            buckets = static.gradients
            tied = 2 * static.head_gradients if not static.embed_gradients else 0
            held = static.weights + static.optimizer + static.gradients + tied
            if settings.gradient_accumulation > 1:
                held += static.gradients
            keys = [*keys, "backward/embedding"]
            pairs = (*pairs, (held + est.fixed_bytes, 0))
        pairs = tuple((s + r + buckets, 0) for s, r in pairs)
        n = 1
    out: dict[str, int] = {}
    for key, (sharded, replicated) in zip(keys, pairs, strict=True):
        phase = key.split("/", 1)[0]
        held = sharded // n + replicated - est.fixed_bytes
        out[phase] = max(out.get(phase, 0), held)
    return out


def peak_bytes(shape: ModelShape, settings: TrainingSettings) -> int:
    """The fitted peak of tensor bytes alone (what the trace's `peak_bytes` measures)."""
    est = estimate(shape, settings)
    return est.total_bytes - sum(est.components[k] for k in overheads.EXTRAS)
