"""The calibrated profile for hybrid stacks (Nemotron-H, Nemotron 3, Falcon-H1, Qwen3-Next,
Gemma 3n, Jamba): within 5 % of the trace.

The machinery: the features price each layer by its type, the fit recovers a linear truth
from the stacks it is given, and the estimate applies a section as the fit predicts it,
refusing the stacks, layer types and attention it was not traced with. Against the trace,
as `test_calibrated.py` holds the uniform families: a grid of 24 jobs on a deeper stack of
unseen widths, and the presets at 2,048 tokens.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from controller.calibration import calibrate_hybrid
from controller.calibration.calibrate import QWEN3_NEXT_LAYERS, gemma3n_layers, jamba_layers
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
from controller.estimator.model import is_kv_shared_layer
from controller.estimator.presets import load_preset
from controller.estimator.storage import static_bytes
from controller.jobs.profiles import estimate
from tests.unit.trace_support import require_trace_extra

PRESETS = {
    "nemotron_h": "nemotron-nano-9b-v2",
    "nemotron_3": "nemotron-3-nano-30b-a3b",
    "falcon_h1": "falcon-h1-1.5b",
    "qwen3_next": "qwen3-next-80b-a3b",
    "gemma3n": "gemma-3n-e4b",
    "jamba": "jamba-v0.1",
}
TOLERANCE = 0.05
LAYER_N, LOCAL_N = len(hybrid_fit.HYBRID_LAYER_FEATURES), len(hybrid_fit.HYBRID_LOCAL_FEATURES)


def _config(family: str, pattern: str) -> dict[str, Any]:
    from controller.calibration.calibrate import shrunk_hybrid

    return shrunk_hybrid(family, random.Random(f"test/{family}"), pattern, (64, 128, 256))


def _summed(config: dict[str, Any], pattern: str, job: TrainingSettings) -> dict[str, int]:
    if config["model_type"] == "qwen3_next":
        layers: dict[str, Any] = {"layer_types": [QWEN3_NEXT_LAYERS[c] for c in pattern]}
    elif config["model_type"] == "gemma3n_text":
        layers = gemma3n_layers(pattern)
    elif config["model_type"] == "jamba":
        layers = jamba_layers(pattern)
    else:
        layers = {"hybrid_override_pattern": pattern}
    shape = parse_config(config | layers | {"num_hidden_layers": len(pattern)})
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
    assert all(adds[kind][k] == 0 for kind in adds for k in hybrid_fit.MOE_FEATURES)


def test_a_gated_deltanet_layer_adds_the_scan_terms_in_its_own_widths() -> None:
    """Qwen3-Next's DeltaNet runs a chunked scan as Mamba-2 does: its value width as D, its
    convolution's channels as C, value heads as Hs, the key head width as the state N, in
    chunks of 64; an attention layer adds none of it; both add their MoE's terms."""
    config = _config("qwen3_next", "LA")
    job = TrainingSettings(method=Method.FULL, batch=2, seq_len=200)
    two = _summed(config, "LA", job)
    linear = {k: v - two[k] for k, v in _summed(config, "LLA", job).items()}
    attention = {k: v - two[k] for k, v in _summed(config, "LAA", job).items()}
    t, tp = 400, 2 * 256  # 200 tokens padded to whole chunks of 64
    heads, dk = config["linear_num_value_heads"], config["linear_key_head_dim"]
    value = heads * config["linear_value_head_dim"]
    conv = 2 * config["linear_num_key_heads"] * dk + value
    assert [linear[k] for k in hybrid_fit.SCAN_FEATURES] == [
        t * value, t * conv, t * heads, tp * heads * 64, tp * heads * dk,
        tp * value * dk // 64, 2 * value * dk,
    ]  # fmt: skip
    assert all(attention[k] == 0 for k in hybrid_fit.SCAN_FEATURES) and attention["t*q"] > 0
    assert linear["t*E"] == t * config["num_experts"] and linear["t*q"] == 0
    assert all(linear[k] == attention[k] > 0 for k in ("t*k*w", "t*k*e", "t*E", "W_E"))


