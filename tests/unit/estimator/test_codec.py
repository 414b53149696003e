"""The Estimate codec: what a traced estimate is kept as in status, and read back exactly."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from fractions import Fraction

import pytest

from controller.estimator import Estimate, Parallelism, codec, load_shape
from controller.estimator.settings import Method, Profile, TrainingSettings
from controller.jobs.profiles import estimate

#: Every field away from its default, so a field the codec forgot cannot round-trip by luck.
FULL = Estimate(
    profile="trace",
    components={"weights": 16 * 2**30, "activations": 3_000_000_001, "cuda_context": 1 << 30},
    total_params=8_030_261_248,
    trainable_params=41_943_040,
    sharded_bytes=16 * 2**30,
    replicated_bytes=4_073_741_825,
    margin=Fraction(11433, 8042),
    head_bytes=7,
    fixed_bytes=1_570_347_417,
    moments=((1, 2), (3, 4)),
    fsdp_moments=((5, 6),),
    ddp_bytes=9,
    traced_per_gpu=(("fsdp", 8, 12_345_678_901),),
    traced_allocated=(("fsdp", 8, 10_987_654_321),),
    comm_bytes=268_435_456,
    reserve_share=(3, 100),
    fsdp_reserve_share=(5, 100),
    ddp_reserve_share=(7, 100),
    load_moment=11,
    resident_bytes=13,
    paged_bytes=17,
)


def test_every_field_is_set_away_from_its_default_here() -> None:
    defaults = Estimate("x", {}, 0, 0, 0, 0)
    for f in fields(Estimate):
        if f.name == "correction_percent":  # admission's, never encoded (next test)
            continue
        assert getattr(FULL, f.name) != getattr(defaults, f.name), f.name


def test_a_correction_is_admissions_and_never_encoded() -> None:
    corrected = replace(FULL, correction_percent=86)
    assert "correction_percent" not in codec.encode(corrected)
    assert codec.decode(codec.encode(corrected)) == FULL
    assert corrected.per_gpu_bytes(1) == -(-FULL.per_gpu_bytes(1) * 86 // 100)


def test_an_estimate_round_trips_exactly_with_its_types() -> None:
    back = codec.decode(codec.encode(FULL))
    assert back == FULL
    assert isinstance(back.margin, Fraction) and back.margin == Fraction(11433, 8042)
    assert type(back.moments) is tuple and type(back.moments[0]) is tuple
    assert back.traced_per_gpu == (("fsdp", 8, 12_345_678_901),)
    assert back.traced_allocated == (("fsdp", 8, 10_987_654_321),)
    assert list(back.components) == list(FULL.components), "the components' order is kept"
    for gpus in (1, 2, 8):
        for parallelism in Parallelism:
            assert back.per_gpu_bytes(gpus, parallelism) == FULL.per_gpu_bytes(gpus, parallelism)


def test_a_formula_estimate_round_trips_and_the_text_is_compact() -> None:
    settings = TrainingSettings(method=Method.LORA, rank=16, profile=Profile.CALIBRATED)
    est = estimate(load_shape("llama-3.1-8b"), settings)
    text = codec.encode(est)
    assert codec.decode(text) == est
    assert " " not in text and len(text) < 2048
    assert json.loads(text)["v"] == codec.VERSION


def _edited(**changes: object) -> str:
    data = json.loads(codec.encode(FULL))
    data.update(changes)
    return json.dumps(data)


@pytest.mark.parametrize(
    "payload",
    [
        None,
        42,
        "",
        "not json",
        "[]",
        '{"v": 1}',
        "[" * 100_000,  # deep nesting
        "x" * (codec.MAX_TEXT + 1),
        _edited(v=0),  # an older version
        _edited(v=2),
        _edited(v=True),
        _edited(total_params=1.5),
        _edited(total_params=True),
        _edited(total_params="8"),
        _edited(total_params=2**70),
        _edited(margin=[1, 0]),
        _edited(margin=[1]),
        _edited(margin=0.5),
        _edited(components=[["weights", 1]]),
        _edited(components={"weights": -1.0}),
        _edited(components={"": 1}),
        _edited(moments=[[1, 2, 3]]),
        _edited(moments=[[1, 2]] * 1000),
        _edited(traced_per_gpu=[["fsdp", 8]]),
        _edited(traced_per_gpu=[[8, 8, 8]]),
        _edited(reserve_share=[1, -2]),
        # Counts and bytes are never negative, and a margin of zero would reserve nothing.
        _edited(components={"weights": -1, "activations": 3_000_000_001}),
        _edited(total_params=-1),
        _edited(sharded_bytes=-(2**30)),
        _edited(moments=[[1, -2]]),
        _edited(traced_per_gpu=[["fsdp", 8, -1]]),
        _edited(reserve_share=[-3, 100]),
        _edited(margin=[0, 1]),
        _edited(margin=[-1, 2]),
        _edited(profile=""),
        _edited(unknown=1),
        json.dumps({k: v for k, v in json.loads(codec.encode(FULL)).items() if k != "margin"}),
        codec.encode(FULL).replace("11433", "1e3"),
        codec.encode(FULL).replace("11433", "NaN"),
    ],
)
def test_anything_but_what_encode_wrote_is_refused_with_a_codec_error(payload: object) -> None:
    with pytest.raises(codec.CodecError):
        codec.decode(payload)


def test_what_made_an_estimate_travels_with_it() -> None:
    text = codec.encode(FULL, "torch 2.15.0; transformers 5.25.0")
    assert codec.decode(text) == FULL
    assert codec.made_by(text) == "torch 2.15.0; transformers 5.25.0"
    assert codec.made_by(codec.encode(FULL)) is None
    for by in (None, 3, "x" * (codec.MAX_BY + 1)):
        with pytest.raises(codec.CodecError):
            codec.decode(_edited(by=by))
    with pytest.raises(codec.CodecError):
        codec.made_by("{")


def test_the_codec_error_is_a_value_error() -> None:
    assert issubclass(codec.CodecError, ValueError)
