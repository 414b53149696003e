"""Every bundled preset's estimate, by method and formula profile, is what it was.

The golden file holds each estimate whole (components, parameters, the per-GPU split and its
moments, FSDP2's per-rank moments and DDP's buckets, per-GPU bytes at 1, 2 and 8 GPUs under
FSDP and DDP). A change of layout or of reading must leave every figure byte-identical; a
change meant to move figures rewrites the file on purpose
(`python -m tests.unit.estimator.test_estimates_unchanged`) and says why in its commit.
The trace profile is left out: seconds per estimate, and its own tests pin its figures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from controller.estimator import Parallelism
from controller.estimator.presets import hand_read_preset_names
from controller.jobs.spec import estimate_plan, translate

GOLDEN = Path(__file__).parent / "data" / "estimates.json"
METHODS = ("Full", "LoRA", "QLoRA")
PROFILES = ("Analytic", "Unsloth", "Calibrated")


def _spec(preset: str, method: str, profile: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"preset": preset},
        "method": method,
        "estimator": {"profile": profile},
    }
    if method != "Full":
        spec["lora"] = {"rank": 16}
    return spec


def _figures(preset: str, method: str, profile: str) -> dict[str, Any]:
    plan, errors = translate(_spec(preset, method, profile))
    if plan is None:
        return {"refused": sorted(str(e) for e in errors)}
    est = estimate_plan(plan)
    return {
        "profile": est.profile,
        "components": dict(est.components),
        "total_params": est.total_params,
        "trainable_params": est.trainable_params,
        "sharded_bytes": est.sharded_bytes,
        "replicated_bytes": est.replicated_bytes,
        "margin": str(est.margin),
        "head_bytes": est.head_bytes,
        "fixed_bytes": est.fixed_bytes,
        "moments": [list(m) for m in est.moments],
        "fsdp_moments": [list(m) for m in est.fsdp_moments],
        "ddp_bytes": est.ddp_bytes,
        "per_gpu": {
            f"{mode.value}x{n}": est.per_gpu_bytes(n, mode)
            for mode in (Parallelism.FSDP, Parallelism.DDP)
            for n in (1, 2, 8)
        },
    }


def _all() -> dict[str, Any]:
    return {
        f"{preset}/{method}/{profile}": _figures(preset, method, profile)
        for preset in sorted(hand_read_preset_names())
        for method in METHODS
        for profile in PROFILES
    }


def test_every_presets_estimate_is_byte_identical_to_the_golden_file() -> None:
    golden = json.loads(GOLDEN.read_text())
    now = json.loads(json.dumps(_all()))
    assert sorted(now) == sorted(golden), "the presets, methods or profiles changed"
    changed = [key for key in sorted(golden) if now[key] != golden[key]]
    if changed:
        pytest.fail(f"{len(changed)} estimates moved, first {changed[:5]}: {now[changed[0]]}")


if __name__ == "__main__":  # rewrite the golden file, on purpose
    GOLDEN.write_text(json.dumps(_all(), indent=1, sort_keys=True) + "\n")
    sys.exit(0)
