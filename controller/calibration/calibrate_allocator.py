"""Measure what the caching allocator reserves beyond the tensors' peak, for `calibrated`.

    python -m controller.calibration.calibrate_allocator [--write]

The trace replays each run's allocations and frees through the allocator model
(`controller.allocator`) and reports the reserved peak; `calibrated` cannot replay (it has no
event sequence, and it must answer in microseconds), so it charges the reserve as a share of
a share of what its tensor peak holds beyond the weights, one share per method and
checkpointing setting. Beyond the weights, because the weights are allocated once, each in a
segment of its own size, and cost the allocator nothing; what it caches and cannot reuse comes
from the step's transient tensors (activations, logits, gradients, scratch). This script
traces small real models across batch and sequence, prints (reserved - peak) / (peak -
weights) per run, and with `--write` stores each group's median share in calibration.json's
`allocator` section, with the spread it came from (the samples' minimum and maximum) so a
reader sees how far one share reaches.
"""

from __future__ import annotations

import argparse
import json
import statistics
from importlib import resources
from pathlib import Path

from controller.estimator import (
    Checkpointing,
    Method,
    TrainingSettings,
    load_preset,
    load_shape,
    static_bytes,
)
from controller.trace.run import trace_run

PRESETS = ("qwen2.5-0.5b", "llama-3.2-1b")
SIZES = ((1, 2048), (4, 2048))
METHODS = (Method.FULL, Method.LORA, Method.QLORA)
CHECKPOINTING = (Checkpointing.ON, Checkpointing.OFF)


def measure() -> dict[str, list[float]]:
    shares: dict[str, list[float]] = {}
    for method in METHODS:
        for gc in CHECKPOINTING:
            key = f"{method.value}/{'off' if gc is Checkpointing.OFF else 'on'}"
            for preset in PRESETS:
                for batch, seq in SIZES:
                    settings = TrainingSettings(
                        method=method,
                        rank=None if method is Method.FULL else 16,
                        gradient_checkpointing=gc,
                        batch=batch,
                        seq_len=seq,
                    )
                    result = trace_run(load_preset(preset).config, settings)
                    weights = static_bytes(load_shape(preset), settings).weights
                    share = (result.reserved - result.peak) / (result.peak - weights)
                    shares.setdefault(key, []).append(share)
                    print(
                        f"{key:12} {preset:14} b={batch} s={seq}: peak "
                        f"{result.peak / 2**30:7.3f} GiB, reserved {result.reserved / 2**30:7.3f} "
                        f"GiB, share {share:+.3f}",
                        flush=True,
                    )
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the shares")
    args = parser.parse_args()
    shares = measure()
    section = {
        key: {
            "share": round(statistics.median(values), 4),
            "min": round(min(values), 4),
            "max": round(max(values), 4),
            "samples": len(values),
        }
        for key, values in shares.items()
    }
    print(json.dumps(section, indent=2))
    if args.write:
        path = Path(str(resources.files("controller.estimator").joinpath("calibration.json")))
        data = json.loads(path.read_text())
        data["allocator"] = {
            "what": "(reserved - tensor peak) / (tensor peak - weights) of traced runs replayed "
            "through the caching allocator model, median per method/checkpointing "
            "(controller.calibration.calibrate_allocator)",
            "presets": list(PRESETS),
            "sizes": [list(s) for s in SIZES],
            "groups": section,
        }
        path.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
