"""Training frameworks as the estimator reads them: a name -> the switches that change memory.

    switches, name, errors = resolve("trl", {"loss": "Chunked"})

`frameworks.json` (package data) holds each preset (Hugging Face, torchtune, LitGPT, Unsloth,
axolotl, LLaMA-Factory), its aliases, and every switch value with the file or page of that
project that sets it and the default read there. A job names a framework
(`spec.training.framework`, `vramgate estimate --framework`) and may override any switch on
its own (`spec.training.switches`, the CLI's switch flags); the overrides win.

A framework vramgate does not know stays a label, as it was before the presets existed: it
gets the default switches (`settings.DEFAULT_SWITCHES`: what the profiles priced before, so
its estimate is unchanged) and a note naming the known ones (`framework_notes`). Pure: the
data file is read once per process.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

from controller.estimator.errors import SpecError, shown
from controller.estimator.settings import (
    DEFAULT_SWITCHES,
    FSDP_VERSIONS,
    SWITCH_NAMES,
    Choice,
    KbitPreparation,
    LoadPath,
    Loss,
    Offloading,
    Switches,
    switch_path,
)

DATA_FILE = "frameworks.json"
#: `TrainingSettings.extras` key of a framework name vramgate does not know.
UNKNOWN_FRAMEWORK = "framework"
#: The camelCase switch name -> its Switches field.
_FIELDS = {camel: name for name, camel in SWITCH_NAMES.items()}
_ENUMS: dict[str, type[Choice]] = {
    "loss": Loss,
    "load_path": LoadPath,
    "activation_offloading": Offloading,
    "kbit_preparation": KbitPreparation,
}
_BOOLS = ("compile", "optimizer_in_backward")


@dataclass(frozen=True)
class Framework:
    """One preset: its canonical name, how people call it, its switches, and for each switch
    (camelCase name) where the framework sets that value."""

    name: str
    title: str
    aliases: tuple[str, ...]
    switches: Switches
    sources: Mapping[str, str]


def _key(text: str) -> str:
    return text.lower().replace("-", "").replace("_", "").replace(" ", "")


@cache
def _data() -> dict[str, Any]:
    text = resources.files("controller.estimator").joinpath(DATA_FILE).read_text()
    data: dict[str, Any] = json.loads(text)
    return data


@cache
def frameworks() -> tuple[Framework, ...]:
    """Every preset, in the data file's order."""
    out = []
    for name, entry in _data()["frameworks"].items():
        values = {camel: item["value"] for camel, item in entry["switches"].items()}
        switches, errors = parse_switches(values, f"frameworks.json {name}")
        if errors or set(values) != set(_FIELDS):
            raise ValueError(f"frameworks.json: {name} must set every switch validly: {errors}")
        sources = {camel: item["source"] for camel, item in entry["switches"].items()}
        out.append(
            Framework(
                name=name,
                title=entry["title"],
                aliases=tuple(entry["aliases"]),
                switches=switches,
                sources=MappingProxyType(sources),
            )
        )
    return tuple(out)


@cache
def _by_key() -> dict[str, Framework]:
    table = {}
    for framework in frameworks():
        for spelling in (framework.name, *framework.aliases):
            table[_key(spelling)] = framework
    return table


def find(name: str) -> Framework | None:
    """The preset `name` spells (its name or an alias, case and `-`/`_` aside), or None."""
    return _by_key().get(_key(name))


@cache
def loss_chunks() -> int:
    """How many chunks a chunked loss splits the tokens into (`loss_chunks` in the data
    file, torchtune's default): the fp32 logits of one chunk are held at a time."""
    value: int = _data()["loss_chunks"]["value"]
    return value


def known_names() -> str:
    """`huggingface (hf, transformers, ...), torchtune, ...`: how notes list the presets."""
    parts = []
    for framework in frameworks():
        aliases = f" ({', '.join(framework.aliases)})" if framework.aliases else ""
        parts.append(framework.name + aliases)
    return ", ".join(parts)


