"""Bundled presets: the config.json of popular models, shipped as package data.

Each `presets/<name>.json` holds a model's Hugging Face `config.json` as published in its repo,
with the parameter count the model page publishes, so an estimate needs no network access and
the tests can hold the architecture parser to published counts:

    {"name": "llama-3.1-8b", "repo": "meta-llama/Llama-3.1-8B", "family": "llama",
     "published_params": 8030261248, "published_params_note": "...", "config": {...}}

`published_params` is an exact count for exactly the model the config describes, or null with
`published_params_approx` (the headline figure, e.g. "671B") and a note saying why no exact
count applies (vision tower included, MTP module, packed 4-bit storage...).

A hand-read multimodal preset also stores its `tower`: the parts of the model transformers
builds outside the language model the hand reading reads (`controller.estimator.model.tower`),
read once from the built model, so an estimate without the trace extra counts them too.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

from controller.estimator.errors import SpecError, shown

FIELD = "model.preset"
_SUFFIX = ".json"
_REQUIRED = ("name", "repo", "family", "published_params", "published_params_note", "config")


@dataclass(frozen=True)
class Preset:
    """One bundled model. `config` is read-only (nested objects too); lists stay lists."""

    name: str
    repo: str
    family: str
    config: Mapping[str, Any]
    published_params: int | None
    published_params_approx: str | None
    note: str
    #: The stored tower (`model.tower.tower_to_json`), or None for a model without one.
    tower: Mapping[str, Any] | None = None

    def config_dict(self) -> dict[str, Any]:
        """A plain, mutable deep copy of `config` (for JSON output or editing)."""
        thawed: dict[str, Any] = _thaw(self.config)
        return thawed


def _files() -> Any:
    return resources.files("controller.estimator") / "presets"


@cache
def _index() -> tuple[str, ...]:
    return tuple(
        sorted(
            entry.name[: -len(_SUFFIX)]
            for entry in _files().iterdir()
            if entry.name.endswith(_SUFFIX) and entry.is_file()
        )
    )


def preset_names() -> list[str]:
    """The names of all bundled presets, sorted."""
    return list(_index())


def read_by_hand(preset: Preset) -> bool:
    """Whether `parse_config` reads the preset's family by hand; the others' shapes are read
    generically from the model transformers builds (`controller.jobs.profiles.read_shape`,
    with the trace extra), so `load_shape` refuses them."""
    from controller.estimator.model.families import SUPPORTED_MODEL_TYPES

    return preset.config.get("model_type") in SUPPORTED_MODEL_TYPES


def hand_read_preset_names() -> list[str]:
    """The presets whose family is read by hand (`read_by_hand`), sorted: those the pure
    estimator parses without the trace extra."""
    return [name for name in _index() if read_by_hand(_load(name))]


@cache
def _repos() -> dict[str, str]:
    return {_load(name).repo.lower(): name for name in _index()}


def load_preset(name: str) -> Preset:
    """The preset called `name` (case-insensitive; its repo id also works).

    Raises `SpecError` on `model.preset` naming the closest presets when there is none.
    """
    if not isinstance(name, str) or not name.strip():
        raise SpecError(FIELD, "must be a preset name (see `vramgate presets`)")
    key = name.strip().lower()
    if key in _index():
        return _load(key)
    if key in _repos():
        return _load(_repos()[key])
    closest = _closest(key)
    hint = f"; closest: {', '.join(closest)}" if closest else ""
    raise SpecError(FIELD, f"unknown preset {shown(name.strip())}{hint} (see `vramgate presets`)")


def _closest(key: str, limit: int = 5) -> list[str]:
    """Presets named like `key`: those extending it first (mistral-7b: mistral-7b-v0.3, not
    mixtral-8x7b, though difflib scores that one higher), then by similarity."""
    names = _index()
    out = sorted(n for n in names if n.startswith(key) and n != key)
    out += [n for n in difflib.get_close_matches(key, names, n=limit, cutoff=0.5) if n not in out]
    out += [n for n in names if (key in n or n in key) and n not in out]
    return out[:limit]


@cache
def _load(name: str) -> Preset:
    path = _files() / f"{name}{_SUFFIX}"
    data = json.loads(path.read_text(encoding="utf-8"))
    where = f"bundled preset {name}{_SUFFIX}"
    if not isinstance(data, dict) or any(k not in data for k in _REQUIRED):
        raise RuntimeError(f"{where}: needs the keys {', '.join(_REQUIRED)}")
    if data["name"] != name or not isinstance(data["config"], dict):
        raise RuntimeError(f"{where}: 'name' must match the file name and 'config' be an object")
    published = data["published_params"]
    approx = data.get("published_params_approx")
    if published is None and not approx:
        raise RuntimeError(f"{where}: published_params is null, so needs published_params_approx")
    if published is not None and (isinstance(published, bool) or not isinstance(published, int)):
        raise RuntimeError(f"{where}: published_params must be an integer or null")
    return Preset(
        name=name,
        repo=str(data["repo"]),
        family=str(data["family"]),
        config=_freeze(data["config"]),
        published_params=published,
        published_params_approx=str(approx) if approx else None,
        note=str(data["published_params_note"]),
        tower=_freeze(data["tower"]) if isinstance(data.get("tower"), dict) else None,
    )


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_freeze(v) for v in value]
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_thaw(v) for v in value]
    return value
