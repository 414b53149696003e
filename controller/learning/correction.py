"""A job's per-GPU figure after what the cluster taught: the estimate x a learned factor.

The rules, in the order they are tried:

1. Policy `off`: the estimate stands (samples are still recorded elsewhere).
2. **Pinned**: the finest key of the job's ladder that a person pinned gives the factor, as
   pinned: no clamp, no policy floor. A person's figure wins over a learned one.
3. **Learned**: the finest key with at least `min_samples` samples gives
   factor = its `percentile` of observed / predicted x (1 + margin), clamped to
   [min_factor, max_factor].
4. No key has enough samples: factor 1.00 (the estimate).
5. **OOM**: after an OOM of a job of exactly this key, the factor is at least the OOM's ratio
   (`record.py`), above the clamp if need be: a figure below what killed the last run would
   kill the next.
6. Policy `raiseOnly`: a factor below 1.00 is read as 1.00.

The factor is whole percent, rounded up, and the figure is the estimate x percent / 100
rounded up to a byte: integers, so `vramgate plan` on a dump reproduces the operator exactly,
and the one-line message's numbers multiply out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from controller.base.units import format_gib
from controller.learning.keys import ANY, JobKey
from controller.learning.record import KeyRecord, Records, own_keys
from controller.learning.settings import LearningSettings, Policy

#: The share of `min_samples` whose weight must be left at `now` for a key to answer: k
#: samples within about a half-life (each then weighs at least 1/2).
RECENT_WEIGHT_SHARE = 0.5


class Source(StrEnum):
    """Where a correction's factor came from."""

    OFF = "Off"  # learning is off for this job or cluster
    TOO_FEW = "TooFewSamples"  # no key of the job's ladder has min_samples yet
    LEARNED = "Learned"
    PINNED = "Pinned"
    OUT_OF_MEMORY = "OutOfMemory"  # raised after a job like it died of OOM


@dataclass(frozen=True, slots=True)
class Correction:
    """The corrected figure and where it came from: what `status.estimate` adds beside the
    estimator's own figure."""

    estimate_bytes: int
    per_gpu_bytes: int
    factor_percent: int
    source: Source
    #: The key the factor came from (`JobKey.name`); None for OFF and TOO_FEW.
    key: str | None
    #: Samples of that key (TOO_FEW: of the finest key that has any).
    samples: int
    percentile: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "estimateBytes": self.estimate_bytes,
            "perGpuBytes": self.per_gpu_bytes,
            "factorPercent": self.factor_percent,
            "source": self.source.value,
            "key": self.key,
            "samples": self.samples,
            "percentile": self.percentile,
            "message": self.message,
        }


def _percent(ratio: float) -> int:
    """Whole percent, rounded up (a float's last bit never adds a percent)."""
    return math.ceil(ratio * 100 - 1e-9)


