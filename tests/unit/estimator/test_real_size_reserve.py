"""A family read generically is charged the allocator reserve of real-size models; a hand-read
family keeps the small models' share its pinned figures were fitted with.

The same Llama shape is priced twice, once as itself and once under a model type no hand
reading reads (the generic reading prices a dense model with the Llama fit, so every
component but the reserve is the same): the reserve must be each group's share of what the
GPU holds beyond its weights, or for a dense model's adapters the real-size fit's bytes per
logit, parameter of the model and token x hidden unit, read from the data file here and
written out again.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Any

import pytest

from controller.calibration import calibrate_allocator
from controller.estimator import (
    Checkpointing,
    Method,
    TrainingSettings,
    calibrated,
    frameworks,
    load_shape,
)
from controller.estimator.model.families import FAMILIES
from controller.estimator.result import Estimate
from controller.estimator.settings import (
    DEFAULT_SWITCHES,
    KbitPreparation,
    LoadPath,
    Loss,
    Offloading,
    Optimizer,
    Parallelism,
    Precision,
    Switches,
)

LLAMA = load_shape("llama-3.1-8b")
GENERIC = replace(LLAMA, model_type="phi")  # a type no hand reading reads
MOE = replace(load_shape("qwen3-30b-a3b"), model_type="phi")
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


def _reread() -> None:
    """Forget what calibrated read from the data file, after `calibration` is patched or
    restored."""
    for read in (
        calibrated.allocator_share,
        calibrated.backward_share,
        calibrated.adapter_reserve,
        calibrated.moe_full_reserve,
    ):
        read.cache_clear()


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


def _adapter_fit() -> dict[str, float]:
    return dict(calibrated.calibration()["allocator"]["real_size"]["adapters"]["on"])


def _fitted_reserve(settings: TrainingSettings, shape: Any = LLAMA) -> int:
    fit = _adapter_fit()
    tokens = settings.batch * settings.lm_seq_len
    parameters = calibrated.static_bytes(shape, settings).total_params
    return round(
        fit["per_logit"] * tokens * shape.vocab_size
        + fit["per_model_param"] * parameters
        + fit["per_token_hidden"] * tokens * shape.hidden_size
    )


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("method", [Method.LORA, Method.QLORA])
def test_a_generic_dense_family_s_adapters_are_charged_the_real_size_fit(
    method: Method, batch: int
) -> None:
    settings = TrainingSettings(method=method, rank=16, batch=batch)
    hand = calibrated.estimate(LLAMA, settings)
    generic = calibrated.estimate(GENERIC, settings)
    slack = _fitted_reserve(settings)
    assert slack > 0
    assert generic.components["allocator_slack"] == slack
    assert generic.reserve_share == (slack, _beyond_weights(generic))
    real = _share(f"{method.value}/on", True)
    by_share = _beyond_weights(generic) * real.numerator // real.denominator
    assert slack != by_share  # not the share it was charged before, so the check can fail
    others = {k: v for k, v in generic.components.items() if k != "allocator_slack"}
    assert others == {k: v for k, v in hand.components.items() if k != "allocator_slack"}


def test_the_adapters_reserve_follows_the_tokens_not_the_rank() -> None:
    """The fit's terms move the reserve where a share of the peak did not: four times the
    tokens add the logits' and hidden states' terms three times over. A higher rank adds
    only what the rank adds to the model's parameters: traced, the reserve did not grow with
    it (Granite-3.3-8B LoRA 1,372 MiB at rank 16, 1,299 at 64), where a share of the peak,
    which holds the adapters' states, would."""
    fit = _adapter_fit()
    one, four = (TrainingSettings(method=Method.QLORA, rank=16, batch=b) for b in (1, 4))
    grown = calibrated.estimate(GENERIC, four).components["allocator_slack"]
    grown -= calibrated.estimate(GENERIC, one).components["allocator_slack"]
    tokens = 3 * one.lm_seq_len
    per_token = fit["per_logit"] * LLAMA.vocab_size + fit["per_token_hidden"] * LLAMA.hidden_size
    assert abs(grown - tokens * per_token) <= 1
    wide = TrainingSettings(method=Method.QLORA, rank=64)
    added = calibrated.estimate(GENERIC, wide).components["allocator_slack"]
    added -= calibrated.estimate(GENERIC, one).components["allocator_slack"]
    more = calibrated.static_bytes(LLAMA, wide).total_params
    more -= calibrated.static_bytes(LLAMA, one).total_params
    assert more > 0 and abs(added - fit["per_model_param"] * more) <= 1
    assert added < calibrated.static_bytes(LLAMA, wide).optimizer // 100