def test_a_jamba_mamba_layer_adds_the_mamba_1_scan_terms() -> None:
    """Jamba's Mamba (1) layer: its inner width as D, x_proj's dt, B and C as the channels,
    the whole sequence's discretised tensors t·D·N and the first state b·D·N, no chunks or
    heads; an attention layer adds none of it, and an MoE layer its experts' terms."""
    config = _config("jamba", "me")
    job = TrainingSettings(method=Method.FULL, batch=2, seq_len=200)
    two = _summed(config, "me", job)
    mamba = {k: v - two[k] for k, v in _summed(config, "mme", job).items()}
    attention = {k: v - two[k] for k, v in _summed(config, "mae", job).items()}
    pair = {k: v - two[k] for k, v in _summed(config, "meme", job).items()}
    t, inner, state = 400, 2 * config["hidden_size"], config["mamba_d_state"]
    assert [mamba[k] for k in hybrid_fit.SCAN_FEATURES] == [
        t * inner, t * (config["mamba_dt_rank"] + 2 * state), 0, 0, t * inner * state, 0,
        2 * inner * state,
    ]  # fmt: skip
    assert mamba["t*q"] == 0 and mamba["t*i"] == t * config["intermediate_size"]
    assert all(attention[k] == 0 for k in hybrid_fit.SCAN_FEATURES) and attention["t*q"] > 0
    assert all(mamba[k] == attention[k] == 0 for k in hybrid_fit.MOE_FEATURES)
    moe = {k: pair[k] - mamba[k] for k in pair}  # the pair less its dense layer
    assert moe["t*E"] == t * config["num_experts"] and moe["W_E"] > 0
    assert moe["t*k*w"] == t * config["num_experts_per_tok"] * config["hidden_size"]
    assert all(moe[k] == mamba[k] for k in hybrid_fit.SCAN_FEATURES)


def test_jamba_s_layer_kinds_are_its_mixer_and_its_experts() -> None:
    """jamba-v0.1: attention every 8th layer from layer 4, experts every other from layer 1,
    so its attention layers are dense; the fit's stacks are the ones period and offset can
    write, and a stack they cannot is refused before it is traced."""
    kinds = hybrid_fit.layer_kinds(load_shape("jamba-v0.1"))
    assert kinds is not None and len(kinds) == 32
    assert kinds[:6] == ("mamba_dense", "mamba_moe", "mamba_dense", "mamba_moe",
                         "attention_dense", "mamba_moe")  # fmt: skip
    assert Counter(kinds) == {"mamba_moe": 16, "mamba_dense": 12, "attention_dense": 4}
    task = ("jamba", "lora", "on", 0)
    config, _ = calibrate_hybrid.variant(task)
    for name, types in calibrate_hybrid.stacks(task).items():
        shape = parse_config(calibrate_hybrid.with_layers("jamba", config, types))
        assert hybrid_fit.layer_kinds(shape) == types, name
    assert jamba_layers("mxme") == {
        "num_hidden_layers": 4,
        "attn_layer_period": 3,
        "attn_layer_offset": 1,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
    }
    with pytest.raises(ValueError, match="expert_layer_period and _offset cannot make 'mee'"):
        jamba_layers("mee")


def test_the_preset_s_mix_is_solved_from_stacks_that_add_a_pair() -> None:
    """Jamba's MoE layer is traced in a pair with a dense one: 10 dense, 15 MoE and 4
    attention layers more than the base are 15 pairs, 5 dense layers fewer, 4 attention."""
    require_trace_extra()  # the fit solves with numpy
    needed = {"mamba_dense": 10, "mamba_moe": 15, "attention_dense": 4}
    assert calibrate_hybrid._multiples("jamba", needed) == {
        "mamba_dense": -5,
        "mamba_moe": 15,
        "attention_dense": 4,
    }
    assert calibrate_hybrid._multiples("gemma3n", {"sparse": 3}) == {"sparse": 3}


