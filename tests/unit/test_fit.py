"""Multi-GPU fit: DDP, FSDP and device-map answers and their reasons."""

from __future__ import annotations

from controller.estimator import (
    Method,
    Parallelism,
    TrainingSettings,
    estimate,
    fit,
    parse_config,
)
from tests.unit.conftest import GIB, LLAMA_31_8B

LLAMA = parse_config(LLAMA_31_8B)
FULL = estimate(LLAMA, TrainingSettings(method=Method.FULL, rank=None))


def test_ddp_needs_the_whole_job_on_every_gpu() -> None:
    qlora = estimate(LLAMA, TrainingSettings())
    result = fit(qlora, [24 * GIB] * 4, Parallelism.DDP, gpus=4)
    assert result.fits and result.per_gpu_bytes == qlora.per_gpu_bytes(1)
    assert result.gpus == (0, 1, 2, 3)
    no = fit(FULL, [80 * 10**9] * 8, Parallelism.DDP)
    assert not no.fits and "on every GPU with DDP" in no.reason


def test_fsdp_smallest_set_prefers_the_freest_gpus() -> None:
    free = [30 * GIB, 79 * GIB, 50 * GIB, 79 * GIB]
    result = fit(FULL, free, Parallelism.FSDP)
    assert result.fits and result.gpus == (1, 3)


def test_no_number_of_gpus_fits_when_activations_exceed_a_card() -> None:
    huge = estimate(LLAMA, TrainingSettings(method=Method.FULL, rank=None, seq_len=131072, batch=8))
    result = fit(huge, [80 * 10**9] * 64, Parallelism.FSDP)
    assert not result.fits
    assert result.reason.startswith("no number of GPUs fits: activations alone need")


def test_too_few_gpus_says_how_many_would_fit() -> None:
    result = fit(FULL, [24 * GIB] * 2, Parallelism.FSDP)
    assert not result.fits
    assert "needs" in result.reason and "GPUs of that size would fit with FSDP" in result.reason


def test_requested_count_is_honoured_not_silently_widened() -> None:
    result = fit(FULL, [80 * 10**9] * 8, Parallelism.FSDP, gpus=1)
    assert not result.fits and result.gpus == ()
    assert fit(FULL, [80 * 10**9] * 8, Parallelism.FSDP, gpus=3).gpus == (0, 1, 2)
    assert "only 8 are available" in fit(FULL, [GIB] * 8, Parallelism.FSDP, gpus=9).reason


def test_device_map_with_a_requested_count_uses_every_gpu() -> None:
    result = fit(FULL, [80 * 10**9] * 4, Parallelism.DEVICE_MAP, gpus=3)
    assert result.fits and result.gpus == (0, 1, 2)


def test_no_gpus() -> None:
    assert not fit(FULL, [], Parallelism.FSDP).fits
