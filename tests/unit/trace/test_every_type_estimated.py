"""Every causal-LM and image-text-to-text model type of the installed transformers, estimated.

Each type's own default config (`test_inventory_all_types.default_config`, with its fixes) is
cut to two decoder layers and estimated twice, as a job of that model would be: by the
operator's default profile (calibrated, through `read_shape` and `estimate`: the hand reading
of its family, else the generic reading of the built model) and by the trace (LoRA, batch 1,
16 tokens). Both must count the parameters transformers reports for the model built on the
meta device with the class the operator builds the config with (`inventory.auto_class_for`:
a type both mappings list is one job, built as a vision-language model where its config has
a vision tower). A type that cannot be estimated here is a strict xfail with why; once it
can, the test says so and the entry goes.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.trace_support import require_trace_extra

require_trace_extra()

from controller.estimator import Profile, TrainingSettings  # noqa: E402
from controller.estimator.settings import Checkpointing, Method  # noqa: E402
from controller.jobs.profiles import estimate, read_shape  # noqa: E402
from controller.trace.inventory import (  # noqa: E402
    auto_class_for,
    build_meta_model,
    cut_layers,
    mapping,
)
from tests.unit.trace.test_inventory_all_types import (  # noqa: E402
    CANNOT_BUILD,
    CAUSAL,
    OWN_DEPTH,
    VLM,
    default_config,
)

#: The trace's job: the cheapest step that runs every module of the language model (no
#: checkpointing: its recomputation doubles the forward's ops, and a few classes refuse it).
TRACED = TrainingSettings(
    profile=Profile.TRACE,
    method=Method.LORA,
    batch=1,
    seq_len=16,
    gradient_checkpointing=Checkpointing.OFF,
)
DEFAULT = TrainingSettings(profile=Profile.CALIBRATED, method=Method.LORA, seq_len=16)

#: Types whose default profile's estimate does not count what transformers builds, with why.
ESTIMATE_FAILS: dict[str, str] = {}
#: Types the trace cannot estimate here, with why.
TRACE_FAILS: dict[str, str] = {}


def job_config(model_type: str) -> dict[str, Any]:
    """The type's default config (fixed where it must be), cut to two decoder layers (at its
    own depth where a cut cannot build), as the config.json a job would carry."""
    from transformers import AutoConfig

    raw = default_config(model_type)
    raw.pop("model_type", None)
    cfg = AutoConfig.for_model(model_type, **raw)
    if model_type not in OWN_DEPTH:
        cfg = cut_layers(cfg, 2)
    config = cfg.to_dict()
    config.pop("transformers_version", None)
    return config


def _types() -> list[str]:
    return sorted(set(mapping(CAUSAL)) | set(mapping(VLM)))


def _cases(fails: dict[str, str]) -> list[Any]:
    cases = []
    for model_type in _types():
        reason = CANNOT_BUILD.get(model_type) or fails.get(model_type)
        marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
        cases.append(pytest.param(model_type, marks=marks, id=model_type))
    return cases


def _meta_params(config: dict[str, Any]) -> int:
    """What transformers reports for the model the operator builds `config` as."""
    model_type = config["model_type"]
    model, _, _, _ = build_meta_model(config, auto=auto_class_for(model_type, config))
    return int(model.num_parameters())


@pytest.mark.parametrize("model_type", _cases(ESTIMATE_FAILS))
def test_the_default_profile_counts_what_transformers_builds(model_type: str) -> None:
    config = job_config(model_type)
    est = estimate(read_shape(config), DEFAULT)
    assert est.total_bytes > 0 and sum(est.components.values()) == est.total_bytes
    assert est.trainable_params > 0  # the adapters, which the total counts too
    assert est.total_params - est.trainable_params == _meta_params(config)


@pytest.mark.parametrize("model_type", _cases(TRACE_FAILS))
def test_the_trace_counts_what_transformers_builds(model_type: str) -> None:
    config = job_config(model_type)
    est = estimate(read_shape(config), TRACED)
    assert est.total_bytes > 0 and est.trainable_params > 0
    assert est.total_params - est.trainable_params == _meta_params(config)


def test_the_tables_name_real_types() -> None:
    listed = set(_types())
    for table in (ESTIMATE_FAILS, TRACE_FAILS):
        assert set(table) <= listed, set(table) - listed