def test_a_looped_scan_s_runs_are_one_moment_its_largest() -> None:
    dynamic = {
        "forward/first/mamba#modeling_jamba.py:424:mul:0": 10,
        "forward/first/mamba#modeling_jamba.py:424:mul:1": 30,
        "forward/first/mamba#modeling_jamba.py:424:mul:2": 20,
        "forward/first/mamba": 5,
        OPTIMIZER_KEY: 7,
    }
    assert calibrate_hybrid._merged_loops(dynamic) == {
        "forward/first/mamba#modeling_jamba.py:424:mul": 30,
        "forward/first/mamba": 5,
        OPTIMIZER_KEY: 7,
    }


def test_a_qwen3_next_stack_with_dense_layers_is_refused() -> None:
    """The fit traced experts in every layer: `mlp_only_layers` (dense MLPs in their place)
    is a layer it never saw."""
    config = _config("qwen3_next", "LLLA") | {"mlp_only_layers": [1]}
    job = TrainingSettings(method=Method.FULL, profile=Profile.CALIBRATED)
    with pytest.raises(SpecError, match="with experts in every layer, this one has dense") as info:
        estimate(parse_config(config), job)
    assert info.value.field == "estimator.profile" and "\n" not in info.value.message


def test_a_gemma_3n_layer_adds_its_kind_s_terms() -> None:
    """Every Gemma 3n layer adds AltUp's streams, its per-layer input and LAuReL's branch; an
    activation-sparse one its cut gate (t·x) too, a kv-shared one no k/v; in a full fine-tune
    its share of the per-layer inputs' gradients (G_p); the mask is once, from the sliding
    window's length on."""
    config = _config("gemma3n", "SH")
    job = TrainingSettings(method=Method.LORA, rank=8, batch=2, seq_len=256)
    two = _summed(config, "SH", job)
    adds = {
        kind: {k: v - two[k] for k, v in _summed(config, f"S{char}H", job).items()}
        for kind, char in (("sparse", "S"), ("dense", "D"), ("shared", "H"))
    }
    t, h, mlp = 512, config["hidden_size"], config["intermediate_size"]
    streams, p, rank = (config[k] for k in ("altup_num_inputs", "hidden_size_per_layer_input",
                                            "laurel_rank"))  # fmt: skip
    kv = config["num_key_value_heads"] * config["head_dim"]
    for kind in adds:
        assert (adds[kind]["t*h*a"], adds[kind]["t*p"], adds[kind]["t*lr"]) == (
            t * h * streams,
            t * p,
            t * rank,
        )
        assert adds[kind]["t*i"] == t * mlp and adds[kind]["t*q"] > 0
    assert adds["sparse"]["t*x"] == t * mlp and adds["dense"]["t*x"] == adds["shared"]["t*x"] == 0
    assert adds["sparse"]["t*kv"] == adds["dense"]["t*kv"] == t * kv and adds["shared"]["t*kv"] == 0
    assert adds["dense"]["t*A"] > adds["shared"]["t*A"] > 0  # LoRA's k/v inputs are not there
    assert adds["dense"]["G_p"] == 0  # the table is frozen
    full = TrainingSettings(method=Method.FULL, batch=2, seq_len=256)
    grown = _summed(config, "SDH", full)["G_p"] - _summed(config, "SH", full)["G_p"]
    assert grown == (config["vocab_size_per_layer_input"] + h) * p * 2
    window = config["sliding_window"]
    shape = parse_config(config | gemma3n_layers("SH"))
    for seq_len in (window - 1, window):
        short = TrainingSettings(method=Method.FULL, seq_len=seq_len)
        once = hybrid_fit.features(shape, short, static_bytes(shape, short))[1]
        mask = dict(zip(hybrid_fit.HYBRID_LOCAL_FEATURES, once, strict=True))["b*s2"]
        assert mask == (0 if seq_len < window else seq_len**2)