def _figure(estimate_bytes: int, percent: int) -> int:
    return -(-estimate_bytes * percent // 100)


def correct(
    estimate_bytes: int,
    key: JobKey,
    records: Records,
    settings: LearningSettings,
    policy: Policy | None = None,
    now: datetime | None = None,
) -> Correction:
    """The job's per-GPU figure: `estimate_bytes` (the estimator's per-GPU figure at the NVML
    level) corrected by what `records` hold for `key`'s ladder. `policy` is the job's own,
    where it names one; else the cluster's (`settings.policy`).

    A key answers once it has `min_samples` samples and, at `now`, at least
    `RECENT_WEIGHT_SHARE` of their weight left: five jobs of last winter and one of today are
    one job's evidence, not five (VPA, likewise, weighs a histogram's samples by age before it
    trusts it). Without `now` the count alone decides."""
    if estimate_bytes <= 0:
        raise ValueError("estimate bytes must be greater than 0")
    policy = settings.policy if policy is None else policy
    profile = key.profile if key.profile != ANY else "estimated"
    head = f"{profile} {format_gib(estimate_bytes)}"
    pct = settings.percentile

    def made(percent: int, source: Source, used: str | None, samples: int, how: str) -> Correction:
        figure = _figure(estimate_bytes, percent)
        if source in (Source.OFF, Source.TOO_FEW):
            message = f"{head} as estimated: {how}"
        else:
            message = f"{head} x {percent / 100:.2f} {how} = {format_gib(figure)} per GPU"
        return Correction(estimate_bytes, figure, percent, source, used, samples, pct, message)

    if policy is Policy.OFF:
        return made(100, Source.OFF, None, 0, "learning is off")
    ladder = key.ladder()
    own = _own_record(records, key)
    oom = own.oom_factor_percent if own is not None else None
    own_name = own.key.name if own is not None else key.name  # where a reset would clear it
    for rung in ladder:
        record = records.get(rung.name)
        if record is not None and record.pinned_percent is not None:
            samples = record.histogram.samples
            how = f"pinned by hand for {rung.describe()}"
            if oom is not None and oom > record.pinned_percent:
                # the pin ran a job like it out of memory: its re-run is raised at once
                how += f", raised from {record.pinned_percent / 100:.2f} after an OOM"
                return made(oom, Source.OUT_OF_MEMORY, own_name, samples, how)
            return made(record.pinned_percent, Source.PINNED, rung.name, samples, how)

    floor = 100 if policy is Policy.RAISE_ONLY else 0
    # The finest key with enough samples that still weigh something (a key whose samples all
    # decayed away answers nothing, and the next coarser key does).
    enough = [
        records[r.name]
        for r in ladder
        if r.name in records
        and records[r.name].histogram.samples >= settings.min_samples
        and records[r.name].histogram.weights
        and (
            now is None
            or records[r.name].histogram.weight_at(now)
            >= settings.min_samples * RECENT_WEIGHT_SHARE
        )
    ]
    chosen = enough[0] if enough else None
    learned: int | None = None
    unclamped = 0
    if chosen is not None:
        ratio = chosen.histogram.percentile(pct / 100)
        if ratio is not None:
            unclamped = _percent(ratio * (100 + settings.margin_percent) / 100)
            low, high = settings.min_factor_percent, settings.max_factor_percent
            learned = min(max(unclamped, low), high)

    if own is not None and oom is not None and (learned is None or oom > learned):
        how = "after a job like it ran out of GPU memory"
        samples = own.histogram.samples
        return made(max(oom, floor), Source.OUT_OF_MEMORY, own_name, samples, how)
    if chosen is None or learned is None:
        finest = next((records[r.name] for r in ladder if r.name in records), None)
        have = finest.histogram.samples if finest is not None else 0
        how = f"{have} jobs like it, {settings.min_samples} needed to learn"
        return made(100, Source.TOO_FEW, None, have, how)
    percent = max(learned, floor)
    n = chosen.histogram.samples
    notes = [f"p{pct}"]
    if unclamped != learned:
        notes.append(f"clamped from {unclamped / 100:.2f}")
    if percent != learned:
        notes.append(f"raiseOnly keeps {learned / 100:.2f} from lowering it")
    how = f"learned from {n} jobs like it ({', '.join(notes)})"
    return made(percent, Source.LEARNED, chosen.key.name, n, how)


def _own_record(records: Records, key: JobKey) -> KeyRecord | None:
    """The record whose OOM raise is the job's own: its key's. A key naming a configuration
    whose record has no raise also takes the raise of the same key without it, where OOMs
    were filed before keys named configurations (`record.own_keys`)."""
    own = records.get(key.name)
    if own is not None and own.oom_factor_percent is not None:
        return own
    for older in own_keys(key)[1:]:
        found = records.get(older.name)
        if found is not None and found.oom_factor_percent is not None:
            return found
    return own


def without_raise_covers(
    records: Records, key: JobKey, ratio: float, settings: LearningSettings, now: datetime
) -> bool:
    """Whether a job of `key` would get at least `ratio` x its estimate from `records` at
    `now` with its own OOM raise taken away (policy adjust): what a success must show before
    its raise may go. A configuration that needs more than its kind's p95 (it falls back
    there below k samples), or than the clamp, would otherwise run out of memory every other
    run: raised after each OOM, lowered after each success."""
    cleared = dict(records)
    for own in own_keys(key):
        found = records.get(own.name)
        if found is not None and found.oom_factor_percent is not None:
            cleared[own.name] = replace(found, oom_factor_percent=None)
    adjust = replace(settings, policy=Policy.ADJUST)
    factor = correct(_RATIO_REFERENCE, key, cleared, adjust, now=now).factor_percent
    return factor >= ratio * 100 - 1e-6  # a figure is whole bytes: a hair over its factor


#: The figure `without_raise_covers` works on: factors are whole percents, any figure will do.
_RATIO_REFERENCE = 1 << 30
