"""An `Estimate` as compact, versioned JSON text, and back, exactly.

Why: a traced estimate costs seconds to a minute, and the operator keeps it in the job's
status (`status.estimate.traced`) so that a restart, a failover or a second replica reads it
instead of tracing the same job again. Status is data anyone with the right may edit and an
older vramgate may have written, so `decode` trusts nothing: any payload that is not exactly
what `encode` of this version writes raises `CodecError` (a ValueError), never anything
else, and the caller computes the estimate again.

The text is a JSON object: `v` (the version), then each field of `Estimate` by name, in the
dataclass's order, then optionally `by`: what made the estimate beyond vramgate's own code
(the trace libraries' versions), read with `made_by`. Integers stay integers (bytes are
exact), `margin` is `[numerator, denominator]` (a Fraction, never a float), tuples are
arrays, `components` an object whose key order is the estimate's own (JSON text keeps it;
a total is a sum in that order).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import fields
from fractions import Fraction
from typing import Any

from controller.estimator.result import Estimate

#: The payload's version: raise it whenever a field's meaning or encoding changes, so that
#: a payload of another version is computed again rather than misread.
VERSION = 1
#: The longest payload read: a traced estimate is well under 2 KiB; a status field that
#: holds more was not written by `encode`.
MAX_TEXT = 32_768
#: The most components, moments and traced counts a payload may hold (traces write ~12, ~4
#: and 1): bounds what a hostile payload makes `decode` build.
MAX_ITEMS = 256
MAX_NAME = 64
#: Integers beyond this are no byte count of any GPU (2^63: a signed 64-bit integer, as
#: Kubernetes' own int64 fields).
MAX_INT = 2**63 - 1
#: The longest `by` read: three libraries' names and versions are well under 100 characters.
MAX_BY = 256

#: Every field but admission's `correction_percent`: a stored estimate is the estimator's own.
_FIELDS = tuple(f.name for f in fields(Estimate) if f.name != "correction_percent")


class CodecError(ValueError):
    """The payload is not an estimate this version of vramgate wrote."""


def encode(est: Estimate, made_by: str | None = None) -> str:
    """`est` as compact JSON text (`decode` gives back an equal Estimate), with `made_by`
    (`made_by` gives it back) where given."""
    out: dict[str, Any] = {"v": VERSION}
    for name in _FIELDS:
        value = getattr(est, name)
        if isinstance(value, Fraction):
            out[name] = [value.numerator, value.denominator]
        elif isinstance(value, tuple):
            out[name] = [list(item) if isinstance(item, tuple) else item for item in value]
        else:
            out[name] = value
    if made_by is not None:
        out["by"] = made_by
    return json.dumps(out, separators=(",", ":"))


def decode(text: object) -> Estimate:
    """The Estimate `encode` wrote as `text`; CodecError for anything else."""
    data = _read(text)
    return Estimate(**{name: _DECODERS[name](data[name], name) for name in _FIELDS})


def made_by(text: object) -> str | None:
    """The `made_by` that `encode` wrote into `text` (None: none); CodecError where `text`
    is not what `encode` wrote."""
    by = _read(text).get("by")
    return None if by is None else str(by)


def _read(text: object) -> dict[str, Any]:
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise CodecError(f"not a string of at most {MAX_TEXT} characters")
    try:
        data = json.loads(text, parse_float=_no_float, parse_constant=_no_float)
    except (ValueError, RecursionError) as error:
        raise CodecError(f"not JSON: {error}") from None
    if not isinstance(data, dict):
        raise CodecError("not a JSON object")
    if data.get("v") != VERSION or isinstance(data.get("v"), bool):
        raise CodecError(f"version {data.get('v')!r}, not {VERSION}")
    names = set(data) - {"v", "by"}
    if names != set(_FIELDS):
        missing, extra = sorted(set(_FIELDS) - names), sorted(names - set(_FIELDS))
        raise CodecError(f"fields missing {missing}, unknown {extra}")
    by = data.get("by", "")
    if not isinstance(by, str) or len(by) > MAX_BY:
        raise CodecError(f"by: not a string of at most {MAX_BY} characters")
    return data


def _no_float(text: str) -> Any:
    raise CodecError(f"{text}: not an integer (an estimate holds no floats)")


def _int(value: object, where: str) -> int:
    # Every integer of an estimate is a count of bytes, parameters, ranks or a share's terms:
    # never negative (a negative component would lower the total that admission reserves).
    if type(value) is not int or not 0 <= value <= MAX_INT:  # bool is no byte count
        raise CodecError(f"{where}: not an integer from 0 to {MAX_INT}")
    return value


def _ints(value: object, length: int, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) != length:
        raise CodecError(f"{where}: not a list of {length} integers")
    return tuple(_int(item, where) for item in value)


def _pairs(value: object, where: str) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise CodecError(f"{where}: not a list of at most {MAX_ITEMS} pairs")
    return tuple(_pair(item, where) for item in value)


def _pair(value: object, where: str) -> tuple[int, int]:
    first, second = _ints(value, 2, where)
    return first, second


def _share(value: object, where: str) -> tuple[int, int] | tuple[()]:
    if value == []:
        return ()
    numerator, denominator = _ints(value, 2, where)
    if denominator <= 0:
        raise CodecError(f"{where}: the denominator must be positive")
    return numerator, denominator


def _name(value: object, where: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME:
        raise CodecError(f"{where}: not a name of 1 to {MAX_NAME} characters")
    return value


def _components(value: object, where: str) -> dict[str, int]:
    if not isinstance(value, dict) or len(value) > MAX_ITEMS:
        raise CodecError(f"{where}: not an object of at most {MAX_ITEMS} entries")
    return {_name(key, where): _int(bytes_, f"{where}.{key}") for key, bytes_ in value.items()}


def _fraction(value: object, where: str) -> Fraction:
    numerator, denominator = _ints(value, 2, where)
    if numerator <= 0 or denominator <= 0:  # a zero margin would reserve nothing
        raise CodecError(f"{where}: not a positive fraction")
    return Fraction(numerator, denominator)


def _traced(value: object, where: str) -> tuple[tuple[str, int, int], ...]:
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise CodecError(f"{where}: not a list of at most {MAX_ITEMS} entries")
    out = []
    for item in value:
        if not isinstance(item, list) or len(item) != 3:
            raise CodecError(f"{where}: not [parallelism, gpus, bytes]")
        parallelism, gpus, held = item
        out.append((_name(parallelism, where), _int(gpus, where), _int(held, where)))
    return tuple(out)


_INTEGERS = (
    "total_params", "trainable_params", "sharded_bytes", "replicated_bytes", "head_bytes",
    "fixed_bytes", "ddp_bytes", "comm_bytes", "load_moment", "resident_bytes", "paged_bytes",
)  # fmt: skip
#: How each field of `Estimate` is read back (a test checks that every field has one).
_DECODERS: dict[str, Callable[[object, str], Any]] = {
    "profile": _name,
    "components": _components,
    "margin": _fraction,
    "moments": _pairs,
    "fsdp_moments": _pairs,
    "traced_per_gpu": _traced,
    "traced_allocated": _traced,
    "reserve_share": _share,
    "fsdp_reserve_share": _share,
    "ddp_reserve_share": _share,
    **dict.fromkeys(_INTEGERS, _int),
}
