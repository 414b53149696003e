"""A decaying histogram of observed / predicted ratios, kept as Kubernetes' VPA keeps usage.

The facts carried over from the VPA recommender (kubernetes/autoscaler,
vertical-pod-autoscaler/pkg/recommender/util/):

* **Exponential buckets** (`histogram_options.go`, `NewExponentialHistogramOptions`): each
  bucket is wider than the one before by a fixed growth, 5 % by default
  (`model/aggregations_config.go`, `DefaultHistogramBucketSizeGrowth = 0.05`), so the relative
  resolution is the same at 0.6 and at 1.4. Here the buckets are geometric from `lowest`
  (VPA's start at 0); everything below `lowest` falls in bucket 0, everything above `highest`
  in the last, open-ended bucket.
* **Decay by a half-life relative to a reference time** (`decaying_histogram.go`): a sample
  taken at time t is added with weight 2^((t - reference) / half_life), so a sample loses half
  its weight against newer ones every half-life. Only relative weights matter, so the
  reference may move: moving it forward by n half-lives multiplies every weight by 2^-n
  (`shiftReferenceTimestamp`). VPA moves it when the exponent would exceed 100; here it moves
  whenever a sample arrives a half-life or more past it, so stored weights stay below 2 and
  read well in a status. The reference is always a whole number of half-lives after the Unix
  epoch (VPA: "always an integer multiple of halfLife").
* **Buckets that decayed below `EPSILON` are dropped** (`histogram.go`,
  `updateMinAndMaxBucket`; VPA's `epsilon = 0.001 * minSampleWeight`): a status keeps only
  what still weighs something.
* **Percentile by cumulative weight** (`histogram.go`, `Percentile`): walk the buckets from the
  lowest until the weight passed reaches p x the total, and answer that bucket's upper end
  (the start of the last bucket when it is the last, which has none). An upper end, not a
  midpoint: a reservation read from it errs on the side of enough memory.
* **Merge** (`decaying_histogram.go`, `Merge`): align both to the later reference, then add
  bucket by bucket.

Plain data: `to_dict` / `from_dict` give a JSON object for a status subresource (a sparse
bucket -> weight map, the reference time, the sample count).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

#: Buckets lighter than this are dropped (VPA: 0.001 x its minimum sample weight of 0.1). A
#: sample's weight falls below it after 13.3 half-lives (about six months at 14 days).
EPSILON = 1e-4
#: VPA's `DefaultHistogramBucketSizeGrowth`: each bucket 5 % wider than the one below.
DEFAULT_GROWTH = 0.05
#: The ratios kept apart: below 0.05 or above 4.0 of a prediction is a broken reading or a
#: broken estimate, and one bucket each is all they need.
DEFAULT_LOWEST = 0.05
DEFAULT_HIGHEST = 4.0
#: The default half-life: two weeks, long enough to gather k samples of a job run weekly, short
#: enough that a trainer image upgraded a month ago weighs a quarter of this week's runs.
DEFAULT_HALF_LIFE_SECONDS = 14 * 24 * 3600


@dataclass(frozen=True, slots=True)
class RatioScale:
    """The bucket boundaries: bucket 0 holds (0, lowest); bucket i >= 1 holds
    [lowest * g^(i-1), lowest * g^i) with g = 1 + growth; the last bucket starts at or above
    `highest` and has no upper end."""

    lowest: float = DEFAULT_LOWEST
    highest: float = DEFAULT_HIGHEST
    growth: float = DEFAULT_GROWTH

    def __post_init__(self) -> None:
        if not 0 < self.lowest < self.highest:
            raise ValueError("scale: lowest must be greater than 0 and less than highest")
        if self.growth <= 0:
            raise ValueError("scale: growth must be greater than 0")

    @property
    def buckets(self) -> int:
        steps = math.ceil(math.log(self.highest / self.lowest) / math.log1p(self.growth))
        return steps + 2

    def bucket(self, ratio: float) -> int:
        if ratio < self.lowest:
            return 0
        index = math.floor(math.log(ratio / self.lowest) / math.log1p(self.growth)) + 1
        return min(index, self.buckets - 1)

    def start(self, bucket: int) -> float:
        return 0.0 if bucket == 0 else self.lowest * (1 + self.growth) ** (bucket - 1)

    def upper(self, bucket: int) -> float:
        """The bucket's upper end; the last bucket's start, as VPA answers for it."""
        if bucket >= self.buckets - 1:
            return self.start(self.buckets - 1)
        return self.start(bucket + 1)

    def to_dict(self) -> dict[str, float]:
        return {"lowest": self.lowest, "highest": self.highest, "growth": self.growth}


def _epoch_seconds(at: datetime) -> float:
    if at.tzinfo is None:
        raise ValueError("times must carry a time zone (UTC)")
    return at.timestamp()


def format_time(at: datetime) -> str:
    """RFC 3339 in UTC, as Kubernetes writes times."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


