"""One settings loader for the operator and the agent: flag > environment > config file > default.

Why one loader built from a pydantic model: every field gets its flag (``--poll-interval-seconds``),
its environment variable (``VRAMGATE_AGENT_POLL_INTERVAL_SECONDS``), its config-file key
(``pollIntervalSeconds``, camelCase like the rest of the API) and its ``--help`` text from its
name and description, so the four cannot drift apart, and a Helm chart can set any of them.
Bad values fail at start with one line naming where the value came from and what is allowed.

Kinds of fields, and how each source spells them:

* lists: a repeatable flag (``--cert-host a --cert-host b``), a comma-separated environment
  variable (``a,b``; empty means the empty list), a YAML list in the file;
* booleans: ``--x`` / ``--no-x``, an environment variable ``true`` / ``false``, a YAML bool;
* everything else: the string as typed, parsed and checked by the model.

A field's flag may be given other spellings (``-n``, a singular ``--namespace`` for
``namespaces``) with `Flag` in its annotation, so an existing command line keeps working.
"""

from __future__ import annotations

import argparse
import enum
import os
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, Union, get_args, get_origin

import yaml
from annotated_types import GroupedMetadata
from pydantic import BaseModel, BeforeValidator, PlainValidator, ValidationError, WrapValidator
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from controller.base.errors import DeploymentError

M = TypeVar("M", bound=BaseModel)


#: The longest interval a setting takes, in seconds: a year. Longer means "never" in effect,
#: and would overflow the dates and timers it feeds; the chart's schema has the same maximum.
MAX_SECONDS = 365 * 24 * 3600


class SettingsError(DeploymentError):
    """Bad configuration: one line naming the setting, its source and what it allows."""


@dataclass(frozen=True)
class Flag:
    """Command-line spellings of a field instead of the one made from its name, and its
    metavar; put in the field's annotation: ``Annotated[list[str], Flag("-n", "--namespace")]``."""

    spellings: tuple[str, ...] = ()
    metavar: str | None = None

    def __init__(self, *spellings: str, metavar: str | None = None) -> None:
        object.__setattr__(self, "spellings", spellings)
        object.__setattr__(self, "metavar", metavar)


def _unwrap_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _is_list(annotation: Any) -> bool:
    return get_origin(_unwrap_optional(annotation)) in (list, tuple)


def _choices(annotation: Any) -> tuple[str, ...]:
    inner = _unwrap_optional(annotation)
    if get_origin(inner) is Literal:
        return tuple(str(a) for a in get_args(inner))
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        return tuple(str(m.value) for m in inner)
    return ()


