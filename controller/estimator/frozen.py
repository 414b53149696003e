"""Building frozen dataclasses on the hot path without their generated `__init__`.

A frozen dataclass's `__init__` sets each field through `object.__setattr__`, which under
Python 3.11 costs about 1,700 machine instructions a field: the 28 fields of `ArchDims`
took a fifth of a raw-config parse, and an estimate builds five such objects. `assemble`
fills the instance's `__dict__` in one update instead, so it needs a class without
`__slots__` and every field given (tests/unit/estimator/test_estimator_speed.py holds each hot-path
class to an instance its `__init__` builds).
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")

_new = object.__new__


def assemble(cls: type[T], fields: dict[str, Any]) -> T:
    """An instance of the frozen dataclass `cls` holding `fields` (all of them, by name),
    as `cls(**fields)` would build it."""
    instance: T = _new(cls)
    instance.__dict__.update(fields)
    return instance
