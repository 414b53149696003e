"""Keys and their fallback, samples, and the correction a new job gets."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from controller.base.units import GIB, MIB
from controller.learning import (
    ANY,
    JobKey,
    KeyRecord,
    LearningSettings,
    Policy,
    Records,
    Source,
    correct,
    oom_need_bytes,
    pin,
    record_oom,
    record_steady,
)

T0 = datetime(2026, 12, 1, tzinfo=UTC)
SETTINGS = LearningSettings()
ESTIMATE = 20 * GIB
KEY = JobKey.of(
    family="llama",
    method="LoRA",
    parallelism="FSDP",
    profile="calibrated",
    framework="trl",
    image="sha256:aa",
)


def key_with(**changes: str) -> JobKey:
    fields = {f: getattr(KEY, f) for f in ("family", "method", "parallelism", "profile")}
    fields |= {"framework": KEY.framework, "image": KEY.image} | changes
    return JobKey.of(**fields)


def steady(records: Records, key: JobKey, ratios: list[float]) -> dict[str, KeyRecord]:
    out = dict(records)
    for i, ratio in enumerate(ratios):
        at = T0 + timedelta(hours=i)
        out |= record_steady(out, key, round(ESTIMATE * ratio), ESTIMATE, at, SETTINGS)
    return out


def test_ladder_drops_image_framework_parallelism_family_in_order() -> None:
    names = [k.name for k in KEY.ladder()]
    assert names == [
        "family=llama,method=LoRA,parallelism=FSDP,profile=calibrated,framework=trl,image=sha256:aa",
        "family=llama,method=LoRA,parallelism=FSDP,profile=calibrated,framework=trl,image=*",
        "family=llama,method=LoRA,parallelism=FSDP,profile=calibrated,framework=*,image=*",
        "family=llama,method=LoRA,parallelism=*,profile=calibrated,framework=*,image=*",
        "family=*,method=LoRA,parallelism=*,profile=calibrated,framework=*,image=*",
    ]
    assert JobKey.parse(names[0]) == KEY
    # An unknown image digest: the job starts at the image-less key.
    assert key_with(image="").ladder() == KEY.ladder()[1:]
    assert KEY.ladder()[-1].method == "LoRA" and KEY.ladder()[-1].family == ANY


def test_fallback_chooses_the_finest_key_with_k_samples() -> None:
    # Four jobs of this image at 0.70 and six of another image at 0.90: the image key has too
    # few, the image-less key has ten, whose p95 is 0.90's bucket.
    records = steady({}, KEY, [0.70] * 4)
    records = steady(records, key_with(image="sha256:bb"), [0.90] * 6)
    result = correct(ESTIMATE, KEY, records, SETTINGS)
    assert result.source is Source.LEARNED
    assert result.key == KEY.ladder()[1].name
    assert result.samples == 10
    assert 0.90 * 1.05 <= result.factor_percent / 100 <= 0.90 * 1.05 * 1.06
    # The fifth job of this image makes its own key the answer.
    records = steady(records, KEY, [0.70])
    result = correct(ESTIMATE, KEY, records, SETTINGS)
    assert result.key == KEY.name and result.samples == 5
    assert result.factor_percent == pytest.approx(70 * 1.05, abs=5)
    assert result.per_gpu_bytes == -(-ESTIMATE * result.factor_percent // 100)


def test_too_few_samples_keep_the_estimate() -> None:
    result = correct(ESTIMATE, KEY, steady({}, KEY, [0.7] * 4), SETTINGS)
    assert (result.source, result.per_gpu_bytes, result.factor_percent) == (
        Source.TOO_FEW,
        ESTIMATE,
        100,
    )
    assert result.message == "calibrated 20.00 GiB as estimated: 4 jobs like it, 5 needed to learn"


def test_message_says_figure_factor_samples_and_percentile() -> None:
    records = steady({}, KEY, [0.80] * 12)
    result = correct(int(21.30 * GIB), KEY, records, SETTINGS)
    factor = result.factor_percent / 100
    figure = result.per_gpu_bytes / GIB
    assert result.message == (
        f"calibrated 21.30 GiB x {factor:.2f} learned from 12 jobs like it (p95) "
        f"= {figure:.2f} GiB per GPU"
    )
    assert f"{21.30 * factor:.2f}" == f"{figure:.2f}"


def test_raise_only_never_lowers() -> None:
    records = steady({}, KEY, [0.70] * 8)
    assert correct(ESTIMATE, KEY, records, SETTINGS).per_gpu_bytes < ESTIMATE
    raise_only = correct(ESTIMATE, KEY, records, SETTINGS, policy=Policy.RAISE_ONLY)
    assert (raise_only.factor_percent, raise_only.per_gpu_bytes) == (100, ESTIMATE)
    assert "raiseOnly" in raise_only.message
    higher = steady({}, KEY, [1.20] * 8)
    assert correct(ESTIMATE, KEY, higher, SETTINGS, policy=Policy.RAISE_ONLY).factor_percent > 120


def test_off_keeps_the_estimate() -> None:
    records = steady({}, KEY, [0.70] * 8)
    off = correct(ESTIMATE, KEY, records, LearningSettings(policy=Policy.OFF))
    assert (off.source, off.per_gpu_bytes) == (Source.OFF, ESTIMATE)


def test_factor_is_clamped() -> None:
    low = correct(ESTIMATE, KEY, steady({}, KEY, [0.30] * 8), SETTINGS)
    high = correct(ESTIMATE, KEY, steady({}, KEY, [2.50] * 8), SETTINGS)
    assert (low.factor_percent, high.factor_percent) == (60, 150)
    assert "clamped from" in low.message
    narrow = LearningSettings(min_factor_percent=80, max_factor_percent=110)
    assert correct(ESTIMATE, KEY, steady({}, KEY, [0.30] * 8), narrow).factor_percent == 80


def test_oom_raises_the_rerun_at_once_until_a_success() -> None:
    records = steady({}, KEY, [0.70] * 8)
    before = correct(ESTIMATE, KEY, records, SETTINGS)
    assert before.factor_percent < 100
    # Died with its reservation (0.75 x 20 GiB) and 2 GiB free beside it.
    reserved = before.per_gpu_bytes
    records |= record_oom(records, KEY, reserved, reserved + 2 * GIB, 0, ESTIMATE, T0, SETTINGS)
    need = oom_need_bytes(reserved, reserved + 2 * GIB, 0, SETTINGS)
    assert need == -(-(reserved + 2 * GIB) * 120 // 100)
    rerun = correct(ESTIMATE, KEY, records, SETTINGS)
    assert rerun.per_gpu_bytes >= need > before.per_gpu_bytes
    # A job of another image is not raised by it...
    other = key_with(image="sha256:cc")
    assert correct(ESTIMATE, other, records, SETTINGS).source is not Source.OUT_OF_MEMORY
    # ... and the raise holds even with no samples at all, and past the clamp.
    alone = record_oom({}, KEY, 30 * GIB, 30 * GIB, 0, ESTIMATE, T0, SETTINGS)
    raised = correct(ESTIMATE, KEY, alone, SETTINGS)
    assert (raised.source, raised.factor_percent) == (Source.OUT_OF_MEMORY, 180)
    assert "after a job like it ran out of GPU memory" in raised.message
    # The re-run succeeded: the raise goes, the histogram keeps the OOM's sample.
    records |= record_steady(records, KEY, rerun.per_gpu_bytes, ESTIMATE, T0, SETTINGS)
    after = correct(ESTIMATE, KEY, records, SETTINGS)
    assert after.source is Source.LEARNED
    assert records[KEY.name].oom_factor_percent is None
    assert records[KEY.name].histogram.samples == 10


def test_oom_bump_is_at_least_100_mib() -> None:
    assert oom_need_bytes(100 * MIB, 0, 0, SETTINGS) == 200 * MIB
    assert oom_need_bytes(10 * GIB, 12 * GIB, 11 * GIB, SETTINGS) == -(-12 * GIB * 12 // 10)


def test_pinned_correction_wins_over_what_was_learned() -> None:
    records = steady({}, KEY, [0.70] * 8)
    coarse = KEY.ladder()[2]
    records[coarse.name] = pin(records, coarse, 90, SETTINGS)
    result = correct(ESTIMATE, KEY, records, SETTINGS)
    assert (result.source, result.factor_percent, result.key) == (Source.PINNED, 90, coarse.name)
    assert "pinned by hand for llama LoRA FSDP calibrated" in result.message
    # A pin on the finer key wins over the coarser one.
    records[KEY.name] = pin(records, KEY, 130, SETTINGS)
    assert correct(ESTIMATE, KEY, records, SETTINGS).factor_percent == 130


def test_an_oom_under_a_pin_raises_the_rerun_above_it() -> None:
    records = steady({}, KEY, [0.70] * 8)
    coarse = KEY.ladder()[2]
    records[coarse.name] = pin(records, coarse, 90, SETTINGS)
    records |= record_oom(records, KEY, ESTIMATE, ESTIMATE, 0, ESTIMATE, T0, SETTINGS)
    result = correct(ESTIMATE, KEY, records, SETTINGS)
    assert (result.source, result.factor_percent) == (Source.OUT_OF_MEMORY, 120)
    assert "raised from 0.90 after an OOM" in result.message


def test_an_oom_files_its_bound_under_its_own_key_only() -> None:
    records = steady({}, KEY, [1.0] * 8)
    other = key_with(image="sha256:bb")  # the same family and method, another image
    before = correct(ESTIMATE, other, records, SETTINGS).factor_percent
    changed = record_oom(records, KEY, ESTIMATE, 4 * ESTIMATE, 0, ESTIMATE, T0, SETTINGS)
    assert set(changed) == {KEY.name}
    records |= changed
    assert correct(ESTIMATE, other, records, SETTINGS).factor_percent == before


def test_samples_that_decayed_away_do_not_count_towards_k() -> None:
    old = steady({}, KEY, [1.0] * 4)  # at T0
    records = {
        name: replace(r, histogram=r.histogram.add(0.5, T0 + timedelta(days=150)))
        for name, r in old.items()
    }
    now = T0 + timedelta(days=150)
    assert correct(ESTIMATE, KEY, records, SETTINGS).source is Source.LEARNED  # count alone
    result = correct(ESTIMATE, KEY, records, SETTINGS, now=now)
    assert result.source is Source.TOO_FEW and result.factor_percent == 100


def test_records_round_trip_as_json() -> None:
    records = steady({}, KEY, [0.7, 0.8, 0.9])
    records |= record_oom(records, KEY, ESTIMATE, ESTIMATE, 0, ESTIMATE, T0, SETTINGS)
    records[KEY.name] = pin(records, KEY, 125, SETTINGS)
    for record in records.values():
        assert KeyRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    result = correct(ESTIMATE, KEY, records, SETTINGS)
    assert json.loads(json.dumps(result.to_dict()))["factorPercent"] == 125


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"learning\.percentile"):
        LearningSettings(percentile=0)
    with pytest.raises(ValueError, match=r"learning\.maxFactorPercent"):
        LearningSettings(max_factor_percent=90)


def test_a_key_whose_samples_weigh_nothing_gives_way_to_a_coarser_one() -> None:
    records = steady({}, key_with(image="sha256:bb"), [0.80] * 6)
    stored = records[KEY.ladder()[1].name].to_dict()
    stored["histogram"]["bucketWeights"] = {}  # six samples, all decayed away
    records[KEY.ladder()[1].name] = KeyRecord.from_dict(stored)
    result = correct(ESTIMATE, KEY, records, SETTINGS)
    assert result.source is Source.LEARNED
    assert result.key == KEY.ladder()[2].name


def test_an_oom_filed_before_keys_named_configurations_still_raises_its_rerun() -> None:
    """OOMs filed under the key without a configuration (before keys named one) raise a job
    of that key whatever its configuration, until a success there clears it; a
    configuration's own raise is its own."""
    legacy = record_oom({}, KEY, 20 * GIB, 20 * GIB, 0, ESTIMATE, T0, SETTINGS)
    configured = replace(KEY, config="3f2a9c0d1e2b")
    rerun = correct(ESTIMATE, configured, legacy, SETTINGS)
    assert (rerun.source, rerun.factor_percent) == (Source.OUT_OF_MEMORY, 120)
    assert rerun.key == KEY.name, "names the key a reset would clear it on"
    # A success at 1.1 x: without the raise the job would get its estimate (too few samples),
    # which it has just shown too small: the raise stays, on its configuration alone (the
    # key without one is every configuration's).
    kept = legacy | record_steady(legacy, configured, 22 * GIB, ESTIMATE, T0, SETTINGS)
    assert kept[KEY.name].oom_factor_percent is None
    assert kept[configured.name].oom_factor_percent == 120
    # At 0.9 x the estimate covers it: the raise goes.
    cleared = legacy | record_steady(legacy, configured, 18 * GIB, ESTIMATE, T0, SETTINGS)
    assert cleared[KEY.name].oom_factor_percent is None
    assert correct(ESTIMATE, configured, cleared, SETTINGS).source is Source.TOO_FEW
    # A configuration's OOM is filed under it alone: another configuration is not raised.
    own = record_oom({}, configured, 20 * GIB, 20 * GIB, 0, ESTIMATE, T0, SETTINGS)
    assert set(own) == {configured.name}
    other = replace(KEY, config="0000aaaa1111")
    assert correct(ESTIMATE, other, own, SETTINGS).source is Source.TOO_FEW