class SettingsLoader(Generic[M]):
    """Flags, environment variables and config-file keys of one settings model.

    `typed_flags`: flags of numbers and choices are parsed by argparse itself (``argument
    --webhook: invalid choice``), as the operator's command line always did; without it
    every flag is a string checked by the model, as the agent's always was.
    `shown_defaults`: how ``--help`` shows a default whose value reads badly (bytes).
    """

    def __init__(
        self,
        model: type[M],
        env_prefix: str,
        *,
        typed_flags: bool = False,
        shown_defaults: Mapping[str, str] | None = None,
    ) -> None:
        self.model = model
        self.env_prefix = env_prefix
        self.config_env = f"{env_prefix}CONFIG"
        self.typed_flags = typed_flags
        self.shown_defaults = dict(shown_defaults or {})
        self.fields: dict[str, FieldInfo] = dict(model.model_fields)

    # -- names ------------------------------------------------------------------------------

    def flag(self, name: str) -> str:
        """The flag users see in messages: the field's own long flag, or its first long one."""
        spellings = self._spellings(name)
        return next((s for s in spellings if s.startswith("--")), spellings[0])

    def env_var(self, name: str) -> str:
        return self.env_prefix + name.upper()

    def key(self, name: str) -> str:
        return to_camel(name)

    def _flag_meta(self, name: str) -> Flag | None:
        return next((m for m in self.fields[name].metadata if isinstance(m, Flag)), None)

    def _spellings(self, name: str) -> tuple[str, ...]:
        meta = self._flag_meta(name)
        return meta.spellings if meta and meta.spellings else ("--" + name.replace("_", "-"),)

    # -- the parser -------------------------------------------------------------------------

    def add_arguments(self, parser: argparse.ArgumentParser, example: str | None) -> None:
        """``--config`` and one flag per field; each help names its environment variable and
        default. `example` shows a line of the config file in ``--config``'s help.

        `example` None: the flags only, for a command that reads no environment and no file
        (load it with ``environ={}``): no ``--config``, and each help names just its default.
        """
        if example is not None:
            parser.add_argument(
                "--config",
                metavar="FILE",
                help=f"YAML config file of camelCase keys, e.g. {example} (env {self.config_env})",
            )
        for name, info in self.fields.items():
            argument = self._argument(name, info, env=example is not None)
            parser.add_argument(*self._spellings(name), dest=name, **argument)

    def _argument(self, name: str, info: FieldInfo, *, env: bool = True) -> dict[str, Any]:
        annotation = info.annotation
        notes = ["repeat"] if _is_list(annotation) else []
        notes += [f"env {self.env_var(name)}"] if env else []
        default = self._default_text(name)
        notes += [default] if default else []
        help_text = f"{info.description} ({'; '.join(notes)})" if notes else f"{info.description}"
        inner = _unwrap_optional(annotation)
        meta = self._flag_meta(name)
        choices = _choices(annotation)
        metavar = (
            meta.metavar
            if meta and meta.metavar
            else ("|".join(choices) if choices else name.split("_")[-1].upper())
        )
        if inner is bool:
            return {"action": argparse.BooleanOptionalAction, "default": None, "help": help_text}
        if _is_list(annotation):
            return {"action": "append", "default": None, "metavar": metavar, "help": help_text}
        argument: dict[str, Any] = {"metavar": metavar, "help": help_text}
        if self.typed_flags:
            if choices:
                argument.update(choices=choices, metavar=None)
            elif inner in (int, float) and not self._parses_itself(info):
                argument["type"] = inner
        return argument

    @staticmethod
    def _parses_itself(info: FieldInfo) -> bool:
        """Whether the field reads its own strings (a size like ``2GiB`` into bytes): a
        validator in its metadata, or in a group there (`controller.base.units.Bytes`)."""
        kinds = (BeforeValidator, PlainValidator, WrapValidator)
        unpacked = (
            part
            for meta in info.metadata
            for part in (meta if isinstance(meta, GroupedMetadata) else (meta,))
        )
        return any(isinstance(part, kinds) for part in unpacked)

    def _default_text(self, name: str) -> str:
        info = self.fields[name]
        if name in self.shown_defaults:
            return f"default {self.shown_defaults[name]}"
        if info.is_required():
            return ""
        default = info.get_default(call_default_factory=True, validated_data={})
        if default is None:
            return ""
        if isinstance(default, bool):
            return f"default {'true' if default else 'false'}"
        if isinstance(default, (list, tuple)):
            return f"default {','.join(map(str, default)) or 'none'}"
        if isinstance(default, enum.Enum):
            return f"default {default.value}"
        return f"default {default}"

    # -- loading ----------------------------------------------------------------------------

    def load(
        self,
        args: argparse.Namespace,
        environ: Mapping[str, str] = os.environ,
        *,
        defaults: Mapping[str, Any] | None = None,
        flags: Mapping[str, tuple[Any, str]] | None = None,
    ) -> M:
        """Merge the sources (flag > env > config file > default) and validate once.

        `defaults` replace the model's defaults where they depend on the environment
        ($POD_NAMESPACE); `flags` are values that other flags imply (``-A``: every
        namespace), each with the flag to name in an error; a field's own flag wins.
        """
        values: dict[str, Any] = dict(defaults or {})
        sources: dict[str, str] = {name: "default" for name in values}
        config = getattr(args, "config", None) or environ.get(self.config_env)
        if config:
            where = "--config" if getattr(args, "config", None) else self.config_env
            for name, value in self.read_config(config, where).items():
                values[name], sources[name] = value, f"{self.key(name)} in {config}"
        for name in self.fields:
            env = self.env_var(name)
            if env in environ:
                values[name], sources[name] = self._from_env(name, environ[env]), env
        for name, (value, source) in (flags or {}).items():
            values[name], sources[name] = value, source
        for name in self.fields:
            given = getattr(args, name, None)
            if given is not None:
                values[name], sources[name] = given, self.flag(name)
        try:
            return self.model.model_validate(values)
        except ValidationError as error:
            raise SettingsError(self._one_line(error, values, sources)) from None

    def _from_env(self, name: str, text: str) -> Any:
        if _is_list(self.fields[name].annotation):
            return [part.strip() for part in text.split(",") if part.strip()]
        return text

    def read_config(self, path: str, source: str) -> dict[str, Any]:
        """The file's values by field name; an unknown key is an error naming the allowed."""
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as error:
            raise SettingsError(f"{source}: cannot read {path}: {error.strerror}") from None
        except yaml.YAMLError as error:
            detail = " ".join(str(error).split())
            raise SettingsError(f"{source}: {path} is not valid YAML: {detail}") from None
        if not isinstance(data, dict):
            raise SettingsError(f"{source}: {path} must hold a mapping of camelCase keys")
        by_key = {self.key(name): name for name in self.fields}
        unknown = sorted(set(map(str, data)) - set(by_key))
        if unknown:
            raise SettingsError(
                f"{path}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(by_key))}"
            )
        return {by_key[k]: v for k, v in data.items()}

    def _one_line(
        self, error: ValidationError, values: dict[str, Any], sources: dict[str, str]
    ) -> str:
        first = error.errors()[0]
        message = first["msg"].replace("Input should be", "must be").replace("Value error, ", "")
        if not first["loc"]:
            return message
        name = self._field_of(str(first["loc"][0]))
        if first["type"] == "missing":
            return (
                f"{self.flag(name)} is required (or {self.env_var(name)}, or "
                f"{self.key(name)} in the config file)"
            )
        got = values.get(name)
        if len(first["loc"]) > 1 and isinstance(first["loc"][1], int) and isinstance(got, list):
            got = got[first["loc"][1]]  # the bad item of a list, not the whole list
        return f"{sources.get(name, self.flag(name))}: {message}, got {got!r}"

    def _field_of(self, loc: str) -> str:
        return {self.key(n): n for n in self.fields}.get(loc, loc)

    def names(self) -> Iterable[str]:
        return self.fields.keys()
