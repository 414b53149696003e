"""Byte sizes: parsed and formatted only at the edges, integers everywhere inside.

`parse_size` reads what people and programs write; `Bytes` puts it into a pydantic model
(settings, the agent's static file, plan's compact cluster file), so every size field reads
the same forms and says the same things when it cannot.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

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


@dataclass(frozen=True)
class Bytes:
    """A size field of a pydantic model: ``Annotated[int, Bytes(unit=True)]``.

    It takes an integer of bytes or a string `parse_size` reads, zero in any unit included:

    * `unit`: a string needs its unit (``2`` is refused; ``2GiB``, ``0`` are not), where a
      person would mean GB rather than bytes: flags, environment variables;
    * `integers`: an integer is bytes, as programs write files (YAML numbers); off, a bare
      integer other than 0 is refused like a string without its unit, for files people write;
    * `zero`: zero is a size here (a headroom, an idle GPU's used memory); off, it must be
      greater than 0 (a GPU's memory).

    pydantic unpacks it (annotated-types' grouped metadata) into its validator and its bound,
    and imports only then: the estimator imports this module without loading pydantic.
    """

    unit: bool = False
    integers: bool = True
    zero: bool = True

    __is_annotated_types_grouped_metadata__ = True

    def __iter__(self) -> Iterator[object]:
        from annotated_types import Ge, Gt
        from pydantic import BeforeValidator

        yield BeforeValidator(self._bytes)
        yield Ge(0) if self.zero else Gt(0)

    def _bytes(self, value: Any) -> Any:
        if isinstance(value, str):
            size = parse_size(value, require_unit=self.unit, allow_zero=True)
        elif self.integers:
            return value  # bytes, or what the integer check refuses
        elif isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("must be a size such as 80GiB or 24GB")
        elif value != 0:
            raise ValueError("must have a unit (80GiB, 24GB); a bare number is ambiguous")
        else:
            size = 0  # zero bytes in any unit
        if size == 0 and not self.zero:
            raise ValueError("must be greater than 0")
        return size


def gib(n_bytes: int) -> float:
    """Bytes as GiB for display (never for comparisons)."""
    return n_bytes / GIB


def format_gib(n_bytes: int, digits: int = 2) -> str:
    return f"{n_bytes / GIB:.{digits}f} GiB"
