"""The fewest-GPUs search ends, whatever each GPU holds besides its share."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.base.units import GIB, MIB
from controller.estimator import (
    DEFAULT_SWITCHES,
    MAX_GPUS,
    Estimate,
    LoadPath,
    Method,
    Parallelism,
    Profile,
    Switches,
    TrainingSettings,
    load_shape,
)
from controller.jobs.profiles import estimate
from controller.packing.fit import fewest_fsdp_gpus


def test_a_count_search_that_no_count_satisfies_gives_up() -> None:
    """NCCL's buffers sit on every GPU beside the moments the search tests first: a GPU
    that holds the undivided part but not the buffers too is held by no count (the search
    used to count up forever)."""
    est = Estimate(
        profile="calibrated",
        components={"weights": 10 * GIB, "activations": 2 * GIB},
        total_params=1,
        trainable_params=1,
        sharded_bytes=10 * GIB,
        replicated_bytes=2 * GIB,
        comm_bytes=256 * MIB,
    )
    largest = 2 * GIB + 256 * MIB - 1  # the undivided part fits, with the buffers it does not
    assert fewest_fsdp_gpus(est, largest) is None
    # with room for a share, the fewest count that leaves it
    # 10 GiB / 160 is 64 MiB, one byte over the room: 161
    assert fewest_fsdp_gpus(est, largest + 64 * MIB) == 161


def _counted_up(est: Estimate, largest: int) -> int | None:
    holding = (n for n in range(1, MAX_GPUS + 1) if est.per_gpu_bytes(n, FSDP) <= largest)
    return next(holding, None)


FSDP = Parallelism.FSDP
WHOLE_MODEL = Switches(load_path=LoadPath.WHOLE_MODEL_PER_RANK)


@pytest.mark.parametrize("preset", ["llama-3.1-8b", "qwen2.5-7b", "llama-3.1-70b", "mixtral-8x7b"])
@pytest.mark.parametrize("method", [Method.FULL, Method.LORA, Method.QLORA])
@pytest.mark.parametrize("case", ["plain", "whole model per rank", "corrected 0.6x"])
def test_the_fewest_count_is_the_one_counting_up_finds(
    preset: str, method: Method, case: str
) -> None:
    """The allocator's reserve is a share of what a GPU holds beyond its weights, not the
    profile's one-GPU margin on all of it: a search started from a bound that assumed the
    margin said 2 GPUs of 16 GiB hold Llama-3.1-8B QLoRA, where one does. Nor is the need
    monotone in the count: a load that holds the whole model on every rank grows with it."""
    rank = None if method is Method.FULL else 16
    switches = WHOLE_MODEL if case == "whole model per rank" else DEFAULT_SWITCHES
    settings = TrainingSettings(
        method=method, rank=rank, profile=Profile.CALIBRATED, switches=switches
    )
    est = estimate(load_shape(preset), settings)
    if case == "corrected 0.6x":  # a learned correction below 1 (controller.learning)
        est = replace(est, correction_percent=60)
    for largest in (10 * GIB, 16 * GIB, 19 * GIB, 24 * GIB, 45 * GIB, 48 * GIB, 80 * GIB):
        assert fewest_fsdp_gpus(est, largest) == _counted_up(est, largest), f"{largest // GIB} GiB"


def test_a_count_the_trace_measured_is_its_own_figure() -> None:
    """The rule says 4 GPUs of 30 GiB; the trace measured 5 ranks at 99 GiB each and 3 at
    20: the fewest is 3, and 5 is skipped."""
    est = Estimate(
        profile="trace",
        components={"weights": 100 * GIB, "activations": 2 * GIB},
        total_params=1,
        trainable_params=1,
        sharded_bytes=100 * GIB,
        replicated_bytes=2 * GIB,
        traced_per_gpu=(("fsdp", 5, 99 * GIB), ("fsdp", 3, 20 * GIB)),
    )
    assert fewest_fsdp_gpus(est, 30 * GIB) == 3 == _counted_up(est, 30 * GIB)
    assert fewest_fsdp_gpus(est, 19 * GIB) == _counted_up(est, 19 * GIB) == 6
