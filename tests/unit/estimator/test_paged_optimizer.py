"""A paged optimizer's state (bitsandbytes' `paged_adamw_32bit`) at each level a GPU is
measured at: outside PyTorch's caching allocator, so not in the allocated or reserved
level; in NVML's, the figure admission reserves, since its pages stay resident on the GPU
while it has room (`Estimate.paged_bytes`)."""

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
    static_bytes,
)
from controller.jobs.profiles import estimate

SHAPE = load_shape("llama-3.2-1b")
FULL = TrainingSettings(method=Method.FULL, rank=None, seq_len=1024, profile=Profile.CALIBRATED)
PAGED = replace(FULL, optimizer=Optimizer.PAGED_ADAMW_32BIT)


def state_bytes() -> int:
    """Two fp32 moments per trainable parameter, as bitsandbytes' 32-bit state holds them."""
    return static_bytes(SHAPE, PAGED).optimizer


def test_the_state_is_two_fp32_moments_per_trainable_parameter() -> None:
    assert state_bytes() >= 8 * SHAPE.total_params


@pytest.mark.parametrize("profile", [Profile.CALIBRATED, Profile.ANALYTIC])
@pytest.mark.parametrize(
    ("gpus", "parallelism", "share"),
    [(1, Parallelism.FSDP, 1), (4, Parallelism.FSDP, 4), (4, Parallelism.DDP, 1)],
)
def test_paged_state_is_in_nvml_only(
    profile: Profile, gpus: int, parallelism: Parallelism, share: int
) -> None:
    est = estimate(SHAPE, replace(PAGED, profile=profile))
    assert est.paged_bytes == est.components["optimizer"] > 0
    levels = est.per_gpu_levels(gpus, parallelism)
    assert levels.nvml == est.per_gpu_bytes(gpus, parallelism)
    outside = levels.nvml - levels.reserved
    assert outside >= state_bytes() // share  # the GPU's share of the state, and the context
    assert levels.allocated <= levels.nvml - state_bytes() // share


def test_the_paged_state_is_resident_and_other_optimizers_are_in_the_allocator() -> None:
    """Calibrated charges the allocator's reserve on what is not resident: the paged state
    is resident (allocated once, outside the allocator). Any other optimizer's state is
    the allocator's: NVML's level over the reserved one is then the CUDA context alone."""
    est = estimate(SHAPE, PAGED)
    assert est.resident_bytes == est.components["weights"] + est.paged_bytes
    plain = estimate(SHAPE, replace(PAGED, optimizer=Optimizer.ADAMW))
    assert plain.paged_bytes == 0
    levels = plain.per_gpu_levels(1)
    assert levels.nvml - levels.reserved == plain.components["cuda_context"]
