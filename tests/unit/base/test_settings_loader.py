"""The one settings loader: flag > environment > config file > default, per kind of field."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from controller.base.settings import Flag, SettingsError, SettingsLoader


class Example(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    name_text: str = Field("default-name", description="a string")
    count: int = Field(1, ge=0, description="a number")
    mode: Literal["a", "b"] = Field("a", description="a choice")
    hosts: Annotated[list[str], Flag("--host", metavar="HOST")] = Field(
        default_factory=lambda: ["d"], description="a list"
    )
    enabled: bool = Field(True, description="a switch")


LOADER = SettingsLoader(Example, "EX_")


def parse(*argv: str, loader: SettingsLoader[Example] = LOADER) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    loader.add_arguments(parser, example="count: 1")
    return parser.parse_args(list(argv))


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


FILE = "nameText: file\ncount: 3\nmode: b\nhosts: [f1, f2]\nenabled: false\n"


def test_defaults_when_no_source_sets_a_field() -> None:
    s = LOADER.load(parse(), environ={})
    assert (s.name_text, s.count, s.mode, s.hosts) == ("default-name", 1, "a", ["d"])
    assert s.enabled is True


def test_the_file_beats_the_defaults_for_every_kind(tmp_path: Path) -> None:
    s = LOADER.load(parse("--config", write(tmp_path, FILE)), environ={})
    assert (s.name_text, s.count, s.mode, s.hosts) == ("file", 3, "b", ["f1", "f2"])
    assert s.enabled is False


def test_the_environment_beats_the_file_for_every_kind(tmp_path: Path) -> None:
    env = {
        "EX_CONFIG": write(tmp_path, FILE),
        "EX_NAME_TEXT": "env", "EX_COUNT": "4", "EX_MODE": "a",
        "EX_HOSTS": "e1, e2,", "EX_ENABLED": "true",
    }  # fmt: skip
    s = LOADER.load(parse(), environ=env)
    assert (s.name_text, s.count, s.mode, s.hosts, s.enabled) == ("env", 4, "a", ["e1", "e2"], True)


def test_flags_beat_the_environment_for_every_kind(tmp_path: Path) -> None:
    env = {"EX_NAME_TEXT": "env", "EX_COUNT": "4", "EX_MODE": "a", "EX_HOSTS": "e1",
           "EX_ENABLED": "true"}  # fmt: skip
    args = parse(
        "--config", write(tmp_path, FILE), "--name-text", "flag", "--count", "5",
        "--mode", "b", "--host", "x", "--host", "y", "--no-enabled",
    )  # fmt: skip
    s = LOADER.load(args, environ=env)
    assert (s.name_text, s.count, s.mode, s.hosts, s.enabled) == ("flag", 5, "b", ["x", "y"], False)
    assert LOADER.load(parse("--enabled"), environ={"EX_ENABLED": "false"}).enabled is True


def test_an_empty_list_variable_means_the_empty_list() -> None:
    assert LOADER.load(parse(), environ={"EX_HOSTS": ""}).hosts == []


def test_environment_dependent_defaults_and_implied_flags_rank_where_they_belong() -> None:
    s = LOADER.load(parse(), environ={}, defaults={"name_text": "computed"})
    assert s.name_text == "computed"
    s = LOADER.load(parse(), environ={"EX_NAME_TEXT": "env"}, defaults={"name_text": "computed"})
    assert s.name_text == "env"
    s = LOADER.load(parse(), environ={"EX_COUNT": "4"}, flags={"count": (7, "--shorthand")})
    assert s.count == 7
    s = LOADER.load(parse("--count", "8"), environ={}, flags={"count": (7, "--shorthand")})
    assert s.count == 8


@pytest.mark.parametrize(
    ("argv", "env", "file", "message"),
    [
        (("--count", "x"), {}, None, "--count: must be a valid integer"),
        ((), {"EX_COUNT": "-1"}, None, "EX_COUNT: must be greater than or equal to 0, got '-1'"),
        ((), {}, "count: many\n", "count in {file}: must be a valid integer"),
        ((), {"EX_MODE": "c"}, None, "EX_MODE: must be 'a' or 'b', got 'c'"),
        ((), {"EX_ENABLED": "maybe"}, None, "EX_ENABLED: must be a valid boolean"),
        ((), {}, "hosts: [a, [b]]\n", "hosts in {file}: must be a valid string, got ['b']"),
        ((), {}, "hosts: a\n", "hosts in {file}: must be a valid list, got 'a'"),
        (
            (),
            {},
            "count: 1\ncolour: red\n",
            "{file}: unknown key 'colour'; allowed: count, enabled, hosts, mode, nameText",
        ),
        ((), {}, "- a\n", "--config: {file} must hold a mapping of camelCase keys"),
        ((), {}, "a: [\n", "--config: {file} is not valid YAML"),
    ],
)
def test_bad_values_are_one_line_naming_their_source(
    tmp_path: Path, argv: tuple[str, ...], env: dict[str, str], file: str | None, message: str
) -> None:
    path = write(tmp_path, file) if file is not None else None
    args = parse(*argv, *(("--config", path) if path else ()))
    with pytest.raises(SettingsError) as info:
        LOADER.load(args, environ=env)
    assert message.format(file=path) in str(info.value)
    assert "\n" not in str(info.value)


def test_a_missing_config_file_named_by_the_environment_names_the_variable() -> None:
    with pytest.raises(SettingsError, match=r"^EX_CONFIG: cannot read /nonexistent\.yaml"):
        LOADER.load(parse(), environ={"EX_CONFIG": "/nonexistent.yaml"})


def test_typed_flags_let_argparse_refuse_bad_numbers_and_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    typed = SettingsLoader(Example, "EX_", typed_flags=True)
    assert parse("--count", "3", loader=typed).count == 3
    with pytest.raises(SystemExit):
        parse("--mode", "c", loader=typed)
    assert "argument --mode: invalid choice: 'c'" in capsys.readouterr().err


def test_help_names_each_variable_and_default() -> None:
    parser = argparse.ArgumentParser()
    LOADER.add_arguments(parser, example="count: 1")
    text = " ".join(parser.format_help().split())
    assert "--host HOST a list (repeat; env EX_HOSTS; default d)" in text
    assert "--enabled, --no-enabled a switch (env EX_ENABLED; default true)" in text
    assert "--mode a|b a choice (env EX_MODE; default a)" in text


def test_flags_only_add_no_config_and_name_no_environment() -> None:
    """`example=None`: a command that reads its settings from its command line alone."""
    parser = argparse.ArgumentParser()
    LOADER.add_arguments(parser, example=None)
    text = " ".join(parser.format_help().split())
    assert "--config" not in text and "env" not in text
    assert "--host HOST a list (repeat; default d)" in text
    assert "--mode a|b a choice (default a)" in text
    args = parser.parse_args(["--count", "5"])
    s = LOADER.load(args, environ={})
    assert (s.count, s.name_text) == (5, "default-name")