def test_a_success_that_needed_more_than_the_clamp_keeps_a_raise() -> None:
    """A kind that needs 1.6 x its estimate: the clamp (1.5) alone would run it out of memory
    every other time, raised after each OOM and lowered after each success. A success past
    the clamp keeps the raise; one within it clears the raise."""
    records = steady({}, KEY, [1.6] * 8)
    clamped = correct(ESTIMATE, KEY, records, SETTINGS)
    assert (clamped.source, clamped.factor_percent) == (Source.LEARNED, 150)
    records |= record_oom(records, KEY, clamped.per_gpu_bytes, clamped.per_gpu_bytes, 0,
                          ESTIMATE, T0, SETTINGS)  # fmt: skip
    raised = correct(ESTIMATE, KEY, records, SETTINGS)
    assert raised.source is Source.OUT_OF_MEMORY and raised.factor_percent == 180
    records |= record_steady(records, KEY, round(ESTIMATE * 1.6), ESTIMATE, T0, SETTINGS)
    assert correct(ESTIMATE, KEY, records, SETTINGS).factor_percent == 180, "kept"
    records |= record_steady(records, KEY, round(ESTIMATE * 1.2), ESTIMATE, T0, SETTINGS)
    assert records[KEY.name].oom_factor_percent is None, "within the clamp: cleared"


