"""The `analytic` profile: seed 2 (`finetuning-vram-calculator.md`), term by term.

    weights      = P × bytes per weight        4 FP32 · 2 BF16 · 0.5 NF4 (QLoRA base)
    gradients    = T × bytes per gradient      2 BF16 · 4 FP32
    optimizer    = T × bytes per state         8 AdamW · 2 AdamW 8-bit · 12 with FP32 master copy
    activations  = L × s × b × h × k           k = 2 with checkpointing, 34 without
                                               (hybrid stacks without checkpointing: what
                                               each layer's mixer saves, per mixer)
    logits       = s × b × V × 8               FP32 logits for the loss plus their gradient
    total        = (sum) × 1.1                 CUDA context, cuBLAS workspace, fragmentation

T is P for full fine-tuning and the adapter for LoRA/QLoRA, counted from the model's own
module shapes (r × (in + out) per targeted module). `modules_to_save` trains those modules in
full: the seed charges them 10 bytes each (gradient + optimizer), and so does this profile.

Where the seed is silent, this follows what PyTorch and PEFT allocate (each noted below);
known deviations of the seed from real frameworks are for the `trace` profile to close.
"""

from __future__ import annotations

from fractions import Fraction

from controller.estimator import frameworks
from controller.estimator.model import ModelShape
from controller.estimator.result import Estimate
from controller.estimator.settings import (
    DEFAULT_SWITCHES,
    Checkpointing,
    Loss,
    Method,
    Offloading,
    Optimizer,
    Precision,
    TrainingSettings,
)
from controller.estimator.storage import static_bytes, upcast_bytes

OVERHEAD = Fraction(11, 10)
K_CHECKPOINTED = 2  # one 16-bit hidden state kept per layer
K_FULL = 34  # Korthikanti et al. 2022, per layer, FlashAttention (no s² term)
LOGITS_BYTES = 8  # FP32 logits plus their gradient
#: Of them, what a chunked loss keeps for every chunk until backward: the fp32 log-softmax.
SAVED_LOGIT_BYTES = 4
DELTANET_CHUNK = 64  # tokens per chunk of the chunked gated delta rule (transformers, fla)

_WEIGHT_BYTES = {
    Precision.FP32: Fraction(4),
    Precision.BF16: Fraction(2),
    Precision.FP16: Fraction(2),
}
_NF4_BYTES = Fraction(1, 2)

# Optimizer state bytes per trainable parameter. The seed gives adamw (two FP32 moments),
# adamw-8bit (two 1-byte moments) and adamw-fp32-master (moments + FP32 master weight).
# The seed is silent on the others, so they follow the libraries:
#   paged-adamw-32bit: bitsandbytes keeps the same two FP32 moments; paging only evicts them
#     to host memory under pressure, which is not something to plan on.
#   sgd: torch.optim.SGD as Hugging Face's Trainer builds it has no momentum, hence no state.
#   adamw-torch: torch.optim.AdamW keeps its moments in the parameter's dtype: FP32 for PEFT
#     adapters (PEFT casts adapter weights to FP32 by default, autocast_adapter_dtype=True)
#     and the training precision for full fine-tuning (4 bytes per bf16 parameter).
_OPTIMIZER_BYTES = {
    Optimizer.ADAMW: 8,
    Optimizer.ADAMW_8BIT: 2,
    Optimizer.ADAMW_FP32_MASTER: 12,
    Optimizer.PAGED_ADAMW_32BIT: 8,
    Optimizer.SGD: 0,
}


def optimizer_bytes_per_param(settings: TrainingSettings) -> int:
    if settings.optimizer is Optimizer.ADAMW_TORCH:
        if settings.is_adapter:
            return 8
        return 2 * int(_WEIGHT_BYTES[settings.precision])
    return _OPTIMIZER_BYTES[settings.optimizer]


def trainable_params(shape: ModelShape, settings: TrainingSettings, lora_per_rank: int) -> int:
    if not settings.is_adapter:
        frozen = shape.frozen_params + sum(lin.params for lin in shape.frozen_linears)
        return shape.total_params - frozen
    saved = 0
    for module in settings.modules_to_save:
        if module == "lm_head" and shape.lm_head_params == 0:
            continue  # tied to embed_tokens: one tensor, already trainable or counted once
        saved += shape.dims.vocab_size * shape.dims.hidden_size
    return (settings.rank or 0) * lora_per_rank + saved


