"""The caching allocator's reserve on each rank of a data-parallel job, in calibrated.

One GPU reserves `groups`' share of what its tensor peak holds beyond the weights; a rank of
FSDP2 or DDP on two or more GPUs reserves the share measured on ranks traced at their world
size (`parallel`), beyond the weights it keeps (its 1/n shard under FSDP, all of them under
DDP). The shares are read from the data file here, the held bytes from the estimate's own
splits, and the rule is written out again: the per-GPU figure must be that rule with the
parallelism's share, never the single-GPU one.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from controller.calibration import calibrate_allocator
from controller.estimator import Checkpointing, Method, TrainingSettings, calibrated, load_shape
from controller.estimator.result import Estimate
from controller.estimator.settings import Parallelism

SHAPE = load_shape("llama-3.1-8b")
SETTINGS = {
    "full/on": TrainingSettings(method=Method.FULL, rank=None),
    "lora/on": TrainingSettings(method=Method.LORA, rank=16),
    "qlora/off": TrainingSettings(
        method=Method.QLORA, rank=16, gradient_checkpointing=Checkpointing.OFF
    ),
}


def _share(parallelism: str, key: str) -> Fraction:
    section = calibrated.calibration()["allocator"]
    if parallelism:
        section = section["parallel"][parallelism]
    return Fraction(str(section["groups"][key]["share"]))


def _reserve(tensors: int, share: Fraction) -> int:
    """The reserve on `tensors` beyond the weights the GPU keeps."""
    return max(0, tensors) * share.numerator // share.denominator


@pytest.mark.parametrize("key", sorted(SETTINGS))
def test_an_fsdp_rank_reserves_the_fsdp_share_beyond_its_weights_shard(key: str) -> None:
    est = calibrated.estimate(SHAPE, SETTINGS[key])
    fsdp, one = _share("fsdp", key), _share("", key)
    assert fsdp != one  # the data file tells the two apart, so the check below can
    for n in (2, 8):
        sharded, replicated = max(est.fsdp_pairs, key=lambda p: p[0] // n + p[1])
        held = sharded // n + replicated
        tensors = held - est.fixed_bytes - est.resident_bytes // n
        expected = held + _reserve(tensors, fsdp) + est.comm_bytes
        assert est.per_gpu_bytes(n, Parallelism.FSDP) == expected
        assert expected != held + _reserve(tensors, one) + est.comm_bytes
        # what no count of GPUs divides carries the same share
        whole = replicated - est.fixed_bytes - est.resident_bytes // n
        assert est.undivided_bytes(n) == replicated + _reserve(whole, fsdp)


@pytest.mark.parametrize("key", sorted(SETTINGS))
def test_a_ddp_rank_reserves_the_ddp_share_on_the_job_and_its_buckets(key: str) -> None:
    est = calibrated.estimate(SHAPE, SETTINGS[key])
    ddp = _share("ddp", key)
    held = est.sharded_bytes + est.replicated_bytes + est.ddp_bytes
    tensors = held - est.fixed_bytes - est.resident_bytes
    for n in (2, 8):  # the same on any count of two or more
        assert est.per_gpu_bytes(n, Parallelism.DDP) == (
            held + _reserve(tensors, ddp) + est.comm_bytes
        )


@pytest.mark.parametrize("key", sorted(SETTINGS))
def test_one_gpu_and_a_device_map_keep_the_single_gpu_share(key: str) -> None:
    est = calibrated.estimate(SHAPE, SETTINGS[key])
    one = _share("", key)
    whole = est.sharded_bytes + est.replicated_bytes
    assert est.components["allocator_slack"] == _reserve(
        whole - est.fixed_bytes - est.resident_bytes, one
    )
    for parallelism in Parallelism:
        assert est.per_gpu_bytes(1, parallelism) == est.total_bytes
    pairs = ((est.sharded_bytes, est.replicated_bytes), *est.moments)
    held = max(s // 2 + r for s, r in pairs)
    tensors = held - est.fixed_bytes - est.resident_bytes // 2
    assert est.per_gpu_bytes(2, Parallelism.DEVICE_MAP) == held + _reserve(tensors, one)


def test_a_file_without_rank_shares_charges_ranks_the_single_gpu_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = dict(calibrated.calibration())
    data["allocator"] = {k: v for k, v in data["allocator"].items() if k != "parallel"}
    with_ranks = calibrated.estimate(SHAPE, SETTINGS["full/on"])
    monkeypatch.setattr(calibrated, "calibration", lambda: data)
    calibrated.allocator_share.cache_clear()
    try:
        est = calibrated.estimate(SHAPE, SETTINGS["full/on"])
    finally:
        monkeypatch.undo()
        calibrated.allocator_share.cache_clear()
    assert est.fsdp_reserve_share == est.ddp_reserve_share == ()
    assert est.total_bytes == with_ranks.total_bytes
    one = _share("", "full/on")
    held = max(s // 8 + r for s, r in est.fsdp_pairs)
    tensors = held - est.fixed_bytes - est.resident_bytes // 8
    assert est.per_gpu_bytes(8, Parallelism.FSDP) == (
        held + _reserve(tensors, one) + est.comm_bytes
    )
    buckets = est.ddp_bytes + _reserve(est.ddp_bytes, one)
    assert est.per_gpu_bytes(2, Parallelism.DDP) == est.total_bytes + buckets + est.comm_bytes


def _shares() -> dict[str, dict[str, list[float]]]:
    return {
        "": {"full/on": [0.1, 0.2, 0.3]},
        "fsdp": {"full/on": [0.3, 0.5, 0.25, 0.45]},
        "ddp": {"full/on": [0.15, 0.05]},
    }


def test_the_scripts_section_is_what_calibrated_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    section = calibrate_allocator.section(_shares())
    assert section["parallel"]["fsdp"]["world_sizes"] == [2, 8]
    assert section["parallel"]["ddp"]["world_sizes"] == [2]
    data: dict[str, Any] = {"allocator": section}
    monkeypatch.setattr(calibrated, "calibration", lambda: data)
    calibrated.allocator_share.cache_clear()
    try:
        one = calibrated.allocator_share(Method.FULL, "on")
        fsdp = calibrated.allocator_share(Method.FULL, "on", "fsdp")
        ddp = calibrated.allocator_share(Method.FULL, "on", "ddp")
        missing = calibrated.allocator_share(Method.LORA, "on", "fsdp")
    finally:
        monkeypatch.undo()
        calibrated.allocator_share.cache_clear()
    assert Fraction(*one) == Fraction("0.2")  # the medians
    assert Fraction(*fsdp) == Fraction("0.375")
    assert Fraction(*ddp) == Fraction("0.1")
    assert missing == (-1, 1)


@pytest.mark.parametrize(
    ("parallelism", "n"), [(Parallelism.FSDP, 2), (Parallelism.FSDP, 8), (Parallelism.DDP, 2)]
)
def test_a_measured_share_gives_back_the_traced_ranks_reserved_peak(
    parallelism: Parallelism, n: int
) -> None:
    """The script's share, charged by the estimate's per-rank rule on a rank that holds what
    the traced one held, reproduces the traced reserved peak: the share's denominator is the
    rule's."""
    gib = 2**30
    weights, peak, reserved = 15 * gib // 10, 7 * gib, 9 * gib  # a traced rank's figures
    share = calibrate_allocator.rank_share(reserved, peak, weights, parallelism.value, n)
    stored = Fraction(str(round(share, 4)))
    pair = (stored.numerator, stored.denominator)
    if parallelism is Parallelism.FSDP:  # the shards, and the rest the rank holds whole
        sharded, replicated, buckets = weights, peak - weights // n, 0
    else:  # the whole job, and DDP's buckets
        sharded, replicated, buckets = weights, peak - weights - gib, gib
    est = Estimate(
        profile="calibrated",
        components={"weights": weights},
        total_params=0,
        trainable_params=0,
        sharded_bytes=sharded,
        replicated_bytes=replicated,
        reserve_share=(1, 100),
        fsdp_reserve_share=pair if parallelism is Parallelism.FSDP else (),
        ddp_reserve_share=pair if parallelism is Parallelism.DDP else (),
        resident_bytes=weights,
        ddp_bytes=buckets,
    )
    assert est.per_gpu_bytes(n, parallelism) == pytest.approx(reserved, rel=1e-4)