def parse_switches(
    values: Mapping[str, object],
    path: str,
    base: Switches = DEFAULT_SWITCHES,
    api: bool = False,
    paths: Mapping[str, str] | None = None,
) -> tuple[Switches, list[SpecError]]:
    """`base` with the switches `values` sets (camelCase names), and every error at
    `path.<name>` (or where `paths` names that switch: `settings.switch_path`). `api`:
    messages list the API's CamelCase spellings (a spec) rather than the lower-case tokens
    (the CLI, the data file)."""
    errors: list[SpecError] = []
    changes: dict[str, object] = {}
    for camel, raw in values.items():
        where = switch_path(str(camel), path, paths)
        name = _FIELDS.get(str(camel))
        if name is None:
            errors.append(SpecError(where, f"unknown switch; allowed: {', '.join(_FIELDS)}"))
            continue
        if raw is None:
            errors.append(SpecError(where, "must not be null; leave it out for the preset's"))
            continue
        if name in _ENUMS:
            enum = _ENUMS[name]
            try:
                changes[name] = enum.parse(raw, where)
            except SpecError:
                spell = ", ".join(m.api if api else m.value for m in enum)
                errors.append(SpecError(where, f"unsupported value {shown(raw)}; allowed: {spell}"))
        elif name in _BOOLS:
            if isinstance(raw, bool):
                changes[name] = raw
            else:
                errors.append(SpecError(where, f"must be true or false, got {shown(raw)}"))
        elif isinstance(raw, int) and not isinstance(raw, bool) and raw in FSDP_VERSIONS:
            changes[name] = raw
        else:
            allowed = ", ".join(str(v) for v in FSDP_VERSIONS)
            errors.append(SpecError(where, f"unsupported value {shown(raw)}; allowed: {allowed}"))
    return (replace(base, **changes) if changes else base), errors  # type: ignore[arg-type]


@dataclass(frozen=True)
class Resolved:
    """What a job's framework and switches come to: the switches, the preset's name (None
    when the job names none or one vramgate does not know) and the label as given."""

    switches: Switches
    preset: str | None
    label: str | None


def resolve(
    framework: object,
    overrides: object,
    *,
    framework_path: str = "training.framework",
    switches_path: str = "training.switches",
    fused_loss: bool = False,
    fused_loss_path: str = "training.fusedLoss",
    api: bool = False,
    switch_paths: Mapping[str, str] | None = None,
) -> tuple[Resolved, list[SpecError]]:
    """The switches of a job: its preset's (the defaults for none, or for a name vramgate
    does not know), then `fused_loss` (the older spelling of `loss: fused`), then each
    override. A `fused_loss` that an explicit `loss` contradicts is an error, not a guess.
    `switch_paths`: where errors name a switch of its own (`settings.switch_path`; the CLI's
    flags), else under `switches_path`."""
    errors: list[SpecError] = []
    label = framework.strip() if isinstance(framework, str) and framework.strip() else None
    preset = find(label) if label is not None else None
    base = preset.switches if preset is not None else DEFAULT_SWITCHES
    if fused_loss:
        base = replace(base, loss=Loss.FUSED)
    values: Mapping[str, object] = {}
    if overrides is not None:
        if isinstance(overrides, Mapping):
            values = overrides
        else:
            errors.append(SpecError(switches_path, "must be an object of switch: value"))
    switches, switch_errors = parse_switches(values, switches_path, base, api, switch_paths)
    errors += switch_errors
    if fused_loss and switches.loss is not Loss.FUSED:
        spelled = switches.loss.api if api else switches.loss.value
        loss_path = switch_path("loss", switches_path, switch_paths)
        errors.append(
            SpecError(
                fused_loss_path, f"true contradicts {loss_path} {spelled}; set only {loss_path}"
            )
        )
    return Resolved(switches, preset.name if preset else None, label), errors


def framework_notes(
    label: str | None,
    switches: Switches,
    framework_path: str,
    switches_path: str,
    switch_paths: Mapping[str, str] | None = None,
) -> list[str]:
    """One line per thing about the trainer the estimate takes on trust: a framework name
    vramgate does not know (default switches), torch.compile (not priced). `switch_paths`
    as in `resolve`."""
    lines = []
    if label is not None:
        lines.append(
            f"{framework_path}: framework {shown(label)} is not one vramgate knows: default "
            f"switches assumed; known: {known_names()}"
        )
    if switches.compile:
        lines.append(
            f"{switch_path('compile', switches_path, switch_paths)}: torch.compile is not "
            "priced; the estimate is of the "
            "eager step"
        )
    return lines


def describe(switches: Switches, api: bool = True) -> dict[str, object]:
    """The switches by their camelCase names, values in the API's spelling (`api`) or the
    CLI's lower-case tokens."""
    out: dict[str, object] = {}
    for name, camel in SWITCH_NAMES.items():
        value = getattr(switches, name)
        if isinstance(value, Choice):
            value = value.api if api else value.value
        out[camel] = value
    return out


#: What the estimate does with each switch, as `summary` says it.
_UNPRICED = {"compile": "not priced", "fsdpVersion": "priced as 2"}


def summary(switches: Switches, framework: str | None) -> str:
    """One line for people: `trainer torchtune: loss chunked, compile off (not priced), ...`."""
    parts = []
    for camel, value in describe(switches, api=False).items():
        shown_value = ("on" if value else "off") if isinstance(value, bool) else str(value)
        note = _UNPRICED.get(camel)
        if (camel == "compile" and not value) or (camel == "fsdpVersion" and value == 2):
            note = None
        parts.append(f"{camel} {shown_value}" + (f" ({note})" if note else ""))
    return f"trainer {framework or '(none named)'}: " + ", ".join(parts)
