"""What the raw-config fast paths must keep: objects as their constructors build them, the
layer grouping the shape would compute, a changed config read again, the same errors."""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields, replace
from typing import Any

import pytest

from controller.estimator import (
    Method,
    Precision,
    Profile,
    SpecError,
    TrainingSettings,
    parse_config,
)
from controller.estimator.calibrated import estimate as calibrated_estimate
from controller.estimator.model import ArchDims, Layer, ModelShape
from controller.estimator.model.parse import _parse_config
from controller.estimator.presets import hand_read_preset_names, load_preset
from controller.estimator.result import Estimate
from controller.estimator.storage import Static, static_bytes

#: Presets that take each path of the layer grouping: one kind, MoE with dense layers,
#: per-layer attention types with experts, attention types alone.
KINDS = ("llama-3.1-8b", "deepseek-v3", "gpt-oss-20b", "gemma-3-270m", "qwen3-30b-a3b")


def _rebuilt(obj: Any) -> Any:
    """`obj` built again by its class's own `__init__` from its fields."""
    return type(obj)(**{f.name: getattr(obj, f.name) for f in fields(obj)})


def _field_names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


@pytest.mark.parametrize("preset", hand_read_preset_names())
def test_assembled_shapes_equal_what_their_constructors_build(preset: str) -> None:
    # A fresh parse: parse_config's cached shapes may hold cached properties by now.
    shape = _parse_config(load_preset(preset).config_dict(), "")
    assert _rebuilt(shape) == shape
    assert _rebuilt(shape.dims) == shape.dims
    assert set(vars(shape)) == _field_names(ModelShape) | {"layer_counts"}
    assert set(vars(shape.dims)) == _field_names(ArchDims)
    for layer, _ in shape.layer_counts:
        assert _rebuilt(layer) == layer
        assert set(vars(layer)) == _field_names(Layer)


@pytest.mark.parametrize("preset", KINDS)
def test_static_and_estimate_are_whole_objects(preset: str) -> None:
    shape = parse_config(load_preset(preset).config_dict())
    job = TrainingSettings(method=Method.LORA, profile=Profile.CALIBRATED)
    static = static_bytes(shape, job)
    assert set(vars(static)) == _field_names(Static) and _rebuilt(static) == static
    est = calibrated_estimate(shape, job)
    assert set(vars(est)) == _field_names(Estimate) and _rebuilt(est) == est


@pytest.mark.parametrize("preset", KINDS)
def test_the_layer_counts_a_parse_hands_over_are_the_ones_the_shape_computes(
    preset: str,
) -> None:
    shape = parse_config(load_preset(preset).config_dict())
    computed = replace(shape).layer_counts  # a new shape: its cached property runs
    assert [(id(layer), n) for layer, n in computed] == [
        (id(layer), n) for layer, n in shape.layer_counts
    ]
    assert sum(n for _, n in shape.layer_counts) == shape.num_layers


def test_a_changed_config_is_read_again() -> None:
    """Shapes are kept by content (test_parse_cache.py): a change in place is a new config."""
    config = load_preset("llama-3.1-8b").config_dict()
    first = parse_config(config)
    config["num_hidden_layers"] = 4
    assert parse_config(config).num_layers == 4 and first.num_layers == 32


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (True, "must be an integer, got True"),
        (0, "must be greater than or equal to 1, got 0"),
        (2**24 + 1, "must be less than or equal to 16777216"),
        ("64", "must be an integer, got '64'"),
    ],
)
def test_the_fast_width_reader_refuses_what_the_full_one_refuses(value: object, words: str) -> None:
    config = load_preset("deepseek-v3").config_dict() | {"qk_rope_head_dim": value}
    with pytest.raises(SpecError, match=words) as error:
        parse_config(config, prefix="spec.model.config")
    assert error.value.field == "spec.model.config.qk_rope_head_dim"


