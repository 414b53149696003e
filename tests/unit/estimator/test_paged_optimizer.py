"""A paged optimizer's state (bitsandbytes' `paged_adamw_32bit`) at each level a GPU is
measured at: outside PyTorch's caching allocator, so not in the allocated or reserved
level; in NVML's, the figure admission reserves, since its pages stay resident on the GPU
while it has room (`Estimate.paged_bytes`). bitsandbytes pages the state of tensors of
10^5 elements or more; smaller ones get ordinary CUDA tensors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.estimator import (
    Method,
    Optimizer,
    Parallelism,
    Profile,
    TrainingSettings,
    load_shape,
)
from controller.jobs.profiles import estimate

SHAPE = load_shape("llama-3.2-1b")  # 16 layers 2048 wide, MLP 8192, tied embedding
FULL = TrainingSettings(
    method=Method.FULL,
    rank=None,
    seq_len=1024,
    optimizer=Optimizer.PAGED_ADAMW_32BIT,
    profile=Profile.CALIBRATED,
)


def paged_state() -> int:
    """A full fine-tune's paged state: two fp32 moments for every parameter but the norms
    (2,048 each, under bitsandbytes' 10^5 threshold)."""
    norms = sum(sum(layer.other_tensors) * n for layer, n in SHAPE.layer_counts)
    return 8 * (SHAPE.total_params - norms - SHAPE.final_norm_params)


def test_a_full_fine_tune_pages_all_but_the_norms_state() -> None:
    est = estimate(SHAPE, FULL)
    assert est.paged_bytes == paged_state()
    assert est.components["optimizer"] > est.paged_bytes  # the norms' state is not paged


def test_small_adapters_state_stays_in_the_allocator() -> None:
    """LoRA r=16 on q and v of a 2048-wide model: A and B hold 32,768 elements or fewer."""
    lora = replace(FULL, method=Method.LORA, rank=16, targets=("q_proj", "v_proj"))
    assert estimate(SHAPE, lora).paged_bytes == 0


@pytest.mark.parametrize("profile", [Profile.CALIBRATED, Profile.ANALYTIC])
@pytest.mark.parametrize(
    ("gpus", "parallelism", "share"),
    [(1, Parallelism.FSDP, 1), (4, Parallelism.FSDP, 4), (4, Parallelism.DDP, 1)],
)
def test_paged_state_is_in_nvml_only(
    profile: Profile, gpus: int, parallelism: Parallelism, share: int
) -> None:
    est = estimate(SHAPE, replace(FULL, profile=profile))
    assert est.paged_bytes > 0
    levels = est.per_gpu_levels(gpus, parallelism)
    assert levels.nvml == est.per_gpu_bytes(gpus, parallelism)
    state = est.paged_bytes // share  # that GPU's share of it
    assert levels.nvml - levels.reserved >= state  # and the CUDA context, NCCL's buffers
    assert levels.allocated <= levels.nvml - state


def test_the_paged_state_is_resident_and_other_optimizers_are_in_the_allocator() -> None:
    """Calibrated charges the allocator's reserve on what is not resident: the paged state
    is resident (allocated once, outside the allocator). Any other optimizer's state is
    the allocator's: NVML's level over the reserved one is then the CUDA context alone."""
    est = estimate(SHAPE, FULL)
    assert est.resident_bytes == est.components["weights"] + est.paged_bytes
    plain = estimate(SHAPE, replace(FULL, optimizer=Optimizer.ADAMW))
    assert plain.paged_bytes == 0
    levels = plain.per_gpu_levels(1)
    assert levels.nvml - levels.reserved == plain.components["cuda_context"]
