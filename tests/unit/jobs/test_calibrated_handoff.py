"""Calibrated hands a job to the trace where a family read generically mixes tokens by
something its fits do not price (a state space, a recurrence, a short convolution), instead
of pricing those layers as attention."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from controller.base.errors import ProfileUnavailable
from controller.estimator import Method, Profile, TrainingSettings, load_shape
from controller.jobs import profiles
from controller.jobs.profiles import calibrated_hands_to_trace, estimate
from tests.unit.trace_support import require_trace_extra

CALIBRATED = TrainingSettings(method=Method.LORA, profile=Profile.CALIBRATED, seq_len=256)


def _small(model_type: str, **fields: Any) -> dict[str, Any]:
    from transformers import AutoConfig

    from controller.trace.inventory import cut_layers

    config = cut_layers(AutoConfig.for_model(model_type, **fields), 2).to_dict()
    return {k: v for k, v in config.items() if k != "transformers_version"}


#: LFM2: a short-convolution layer, then an attention layer (both with a gated MLP).
LFM2 = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "num_hidden_layers": 2,
    "layer_types": ["conv", "full_attention"],
}


def test_a_hand_read_shape_is_never_handed_off() -> None:
    assert not calibrated_hands_to_trace(load_shape("llama-3.2-1b"))
    assert not calibrated_hands_to_trace(load_shape("jamba-v0.1"))  # its own hybrid fit


def test_without_the_trace_extra_the_hand_off_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shape = replace(load_shape("llama-3.2-1b"), model_type="rwkv", unpriced_mixers=("attention",))
    assert calibrated_hands_to_trace(shape)
    monkeypatch.setattr(profiles, "trace_extra_installed", lambda: False)
    with pytest.raises(ProfileUnavailable) as info:
        estimate(shape, CALIBRATED, paths={"profile": "spec.estimator.profile"})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("spec.estimator.profile: calibrated has no fit for rwkv's attention")
    assert "pip install 'vramgate[trace]'" in message
    # the other formula profiles still answer (they price every layer as attention)
    assert estimate(shape, replace(CALIBRATED, profile=Profile.ANALYTIC)).profile == "analytic"


def test_a_convolution_layer_sends_calibrated_to_the_trace() -> None:
    require_trace_extra()
    shape = profiles.read_shape(_small("lfm2", **LFM2))
    assert shape.unpriced_mixers == ("conv",)
    assert calibrated_hands_to_trace(shape)
    assert "hands its jobs to the trace profile" in shape.config_warnings[0][1]
    handed = estimate(shape, CALIBRATED)
    traced = estimate(shape, replace(CALIBRATED, profile=Profile.TRACE))
    assert handed.profile == "trace"
    assert handed.components == traced.components


def test_attention_families_read_generically_stay_with_calibrated() -> None:
    require_trace_extra()
    small = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4}
    shape = profiles.read_shape(_small("gpt_neox", vocab_size=1024, **small))
    assert shape.unpriced_mixers == ()
    assert estimate(shape, CALIBRATED).profile == "calibrated"


def test_the_operator_runs_a_handed_off_job_on_its_trace_workers() -> None:
    """A calibrated job that calibrated hands to the trace is a trace to the operator: it
    runs on the trace workers, says Tracing and is kept in status, as a Trace job is."""
    require_trace_extra()
    from controller.jobs.spec import needs_trace, translate

    def spec(config: dict[str, Any]) -> dict[str, Any]:
        return {
            "model": {"config": config},
            "method": "LoRA",
            "lora": {"rank": 16},
            "training": {"sequenceLength": 256},
            "resources": {"gpus": 1},
        }

    handed, errors = translate(spec(_small("lfm2", **LFM2)))
    assert handed is not None, errors
    assert handed.settings.profile is Profile.CALIBRATED and needs_trace(handed)
    small = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4}
    kept, errors = translate(spec(_small("gpt_neox", vocab_size=1024, **small)))
    assert kept is not None, errors
    assert not needs_trace(kept)
