"""A generic family's config is held to the hand reading's bounds before anything is built, and
what transformers refuses in it is named by its field: a config of 10^8 layers must not hold
an estimate worker for hours, a negative depth must not end in a traceback."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.unit.trace_support import require_trace_extra

require_trace_extra()

from controller.estimator import SpecError  # noqa: E402
from controller.estimator.model import MAX_DIMENSION, MAX_LAYERS  # noqa: E402
from controller.jobs.profiles import read_shape  # noqa: E402

PHI = {
    "model_type": "phi",
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 1000,
}


def refusal(config: dict[str, Any]) -> SpecError:
    with pytest.raises(SpecError) as caught:
        read_shape(config, prefix="spec.model.config")
    assert "\n" not in str(caught.value)
    return caught.value


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("num_hidden_layers", 100_000_000, f"between 1 and {MAX_LAYERS}"),
        ("num_hidden_layers", MAX_LAYERS + 1, f"between 1 and {MAX_LAYERS}"),
        ("num_hidden_layers", -3, f"between 1 and {MAX_LAYERS}"),
        ("num_hidden_layers", 0, f"between 1 and {MAX_LAYERS}"),
        ("hidden_size", 2**30, f"between 0 and {MAX_DIMENSION}"),
        ("vocab_size", -1, f"between 0 and {MAX_DIMENSION}"),
    ],
)
def test_out_of_bounds_fields_are_refused_by_name_before_building(
    field: str, value: int, allowed: str
) -> None:
    started = time.perf_counter()
    error = refusal(PHI | {field: value})
    assert error.field == f"spec.model.config.{field}"
    assert allowed in error.message and str(value) in error.message
    assert time.perf_counter() - started < 5  # refused, not built


def test_a_nested_text_config_is_bounded_too() -> None:
    config = {
        "model_type": "qwen2_5_vl",
        "text_config": {"model_type": "qwen2_5_vl_text", "num_hidden_layers": 10**7},
    }
    error = refusal(config)
    assert error.field == "spec.model.config.text_config.num_hidden_layers"


@pytest.mark.parametrize(("field", "value"), [("hidden_size", "abc"), ("num_hidden_layers", True)])
def test_a_value_transformers_refuses_is_named_by_its_field(field: str, value: Any) -> None:
    error = refusal(PHI | {field: value})
    assert error.field == f"spec.model.config.{field}"
    assert "expected int" in error.message  # the reason, not only the field's name


def test_the_bounds_leave_a_real_config_alone() -> None:
    shape = read_shape(PHI | {"num_hidden_layers": 3}, prefix="spec.model.config")
    assert shape.num_layers == 3