def test_a_success_above_its_kinds_p95_keeps_a_raise_until_its_own_key_covers_it() -> None:
    """A configuration that needs 1.3 x, in a kind whose jobs use 1.0 x: below k samples of
    its own it falls back to the kind's p95 (about 1.05), which a success at 1.3 x shows too small;
    the raise stays until its own key answers and covers it."""
    kind = steady({}, key_with(image="sha256:bb"), [1.0] * 8)  # the kind: image-less key
    configured = replace(KEY, config="3f2a9c0d1e2b")
    first = correct(ESTIMATE, configured, kind, SETTINGS)
    assert first.source is Source.LEARNED and first.factor_percent < 130
    records = kind | record_oom(kind, configured, first.per_gpu_bytes, first.per_gpu_bytes, 0,
                                ESTIMATE, T0, SETTINGS)  # fmt: skip
    for i in range(SETTINGS.min_samples):
        at = T0 + timedelta(hours=i + 1)
        records |= record_steady(records, configured, round(ESTIMATE * 1.3), ESTIMATE, at,
                                 SETTINGS)  # fmt: skip
        found = correct(ESTIMATE, configured, records, SETTINGS)
        assert found.factor_percent >= 130, (i, found)
    assert records[configured.name].oom_factor_percent is None, "its own key covers it now"
    assert correct(ESTIMATE, configured, records, SETTINGS).source is Source.LEARNED


