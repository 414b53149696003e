"""The calibrated profile's per-GPU need under FSDP against the trace's: an accuracy check.

    python -m benchmarks.per_gpu_vs_trace [PRESET ...] [--gpus 1,2,8] [--seq-len 2048]

For each preset, full fine-tuning and LoRA, gradient checkpointing on and off, batch 1: the
per-GPU need (`Estimate.per_gpu_bytes`) of both profiles and calibrated's error against the
trace at each GPU count. The trace's phases are the reference: its gradients are tagged as
such, where the calibrated fits place them by the moment (`calibrated._holds_layer_gradients`).
Needs the trace extra (`pip install -e '.[trace]'`); a 32-layer model takes 5-50 s a job on
2 cores. Not a timed benchmark: the figures are bytes.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from controller.base.units import GIB
from controller.estimator import (
    Checkpointing,
    Method,
    Profile,
    TrainingSettings,
    load_shape,
)
from controller.estimator.presets import load_preset
from controller.jobs.profiles import estimate

DEFAULT_PRESETS = ("qwen2.5-0.5b", "llama-3.2-1b", "llama-3.1-8b", "mixtral-8x7b")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("presets", nargs="*", default=list(DEFAULT_PRESETS))
    parser.add_argument("--gpus", default="1,2,8", help="GPU counts, comma-separated")
    parser.add_argument("--seq-len", type=int, default=2048)
    args = parser.parse_args(argv)
    from controller.trace import estimate as trace_estimate  # the trace extra

    counts = [int(n) for n in args.gpus.split(",")]
    print(
        "preset method gc | "
        + " | ".join(f"{n} GPUs: calibrated / trace GiB (error)" for n in counts)
    )
    for preset in args.presets:
        config, shape = load_preset(preset).config, load_shape(preset)
        for method in (Method.FULL, Method.LORA):
            for gc in (Checkpointing.ON, Checkpointing.OFF):
                job = TrainingSettings(
                    method=method,
                    rank=None if method is Method.FULL else 16,
                    gradient_checkpointing=gc,
                    seq_len=args.seq_len,
                )
                traced = trace_estimate(config, job)
                predicted = estimate(shape, replace(job, profile=Profile.CALIBRATED))
                cells = []
                for n in counts:
                    need, truth = predicted.per_gpu_bytes(n), traced.per_gpu_bytes(n)
                    cells.append(
                        f"{need / GIB:.2f} / {truth / GIB:.2f} ({(need - truth) / truth:+.1%})"
                    )
                print(f"{preset} {method.value} {gc.value} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
