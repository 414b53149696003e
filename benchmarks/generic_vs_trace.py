"""The calibrated profile's figure for a family read generically against the trace's, per level.

    python -m benchmarks.generic_vs_trace [PRESET ...] [--layers 0] [--seq-len 2048]
        [--batch 1] [--checkpointing on] [--methods full,lora,qlora] [--traces FILE]
        [--components] [--markdown]

For each preset whose family no hand reading reads (every such bundled preset by default),
full fine-tuning, LoRA and QLoRA at the default settings (batch 1, 2,048 tokens, gradient
checkpointing on, AdamW, rank 16 on all linears, one GPU): calibrated's estimate of the
shape read from the model transformers builds (`controller.jobs.profiles.read_shape`, priced
with the fit `GENERIC_FITS` names) and the trace profile's, at the three levels one GPU is
measured at (`Estimate.per_gpu_levels(1)`): allocated (the tensors), reserved (the caching
allocator's peak) and NVML (what admission reserves), with calibrated's error.

The trace builds the model at its own depth on fake tensors and extrapolates the layers from
a few traced ones (`controller.trace.extrapolate`), so a real-size trace takes seconds to a
few minutes on one core; each one's time is printed. `--traces FILE` keeps the traced
figures (JSON, keyed by preset, method, depth and length) so a second run, after a change
to the formula, traces nothing again. `--components` prints each cell's components side by
side (calibrated / trace), for finding which one differs. `--layers N` cuts each config to N
decoder layers (a quick look; the 5 % target is at real size).

Needs the trace extra. Not a timed benchmark apart from the trace times: the figures are bytes.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.comparison import error, spread
from controller.base.units import MIB
from controller.estimator import Checkpointing, Method, Profile, TrainingSettings
from controller.estimator.presets import load_preset, preset_names, read_by_hand
from controller.jobs.profiles import estimate, read_shape

LEVELS = ("allocated", "reserved", "nvml")
METHODS = {"full": Method.FULL, "lora": Method.LORA, "qlora": Method.QLORA}


@dataclass(frozen=True)
class Figures:
    """One profile's estimate of one job: the three levels on one GPU and its components."""

    levels: dict[str, int]
    components: dict[str, int]
    seconds: float


def generic_presets() -> list[str]:
    """The bundled presets of families read generically."""
    return [name for name in preset_names() if not read_by_hand(load_preset(name))]


def config_of(preset: str, layers: int) -> dict[str, Any]:
    """The preset's config, cut to `layers` decoder layers where given (the text model's,
    for a config that nests one)."""
    config = load_preset(preset).config_dict()
    if layers:
        text = config.get("text_config", config)
        text["num_hidden_layers"] = layers
    return config


def settings_for(
    method: Method, seq_len: int, batch: int = 1, checkpointing: str = "on"
) -> TrainingSettings:
    return TrainingSettings(
        method=method,
        rank=None if method is Method.FULL else 16,
        seq_len=seq_len,
        batch=batch,
        gradient_checkpointing=Checkpointing.parse(checkpointing, "--checkpointing"),
    )


def figures(config: dict[str, Any], settings: TrainingSettings, profile: Profile) -> Figures:
    start = time.perf_counter()
    est = estimate(read_shape(config), replace(settings, profile=profile))
    seconds = time.perf_counter() - start
    levels = est.per_gpu_levels(1)
    return Figures(
        {level: getattr(levels, level) for level in LEVELS}, dict(est.components), seconds
    )


