"""Estimates per second on one core: from a preset (parsed once) and from a raw config.

    python -m benchmarks.bench_estimator [--seconds 3] [--clock wall|cpu] [--generic-only]

The design's target is >= 20,000 estimates/s on one core. The process pins itself to one
CPU so the figure does not depend on how many cores the machine has. "raw config" hands
`parse_config` the config.json dict on every call, as the operator and `vramgate plan` do
for an inline or ConfigMap config: the shape comes from its cache by the config's content
after the first call. "new config" gives every call a config it has not seen (the same
model under another `_name_or_path`), so each call parses: what a model seen for the first
time costs.
Families read generically (GENERIC_CASES, the trace extra needed) are read from the model
transformers builds: "preset" and "raw config" find the shape in `read_shape`'s cache by the
config's content; "cached inventory" keeps the built model's inventory (what the operator
reads once per model) and turns it into a new shape on every call
(`model.generic.shape_from_inventory`), so each estimate prices a shape it has not seen: the
generic reading's own cost, which must stay >= 10,000 estimates/s, for every bundled preset
of such a family (at the operator's defaults, calibrated QLoRA).
`--clock cpu` counts this thread's CPU time instead of wall time, so the time other
processes take on the same core does not count (a busy machine still slows each
instruction some: shared caches).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import time
from collections.abc import Callable

from controller.estimator import (
    Method,
    Profile,
    TrainingSettings,
    load_shape,
    parse_config,
)
from controller.estimator.model.generic import shape_from_inventory
from controller.estimator.presets import load_preset, preset_names, read_by_hand
from controller.jobs.profiles import estimate, preset_shape, read_shape

CASES = {
    "llama-3.1-8b qlora analytic": ("llama-3.1-8b", TrainingSettings()),
    "llama-3.1-8b full analytic": ("llama-3.1-8b", TrainingSettings(method=Method.FULL, rank=None)),
    "llama-3.1-8b qlora unsloth": ("llama-3.1-8b", TrainingSettings(profile=Profile.UNSLOTH)),
    "deepseek-v3 lora unsloth": (
        "deepseek-v3",
        TrainingSettings(method=Method.LORA, profile=Profile.UNSLOTH),
    ),
    "llama-3.1-8b lora calibrated": (
        "llama-3.1-8b",
        TrainingSettings(method=Method.LORA, profile=Profile.CALIBRATED),
    ),
    "llama-3.1-8b qlora calibrated": ("llama-3.1-8b", TrainingSettings(profile=Profile.CALIBRATED)),
    "deepseek-v3 lora calibrated": (
        "deepseek-v3",
        TrainingSettings(method=Method.LORA, profile=Profile.CALIBRATED),
    ),
    # hybrid stacks: per-layer features summed by layer type (hybrid_fit.py)
    "qwen3-next-80b-a3b qlora calibrated": (
        "qwen3-next-80b-a3b",
        TrainingSettings(profile=Profile.CALIBRATED),
    ),
    "nemotron-3-nano-30b-a3b qlora calibrated": (
        "nemotron-3-nano-30b-a3b",
        TrainingSettings(targets=("in_proj", "q_proj", "v_proj"), profile=Profile.CALIBRATED),
    ),
    # Gemma 3n: sparse, dense and kv-shared layers told apart by index
    "gemma-3n-e4b lora calibrated": (
        "gemma-3n-e4b",
        TrainingSettings(method=Method.LORA, profile=Profile.CALIBRATED),
    ),
    # Jamba: Mamba-1 and attention layers, dense or MoE, told apart layer by layer
    "jamba-v0.1 lora calibrated": (
        "jamba-v0.1",
        TrainingSettings(
            method=Method.LORA, targets=("in_proj", "q_proj", "v_proj"), profile=Profile.CALIBRATED
        ),
    ),
}

#: Families read generically (`model.generic`): a dense one (Granite, the Llama fit) and an
#: MoE one (OLMoE, the GPT-OSS fit), at the defaults (QLoRA) and LoRA.
GENERIC_CASES = {
    "granite-3.3-8b-instruct qlora calibrated": (
        "granite-3.3-8b-instruct",
        TrainingSettings(profile=Profile.CALIBRATED),
    ),
    "granite-3.3-8b-instruct full calibrated": (
        "granite-3.3-8b-instruct",
        TrainingSettings(method=Method.FULL, rank=None, profile=Profile.CALIBRATED),
    ),
    "olmoe-1b-7b-0125-instruct lora calibrated": (
        "olmoe-1b-7b-0125-instruct",
        TrainingSettings(method=Method.LORA, profile=Profile.CALIBRATED),
    ),
    "pythia-6.9b lora calibrated": (
        "pythia-6.9b",
        TrainingSettings(method=Method.LORA, profile=Profile.CALIBRATED),
    ),
}


#: The job every generic preset is read for from a cached inventory, beside GENERIC_CASES:
#: the operator's defaults (calibrated, QLoRA), the slowest method of the three.
GENERIC_DEFAULT = TrainingSettings(profile=Profile.CALIBRATED)


def generic_rates(seconds: float, clock: Callable[[], float]) -> dict[str, float]:
    """GENERIC_CASES' rates: from the preset's shape, from the raw config (`read_shape`'s
    cache), and from a cached inventory (a new shape on every call); then every preset of a
    family read generically from a cached inventory at GENERIC_DEFAULT."""
    from controller.trace.inventory import read_inventory

    results = {}
    for label, (preset, settings) in GENERIC_CASES.items():
        config = load_preset(preset).config_dict()
        shape = preset_shape(preset)
        inventory = read_inventory(config)
        results[f"preset: {label}"] = rate(
            lambda shape=shape, s=settings: estimate(shape, s), seconds, clock
        )
        results[f"raw config: {label}"] = rate(
            lambda config=config, s=settings: estimate(read_shape(config), s), seconds, clock
        )
        results[f"cached inventory: {label}"] = rate(
            lambda inv=inventory, config=config, s=settings: estimate(
                shape_from_inventory(inv, config), s
            ),
            seconds,
            clock,
        )
    for preset in generic_preset_names():
        config = load_preset(preset).config_dict()
        inventory = read_inventory(config)
        results[f"cached inventory: {preset} qlora calibrated (default)"] = rate(
            lambda inv=inventory, config=config: estimate(
                shape_from_inventory(inv, config), GENERIC_DEFAULT
            ),
            seconds,
            clock,
        )
    return results


def generic_preset_names() -> list[str]:
    """The bundled presets of families no hand reading reads."""
    return [name for name in preset_names() if not read_by_hand(load_preset(name))]


def rate(
    fn: Callable[[], object], seconds: float, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Calls per second of fn over about `seconds` of `clock`, after a warm-up."""
    for _ in range(100):
        fn()
    n, start = 0, clock()
    deadline = start + seconds
    while True:
        for _ in range(200):
            fn()
        n += 200
        now = clock()
        if now >= deadline:
            return n / (now - start)


