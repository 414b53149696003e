"""Measure what the caching allocator reserves beyond the tensors' peak, for `calibrated`.

    python -m controller.calibration.calibrate_allocator [--write] [--workers N]
        [--real-size [--methods full,lora,qlora]]

The trace replays each run's allocations and frees through the allocator model
(`controller.allocator`) and reports the reserved peak; `calibrated` cannot replay (it has no
event sequence, and it must answer in microseconds), so it charges the reserve as a share of
what its tensor peak holds beyond the weights, one share per method and checkpointing
setting. Beyond the weights, because the weights are allocated once, each in a segment of its
own size, and cost the allocator nothing; what it caches and cannot reuse comes from the
step's transient tensors (activations, logits, gradients, scratch). This script traces small
real models across batch and sequence, prints (reserved - peak) / (peak - weights) per run,
and with `--write` stores each group's median share in calibration.json's `allocator`
section, with the spread it came from (the samples' minimum and maximum) so a reader sees how
far one share reaches.

A family read generically (no hand reading) is charged what real-size models reserve
instead, with checkpointing on (`--real-size`: hand-read models of 3 to 47 B traced at
their whole depth, one GPU; `real_size` in the section): a dense model's adapters the
least-squares fit of those runs' reserve to bytes per logit, per parameter of the model and
per token x hidden unit (`adapters`; `calibrated.adapter_reserve`), an MoE's adapters their
median share, its full fine-tuning a share of what its backward holds
(`calibrated.backward_share`), an MoE's full fine-tuning bytes per logit fitted to four
hand-read MoEs' runs (`moe_full`; `calibrated.moe_full_reserve`). The hand-read families
keep the small models' shares, to which their pinned figures were fitted.

A rank of a data-parallel job reserves differently from the same job on one GPU: FSDP2's
all-gather and reduce-scatter buffers live on streams of their own, whose cached blocks the
compute stream never reuses, and DDP's gradient buckets stay allocated across the step. So
one rank is traced at a world size as well (`controller.trace.distributed`: FSDP2 at 2 and 8
ranks, DDP at 2) and its share stored apart (`parallel`), each with the denominator
`calibrated` charges it on (`Estimate.per_gpu_bytes`): what that rank holds beyond its own
weights, 1/n of them under FSDP (the shards; the blocks gathered in flight are transient),
all of them under DDP. About ten minutes on 2 cores (96 traces).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from concurrent.futures import ProcessPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Any

from controller.estimator import (
    Checkpointing,
    Method,
    TrainingSettings,
    load_preset,
    load_shape,
    static_bytes,
)
from controller.estimator.calibrated import backward_transient
from controller.estimator.model.shape import ModelShape
from controller.estimator.settings import Parallelism

PRESETS = ("qwen2.5-0.5b", "llama-3.2-1b")
SIZES = ((1, 2048), (4, 2048))
#: Hand-read models of 3 to 30 B, traced at their whole depth on one GPU for the shares of a
#: family read generically (`real_size` in the section; `calibrated.allocator_share`). The
#: small models' shares above are not theirs: a 0.5-1 B model's reserve under full
#: fine-tuning is mostly its embedding's optimizer state, larger than any block the backward
#: cached (16 % of what it holds beyond its weights; 0.5-21 % at 3-30 B and batch 1), and
#: its adapters' reserve is the smaller (24 % against 29-31 %, checkpointing on). The
#: hand-read families keep the small models' shares: their figures are pinned (the seed
#: figures, the Unsloth comparison).
REAL_SIZE_PRESETS = (
    "llama-3.2-3b",
    "qwen2.5-3b",
    "phi-3-mini-4k",
    "qwen3-4b",
    "gemma-3-4b",
    "mistral-7b-v0.3",
    "olmo-2-7b",
    "qwen2.5-7b",
    "llama-3.1-8b",
    "qwen3-8b",
    "yi-1.5-9b",
    "gemma-2-9b",
    "mistral-nemo-12b",
    "phi-4",
    "qwen2.5-14b",
    "qwen3-30b-a3b",
)
#: Hand-read MoEs traced at real size for full fine-tuning only, for the bytes per logit a
#: generic MoE's full fine-tuning is charged (`moe_full`; `calibrated.moe_full_reserve`):
#: their reserve grew 5-9 x from batch 1 to 4 and their logits 4 x, where the backward the
#: generic MoE fit prices grew 1.3 x. Only Qwen3-30B-A3B is among the presets above, whose
#: shares these would move.
REAL_SIZE_MOES = ("qwen3-30b-a3b", "ernie-4.5-21b-a3b", "gpt-oss-20b", "mixtral-8x7b")
METHODS = (Method.FULL, Method.LORA, Method.QLORA)
CHECKPOINTING = (Checkpointing.ON, Checkpointing.OFF)
#: The spreads traced beyond one GPU, (parallelism, world size): FSDP2 on a small and a
#: large count (what each rank holds whole grows against its shards as n grows), DDP on 2
#: (a DDP rank holds the same on any count of two or more).
SPREADS = ((Parallelism.FSDP, 2), (Parallelism.FSDP, 8), (Parallelism.DDP, 2))

#: One traced run: (method, checkpointing, preset, batch, sequence, parallelism value or ""
#: for one GPU, world size).
Task = tuple[str, str, str, int, int, str, int]
#: A one-GPU run's features for the fits: (logits, the model's parameters, tokens x hidden
#: size); `adapters` reads all three, `moe_full` the logits.
Features = tuple[int, int, int]


def group_key(method: Method, gc: Checkpointing) -> str:
    """The group a run's share belongs to, as `calibrated.allocator_share` looks it up."""
    return f"{method.value}/{'off' if gc is Checkpointing.OFF else 'on'}"


