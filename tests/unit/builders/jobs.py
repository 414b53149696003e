"""Builders of FineTuneJob specs: the reference job of the spec translation's tests, with
changes merged in."""

from __future__ import annotations

from typing import Any


def job(**changes: Any) -> dict[str, Any]:
    """The reference job (llama-3.1-8b, QLoRA r=16, 2048 x 1, analytic), with `changes`
    merged in one level deep (`training={"optimizer": "SGD"}` keeps the other keys); a
    `model` replaces the preset."""
    spec: dict[str, Any] = {
        "model": {"preset": "llama-3.1-8b"},
        "method": "QLoRA",
        "lora": {"rank": 16},
        "training": {"sequenceLength": 2048, "microBatchSize": 1},
        "estimator": {"profile": "Analytic"},
    }
    for key, value in changes.items():
        if key != "model" and isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec
