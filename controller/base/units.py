"""Byte sizes: parsed and formatted only at the edges, integers everywhere inside."""

from __future__ import annotations

import re
from fractions import Fraction

GIB = 2**30
MIB = 2**20

#: The largest size accepted (1 EiB): far above any GPU or node, small enough that GiB figures
#: format as floats. Digits are bounded too, so no input reaches Python's big-int limits.
MAX_SIZE = 2**60
#: ASCII digits only: `\d` would also take other scripts' digits (a fullwidth ５GiB).
_SIZE = re.compile(r"^\s*([0-9]{1,24}(?:\.[0-9]{1,24})?)\s*([a-zA-Z]*)\s*$")
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 2**10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": MIB,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": GIB,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 2**40,
    # Kubernetes quantities' binary suffixes, as people write them in Helm values (2Gi).
    "ki": 2**10,
    "mi": MIB,
    "gi": GIB,
    "ti": 2**40,
}


def parse_size(text: str, require_unit: bool = False, allow_zero: bool = False) -> int:
    """Parse `80GB` (decimal, as GPU vendors label cards), `80GiB`, `80Gi`, `24G` or plain
    bytes.

    Decimal suffixes follow the vendors' labels ("80 GB" H100 is 80e9 bytes nominal); binary
    suffixes (GiB) follow NVML and the seeds. `require_unit` refuses a bare number, where a
    person would mean GB rather than bytes (`--gpu-memory 80`); files written by programs
    keep plain bytes. `allow_zero` takes zero, in any unit or none (it is zero bytes either
    way), where a size may be nothing (a headroom). Raises ValueError with the allowed forms.
    """
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        plain = "" if require_unit else ", or plain bytes"
        raise ValueError(
            f"invalid size {text!r}: use a number with B, KB, MB, GB, TB (decimal), "
            f"KiB, MiB, GiB, TiB or Ki, Mi, Gi, Ti (binary){plain}"
        )
    if allow_zero and Fraction(match.group(1)) == 0:
        return 0
    if require_unit and not unit:
        number = text.strip()
        raise ValueError(f"invalid size {text!r}: needs a unit, e.g. {number}GB or {number}GiB")
    size = int(Fraction(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"invalid size {text!r}: must be greater than 0")
    if size > MAX_SIZE:
        raise ValueError(f"invalid size {text!r}: must be at most 1 EiB")
    return size


def gib(n_bytes: int) -> float:
    """Bytes as GiB for display (never for comparisons)."""
    return n_bytes / GIB


def format_gib(n_bytes: int, digits: int = 2) -> str:
    return f"{n_bytes / GIB:.{digits}f} GiB"