def test_an_int_subclass_in_range_reads_as_before() -> None:
    class Width(int):
        pass

    config = load_preset("deepseek-v3").config_dict()
    plain = parse_config(config)
    assert parse_config(config | {"qk_rope_head_dim": Width(64)}).dims == plain.dims


#: One preset of each hybrid fit (`hybrid_fit.STACKS`): their layer sums are kept per shape.
HYBRIDS = (
    "nemotron-nano-9b-v2", "nemotron-3-nano-30b-a3b", "falcon-h1-1.5b", "qwen3-next-80b-a3b",
    "gemma-3n-e4b", "jamba-v0.1",
)  # fmt: skip
#: Jobs that change every setting a hybrid's features read: method, adapters, batch, length
#: (past and short of Gemma 3n's window, across scan chunks), precision, the fused loss.
HYBRID_JOBS = (
    TrainingSettings(method=Method.FULL, rank=None, batch=3, seq_len=700, fused_loss=True),
    TrainingSettings(method=Method.LORA, rank=64, targets=("q_proj", "v_proj"), seq_len=100),
    TrainingSettings(seq_len=4097, batch=2),
    TrainingSettings(method=Method.FULL, rank=None, precision=Precision.FP32, seq_len=300),
)


@pytest.mark.parametrize("preset", HYBRIDS)
def test_a_hybrid_s_layer_sums_kept_per_shape_hold_nothing_a_job_sets(preset: str) -> None:
    """`hybrid_fit.features` sums the layers' widths once per shape and multiplies them per
    job: a shape that priced other jobs first must give what a fresh parse gives."""
    from controller.estimator import hybrid_fit

    kept = parse_config(load_preset(preset).config_dict())
    for job in HYBRID_JOBS:
        hybrid_fit.features(kept, job, static_bytes(kept, job))
    for job in reversed(HYBRID_JOBS):
        fresh = _parse_config(load_preset(preset).config_dict(), "")
        assert hybrid_fit.features(kept, job, static_bytes(kept, job)) == hybrid_fit.features(
            fresh, job, static_bytes(fresh, job)
        )


#: Digests of `hybrid_fit.features` over HYBRID_JOBS, recorded from the code before the
#: layer sums were kept per shape (f13a7d9, which built each group's vector per call): a
#: width moved to another feature's place changes them.
PINNED = {
    "nemotron-nano-9b-v2": "fb2b5d12576f8dab",
    "nemotron-3-nano-30b-a3b": "f5ca15dddc6b70ca",
    "falcon-h1-1.5b": "1fa09e0004768632",
    "qwen3-next-80b-a3b": "add1b64c06077b13",
    "gemma-3n-e4b": "ef0ac33a2f682a5f",
    "jamba-v0.1": "56587d7c3c25ef86",
}


@pytest.mark.parametrize("preset", HYBRIDS)
def test_a_hybrid_s_features_are_what_the_per_layer_code_gave(preset: str) -> None:
    from controller.estimator import hybrid_fit

    shape = parse_config(load_preset(preset).config_dict())
    values = [hybrid_fit.features(shape, job, static_bytes(shape, job)) for job in HYBRID_JOBS]
    digest = hashlib.sha256(json.dumps([[list(a), list(b)] for a, b in values]).encode())
    assert digest.hexdigest()[:16] == PINNED[preset]


def test_a_refused_hybrid_stack_is_refused_on_every_estimate_with_the_field() -> None:
    """The refusal is decided once per shape; each estimate raises it anew, by its field."""
    from controller.estimator import hybrid_fit

    config = load_preset("qwen3-next-80b-a3b").config_dict() | {"mlp_only_layers": [3]}
    shape = parse_config(config)
    raised = []
    for field in ("estimator.profile", "spec.estimator.profile"):
        with pytest.raises(SpecError, match="dense MLP layers") as error:
            hybrid_fit.check_stack(shape, field)
        assert error.value.field == field
        raised.append(error.value)
    assert raised[0] is not raised[1]
    hybrid_fit.check_stack(parse_config(load_preset("qwen3-next-80b-a3b").config_dict()), "x")
