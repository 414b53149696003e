"""The webhook latency figures read from the API server's histogram: per webhook name and
type, summed over the other labels, quantiles as Prometheus interpolates them, exact means,
and vramgate's against the no-op's."""

from __future__ import annotations

import math

import pytest

from benchmarks.noop_webhook import CONFIG_NAME as NOOP
from benchmarks.webhook_latency import (
    BUCKETS_S,
    METRIC,
    TARGET_RATIO,
    Histogram,
    histograms,
    quantile,
    sides,
    table,
)
from controller.webhook.registration import configurations

OURS = "vramgate-integration.vramgate.dev"


def names(config: str) -> dict[str, str]:
    """The webhook names the registrar gives a configuration, by type label."""
    made = configurations(config, "https://127.0.0.1:1")
    return {
        "admit": made["MutatingWebhookConfiguration"]["webhooks"][0]["name"],
        "validating": made["ValidatingWebhookConfiguration"]["webhooks"][0]["name"],
    }


def series(name: str, type_: str, op: str, rejected: str, cumulative: list[float], total: float,
           sum_s: float) -> list[str]:  # fmt: skip
    """One label set's lines: `cumulative` for the finite bounds (the last repeated to the
    end), `total` for +Inf and the count."""
    labels = f'name="{name}",operation="{op}",rejected="{rejected}",type="{type_}"'
    counts = cumulative + [cumulative[-1]] * (len(BUCKETS_S) - len(cumulative))
    pairs = zip(BUCKETS_S, counts, strict=True)
    lines = [f'{METRIC}_bucket{{{labels},le="{b:g}"}} {c:g}' for b, c in pairs]
    lines.append(f'{METRIC}_bucket{{{labels},le="+Inf"}} {total:g}')
    lines += [f"{METRIC}_sum{{{labels}}} {sum_s}", f"{METRIC}_count{{{labels}}} {total:g}"]
    return lines


def metrics_text() -> str:
    ours, noop = names(OURS), names(NOOP)
    return "\n".join([
        f"# HELP {METRIC} Admission webhook latency histogram in seconds.",
        f"# TYPE {METRIC} histogram",
        # vramgate's mutating webhook over two label sets: 190 / 197 / 200 calls within
        # 5 / 25 / 100 ms, 0.7 s in all.
        *series(ours["admit"], "admit", "CREATE", "false", [100, 104, 106], 106, 0.4),
        *series(ours["admit"], "admit", "CREATE", "true", [90, 93, 94], 94, 0.3),
        *series(noop["admit"], "admit", "CREATE", "false", [199, 200], 200, 0.2),
        # Both validating webhooks' p99s between 5 and 25 ms.
        *series(ours["validating"], "validating", "CREATE", "false", [50, 100], 100, 0.8),
        *series(noop["validating"], "validating", "CREATE", "false", [80, 100], 100, 0.3),
        # Other metrics of the API server, with the same labels or a prefix in common.
        'apiserver_admission_webhook_request_total{name="x",type="admit"} 7',
        *series("x", "admit", "CREATE", "false", [1], 1, 9.0)[:1],
        'apiserver_admission_step_admission_duration_seconds_bucket{le="0.005",type="admit"} 3',
    ])  # fmt: skip


def test_histograms_by_name_and_type_summed_over_other_labels() -> None:
    found = histograms(metrics_text(), METRIC, ("name", "type"))
    ours = found[(names(OURS)["admit"], "admit")]
    assert ours.buckets[0.005] == 190
    assert ours.buckets[0.025] == 197
    assert ours.buckets[0.1] == ours.buckets[25.0] == ours.buckets[math.inf] == 200
    assert ours.count == 200
    assert ours.sum == pytest.approx(0.7)
    assert ours.mean == pytest.approx(0.0035)
    assert ours.within(0.005) == pytest.approx(0.95)
    assert (names(NOOP)["validating"], "validating") in found


def test_quantile_interpolates_within_the_bucket_as_prometheus() -> None:
    found = histograms(metrics_text(), METRIC, ("name", "type"))
    ours = found[(names(OURS)["admit"], "admit")]
    # rank 198 of 200: past 197 at 25 ms, one of the 3 calls between 25 and 100 ms
    assert ours.quantile(0.99) == pytest.approx(0.025 + 0.075 * 1 / 3)
    # rank 100 in the first bucket, interpolated from 0
    assert ours.quantile(0.5) == pytest.approx(0.005 * 100 / 190)
    noop = found[(names(NOOP)["admit"], "admit")]
    assert noop.quantile(0.99) == pytest.approx(0.005 * 198 / 199)


def test_quantile_edges() -> None:
    assert math.isnan(quantile({0.005: 0, math.inf: 0}, 0.99))
    assert math.isnan(quantile({}, 0.99))
    # a rank in +Inf: the highest finite bound
    assert quantile({0.005: 0, 0.025: 0, 25.0: 0, math.inf: 10}, 0.99) == 25.0
    assert quantile({0.005: 10, 0.025: 10, math.inf: 10}, 1.0) == pytest.approx(0.005)


def test_minus_leaves_the_calls_since() -> None:
    before = Histogram({0.005: 10, 0.025: 12, math.inf: 12}, 0.05, 12)
    after = Histogram({0.005: 15, 0.025: 20, math.inf: 21}, 0.15, 21)
    delta = after.minus(before)
    assert delta.buckets == {0.005: 5, 0.025: 8, math.inf: 9}
    assert delta.count == 9
    assert delta.sum == pytest.approx(0.1)
    assert after.minus(None).buckets == after.buckets


def test_sides_and_ratios() -> None:
    found = histograms(metrics_text(), METRIC, ("name", "type"))
    mutating, validating = sides(found, OURS, NOOP)
    assert mutating.kind == "mutating"
    assert mutating.p99_ratio == pytest.approx(0.05 / (0.005 * 198 / 199))
    assert mutating.mean_ratio == pytest.approx(3.5)
    assert not mutating.same_bucket
    assert not mutating.met
    # 24.6 against 24.0 ms: met by the interpolation, though the mean is 2.67 x
    assert validating.p99_ratio == pytest.approx(0.0246 / 0.024)
    assert validating.p99_ratio <= TARGET_RATIO
    assert validating.met
    assert validating.same_bucket
    assert validating.mean_ratio == pytest.approx(8 / 3)


def test_sides_need_each_webhook_once() -> None:
    found = histograms(metrics_text(), METRIC, ("name", "type"))
    without = {k: h for k, h in found.items() if k[0] != names(NOOP)["validating"]}
    with pytest.raises(ValueError, match="0 validating webhooks of vramgate-noop"):
        sides(without, OURS, NOOP)


def test_table_says_the_ratios_the_target_and_how_p99_is_read() -> None:
    text = table(sides(histograms(metrics_text(), METRIC, ("name", "type")), OURS, NOOP))
    assert "10.05 x" in text  # mutating p99 ratio
    assert "3.50 x" in text  # mutating mean ratio
    assert "<= 1.2" in text
    assert "not met" in text
    assert "validating: both p99s in the bucket up to 25 ms" in text
    assert "5, 25, 100, 500, 1000, 2500, 10000, 25000 ms" in text
    assert "50.00" in text  # vramgate's mutating p99, ms