def test_gemma_3n_s_layer_kinds_follow_its_sparsity_and_kv_sharing() -> None:
    shape = load_shape(PRESETS["gemma3n"])
    assert hybrid_fit.layer_kinds(shape) == ("sparse",) * 10 + ("dense",) * 10 + ("shared",) * 15
    assert hybrid_fit.fit_family(shape) == "gemma3n"
    assert hybrid_fit.layer_kinds(load_shape("llama-3.1-8b")) is None
    for pattern in ("SH", "SSDH", "SDHH"):
        config = _config("gemma3n", pattern)
        kinds = hybrid_fit.layer_kinds(parse_config(config))
        assert "".join(k[0].upper() if k != "shared" else "H" for k in kinds or ()) == pattern
    # as the parser reads kv sharing: as many shared layers as layers means none shares
    config = _config("gemma3n", "SDH")
    for shared, kinds in [(0, ("sparse", "dense", "dense")), (2, ("sparse", "shared", "shared")),
                          (3, ("sparse", "dense", "dense"))]:  # fmt: skip
        layout = {"num_kv_shared_layers": shared, "activation_sparsity_pattern": [0.9, 0, 0]}
        shape = parse_config(config | layout)
        assert hybrid_fit.layer_kinds(shape) == kinds
        assert [kind.endswith("shared") for kind in kinds] == [
            is_kv_shared_layer(shape.dims, i) for i in range(3)
        ]


def test_per_layer_input_gradients_are_gemma_3n_s_alone() -> None:
    """G_p and its share taken off the embedding's gradients are Gemma 3n's: a Nemotron-H
    config that carries the fields (the parser reads them for any model) keeps its G_head
    and G_embed whole and has no G_p."""
    config = load_preset(PRESETS["nemotron_h"]).config_dict()
    extra = {"hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 4096}
    job = TrainingSettings(method=Method.FULL, seq_len=4096)
    shape = parse_config(config | extra)
    static = static_bytes(shape, job)
    per_layer, once = hybrid_fit.features(shape, job, static)
    layer = dict(zip(hybrid_fit.HYBRID_LAYER_FEATURES, per_layer, strict=True))
    local = dict(zip(hybrid_fit.HYBRID_LOCAL_FEATURES, once, strict=True))
    assert layer["G_p"] == 0 and static.embed_gradients > 0
    assert (local["G_head"], local["G_embed"]) == (static.head_gradients, static.embed_gradients)


def test_gemma_3n_samples_grow_a_base_whose_first_layer_stores_no_k_v() -> None:
    """The kv-shared layers reuse the k/v of the last layer before them; in a two-layer
    [sparse, shared] that is the first layer, whose recomputation then holds less than in any
    real stack. Each sample's stacks add one layer of a kind to [sparse, dense, shared], in
    the place a real stack has it, and parse back to those kinds."""
    task = ("gemma3n", "lora", "on", 0)
    assert calibrate_hybrid.stacks(task) == {
        "2": ("sparse", "dense", "shared"),
        "sparse": ("sparse", "sparse", "dense", "shared"),
        "dense": ("sparse", "dense", "dense", "shared"),
        "shared": ("sparse", "dense", "shared", "shared"),
    }
    config, _ = calibrate_hybrid.variant(task)
    for kinds in calibrate_hybrid.stacks(task).values():
        shape = parse_config(calibrate_hybrid.with_layers("gemma3n", config, kinds))
        assert hybrid_fit.layer_kinds(shape) == kinds
    # the other families' bases are their first and last layers, a layer put between
    assert calibrate_hybrid.stacks(("nemotron_h", "lora", "on", 0))["attention"] == (
        "mamba2", "attention", "mlp"
    )  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # a sparse layer among the kv-shared ones: no published model's, never traced
        ({"activation_sparsity_pattern": [0.95, 0.0, 0.95]}, "this one has sparse_shared"),
        # a dense first layer: the fit's stacks begin with a sparse one, as Google's do
        ({"activation_sparsity_pattern": [0.0, 0.0, 0.0]}, "first layer is sparse"),
    ],
)
def test_a_gemma_3n_stack_the_fit_never_traced_is_refused(
    change: dict[str, Any], message: str
) -> None:
    config = _config("gemma3n", "SDH") | change
    job = TrainingSettings(method=Method.LORA, profile=Profile.CALIBRATED)
    with pytest.raises(SpecError, match=message) as info:
        estimate(parse_config(config), job)
    assert info.value.field == "estimator.profile" and "\n" not in info.value.message


