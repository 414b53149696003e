"""Byte sizes in agent settings and static files: integers, or strings such as ``256MiB``.

Why not ``controller.base.units.parse_size`` alone: it refuses zero (no GPU has zero memory), but
zero is a real value here: an idle GPU uses ``0GiB``, and a change threshold of 0 writes
every change.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from controller.base.units import parse_size


def _to_bytes(value: Any) -> Any:
    if isinstance(value, str):
        return parse_size(value, allow_zero=True)
    return value


ByteSize = Annotated[int, BeforeValidator(_to_bytes), Field(ge=0)]