def test_image_tokens_count_as_the_language_model_s_tokens() -> None:
    """A vision-language job's image tokens run through the language model beside its text
    (`lm_seq_len`): they make logits and hidden states as text tokens do."""
    text = TrainingSettings(method=Method.QLORA, rank=16, seq_len=2048)
    mixed = TrainingSettings(method=Method.QLORA, rank=16, seq_len=1024, image_tokens=1024)
    assert mixed.lm_seq_len == text.lm_seq_len
    slack = calibrated.estimate(GENERIC, mixed).components["allocator_slack"]
    assert (
        slack
        == _fitted_reserve(mixed)
        == calibrated.estimate(GENERIC, text).components["allocator_slack"]
    )


#: Set-ups the fits' runs did not have, as TrainingSettings overrides of LoRA rank 16.
UNFITTED = [
    pytest.param({"switches": Switches(loss=Loss.CHUNKED)}, id="chunked-loss"),
    pytest.param({"fused_loss": True}, id="fused-loss"),
    pytest.param({"precision": Precision.FP32}, id="fp32"),
    pytest.param(
        {
            "method": Method.QLORA,
            "switches": Switches(kbit_preparation=KbitPreparation.UPCAST_NON_QUANTIZED),
        },
        id="upcast",
    ),
    pytest.param({"switches": Switches(activation_offloading=Offloading.CPU)}, id="offload"),
    pytest.param({"switches": Switches(optimizer_in_backward=True)}, id="step-in-backward"),
    pytest.param({"optimizer": Optimizer.ADAMW_8BIT}, id="adamw-8bit"),
    pytest.param({"gradient_accumulation": 4}, id="accumulation"),
    pytest.param({"gradient_checkpointing": Checkpointing.UNSLOTH}, id="unsloth"),
]


@pytest.mark.parametrize(
    "case",
    [
        *UNFITTED,
        pytest.param({"modules_to_save": ("lm_head",)}, id="modules-to-save"),
        pytest.param({"rank": calibrated.ADAPTER_FIT_MAX_RANK * 2}, id="rank-128"),
    ],
)
def test_adapters_set_up_otherwise_are_charged_the_larger_of_fit_and_share(
    case: dict[str, Any],
) -> None:
    """The fit's runs had checkpointing on, the plain loss, 16-bit training, AdamW, no
    accumulation, no switch that changes one GPU's step, no `modules_to_save` and rank 16.
    Elsewhere neither figure was measured: the fit's terms (logits, hidden states) do not
    depend on what differs, and the share grows with what the step holds (a saved LM head's
    or a high rank's states), so a job is charged the larger."""
    settings = TrainingSettings(**({"method": Method.LORA, "rank": 16} | case))
    generic = calibrated.estimate(GENERIC, settings)
    real = _share(f"{settings.method.value}/on", True)
    by_share = _beyond_weights(generic) * real.numerator // real.denominator
    fitted = _fitted_reserve(settings)
    assert by_share != fitted  # so the check below tells the two apart
    assert generic.components["allocator_slack"] == max(by_share, fitted)