def _unseen(config: dict[str, object], settings: TrainingSettings) -> Callable[[], object]:
    """An estimate from a config parse_config has not seen on each call."""
    names = itertools.count()

    def call() -> object:
        return estimate(parse_config({**config, "_name_or_path": f"bench-{next(names)}"}), settings)

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument(
        "--generic-only", action="store_true", help="only the families read generically"
    )
    args = parser.parse_args()
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    results = {}
    for label, (preset, settings) in ({} if args.generic_only else CASES).items():
        shape = load_shape(preset)
        config = load_preset(preset).config_dict()
        results[f"preset: {label}"] = rate(
            lambda shape=shape, s=settings: estimate(shape, s), args.seconds, clock
        )
        results[f"raw config: {label}"] = rate(
            lambda config=config, s=settings: estimate(parse_config(config), s),
            args.seconds,
            clock,
        )
        results[f"new config: {label}"] = rate(_unseen(config, settings), args.seconds, clock)
    try:
        results |= generic_rates(args.seconds, clock)
    except ImportError as error:  # the trace extra reads generic families
        print(f"generic families skipped: {error}")
    print(f"python {platform.python_version()} on {platform.machine()}, one core, {args.clock}")
    width = max(map(len, results))
    for label, value in results.items():
        print(f"{label:{width}s} {value:12,.0f} estimates/s")
    print(json.dumps({k: round(v) for k, v in results.items()}))


if __name__ == "__main__":
    main()