def mixer_bytes_per_token(shape: ModelShape, mixer: str) -> int:
    """16-bit bytes one token leaves saved for backward in one layer of a hybrid stack,
    counted tensor by tensor as Korthikanti et al. count the 34·h of an attention + MLP block
    (where seed 2 is silent: a layer holding one mixer saves that mixer's tensors, not 34·h):

    * attention alone: the norm's and the projections' inputs (2h + 2h), q, k and v for the
      attention kernel (2q + 4kv), its output, o_proj's input (2q): no s² term (flash/sdpa);
    * MLP alone (up, ReLU², down): the norm's and up_proj's inputs, up's output and its
      activation (2h + 2h + 2i + 2i);
    * Mamba-2: the norm's and in_proj's inputs (2h + 2h), in_proj's output (2P: z, x/B/C,
      dt), the convolution's output and its SiLU (2C + 2C), the scan's output y, the gated
      norm's input and out_proj's input (3 x 2·inner), and the fp32 state each chunk of
      `chunk_size` tokens passes on (4 x inner x state / chunk per token): the state space's
      memory instead of a k/v cache or score matrix;
    * attention beside Mamba-2, then a gated MLP (Falcon-H1), and an MoE alone (Nemotron
      3): see below.
    """
    d = shape.dims
    h = d.hidden_size
    if mixer == "attention_mlp":  # Jamba's attention layers: the standard block
        return K_FULL * h
    if mixer == "mamba1_mlp":
        # Jamba's Mamba layers: the standard block less its attention and that norm (the
        # 11h + 2h of the 34h), plus what a Mamba (1) mixer saves with its fused scan (the
        # selective-scan kernel keeps its inputs and recomputes the states): the norm's and
        # in_proj's inputs, in_proj's output (x, z), the convolution's output and its SiLU,
        # x_proj's output (dt, B, C) and the three norms' outputs, dt_proj's output, the
        # scan's output y and out_proj's input.
        m = d.mamba1
        assert m is not None  # parsed for every Jamba config
        mamba = 4 * h + 14 * m.inner + 4 * (m.dt_rank + 2 * m.state_size)
        return (K_FULL - 13) * h + mamba
    if mixer == "deltanet_mlp":
        # Qwen3-Next's linear-attention layers: the standard block less its attention and
        # that norm, plus what Gated DeltaNet saves: the norm's and projections' inputs,
        # in_proj_qkvz's and in_proj_ba's outputs, the convolution's output and its SiLU,
        # the L2-normed q and k, the core's output and the gated norm's (out_proj's input),
        # and the fp32 state (value heads x key dim x value dim) each chunk of 64 tokens
        # passes on: a fixed-size state instead of k/v or a score matrix.
        g = d.deltanet
        assert g is not None  # parsed for every Qwen3-Next config
        state = 4 * g.num_v_heads * g.head_k_dim * g.head_v_dim // DELTANET_CHUNK
        net = 4 * h + 4 * (g.key_dim + g.value_dim) + 4 * g.num_v_heads + 4 * g.conv_dim
        net += 4 * g.key_dim + 4 * g.value_dim + state
        return (K_FULL - 13) * h + net
    if mixer == "moe":
        # Nemotron 3's MoE alone: the norm's input and output (which the router, the shared
        # expert and the latent projection all read: 2h + 2h), the router's fp32 copy of it
        # and its fp32 scores (4h + 4E), the shared expert's up output and its ReLU² (2s +
        # 2s), and for each of the k experts a token goes to: its gathered input, up's
        # output, ReLU²'s, and down's output that the routing weight scales (2w + 2i + 2i +
        # 2w, w the latent width or h); with a latent projection, fc2's input too (2w).
        width = d.moe_latent_size or h
        inner = d.moe_intermediate_size or d.intermediate_size
        shared = d.shared_expert_intermediate_size or inner
        routed = d.experts_per_token * (4 * width + 4 * inner)
        latent = 2 * width if d.moe_latent_size else 0
        return 8 * h + 4 * d.num_experts + 4 * shared + routed + latent
    head_dim = d.head_dim or h // d.num_heads
    attention = 4 * h + 4 * d.num_heads * head_dim + 4 * d.num_kv_heads * head_dim
    if mixer == "attention":
        return attention
    if mixer == "mlp":
        return 4 * h + 4 * d.intermediate_size
    ssm = d.ssm
    assert ssm is not None  # parsed whenever a layer is Mamba-2
    state = 4 * ssm.inner * ssm.state_size // ssm.chunk_size
    scan = 2 * ssm.in_proj_width + 4 * ssm.conv_dim + 6 * ssm.inner + state
    if mixer == "parallel":
        # Falcon-H1: attention and Mamba-2 read the same normed input (counted once, with
        # attention), then a gated MLP saves its norm's and projections' inputs, gate's and
        # up's outputs, the activation and the product (2h + 2h + 4 x 2i).
        return attention + scan + 4 * h + 8 * d.intermediate_size
    return 4 * h + scan


