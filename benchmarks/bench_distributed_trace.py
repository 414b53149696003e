"""One rank of a multi-GPU job traced at its world size: time, host memory, what it shows.

    python -m benchmarks.bench_distributed_trace [--compare] [--json]

1. Llama-3.1-8B full fine-tuning, FSDP2 at world size 8, 2,048 tokens, batch 1, AdamW,
   checkpointing (the CLI's defaults): `vramgate trace --gpus 8` in a fresh process pinned to
   one core, extended from 4 and 5 layers. Reported: the process's wall time (imports
   included), the trace's own seconds and the process's peak RSS. Target: < 60 s and
   < 4 GiB RAM on one core.
2. Llama-3.2-1B full fine-tuning at world sizes 1, 2, 8 and 64 (FSDP2), and DDP: the traced
   rank's peak of tensor bytes by phase, its per-GPU figure (peak + the per-GPU constants
   and slack), and what the rule on the single-GPU trace (`sharded / n + replicated`) says
   for the same count: what stays on each rank as N grows and what shrinks.
3. With --compare: torch's `FSDPMemTracker` against `StorageTracker` on the same rank
   (Llama-3.1-8B cut to 4 layers, 512 tokens, world size 8, full and LoRA), on the second
   step (FSDPMemTracker, entered after a first step outside it, sees only the steady state).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

GIB = 2**30

_CHILD = (
    "import json, os, resource, sys, time; "
    "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); t = time.perf_counter(); "
    "from controller.cli import main; main(sys.argv[1:]); "
    "print(json.dumps({'wall': time.perf_counter() - t, "
    "'rss': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}), file=sys.stderr)"
)


def eight_b_fsdp8() -> dict[str, Any]:
    argv = ["trace", "--model", "llama-3.1-8b", "--method", "full", "--gpus", "8", "--json"]
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True, check=True
    )
    wall = time.perf_counter() - started
    report = json.loads(done.stdout)
    child = json.loads(done.stderr.strip().splitlines()[-1])
    return {
        "process_seconds": round(wall, 2),
        "trace_seconds": report["seconds"],
        "peak_rss_mib": round(child["rss"] / 2**20),
        "rank_peak_gib": round(report["peak_bytes"] / GIB, 3),
        "rank_per_gpu_gib": round(report["total_bytes"] / GIB, 3),
        "phases_gib": {k: round(v["peak_bytes"] / GIB, 3) for k, v in report["phases"].items()},
        "traced_layers": report["traced_layers"],
    }


def world_sizes(model: str = "llama-3.2-1b") -> dict[str, Any]:
    from controller.estimator import Method, Parallelism, TrainingSettings
    from controller.estimator.presets import load_preset
    from controller.trace import estimate, trace
    from controller.trace.distributed import Distributed

    config = load_preset(model).config
    settings = TrainingSettings(method=Method.FULL, rank=None, seq_len=2048)
    rule = estimate(config, settings)  # the single-GPU trace, spread by the rule
    out: dict[str, Any] = {}
    for parallelism, counts in ((Parallelism.FSDP, (1, 2, 8, 64)), (Parallelism.DDP, (8,))):
        for n in counts:
            report = trace(config, settings, distributed=Distributed(n, parallelism))
            out[f"{model} full {parallelism.value} x{n}"] = {
                "rank_peak_gib": round(report.peak_bytes / GIB, 3),
                "phases_gib": {k: round(v.peak / GIB, 3) for k, v in report.phases.items()},
                "weights_at_peak_gib": round(report.breakdown["weights"] / GIB, 3),
                "traced_per_gpu_gib": round(report.total_bytes / GIB, 3),
                "rule_per_gpu_gib": round(rule.per_gpu_bytes(n, parallelism) / GIB, 3),
                "seconds": round(report.seconds, 2),
            }
    return out


def compare_fsdp_mem_tracker() -> dict[str, Any]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from controller.estimator import Method, TrainingSettings
    from controller.estimator.presets import load_preset
    from controller.trace.build import build_model
    from controller.trace.distributed import (
        Distributed,
        _fully_shard,
        fake_process_group,
        trace_distributed_run,
    )
    from controller.trace.run import decoder_layers

    config = load_preset("llama-3.1-8b").config
    out: dict[str, Any] = {}
    base = TrainingSettings(method=Method.FULL, rank=None, seq_len=512)
    for name, settings in (("full", base), ("lora", replace(base, method=Method.LORA, rank=16))):
        d = Distributed(8)
        ours = trace_distributed_run(config, settings, d, layers=4).result
        second_step = max(s.peak for s in ours.segments if s.step == 1)
        with fake_process_group(8) as mesh, FakeTensorMode():
            model = build_model(config, settings, 4)
            blocks = decoder_layers(model, 4)
            assert blocks is not None
            root = _fully_shard(model, blocks, mesh, d)
            params = [p for p in model.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(params, lr=1e-5, foreach=True)
            ids = torch.zeros((1, settings.seq_len), dtype=torch.long)

            # The first step outside the tracker: under fake tensors FSDPMemTracker also counts
            # DTensor's first-step shape propagation (global-shape tensors, no memory on a GPU).
            _step(root, ids, optimizer)
            with FSDPMemTracker(root, optimizer) as tracker:
                _step(root, ids, optimizer)
            theirs = sum(v["Total"] for v in tracker.get_tracker_snapshot("peak").values())
        out[name] = {
            "storage_tracker_step2_mib": round(second_step / 2**20, 2),
            "fsdp_mem_tracker_step2_mib": round(theirs / 2**20, 2),
            "relative_difference": round(theirs / second_step - 1, 5),
        }
    return out


def _step(model: Any, ids: Any, optimizer: Any) -> None:
    import torch

    loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss
    loss.backward()
    del loss
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--compare", action="store_true", help="also FSDPMemTracker vs ours")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    results: dict[str, Any] = {"machine": machine}
    results["llama-3.1-8b full fsdp x8, 2048 tokens, one core"] = eight_b_fsdp8()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    results |= world_sizes()
    if args.compare:
        results["FSDPMemTracker vs StorageTracker (8B, 4 layers, 512 tokens, x8)"] = (
            compare_fsdp_mem_tracker()
        )
    results["this process peak RSS MiB"] = round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for key, value in results.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