def rank_share(reserved: int, peak: int, weights: int, parallelism: str, world_size: int) -> float:
    """(reserved - peak) / (peak - the weights the rank keeps): the share `calibrated`
    multiplies by what a rank holds beyond its own weights (`Estimate._reserved`), its
    1/n of them under FSDP on n ranks, all of them on one GPU and under DDP."""
    own = weights // world_size if parallelism == Parallelism.FSDP.value else weights
    return (reserved - peak) / (peak - own)


def tasks(real_size: bool = False, methods: tuple[Method, ...] = METHODS) -> list[Task]:
    """The runs to trace: the small models on one GPU and at each spread, or (`real_size`)
    the real-size models on one GPU."""
    spreads = (("", 1),) if real_size else (("", 1), *((p.value, n) for p, n in SPREADS))
    presets = REAL_SIZE_PRESETS if real_size else PRESETS
    # Real size, checkpointing on only: off, the generic reading measured further from the
    # trace with the real-size shares than with the small models' (calibrated keeps those).
    checkpointing = (Checkpointing.ON,) if real_size else CHECKPOINTING
    runs = [
        (method.value, gc.value, preset, batch, seq, parallelism, world_size)
        for parallelism, world_size in spreads
        for method in methods
        for gc in checkpointing
        for preset in presets
        for batch, seq in SIZES
    ]
    if real_size and Method.FULL in methods:
        moes = [preset for preset in REAL_SIZE_MOES if preset not in presets]
        on = Checkpointing.ON.value
        runs += [("full", on, preset, b, seq, "", 1) for preset in moes for b, seq in SIZES]
    return runs


def trace_one(task: Task) -> tuple[Task, int, int, int, int, Features | None]:
    """Trace one run (one GPU, or one rank at its world size): its tensor peak, the
    allocator replay's reserved peak, the whole model's weights, for a full fine-tuning on
    one GPU what calibrated's backward holds beyond its static part as the generic reading
    prices it (`calibrated.backward_transient`; 0 for the rest), and on one GPU the fits'
    features (`adapter_features`)."""
    from controller.trace.distributed import Distributed, trace_distributed_run
    from controller.trace.run import trace_run

    method, gc, preset, batch, seq, parallelism, world_size = task
    settings = TrainingSettings(
        method=Method.parse(method, "method"),
        rank=None if method == Method.FULL.value else 16,
        gradient_checkpointing=Checkpointing.parse(gc, "gradient_checkpointing"),
        batch=batch,
        seq_len=seq,
    )
    config = load_preset(preset).config
    if parallelism:
        spread = Distributed(world_size, Parallelism.parse(parallelism, "parallelism"))
        result = trace_distributed_run(config, settings, spread).result
    else:
        result = trace_run(config, settings)
    shape = load_shape(preset)
    weights = static_bytes(shape, settings).weights
    full = settings.method is Method.FULL and not parallelism
    transient = backward_transient(shape, settings) if full else 0
    features = adapter_features(shape, settings) if not parallelism else None
    return task, result.peak, result.reserved, weights, transient, features


def adapter_features(shape: ModelShape, settings: TrainingSettings) -> Features:
    """What `calibrated.adapter_reserve` multiplies: the loss's logits (tokens x vocabulary),
    the model's parameters, and tokens x hidden size."""
    tokens = settings.batch * settings.lm_seq_len
    parameters = static_bytes(shape, settings).total_params
    return tokens * shape.vocab_size, parameters, tokens * shape.hidden_size