class TraceStore:
    """Traced figures kept in a JSON file between runs (a real-size trace takes minutes)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.data: dict[str, Any] = {}
        if path is not None and path.exists():
            self.data = json.loads(path.read_text())

    def get(self, key: str, config: dict[str, Any], settings: TrainingSettings) -> Figures | str:
        """The trace's figures, or the one line it refused the job with."""
        if key not in self.data:
            try:
                found = figures(config, settings, Profile.TRACE)
                self.data[key] = {
                    "levels": found.levels,
                    "components": found.components,
                    "seconds": found.seconds,
                }
            except Exception as refusal:  # a family the trace cannot run yet: reported
                self.data[key] = {"refused": f"{type(refusal).__name__}: {refusal}"[:200]}
            if self.path is not None:
                self.path.write_text(json.dumps(self.data, indent=1, sort_keys=True) + "\n")
        entry = self.data[key]
        if "refused" in entry:
            return str(entry["refused"])
        return Figures(entry["levels"], entry["components"], entry["seconds"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("presets", nargs="*")
    parser.add_argument("--layers", type=int, default=0, help="decoder layers; 0: all")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--methods", default="full,lora,qlora")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--checkpointing", default="on", choices=("on", "off"))
    parser.add_argument("--traces", type=Path, help="JSON file keeping the traced figures")
    parser.add_argument("--components", action="store_true", help="print the components")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args(argv)
    presets = list(dict.fromkeys(args.presets)) or generic_presets()  # each once
    store = TraceStore(args.traces)
    errors: dict[str, list[float]] = {level: [] for level in LEVELS}
    by_family: dict[str, list[float]] = {}  # each preset's NVML errors, for the target's count
    rows: list[list[str]] = []
    for preset in presets:
        config = config_of(preset, args.layers)
        for name in args.methods.split(","):
            settings = settings_for(METHODS[name], args.seq_len, args.batch, args.checkpointing)
            key = f"{preset}/{name}/{args.layers or 'all'}/{args.seq_len}"
            if (args.batch, args.checkpointing) != (1, "on"):  # the defaults keep their keys
                key += f"/b{args.batch}/gc-{args.checkpointing}"
            calibrated = figures(config, settings, Profile.CALIBRATED)
            traced = store.get(key, config, settings)
            if isinstance(traced, str):  # calibrated's figures alone, and why
                mine = [f"{calibrated.levels[level] / MIB:,.0f} / -" for level in LEVELS]
                print(f"{preset} {name:5s} | {' | '.join(mine)} | trace refused: {traced}")
                rows.append([preset, name, *mine, "-"])
                continue
            cells, row = [], [preset, name]
            for level in LEVELS:
                pair = (calibrated.levels[level], traced.levels[level])
                e = error(pair)
                errors[level].append(e)
                if level == "nvml":
                    by_family.setdefault(preset, []).append(e)
                cells.append(f"{level} {pair[0] / MIB:9.0f} / {pair[1] / MIB:9.0f} ({e:+6.1%})")
                row.append(f"{pair[0] / MIB:,.0f} / {pair[1] / MIB:,.0f} ({e:+.1%})")
            row.append(f"{traced.seconds:.0f}")
            rows.append(row)
            print(
                f"{preset} {name:5s} | " + " | ".join(cells) + f" | trace {traced.seconds:.0f} s",
                flush=True,
            )
            if args.components:
                for part in sorted(set(calibrated.components) | set(traced.components)):
                    mine = calibrated.components.get(part, 0)
                    theirs = traced.components.get(part, 0)
                    print(f"    {part:28s} {mine / MIB:10.1f} / {theirs / MIB:10.1f} MiB")
    print(
        f"MiB on one GPU, {args.layers or 'all'} layers, {args.seq_len} tokens, batch "
        f"{args.batch}, checkpointing {args.checkpointing}: "
        "calibrated / trace (calibrated's error)"
    )
    for level, values in errors.items():
        if values:
            print(
                f"{level}: {len(values)} runs; {spread(values)}; "
                f"within 5 %: {sum(abs(v) <= 0.05 for v in values)}"
            )
    methods = args.methods.split(",")
    refused = sorted(set(presets) - set(by_family))  # no trace to compare with
    inside = [
        preset
        for preset, values in by_family.items()
        if len(values) == len(methods) and all(abs(v) <= 0.05 for v in values)
    ]
    out = sorted(set(by_family) - set(inside))
    print(
        f"presets with {', '.join(methods)} all within 5 % at the NVML "
        f"level: {len(inside)} of {len(by_family)} traced"
        + (f"; out: {', '.join(out)}" if out else "")
        + (f"; trace refused: {', '.join(refused)}" if refused else "")
    )
    if args.markdown:
        print()
        print("| preset | method | allocated MiB | reserved MiB | NVML MiB | trace s |")
        print("|---|---|---|---|---|---|")
        for row in rows:
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
