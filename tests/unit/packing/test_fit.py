"""Fit on N GPUs: DDP, FSDP and device-map answers, the smallest count, and their reasons."""

from __future__ import annotations

from controller.estimator import (
    MAX_GPUS,
    Method,
    Parallelism,
    TrainingSettings,
    parse_config,
)
from controller.jobs.profiles import estimate
from controller.packing.fit import fit, gib
from tests.unit.conftest import GIB, LLAMA_31_8B

LLAMA = parse_config(LLAMA_31_8B)
FULL = estimate(LLAMA, TrainingSettings(method=Method.FULL, rank=None))
QLORA = estimate(LLAMA, TrainingSettings())


def test_one_gpu_holds_the_total_whatever_the_parallelism() -> None:
    for parallelism in Parallelism:
        assert QLORA.per_gpu_bytes(1, parallelism) == QLORA.total_bytes


def test_ddp_holds_the_whole_job_on_every_gpu_at_any_count() -> None:
    for n in (1, 2, 8):
        assert FULL.per_gpu_bytes(n, Parallelism.DDP) == FULL.total_bytes
    result = fit(QLORA, [24 * GIB] * 4, Parallelism.DDP, gpus=4)
    assert result.fits and result.per_gpu_bytes == QLORA.total_bytes
    assert result.chosen == (0, 1, 2, 3) and result.min_gpus == 1
    no = fit(FULL, [80 * 10**9] * 8, Parallelism.DDP, gpus=2)
    assert not no.fits and no.min_gpus is None
    assert "per GPU on 2 GPUs with DDP" in no.reason


def test_fsdp_takes_the_freest_gpus() -> None:
    free = [30 * GIB, 79 * GIB, 50 * GIB, 79 * GIB]
    result = fit(FULL, free, Parallelism.FSDP, gpus=2)
    assert result.fits and result.chosen == (1, 3)


def test_fsdp_per_gpu_figure_shrinks_with_the_count_and_keeps_the_margin() -> None:
    two = FULL.per_gpu_bytes(2, Parallelism.FSDP)
    four = FULL.per_gpu_bytes(4, Parallelism.FSDP)
    assert four < two < FULL.total_bytes
    assert two == int((FULL.sharded_bytes // 2 + FULL.replicated_bytes) * FULL.margin)


def test_no_number_of_gpus_fits_when_activations_exceed_a_card() -> None:
    huge = estimate(LLAMA, TrainingSettings(method=Method.FULL, rank=None, seq_len=131072, batch=8))
    result = fit(huge, [80 * 10**9] * 64, Parallelism.FSDP, gpus=64)
    assert not result.fits and result.min_gpus is None
    most = gib(huge.per_gpu_bytes(MAX_GPUS, Parallelism.FSDP))
    whole = gib(huge.undivided_bytes(MAX_GPUS))
    assert result.reason.startswith(
        f"no number of GPUs fits: even on 4,096 GPUs each needs {most}, {whole} of it what "
        "FSDP does not divide (activations, buffers)"
    )


def test_an_unfitting_count_says_which_count_would_fit() -> None:
    result = fit(FULL, [80 * 10**9] * 8, Parallelism.FSDP, gpus=1)
    assert not result.fits and result.chosen == ()
    assert result.min_gpus == 2
    assert result.min_gpus_per_gpu_bytes == FULL.per_gpu_bytes(2, Parallelism.FSDP)
    assert "(2 GPUs would fit with FSDP" in result.reason


def test_requested_count_is_honoured_not_silently_widened() -> None:
    assert fit(FULL, [80 * 10**9] * 8, Parallelism.FSDP, gpus=3).chosen == (0, 1, 2)
    assert "only 8 are available" in fit(FULL, [GIB] * 8, Parallelism.FSDP, gpus=9).reason


def test_device_map_with_a_requested_count_uses_every_gpu() -> None:
    result = fit(FULL, [80 * 10**9] * 4, Parallelism.DEVICE_MAP, gpus=3)
    assert result.fits and result.chosen == (0, 1, 2)


def test_device_map_charges_the_logits_to_the_lm_head_gpu_only() -> None:
    assert FULL.head_bytes == FULL.components["logits"] > 0
    head = FULL.per_gpu_bytes(4, Parallelism.DEVICE_MAP)
    rest = FULL.device_map_min_bytes(4)
    logits = int(FULL.head_bytes * FULL.margin)
    assert head - rest in (logits, logits + 1)  # the margin rounds each figure down apart


def test_device_map_failure_names_the_binding_constraint() -> None:
    pool_short = fit(FULL, [30 * GIB] * 2, Parallelism.DEVICE_MAP, gpus=2)
    assert not pool_short.fits and "in total" in pool_short.reason
    # A pool that is large enough, but a second GPU too small for its share.
    skewed = fit(QLORA, [40 * GIB, 2 * GIB], Parallelism.DEVICE_MAP, gpus=2)
    assert not skewed.fits and "per-GPU minimum" in skewed.reason


def test_the_count_search_is_linear_in_the_number_of_gpus() -> None:
    result = fit(FULL, [80 * 10**9] * 4096, Parallelism.FSDP, gpus=4096)
    assert result.fits and result.min_gpus == 2


def test_no_gpus() -> None:
    result = fit(FULL, [], Parallelism.FSDP)
    assert not result.fits and result.min_gpus is None


def test_calibrated_slack_grows_with_each_gpus_share_not_the_whole_job() -> None:
    from controller.estimator import Profile, load_shape
    from controller.estimator.overheads import PER_GPU_EXTRAS
    from controller.jobs.profiles import estimate as estimate_profile

    shape = load_shape("llama-3.1-70b")
    full = estimate_profile(
        shape, TrainingSettings(method=Method.FULL, rank=None, profile=Profile.CALIBRATED)
    )
    fixed = sum(full.components[k] for k in PER_GPU_EXTRAS)
    assert full.fixed_bytes == fixed
    eight = full.per_gpu_bytes(8, Parallelism.FSDP)
    held = full.sharded_bytes // 8 + full.replicated_bytes - fixed
    # the allocator's reserve is a share of what each GPU holds beyond its share of the
    # weights (allocated once, they leave nothing cached): an FSDP rank's own share
    num, den = full.fsdp_reserve_share
    reserve = (held - full.resident_bytes // 8) * num // den
    assert eight == held + reserve + fixed + full.comm_bytes
    # The whole job's slack alone would be more than its 8-way share of everything.
    assert full.components["allocator_slack"] > eight - held - fixed