@pytest.mark.parametrize("latent", [None, 128])
def test_a_nemotron_3_moe_layer_adds_its_experts_terms(latent: int | None) -> None:
    """t·k·w over the routed rows (w the latent width where there is one), t·k·e over the
    experts' inner width, t·E for the router, the expert stacks, and its shared expert as the
    layer's MLP width; no scan, no attention."""
    config = _config("nemotron_3", "ME") | {"moe_latent_size": latent}
    job = TrainingSettings(method=Method.FULL, batch=2, seq_len=256)
    two = _summed(config, "ME", job)
    adds = {k: v - two[k] for k, v in _summed(config, "MEE", job).items()}
    t, k, e = 512, config["num_experts_per_tok"], config["n_routed_experts"]
    w, inner = latent or config["hidden_size"], config["moe_intermediate_size"]
    assert (adds["t*k*w"], adds["t*k*e"], adds["t*E"]) == (t * k * w, t * k * inner, t * e)
    assert adds["W_E"] == 2 * e * 2 * w * inner  # up and down, 16-bit
    assert adds["t*l"] == t * (latent or 0)
    assert adds["t*i"] == t * config["moe_shared_expert_intermediate_size"]
    assert adds["t*D"] == adds["t*q"] == 0
    shape = parse_config(config | {"hybrid_override_pattern": "ME", "num_hidden_layers": 2})
    assert hybrid_fit.fit_family(shape) == "nemotron_3"


@pytest.mark.parametrize("family", list(PRESETS))
def test_the_feature_vectors_are_as_long_as_their_names(family: str) -> None:
    """The estimate multiplies them with `map`, which would stop at the shorter silently."""
    shape = load_shape(PRESETS[family])
    for method in (Method.FULL, Method.QLORA):
        config = load_preset(PRESETS[family]).config_dict()
        targets = calibrate_hybrid.lora_targets(family, config)
        job = TrainingSettings(method=method, targets=targets)
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


@pytest.mark.parametrize("family", list(PRESETS))
def test_the_fit_recovers_a_linear_truth(family: str) -> None:
    require_trace_extra()  # the fit solves with numpy
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


def test_cross_validation_reports_each_class_on_held_out_samples() -> None:
    """A linear truth is predicted on every held-out sample; a sample whose peak strays from
    it (a third more) shows as an error of about that size."""
    require_trace_extra()  # the fit solves with numpy
    truth = {"backward/tail": _truth(1), OPTIMIZER_KEY: _truth(2)}
    rows = list(_synthetic_rows("falcon_h1", truth))
    exact = calibrate_hybrid.cross_validate(rows, 4)
    assert list(exact) == ["falcon_h1/full/on/sdpa"] and exact["falcon_h1/full/on/sdpa"] < 1e-6
    for run in rows[5]["runs"].values():
        run["peak"] = round(run["peak"] * 4 / 3)
    assert calibrate_hybrid.cross_validate(rows, 4)["falcon_h1/full/on/sdpa"] > 0.2


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


def test_a_jamba_attention_layer_with_experts_is_refused() -> None:
    """No published Jamba puts experts on an attention layer, and the fit never traced one:
    attention at an odd layer, where the experts are, is refused with the field."""
    config = load_preset("jamba-v0.1").config_dict() | {"attn_layer_offset": 5}
    job = TrainingSettings(
        method=Method.LORA, targets=("q_proj", "v_proj"), profile=Profile.CALIBRATED
    )
    with pytest.raises(SpecError) as info:
        estimate(parse_config(config), job)
    assert info.value.field == "estimator.profile" and "\n" not in info.value.message
    assert "this one has attention_moe layers too" in info.value.message


