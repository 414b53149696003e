"""The fewest-GPUs search ends, whatever each GPU holds besides its share."""

from __future__ import annotations

from controller.base.units import GIB, MIB
from controller.decision.explain import _fsdp_count
from controller.decision.types import JobRequest
from controller.estimator import Estimate, Parallelism


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
    job = JobRequest(key="ns/j", estimate=est, parallelism=Parallelism.FSDP, gpus=1)
    assert _fsdp_count(job, largest) is None
    # with room for a share, the fewest count that leaves it
    # 10 GiB / 160 is 64 MiB, one byte over the room: 161
    assert _fsdp_count(job, largest + 64 * MIB) == 161
