"""The calibrated profile for hybrid stacks (Nemotron-H, Falcon-H1): within 5 % of the trace.

The machinery: the features price each layer by its type, the fit recovers a linear truth
from the stacks it is given, and the estimate applies a section as the fit predicts it,
refusing the stacks, layer types and attention it was not traced with. Against the trace,
as `test_calibrated.py` holds the uniform families: a grid of 24 jobs on a deeper stack of
unseen widths, and the presets at 2,048 tokens.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from controller.estimator import (
    Attention,
    Checkpointing,
    Method,
    Profile,
    SpecError,
    TrainingSettings,
    calibrated,
    hybrid_fit,
    load_shape,
    parse_config,
)
from controller.estimator.calibrated import OPTIMIZER_KEY
from controller.estimator.presets import load_preset
from controller.estimator.storage import static_bytes
from controller.profiles import estimate
from controller.trace import calibrate_hybrid
from tests.unit.trace_support import require_trace_extra

PRESETS = {"nemotron_h": "nemotron-nano-9b-v2", "falcon_h1": "falcon-h1-1.5b"}
TOLERANCE = 0.05
LAYER_N, LOCAL_N = len(hybrid_fit.HYBRID_LAYER_FEATURES), len(hybrid_fit.HYBRID_LOCAL_FEATURES)


def _config(family: str, pattern: str) -> dict[str, Any]:
    from controller.trace.calibrate import shrunk_hybrid

    return shrunk_hybrid(family, random.Random(f"test/{family}"), pattern, (64, 128, 256))


def _summed(config: dict[str, Any], pattern: str, job: TrainingSettings) -> dict[str, int]:
    cfg = config | {"hybrid_override_pattern": pattern, "num_hidden_layers": len(pattern)}
    shape = parse_config(cfg)
    values = hybrid_fit.features(shape, job, static_bytes(shape, job))[0]
    return dict(zip(hybrid_fit.HYBRID_LAYER_FEATURES, values, strict=True))


def test_the_summed_features_price_each_layer_by_its_type() -> None:
    """A Mamba-2 layer adds the scan's terms and no attention, an attention layer t·q and no
    scan, an MLP layer only its width: the sums are the per-type vectors added up."""
    config = _config("nemotron_h", "M*-")
    job = TrainingSettings(
        method=Method.LORA, rank=8, targets=calibrate_hybrid.TARGETS["nemotron_h"]
    )
    names = hybrid_fit.HYBRID_LAYER_FEATURES
    two = _summed(config, "M-", job)
    adds = {
        kind: {k: v - two[k] for k, v in _summed(config, f"M{char}-", job).items()}
        for kind, char in (("mamba", "M"), ("attn", "*"), ("mlp", "-"))
    }
    assert adds["mamba"]["tp*Hs*c"] > 0 and adds["mamba"]["tp*D*N/c"] > 0
    assert adds["mamba"]["t*q"] == adds["mamba"]["t*i"] == 0
    assert adds["attn"]["t*q"] > 0 and adds["attn"]["t*D"] == adds["attn"]["t*i"] == 0
    assert adds["mlp"]["t*i"] > 0 and adds["mlp"]["t*D"] == adds["mlp"]["t*q"] == 0
    assert all(adds[kind]["t*h"] == adds["mlp"]["t*h"] > 0 for kind in adds)
    assert adds["mamba"]["t*A"] > 0 and adds["mlp"]["G_layer"] > 0  # LoRA on in_proj, up/down
    twice = _summed(config, "MMM-", job)  # two Mamba-2 layers add twice what one adds
    assert all(twice[k] - two[k] == 2 * adds["mamba"][k] for k in names)


@pytest.mark.parametrize("family", list(PRESETS))
def test_the_feature_vectors_are_as_long_as_their_names(family: str) -> None:
    """The estimate multiplies them with `map`, which would stop at the shorter silently."""
    shape = load_shape(PRESETS[family])
    for method in (Method.FULL, Method.QLORA):
        job = TrainingSettings(method=method, targets=calibrate_hybrid.TARGETS[family])
        per_layer, once = hybrid_fit.features(shape, job, static_bytes(shape, job))
        assert (len(per_layer), len(once)) == (LAYER_N, LOCAL_N)


def _truth(seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    return [
        [rng.uniform(0, 4) for _ in range(LAYER_N)],
        [rng.uniform(0, 4) for _ in range(LOCAL_N)],
    ]


def _synthetic_rows(family: str, truth: dict[str, list[list[float]]]) -> Iterator[dict[str, Any]]:
    """Rows as `calibrate_hybrid.sample` writes them, with each moment's bytes given by
    `truth` instead of a trace (features and static parts are the real ones)."""
    for seed in range(40):
        task = (family, "full", "on", seed)
        config, settings = calibrate_hybrid.variant(task)
        runs = {}
        for name, types in calibrate_hybrid.stacks(task).items():
            cfg = calibrate_hybrid.with_layers(family, config, types)
            shape = parse_config(cfg)
            static = static_bytes(shape, settings)
            per_layer, once = hybrid_fit.features(shape, settings, static)
            point = {"per_layer": per_layer, "once": once}
            dynamic = {k: round(calibrate_hybrid._dynamic(c, point)) for k, c in truth.items()}
            base = static.weights + static.optimizer
            step = static.weights + static.gradients + static.optimizer + static.optimizer_scratch
            peak = max(v + (step if k == OPTIMIZER_KEY else base) for k, v in dynamic.items())
            runs[name] = point | {
                "dynamic": dynamic,
                "base": base,
                "static_step": step,
                "peak": peak,
            }
        yield {"task": list(task), "class": list(task[:3]), "runs": runs}


@pytest.mark.parametrize("family", ["nemotron_h", "falcon_h1"])
def test_the_fit_recovers_a_linear_truth(family: str) -> None:
    truth = {"backward/tail": _truth(1), OPTIMIZER_KEY: _truth(2)}
    rows = list(_synthetic_rows(family, truth))
    coefficients, worst = calibrate_hybrid.fit(rows, family)
    assert set(coefficients) <= set(truth) and worst < 1e-6
    # and predicts stacks it never saw: the preset's own depth and mix, from its features.
    # Some features move together on the shrunk grid, so the coefficients are not the
    # truth's one for one, and the extrapolation is close, not exact.
    shape = load_shape(PRESETS[family])
    job = TrainingSettings(method=Method.FULL)
    per_layer, once = hybrid_fit.features(shape, job, static_bytes(shape, job))
    point = {"per_layer": per_layer, "once": once}
    for key, coefs in coefficients.items():
        expected = calibrate_hybrid._dynamic(truth[key], point)
        assert calibrate_hybrid._dynamic(coefs, point) == pytest.approx(expected, rel=0.01)


@pytest.fixture
def with_hybrid_section(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The data file with a hybrid section (made-up coefficients: its shape is what counts)."""
    data = dict(calibrated.calibration())
    moments = {"backward/tail": _truth(3), OPTIMIZER_KEY: _truth(4)}
    section = {
        family: {
            m: {gc: {"sdpa": moments} for gc in ("on", "off")} for m in ("full", "lora", "qlora")
        }
        for family in PRESETS
    }
    data["hybrid"] = {"families": section}
    monkeypatch.setattr(calibrated, "calibration", lambda: data)
    calibrated._moments.cache_clear()
    yield moments
    calibrated._moments.cache_clear()


