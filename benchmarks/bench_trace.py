"""Trace time and host memory, and calibrated estimates per second.

    python -m benchmarks.bench_trace [--seconds 3] [--json]

Trace: Llama-3.1-8B, full fine-tuning and LoRA (r=16, all-linear), 2,048 tokens, batch 1,
checkpointing, AdamW; each case in a fresh process, once extended from 4 and 5 layers (the
default for a 32-layer model) and once traced whole; and LoRA of two MoE models,
Mixtral 8x7B and DeepSeek-V3 (671B, 256 experts), at the default depths only. Reported:
the process's wall time (imports included), the trace's own seconds, and the process's peak
RSS. Targets (issue 5):
under 30 s and 2 GiB on 2 cores.

Calibrated: estimates per second from a preset on one core (the process pins itself to one
CPU), target >= 20,000/s.
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

from benchmarks.bench_estimator import rate

#: name: (model, options, depths traced)
CASES = {
    "llama-3.1-8b full": ("llama-3.1-8b", ["--method", "full"], ("auto", "full")),
    "llama-3.1-8b lora": ("llama-3.1-8b", ["--method", "lora"], ("auto", "full")),
    "mixtral-8x7b lora": ("mixtral-8x7b", ["--method", "lora"], ("auto",)),
    "deepseek-v3 lora": ("deepseek-v3", ["--method", "lora"], ("auto",)),
}
_CHILD = (
    "import json, resource, sys, time; t = time.perf_counter(); "
    "from controller.cli import main; main(sys.argv[1:]); "
    "print(json.dumps({'wall': time.perf_counter() - t, "
    "'rss': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}), file=sys.stderr)"
)


def trace_case(model: str, args: list[str], layers: str) -> dict[str, float]:
    argv = ["trace", "--model", model, *args, "--trace-layers", layers, "--json"]
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
        "peak_gib": round(report["peak_bytes"] / 2**30, 3),
    }


def calibrated_rate(model: str, seconds: float) -> float:
    from controller.estimator import Method, Profile, TrainingSettings, load_shape
    from controller.jobs.profiles import estimate

    shape = load_shape(model)
    settings = TrainingSettings(method=Method.LORA, profile=Profile.CALIBRATED)
    return rate(lambda: estimate(shape, settings), seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    results: dict[str, object] = {"machine": machine}
    for name, (model, case, depths) in CASES.items():
        for layers in depths:
            results[f"trace {name} ({layers})"] = trace_case(model, case, layers)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    for model in ("llama-3.1-8b", "deepseek-v3"):
        results[f"calibrated estimates/s ({model} lora, one core)"] = round(
            calibrated_rate(model, args.seconds)
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