def test_a_family_the_data_file_has_no_fit_for_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A data file fitted before a family was (`--families` keeps the others): refused,
    never priced with another family's coefficients."""
    data = dict(calibrated.calibration())
    data["hybrid"] = data["hybrid"] | {
        "families": {k: v for k, v in data["hybrid"]["families"].items() if k != "jamba"}
    }
    monkeypatch.setattr(calibrated, "calibration", lambda: data)
    calibrated._moments.cache_clear()
    job = TrainingSettings(
        method=Method.LORA, targets=("q_proj", "v_proj"), profile=Profile.CALIBRATED
    )
    try:
        with pytest.raises(SpecError, match="no fit for hybrid layers of this family") as info:
            estimate(load_shape("jamba-v0.1"), job)
    finally:
        calibrated._moments.cache_clear()
    assert info.value.field == "estimator.profile" and "\n" not in info.value.message


def test_a_nemotron_3_stack_with_a_layer_type_it_never_traced_is_refused() -> None:
    """Nemotron 3's fit traced Mamba-2, attention and MoE layers: an MLP layer among them
    (Nemotron-H's, which that fit never saw beside experts) is refused with the field."""
    shape = parse_config(_config("nemotron_3", "ME-E"))
    job = TrainingSettings(method=Method.FULL, profile=Profile.CALIBRATED)
    with pytest.raises(SpecError) as info:
        estimate(shape, job)
    assert info.value.field == "estimator.profile" and "\n" not in info.value.message
    assert info.value.message.startswith(
        "calibrated fits nemotron_3 stacks of attention, mamba2, moe layers, this one has mlp"
    )


# -- against the trace ----------------------------------------------------------------------

#: The grid's stacks: Nemotron-H's begin with Mamba-2 and end with an MLP layer, as every
#: published one does; Falcon-H1's layers are all alike.
GRID_PATTERNS = {
    "nemotron_h": "M-*M-",
    "nemotron_3": "MEM*E",
    "falcon_h1": "PPPP",
    "qwen3_next": "LLALLA",
    "gemma3n": "SSDDHH",
    # attention every 4th layer from layer 2, experts every other from layer 1
    "jamba": "meaeme",
}
GRID_JOBS = [
    (method, gc, seq_len, batch)
    for method in (Method.FULL, Method.LORA, Method.QLORA)
    for gc in (Checkpointing.ON, Checkpointing.OFF)
    for seq_len in (256, 512)
    for batch in (1, 2)
]
#: Jamba's Mamba runs token by token, some 35 ms per token and layer on 2 cores: every class
#: at 128 tokens x 2, and LoRA with checkpointing at 512 tokens, twice the samples' longest.
LOOPED_GRID_JOBS = [
    (method, gc, 128, 2)
    for method in (Method.FULL, Method.LORA, Method.QLORA)
    for gc in (Checkpointing.ON, Checkpointing.OFF)
] + [(Method.LORA, Checkpointing.ON, 512, 1)]


def _job(family: str, config: dict[str, Any], method: Method, **fields: Any) -> TrainingSettings:
    adapter = method is not Method.FULL
    return TrainingSettings(
        method=method,
        rank=16 if adapter else None,
        targets=calibrate_hybrid.lora_targets(family, config) if adapter else ("all-linear",),
        **fields,
    )


@pytest.mark.parametrize("family", list(GRID_PATTERNS))
def test_within_5_percent_of_the_trace_on_the_grid(family: str) -> None:
    """A stack deeper than any the fit was traced with, its widths drawn with a seed of its
    own, in chunks of 128 tokens (Qwen3-Next's: 64): full / LoRA / QLoRA x checkpointing x
    256 / 512 tokens x batch 1 / 2 (Jamba's: LOOPED_GRID_JOBS), against the whole stack's
    trace."""
    require_trace_extra()
    from controller.calibration.calibrate import shrunk_hybrid
    from controller.trace.run import trace_run

    config = shrunk_hybrid(family, random.Random(f"grid/{family}"), GRID_PATTERNS[family])
    misses = []
    jobs = LOOPED_GRID_JOBS if family in calibrate_hybrid.LOOPED else GRID_JOBS
    for method, gc, seq_len, batch in jobs:
        job = _job(family, config, method, gradient_checkpointing=gc, seq_len=seq_len, batch=batch)
        loaded = calibrate_hybrid.with_method(family, config, method.value)
        traced = trace_run(loaded, job, breakdowns=False).peak
        error = (calibrated.peak_bytes(parse_config(loaded), job) - traced) / traced
        if abs(error) > TOLERANCE:
            misses.append(f"{method.value} gc={gc.value} s={seq_len} b={batch}: {error:+.1%}")
    assert not misses, "; ".join(misses)