@pytest.mark.parametrize(
    "switches",
    [
        pytest.param(Switches(), id="equal-to-the-defaults"),
        *(
            pytest.param(frameworks.find(name).switches, id=name)  # type: ignore[union-attr]
            for name in ("huggingface", "axolotl", "llama-factory", "trl")
        ),
        pytest.param(Switches(load_path=LoadPath.WHOLE_MODEL_PER_RANK), id="load-path"),
        pytest.param(Switches(compile=True), id="compile"),
        pytest.param(
            Switches(kbit_preparation=KbitPreparation.UPCAST_NON_QUANTIZED), id="kbit-on-lora"
        ),
    ],
)
def test_switches_that_leave_one_gpu_s_step_alone_keep_the_fits(switches: Switches) -> None:
    """The Hugging Face, Axolotl, LLaMA-Factory and TRL presets differ from the defaults only
    in FSDP's version, which one GPU never runs; `compile` is not priced (every estimate is
    of the eager step); a k-bit preparation upcasts nothing in a 16-bit LoRA. The fits the
    defaults get are theirs."""
    adapters = TrainingSettings(method=Method.LORA, rank=16, switches=switches)
    assert switches is not DEFAULT_SWITCHES
    est = calibrated.estimate(GENERIC, adapters)
    assert est.components["allocator_slack"] == _fitted_reserve(adapters)
    full = TrainingSettings(method=Method.FULL, rank=None, switches=switches)
    default = calibrated.estimate(MOE, TrainingSettings(method=Method.FULL, rank=None))
    moe = calibrated.estimate(MOE, full)
    assert moe.components["allocator_slack"] == default.components["allocator_slack"]


@pytest.mark.parametrize("method", [Method.LORA, Method.QLORA])
def test_a_generic_moe_s_adapters_keep_the_real_size_share(method: Method) -> None:
    """The fit's runs are the dense models': an MoE's experts cache blocks of their own."""
    moe = replace(load_shape("qwen3-30b-a3b"), model_type="phi")
    settings = TrainingSettings(method=method, rank=16)
    est = calibrated.estimate(moe, settings)
    small, real = _share(f"{method.value}/on", False), _share(f"{method.value}/on", True)
    assert small != real  # the data file tells them apart, so the check below can fail
    assert est.components["allocator_slack"] == _beyond_weights(est) * real.numerator // (
        real.denominator
    )


