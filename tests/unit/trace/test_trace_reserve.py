"""The trace's allocator line: its steps replayed through the caching-allocator model.

A GPU shows what PyTorch's caching allocator reserved, not what tensors hold; the trace
replays its own allocations and frees (`controller.allocator`) and reports the difference
as `allocator_reserve` instead of a flat share of the peak.
"""

from __future__ import annotations

import pytest

from tests.unit.trace_support import TINY_LLAMA, require_trace_extra

require_trace_extra()

from controller.allocator.replay import replay_live_intervals  # noqa: E402
from controller.estimator import Method, Parallelism, TrainingSettings, overheads  # noqa: E402
from controller.trace import estimate, trace  # noqa: E402
from controller.trace import run as run_module  # noqa: E402
from controller.trace.distributed import Distributed  # noqa: E402
from controller.trace.run import trace_run  # noqa: E402

FULL = TrainingSettings(method=Method.FULL, rank=None, seq_len=128)
LORA = TrainingSettings(method=Method.LORA, seq_len=128)


def test_a_run_reserves_what_its_intervals_replay_to(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}
    original = run_module._result

    def capture(tracker, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen["intervals"] = tracker.intervals()
        return original(tracker, *args, **kwargs)

    monkeypatch.setattr(run_module, "_result", capture)
    result = trace_run(TINY_LLAMA, FULL)
    replayed = replay_live_intervals(seen["intervals"])
    assert result.reserved == replayed.peak_reserved
    # Segments come in 2 MiB and 20 MiB units and cached blocks stay reserved: more than the
    # tensors' own peak, never less.
    assert result.reserved > result.peak
    assert replayed.peak_allocated >= result.peak


def test_the_report_adds_the_replayed_reserve_not_a_flat_slack() -> None:
    report = trace(TINY_LLAMA, LORA)
    assert "allocator_slack" not in report.extras
    reserve = report.extras["allocator_reserve"]
    result = trace_run(TINY_LLAMA, LORA)
    assert reserve == result.reserved - result.peak
    assert report.total_bytes == (
        report.peak_bytes
        + reserve
        + overheads.CUDA_CONTEXT_BYTES
        + overheads.CUBLAS_WORKSPACE_BYTES
    )


def test_the_estimate_scales_the_reserve_with_each_gpus_tensors() -> None:
    est = estimate(TINY_LLAMA, LORA)
    assert est.components["allocator_reserve"] > 0
    fixed = overheads.CUDA_CONTEXT_BYTES + overheads.CUBLAS_WORKSPACE_BYTES
    tensors = est.total_bytes - fixed - est.components["allocator_reserve"]
    # On one GPU: the tensors times the margin is the tensors plus the reserve.
    assert int((tensors) * est.margin) == pytest.approx(
        tensors + est.components["allocator_reserve"], abs=2
    )


def test_a_rank_on_several_gpus_holds_nccls_buffers() -> None:
    one = trace(TINY_LLAMA, FULL, distributed=Distributed(1))
    two = trace(TINY_LLAMA, FULL, distributed=Distributed(2))
    assert "nccl_buffers" not in one.extras
    assert two.extras["nccl_buffers"] == overheads.NCCL_BYTES_PER_PEER
    est = estimate(TINY_LLAMA, FULL, gpus=2, parallelism=Parallelism.FSDP)
    assert est.per_gpu_bytes(2, Parallelism.FSDP) == two.total_bytes
