"""Fit the calibrated profile's hybrid section: Nemotron-H, Nemotron 3, Falcon-H1,
Qwen3-Next, Gemma 3n and Jamba (`hybrid_fit.py`).

    python -m controller.calibration.calibrate_hybrid [--samples 60] [--first-seed 0] [--workers N]
        [--out PATH] [--rows PATH] [--refit PATH...] [--families nemotron_3,...]
        [--cross-validate FOLDS]

Writes the `hybrid` section of `calibration.json` and leaves the rest of the file as it is
(the uniform families' features are not these). For each family, method (full / LoRA /
QLoRA) and checkpointing, sdpa attention only, `--samples` shrunk variants of the family's
preset (`calibrate.shrunk_hybrid`, chunks of 64, 128 or 256 tokens, two chunks or more;
Qwen3-Next's are always 64):
each one traced as a base stack (`base_stack`: the family's first and last layer types
(`hybrid_fit.STACKS`); Gemma 3n's sparse, dense and kv-shared layer, `BASES` says why) and
once more with one layer of each type added to it (Jamba's MoE layer with a dense one,
`GROWN`: its periods cannot place one alone), every op
of a layer a moment of its own (`StorageTracker.split_ops`). Per moment of the step, what a
layer of a type adds (the grown trace less the base) is fitted against the
summed per-layer features, one coefficient vector for every type; what is left of the
base stack once its own layers are taken off is fitted against the once-per-step
features. LoRA adapts every linear PEFT accepts on these models (PEFT refuses `out_proj` and
so `all-linear` on Mamba-2 mixers; on Qwen3-Next the MLP names reach the routed experts'
stacks too, as PEFT maps them; Gemma 3n takes `all-linear`, its QLoRA keeps AltUp's clamped
linears in 16 bits, `GEMMA3N_QLORA`; Jamba takes its Mamba mixers', attention's and dense
MLPs' linears). Jamba's Mamba-1 scan loops token by token: every run of an op in the loop is
one moment (`LOOPED`), and its samples are 64-256 tokens long.

Measured (2 cores): Nemotron-H and Falcon-H1, 60 samples per class (2,880 traces) in 13-20
minutes, within 2.0 % of its own samples; in four-fold cross-validation (a quarter of each
class's samples held out in turn), every held-out peak within 3.6 %. Nemotron 3 (1,440 traces)
in 4 minutes, within 1.9 %, held out within 2.6 %. Qwen3-Next (1,080 traces) in 6 minutes,
within 2.0 %, held out within 4.4 %: 17.7 % under on one sample until the moments to keep
were chosen at the preset's widths too (`_preset_points`), that sample being the only one
whose peak is the loss's. Gemma 3n, 40 samples per class (960 traces) in 43 minutes beside a
Go build, within 2.0 %, held out within 5.2 % (one LoRA sample without checkpointing; the
other classes within 3.8 %). Its per-layer tables are drawn up to 64k rows; with the
vocabulary's (at most 16k) the fit was within 1.8 %, held out within 4.2 %, but 1.8 % under
E4B's full fine-tune without checkpointing, now 0.6 %. The first fit, from whole module
regions and one-chunk scans, was 5-50 % off on held-out samples: a region holding the scan's
fifty ops peaks at whichever op the widths favour, and a one-chunk scan skips copies.
Jamba, 20 samples per class (480 traces of 64-256 tokens) in 32 minutes, and 20 more of
QLoRA with checkpointing (seeds 20-39, `sample` mapped over those tasks) in 8: within 2.2 %
of its own samples, held out within 2.1 % (with that class's first 20 alone: 21 %, a QLoRA
dequantisation moment fitted from 15 samples; its file says 23 samples per class, the mean).
`--first-seed` traces further seeds into another `--rows` file and `--refit` fits several
files together, so samples can be added in parts (rows keep their task, not their config:
a change to `variant` or `shrunk_hybrid` makes earlier rows unusable). `--families` fits
some families and keeps the others' fits in `--out` (refused if the features or the library
versions changed since). `--refit ROWS --cross-validate 4` prints each class's worst error on
held-out samples (the figures above).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from operator import mul
from pathlib import Path
from typing import Any

from controller.calibration.calibrate import (
    CHECKPOINTING,
    HYBRID_PRESETS,
    METHODS,
    QWEN3_NEXT_LAYERS,
    _lstsq,
    _measure,
    by_class,
    gemma3n_layers,
    jamba_layers,
    keep_deciding,
    library_versions,
    shrunk_hybrid,
)
from controller.estimator import hybrid_fit
from controller.estimator.calibrated import DATA_FILE, OPTIMIZER_KEY, dynamic_bytes
from controller.estimator.model import parse_config
from controller.estimator.presets import load_preset
from controller.estimator.settings import Attention, Checkpointing, Method, TrainingSettings
from controller.estimator.storage import static_bytes

_ATTENTION_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
_LATENT = ("fc1_latent_proj", "fc2_latent_proj")
#: LoRA's targets in the fit: every linear PEFT 0.21 adapts on the family's layers (less
#: Nemotron 3's latent projections where there are none: `lora_targets`).
TARGETS = {
    "nemotron_h": ("in_proj", *_ATTENTION_LINEARS, "up_proj", "down_proj"),
    # up and down: the shared experts' (the routed experts are 3-D parameters, not linears)
    "nemotron_3": ("in_proj", *_ATTENTION_LINEARS, "up_proj", "down_proj", *_LATENT),
    "falcon_h1": ("in_proj", *_ATTENTION_LINEARS, "gate_proj", "up_proj", "down_proj"),
    # the DeltaNet's projections, gated attention, the shared expert's MLP; PEFT also maps
    # gate/up/down onto the routed experts' stacks here (Qwen2-MoE's names), as it does for a user
    "qwen3_next": (
        "in_proj_qkvz",
        "in_proj_ba",
        "out_proj",
        *_ATTENTION_LINEARS,
        "gate_proj",
        "up_proj",
        "down_proj",
    ),
    # all-linear: PEFT's every nn.Linear but the LM head (AltUp's, LAuReL's and the
    # per-layer inputs' too), as a user asks for it
    "gemma3n": ("all-linear",),
    # the Mamba mixer's four linears, attention's, the dense MLPs' (the experts are 3-D
    # parameters PEFT leaves alone on Jamba), not the router
    "jamba": (
        "in_proj",
        "x_proj",
        "dt_proj",
        "out_proj",
        *_ATTENTION_LINEARS,
        "gate_proj",
        "up_proj",
        "down_proj",
    ),
}
#: What Gemma 3n's QLoRA keeps in 16 bits: AltUp clamps these weights in place while
#: training, which 4-bit weights cannot take (`trace.build._refuse_clamped_4bit`).
GEMMA3N_QLORA = {
    "quant_method": "bitsandbytes",
    "load_in_4bit": True,
    "bnb_4bit_use_double_quant": True,
    "llm_int8_skip_modules": ["prediction_coefs", "correction_coefs"],
}
_CHAR = {
    "mamba2": "M",
    "attention": "*",
    "mlp": "-",
    "moe": "E",
    "parallel": "P",
    "deltanet_mlp": "L",  # Qwen3-Next (`calibrate.QWEN3_NEXT_LAYERS`)
    "attention_mlp": "A",
    "sparse": "S",  # Gemma 3n (`calibrate.GEMMA3N_LAYERS`)
    "dense": "D",
    "shared": "H",
    "mamba_dense": "m",  # Jamba (`calibrate.JAMBA_LAYERS`)
    "mamba_moe": "e",
    "attention_dense": "a",
    "attention_moe": "x",
}
CHUNKS = (64, 128, 256)
#: Real depths a moment is checked at before it is dropped, in the preset's layer mix.
DEPTHS = (32, 80)

Task = tuple[str, str, str, int]  # family, method, checkpointing, seed
_CLASSES = len(METHODS) * len(CHECKPOINTING)  # per family: sdpa only


def lora_targets(family: str, config: dict[str, Any]) -> tuple[str, ...]:
    """TARGETS of a config: without `moe_latent_size` Nemotron 3's latent projections are
    nn.Identity, which PEFT refuses to adapt."""
    if config.get("moe_latent_size"):
        return TARGETS[family]
    return tuple(name for name in TARGETS[family] if name not in _LATENT)


def with_layers(family: str, config: dict[str, Any], types: tuple[str, ...]) -> dict[str, Any]:
    """`config` cut to the stack of `types`."""
    out = config | {"num_hidden_layers": len(types)}
    if family == "qwen3_next":
        out["layer_types"] = [QWEN3_NEXT_LAYERS[_CHAR[t]] for t in types]
    elif family == "gemma3n":
        out |= gemma3n_layers("".join(_CHAR[t] for t in types))
    elif family == "jamba":
        out |= jamba_layers("".join(_CHAR[t] for t in types))
    elif family != "falcon_h1":  # Nemotron-H and Nemotron 3 name their layers in a pattern
        out["hybrid_override_pattern"] = "".join(_CHAR[t] for t in types)
    return out


def variant(task: Task) -> tuple[dict[str, Any], TrainingSettings]:
    """The base stack's config (`base_stack`) and the settings of one sample (deterministic
    in the task)."""
    family, method, gc, seed = task
    rng = random.Random(f"hybrid/{family}/{method}/{gc}/{seed}")
    first, last, _ = hybrid_fit.STACKS[family]
    config = shrunk_hybrid(family, rng, "".join(_CHAR[t] for t in (first, last)), CHUNKS)
    config = with_layers(family, config, base_stack(family))
    adapter = method != "full"
    if family in LOOPED:  # a scan token by token: no chunks
        seq_len = rng.choice(LOOPED_LENGTHS)
    else:
        seq_len = rng.choice((128, 256, 384, 512))
        # Two chunks or more, as at real lengths (2,048 tokens and up in chunks of 128 or
        # 256): a one-chunk scan skips copies a longer one makes, so its moments differ.
        chunk = rng.choice([c for c in CHUNKS if 2 * c <= seq_len])
        # Qwen3-Next's chunk is fixed, Gemma 3n does not scan
        if family not in ("qwen3_next", "gemma3n"):
            config["mamba_chunk_size" if family == "falcon_h1" else "chunk_size"] = chunk
    config = with_method(family, config, method)
    rank = rng.choice((8, 16, 32)) if adapter else None
    batch = rng.choice((1, 2))
    return config, _settings(family, config, (method, gc), rank, batch, seq_len)


def with_method(family: str, config: dict[str, Any], method: str) -> dict[str, Any]:
    """`config` as a job of `method` loads it: Gemma 3n's QLoRA with GEMMA3N_QLORA."""
    if family == "gemma3n" and method == Method.QLORA.value:
        return config | {"quantization_config": GEMMA3N_QLORA}
    return config