def test_a_device_map_spreads_the_fitted_reserve_as_each_gpu_holds() -> None:
    settings = TrainingSettings(method=Method.QLORA, rank=16)
    generic = calibrated.estimate(GENERIC, settings)
    slack = generic.components["allocator_slack"]
    pairs = ((generic.sharded_bytes, generic.replicated_bytes), *generic.moments)
    held = max(s // 2 + r for s, r in pairs)
    tensors = held - generic.fixed_bytes - generic.resident_bytes // 2
    expected = held + tensors * slack // _beyond_weights(generic)
    assert generic.per_gpu_bytes(2, Parallelism.DEVICE_MAP) == expected


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
    _reread()
    try:
        lora = calibrated.estimate(GENERIC, SETTINGS["lora/on"])
        full = calibrated.estimate(GENERIC, SETTINGS["full/on"])
    finally:
        monkeypatch.undo()
        _reread()
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
    # runs reserving exactly 2.5 B per logit, 0.05 per parameter, 60 per token x
    # hidden unit, but one: the fit recovers the rule and says how far that run is from it
    features = [
        (2048 * 49_155, 8_200_000_000, 2048 * 4096),
        (8192 * 128_256, 3_100_000_000, 8192 * 2048),
        (2048 * 32_000, 12_000_000_000, 2048 * 5120),
        (4096 * 151_936, 7_600_000_000, 4096 * 3584),
    ]
    runs = [(round(2.5 * f[0] + 0.05 * f[1] + 60 * f[2]), f) for f in features]
    odd = (4096 * 50_000, 9_000_000_000, 4096 * 4096)
    runs.append((round(2.5 * odd[0] + 0.05 * odd[1] + 60 * odd[2]) + (64 << 20), odd))
    part = calibrate_allocator.real_size_section(shares, kept, runs[:-1])
    fit = part["adapters"]["on"]
    assert (fit["per_logit"], fit["per_model_param"], fit["per_token_hidden"]) == (2.5, 0.05, 60)
    assert (fit["samples"], fit["under_mib"], fit["over_mib"]) == (4, 0, 0)
    off = calibrate_allocator.real_size_section(shares, kept, runs)["adapters"]["on"]
    assert off["samples"] == 5 and off["under_mib"] > 0 and off["over_mib"] > 0
    assert calibrate_allocator.real_size_section(shares, part)["adapters"] == part["adapters"]
    moes = [(round(11.5 * f[0]), f) for f in features]
    moe_fit = calibrate_allocator.real_size_section(shares, kept, None, moes)["moe_full"]
    assert moe_fit["on"]["per_logit"] == 11.5 and moe_fit["on"]["samples"] == 4
    assert moe_fit["presets"] == list(calibrate_allocator.REAL_SIZE_MOES)
    kept_fit = calibrate_allocator.real_size_section(shares, {"moe_full": moe_fit})["moe_full"]
    assert kept_fit == moe_fit
    assert part["presets"] == list(calibrate_allocator.REAL_SIZE_PRESETS)
    assert "full/on" not in part["groups"]  # full fine-tuning goes by its backward
    assert "qlora/off" not in part["groups"] and "full/off" not in part["backward"]
    data: dict[str, Any] = {
        "allocator": {"groups": {"full/on": {"share": 0.16}}, "real_size": part}
    }
    monkeypatch.setattr(calibrated, "calibration", lambda: data)
    _reread()
    try:
        lora = calibrated.allocator_share(Method.LORA, "on", "", True)
        qlora = calibrated.allocator_share(Method.QLORA, "on", "", True)
        full = calibrated.allocator_share(Method.FULL, "on", "", True)
        backward = calibrated.backward_share("on"), calibrated.backward_share("off")
        adapters = calibrated.adapter_reserve("on"), calibrated.adapter_reserve("off")
    finally:
        monkeypatch.undo()
        _reread()
    assert Fraction(*lora) == Fraction("0.3")  # the median
    assert Fraction(*qlora) == Fraction("0.33")  # kept: not measured this time
    assert Fraction(*full) == Fraction("0.16")  # no real-size group: the small models'
    assert backward == (Fraction("0.8").as_integer_ratio(), None)
    assert adapters == ((2.5, 0.05, 60.0), None)


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
    traced = set(calibrate_allocator.REAL_SIZE_PRESETS) | set(calibrate_allocator.REAL_SIZE_MOES)
    assert {preset for _, _, preset, _, _, _, _ in runs} == traced
    assert len(runs) == len(traced) * len(calibrate_allocator.SIZES)
    adapters = calibrate_allocator.tasks(real_size=True, methods=(Method.LORA,))
    assert {preset for _, _, preset, _, _, _, _ in adapters} == set(
        calibrate_allocator.REAL_SIZE_PRESETS
    )


def test_every_real_size_moe_is_kept_out_of_the_dense_adapters_fit() -> None:
    """`measure` tells an MoE by its name in REAL_SIZE_MOES: every real-size preset with
    experts must be there, or its adapters would enter the dense models' fit."""
    moes = {p for p in calibrate_allocator.REAL_SIZE_PRESETS if load_shape(p).dims.num_experts > 1}
    assert moes and moes <= set(calibrate_allocator.REAL_SIZE_MOES)
    assert all(load_shape(p).dims.num_experts > 1 for p in calibrate_allocator.REAL_SIZE_MOES)


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
def test_a_generic_moe_s_full_fine_tuning_is_charged_per_logit(batch: int) -> None:
    settings = TrainingSettings(method=Method.FULL, rank=None, batch=batch)
    est = calibrated.estimate(MOE, settings)
    fit = calibrated.calibration()["allocator"]["real_size"]["moe_full"]["on"]
    logits = batch * settings.lm_seq_len * MOE.vocab_size
    assert est.components["allocator_slack"] == round(fit["per_logit"] * logits) > 0
    assert est.reserve_share == (est.components["allocator_slack"], _beyond_weights(est))
    small = _share("full/on", False)  # the floor it was charged before, far above at batch 1
    if batch == 1:
        assert est.components["allocator_slack"] < _beyond_weights(est) * small.numerator // (
            small.denominator
        )


def test_a_hand_read_moe_keeps_the_small_models_share() -> None:
    """The MoE fit is a generic MoE's: a hand-read one keeps the share its figures are
    pinned to (a dense generic family's full fine-tuning keeps its backward's share: above)."""
    settings = TrainingSettings(method=Method.FULL, rank=None)
    hand = calibrated.estimate(load_shape("qwen3-30b-a3b"), settings)
    assert Fraction(*hand.reserve_share) == _share("full/on", False)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("case", [c for c in UNFITTED if c.id not in ("upcast",)])
