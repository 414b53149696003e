"""parse_config keeps shapes by the config's exact content: same bytes, same shape; anything
that differs in value or type is parsed on its own."""

from __future__ import annotations

import collections
import datetime
from typing import Any

import pytest

from controller.estimator import SpecError, parse_config
from controller.estimator.model.parse import PARSED_CONFIG_MAX_BYTES, PARSED_CONFIG_MAX_CONTAINERS
from tests.unit.conftest import LLAMA_31_8B


def _config(**changes: Any) -> dict[str, Any]:
    return {**LLAMA_31_8B, "_name_or_path": "test_parse_cache", **changes}


def test_an_equal_config_gets_the_same_shape() -> None:
    first = parse_config(_config())
    assert parse_config(_config()) is first
    assert parse_config(_config(), prefix="spec.model.config") is not first  # errors differ


def test_the_shape_does_not_follow_later_changes_to_the_callers_dict() -> None:
    config = _config(_name_or_path="changed-later")
    shape = parse_config(config)
    config["num_hidden_layers"] = 2
    assert shape.source is not None and shape.source["num_hidden_layers"] == 32
    assert shape.num_layers == 32
    assert parse_config(config).num_layers == 2


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_hidden_layers", 32.0, "num_hidden_layers: must be an integer, got 32.0"),
        ("num_hidden_layers", True, "num_hidden_layers: must be an integer, got True"),
        ("tie_word_embeddings", 0, "tie_word_embeddings: must be true or false, got 0"),
    ],
)
def test_values_equal_in_python_but_of_another_type_are_not_the_cached_config(
    field: str, value: object, message: str
) -> None:
    parse_config(_config())  # 32, False cached; 32.0 == 32 and True == 1 in Python
    with pytest.raises(SpecError, match=message):
        parse_config(_config(**{field: value}))


def test_errors_are_raised_every_time() -> None:
    bad = _config(hidden_size="wide")
    for _ in range(2):
        with pytest.raises(SpecError, match="hidden_size: must be an integer"):
            parse_config(bad)


def test_what_marshal_cannot_write_is_parsed_as_it_is() -> None:
    ordered = collections.OrderedDict(_config())
    assert parse_config(ordered).total_params == parse_config(_config()).total_params
    dated = _config(created=datetime.date(2026, 12, 1))  # YAML decodes dates
    assert parse_config(dated) is not parse_config(dated)
    assert parse_config(dated).total_params == parse_config(_config()).total_params


def test_a_config_over_the_size_bound_is_not_kept() -> None:
    big = _config(id2label={str(i): f"label-{i}" for i in range(PARSED_CONFIG_MAX_BYTES // 8)})
    assert parse_config(big) is not parse_config(big)


def test_a_config_of_many_small_containers_is_not_kept() -> None:
    """2 marshalled bytes per `{}`, 64 in memory: kept, such configs could pin ~150 MB."""
    many = _config(junk=[{} for _ in range(PARSED_CONFIG_MAX_CONTAINERS)])
    assert parse_config(many) is not parse_config(many)
    few = _config(junk=[{} for _ in range(PARSED_CONFIG_MAX_CONTAINERS // 2)])
    assert parse_config(few) is parse_config(few)
