"""The job's optimizer, pinned to the implementation it runs with on a GPU.

On fake CPU tensors torch's AdamW would pick its CPU default (the per-parameter loop); on a
GPU it picks `foreach`, whose step allocates a parameter-sized scratch list (`sqrt` of the
second moments). So every choice is explicit:

* `adamw` -> `torch.optim.AdamW(foreach=True)`, torch's default on CUDA. Moments in the
  parameter's dtype (bf16 for full bf16 fine-tuning, fp32 for PEFT's fp32 adapters).
* `adamw-torch` (`adamw_torch_fused`) -> `torch.optim.AdamW(fused=True)`: same moments, a
  single in-place kernel, no scratch.
* `sgd` -> `torch.optim.SGD(foreach=True)` without momentum, as Hugging Face's Trainer builds
  it: no state.
* `adamw-fp32-master` -> an fp32 master copy of every trainable parameter, trained by
  `torch.optim.AdamW(foreach=True)` (fp32 moments); at each step the 16-bit gradients are
  cast to fp32 onto the masters, the step runs, the masters are copied back into the 16-bit
  weights and the fp32 gradients are dropped.
* `adamw-8bit` and `paged-adamw-32bit` -> bitsandbytes, whose CUDA kernels cannot run on
  fake tensors, so their state is modelled: `BnbAdamWStorage` allocates what bitsandbytes'
  `Optimizer2State` allocates, and its update, a fused in-place kernel, allocates nothing.
  8-bit: for a tensor of n >= 4096 elements (`min_8bit_size`), two uint8 moments (n bytes
  each) and two fp32 absmax vectors of ceil(n / 256) (blockwise, blocksize 256); smaller
  tensors keep two fp32 moments; plus two 256-entry fp32 quantisation maps per optimizer.
  32-bit: two fp32 moments. Paged memory is still GPU memory while the job runs (paging only
  evicts it under pressure), so it is counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import torch
from torch import nn

from controller.estimator import Optimizer

MIN_8BIT_SIZE = 4096
BLOCKSIZE_8BIT = 256
QMAP_ENTRIES = 256


class TracedOptimizer(Protocol):
    def step(self) -> None: ...

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def state_tensors(self) -> Iterator[torch.Tensor]: ...

    def param_states(self) -> Iterator[tuple[torch.Tensor | None, torch.Tensor]]:
        """Each state tensor with the parameter it belongs to (None: shared by all), so that
        a device map can place it with its parameter's module."""
        ...


class TorchOptimizer:
    """A torch optimizer with its implementation pinned."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:
        self.inner = inner

    def step(self) -> None:
        self.inner.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def state_tensors(self) -> Iterator[torch.Tensor]:
        for _, value in self.param_states():
            yield value

    def param_states(self) -> Iterator[tuple[torch.Tensor | None, torch.Tensor]]:
        for param, state in self.inner.state.items():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    yield param, value


class Fp32MasterAdamW:
    """AdamW on fp32 master copies of 16-bit parameters (ZeRO-style mixed precision)."""

    def __init__(self, params: Sequence[nn.Parameter]) -> None:
        self.params = list(params)
        self.masters = [nn.Parameter(p.detach().to(torch.float32, copy=True)) for p in self.params]
        self.inner = torch.optim.AdamW(self.masters, lr=1e-5, foreach=True)

    def step(self) -> None:
        with torch.no_grad():
            for param, master in zip(self.params, self.masters, strict=True):
                if param.grad is not None:
                    master.grad = param.grad.to(torch.float32, copy=True)
            self.inner.step()
            for param, master in zip(self.params, self.masters, strict=True):
                param.copy_(master)
                master.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            param.grad = None

    def state_tensors(self) -> Iterator[torch.Tensor]:
        for _, value in self.param_states():
            yield value

    def param_states(self) -> Iterator[tuple[torch.Tensor | None, torch.Tensor]]:
        yield from zip(self.params, self.masters, strict=True)
        of_master = {id(m): p for p, m in zip(self.params, self.masters, strict=True)}
        for master, value in TorchOptimizer(self.inner).param_states():
            yield of_master.get(id(master)), value


class BnbAdamWStorage:
    """bitsandbytes' AdamW (8-bit blockwise or 32-bit) as far as memory goes."""

    def __init__(self, params: Sequence[nn.Parameter], eight_bit: bool) -> None:
        self.params = list(params)
        self.eight_bit = eight_bit
        self.state: dict[int, list[torch.Tensor]] = {}
        self.qmaps: list[torch.Tensor] = []

    def _init_state(self, param: nn.Parameter) -> list[torch.Tensor]:
        n = param.numel()
        if self.eight_bit and n >= MIN_8BIT_SIZE:
            if not self.qmaps:
                self.qmaps = [torch.zeros(QMAP_ENTRIES, dtype=torch.float32) for _ in range(2)]
            blocks = -(-n // BLOCKSIZE_8BIT)
            return [
                torch.zeros_like(param, dtype=torch.uint8),
                torch.zeros_like(param, dtype=torch.uint8),
                torch.zeros(blocks, dtype=torch.float32),
                torch.zeros(blocks, dtype=torch.float32),
            ]
        return [torch.zeros_like(param, dtype=torch.float32) for _ in range(2)]

    def step(self) -> None:
        for param in self.params:
            if param.grad is None:
                continue
            if id(param) not in self.state:
                self.state[id(param)] = self._init_state(param)
            # The update itself is one in-place CUDA kernel: it allocates nothing.

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            param.grad = None

    def state_tensors(self) -> Iterator[torch.Tensor]:
        for _, value in self.param_states():
            yield value

    def param_states(self) -> Iterator[tuple[torch.Tensor | None, torch.Tensor]]:
        for qmap in self.qmaps:
            yield None, qmap
        of_id = {id(param): param for param in self.params}
        for key, tensors in self.state.items():
            for value in tensors:
                yield of_id[key], value


def build_optimizer(params: Iterable[nn.Parameter], optimizer: Optimizer) -> TracedOptimizer:
    trainable = [p for p in params if p.requires_grad]
    if optimizer is Optimizer.ADAMW:
        return TorchOptimizer(torch.optim.AdamW(trainable, lr=1e-5, foreach=True))
    if optimizer is Optimizer.ADAMW_TORCH:
        return TorchOptimizer(torch.optim.AdamW(trainable, lr=1e-5, fused=True))
    if optimizer is Optimizer.SGD:
        return TorchOptimizer(torch.optim.SGD(trainable, lr=1e-5, foreach=True))
    if optimizer is Optimizer.ADAMW_FP32_MASTER:
        return Fp32MasterAdamW(trainable)
    if optimizer is Optimizer.ADAMW_8BIT:
        return BnbAdamWStorage(trainable, eight_bit=True)
    return BnbAdamWStorage(trainable, eight_bit=False)
