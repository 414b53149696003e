"""Webhook latency as the API server measures it, side by side with a no-op webhook's.

The API server times each webhook call (the HTTPS round trip, from its side) in the
histogram `apiserver_admission_webhook_admission_duration_seconds`, labelled `name` (the
webhook's), `type` (`admit` for a mutating one, `validating`), `operation` and `rejected`.
Its buckets, in kube-apiserver 1.36 (k8s.io/apiserver v0.36.3,
pkg/admission/metrics/metrics.go), are `BUCKETS_S`: 5, 25, 100, 500 ms, 1, 2.5, 10, 25 s.

A quantile is read as Prometheus's `histogram_quantile` reads it: the bucket holding the
rank q x count, and linear interpolation within it, from 0 in the first bucket; a rank in the
+Inf bucket gives the highest finite bound. The interpolation assumes calls spread evenly
within the bucket, so two p99s in the same bucket (both between 5 and 25 ms, say) differ by
how many calls passed the bucket's lower bound, not by how slow they were: the ratio of two
such p99s says little. The histogram's sum is exact, so the mean (sum / count) is reported
beside it, with the share of calls within the first bucket (5 ms).

Pure: Prometheus text in, figures and a table out (no I/O).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

METRIC = "apiserver_admission_webhook_admission_duration_seconds"
#: The metric's bucket bounds in kube-apiserver 1.36, seconds (+Inf beside them).
BUCKETS_S = (0.005, 0.025, 0.1, 0.5, 1.0, 2.5, 10.0, 25.0)
#: The design's target: the webhook's p99 at most this many times the no-op's.
TARGET_RATIO = 1.2
#: The `type` label per kind of webhook.
TYPES = {"mutating": "admit", "validating": "validating"}

_LINE = re.compile(r"^(?P<metric>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass
class Histogram:
    """One histogram's cumulative bucket counts by upper bound (+Inf included), its sum and
    its count."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0

    def minus(self, before: Histogram | None) -> Histogram:
        """The observations made since `before` (a reading of the same counters)."""
        if before is None:
            return Histogram(dict(self.buckets), self.sum, self.count)
        return Histogram(
            {le: c - before.buckets.get(le, 0.0) for le, c in self.buckets.items()},
            self.sum - before.sum,
            self.count - before.count,
        )

    def quantile(self, q: float) -> float:
        """The q-quantile, seconds (NaN with no observations): see the module's docstring."""
        return quantile(self.buckets, q)

    @property
    def mean(self) -> float:
        """Exact: the observations' sum over their count (NaN with none)."""
        return self.sum / self.count if self.count else math.nan

    def within(self, bound: float) -> float:
        """The share of observations of at most `bound` seconds (a bucket's bound)."""
        return self.buckets.get(bound, 0.0) / self.count if self.count else math.nan

    def bucket_of(self, seconds: float) -> float:
        """The upper bound of the bucket `seconds` falls in (+Inf past the last)."""
        return next((b for b in sorted(self.buckets) if seconds <= b), math.inf)


def histograms(
    text: str, metric: str, by: tuple[str, ...] = ("name",)
) -> dict[tuple[str, ...], Histogram]:
    """Every histogram `metric` in Prometheus text `text`, keyed by the values of the labels
    `by` and summed over the others (operations, rejected or not)."""
    out: dict[tuple[str, ...], Histogram] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or not m["metric"].startswith(metric):
            continue
        part = m["metric"][len(metric) :]
        if part not in ("_bucket", "_sum", "_count"):
            continue
        labels = dict(_LABEL.findall(m["labels"] or ""))
        if any(label not in labels for label in by):
            continue
        found = out.setdefault(tuple(labels[label] for label in by), Histogram())
        value = float(m["value"])
        if part == "_bucket":
            le = math.inf if labels["le"] == "+Inf" else float(labels["le"])
            found.buckets[le] = found.buckets.get(le, 0.0) + value
        elif part == "_sum":
            found.sum += value
        else:
            found.count += value
    return out


