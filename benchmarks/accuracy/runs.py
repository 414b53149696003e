"""The validation set: published, measured runs (`runs.yaml`) as estimator inputs.

    runs = load_runs()                       # every run, its source's shared keys merged in
    shape, settings = job_of(runs[0])        # what vramgate would be asked to estimate

Each run goes through the same `build_settings` and `check_against_model` that the CLI and the
webhook use, so a run the estimator would refuse is refused here too, with the same message,
instead of being priced on settings no user could submit.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from controller.estimator import (
    ModelShape,
    Parallelism,
    SpecError,
    SpecErrors,
    TrainingSettings,
    build_settings,
    check_against_model,
    load_shape,
    parse_config,
    preset_names,
)

RUNS_FILE = Path(__file__).with_name("runs.yaml")

#: What each statistic is, as `runs.yaml`'s header explains.
STATISTICS = ("allocated", "reserved", "nvml")
#: Bytes per unit as written in a source. "G" is how some tables abbreviate GB; "B" is bytes.
UNITS = {"GiB": 2**30, "MiB": 2**20, "GB": 10**9, "G": 10**9, "B": 1}
#: How a run spread over its GPUs, in the set's words, and vramgate's parallelism for each.
PARALLELISMS = {
    "single": Parallelism.FSDP,  # one GPU: every parallelism holds the whole job
    "ddp": Parallelism.DDP,
    "fsdp": Parallelism.FSDP,
}
METHODS = ("full", "lora", "qlora")
REQUIRED = (
    "id",
    "source",
    "quote",
    "statistic",
    "statistic_stated",
    "measured",
    "model",
    "method",
    "batch",
    "seq_len",
    "gradient_accumulation",
    "gradient_checkpointing",
    "optimizer",
    "precision",
    "gpus",
    "parallelism",
    "framework",
)
#: Run keys that become `build_settings` values under the same name.
_SETTING_KEYS = (
    "method",
    "batch",
    "seq_len",
    "gradient_accumulation",
    "gradient_checkpointing",
    "optimizer",
    "precision",
    "attention",
    "fused_loss",
    "framework",
    "switches",
)


@dataclass(frozen=True)
class Run:
    """One published measurement and the job that produced it (a source's keys merged in)."""

    fields: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.fields["id"])

    @property
    def statistic(self) -> str:
        return str(self.fields["statistic"])

    @property
    def gpus(self) -> int:
        return int(self.fields["gpus"])

    @property
    def parallelism(self) -> Parallelism:
        return PARALLELISMS[self.fields["parallelism"]]

    @property
    def measured_bytes(self) -> int:
        measured = self.fields["measured"]
        return int(Fraction(str(measured["value"])) * UNITS[measured["unit"]])

    @property
    def unmodelled(self) -> tuple[str, ...]:
        """What the run did that vramgate's settings cannot say."""
        return tuple(self.fields.get("unmodelled") or ())


def load_document(path: Path = RUNS_FILE) -> dict[str, Any]:
    with path.open(encoding="utf-8") as handle:
        document: dict[str, Any] = yaml.safe_load(handle)
    return document


def load_runs(path: Path = RUNS_FILE) -> list[Run]:
    """Every run, with its source's shared keys under its own (a run's key wins)."""
    document = load_document(path)
    sources = document.get("sources") or {}
    runs = []
    for raw in document["runs"]:
        shared = dict(sources.get(raw.get("from"), {})) if raw.get("from") else {}
        runs.append(Run({**shared, **raw}))
    return runs


def model_shape(run: Run, models: dict[str, Any]) -> ModelShape:
    """The run's model: a config of `runs.yaml`'s `models:`, else a bundled preset."""
    name = run.fields["model"]
    if name in models:
        return parse_config(models[name]["config"], prefix=f"models.{name}")
    if name not in preset_names():
        raise SpecError("model", f"{name!r} is neither a preset nor a model of runs.yaml")
    return load_shape(name)


def _switch(value: object) -> object:
    """YAML reads a bare `on` / `off` as a boolean; the settings want the word."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


def settings_values(run: Run) -> dict[str, object]:
    """The run as `build_settings` values (TrainingSettings field names)."""
    values: dict[str, object] = {
        key: _switch(run.fields[key]) if key == "gradient_checkpointing" else run.fields[key]
        for key in _SETTING_KEYS
        if key in run.fields
    }
    lora = run.fields.get("lora") or {}
    if run.fields["method"] == "full":
        values["rank"] = None
    else:
        values["rank"] = lora.get("rank")
        values["targets"] = list(lora.get("targets") or ["all-linear"])
        if lora.get("modules_to_save"):
            values["modules_to_save"] = list(lora["modules_to_save"])
    return values


def job_of(run: Run, models: dict[str, Any]) -> tuple[ModelShape, TrainingSettings]:
    """The model and settings vramgate estimates for this run; SpecErrors if any is invalid,
    with the errors the CLI would print."""
    shape = model_shape(run, models)
    settings, errors = build_settings(settings_values(run))
    if settings is None:
        raise SpecErrors(errors)
    settings, errors = check_against_model(shape, settings)
    if errors:
        raise SpecErrors(errors)
    return shape, settings


def form_errors(run: Run) -> list[str]:
    """What makes a run ill-formed (missing fields, unknown kinds, no source address), as
    messages naming the run; empty for a well-formed run. The job's own validity is
    `job_of`'s."""
    fields = run.fields
    where = fields.get("id", "<no id>")
    errors = [f"{where}: missing {key}" for key in REQUIRED if fields.get(key) in (None, "")]
    if errors:
        return errors
    if not str(fields["source"]).startswith("https://"):
        errors.append(f"{where}: source must be an https:// address")
    if not str(fields["quote"]).strip():
        errors.append(f"{where}: quote is empty")
    if fields["statistic"] not in STATISTICS:
        errors.append(f"{where}: statistic must be one of {', '.join(STATISTICS)}")
    if not isinstance(fields["statistic_stated"], bool):
        errors.append(f"{where}: statistic_stated must be true or false")
    measured = fields["measured"]
    if not isinstance(measured, dict) or measured.get("unit") not in UNITS:
        errors.append(f"{where}: measured needs a value and a unit of {', '.join(UNITS)}")
    elif not isinstance(measured.get("value"), int | float) or measured["value"] <= 0:
        errors.append(f"{where}: measured value must be a positive number")
    if fields["method"] not in METHODS:
        errors.append(f"{where}: method must be one of {', '.join(METHODS)}")
    if fields["parallelism"] not in PARALLELISMS:
        errors.append(f"{where}: parallelism must be one of {', '.join(PARALLELISMS)}")
    gpus = fields["gpus"]
    if not isinstance(gpus, int) or gpus < 1:
        errors.append(f"{where}: gpus must be a positive integer")
    elif (gpus == 1) != (fields["parallelism"] == "single"):
        errors.append(f"{where}: parallelism single means exactly one GPU")
    return errors
