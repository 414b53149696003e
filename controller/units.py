"""Byte sizes: parsed and formatted only at the edges, integers everywhere inside."""

from __future__ import annotations

import re

GIB = 2**30
MIB = 2**20

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 2**10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 2**20,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 2**30,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 2**40,
}


def parse_size(text: str) -> int:
    """Parse `80GB` (decimal, as GPU vendors label cards), `80GiB`, `24G` or plain bytes.

    Decimal suffixes follow the vendors' labels ("80 GB" H100 is 80e9 bytes nominal); binary
    suffixes (GiB) follow NVML and the seeds. Raises ValueError with the allowed forms.
    """
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(
            f"invalid size {text!r}: use a number with B, KB, MB, GB, TB (decimal), "
            "KiB, MiB, GiB, TiB (binary), or plain bytes"
        )
    value = float(match.group(1)) if "." in match.group(1) else int(match.group(1))
    size = int(value * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"invalid size {text!r}: must be greater than 0")
    return size


def gib(n_bytes: int) -> float:
    """Bytes as GiB for display (never for comparisons)."""
    return n_bytes / GIB


def format_gib(n_bytes: int, digits: int = 2) -> str:
    return f"{n_bytes / GIB:.{digits}f} GiB"
