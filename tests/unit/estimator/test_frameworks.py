"""Framework presets and the trainer's switches: the data file, how a job's framework and
switches resolve, and what each switch changes in every formula profile."""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources

import pytest

from controller.estimator import (
    Checkpointing,
    LoadPath,
    Loss,
    Method,
    Offloading,
    Parallelism,
    Profile,
    Switches,
    TrainingSettings,
    build_settings,
    load_shape,
    static_bytes,
)
from controller.estimator import frameworks as fw
from controller.estimator.calibrated import chunked_logit_bytes
from controller.estimator.settings import DEFAULT_SWITCHES, SWITCH_NAMES
from controller.jobs.profiles import estimate

SMALL = load_shape("llama-3.2-1b")  # 128k vocabulary, 16 layers: the logits weigh
FORMULAS = (Profile.ANALYTIC, Profile.UNSLOTH, Profile.CALIBRATED)


def settings(switches: Switches = DEFAULT_SWITCHES, **kw: object) -> TrainingSettings:
    base: dict[str, object] = {
        "method": Method.FULL,
        "rank": None,
        "seq_len": 8192,
        "profile": Profile.CALIBRATED,
    }
    return TrainingSettings(**(base | kw), switches=switches)  # type: ignore[arg-type]


def on(**kw: object) -> Switches:
    return replace(DEFAULT_SWITCHES, **kw)  # type: ignore[arg-type]


# -- the data file ------------------------------------------------------------------------


def test_every_preset_sets_every_switch_with_a_source() -> None:
    raw = json.loads(resources.files("controller.estimator").joinpath(fw.DATA_FILE).read_text())
    names = {f.name for f in fw.frameworks()}
    assert names == {"huggingface", "torchtune", "litgpt", "unsloth", "axolotl", "llama-factory"}
    for name, entry in raw["frameworks"].items():
        assert set(entry["switches"]) == set(SWITCH_NAMES.values()), name
        for camel, item in entry["switches"].items():
            assert len(item["source"]) > 40, (name, camel)  # a file or page, and its default
    assert set(raw["switches"]) == set(SWITCH_NAMES.values())
    # The documented defaults are the ones today's profiles assume.
    defaults = {c: raw["switches"][c]["default"] for c in SWITCH_NAMES.values()}
    assert fw.parse_switches(defaults, "x")[0] == DEFAULT_SWITCHES


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("huggingface", "huggingface"),
        ("Transformers", "huggingface"),
        ("trl", "huggingface"),
        ("accelerate", "huggingface"),
        ("HF", "huggingface"),
        ("LLaMA-Factory", "llama-factory"),
        ("llama_factory", "llama-factory"),
        ("torchtune", "torchtune"),
        ("Unsloth", "unsloth"),
    ],
)
def test_names_and_aliases_find_their_preset(name: str, expected: str) -> None:
    preset = fw.find(name)
    assert preset is not None and preset.name == expected


def test_presets_read_what_their_sources_say() -> None:
    torchtune = fw.find("torchtune")
    unsloth = fw.find("unsloth")
    hf = fw.find("hf")
    assert torchtune and unsloth and hf
    assert torchtune.switches == Switches(loss=Loss.CHUNKED, fsdp_version=2)
    assert unsloth.switches.loss is Loss.FUSED
    assert unsloth.switches.load_path is LoadPath.WHOLE_MODEL_PER_RANK
    assert unsloth.switches.activation_offloading is Offloading.CPU
    assert hf.switches == Switches(fsdp_version=1)


# -- resolution ---------------------------------------------------------------------------


def test_explicit_switches_override_the_preset() -> None:
    s, errors = build_settings({"framework": "torchtune", "switches": {"loss": "fused"}})
    assert not errors and s is not None
    assert s.switches.loss is Loss.FUSED and s.switches.fsdp_version == 2
    assert s.framework == "torchtune"


def test_unknown_framework_is_a_label_with_default_switches_and_a_note() -> None:
    s, errors = build_settings({"framework": "my-trainer"})
    assert not errors and s is not None
    assert s.switches == DEFAULT_SWITCHES and s.framework == "my-trainer"
    notes = fw.framework_notes(
        s.extras.get(fw.UNKNOWN_FRAMEWORK), s.switches, "training.framework", "t.s"
    )
    assert notes == [
        "training.framework: framework 'my-trainer' is not one vramgate knows: default "
        "switches assumed; known: huggingface (hf, transformers, trl, accelerate), torchtune, "
        "litgpt, unsloth, axolotl, llama-factory"
    ]


