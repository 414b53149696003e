"""What is kept per key, and how a job's outcome is filed: a steady peak or an OOM.

**A steady job** (finished, or running past its first optimizer steps) files
ratio = observed per-GPU peak / predicted per-GPU figure, both at the NVML level, under every
key of its ladder (`JobKey.ladder`), so a coarse key learns from all the kinds below it.

**A job that died of GPU OOM** never showed its peak; it needed more than it had. Its sample
follows VPA's `RecordOOM` (vertical-pod-autoscaler/pkg/recommender/model/container.go): the
memory it had is the larger of its reservation, the memory it could reach when it died
(`available_bytes`: its reservation plus what was free beside it, or the whole GPU where it
had one alone) and its observed peak; what it needs is that plus the larger of 20 % and
100 MiB (`DefaultOOMBumpUpRatio`, `DefaultOOMMinBumpUp`). The sample is that need / the
prediction, so it is never below capacity / prediction. Like VPA, the peak an OOM-killed job
reached is not bumped on top of the bump, so repeated OOMs do not compound.

An OOM also raises the job's own (finest) key at once: `oom_factor_percent` holds the OOM's
ratio, and every correction of that key is at least that, whatever the percentile says or how
few samples there are, until a later steady sample of the key clears it (the re-run that
succeeded). Only the finest key is raised, and only it files the OOM's sample: an OOM of one
trainer image says little of another, and its need is a bound, not a measurement.

A **pinned** correction is a person's: set on a key by hand, it wins over everything learned
(`correction.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from controller.learning.histogram import DecayingHistogram
from controller.learning.keys import ANY, JobKey
from controller.learning.settings import LearningSettings


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """What one key learned: the status of one key's stored object."""

    key: JobKey
    histogram: DecayingHistogram = field(default_factory=DecayingHistogram)
    #: After an OOM of a job of exactly this key: the least factor (percent) its next jobs get.
    oom_factor_percent: int | None = None
    #: A correction set by hand (percent), winning over the learned one; spec, not status.
    pinned_percent: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key.name,
            "histogram": self.histogram.to_dict(),
            "oomFactorPercent": self.oom_factor_percent,
            "pinnedPercent": self.pinned_percent,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KeyRecord:
        for name in ("oomFactorPercent", "pinnedPercent"):
            value = data.get(name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}: must be a positive integer (percent) or absent")
        return cls(
            key=JobKey.parse(str(data.get("key", ""))),
            histogram=DecayingHistogram.from_dict(data.get("histogram") or {}),
            oom_factor_percent=data.get("oomFactorPercent"),
            pinned_percent=data.get("pinnedPercent"),
        )


#: Every key's record, by `JobKey.name`.
Records = Mapping[str, KeyRecord]


def own_keys(key: JobKey) -> tuple[JobKey, ...]:
    """The keys whose OOM raise is a job's own: its key, and for a key naming a
    configuration, the same key without it, which OOMs were filed under before keys named
    configurations. A success settles the raise of both (`record_steady`: cleared, or kept
    on the first alone); the correction reads the second where the first has none."""
    if key.config == ANY:
        return (key,)
    return (key, replace(key, config=ANY))


def _record(records: Records, key: JobKey, settings: LearningSettings) -> KeyRecord:
    found = records.get(key.name)
    if found is not None:
        return found
    return KeyRecord(key, DecayingHistogram(half_life_seconds=settings.half_life_seconds))


def _ratio(numerator: int, predicted_bytes: int) -> float:
    if predicted_bytes <= 0:
        raise ValueError("predicted bytes must be greater than 0")
    if numerator <= 0:
        raise ValueError("observed bytes must be greater than 0")
    return numerator / predicted_bytes


def record_steady(
    records: Records,
    key: JobKey,
    observed_bytes: int,
    predicted_bytes: int,
    at: datetime,
    settings: LearningSettings,
    clears_oom: bool = True,
    judged_on: Records | None = None,
) -> dict[str, KeyRecord]:
    """The records a steady job changes (every key of its ladder), by key name: the caller
    writes these and keeps the rest.

    The job's own OOM raise (`own_keys`) is cleared where what a job of its key got without
    it (`correction.without_raise_covers`, decayed to `at`) covers what this one used. Else
    the raise stays, at least at what it used (whole percent), and on the job's own key only
    (a raise filed under the key without a configuration is every configuration's). Not by
    a job still running (`clears_oom` false), which may yet run out of memory.

    Judged on the records without this job: `records` as they stood, or `judged_on` where
    the caller knows better (a job's end replaces its running sample, which `records` hold;
    a rebuilt key's coarser keys have counted this very sample already). A job must not
    cover itself."""
    # Imported here: `correction` builds on this module's records.
    from controller.learning.correction import without_raise_covers

    ratio = _ratio(observed_bytes, predicted_bytes)
    changed = {}
    for rung in key.ladder():
        record = _record(records, rung, settings)
        changed[rung.name] = replace(record, histogram=record.histogram.add(ratio, at))
    if not clears_oom:
        return changed
    raises = [
        raise_to
        for k in own_keys(key)
        if (raise_to := changed[k.name].oom_factor_percent) is not None
    ]
    if not raises:
        return changed
    judged = records if judged_on is None else judged_on
    if without_raise_covers(judged, key, ratio, settings, at):
        kept = None
    else:  # never lowered; at least what it used, to the whole percent below (a figure
        # past what it used could pass the GPU it fit, and no job of the key would fit)
        kept = max(*raises, math.floor(ratio * 100 + 1e-9))
    for own in own_keys(key):
        changed[own.name] = replace(changed[own.name], oom_factor_percent=None)
    changed[key.name] = replace(changed[key.name], oom_factor_percent=kept)
    return changed


def oom_need_bytes(
    reserved_bytes: int, available_bytes: int, observed_bytes: int, settings: LearningSettings
) -> int:
    """What a job that died of OOM needs at least: VPA's `RecordOOM` rule (module docstring)."""
    had = max(reserved_bytes, available_bytes, observed_bytes)
    bumped = -(-had * settings.oom_bump_percent // 100)
    return max(had + settings.oom_min_bump_bytes, bumped)


def record_oom(
    records: Records,
    key: JobKey,
    reserved_bytes: int,
    available_bytes: int,
    observed_bytes: int,
    predicted_bytes: int,
    at: datetime,
    settings: LearningSettings,
) -> dict[str, KeyRecord]:
    """The record an OOM-killed job changes: its own key's, with its need as a sample and
    raised to at least that need at once. The coarser keys of its ladder are left alone: the
    need is a bound (capacity x 1.2), not a measurement, and one configuration's OOM filed under a
    family-wide key would lift every job of that family to the clamp."""
    need = oom_need_bytes(reserved_bytes, available_bytes, observed_bytes, settings)
    ratio = _ratio(need, predicted_bytes)
    raise_to = math.ceil(ratio * 100 - 1e-9)
    record = _record(records, key, settings)
    before = record.oom_factor_percent or 0
    record = replace(
        record,
        histogram=record.histogram.add(ratio, at),
        oom_factor_percent=max(before, raise_to),
    )
    return {key.name: record}


def pin(
    records: Records, key: JobKey, percent: int | None, settings: LearningSettings
) -> KeyRecord:
    """The key's record with a correction pinned by hand (None unpins it)."""
    if percent is not None and percent < 1:
        raise ValueError("pinnedPercent: must be a positive integer (percent)")
    return replace(_record(records, key, settings), pinned_percent=percent)
