"""Shared model configs for the estimator tests (as a config.json would hold them), and the
order the unit tests run in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

GIB = 2**30

LLAMA_31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
}

QWEN25_05B: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
}

# The original LLaMA-65B (the QLoRA paper's headline run), not a bundled preset.
LLAMA_65B: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 22016,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "max_position_embeddings": 2048,
}

# Pythia-6.9B's config.json (EleutherAI/pythia-6.9b): a GPT-NeoX, which vramgate does not read.
# Read as a Llama-style block it came out at 9.00B parameters (the real count is 6.86B).
PYTHIA_69B: dict[str, Any] = {
    "architectures": ["GPTNeoXForCausalLM"],
    "model_type": "gpt_neox",
    "hidden_act": "gelu",
    "hidden_size": 4096,
    "intermediate_size": 16384,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "rotary_pct": 0.25,
    "use_parallel_residual": True,
    "vocab_size": 50432,
    "tie_word_embeddings": False,
    "max_position_embeddings": 2048,
}
#: How each path starts its refusal of it, after the field's path.
NOT_A_FAMILY = "model_type: 'gpt_neox' is not a model family vramgate reads"


@pytest.fixture
def llama8b() -> dict[str, Any]:
    return dict(LLAMA_31_8B)


#: The files whose tests trace models for minutes (two thirds of the unit tests' time), in
#: order of their total time. `make test` runs the unit tests on two workers handed one test at
#: a time (`pytest -n 2 --maxschedchunk 1`): run in file order, these came last, and one
#: worker was left alone on them for a quarter of an hour while the other idled.
LONG_FILES_FIRST = (
    "test_calibrated_hybrid.py",
    "test_calibrated.py",
    "test_trace.py",
    "test_gemma3n.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The unit tests reordered among the places they hold; any other test keeps its own."""
    here = Path(__file__).parent
    places = [i for i, item in enumerate(items) if here in item.path.parents]

    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONG_FILES_FIRST.index(name) if name in LONG_FILES_FIRST else len(LONG_FILES_FIRST)

    ordered = sorted((items[i] for i in places), key=rank)  # stable: each file keeps its order
    for i, item in zip(places, ordered, strict=True):
        items[i] = item