def _settings(
    family: str,
    config: dict[str, Any],
    job_class: tuple[str, str],
    rank: int | None,
    batch: int,
    seq_len: int,
) -> TrainingSettings:
    """A job of a class (method, checkpointing) as the fit sets it up: LoRA on `lora_targets`,
    a full fine-tune on every linear, sdpa attention."""
    method, gc = job_class
    adapter = method != "full"
    return TrainingSettings(
        method=Method.parse(method, "method"),
        rank=rank,
        targets=lora_targets(family, config) if adapter else ("all-linear",),
        batch=batch,
        seq_len=seq_len,
        gradient_checkpointing=Checkpointing.parse(gc, "gradient_checkpointing"),
        attention=Attention.SDPA,
    )


def _features(config: dict[str, Any], settings: TrainingSettings) -> tuple[list[int], list[int]]:
    shape = parse_config(config)
    return hybrid_fit.features(shape, settings, static_bytes(shape, settings))


#: The stack a sample's others add one layer to, where it is not the first and last layer
#: alone. Gemma 3n's first layer is never the one whose k/v the kv-shared layers reuse
#: (transformers' last layer before them), as it is in [sparse, shared]: there the first
#: layer's recomputation held 17 MB less (the shrunk grid's LoRA, 1,024 tokens) than in any
#: deeper stack, and a fit from that base read the jump as what a layer adds (6.6-11.4 % over
#: the trace of a six-layer stack).
BASES = {"gemma3n": ("sparse", "dense", "shared")}
#: Stacks that add more than one layer where one alone cannot be written: Jamba places its
#: experts by period and offset (`calibrate.jamba_layers`), so [dense, MoE, MoE] cannot be
#: made, and its MoE layer comes in a pair with a dense one. The per-layer fit takes stack
#: differences of any size (its features are sums); `_points` solves for the mix.
GROWN = {
    "jamba": {"mamba_moe": ("mamba_dense", "mamba_moe", "mamba_dense", "mamba_moe")},
}
#: Families whose scan loops token by token (transformers' Mamba-1 torch path): each run of
#: an op in the loop would be a moment of its own, named by its count, and a sample of 128
#: tokens has none of a longer one's later tokens. Their runs are one moment, the largest
#: (`_merged_loops`): the loop's last token, whose held states are linear in the features.
LOOPED = frozenset({"jamba"})
#: A LOOPED family's sample lengths: its trace costs some 35 ms per token and layer (Jamba,
#: LoRA with checkpointing, 2 cores), linear in the length, so its samples are shorter.
LOOPED_LENGTHS = (64, 128, 192, 256)


