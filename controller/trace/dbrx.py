"""DBRX's experts as the trace runs them: the eager loop, over a uniform routing.

transformers runs DBRX's experts only as an eager loop over the experts the router hit
(`DbrxExperts.forward`; it takes no experts implementation), and which experts those are
is data that fake tensors do not have. What the loop allocates does not depend on it,
though: expert e processes the n_e pairs routed to it (gathered input, gate and up
projections, the activation, their product, the down projection, its routing-weighted
copy), the n_e sum to the t x k pairs, and every tensor backward needs is kept until
backward whichever expert made it. So the trace runs the loop over the t x k pairs dealt
out evenly among the experts, as a uniform routing would: the same modules
(`DbrxExpertGLU` included), the same slices `w.view(E, i, h)[e]` of DBRX's 2-D stacks (so
full fine-tuning's backward accumulates one full-size gradient per expert into each stack's,
as the loop's does), the same saved tensors in total. Only each expert's share of the pairs
is the uniform one rather than the router's, which moves the forward's transient peak by a
fraction of one expert's tensors (tests/unit/trace/test_trace.py compares it with the loop on real
tensors and a real routing).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

#: The class whose forward `uniform_routing` replaces.
EXPERTS_CLASS = "DbrxExperts"


def _forward(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    batch = hidden_states.shape[0]
    flat = hidden_states.reshape(-1, self.hidden_size)
    tokens, k = top_k_index.shape
    pair_token = torch.arange(tokens, device=flat.device).repeat_interleave(k)
    pair_weight = top_k_weights.reshape(-1, 1)
    split = (-1, self.ffn_hidden_size, self.hidden_size)
    stacks = (self.mlp.w1.view(split), self.mlp.v1.view(split), self.mlp.w2.view(split))
    out = torch.zeros_like(flat)
    pairs = pair_token.shape[0]
    for expert in range(self.num_experts):
        rows = slice(expert * pairs // self.num_experts, (expert + 1) * pairs // self.num_experts)
        if rows.start == rows.stop:  # fewer pairs than experts: this one gets none
            continue
        w1, v1, w2 = (stack[expert] for stack in stacks)
        states = self.mlp(flat[pair_token[rows]], w1, v1, w2)
        states = states.view(-1, self.hidden_size) * pair_weight[rows]
        out.index_add_(0, pair_token[rows], states.to(out.dtype))
    return out.view(batch, -1, self.hidden_size)


def uniform_routing(model: nn.Module) -> int:
    """Run every DBRX experts module of `model` over the pairs dealt out evenly (see the
    module docstring); how many modules were changed."""
    changed = 0
    for module in model.modules():
        if type(module).__name__ == EXPERTS_CLASS:
            module.forward = types.MethodType(_forward, module)  # type: ignore[method-assign]
            changed += 1
    return changed