def test_a_pin_that_covers_a_success_clears_the_raise_under_it() -> None:
    records = pin({}, KEY, 170, SETTINGS)
    records = {KEY.name: records}
    records |= record_oom(records, KEY, 40 * GIB, 40 * GIB, 0, ESTIMATE, T0, SETTINGS)
    assert correct(ESTIMATE, KEY, records, SETTINGS).source is Source.OUT_OF_MEMORY
    records |= record_steady(records, KEY, round(ESTIMATE * 1.6), ESTIMATE, T0, SETTINGS)
    found = correct(ESTIMATE, KEY, records, SETTINGS)
    assert (found.source, found.factor_percent) == (Source.PINNED, 170)


def test_whether_a_success_is_covered_is_read_at_its_time_with_old_samples_decayed() -> None:
    """Its own key's samples are a year old (they weigh nothing now): a job of it gets the
    kind's p95, which a success at 1.3 x exceeds, so the raise stays."""
    kind = steady({}, key_with(image="sha256:bb"), [1.0] * 8)
    configured = replace(KEY, config="3f2a9c0d1e2b")
    year_ago = T0 - timedelta(days=365)
    records = dict(kind)
    for i in range(SETTINGS.min_samples):
        at = year_ago + timedelta(hours=i)
        records |= record_steady(records, configured, round(ESTIMATE * 1.3), ESTIMATE, at,
                                 SETTINGS)  # fmt: skip
    records |= record_oom(records, configured, ESTIMATE, ESTIMATE, 0, ESTIMATE, T0, SETTINGS)
    now = T0 + timedelta(hours=10)
    records |= record_steady(records, configured, round(ESTIMATE * 1.3), ESTIMATE, now,
                             SETTINGS)  # fmt: skip
    assert records[configured.name].oom_factor_percent is not None
    assert correct(ESTIMATE, configured, records, SETTINGS, now=now).factor_percent >= 130