def test_a_known_framework_gets_no_unknown_note() -> None:
    s, _ = build_settings({"framework": "trl"})
    assert s is not None and fw.UNKNOWN_FRAMEWORK not in s.extras


def test_bad_switches_name_the_field_and_what_it_allows() -> None:
    _, errors = build_settings(
        {
            "switches": {
                "loss": "streamed",
                "compile": "yes",
                "loadPath": "disk",
                "activationOffloading": "nvme",
                "fsdpVersion": 3,
                "optimizerInBackward": 1,
                "kbitPreparation": "fp32",
                "speed": "fast",
            }
        }
    )
    assert [str(e) for e in errors] == [
        "training.switches.loss: unsupported value 'streamed'; allowed: plain, chunked, fused",
        "training.switches.compile: must be true or false, got 'yes'",
        "training.switches.loadPath: unsupported value 'disk'; allowed: meta-sharded, "
        "whole-model-per-rank",
        "training.switches.activationOffloading: unsupported value 'nvme'; allowed: none, cpu",
        "training.switches.fsdpVersion: unsupported value 3; allowed: 1, 2",
        "training.switches.optimizerInBackward: must be true or false, got 1",
        "training.switches.kbitPreparation: unsupported value 'fp32'; allowed: none, "
        "upcast-norms, upcast-non-quantized",
        "training.switches.speed: unknown switch; allowed: loss, compile, loadPath, "
        "activationOffloading, fsdpVersion, optimizerInBackward, kbitPreparation",
    ]


def test_fused_loss_is_loss_fused_and_may_not_contradict_it() -> None:
    s, _ = build_settings({"framework": "torchtune", "fused_loss": True})
    assert s is not None and s.loss is Loss.FUSED
    _, errors = build_settings({"fused_loss": True, "switches": {"loss": "chunked"}})
    assert [str(e) for e in errors] == [
        "training.fusedLoss: true contradicts training.switches.loss chunked; set only "
        "training.switches.loss"
    ]


def test_optimizer_in_backward_refuses_gradient_accumulation() -> None:
    _, errors = build_settings(
        {"gradient_accumulation": 4, "switches": {"optimizerInBackward": True}}
    )
    assert [e.field for e in errors] == ["training.switches.optimizerInBackward"]
    assert "needs gradient accumulation 1" in errors[0].message


# -- what each switch changes ---------------------------------------------------------------


@pytest.mark.parametrize("profile", FORMULAS)
def test_default_switches_and_an_unknown_label_change_nothing(profile: Profile) -> None:
    plain = estimate(SMALL, settings(profile=profile))
    labelled, _ = build_settings(
        {"method": "full", "seq_len": 8192, "profile": profile.value, "framework": "x"}
    )
    assert labelled is not None
    assert estimate(SMALL, labelled) == plain


def test_calibrated_chunked_loss_holds_the_saved_log_softmax_and_one_chunk() -> None:
    assert chunked_logit_bytes(12.0) == 4 + 8 / fw.loss_chunks()
    lora = {"method": Method.LORA, "rank": 16}  # the loss's backward decides, not the step
    plain = estimate(SMALL, settings(**lora)).total_bytes
    chunked = estimate(SMALL, settings(on(loss=Loss.CHUNKED), **lora)).total_bytes
    fused = estimate(SMALL, settings(on(loss=Loss.FUSED), **lora)).total_bytes
    assert fused < chunked < plain


def test_analytic_chunked_loss_keeps_the_log_softmax_and_one_chunks_gradient() -> None:
    plain = estimate(SMALL, settings(profile=Profile.ANALYTIC)).components["logits"]
    chunked = estimate(SMALL, settings(on(loss=Loss.CHUNKED), profile=Profile.ANALYTIC))
    assert chunked.components["logits"] == plain // 2 + -(-(plain // 2) // fw.loss_chunks())
    fused = estimate(SMALL, settings(on(loss=Loss.FUSED), profile=Profile.ANALYTIC))
    assert fused.components["logits"] == 0


def test_calibrated_optimizer_in_backward_holds_one_gradient_at_a_time() -> None:
    s = settings(seq_len=512)
    static = static_bytes(SMALL, s)
    plain = estimate(SMALL, s)
    assert plain.components["gradients"] == static.gradients  # the step decides
    stepped = estimate(SMALL, replace(s, switches=on(optimizer_in_backward=True)))
    assert stepped.components["gradients"] <= static.largest_gradient
    assert stepped.components["optimizer_scratch"] <= static.largest_scratch
    assert stepped.total_bytes < plain.total_bytes - static.gradients // 2


