"""What a trace cannot see, as documented constants, reported apart from the traced peak.

Shared by the `trace` and `calibrated` profiles (pure: no torch).

The trace counts tensor storages: what `torch.cuda.max_memory_allocated()` reports. A GPU
holds more than that while the job runs; each extra is a constant here with its source, and
each is reported as its own line so nobody mistakes it for a measurement.
"""

from __future__ import annotations

from fractions import Fraction

from controller.base.units import MIB
from controller.estimator.unsloth import CUDA_OVERHEAD_BYTES

#: CUDA driver context + PyTorch runtime (kernels, cuBLAS/cuDNN handles) outside the caching
#: allocator. Source: seed 1 (unsloth-vram-estimation.md, section 7), "1.4 GB fixed",
#: calibrated on an RTX 5070 Ti; the same constant the `unsloth` profile adds.
CUDA_CONTEXT_BYTES = CUDA_OVERHEAD_BYTES

#: cuBLAS workspaces: allocated through the caching allocator (so in max_memory_allocated on a
#: GPU) but by no op a fake tensor runs. PyTorch's default CUBLAS_WORKSPACE_CONFIG on Hopper
#: is ":4096:8" = 8 x 4 MiB per handle; one handle for the forward thread and one for
#: autograd's device thread. Source: torch/csrc/cuda/CublasHandlePool.cpp (getChosenWorkspaceSize).
CUBLAS_WORKSPACE_BYTES = 2 * 8 * 4 * MIB

#: Caching-allocator slack: memory the allocator has reserved but not handed out at the peak
#: (block rounding above 1 MiB to 2 MiB / 20 MiB segments, fragmentation between freed
#: blocks). There is no exact figure; seed 2 (finetuning-vram-calculator.md) charges 10 % for
#: "CUDA context, cuBLAS workspace and allocator fragmentation" together. Used only where
#: nothing better is known: the trace replays its allocations through the allocator model
#: (`controller.allocator`) and calibrated charges the share those replays measured
#: (`calibration.json`'s `allocator`, 10 to 24 % of the tensors beyond the weights); a flat
#: 10 % of the whole peak over-reserves large models and under-reserves small ones.
ALLOCATOR_SLACK = Fraction(1, 10)

#: Not added to a single-GPU estimate, reported for multi-GPU jobs: NCCL's buffers, 4 MiB
#: (NCCL_BUFFSIZE default) per channel per peer and direction; with up to 32 channels on
#: NVLink that is 2 x 32 x 4 MiB = 256 MiB per peer. Source: NCCL environment-variable docs
#: (NCCL_BUFFSIZE, NCCL_MAX_NCHANNELS). DDP also keeps gradient buckets (25 MiB each, all
#: gradients once unless gradient_as_bucket_view=True), which a single-GPU trace omits.
NCCL_BYTES_PER_PEER = 2 * 32 * 4 * MIB


def slack_bytes(traced_peak: int) -> int:
    """`int(traced_peak * ALLOCATOR_SLACK)` in integers (truncated toward zero, as `int` of
    a Fraction is): Fraction arithmetic costs microseconds an estimate can spare."""
    scaled = traced_peak * ALLOCATOR_SLACK.numerator
    if scaled >= 0:
        return scaled // ALLOCATOR_SLACK.denominator
    return -(-scaled // ALLOCATOR_SLACK.denominator)


#: The component names these constants appear under in an estimate, in order.
EXTRAS = ("cuda_context", "cublas_workspace", "allocator_slack")
#: The extras each GPU holds whatever its share of the job: they do not shrink with sharding.
PER_GPU_EXTRAS = ("cuda_context", "cublas_workspace")
#: The slack as an estimate's margin: it grows with the tensors each GPU holds.
SLACK_MARGIN = 1 + ALLOCATOR_SLACK


def extras(traced_peak: int) -> dict[str, int]:
    return {
        "cuda_context": CUDA_CONTEXT_BYTES,
        "cublas_workspace": CUBLAS_WORKSPACE_BYTES,
        "allocator_slack": slack_bytes(traced_peak),
    }