_ON, _OFF = Checkpointing.ON, Checkpointing.OFF
REAL = [
    ("nemotron-nano-9b-v2", Method.LORA, _ON),
    ("nemotron-nano-9b-v2", Method.QLORA, _ON),
    ("nemotron-3-nano-30b-a3b", Method.LORA, _ON),
    ("nemotron-3-nano-30b-a3b", Method.QLORA, _ON),
    # Without checkpointing: with it, the 80B's peak is its optimizer step (activations
    # decide nothing). About 45 s of trace at full size.
    ("qwen3-next-80b-a3b", Method.QLORA, _OFF),
    ("falcon-h1-1.5b", Method.FULL, _ON),
    ("falcon-h1-1.5b", Method.LORA, _ON),
    ("gemma-3n-e4b", Method.LORA, _ON),
    ("gemma-3n-e4b", Method.QLORA, _OFF),
    # the per-layer inputs' gradients (G_p) at a real vocabulary: 16x the samples' largest
    ("gemma-3n-e4b", Method.FULL, _OFF),
]


@pytest.mark.parametrize(
    ("preset", "method", "gc"), REAL, ids=[f"{p}-{m.value}-gc-{g.value}" for p, m, g in REAL]
)
def test_within_5_percent_of_the_trace_at_real_widths(
    preset: str, method: Method, gc: Checkpointing
) -> None:
    """2,048 tokens in chunks of the preset's own size, batch 1: widths and depths the fit
    never saw."""
    require_trace_extra()
    from controller.trace import trace

    family = hybrid_fit.fit_family(load_shape(preset))
    config = calibrate_hybrid.with_method(family, load_preset(preset).config_dict(), method.value)
    job = _job(family, config, method, gradient_checkpointing=gc)
    traced = trace(config, job).peak_bytes
    predicted = calibrated.peak_bytes(parse_config(config), job)
    assert abs(predicted - traced) <= TOLERANCE * traced, (predicted, traced)


def test_a_latent_moe_at_real_widths_is_within_5_percent_of_the_trace() -> None:
    """Nemotron 3 Nano's widths with its experts behind a latent projection of 1,024 (as
    Nemotron 3's larger models narrow them), QLoRA without checkpointing, where the MoE
    layers' saved tensors decide: half the fit's samples drew a latent width."""
    require_trace_extra()
    from controller.trace import trace

    config = load_preset("nemotron-3-nano-30b-a3b").config_dict() | {"moe_latent_size": 1024}
    job = _job("nemotron_3", config, Method.QLORA, gradient_checkpointing=Checkpointing.OFF)
    traced = trace(config, job).peak_bytes
    predicted = calibrated.peak_bytes(parse_config(config), job)
    assert abs(predicted - traced) <= TOLERANCE * traced, (predicted, traced)


def test_jamba_at_real_widths_cut_to_six_layers_is_within_5_percent_of_the_trace() -> None:
    """jamba-v0.1's widths (hidden 4,096, Mamba 8,192 wide, 16 experts of 14,336) and its own
    periods over 6 layers (dense and MoE Mamba, an attention layer), QLoRA without
    checkpointing at 512 tokens, twice the samples' longest: the whole 32 layers at 2,048
    tokens would take some 35 minutes of trace (its Mamba runs token by token)."""
    require_trace_extra()
    from controller.trace.run import trace_run

    config = load_preset("jamba-v0.1").config_dict() | {"num_hidden_layers": 6}
    job = _job("jamba", config, Method.QLORA, gradient_checkpointing=_OFF, seq_len=512)
    traced = trace_run(config, job, breakdowns=False).peak
    predicted = calibrated.peak_bytes(parse_config(config), job)
    assert abs(predicted - traced) <= TOLERANCE * traced, (predicted, traced)
