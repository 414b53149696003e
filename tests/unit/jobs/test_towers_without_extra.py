"""Without the trace extra, a hand-read multimodal config is still estimated: as its language
model, with a note that its tower is not counted; a bundled preset counts its stored tower."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controller.estimator import Method, Profile, TrainingSettings, load_shape
from controller.estimator.model import parse_config
from controller.estimator.model.tower import UNCOUNTED_NOTE, tower_from_json
from controller.estimator.presets import load_preset
from controller.jobs import profiles
from controller.jobs.spec import estimate_plan, translate
from tests.unit.builders.jobs import job


@pytest.fixture
def no_extra(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(profiles, "trace_extra_installed", lambda: False)
    profiles._towers_marshalled.cache_clear()  # a read with the extra is kept by content
    yield
    profiles._towers_marshalled.cache_clear()


@pytest.mark.usefixtures("no_extra")
def test_a_raw_vlm_config_is_its_text_model_with_a_note() -> None:
    config = load_preset("gemma-3-4b").config_dict()
    shape = profiles.read_shape(config, prefix="model.config")
    assert shape.total_params == parse_config(config).total_params
    assert not shape.frozen_linears and not shape.frozen_params
    assert ("model.config", UNCOUNTED_NOTE) in shape.config_warnings
    # a plain image answers, and says so on the job
    plan, errors = translate(job(model={"config": config}, lora={"rank": 16}))
    assert errors == [] and plan is not None
    assert any("only the language model is counted" in w for w in plan.warnings)
    assert estimate_plan(plan).total_bytes > 0


@pytest.mark.usefixtures("no_extra")
def test_a_preset_counts_its_stored_tower_without_the_extra() -> None:
    preset = load_preset("gemma-3-4b")
    assert preset.tower is not None
    tower = tower_from_json(preset.tower)
    text = parse_config(preset.config)
    shape = load_shape("gemma-3-4b")
    # the page's exact total, the SigLIP tower and projector included
    assert shape.total_params == text.total_params + tower.params == 4_300_079_472
    plan, errors = translate(job(model={"preset": "gemma-3-4b"}, lora={"rank": 16}))
    assert errors == [] and plan is not None and plan.warnings == ()
    settings = TrainingSettings(method=Method.LORA, profile=Profile.CALIBRATED)
    with_tower = profiles.estimate(shape, settings)
    text_only = profiles.estimate(text, settings)
    assert with_tower.total_bytes > text_only.total_bytes
    assert with_tower.trainable_params == text_only.trainable_params  # all-linear: no tower
