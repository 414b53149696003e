"""The decaying histogram: VPA's percentile rule, half-life decay, status round trip, merge."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from controller.learning import DecayingHistogram, RatioScale

DAY = 24 * 3600
T0 = datetime(2026, 12, 1, tzinfo=UTC)
#: Buckets a person can check by hand: (0, 1), [1, 2), [2, 4), [4, 8), [8, 16), [16, ...).
DOUBLING = RatioScale(lowest=1.0, highest=16.0, growth=1.0)


def hist(**kwargs: object) -> DecayingHistogram:
    return DecayingHistogram(half_life_seconds=DAY, scale=DOUBLING, **kwargs)  # type: ignore[arg-type]


def test_buckets_are_exponential_with_an_open_last_bucket() -> None:
    assert DOUBLING.buckets == 6
    assert [DOUBLING.bucket(r) for r in (0.5, 1.0, 1.5, 3.0, 5.0, 9.0, 100.0)] == [
        0,
        1,
        1,
        2,
        3,
        4,
        5,
    ]
    assert [DOUBLING.upper(b) for b in range(6)] == [1.0, 2.0, 4.0, 8.0, 16.0, 16.0]


def test_default_scale_grows_five_percent_from_0_05_to_4() -> None:
    scale = RatioScale()
    assert scale.upper(10) / scale.upper(9) == pytest.approx(1.05)
    assert scale.start(scale.buckets - 1) >= 4.0 > scale.start(scale.buckets - 2)
    assert scale.bucket(0.86) != scale.bucket(0.86 * 1.06)


def test_percentile_is_the_upper_end_of_the_bucket_reaching_the_weight() -> None:
    # Weights (same time): 1.5 -> 1, 3.0 -> 1, 5.0 -> 2; total 4.
    h = hist().add(1.5, T0).add(3.0, T0).add(5.0, T0, weight=2.0)
    assert h.percentile(0.25) == 2.0  # 1 of 4 reached in [1, 2)
    assert h.percentile(0.5) == 4.0  # 2 of 4 reached in [2, 4)
    assert h.percentile(0.95) == 8.0  # 3.8 of 4 needs [4, 8)
    assert hist().percentile(0.95) is None


def test_a_sample_one_half_life_old_weighs_half_a_new_one() -> None:
    h = hist().add(1.5, T0).add(5.0, T0 + timedelta(seconds=DAY))
    assert h.weights[DOUBLING.bucket(1.5)] * 2 == pytest.approx(h.weights[DOUBLING.bucket(5.0)])
    assert h.weight_at(T0 + timedelta(seconds=DAY)) == pytest.approx(1.5)
    # Two at T0 and one a half-life later: the late one is a third of the weight, not half.
    h3 = hist().add(1.5, T0).add(1.5, T0).add(5.0, T0 + timedelta(seconds=DAY))
    assert h3.percentile(0.6) == 8.0
    assert hist().add(1.5, T0).add(1.5, T0).add(5.0, T0).percentile(0.6) == 2.0


def test_moving_the_reference_renormalises_without_changing_percentiles() -> None:
    h = hist().add(1.5, T0).add(3.0, T0 + timedelta(hours=1))
    later = h.add(5.0, T0 + timedelta(days=10))
    assert later.reference == datetime(2026, 12, 11, tzinfo=UTC)
    assert max(later.weights.values()) < 2.0  # stored weights stay small in a status
    assert later.samples == 3
    # 20 half-lives on, the oldest samples fall below EPSILON and are dropped.
    forgotten = h.add(5.0, T0 + timedelta(days=20))
    assert set(forgotten.weights) == {DOUBLING.bucket(5.0)}
    assert forgotten.samples == 3


def test_status_round_trip_through_json() -> None:
    h = DecayingHistogram().add(0.86, T0).add(1.12, T0 + timedelta(days=3))
    data = json.loads(json.dumps(h.to_dict()))
    assert data["referenceTime"] == "2026-12-03T00:00:00Z"
    assert DecayingHistogram.from_dict(data) == h
    with pytest.raises(ValueError, match="bucketWeights"):
        DecayingHistogram.from_dict({**data, "bucketWeights": {"500": 1.0}})


def test_merge_aligns_references_and_adds_samples() -> None:
    a = hist().add(1.5, T0)
    b = hist().add(5.0, T0 + timedelta(days=2))
    merged = a.merge(b)
    assert merged.samples == 2
    assert merged.reference == b.reference
    assert merged.weights[DOUBLING.bucket(1.5)] == pytest.approx(0.25 * merged.weights[3])
    assert merged == b.merge(a)
    with pytest.raises(ValueError, match="same half-life"):
        a.merge(DecayingHistogram(half_life_seconds=2 * DAY, scale=DOUBLING))


def test_samples_added_in_any_order_give_the_same_histogram() -> None:
    # A lost store is rebuilt from finished jobs' status, in whatever order they are listed.
    samples = [(0.8, T0), (1.5, T0 + timedelta(days=3)), (5.0, T0 + timedelta(days=1, hours=5))]
    forward = hist()
    backward = hist()
    for ratio, at in samples:
        forward = forward.add(ratio, at)
    for ratio, at in reversed(samples):
        backward = backward.add(ratio, at)
    assert forward.reference == backward.reference
    assert forward.weights.keys() == backward.weights.keys()
    for bucket, weight in forward.weights.items():
        assert backward.weights[bucket] == pytest.approx(weight)


def test_removing_a_sample_takes_off_exactly_the_weight_adding_it_put_on() -> None:
    """A job's end replaces its running sample: what remains is what the other samples made,
    at any age of the one removed; one whose weight decayed away takes nothing."""
    t0 = datetime(2025, 3, 1, 12, tzinfo=UTC)
    others = DecayingHistogram().add(0.8, t0).add(1.1, t0 + timedelta(days=3))
    with_it = others.add(0.6, t0 + timedelta(days=5)).add(0.8, t0 + timedelta(days=6))
    without = with_it.remove(0.6, t0 + timedelta(days=5)).remove(0.8, t0 + timedelta(days=6))
    assert without.samples == others.samples
    assert without.weights.keys() == others.weights.keys()
    assert all(without.weights[b] == pytest.approx(w, rel=1e-12) for b, w in others.weights.items())
    assert DecayingHistogram().remove(0.6, t0) == DecayingHistogram()
