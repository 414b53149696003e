"""The trainer's switches on one traced rank of an FSDP2 or DDP job, against the single-GPU
trace: the same loss and the same optimizer-in-backward, under the wrappers' hooks.

A 4-layer, 512-wide Llama; for the losses, with a 32,000-token vocabulary so that the logits
weigh (each rank's logits are its own micro-batch's, whole on every rank).
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from typing import Any

import pytest

from tests.unit.trace_support import TINY_LLAMA, require_trace_extra

require_trace_extra()

from controller.cli import main  # noqa: E402
from controller.estimator import (  # noqa: E402
    Loss,
    Method,
    Offloading,
    Parallelism,
    Switches,
    TrainingSettings,
    parse_config,
)
from controller.estimator.storage import static_bytes  # noqa: E402
from controller.trace import TraceUnsupported  # noqa: E402
from controller.trace.distributed import (  # noqa: E402
    Distributed,
    DistributedRun,
    trace_distributed_run,
)
from controller.trace.run import RunResult, trace_run  # noqa: E402
from controller.trace.tracker import OPTIMIZER_STREAM, REDUCE_SCATTER_STREAM  # noqa: E402

WIDE_VOCAB = TINY_LLAMA | {"vocab_size": 32000}
#: Full fine-tuning at 512 tokens: the loss's backward decides the rank's peak.
LOGITS = TrainingSettings(method=Method.FULL, rank=None, seq_len=512)
#: At 64 tokens the optimizer step decides the single-GPU peak.
SHORT = TrainingSettings(method=Method.FULL, rank=None, seq_len=64)
FSDP, DDP = Parallelism.FSDP, Parallelism.DDP


def switched(settings: TrainingSettings, **switches: Any) -> TrainingSettings:
    return replace(settings, switches=Switches(**switches))


@cache
def traced_rank(
    config_key: str, settings: TrainingSettings, world_size: int, parallelism: Parallelism
) -> DistributedRun:
    config = WIDE_VOCAB if config_key == "wide" else TINY_LLAMA
    return trace_distributed_run(config, settings, Distributed(world_size, parallelism))


def rank(
    config_key: str,
    settings: TrainingSettings,
    world_size: int = 8,
    parallelism: Parallelism = FSDP,
) -> RunResult:
    return traced_rank(config_key, settings, world_size, parallelism).result


@cache
def single(config_key: str, settings: TrainingSettings) -> RunResult:
    return trace_run(WIDE_VOCAB if config_key == "wide" else TINY_LLAMA, settings)


def backward(result: RunResult) -> int:
    return result.phase_peaks["backward"].peak


def test_each_loss_lowers_an_fsdp2_rank_whose_logits_decide() -> None:
    plain, chunked, fused = (rank("wide", switched(LOGITS, loss=loss)).peak for loss in Loss)
    assert fused < chunked < plain
    # What the chunked loss saves is the logits' share of one micro-batch: a sizeable part
    # of the rank (8 MiB of its 16-bit logits alone).
    assert plain - chunked > 32000 * 512 * 2


def test_a_ddp_rank_saves_what_one_gpu_saves_by_each_loss() -> None:
    # DDP's rank holds the whole model and its own micro-batch, as one GPU does: the loss's
    # backward holds the same bytes less, to the byte.
    saved = {}
    for where in ("single", "ddp"):
        peaks = {}
        for loss in Loss:
            settings = switched(LOGITS, loss=loss)
            run = single("wide", settings) if where == "single" else rank("wide", settings, 8, DDP)
            peaks[loss] = backward(run)
        saved[where] = (
            peaks[Loss.PLAIN] - peaks[Loss.CHUNKED],
            peaks[Loss.PLAIN] - peaks[Loss.FUSED],
        )
    assert saved["ddp"] == saved["single"]
    assert 0 < saved["single"][0] < saved["single"][1]


def test_optimizer_in_backward_steps_each_shard_and_frees_its_gradient() -> None:
    plain = rank("tiny", SHORT)
    stepped = rank("tiny", switched(SHORT, optimizer_in_backward=True))
    at_step, stepped_at_step = plain.phase_peaks["optimizer"], stepped.phase_peaks["optimizer"]
    # Every shard was stepped (the same moments, a rank's eighth), and no gradient is left
    # for the step phase: its peak loses the sharded gradients and foreach AdamW's scratch.
    assert stepped_at_step.breakdown["optimizer"] == at_step.breakdown["optimizer"] > 0
    assert stepped_at_step.breakdown["gradients"] == 0
    sharded_gradients = at_step.breakdown["gradients"]
    gradients = static_bytes(parse_config(TINY_LLAMA), SHORT).gradients
    assert sharded_gradients == pytest.approx(gradients / 8, rel=0.01)
    assert at_step.peak - stepped_at_step.peak >= 2 * sharded_gradients * 99 // 100
    # In backward, the reduced shards go as they come (the unsharded gradients of the block
    # in flight and of the root, held until their reduce-scatter, stay).
    assert backward(stepped) < backward(plain)
    assert stepped.peak < plain.peak


def test_optimizer_in_backward_on_one_rank_drops_the_gradients_as_on_one_gpu() -> None:
    settings = switched(SHORT, optimizer_in_backward=True)
    gradients = static_bytes(parse_config(TINY_LLAMA), SHORT).gradients
    one_rank = rank("tiny", SHORT, 1).peak - rank("tiny", settings, 1).peak
    one_gpu = single("tiny", SHORT).peak - single("tiny", settings).peak
    # The step decided both; without it the whole gradients (and on one GPU the foreach
    # scratch too) are never held. FSDP2 holds a block's unsharded gradients in backward
    # until its reduce-scatter, which one GPU does not, so one rank saves less than one GPU.
    assert gradients <= one_rank < one_gpu


def test_optimizer_in_backward_under_ddp_steps_each_reduced_bucket() -> None:
    plain = rank("tiny", SHORT, 8, DDP)
    stepped = rank("tiny", switched(SHORT, optimizer_in_backward=True), 8, DDP)
    gradients = static_bytes(parse_config(TINY_LLAMA), SHORT).gradients
    at_step, stepped_at_step = plain.phase_peaks["optimizer"], stepped.phase_peaks["optimizer"]
    assert stepped_at_step.breakdown["optimizer"] == at_step.breakdown["optimizer"] > 0
    # The buckets stay (a whole model's gradients); the gradients DDP copies out of them
    # after the all-reduce are never made.
    assert at_step.breakdown["gradients"] == pytest.approx(2 * gradients, rel=0.01)
    assert stepped_at_step.breakdown["gradients"] == pytest.approx(gradients, rel=0.01)
    assert plain.peak - stepped.peak >= gradients * 3 // 4


def test_the_in_backward_steps_allocate_on_the_streams_that_run_them() -> None:
    # FSDP2 runs the hooks on its reduce-scatter stream; DDP's comm hook on a stream of its
    # own. A replay keeps their blocks apart from the compute stream's.
    settings = switched(SHORT, optimizer_in_backward=True)
    for parallelism, stream in ((FSDP, REDUCE_SCATTER_STREAM), (DDP, OPTIMIZER_STREAM)):
        plain, stepped = (
            sum(1 for *_, s in traced_rank("tiny", each, 8, parallelism).intervals if s == stream)
            for each in (SHORT, settings)
        )
        assert stepped > plain  # the optimizer's state and scratch


def test_activation_offloading_is_refused_by_the_rank_as_by_one_gpu() -> None:
    settings = switched(SHORT, activation_offloading=Offloading.CPU)
    with pytest.raises(TraceUnsupported) as one_gpu:
        trace_run(TINY_LLAMA, settings)
    for parallelism in (FSDP, DDP):
        with pytest.raises(TraceUnsupported) as one_rank:
            trace_distributed_run(TINY_LLAMA, settings, Distributed(8, parallelism))
        assert str(one_rank.value) == str(one_gpu.value)
        assert "\n" not in str(one_rank.value)


def test_cli_traces_a_rank_with_the_switch_flags(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(WIDE_VOCAB))
    argv = ["trace", "--config", str(config), "--method", "full", "--seq-len", "512"]
    assert main([*argv, "--gpus", "8", "--loss", "fused", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["peak_bytes"] == rank("wide", switched(LOGITS, loss=Loss.FUSED)).peak