@pytest.mark.parametrize("profile", [Profile.ANALYTIC, Profile.UNSLOTH])
def test_seed_profiles_optimizer_in_backward_charges_the_largest_gradient(
    profile: Profile,
) -> None:
    s = settings(on(optimizer_in_backward=True), profile=profile)
    est = estimate(SMALL, s)
    assert est.components["gradients"] == static_bytes(SMALL, s).largest_gradient
    assert (
        est.components["gradients"]
        < estimate(SMALL, settings(profile=profile)).components["gradients"]
    )


def test_calibrated_offloaded_activations_leave_one_layer_on_the_gpu() -> None:
    s = settings(seq_len=2048, gradient_checkpointing=Checkpointing.OFF)
    plain = estimate(SMALL, s)
    offloaded = estimate(SMALL, replace(s, switches=on(activation_offloading=Offloading.CPU)))
    assert offloaded.total_bytes < plain.total_bytes
    assert offloaded.components["activations"] < plain.components["activations"] / 2


def test_analytic_offloaded_activations_are_one_layers() -> None:
    plain = estimate(SMALL, settings(profile=Profile.ANALYTIC)).components["activations"]
    s = settings(on(activation_offloading=Offloading.CPU), profile=Profile.ANALYTIC)
    assert estimate(SMALL, s).components["activations"] == -(-plain // SMALL.num_layers)


def test_unsloth_offloaded_activations_are_its_offloaded_checkpointing() -> None:
    offloaded = settings(on(activation_offloading=Offloading.CPU), profile=Profile.UNSLOTH)
    seed_row = settings(profile=Profile.UNSLOTH, gradient_checkpointing=Checkpointing.UNSLOTH)
    plain = estimate(SMALL, settings(profile=Profile.UNSLOTH)).components["activations"]
    assert estimate(SMALL, offloaded).components == estimate(SMALL, seed_row).components
    assert estimate(SMALL, offloaded).components["activations"] < plain


@pytest.mark.parametrize("profile", FORMULAS)
def test_whole_model_per_rank_load_is_a_moment_on_every_gpu(profile: Profile) -> None:
    shape = load_shape("llama-3.1-8b")
    s = settings(seq_len=1024, profile=profile)
    sharded = estimate(shape, s)
    whole = estimate(shape, replace(s, switches=on(load_path=LoadPath.WHOLE_MODEL_PER_RANK)))
    assert whole.total_bytes == sharded.total_bytes  # one GPU: the step holds more
    loaded = whole.components["weights"] + whole.components.get("lora_adapters", 0)
    fixed = whole.fixed_bytes + whole.components.get("cuda_overhead", 0)
    expected = int(loaded * whole.margin) + whole.fixed_bytes + whole.comm_bytes
    if whole.reserve_share:  # calibrated: an FSDP rank's reserve on what is not its weights'
        num, den = whole.fsdp_reserve_share
        reserve = max(0, loaded - whole.resident_bytes // 64) * num // den
        expected = loaded + reserve + whole.fixed_bytes + whole.comm_bytes
    if profile is Profile.UNSLOTH:
        expected = loaded + fixed + whole.comm_bytes
    per_gpu = whole.per_gpu_bytes(64, Parallelism.FSDP)
    assert per_gpu == expected > sharded.per_gpu_bytes(64, Parallelism.FSDP)
    assert whole.most_replicated_bytes >= loaded


def test_compile_is_recorded_not_priced() -> None:
    s = settings(on(compile=True))
    assert estimate(SMALL, s) == estimate(SMALL, settings())
    notes = fw.framework_notes(None, s.switches, "f", "training.switches")
    assert notes == [
        "training.switches.compile: torch.compile is not priced; the estimate is of the eager step"
    ]


def test_summary_names_every_switch() -> None:
    unsloth = fw.find("unsloth")
    assert unsloth is not None
    assert fw.summary(unsloth.switches, "unsloth") == (
        "trainer unsloth: loss fused, compile on (not priced), loadPath whole-model-per-rank, "
        "activationOffloading cpu, fsdpVersion 1 (priced as 2), optimizerInBackward off, "
        "kbitPreparation none"
    )
