"""The trainer's k-bit preparation (`Switches.kbit_preparation`): what it casts to fp32, and
what each formula profile charges for it.

The upcast bytes are computed here from the model's own parameter counts (every parameter
that is not 4-bit, or the norms alone), not read back from the code under test."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.estimator import (
    KbitPreparation,
    Method,
    ModelShape,
    Precision,
    Profile,
    Switches,
    TrainingSettings,
    build_settings,
    load_shape,
)
from controller.estimator.storage import upcast_bytes
from controller.jobs.profiles import estimate

SHAPE = load_shape("llama-3.2-1b")  # tied embeddings: the one weight is cast once
UNTIED = load_shape("mistral-7b-v0.1")
QLORA = TrainingSettings(method=Method.QLORA, seq_len=2048, batch=2, profile=Profile.CALIBRATED)
NONE, NORMS, ALL = KbitPreparation


def prepared(kind: KbitPreparation, base: TrainingSettings = QLORA) -> TrainingSettings:
    return replace(base, switches=Switches(kbit_preparation=kind))


def norm_params(shape: ModelShape) -> int:
    """Each layer's parameters outside its linears (Llama's and Mistral's: two RMSNorms) and
    the final norm."""
    per_layer = sum(sum(layer.other_tensors) * count for layer, count in shape.layer_counts)
    return per_layer + shape.final_norm_params


def non_quantized_params(shape: ModelShape) -> int:
    """What stays 16-bit under QLoRA in these models (no biases, no routers): the norms, the
    embedding and an untied LM head."""
    return norm_params(shape) + shape.embedding_params + shape.lm_head_params


def test_the_switch_parses_in_both_spellings_and_a_bad_value_names_the_field() -> None:
    for raw in ("upcast-non-quantized", "UpcastNonQuantized"):
        s, errors = build_settings({"switches": {"kbitPreparation": raw}})
        assert not errors and s is not None and s.switches.kbit_preparation is ALL
    _, errors = build_settings({"switches": {"kbitPreparation": True}}, api=True)
    assert [str(e) for e in errors] == [
        "training.switches.kbitPreparation: unsupported value True; allowed: None, "
        "UpcastNorms, UpcastNonQuantized"
    ]


@pytest.mark.parametrize("shape", [SHAPE, UNTIED], ids=["tied", "untied"])
def test_upcast_bytes_are_two_more_bytes_per_parameter_cast(shape: ModelShape) -> None:
    assert upcast_bytes(shape, prepared(NONE)) == 0
    assert upcast_bytes(shape, prepared(NORMS)) == 2 * norm_params(shape)
    assert upcast_bytes(shape, prepared(ALL)) == 2 * non_quantized_params(shape)


@pytest.mark.parametrize("method", [Method.LORA, Method.FULL])
def test_only_a_4bit_model_is_prepared(method: Method) -> None:
    base = replace(QLORA, method=method, rank=None if method is Method.FULL else 16)
    plain = estimate(SHAPE, base)
    assert estimate(SHAPE, prepared(ALL, base)).total_bytes == plain.total_bytes
    fp32 = replace(QLORA, precision=Precision.FP32)  # nothing left to widen
    assert upcast_bytes(SHAPE, prepared(ALL, fp32)) == 0


@pytest.mark.parametrize("profile", [Profile.CALIBRATED, Profile.ANALYTIC])
@pytest.mark.parametrize("kind", [NORMS, ALL])
def test_profiles_charge_the_upcast_weights_and_wider_activations(
    profile: Profile, kind: KbitPreparation
) -> None:
    base = replace(QLORA, profile=profile)
    plain, upcast = estimate(UNTIED, base), estimate(UNTIED, prepared(kind, base))
    cast = 2 * (non_quantized_params(UNTIED) if kind is ALL else norm_params(UNTIED))
    assert upcast.components["weights"] - plain.components["weights"] == cast
    # The fp32 residual stream: at least every layer's checkpoint but one two bytes wider.
    checkpoints = (UNTIED.num_layers - 1) * base.batch * base.seq_len * UNTIED.hidden_size * 2
    assert upcast.total_bytes - plain.total_bytes >= cast + checkpoints


def test_switch_off_is_the_estimate_without_switches() -> None:
    assert estimate(UNTIED, prepared(NONE)) == estimate(UNTIED, QLORA)


def test_a_preparation_that_cannot_apply_is_said_to_be_ignored() -> None:
    from controller.estimator import context_warnings

    def notes(settings: TrainingSettings) -> list[str]:
        return [line for line in context_warnings(SHAPE, settings) if "kbitPreparation" in line]

    assert notes(prepared(NORMS)) == []  # QLoRA in bf16: it applies, nothing to say
    assert notes(prepared(NONE, replace(QLORA, method=Method.FULL))) == []
    full = notes(prepared(NORMS, replace(QLORA, method=Method.FULL)))
    assert len(full) == 1 and "not 4-bit" in full[0] and "ignored" in full[0]
    fp32 = notes(prepared(ALL, replace(QLORA, precision=Precision.FP32)))
    assert len(fp32) == 1 and "fp32" in fp32[0]
