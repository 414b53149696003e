"""A family read generically is charged the allocator share of real-size models; a hand-read
family keeps the small models' share its pinned figures were fitted with.

The same Llama shape is priced twice, once as itself and once under a model type no hand
reading reads (the generic reading prices a dense model with the Llama fit, so every
component but the reserve is the same): the reserve must be each group's share of what the
GPU holds beyond its weights, read from the data file here and written out again.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Any

import pytest

from controller.calibration import calibrate_allocator
from controller.estimator import Checkpointing, Method, TrainingSettings, calibrated, load_shape
from controller.estimator.model.families import FAMILIES
from controller.estimator.result import Estimate
from controller.estimator.settings import Parallelism

LLAMA = load_shape("llama-3.1-8b")
GENERIC = replace(LLAMA, model_type="phi")  # a type no hand reading reads
SETTINGS = {
    "full/on": TrainingSettings(method=Method.FULL, rank=None),
    "lora/on": TrainingSettings(method=Method.LORA, rank=16),
    "qlora/off": TrainingSettings(
        method=Method.QLORA, rank=16, gradient_checkpointing=Checkpointing.OFF
    ),
}


def _share(key: str, real_size: bool) -> Fraction:
    section = calibrated.calibration()["allocator"]
    if real_size:
        section = section["real_size"]
    return Fraction(str(section["groups"][key]["share"]))


def _backward_share(key: str) -> Fraction:
    section = calibrated.calibration()["allocator"]["real_size"]["backward"]
    return Fraction(str(section[key]["share"]))


def _beyond_weights(est: Estimate) -> int:
    return est.sharded_bytes + est.replicated_bytes - est.fixed_bytes - est.resident_bytes


def test_the_relabelled_shape_is_read_generically() -> None:
    assert "phi" not in FAMILIES and LLAMA.model_type in FAMILIES


@pytest.mark.parametrize("key", sorted(SETTINGS))
def test_a_hand_read_family_keeps_the_small_models_share(key: str) -> None:
    est = calibrated.estimate(LLAMA, SETTINGS[key])
    share = _share(key, False)
    slack = _beyond_weights(est) * share.numerator // share.denominator
    assert est.components["allocator_slack"] == slack
    assert Fraction(*est.reserve_share) == share


@pytest.mark.parametrize("method", [Method.LORA, Method.QLORA])
def test_a_generic_family_s_adapters_are_charged_the_real_size_share(method: Method) -> None:
    settings = TrainingSettings(method=method, rank=16)
    key = f"{method.value}/on"
    hand = calibrated.estimate(LLAMA, settings)
    generic = calibrated.estimate(GENERIC, settings)
    small, real = _share(key, False), _share(key, True)
    assert small != real  # the data file tells them apart, so the checks below can fail
    slack = _beyond_weights(generic) * real.numerator // real.denominator
    assert generic.components["allocator_slack"] == slack
    others = {k: v for k, v in generic.components.items() if k != "allocator_slack"}
    assert others == {k: v for k, v in hand.components.items() if k != "allocator_slack"}


@pytest.mark.parametrize("method", list(Method))
def test_without_checkpointing_a_generic_family_keeps_the_small_models_share(
    method: Method,
) -> None:
    settings = TrainingSettings(
        method=method,
        rank=None if method is Method.FULL else 16,
        gradient_checkpointing=Checkpointing.OFF,
    )
    generic = calibrated.estimate(GENERIC, settings)
    small = _share(f"{method.value}/off", False)
    slack = _beyond_weights(generic) * small.numerator // small.denominator
    assert generic.components["allocator_slack"] == slack


@pytest.mark.parametrize("batch", [1, 4])
def test_a_generic_full_fine_tuning_is_charged_a_share_of_its_backward(batch: int) -> None:
    settings = TrainingSettings(method=Method.FULL, rank=None, batch=batch)
    generic = calibrated.estimate(GENERIC, settings)
    hand = calibrated.estimate(LLAMA, settings)
    # what the calibration measured the share against: the hand-read model priced as the
    # generic reading prices it
    transient = calibrated.backward_transient(LLAMA, settings)
    assert transient == calibrated.backward_transient(GENERIC, settings)
    assert 0 < transient < _beyond_weights(generic)  # the step holds more
    share = _backward_share("full/on")
    slack = transient * share.numerator // share.denominator
    assert generic.components["allocator_slack"] == slack
    assert generic.total_bytes - slack == hand.total_bytes - hand.components["allocator_slack"]
    # a device map's GPUs carry the same reserve in proportion to what each holds
    pairs = ((generic.sharded_bytes, generic.replicated_bytes), *generic.moments)
    held = max(s // 2 + r for s, r in pairs)
    tensors = held - generic.fixed_bytes - generic.resident_bytes // 2
    expected = held + tensors * slack // _beyond_weights(generic)
    assert generic.per_gpu_bytes(2, Parallelism.DEVICE_MAP) == expected


def test_the_backward_grows_with_the_batch_as_the_step_does_not() -> None:
    one, four = (
        calibrated.estimate(GENERIC, TrainingSettings(method=Method.FULL, rank=None, batch=b))
        for b in (1, 4)
    )
    assert four.components["allocator_slack"] > 3 * one.components["allocator_slack"]
    hand = [
        calibrated.estimate(LLAMA, TrainingSettings(method=Method.FULL, rank=None, batch=b))
        for b in (1, 4)
    ]
    assert hand[1].components["allocator_slack"] < 2 * hand[0].components["allocator_slack"]


def test_a_file_without_real_size_shares_charges_the_small_models_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = dict(calibrated.calibration())
    data["allocator"] = {k: v for k, v in data["allocator"].items() if k != "real_size"}
    monkeypatch.setattr(calibrated, "calibration", lambda: data)
    calibrated.allocator_share.cache_clear()
    calibrated.backward_share.cache_clear()
    try:
        lora = calibrated.estimate(GENERIC, SETTINGS["lora/on"])
        full = calibrated.estimate(GENERIC, SETTINGS["full/on"])
    finally:
        monkeypatch.undo()
        calibrated.allocator_share.cache_clear()
        calibrated.backward_share.cache_clear()
    assert Fraction(*lora.reserve_share) == _share("lora/on", False)
    assert Fraction(*full.reserve_share) == _share("full/on", False)


def test_the_scripts_real_size_part_is_what_calibrated_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shares = {
        "": {"full/on": [0.01, 0.3, 0.02], "lora/on": [0.3, 0.4, 0.2]},
        "backward": {"full/on": [0.9, 0.5, 0.8]},
    }
    kept = {
        "groups": {"qlora/on": {"share": 0.33}, "qlora/off": {"share": 0.05}},
        "backward": {"full/off": {"share": 0.7}},
    }
    part = calibrate_allocator.real_size_section(shares, kept)
    assert part["presets"] == list(calibrate_allocator.REAL_SIZE_PRESETS)
    assert "full/on" not in part["groups"]  # full fine-tuning goes by its backward
    assert "qlora/off" not in part["groups"] and "full/off" not in part["backward"]
    data: dict[str, Any] = {
        "allocator": {"groups": {"full/on": {"share": 0.16}}, "real_size": part}
    }
    monkeypatch.setattr(calibrated, "calibration", lambda: data)
    calibrated.allocator_share.cache_clear()
    calibrated.backward_share.cache_clear()
    try:
        lora = calibrated.allocator_share(Method.LORA, "on", "", True)
        qlora = calibrated.allocator_share(Method.QLORA, "on", "", True)
        full = calibrated.allocator_share(Method.FULL, "on", "", True)
        backward = calibrated.backward_share("on"), calibrated.backward_share("off")
    finally:
        monkeypatch.undo()
        calibrated.allocator_share.cache_clear()
        calibrated.backward_share.cache_clear()
    assert Fraction(*lora) == Fraction("0.3")  # the median
    assert Fraction(*qlora) == Fraction("0.33")  # kept: not measured this time
    assert Fraction(*full) == Fraction("0.16")  # no real-size group: the small models'
    assert backward == (Fraction("0.8").as_integer_ratio(), None)


def test_the_real_size_models_are_hand_read_and_apart_from_the_small_ones() -> None:
    from controller.estimator.presets import load_preset, read_by_hand

    presets = calibrate_allocator.REAL_SIZE_PRESETS
    assert all(read_by_hand(load_preset(name)) for name in presets)
    assert not set(presets) & set(calibrate_allocator.PRESETS)


def test_the_real_size_run_traces_checkpointing_on_on_one_gpu() -> None:
    runs = calibrate_allocator.tasks(real_size=True, methods=(Method.FULL,))
    assert {(method, gc, parallelism) for method, gc, _, _, _, parallelism, _ in runs} == {
        ("full", "on", "")
    }
    assert len(runs) == len(calibrate_allocator.REAL_SIZE_PRESETS) * len(calibrate_allocator.SIZES)


def test_methods_without_real_size_are_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.argv", ["calibrate_allocator", "--methods", "full"])
    with pytest.raises(SystemExit):
        calibrate_allocator.main()
    assert "--methods: only with --real-size" in capsys.readouterr().err


def test_the_backward_is_priced_with_the_fit_a_generic_family_gets() -> None:
    """Gemma-2's own fit keeps other moments than the dense generic one (Llama's): the
    calibration must measure the share on what the generic reading multiplies it by."""
    gemma = load_shape("gemma-2-9b")
    settings = TrainingSettings(method=Method.FULL, rank=None)
    as_generic = calibrated.backward_transient(gemma, settings)
    assert as_generic == calibrated.backward_transient(replace(gemma, model_type="phi"), settings)
    own = calibrated.estimate(gemma, settings)
    moments = calibrated._moments(calibrated._fit_of(gemma, settings), Method.FULL, "on", "sdpa")
    by_own_fit = max(
        r - own.fixed_bytes for m, (_, r) in zip(moments, own.moments, strict=False) if not m[1]
    )
    assert by_own_fit != as_generic


def test_the_backward_is_for_full_fine_tuning_only() -> None:
    with pytest.raises(ValueError, match="full fine-tuning only"):
        calibrated.backward_transient(LLAMA, SETTINGS["lora/on"])


@pytest.mark.parametrize("batch", [1, 4])
def test_a_generic_moe_is_never_charged_less_than_the_small_models_share(batch: int) -> None:
    moe = replace(load_shape("qwen3-30b-a3b"), model_type="phi")
    settings = TrainingSettings(method=Method.FULL, rank=None, batch=batch)
    est = calibrated.estimate(moe, settings)
    backward, small = _backward_share("full/on"), _share("full/on", False)
    by_backward = calibrated.backward_transient(moe, settings) * backward.numerator
    by_backward //= backward.denominator
    by_peak = _beyond_weights(est) * small.numerator // small.denominator
    assert est.components["allocator_slack"] == max(by_backward, by_peak)
