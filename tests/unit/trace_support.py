"""What the trace and calibrated tests share: the torch guard and small model configs."""

from __future__ import annotations

import os
from typing import Any

import pytest


def require_trace_extra() -> None:
    """Skip (with the reason shown) where torch is absent, except in CI, where it must be:
    CI installs the `trace` extra, so a missing torch there is a failure, not a skip."""
    if os.environ.get("CI"):
        import torch  # noqa: F401  (an ImportError fails the run)
        import transformers  # noqa: F401

        return
    for name in ("torch", "transformers", "peft"):
        pytest.importorskip(name, reason="needs the `trace` extra: pip install -e '.[trace]'")


#: A small Llama-style model: 4 layers, GQA, untied head (traces in well under a second).
TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
    "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
}


def with_layers(config: dict[str, Any], layers: int) -> dict[str, Any]:
    return config | {"num_hidden_layers": layers}