def adapter_fit(samples: list[tuple[int, Features]]) -> dict[str, Any]:
    """The least-squares (reserved - tensor peak) = a x logits + b x the model's parameters +
    c x tokens x hidden over the real-size adapter runs, no constant term (a job with none
    of these reserves nothing), and how far its runs fall from it in MiB."""
    import numpy as np  # the trace extra's, as torch is

    x = np.array([features for _, features in samples], dtype=float)
    y = np.array([reserve for reserve, _ in samples], dtype=float)
    coefficients = np.linalg.lstsq(x, y, rcond=None)[0]
    a, b, c = (float(f"{v:.6g}") for v in coefficients)
    if min(a, b, c) < 0:  # each term is bytes the allocator caches: none can take any away
        raise ValueError(
            f"adapters fit: a negative term ({a} per logit, {b} per parameter, {c} per token "
            "x hidden unit): the runs do not follow the fit's terms; not written"
        )
    misses = [(a * f[0] + b * f[1] + c * f[2] - r) / 2**20 for r, f in samples]
    return {
        "per_logit": a,
        "per_model_param": b,
        "per_token_hidden": c,
        "samples": len(samples),
        "under_mib": round(-min(misses)),
        "over_mib": round(max(misses)),
    }


def moe_full_fit(samples: list[tuple[int, Features]]) -> dict[str, Any]:
    """The least-squares (reserved - tensor peak) = a x logits over the MoEs' full
    fine-tuning runs (through the origin: a = sum(xy) / sum(x^2)), and how far its runs
    fall from it in MiB."""
    logits = [features[0] for _, features in samples]
    a = sum(x * r for x, (r, _) in zip(logits, samples, strict=True)) / sum(x * x for x in logits)
    a = float(f"{a:.6g}")
    misses = [(a * x - r) / 2**20 for x, (r, _) in zip(logits, samples, strict=True)]
    return {
        "per_logit": a,
        "samples": len(samples),
        "under_mib": round(-min(misses)),
        "over_mib": round(max(misses)),
    }


def measure(
    workers: int,
    real_size: bool = False,
    methods: tuple[Method, ...] = METHODS,
    adapters: list[tuple[int, Features]] | None = None,
    moes: list[tuple[int, Features]] | None = None,
) -> dict[str, dict[str, list[float]]]:
    """Shares by spread ("" one GPU, else "fsdp" / "ddp") and group; with `real_size`, full
    fine-tuning's on the backward's transient bytes as well ("backward"), each dense
    model's adapter run (reserve, features) appended to `adapters` and each MoE's full
    fine-tuning to `moes`. The MoEs traced for `moes` alone leave the shares as they are."""
    shares: dict[str, dict[str, list[float]]] = {}
    runs = tasks(real_size, methods)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for task, peak, reserved, weights, transient, features in pool.map(trace_one, runs):
            method, gc, preset, batch, seq, parallelism, world_size = task
            moe, full = preset in REAL_SIZE_MOES, method == Method.FULL.value
            if real_size and features is not None and moes is not None and moe and full:
                moes.append((reserved - peak, features))
            if real_size and preset not in REAL_SIZE_PRESETS:  # traced for the MoE fit only
                print(
                    f"one@1   moe-fit    {preset:16} b={batch} s={seq}: peak "
                    f"{peak / 2**30:7.3f} GiB, reserved {reserved / 2**30:7.3f} GiB",
                    flush=True,
                )
                continue
            key = group_key(
                Method.parse(method, "method"), Checkpointing.parse(gc, "gradient_checkpointing")
            )
            share = rank_share(reserved, peak, weights, parallelism, world_size)
            shares.setdefault(parallelism, {}).setdefault(key, []).append(share)
            if real_size and transient > 0:
                backward = (reserved - peak) / transient
                shares.setdefault("backward", {}).setdefault(key, []).append(backward)
            adapter = not full and not moe
            if real_size and features is not None and adapters is not None and adapter:
                adapters.append((reserved - peak, features))
            spread = f"{parallelism or 'one'}@{world_size}"
            print(
                f"{spread:7} {key:10} {preset:16} b={batch} s={seq}: peak "
                f"{peak / 2**30:7.3f} GiB, reserved {reserved / 2**30:7.3f} GiB, "
                f"share {share:+.3f}",
                flush=True,
            )
    return shares