def hybrid_bytes_per_token(shape: ModelShape) -> int:
    """`mixer_bytes_per_token` summed over a hybrid stack's layers."""
    return sum(
        mixer_bytes_per_token(shape, layer.mixer) * count for layer, count in shape.layer_counts
    )


def estimate(shape: ModelShape, settings: TrainingSettings, lora_per_rank: int) -> Estimate:
    """Seed 2's estimate. `lora_per_rank` is the adapter size at rank 1 on the chosen targets."""
    p = shape.total_params
    t = trainable_params(shape, settings, lora_per_rank)
    nf4 = settings.method is Method.QLORA or (
        settings.method is Method.LORA
        and shape.quantization is not None
        and shape.quantization.load_in_4bit
    )
    # + the fp32 buffers a router holds (DeepSeek-V3's correction bias): not parameters
    weights = int(p * (_NF4_BYTES if nf4 else _WEIGHT_BYTES[settings.precision]))
    weights += shape.buffer_bytes
    gradients = t * int(_WEIGHT_BYTES[settings.precision])
    optimizer = t * optimizer_bytes_per_param(settings)

    # k assumes 16-bit activations; FP32 training keeps 4-byte hidden states.
    width = int(_WEIGHT_BYTES[settings.precision]) // 2
    k = K_FULL if settings.gradient_checkpointing is Checkpointing.OFF else K_CHECKPOINTED
    tokens = settings.lm_seq_len * settings.batch
    streams = shape.dims.altup_num_inputs
    if streams > 1:
        # Gemma 3n: AltUp carries `streams` copies of the hidden state through every layer,
        # so a checkpoint holds all of them (2 bytes x streams), and without checkpointing
        # each extra stream is saved twice more (the stack a layer reads, the predicted
        # stack it corrects: 4h each).
        k = k * streams if k == K_CHECKPOINTED else k + 4 * (streams - 1)
    if shape.dims.mixers is None or k == K_CHECKPOINTED:
        activations = shape.num_layers * tokens * shape.hidden_size * k * width
    else:
        activations = tokens * hybrid_bytes_per_token(shape) * width
    logits = 0 if settings.loss is Loss.FUSED else tokens * shape.vocab_size * LOGITS_BYTES
    switches = settings.switches
    if switches is not DEFAULT_SWITCHES:
        # Extensions: the seed prices the model's own loss, activations on the GPU and a
        # separate optimizer step (`frameworks.json` for what each switch means).
        if settings.loss is Loss.CHUNKED:
            # The seed's 8 bytes are the fp32 logits and their gradient: each chunk's saved
            # fp32 log-softmax stays until backward (4 bytes for every token), the gradient
            # is one chunk's at a time (as the traced chunked loss shows).
            saved = logits // LOGITS_BYTES * SAVED_LOGIT_BYTES
            logits = saved + -(-(logits - saved) // frameworks.loss_chunks())
        if switches.activation_offloading is Offloading.CPU:  # one layer's stays on the GPU
            activations = -(-activations // max(shape.num_layers, 1))
        if switches.optimizer_in_backward:  # one parameter's gradient at a time
            gradients = static_bytes(shape, settings).largest_gradient
        upcast = upcast_bytes(shape, settings)
        if upcast:  # a k-bit preparation's fp32 parameters, and its fp32 hidden states
            weights += upcast
            activations *= 2

    paged = 0  # outside PyTorch's allocator (`Estimate.paged_bytes`)
    if settings.optimizer is Optimizer.PAGED_ADAMW_32BIT:
        paged = min(optimizer, static_bytes(shape, settings).paged_optimizer)
    subtotal = weights + gradients + optimizer + activations + logits
    overhead = int(subtotal * OVERHEAD) - subtotal
    return Estimate(
        profile="analytic",
        components={
            "weights": weights,
            "gradients": gradients,
            "optimizer": optimizer,
            "activations": activations,
            "logits": logits,
            "overhead": overhead,
        },
        total_params=p,
        trainable_params=t,
        sharded_bytes=weights + gradients + optimizer,
        replicated_bytes=activations + logits,
        margin=OVERHEAD,
        head_bytes=logits,
        paged_bytes=paged,
    )
