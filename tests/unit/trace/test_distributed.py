"""One rank of an FSDP2 or DDP job, traced at its world size under the fake process group.

The 4-layer, 512-wide Llama at 128 tokens traces in about a second per world size.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from tests.unit.trace_support import TINY_LLAMA, require_trace_extra, with_layers

require_trace_extra()

from controller.cli import main  # noqa: E402
from controller.estimator import Method, Parallelism, Precision, TrainingSettings  # noqa: E402
from controller.estimator.presets import load_preset  # noqa: E402
from controller.trace import TraceUnsupported, estimate, trace  # noqa: E402
from controller.trace.distributed import (  # noqa: E402
    Distributed,
    DistributedRun,
    trace_distributed_run,
)
from controller.trace.run import RunResult, trace_run  # noqa: E402
from controller.trace.tracker import (  # noqa: E402
    ALL_GATHER_STREAM,
    COMPUTE_STREAM,
    REDUCE_SCATTER_STREAM,
    allocated_bytes,
)

FULL = TrainingSettings(method=Method.FULL, rank=None, seq_len=128)
LORA = TrainingSettings(method=Method.LORA, seq_len=128)
QLORA = TrainingSettings(method=Method.QLORA, seq_len=128)
FSDP = Parallelism.FSDP
DDP = Parallelism.DDP

#: One decoder block of TINY_LLAMA in bf16: q, o (512 x 512), k, v (128 x 512), gate, up,
#: down (1536 x 512), two norms (512).
BLOCK_BYTES = 2 * (2 * 512 * 512 + 2 * 128 * 512 + 3 * 1536 * 512 + 2 * 512)

_RUNS: dict[tuple[Any, ...], DistributedRun] = {}


def rank(settings: TrainingSettings = FULL, **options: Any) -> DistributedRun:
    """One traced rank (cached: several tests read the same run)."""
    options.setdefault("world_size", 8)
    key = (settings, tuple(sorted(options.items())))
    if key not in _RUNS:
        _RUNS[key] = trace_distributed_run(TINY_LLAMA, settings, Distributed(**options))
    return _RUNS[key]


_SINGLE: dict[TrainingSettings, RunResult] = {}


def single_gpu(settings: TrainingSettings = FULL) -> RunResult:
    if settings not in _SINGLE:
        _SINGLE[settings] = trace_run(TINY_LLAMA, settings)
    return _SINGLE[settings]


def phase(result: RunResult, name: str) -> int:
    return result.phase_peaks[name].peak


def test_sharded_state_shrinks_with_the_world_size_and_the_gathered_block_stays() -> None:
    peaks = {n: rank(world_size=n).result for n in (2, 8, 64)}
    # The optimizer step holds only shards: it shrinks about as 1 / n.
    assert phase(peaks[2], "optimizer") > 3 * phase(peaks[8], "optimizer")
    assert phase(peaks[8], "optimizer") > 6 * phase(peaks[64], "optimizer")
    assert peaks[2].peak > peaks[8].peak > peaks[64].peak
    for result in peaks.values():
        # Forward holds at least one whole gathered block's weights on every rank...
        assert result.phase_peaks["forward"].breakdown["weights"] >= BLOCK_BYTES
    # ...so at 64 ranks forward and backward stay far above a 64th of one GPU's step.
    single = single_gpu()
    assert peaks[64].peak > single.peak / 8


def test_one_rank_of_one_is_the_single_gpu_step() -> None:
    single = single_gpu()
    one = rank(world_size=1).result
    # The peak is the optimizer step's on both: the same weights, gradients and states.
    assert one.peak == pytest.approx(single.peak, rel=0.01)
    assert one.phase_peaks["optimizer"].breakdown["optimizer"] == pytest.approx(
        single.phase_peaks["optimizer"].breakdown["optimizer"], rel=0.01
    )


def test_keeping_gathered_blocks_after_forward_holds_more() -> None:
    kept = rank(reshard_after_forward=False).result
    freed = rank(reshard_after_forward=True).result
    assert phase(kept, "forward") > phase(freed, "forward") + 2 * BLOCK_BYTES // 8
    assert phase(kept, "backward") > phase(freed, "backward")
    assert phase(kept, "optimizer") == phase(freed, "optimizer")


def test_explicit_prefetch_gathers_the_next_block_in_forward() -> None:
    implicit = rank().result
    ahead = rank(prefetch=1).result
    assert phase(ahead, "forward") >= phase(implicit, "forward") + BLOCK_BYTES * 7 // 8 // 2


def test_mixed_precision_gathers_16_bit_blocks_from_fp32_shards() -> None:
    fp32 = replace(FULL, precision=Precision.FP32)
    plain = rank(fp32).result.phase_peaks["forward"].breakdown["weights"]
    mixed = rank(fp32, param_dtype=Precision.BF16).result.phase_peaks["forward"].breakdown
    # The gathered block (and the root's embeddings) in bf16: half of fp32's, on top of the
    # same fp32 shards.
    assert mixed["weights"] < plain - BLOCK_BYTES // 2


def test_ddp_holds_whole_gradients_and_its_buckets() -> None:
    single = single_gpu()
    buckets = rank(parallelism=DDP).result
    views = rank(parallelism=DDP, gradient_as_bucket_view=True).result
    grads = single.phase_peaks["optimizer"].breakdown["gradients"]
    # Separate buckets: every gradient twice, on any number of ranks.
    assert buckets.peak >= single.peak + grads * 9 // 10
    assert buckets.phase_peaks["optimizer"].breakdown["gradients"] >= 2 * grads * 9 // 10
    # Gradients as views into the buckets: as on one GPU.
    assert views.peak == pytest.approx(single.peak, rel=0.01)
    assert rank(parallelism=DDP, world_size=64).result.peak == buckets.peak


def test_lora_and_qlora_shard_under_fsdp2() -> None:
    for settings in (LORA, QLORA):
        single = single_gpu(settings)
        eight = rank(settings, world_size=8).result
        assert eight.trainable_params == single.trainable_params > 0
        assert eight.peak < single.peak
        # The adapters, their gradients and moments: sharded 8 ways (the batch stays).
        assert phase(eight, "optimizer") < phase(single, "optimizer") / 4


def test_parameter_offload_leaves_shards_and_optimizer_on_the_host() -> None:
    on_gpu = rank().result
    offloaded = rank(offload_params=True).result
    assert phase(offloaded, "optimizer") < phase(on_gpu, "optimizer") / 10
    assert offloaded.peak < on_gpu.peak
    # The optimizer alone on the host: its moments leave, the shards and gradients stay.
    optimizer_only = rank(offload_optimizer=True).result.phase_peaks["optimizer"].breakdown
    assert optimizer_only["optimizer"] == 0
    assert optimizer_only["weights"] == on_gpu.phase_peaks["optimizer"].breakdown["weights"]


def test_the_process_group_is_set_up_again_on_every_call() -> None:
    import torch.distributed as dist

    first = trace_distributed_run(TINY_LLAMA, FULL, Distributed(4))
    assert not dist.is_initialized()
    second = trace_distributed_run(TINY_LLAMA, FULL, Distributed(4))
    assert second.result.peak == first.result.peak
    assert not dist.is_initialized()


def test_intervals_replay_to_the_tracked_peak() -> None:
    run = rank()
    events: list[tuple[int, int]] = []
    for size, born, died, _stream in run.intervals:
        events.append((born, allocated_bytes(size)))
        if died is not None:
            events.append((died, -allocated_bytes(size)))
    live = peak = 0
    for _tick, change in sorted(events):  # a tick is one event: no two share one
        live += change
        peak = max(peak, live)
    assert peak == run.result.peak
    streams = {stream for *_, stream in run.intervals}
    assert streams == {COMPUTE_STREAM, ALL_GATHER_STREAM, REDUCE_SCATTER_STREAM}
    # The all-gather buffers: one block's parameters, gathered from all ranks.
    gathered = [size for size, *_, stream in run.intervals if stream == ALL_GATHER_STREAM]
    assert max(gathered) >= BLOCK_BYTES


def test_deep_models_extend_from_two_shallow_ranks() -> None:
    deep = with_layers(TINY_LLAMA, 7)
    d = Distributed(4)
    whole = trace(deep, FULL, "full", d)
    extended = trace(deep, FULL, 4, d)
    assert extended.traced_layers == (4, 5)
    assert extended.peak_bytes == pytest.approx(whole.peak_bytes, rel=0.005)
    for name, seg in whole.phases.items():
        assert extended.phases[name].peak == pytest.approx(seg.peak, rel=0.005)


def test_the_trace_estimate_carries_the_traced_rank() -> None:
    est = estimate(TINY_LLAMA, FULL, gpus=4, parallelism=FSDP)
    traced = trace(TINY_LLAMA, FULL, distributed=Distributed(4))
    assert est.traced_per_gpu == (("fsdp", 4, traced.total_bytes),)
    assert est.per_gpu_bytes(4, FSDP) == traced.total_bytes
    # Other counts keep the rule on the single-GPU split.
    assert est.per_gpu_bytes(2, FSDP) == replace(est, traced_per_gpu=()).per_gpu_bytes(2, FSDP)
    # The rank's allocated level is its own tensor peak, not the single-GPU job's share of
    # its figure: a rank reserves more beside its tensors (collectives' own streams).
    levels = est.per_gpu_levels(4, FSDP)
    assert est.traced_allocated == (("fsdp", 4, traced.peak_bytes),)
    assert levels.allocated == traced.peak_bytes < levels.reserved <= levels.nvml
    reserve = traced.extras["allocator_reserve"]
    assert levels.reserved - levels.allocated >= reserve


def test_what_cannot_be_traced_says_so_in_a_line() -> None:
    with pytest.raises(TraceUnsupported, match="only FSDP and DDP"):
        trace_distributed_run(TINY_LLAMA, FULL, Distributed(2, Parallelism.DEVICE_MAP))
    with pytest.raises(TraceUnsupported, match="mixed-precision"):
        trace_distributed_run(TINY_LLAMA, FULL, Distributed(2, DDP, param_dtype=FULL.precision))


def test_cli_traces_a_rank(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_LLAMA))
    argv = ["trace", "--config", str(config), "--method", "full", "--seq-len", "128"]
    assert main([*argv, "--gpus", "8", "--prefetch", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["distributed"]["world_size"] == 8
    assert out["distributed"]["prefetch"] == 1
    assert out["peak_bytes"] == rank(prefetch=1).result.peak
    assert main([*argv, "--gpus", "8"]) == 0
    assert "one rank of 8 under FSDP" in capsys.readouterr().out


def test_a_preset_traces_at_its_real_widths() -> None:
    """Llama-3.1-8B cut to 4 layers at 8 ranks: what the 8B benchmark extends from."""
    config = load_preset("llama-3.1-8b").config
    small = replace(FULL, seq_len=64)
    result = trace_distributed_run(config, small, Distributed(8), layers=4).result
    params = result.total_params
    # bf16 shards, gradients and AdamW moments: 8 bytes a parameter over 8 ranks, at least.
    assert result.peak >= 8 * params // 8
    assert result.peak < 8 * params // 2
