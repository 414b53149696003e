"""The accuracy set (benchmarks/accuracy/runs.yaml) is well formed: every run names its source,
quotes it, says which statistic it measured, and describes a job vramgate accepts.

Not its errors: those are the benchmark's (`python -m benchmarks.accuracy.report`), figures that
change as the estimator does. What is checked is what would make a row of that report
meaningless: a run without an address or a quote, a statistic the report cannot compare like
with like, settings the CLI would refuse, a model that does not resolve.
"""

from __future__ import annotations

import pytest

from benchmarks.accuracy.report import predict
from benchmarks.accuracy.runs import (
    Run,
    form_errors,
    job_of,
    load_document,
    load_runs,
    model_shape,
)
from controller.estimator import Profile, SpecErrors

RUNS = load_runs()
MODELS = load_document().get("models") or {}


def test_the_set_holds_enough_runs_of_each_kind() -> None:
    singles = [r for r in RUNS if r.gpus == 1]
    assert len(singles) >= 25
    assert len(RUNS) - len(singles) >= 15
    assert {r.statistic for r in RUNS} == {"allocated", "reserved", "nvml"}


def test_run_ids_are_unique() -> None:
    ids = [r.id for r in RUNS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.id)
def test_run_is_well_formed(run: Run) -> None:
    assert form_errors(run) == []


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.id)
def test_run_is_a_job_vramgate_accepts(run: Run) -> None:
    _shape, settings = job_of(run, MODELS)
    assert settings.method.value == run.fields["method"]
    assert settings.batch == run.fields["batch"]
    assert settings.seq_len == run.fields["seq_len"]


def test_models_resolve_to_their_published_sizes() -> None:
    """An embedded config that parses to the wrong model would price every run on it wrong:
    each is held to its model card's parameter count (within 1 %)."""
    published = {
        "llama-2-7b": 6.74e9,
        "llama-2-70b": 68.98e9,
        "yi-34b": 34.39e9,
        "qwen1-1.8b": 1.84e9,
        "qwen1-7b": 7.72e9,
        "qwen1-14b": 14.17e9,
        "qwen1-72b": 72.29e9,
    }
    assert set(published) == set(MODELS)
    for name, count in published.items():
        run = Run({"model": name})
        assert model_shape(run, MODELS).total_params == pytest.approx(count, rel=0.01)


def _run(**changes: object) -> Run:
    base = dict(RUNS[0].fields)
    base.update(changes)
    return Run(base)


def test_form_errors_catch_what_makes_a_run_unusable() -> None:
    assert form_errors(_run(source="")) == [f"{RUNS[0].id}: missing source"]
    assert form_errors(_run(quote=" ")) == [f"{RUNS[0].id}: quote is empty"]
    assert form_errors(_run(source="www.example.com"))
    assert form_errors(_run(statistic="peak"))
    assert form_errors(_run(measured={"value": 3, "unit": "TB"}))
    assert form_errors(_run(gpus=2, parallelism="single"))


def test_a_run_the_cli_would_refuse_is_refused() -> None:
    with pytest.raises(SpecErrors, match=r"training\.microBatchSize"):
        job_of(_run(batch=0), MODELS)
    with pytest.raises(SpecErrors, match=r"lora\.targetModules"):
        job_of(_run(lora={"rank": 8, "targets": ["no_such_proj"]}), MODELS)


def test_measured_units_convert_explicitly() -> None:
    assert _run(measured={"value": 1.5, "unit": "GiB"}).measured_bytes == 3 * 2**29
    assert _run(measured={"value": 64, "unit": "GB"}).measured_bytes == 64 * 10**9


def test_predictions_compare_like_with_like() -> None:
    run = next(r for r in RUNS if r.statistic == "reserved")
    allocated = Run({**run.fields, "statistic": "allocated"})
    nvml = Run({**run.fields, "statistic": "nvml"})
    reserved = predict(run, Profile.CALIBRATED, MODELS).predicted
    tensors = predict(allocated, Profile.CALIBRATED, MODELS).predicted
    whole = predict(nvml, Profile.CALIBRATED, MODELS).predicted
    assert whole is not None and reserved is not None and tensors is not None
    assert tensors < reserved < whole