def test_a_section_prices_a_hybrid_as_its_fit_predicts(with_hybrid_section: dict[str, Any]) -> None:
    shape = load_shape(PRESETS["nemotron_h"])
    job = TrainingSettings(method=Method.FULL, profile=Profile.CALIBRATED)
    est = estimate(shape, job)
    static = static_bytes(shape, job)
    per_layer, once = hybrid_fit.features(shape, job, static)
    point = {"per_layer": per_layer, "once": once}
    base = static.weights + static.optimizer
    step = base + static.gradients + static.optimizer_scratch
    fitted = {
        k: round(calibrate_hybrid._dynamic(c, point)) + (step if k == OPTIMIZER_KEY else base)
        for k, c in with_hybrid_section.items()
    }
    assert calibrated.peak_bytes(shape, job) == max(fitted.values())
    assert est.profile == "calibrated" and est.total_bytes == sum(est.components.values())
    deeper = load_preset(PRESETS["nemotron_h"]).config_dict()
    pattern = deeper["hybrid_override_pattern"][:-1] + "MM-"
    deeper |= {"hybrid_override_pattern": pattern, "num_hidden_layers": len(pattern)}
    assert calibrated.peak_bytes(parse_config(deeper), job) > calibrated.peak_bytes(shape, job)


def test_a_stack_with_other_ends_is_refused_with_the_field(
    with_hybrid_section: dict[str, Any],
) -> None:
    config = _config("nemotron_h", "*M-M-")
    job = TrainingSettings(method=Method.FULL, profile=Profile.CALIBRATED)
    with pytest.raises(SpecError) as info:
        estimate(parse_config(config), job)
    assert info.value.field == "estimator.profile" and "\n" not in info.value.message
    assert "first layer is mamba2 and last is mlp, this one runs attention" in info.value.message
    analytic = TrainingSettings(method=Method.FULL, profile=Profile.ANALYTIC)
    assert estimate(parse_config(config), analytic).total_bytes > 0