def base_stack(family: str) -> tuple[str, ...]:
    """A sample's base stack: BASES's, else the family's first and last layer types."""
    first, last, _ = hybrid_fit.STACKS[family]
    return BASES.get(family, (first, last))


def stacks(task: Task) -> dict[str, tuple[str, ...]]:
    """The traced stacks of a sample: "2", the base stack (`base_stack`; the name is the
    two-layer one's, as stored rows have it), and one per type with a layer of that type put
    after the base's last one (after the first layer where the base has none), or GROWN's."""
    family = task[0]
    base = base_stack(family)
    out = {"2": base}
    for kind in hybrid_fit.STACKS[family][2]:
        at = max((i for i, k in enumerate(base) if k == kind), default=0) + 1
        out[kind] = GROWN.get(family, {}).get(kind) or (*base[:at], kind, *base[at:])
    return out


def _merged_loops(dynamic: dict[str, int]) -> dict[str, int]:
    """A LOOPED family's moments with every run of an op one moment (`LOOPED`)."""
    out: dict[str, int] = {}
    for key, value in dynamic.items():
        if "#" in key:
            key = key.rpartition(":")[0]
        out[key] = max(out.get(key, 0), value)
    return out


def sample(task: Task) -> dict[str, Any]:
    """Trace one sample's stacks; keep each one's features, moments and static parts."""
    config, settings = variant(task)
    runs = {}
    for name, types in stacks(task).items():
        cfg = with_layers(task[0], config, types)
        per_layer, once = _features(cfg, settings)
        runs[name] = _measure(cfg, settings, split_layers=True) | {
            "per_layer": per_layer,
            "once": once,
        }
        if task[0] in LOOPED:
            runs[name]["dynamic"] = _merged_loops(runs[name]["dynamic"])
    return {"task": list(task), "class": task[:3], "runs": runs}


