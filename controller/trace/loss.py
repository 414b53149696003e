"""The training loss as the job's trainer computes it (`Switches.loss`), on the traced model.

* `plain`: the model's own causal-LM loss from `labels` (transformers' ForCausalLMLoss: the
  whole logits, an fp32 copy, log-softmax, NLL).
* `chunked`: the decoder's hidden states, then the LM head and an fp32 cross-entropy chunk
  by chunk of tokens (`frameworks.loss_chunks`, torchtune's 8), summed: what torchtune's
  LinearCrossEntropyLoss runs without torch.compile. Autograd keeps what each chunk's
  cross-entropy saves for backward (its fp32 log-softmax) until backward, so the trace shows
  what chunking really saves in eager mode, not only "one chunk's logits".
* `fused`: a fused linear cross-entropy as Liger's LigerFusedLinearCrossEntropyFunction
  computes it: in forward, chunk by chunk (a chunk's logits about the size of its hidden
  states: `chunk = next_pow2(ceil(tokens / ceil(V / h)))`), the 16-bit logits, their
  gradient written in place, the gradient of the hidden states and (a trainable head) of the
  weight accumulated; only those two are kept for backward, which scales them.

Under FSDP2 or DDP (`distributed.py`) the loss runs inside the wrapped model's forward
(`wrapped_loss`), where the wrappers' hooks gather the root's parameters (the embeddings,
the final norm, the LM head) and see the output: where Liger's and Unsloth's fused losses
run (each replaces the causal LM's forward). torchtune calls its LM head from the loss,
after the model's forward; when FSDP2 gathers that head (its own unit, or the root's) is
not modelled apart: the rank gathers it with the root, as for the plain loss.

The label shift (transformers shifts inside its loss; torchtune's data is pre-shifted) moves
no memory worth counting and is left out of the chunked and fused paths; so are final-logit
soft-capping and logit scales (Gemma 2/3, Cohere), which a fused kernel applies per chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from controller.estimator import Loss
from controller.estimator.frameworks import loss_chunks
from controller.trace.build import TraceUnsupported


def compute_loss(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    loss: Loss,
) -> torch.Tensor:
    """The scalar loss of one micro-batch, computed as `loss` says."""
    if loss is Loss.PLAIN:
        out: Any = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        result: torch.Tensor = out.loss
        return result
    base: Any = getattr(model, "get_base_model", None)
    causal: Any = base() if callable(base) else model
    head = causal.get_output_embeddings()
    try:
        decoder = causal.get_decoder()
    except (AttributeError, NotImplementedError, TypeError):
        decoder = None
    if decoder is None or not isinstance(head, nn.Module):
        raise TraceUnsupported(
            f"a {loss.value} loss needs the model's decoder and LM head apart; this model "
            "does not expose them"
        )
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask)[0]
    hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = labels.reshape(-1)
    if loss is Loss.CHUNKED:
        return _chunked(head, hidden, targets)
    weight = _weight(head)
    return _FusedLinearCrossEntropy.apply(hidden, weight, targets)  # type: ignore[no-any-return]


def wrapped_loss(
    wrapper: Callable[..., Any],
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    loss: Loss,
) -> torch.Tensor:
    """`compute_loss` through `wrapper` (DDP around `model`, or `model` itself as FSDP2's
    root): the wrapper's forward hooks run around the whole loss, which the chunked and
    fused losses, calling the decoder and the LM head apart, would otherwise bypass. For
    the call, `model`'s forward is that loss (an instance attribute shadows the class's
    `forward`; hooks registered on the module still run)."""
    if loss is Loss.PLAIN:
        out: Any = wrapper(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        plain: torch.Tensor = out.loss
        return plain
    from transformers.modeling_outputs import CausalLMOutput

    def forward(**kwargs: Any) -> CausalLMOutput:
        value = compute_loss(
            model, kwargs["input_ids"], kwargs["attention_mask"], kwargs["labels"], loss
        )
        return CausalLMOutput(loss=value)

    model.forward = forward  # type: ignore[method-assign]
    try:
        out = wrapper(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    finally:
        del model.forward
    result: torch.Tensor = out.loss
    return result


def _chunked(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    total = hidden.new_zeros((), dtype=torch.float32)
    chunks = loss_chunks()
    for part, target in zip(hidden.tensor_split(chunks), targets.tensor_split(chunks), strict=True):
        logits = head(part)
        total = total + nn.functional.cross_entropy(logits.float(), target, reduction="sum")
    return total / targets.numel()


def _weight(head: nn.Module) -> torch.Tensor:
    """The LM head's weight (a module PEFT wraps to train a copy of: that copy's)."""
    for name in ("weight", "modules_to_save"):
        found = getattr(head, name, None)
        if isinstance(found, torch.Tensor):
            return found
        if isinstance(found, nn.ModuleDict) and len(found):
            inner = getattr(next(iter(found.values())), "weight", None)
            if isinstance(inner, torch.Tensor):
                return inner
    original = getattr(getattr(head, "original_module", None), "weight", None)
    if isinstance(original, torch.Tensor):
        return original
    raise TraceUnsupported("a fused loss needs the LM head's weight; this head has none")


def fused_chunk_tokens(tokens: int, vocab: int, hidden: int) -> int:
    """Liger's chunk of tokens (fused_linear_cross_entropy.py: `inc_factor = cdiv(V, H)`,
    `chunk_size = next_power_of_2(cdiv(BT, inc_factor))`): a chunk's logits are about
    the size of the hidden states."""
    per = max(1, math.ceil(tokens / max(1, math.ceil(vocab / hidden))))
    return 1 << (per - 1).bit_length()


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Liger's fused linear cross-entropy, as memory sees it (module docstring)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        tokens, width = hidden.shape
        chunk = fused_chunk_tokens(tokens, weight.shape[0], width)
        grad_hidden = torch.zeros_like(hidden)
        grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, tokens, chunk):
            part = hidden[start : start + chunk]
            target = targets[start : start + chunk]
            logits = part @ weight.t()  # 16-bit, this chunk only
            lse = torch.logsumexp(logits.float(), dim=-1)
            picked = logits.gather(1, target.unsqueeze(1)).squeeze(1).float()
            total = total + (lse - picked).sum()
            # The kernel writes the softmax gradient over the logits in place.
            logits.sub_(lse.unsqueeze(1).to(logits.dtype)).exp_().div_(tokens)
            grad_hidden[start : start + chunk] = logits @ weight
            if grad_weight is not None:
                grad_weight.addmm_(logits.t(), part)
            del logits
        ctx.save_for_backward(grad_hidden, grad_weight)
        return total / tokens

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_output.to(grad_hidden.dtype)
        grad_weight = grad_weight * scale if grad_weight is not None else None
        return grad_hidden * scale, grad_weight, None