def test_eager_attention_is_refused_not_guessed(with_hybrid_section: dict[str, Any]) -> None:
    job = TrainingSettings(
        method=Method.LORA,
        targets=calibrate_hybrid.TARGETS["falcon_h1"],
        attention=Attention.EAGER,
        profile=Profile.CALIBRATED,
    )
    with pytest.raises(SpecError, match=r"sdpa attention .* only, not eager") as info:
        estimate(load_shape(PRESETS["falcon_h1"]), job)
    assert info.value.field == "estimator.profile"


def test_the_data_file_fits_every_class_of_the_traced_families() -> None:
    section = calibrated.calibration()["hybrid"]
    assert section["layer_features"] == list(hybrid_fit.HYBRID_LAYER_FEATURES)
    assert section["local_features"] == list(hybrid_fit.HYBRID_LOCAL_FEATURES)
    assert set(section["families"]) == set(hybrid_fit.STACKS) == set(PRESETS)
    for family in PRESETS:
        for method in ("full", "lora", "qlora"):
            for gc in ("on", "off"):
                moments = section["families"][family][method][gc]["sdpa"]
                assert moments
                for per_layer, once in moments.values():
                    assert (len(per_layer), len(once)) == (LAYER_N, LOCAL_N)


@pytest.mark.parametrize(
    ("preset", "message"),
    [
        ("jamba-v0.1", "no fit for hybrid layers"),
        ("qwen3-next-80b-a3b", "no fit for hybrid layers"),
        ("nemotron-3-nano-30b-a3b", "this one has moe layers too"),
    ],
)
def test_what_the_fit_never_traced_stays_refused(preset: str, message: str) -> None:
    shape = load_shape(preset)
    job = TrainingSettings(
        method=Method.LORA, targets=("q_proj", "v_proj"), profile=Profile.CALIBRATED
    )
    with pytest.raises(SpecError, match=message) as info:
        estimate(shape, job)
    assert info.value.field == "estimator.profile" and "\n" not in info.value.message


# -- against the trace ----------------------------------------------------------------------

#: The grid's stacks: Nemotron-H's begin with Mamba-2 and end with an MLP layer, as every
#: published one does; Falcon-H1's layers are all alike.
GRID_PATTERNS = {"nemotron_h": "M-*M-", "falcon_h1": "PPPP"}
GRID_JOBS = [
    (method, gc, seq_len, batch)
    for method in (Method.FULL, Method.LORA, Method.QLORA)
    for gc in (Checkpointing.ON, Checkpointing.OFF)
    for seq_len in (256, 512)
    for batch in (1, 2)
]


def _job(family: str, method: Method, **fields: Any) -> TrainingSettings:
    adapter = method is not Method.FULL
    return TrainingSettings(
        method=method,
        rank=16 if adapter else None,
        targets=calibrate_hybrid.TARGETS[family] if adapter else ("all-linear",),
        **fields,
    )


@pytest.mark.parametrize("family", list(GRID_PATTERNS))
def test_within_5_percent_of_the_trace_on_the_grid(family: str) -> None:
    """A stack deeper than any the fit was traced with, its widths drawn with a seed of its
    own, in chunks of 128 tokens: full / LoRA / QLoRA x checkpointing x 256 / 512 tokens x
    batch 1 / 2, against the whole stack's trace."""
    require_trace_extra()
    from controller.trace.calibrate import shrunk_hybrid
    from controller.trace.run import trace_run

    config = shrunk_hybrid(family, random.Random(f"grid/{family}"), GRID_PATTERNS[family])
    shape = parse_config(config)
    misses = []
    for method, gc, seq_len, batch in GRID_JOBS:
        job = _job(family, method, gradient_checkpointing=gc, seq_len=seq_len, batch=batch)
        traced = trace_run(config, job, breakdowns=False).peak
        error = (calibrated.peak_bytes(shape, job) - traced) / traced
        if abs(error) > TOLERANCE:
            misses.append(f"{method.value} gc={gc.value} s={seq_len} b={batch}: {error:+.1%}")
    assert not misses, "; ".join(misses)


REAL = [
    ("nemotron-nano-9b-v2", Method.LORA),
    ("nemotron-nano-9b-v2", Method.QLORA),
    ("falcon-h1-1.5b", Method.FULL),
    ("falcon-h1-1.5b", Method.LORA),
]


@pytest.mark.parametrize(("preset", "method"), REAL, ids=[f"{p}-{m.value}" for p, m in REAL])
def test_within_5_percent_of_the_trace_at_real_widths(preset: str, method: Method) -> None:
    """2,048 tokens in chunks of the preset's own size, batch 1, checkpointing on: widths and
    depths the fit never saw."""
    require_trace_extra()
    from controller.trace import trace

    shape = load_shape(preset)
    job = _job(shape.model_type, method)
    traced = trace(load_preset(preset).config, job).peak_bytes
    predicted = calibrated.peak_bytes(shape, job)
    assert abs(predicted - traced) <= TOLERANCE * traced, (predicted, traced)