def _refeatured(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row with its features recomputed (they may have changed since)."""
    task: Task = tuple(row["task"])  # type: ignore[assignment]
    config, settings = variant(task)
    for name, types in stacks(task).items():
        per_layer, once = _features(with_layers(task[0], config, types), settings)
        row["runs"][name] |= {"per_layer": per_layer, "once": once}
    return row


def _dynamic(coefs: list[list[float]], run: dict[str, Any]) -> float:
    """A moment's fitted bytes: the per-layer features are already summed over the layers."""
    return max(0.0, dynamic_bytes(1, run["per_layer"], run["once"], coefs))


@cache
def _preset_mix(family: str) -> Counter[str]:
    """How many layers of each type the family's preset stacks."""
    shape = parse_config(load_preset(HYBRID_PRESETS[family]).config_dict())
    return Counter(hybrid_fit.layer_kinds(shape))


def _points(row: dict[str, Any], family: str) -> list[dict[str, Any]]:
    """The row's traced stacks, plus stacks at DEPTHS in the family preset's layer mix
    (static parts and features are affine in the number of layers of each type)."""
    runs = row["runs"]
    base = runs["2"]
    mix = _preset_mix(family)
    middle = hybrid_fit.STACKS[family][2]
    in_base = Counter(base_stack(family))
    points = list(runs.values())
    for depth in DEPTHS:
        extra = _multiples(
            family, {t: round(depth * mix[t] / mix.total()) - in_base[t] for t in middle}
        )
        point = {"per_layer": list(base["per_layer"]), "once": base["once"]}
        for name in ("base", "static_step"):
            point[name] = base[name] + sum(
                n * (runs[t][name] - base[name]) for t, n in extra.items()
            )
        for t, n in extra.items():
            point["per_layer"] = [
                p + n * (x - y)
                for p, x, y in zip(
                    point["per_layer"], runs[t]["per_layer"], base["per_layer"], strict=True
                )
            ]
        points.append(point)
    return points


def _multiples(family: str, needed: dict[str, int]) -> dict[str, int]:
    """How many times to add each traced stack's layers (`stacks`) to the base for `needed`
    more layers of each type: `needed` itself where each adds one layer of its type, else
    the integer solution of the stacks' layer counts (GROWN's pairs)."""
    grown = GROWN.get(family, {})
    if not grown:
        return needed
    import numpy as np

    base = Counter(base_stack(family))
    names = list(needed)
    traced = stacks((family, "", "", 0))
    added = [[Counter(traced[name])[kind] - base[kind] for name in names] for kind in names]
    solution = np.linalg.solve(np.array(added, dtype=float), [needed[k] for k in names])
    return {name: round(float(n)) for name, n in zip(names, solution, strict=True)}


#: Lengths and batches the family's preset is priced at when the moments to keep are chosen:
#: a moment that decides only at real widths is kept too. The loss (`backward/tail`, t x a
#: real vocabulary) decides Falcon-H1 1.5B's LoRA at 2,048 tokens and no shrunk sample; the
#: fit without these points left it out and priced that job 4.3 % under the trace.
PRESET_LENGTHS = (512, 2048, 8192)
PRESET_BATCHES = (1, 4)


@cache
def _preset_points(family: str, method: str, gc: str) -> tuple[dict[str, Any], ...]:
    """The family preset's features and static parts at PRESET_LENGTHS x PRESET_BATCHES,
    as the samples of the class are set up (no trace: only the fit's predictions count)."""
    config = with_method(family, load_preset(HYBRID_PRESETS[family]).config_dict(), method)
    shape = parse_config(config)
    rank = 16 if method != "full" else None
    points = []
    for seq_len in PRESET_LENGTHS:
        for batch in PRESET_BATCHES:
            settings = _settings(family, config, (method, gc), rank, batch, seq_len)
            static = static_bytes(shape, settings)
            per_layer, once = hybrid_fit.features(shape, settings, static)
            base = static.weights + static.optimizer
            step = base + static.gradients + static.optimizer_scratch
            points.append({"per_layer": per_layer, "once": once, "base": base, "static_step": step})
    return tuple(points)


def _predict(key: str, coefs: list[list[float]], point: dict[str, Any]) -> float:
    static = point["static_step" if key == OPTIMIZER_KEY else "base"]
    return float(static) + _dynamic(coefs, point)


def _dot(coefs: list[float], values: list[int]) -> float:
    return sum(map(mul, coefs, values))


def fit(rows: list[dict[str, Any]], family: str) -> tuple[dict[str, list[list[float]]], float]:
    """Per moment: the per-layer coefficients from what each added layer adds (three layers
    less two), then the once coefficients from what they leave of every traced stack. Keeps
    the moments that decide some point, as `calibrate._deciding` does; returns them and the
    worst relative error of the predicted peak over the traced stacks."""
    middle = hybrid_fit.STACKS[family][2]
    runs = [run for row in rows for run in row["runs"].values()]
    keys = set.intersection(*(set(run["dynamic"]) for run in runs))
    fitted: dict[str, list[list[float]]] = {}
    for key in sorted(keys):
        layer_rows, layer_targets = [], []
        for row in rows:
            base = row["runs"]["2"]
            for t in middle:
                run = row["runs"][t]
                layer_rows.append(
                    [x - y for x, y in zip(run["per_layer"], base["per_layer"], strict=True)]
                )
                layer_targets.append(run["dynamic"][key] - base["dynamic"][key])
        per_layer = _lstsq(layer_rows, layer_targets)
        left = [run["dynamic"][key] - _dot(per_layer, run["per_layer"]) for run in runs]
        fitted[key] = [per_layer, _lstsq([run["once"] for run in runs], left)]
    points = [p for row in rows for p in _points(row, family)]
    points += _preset_points(family, *rows[0]["class"][1:3])
    keep = keep_deciding([{k: _predict(k, c, p) for k, c in fitted.items()} for p in points])
    coefficients = {k: fitted[k] for k in sorted(keep)}
    worst = max(
        abs(max(_predict(k, c, run) for k, c in coefficients.items()) - run["peak"]) / run["peak"]
        for run in runs
    )
    return coefficients, worst


def tasks(samples: int, first_seed: int = 0, families: list[str] | None = None) -> list[Task]:
    """Every sample of `families` (all by default); a family of one layer type adds one
    layer per sample, not three, so it gets twice the samples."""
    return [
        (family, method.value, gc.value, seed)
        for family, (_, _, middle) in hybrid_fit.STACKS.items()
        if families is None or family in families
        for method in METHODS
        for gc in CHECKPOINTING
        for seed in range(first_seed, first_seed + samples * (2 if len(middle) == 1 else 1))
    ]


def stored_rows(paths: list[Path], families: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of `--rows` files, of `families` (all by default), features recomputed."""
    rows = [row for path in paths for row in json.loads(path.read_text())]
    return [_refeatured(row) for row in rows if families is None or row["task"][0] in families]


def cross_validate(rows: list[dict[str, Any]], folds: int) -> dict[str, float]:
    """Per class, the worst relative error of the predicted peak over the samples held out of
    the fit: every `folds`-th sample in turn, fitted from the others."""
    worst: dict[str, float] = {}
    for (family, method, gc), group in by_class(rows).items():
        name = f"{family}/{method}/{gc}/sdpa"
        for fold in range(folds):
            kept = [row for i, row in enumerate(group) if i % folds != fold]
            coefficients, _ = fit(kept, family)
            for row in group[fold::folds]:
                for run in row["runs"].values():
                    predicted = max(_predict(k, c, run) for k, c in coefficients.items())
                    error = abs(predicted - run["peak"]) / run["peak"]
                    worst[name] = max(worst.get(name, 0.0), error)
    return worst


def calibrate(
    samples: int,
    workers: int,
    dump: Path | None = None,
    refit: list[Path] | None = None,
    first_seed: int = 0,
    families: list[str] | None = None,
) -> dict[str, Any]:
    started = time.perf_counter()
    if refit:
        rows = stored_rows(refit, families)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            rows = list(pool.map(sample, tasks(samples, first_seed, families), chunksize=2))
    missing = sorted(set(families or hybrid_fit.STACKS) - {r["task"][0] for r in rows})
    if missing:
        raise SystemExit(f"no samples of {', '.join(missing)} to fit")
    if dump is not None:
        dump.write_text(json.dumps(rows))
    fits: dict[str, Any] = {}
    errors: dict[str, float] = {}
    for (family, method, gc), group in by_class(rows).items():
        coefficients, worst = fit(group, family)
        fits.setdefault(family, {}).setdefault(method, {}).setdefault(gc, {})["sdpa"] = coefficients
        errors[f"{family}/{method}/{gc}/sdpa"] = worst
    return {
        "generated_by": "python -m controller.calibration.calibrate_hybrid",
        "versions": library_versions(),
        "samples_per_class": {
            f: sum(r["class"][0] == f for r in rows) // _CLASSES
            for f in hybrid_fit.STACKS
            if families is None or f in families
        },
        "seconds": round(time.perf_counter() - started, 1),
        "refit_of_stored_samples": bool(refit),
        "scope": (
            "bf16, AdamW, LoRA on every linear PEFT adapts there, sdpa (also used for "
            "flash/flex; eager is not fitted), transformers' torch path of the Mamba-2 scan "
            "(the fused CUDA kernel holds less), of Jamba's Mamba-1 scan (token by token; "
            "the fused kernel holds less) and of Qwen3-Next's gated delta rule (fla's "
            "kernels hold less), MoE experts as transformers' grouped_mm; Gemma 3n traced "
            "with sliding-attention layers only (a full-attention layer's RoPE table, t x "
            "head dim x 4 bytes once, is not fitted); stacks whose first and last layers are "
            "of the types in `stacks`"
        ),
        "stacks": {
            f: {"first": a, "last": b, "between": list(m)}
            for f, (a, b, m) in hybrid_fit.STACKS.items()
        },
        "layer_features": list(hybrid_fit.HYBRID_LAYER_FEATURES),
        "local_features": list(hybrid_fit.HYBRID_LOCAL_FEATURES),
        "worst_relative_error": max(errors.values()),
        "errors": errors,
        "families": fits,
    }


def merged(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """`old` with the families fitted in `new` replaced (or added), as `calibrate.merged`
    does for the uniform families: each family's fit stands alone while the features and the
    libraries are those `old` was fitted with."""
    if old is None:
        return new
    if (old["layer_features"], old["local_features"]) != (
        new["layer_features"],
        new["local_features"],
    ):
        raise SystemExit("--families: the features changed; fit every family")
    if old["versions"] != new["versions"]:
        raise SystemExit("--families: the library versions changed; fit every family")
    fitted = tuple(new["families"])
    others = [f for f in old["families"] if f not in fitted]
    changed = [f for f in others if old["stacks"][f] != new["stacks"][f]]
    if changed:
        raise SystemExit(f"--families: the stacks of {', '.join(changed)} changed; fit them too")
    out = old | {
        "families": old["families"] | new["families"],
        "stacks": new["stacks"],
        "scope": new["scope"],
        "samples_per_class": old["samples_per_class"] | new["samples_per_class"],
        "merged": sorted(set(old.get("merged", [])) | set(fitted)),
        "merged_seconds": old.get("merged_seconds", {}) | {",".join(fitted): new["seconds"]},
    }
    kept = {k: v for k, v in old["errors"].items() if k.split("/")[0] not in fitted}
    out["errors"] = kept | new["errors"]
    out["worst_relative_error"] = max(out["errors"].values())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=60, help="samples per class")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    default_out = Path(__file__).resolve().parents[1] / "estimator" / DATA_FILE
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--rows", type=Path, help="also write the traced samples here (JSON)")
    parser.add_argument("--first-seed", type=int, default=0, help="seed of the first sample")
    parser.add_argument(
        "--refit", type=Path, nargs="+", help="fit samples written by --rows, no tracing"
    )
    parser.add_argument(
        "--families",
        type=lambda text: text.split(","),
        help=f"only these (comma-separated, of {', '.join(hybrid_fit.STACKS)}); the other "
        "families' fits in --out are kept",
    )
    parser.add_argument(
        "--cross-validate",
        type=int,
        metavar="FOLDS",
        help="with --refit: print each class's worst error on held-out samples, write nothing",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.families or ()) - set(hybrid_fit.STACKS))
    if unknown:
        parser.error(f"--families: unknown {', '.join(unknown)}; of {', '.join(hybrid_fit.STACKS)}")
    if args.cross_validate is not None:
        if not args.refit or args.cross_validate < 2:
            parser.error("--cross-validate needs --refit (the stored samples) and 2 folds or more")
        held_out = cross_validate(stored_rows(args.refit, args.families), args.cross_validate)
        for name, error in sorted(held_out.items()):
            print(f"{name}: worst held-out error {error:.2%}")
        return 0
    section = calibrate(
        args.samples, args.workers, args.rows, args.refit, args.first_seed, args.families
    )
    data = json.loads(args.out.read_text())
    data["hybrid"] = merged(data.get("hybrid"), section) if args.families else section
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(
        f"wrote the hybrid section of {args.out}: {len(section['errors'])} classes, worst "
        f"error {section['worst_relative_error']:.4%}, {section['seconds']} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
