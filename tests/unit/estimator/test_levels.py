"""One GPU's figure at the three levels people measure: allocated, reserved, NVML."""

from __future__ import annotations

import pytest

from controller.estimator import (
    Method,
    Parallelism,
    Profile,
    TrainingSettings,
    formula_estimate,
    load_shape,
)
from controller.estimator.result import NCCL_BYTES

SHAPE = load_shape("llama-3.1-8b")


def _estimate(profile: Profile, method: Method = Method.LORA):  # type: ignore[no-untyped-def]
    rank = None if method is Method.FULL else 16
    return formula_estimate(SHAPE, TrainingSettings(method=method, rank=rank, profile=profile))


def test_calibrated_levels_peel_the_context_nccl_and_reserve_off_the_nvml_figure() -> None:
    est = _estimate(Profile.CALIBRATED)
    one = est.per_gpu_levels(1)
    c = est.components
    assert one.nvml == est.total_bytes
    assert one.reserved == est.total_bytes - c["cuda_context"]
    # the tensors (and cuBLAS's workspace, which the allocator hands out) without the reserve
    assert one.allocated == pytest.approx(one.reserved - c["allocator_slack"], abs=2)
    eight = est.per_gpu_levels(8, Parallelism.FSDP)
    assert eight.nvml == est.per_gpu_bytes(8, Parallelism.FSDP)
    assert eight.reserved == eight.nvml - c["cuda_context"] - NCCL_BYTES
    assert 0 < eight.allocated < eight.reserved < eight.nvml
    # a device map is one process: no NCCL communicator to take off
    dm = est.per_gpu_levels(4, Parallelism.DEVICE_MAP)
    assert dm.reserved == dm.nvml - c["cuda_context"]


@pytest.mark.parametrize("profile", [Profile.ANALYTIC, Profile.UNSLOTH, Profile.CALIBRATED])
@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_levels_are_ordered_for_every_profile(profile: Profile, gpus: int) -> None:
    est = _estimate(profile, Method.FULL)
    for parallelism in (Parallelism.FSDP, Parallelism.DDP):
        levels = est.per_gpu_levels(gpus, parallelism)
        assert 0 < levels.allocated <= levels.reserved <= levels.nvml
        assert levels.nvml == est.per_gpu_bytes(gpus, parallelism)


def test_analytic_allocated_is_its_figure_without_its_ten_percent() -> None:
    est = _estimate(Profile.ANALYTIC)
    levels = est.per_gpu_levels(1)
    assert levels.allocated == pytest.approx(est.total_bytes / 1.1, rel=1e-6)
    assert levels.reserved == levels.nvml  # analytic's 10 % stands for both