@dataclass(frozen=True, slots=True)
class DecayingHistogram:
    """Ratios observed / predicted, each weighted by how recent it is. Immutable: `add` and
    `merge` answer a new histogram, so a caller holding the stored one can compare."""

    half_life_seconds: int = DEFAULT_HALF_LIFE_SECONDS
    scale: RatioScale = field(default_factory=RatioScale)
    #: Bucket index -> weight relative to `reference`; buckets of no weight are absent.
    weights: Mapping[int, float] = field(default_factory=dict)
    #: None until the first sample.
    reference: datetime | None = None
    #: How many samples were ever added (merged histograms add theirs): what "k samples" and
    #: "learned from 12 jobs" count. Decay changes their weights, not their number.
    samples: int = 0

    def __post_init__(self) -> None:
        if self.half_life_seconds <= 0:
            raise ValueError("halfLifeSeconds must be greater than 0")

    @property
    def total_weight(self) -> float:
        return sum(self.weights.values())

    def weight_at(self, now: datetime) -> float:
        """The total weight as of `now`: a fresh sample weighs 1, one a half-life old 0.5."""
        if self.reference is None:
            return 0.0
        age = _epoch_seconds(now) - _epoch_seconds(self.reference)
        return self.total_weight * math.exp2(-age / self.half_life_seconds)

    def _reference_for(self, at: datetime) -> datetime:
        """The whole number of half-lives since the epoch at or before `at`."""
        seconds = _epoch_seconds(at)
        start = math.floor(seconds / self.half_life_seconds) * self.half_life_seconds
        return datetime.fromtimestamp(start, UTC)

    def shifted(self, reference: datetime) -> DecayingHistogram:
        """The same histogram with its reference moved to `reference` (a whole number of
        half-lives from the current one): every weight times 2^-(half-lives moved)."""
        if self.reference is None or reference == self.reference:
            return replace(self, reference=reference)
        moved = _epoch_seconds(reference) - _epoch_seconds(self.reference)
        factor = math.exp2(-moved / self.half_life_seconds)
        weights = {b: w * factor for b, w in self.weights.items() if w * factor >= EPSILON}
        return replace(self, weights=weights, reference=reference)

    def add(self, ratio: float, at: datetime, weight: float = 1.0) -> DecayingHistogram:
        """This histogram with one sample of `ratio` taken at `at`."""
        if not ratio > 0 or math.isinf(ratio):
            raise ValueError(f"a ratio must be a positive number, not {ratio!r}")
        if weight <= 0:
            raise ValueError("a sample's weight must be greater than 0")
        base = self
        if self.reference is None:
            base = replace(self, reference=self._reference_for(at))
        elif _epoch_seconds(at) - _epoch_seconds(self.reference) >= self.half_life_seconds:
            base = self.shifted(self._reference_for(at))
        assert base.reference is not None
        age = _epoch_seconds(at) - _epoch_seconds(base.reference)
        decayed = weight * math.exp2(age / self.half_life_seconds)
        weights = dict(base.weights)
        bucket = self.scale.bucket(ratio)
        weights[bucket] = weights.get(bucket, 0.0) + decayed
        if weights[bucket] < EPSILON:  # a sample older than everything kept: forgotten
            del weights[bucket]
        return replace(base, weights=weights, samples=base.samples + 1)

    def remove(self, ratio: float, at: datetime) -> DecayingHistogram:
        """This histogram without a sample of `ratio` that `add` took at `at`: the same
        decayed weight taken off its bucket (a job's later sample replaces its earlier one).
        A sample whose weight has already decayed away takes nothing."""
        if self.reference is None or not ratio > 0 or math.isinf(ratio):
            return self
        age = _epoch_seconds(at) - _epoch_seconds(self.reference)
        decayed = math.exp2(age / self.half_life_seconds)
        bucket = self.scale.bucket(ratio)
        weights = dict(self.weights)
        left = weights.get(bucket, 0.0) - decayed
        if left < EPSILON:
            weights.pop(bucket, None)
        else:
            weights[bucket] = left
        return replace(self, weights=weights, samples=max(0, self.samples - 1))

    def percentile(self, fraction: float) -> float | None:
        """The ratio below which `fraction` (0 to 1) of the weight lies: the upper end of the
        first bucket whose cumulative weight reaches it. None when empty."""
        if not 0 <= fraction <= 1:
            raise ValueError("a percentile must be between 0 and 1")
        total = self.total_weight
        if not self.weights or total <= 0:
            return None
        threshold = fraction * total
        passed = 0.0
        buckets = sorted(self.weights)
        for bucket in buckets:
            passed += self.weights[bucket]
            if passed >= threshold:
                return self.scale.upper(bucket)
        return self.scale.upper(buckets[-1])  # rounding left the last sliver uncounted

    def merge(self, other: DecayingHistogram) -> DecayingHistogram:
        """Both histograms' samples in one, aligned to the later reference."""
        if other.half_life_seconds != self.half_life_seconds or other.scale != self.scale:
            raise ValueError("only histograms of the same half-life and scale merge")
        if other.reference is None:
            return replace(self, samples=self.samples + other.samples)
        if self.reference is None:
            return replace(other, samples=self.samples + other.samples)
        later = max(self.reference, other.reference)
        mine, theirs = self.shifted(later), other.shifted(later)
        weights = dict(mine.weights)
        for bucket, weight in theirs.weights.items():
            weights[bucket] = weights.get(bucket, 0.0) + weight
        return replace(mine, weights=weights, samples=self.samples + other.samples)

    def to_dict(self) -> dict[str, Any]:
        """The status form: camelCase keys, bucket indices as strings (JSON object keys),
        `totalWeight` for people reading it (recomputed on load)."""
        return {
            "halfLifeSeconds": self.half_life_seconds,
            "scale": self.scale.to_dict(),
            "referenceTime": None if self.reference is None else format_time(self.reference),
            "samples": self.samples,
            "totalWeight": self.total_weight,
            "bucketWeights": {str(b): w for b, w in sorted(self.weights.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DecayingHistogram:
        """The histogram `to_dict` wrote; ValueError naming the field that is wrong."""
        scale_data = data.get("scale") or {}
        try:
            scale = RatioScale(
                float(scale_data.get("lowest", DEFAULT_LOWEST)),
                float(scale_data.get("highest", DEFAULT_HIGHEST)),
                float(scale_data.get("growth", DEFAULT_GROWTH)),
            )
            weights = {int(b): float(w) for b, w in (data.get("bucketWeights") or {}).items()}
        except (TypeError, ValueError) as error:
            raise ValueError(f"bucketWeights or scale: {error}") from None
        if any(not 0 <= b < scale.buckets or w < 0 for b, w in weights.items()):
            raise ValueError(f"bucketWeights: indices must be 0 to {scale.buckets - 1}")
        reference = data.get("referenceTime")
        samples = data.get("samples", 0)
        if not isinstance(samples, int) or samples < 0:
            raise ValueError("samples: must be a non-negative integer")
        return cls(
            half_life_seconds=int(data.get("halfLifeSeconds", DEFAULT_HALF_LIFE_SECONDS)),
            scale=scale,
            weights=weights,
            reference=None if reference is None else parse_time(str(reference)),
            samples=samples,
        )