def summary(groups: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    return {
        key: {
            "share": round(statistics.median(values), 4),
            "min": round(min(values), 4),
            "max": round(max(values), 4),
            "samples": len(values),
        }
        for key, values in groups.items()
    }


def section(shares: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """calibration.json's `allocator` section: the one-GPU groups (`groups`, read for one
    GPU and a device map) and each spread's (`parallel`, read at n >= 2)."""
    parallel = {}
    for parallelism in dict.fromkeys(p.value for p, _ in SPREADS):
        parallel[parallelism] = {
            "world_sizes": [n for p, n in SPREADS if p.value == parallelism],
            "groups": summary(shares[parallelism]),
        }
    return {
        "what": "(reserved - tensor peak) / (tensor peak - the weights the GPU keeps) of traced "
        "runs replayed through the caching allocator model, median per method/checkpointing "
        "(python -m controller.calibration.calibrate_allocator). `groups`: one GPU (also a "
        "device map), all the weights. `parallel`: one rank of FSDP2 or DDP traced at the "
        "world sizes listed (controller.trace.distributed), the share calibrated charges at "
        "n >= 2 GPUs of that parallelism; the weights it keeps are its 1/n shard under FSDP, "
        "all of them under DDP",
        "presets": list(PRESETS),
        "sizes": [list(s) for s in SIZES],
        "groups": summary(shares[""]),
        "parallel": parallel,
    }


def _on(groups: dict[str, Any]) -> dict[str, Any]:
    """The groups with checkpointing on (the only ones the real-size run measures)."""
    return {key: value for key, value in groups.items() if key.endswith("/on")}


def real_size_section(
    shares: dict[str, dict[str, list[float]]],
    before: dict[str, Any] | None = None,
    adapters: list[tuple[int, Features]] | None = None,
    moes: list[tuple[int, Features]] | None = None,
) -> dict[str, Any]:
    """The `real_size` part of the section: the one-GPU groups of the real-size models'
    adapters (`groups`), full fine-tuning's share of its backward (`backward`), the dense
    models' adapter fit (`adapters`) and the MoEs' full fine-tuning fit (`moe_full`), each
    fit from its (reserve, features) runs. What was not measured this time is kept from
    `before`."""
    before = before or {}
    fit = {"on": adapter_fit(adapters)} if adapters else dict(before.get("adapters", {}))
    moe_fit = {"on": moe_full_fit(moes)} if moes else dict(before.get("moe_full", {}))
    groups = {k: v for k, v in shares.get("", {}).items() if not k.startswith("full/")}
    return {
        "what": "hand-read models of 3 to 47 B traced at their whole depth on one GPU with "
        "checkpointing on, charged to a family read generically (python -m "
        "controller.calibration.calibrate_allocator --real-size). `groups`: LoRA and QLoRA, "
        "the same share as above. `backward`: full fine-tuning, (reserved - tensor peak) / "
        "what calibrated's backward holds beyond the weights, optimizer state and gradients "
        "as the generic reading prices it (calibrated.backward_transient), the median. "
        "`adapters`: LoRA and QLoRA of the dense models, (reserved - tensor peak) fitted by "
        "least squares to bytes per logit, per parameter of the model and per token x hidden "
        "unit (calibrated.adapter_reserve), with the runs' worst misses in MiB. `moe_full`: "
        "full fine-tuning of the MoEs listed there, (reserved - tensor peak) fitted to bytes "
        "per logit (calibrated.moe_full_reserve)",
        "presets": list(REAL_SIZE_PRESETS),
        "sizes": [list(s) for s in SIZES],
        "groups": _on(before.get("groups", {})) | summary(groups),
        "backward": _on(before.get("backward", {})) | summary(shares.get("backward", {})),
        "adapters": fit,
        "moe_full": moe_fit | ({"presets": list(REAL_SIZE_MOES)} if moes else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the shares")
    parser.add_argument(
        "--real-size",
        action="store_true",
        help="measure only the real-size models' one-GPU shares (`real_size`), about 15 "
        "minutes on 2 cores for the three methods (102 traces: full fine-tuning adds three "
        "MoEs for `moe_full`)",
    )
    parser.add_argument(
        "--methods", default="full,lora,qlora", help="with --real-size: the methods traced"
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    methods = tuple(Method.parse(m, "--methods") for m in args.methods.split(","))
    if set(methods) != set(METHODS) and not args.real_size:
        parser.error("--methods: only with --real-size (the small models' run traces all)")
    path = Path(str(resources.files("controller.estimator").joinpath("calibration.json")))
    data = json.loads(path.read_text())
    if args.real_size:
        allocator = dict(data.get("allocator", {}))
        # The fit is of LoRA and QLoRA together: refitted only when both were traced.
        adapters: list[tuple[int, Features]] = []
        moes: list[tuple[int, Features]] = []
        both = {Method.LORA, Method.QLORA} <= set(methods)
        allocator["real_size"] = real_size_section(
            measure(args.workers, real_size=True, methods=methods, adapters=adapters, moes=moes),
            allocator.get("real_size"),
            adapters if both else None,
            moes,
        )
        print(json.dumps(allocator["real_size"], indent=2))
    else:
        allocator = section(measure(args.workers))
        if "real_size" in data.get("allocator", {}):  # measured apart (--real-size)
            allocator["real_size"] = data["allocator"]["real_size"]
        print(json.dumps(allocator, indent=2))
    if args.write:
        data["allocator"] = allocator
        path.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
