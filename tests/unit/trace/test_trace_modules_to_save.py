"""LoRA with `modules_to_save`: PEFT trains a full copy of each listed module beside the
frozen original, and the trace counts that copy (its weights, gradients and AdamW moments)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.unit.trace_support import TINY_LLAMA, require_trace_extra

require_trace_extra()

from controller.estimator import Method, TrainingSettings  # noqa: E402
from controller.estimator.settings import SAVABLE_MODULES  # noqa: E402
from controller.trace.run import RunResult, trace_run  # noqa: E402

LORA = TrainingSettings(method=Method.LORA, seq_len=128)
# Both savable modules of the tiny (untied) Llama are vocab x hidden.
COPY_PARAMS = TINY_LLAMA["vocab_size"] * TINY_LLAMA["hidden_size"]
BF16 = 2
# PyTorch's AdamW keeps two moments in the parameter's dtype (bf16 for PEFT's copies).
COPY_BYTES = COPY_PARAMS * (BF16 + BF16 + 2 * BF16)  # weights + gradients + moments


@pytest.fixture(scope="module")
def plain() -> RunResult:
    return trace_run(TINY_LLAMA, LORA)


@pytest.mark.parametrize("module", SAVABLE_MODULES)
def test_a_saved_module_is_traced_as_a_trained_copy(module: str, plain: RunResult) -> None:
    saved = trace_run(TINY_LLAMA, replace(LORA, modules_to_save=(module,)))
    assert saved.trainable_params == plain.trainable_params + COPY_PARAMS
    assert saved.total_params == plain.total_params + COPY_PARAMS  # the original stays, frozen
    assert saved.peak - plain.peak >= COPY_BYTES
    copy_weights = saved.breakdown["weights"] - plain.breakdown["weights"]
    assert copy_weights >= COPY_PARAMS * BF16


def test_both_savable_modules_are_copied() -> None:
    both = trace_run(TINY_LLAMA, replace(LORA, modules_to_save=SAVABLE_MODULES))
    one = trace_run(TINY_LLAMA, replace(LORA, modules_to_save=("lm_head",)))
    assert both.trainable_params == one.trainable_params + COPY_PARAMS
    assert both.peak - one.peak >= COPY_BYTES