def quantile(buckets: Mapping[float, float], q: float) -> float:
    """The q-quantile of cumulative `buckets` (upper bound -> count, +Inf last), as
    Prometheus's `histogram_quantile`: linear within the bucket holding rank q x count, from 0
    in the first; the highest finite bound for a rank in +Inf. NaN with no observations."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return math.nan
    rank, prev_bound, prev_count = q * total, 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == math.inf:
                return prev_bound
            width = count - prev_count
            return prev_bound + (bound - prev_bound) * ((rank - prev_count) / width if width else 1)
        prev_bound, prev_count = bound, count
    return prev_bound


@dataclass(frozen=True)
class Side:
    """One kind of webhook (mutating or validating), vramgate's against the no-op's."""

    kind: str
    ours: Histogram
    noop: Histogram

    @property
    def p99_ratio(self) -> float:
        return _ratio(self.ours.quantile(0.99), self.noop.quantile(0.99))

    @property
    def mean_ratio(self) -> float:
        return _ratio(self.ours.mean, self.noop.mean)

    @property
    def same_bucket(self) -> bool:
        """Both p99s in one bucket: their ratio is the interpolation's, not the latency's."""
        ours, noop = self.ours.quantile(0.99), self.noop.quantile(0.99)
        if math.isnan(ours) or math.isnan(noop):
            return False
        return self.ours.bucket_of(ours) == self.noop.bucket_of(noop)

    @property
    def met(self) -> bool:
        return self.p99_ratio <= TARGET_RATIO


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def sides(deltas: Mapping[tuple[str, ...], Histogram], ours: str, noop: str) -> list[Side]:
    """The mutating and validating sides, from histograms keyed by (webhook name, type): the
    webhooks of the configuration `ours` against those of `noop` (a name ends in `.<config>`)."""

    def of(config: str, kind: str) -> Histogram:
        found = [h for (name, t), h in deltas.items()
                 if t == TYPES[kind] and name.endswith(f".{config}")]  # fmt: skip
        if len(found) != 1:
            raise ValueError(f"{len(found)} {kind} webhooks of {config} in the histogram")
        return found[0]

    return [Side(kind, of(ours, kind), of(noop, kind)) for kind in TYPES]


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{1000 * seconds:.2f}"


def _x(ratio: float) -> str:
    return "-" if math.isnan(ratio) else f"{ratio:.2f} x"


def _share(share: float) -> str:
    return "-" if math.isnan(share) else f"{100 * share:.1f} %"


def table(found: Iterable[Side]) -> str:
    """The figures side by side, with the target and how p99 was read."""
    first = f"{1000 * BUCKETS_S[0]:g} ms"
    rows = [f"{'webhook':<22}{'calls':>7}{'p99 ms':>9}{'mean ms':>9}{'<= ' + first:>10}"]
    notes: list[str] = []
    ratios = [f"{'ratio to the no-op':<22}{'':>7}{'p99':>9}{'mean':>9}{'target':>10}"]
    for side in found:
        for who, h in (("vramgate", side.ours), ("no-op", side.noop)):
            rows.append(f"{who + ' ' + side.kind:<22}{int(h.count):>7}"
                        f"{_ms(h.quantile(0.99)):>9}{_ms(h.mean):>9}"
                        f"{_share(h.within(BUCKETS_S[0])):>10}")  # fmt: skip
        ratios.append(f"{side.kind:<22}{'':>7}{_x(side.p99_ratio):>9}{_x(side.mean_ratio):>9}"
                      f"{'<= ' + str(TARGET_RATIO):>10}"
                      f"  {'met' if side.met else 'not met'}"
                      f"{' (same bucket)' if side.same_bucket else ''}")  # fmt: skip
        if side.same_bucket:
            notes.append(f"{side.kind}: both p99s in the bucket up to "
                         f"{1000 * side.ours.bucket_of(side.ours.quantile(0.99)):g} ms, so "
                         f"their ratio is the interpolation's; the means are exact")  # fmt: skip
    bounds = ", ".join(f"{1000 * b:g}" for b in BUCKETS_S)
    notes.append(f"p99 interpolated linearly within the API server's buckets ({bounds} ms; "
                 f"from 0 in the first), as Prometheus's histogram_quantile")  # fmt: skip
    return "\n".join([*rows, "", *ratios, "", *notes])