def test_a_generic_moe_the_fit_did_not_measure_is_never_charged_less_than_the_small_models_share(
    batch: int, case: dict[str, Any]
) -> None:
    """Set up otherwise than the MoEs the per-logit fit was traced on, the backward's share
    stands with the small models' share of the peak as its floor (which is far above the
    fit: the peak holds the whole optimizer state)."""
    moe = MOE
    overrides = {k: v for k, v in case.items() if k != "method"}
    settings = TrainingSettings(method=Method.FULL, rank=None, batch=batch, **overrides)
    est = calibrated.estimate(moe, settings)
    backward, small = _backward_share("full/on"), _share("full/on", False)
    by_backward = calibrated.backward_transient(moe, settings) * backward.numerator
    by_backward //= backward.denominator
    by_peak = _beyond_weights(est) * small.numerator // small.denominator
    assert est.components["allocator_slack"] == max(by_backward, by_peak)


def test_a_fit_that_would_take_bytes_away_charges_none(monkeypatch: pytest.MonkeyPatch) -> None:
    data = dict(calibrated.calibration())
    fit = {"per_logit": -50.0, "per_model_param": 0.05, "per_token_hidden": 60.0}
    allocator = dict(data["allocator"])
    allocator["real_size"] = dict(allocator["real_size"]) | {"adapters": {"on": fit}}
    data["allocator"] = allocator
    monkeypatch.setattr(calibrated, "calibration", lambda: data)
    _reread()
    try:
        est = calibrated.estimate(GENERIC, TrainingSettings(method=Method.LORA, rank=16))
    finally:
        monkeypatch.undo()
        _reread()
    assert est.components["allocator_slack"] == 0
    assert est.reserve_share == (0, _beyond_weights(est))


def test_the_script_refuses_a_fit_with_a_negative_term() -> None:
    features = [(1000, 10, 100), (2000, 10, 100), (3000, 10, 100), (1000, 20, 300)]
    runs = [(10**6 - 100 * f[0], f) for f in features]  # less reserve as the logits grow
    with pytest.raises(ValueError, match="negative term"):
        calibrate_allocator.adapter_fit(runs)


class _InProcess:
    """The part of ProcessPoolExecutor `measure` uses, in this process: a fake `trace_one`
    patched here would not reach a worker process."""

    def __init__(self, max_workers: int) -> None:
        del max_workers

    def __enter__(self) -> _InProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def map(self, fn: Any, items: Any) -> Any:
        return map(fn, items)


def test_measure_routes_each_real_size_run_to_its_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The MoEs traced for `moe_full` alone stay out of the shares; Qwen3-30B-A3B, a
    real-size preset and an MoE, is in the shares and the MoE fit but not the dense
    adapters' fit; every dense adapter run is in that fit."""

    def fake(task: calibrate_allocator.Task) -> tuple[Any, ...]:
        method, _, _, batch, _, _, _ = task
        features = (batch * 1000, 7, batch * 10)
        transient = 100 if method == "full" else 0
        return task, 1000, 1100, 500, transient, features

    monkeypatch.setattr(calibrate_allocator, "trace_one", fake)
    monkeypatch.setattr(calibrate_allocator, "ProcessPoolExecutor", _InProcess)
    adapters: list[Any] = []
    moes: list[Any] = []
    methods = (Method.FULL, Method.LORA, Method.QLORA)
    shares = calibrate_allocator.measure(1, True, methods, adapters, moes)
    sizes = len(calibrate_allocator.SIZES)
    presets = calibrate_allocator.REAL_SIZE_PRESETS
    in_both = set(presets) & set(calibrate_allocator.REAL_SIZE_MOES)
    assert in_both == {"qwen3-30b-a3b"}
    assert len(shares[""]["full/on"]) == len(shares["backward"]["full/on"]) == len(presets) * sizes
    assert len(shares[""]["lora/on"]) == len(presets) * sizes
    assert len(moes) == len(calibrate_allocator.REAL_SIZE_MOES) * sizes
    assert len(adapters) == 2 * (len(presets) - len(in_both)) * sizes
