"""Which model types vramgate reads, and how: by hand, generically, or by the trace alone.

    for row in model_type_readings():   # what `vramgate presets --types` prints
        print(row.model_type, row.reading)

Three readings, from the cheapest and most exact to the most general:

* **by hand**: the 28 families `controller.estimator.model.parse_config` reads, byte-exact,
  with fits of their own in `calibrated`;
* **generic**: any other type the installed transformers builds as a causal LM or a
  vision-language model, read from the model it builds on the meta device
  (`controller.estimator.model.generic`) and priced with the closest fitted structure;
* **trace**: a type whose layers no fitted structure prices (the trace alone measures it:
  `calibrated` hands such a job to the trace).

The generic and trace readings need the `trace` extra; without it only the hand-read types
are listed, with a line saying what the extra adds.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from controller.estimator.model.families import SUPPORTED_MODEL_TYPES


class Reading(StrEnum):
    HAND = "by hand"
    GENERIC = "generic"
    TRACE = "trace only"


@dataclass(frozen=True)
class TypeReading:
    model_type: str
    reading: Reading
    #: The transformers auto mapping(s) that build a type read generically ("" by hand).
    built_as: str = ""


def reading_of(model_type: str) -> Reading:
    """How a config of `model_type` is read (without building anything): a hand-read type is
    read by hand, any other one generically, or by the trace where its layers are ones no
    fitted structure prices."""
    if model_type in SUPPORTED_MODEL_TYPES:
        return Reading.HAND
    return Reading.TRACE if model_type in trace_only_types() else Reading.GENERIC


def trace_only_types() -> frozenset[str]:
    """The model types `calibrated` hands to the trace (none yet: every type transformers
    builds is priced by the generic reading's fits)."""
    return frozenset()


def model_type_readings(with_generic: bool) -> list[TypeReading]:
    """Every model type vramgate reads, sorted: the hand-read ones, and with `with_generic`
    (the trace extra installed) every other causal-LM or vision-language type of the installed
    transformers, with the auto class it is built with."""
    rows = [TypeReading(t, Reading.HAND) for t in SUPPORTED_MODEL_TYPES]
    if with_generic:
        from controller.trace.inventory import mapping

        built: dict[str, str] = {}
        for auto in ("causal_lm", "image_text_to_text"):  # both: by whether it has a tower
            for t in mapping(auto):
                built[t] = f"{built[t]}, {auto}" if t in built else auto
        rows += [
            TypeReading(t, reading_of(t), built_as)
            for t, built_as in built.items()
            if t not in SUPPORTED_MODEL_TYPES
        ]
    return sorted(rows, key=lambda row: row.model_type)
