"""The calibrated profile's per-GPU figure against the distributed trace's, per moment.

    python -m benchmarks.per_gpu_vs_trace [PRESET ...] [--gpus 1,2,8,64] [--layers 4]
        [--seq-len 512] [--parallelism fsdp,ddp] [--reserved]

For each preset cut to `--layers` decoder layers (the calibrated profile estimates the same
cut config, read by `parse_config`), full fine-tuning and LoRA, gradient checkpointing on and
off, batch 1: the tensor bytes each rank holds at each phase's peak, from
`controller.trace.distributed.trace_distributed_run` (FSDP2 or DDP, one rank at the world
size, on fake tensors) and from `calibrated.phase_bytes` (the fitted moments plus what
FSDP2 holds unsharded, `calibrated._fsdp_unsharded`, or DDP's buckets), and calibrated's
error. Both sides are tensor bytes: no CUDA context, no allocator margin.

On one GPU calibrated prices the job unwrapped (the single-GPU trace, `trace_run`, is its
reference, and that figure must not move); a one-rank FSDP2 job also holds the root's
parameters twice, so the column "fsdp@1" compares the FSDP figure at n = 1 with the
distributed trace at world size 1. Forward: calibrated prices forward's start under FSDP
(the root gathered twice, `calibrated._fsdp_only`), compared where the trace's forward peak
is there; where it is forward's tail (what backward's tail holds less the logits' gradient;
no calibrated moment), the check is that it stays below the backward peak.

`--reserved` compares the reserved level instead, once per run: what calibrated's per-GPU
figure has the caching allocator reserve (`Estimate.per_gpu_levels(n).reserved`, without
cuBLAS's workspace, which the trace does not allocate) against the traced rank's allocations
and frees replayed through the allocator model (`RunResult.reserved`), with beside it what
calibrated reserves with the single-GPU share on every rank (its rule before the ranks'
shares were measured). QLoRA is added there: its share is measured apart.

Needs the trace extra; about a second a trace at 4 layers of a 1B model on one core.
Not a timed benchmark: the figures are bytes. Prints the worst under and over per preset.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from benchmarks.comparison import error, spread
from controller.base.units import MIB
from controller.estimator import Checkpointing, Method, TrainingSettings, calibrated, parse_config
from controller.estimator.presets import load_preset
from controller.estimator.settings import Parallelism

DEFAULT_PRESETS = ("qwen2.5-0.5b", "llama-3.2-1b", "llama-3.1-8b")
PHASES = ("forward", "backward", "optimizer")


def cut(preset: str, layers: int) -> dict[str, Any]:
    config = dict(load_preset(preset).config)
    if layers:
        config["num_hidden_layers"] = layers
    return config


def steady(result: Any) -> dict[str, Any]:
    """Each phase's peak segment in the last traced step: the steady state, with the
    optimizer state made (the first step's regions also come before FSDP2's lazy setup has
    run its hooks, so its whole first forward reads as "head")."""
    last = max(seg.step for seg in result.segments)
    peaks: dict[str, Any] = {}
    for seg in result.segments:
        if seg.step == last and (seg.phase not in peaks or seg.peak > peaks[seg.phase].peak):
            peaks[seg.phase] = seg
    return peaks


def compare(
    config: dict[str, Any], settings: TrainingSettings, gpus: int, parallelism: Parallelism
) -> dict[str, tuple[int, int]]:
    """phase -> (calibrated, traced) tensor bytes per rank, the trace's in its steady
    state; "forward" where the trace's forward peak is forward's start, and beside it
    "forward<=backward" -> (whether the forward peak is below backward's, the forward peak)."""
    from controller.trace.distributed import Distributed, trace_distributed_run
    from controller.trace.run import trace_run

    shape = parse_config(config)
    if gpus == 1 and parallelism is Parallelism.FSDP:
        traced = steady(trace_run(config, settings))
    else:
        run = trace_distributed_run(config, settings, Distributed(gpus, parallelism))
        traced = steady(run.result)
    predicted = calibrated.phase_bytes(shape, settings, gpus, parallelism)
    out = {p: (predicted[p], traced[p].peak) for p in PHASES[1:] if p in predicted}
    forward = traced["forward"]
    if forward.region == "head" and "forward" in predicted:
        out["forward"] = (predicted["forward"], forward.peak)
    out["forward<=backward"] = (int(forward.peak <= traced["backward"].peak), forward.peak)
    return out


def one_rank_fsdp(config: dict[str, Any], settings: TrainingSettings) -> dict[str, tuple[int, int]]:
    """FSDP2 at world size 1 against calibrated's FSDP moments taken at n = 1."""
    from controller.trace.distributed import Distributed, trace_distributed_run

    shape = parse_config(config)
    est = calibrated.estimate(shape, settings)
    traced = steady(trace_distributed_run(config, settings, Distributed(1)).result)
    held = max(s + r for s, r in est.fsdp_moments) - est.fixed_bytes
    top = max(seg.peak for seg in traced.values())
    return {"peak": (held, top)}


def reserved_figures(
    config: dict[str, Any], settings: TrainingSettings, gpus: int, parallelism: Parallelism
) -> tuple[int, int, int]:
    """Bytes the caching allocator reserves on one rank: calibrated's, calibrated's with the
    single-GPU share in place of the rank's own (what it charged before the ranks' shares
    were measured), and the traced rank's replay."""
    from controller.trace.distributed import Distributed, trace_distributed_run
    from controller.trace.run import trace_run

    est = calibrated.estimate(parse_config(config), settings)
    one_share = replace(est, fsdp_reserve_share=(), ddp_reserve_share=())
    workspace = est.components["cublas_workspace"]
    predicted = est.per_gpu_levels(gpus, parallelism).reserved - workspace
    before = one_share.per_gpu_levels(gpus, parallelism).reserved - workspace
    if gpus == 1:
        return predicted, before, trace_run(config, settings).reserved
    run = trace_distributed_run(config, settings, Distributed(gpus, parallelism))
    return predicted, before, run.result.reserved


def reserved_table(
    presets: list[str], layers: int, seq_len: int, counts: list[int], modes: list[Parallelism]
) -> None:
    print(
        f"reserved MiB per rank, {layers or 'all'} layers, {seq_len} tokens: calibrated "
        "(error) / with the single-GPU share (error) / trace"
    )
    errors: dict[str, tuple[list[float], list[float]]] = {}
    for preset in presets:
        config = cut(preset, layers)
        for method in (Method.FULL, Method.LORA, Method.QLORA):
            for gc in (Checkpointing.ON, Checkpointing.OFF):
                settings = TrainingSettings(
                    method=method,
                    rank=None if method is Method.FULL else 16,
                    gradient_checkpointing=gc,
                    seq_len=seq_len,
                )
                cells = []
                for mode in modes:
                    for n in counts:
                        if (mode is Parallelism.DDP and n not in (2, 8)) or (
                            n == 1 and mode is not modes[0]
                        ):
                            continue
                        predicted, before, traced = reserved_figures(config, settings, n, mode)
                        e, e_before = error((predicted, traced)), error((before, traced))
                        where = "one" if n == 1 else f"{mode.value}@{n}"
                        now, then = errors.setdefault(where, ([], []))
                        now.append(e)
                        then.append(e_before)
                        cells.append(
                            f"{where} {predicted / MIB:7.0f} ({e:+6.1%}) / {before / MIB:7.0f} "
                            f"({e_before:+6.1%}) / {traced / MIB:7.0f}"
                        )
                print(
                    f"{preset} {method.value:5s} gc {gc.value:3s} | " + " | ".join(cells),
                    flush=True,
                )
    for where, (now, then) in errors.items():
        print(f"{where}: {len(now)} runs; calibrated {spread(now)}", flush=True)
        if where != "one":
            print(f"{where}: with the single-GPU share {spread(then)}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("presets", nargs="*", default=list(DEFAULT_PRESETS))
    parser.add_argument("--gpus", default="1,2,8,64", help="world sizes, comma-separated")
    parser.add_argument("--layers", type=int, default=0, help="decoder layers; 0: all")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--parallelism", default="fsdp,ddp")
    parser.add_argument("--reserved", action="store_true", help="compare the reserved level")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.gpus.split(",")]
    modes = [Parallelism(p) for p in args.parallelism.split(",")]
    if args.reserved:
        reserved_table(args.presets, args.layers, args.seq_len, counts, modes)
        return
    print(
        f"tensor MiB per rank, {args.layers or 'all'} layers, {args.seq_len} tokens: "
        "calibrated / trace (error)"
    )
    for preset in args.presets:
        config = cut(preset, args.layers)
        errors: list[tuple[float, str]] = []
        for method in (Method.FULL, Method.LORA):
            for gc in (Checkpointing.ON, Checkpointing.OFF):
                settings = TrainingSettings(
                    method=method,
                    rank=None if method is Method.FULL else 16,
                    gradient_checkpointing=gc,
                    seq_len=args.seq_len,
                )
                for mode in modes:
                    for n in counts:
                        if mode is Parallelism.DDP and n not in (2, 8):
                            continue  # a DDP rank holds the same at any world size
                        rows = compare(config, settings, n, mode)
                        cells = []
                        for phase in PHASES:
                            if phase == "forward" and phase not in rows:
                                below = rows["forward<=backward"]
                                ok = "below backward" if below[0] else "ABOVE BACKWARD"
                                cells.append(f"forward tail {below[1] / MIB:8.1f} ({ok})")
                                continue
                            if phase not in rows:  # no fitted moment of this phase
                                cells.append(f"{phase} {'-':>8s} / {'':8s}")
                                continue
                            pair = rows[phase]
                            e = error(pair)
                            where = f"{method.value} gc {gc.value} {mode.value}@{n} {phase}"
                            errors.append((e, where))
                            cells.append(
                                f"{phase} {pair[0] / MIB:8.1f} / {pair[1] / MIB:8.1f} ({e:+6.1%})"
                            )
                        print(
                            f"{preset} {method.value:4s} gc {gc.value:3s} {mode.value}@{n:<3d} | "
                            + " | ".join(cells),
                            flush=True,
                        )
                    if mode is Parallelism.FSDP and 1 in counts:
                        pair = one_rank_fsdp(config, settings)["peak"]
                        errors.append((error(pair), f"{method.value} gc {gc.value} fsdp@1 (FSDP2)"))
                        print(
                            f"{preset} {method.value:4s} gc {gc.value:3s} fsdp@1 FSDP2-wrapped | "
                            f"peak {pair[0] / MIB:8.1f} / {pair[1] / MIB:8.1f} "
                            f"({error(pair):+6.1%})",
                            flush=True,
                        )
        under, over = min(errors), max(errors)
        print(
            f"{preset}: worst under {under[0]:+.1%} ({under[1]}), "
            f"worst over {over[0]:+.1%} ({over[1]})",
            flush=True,
        )


if __name__ == "__main__":
    main()
