"""The Dockerfile, read as Docker reads it: there is no Docker engine here to build it.

What is checked is what makes the image safe to run under the chart: pinned bases, a
numeric non-root user, an exec-form entrypoint (SIGTERM reaches vramgate), no secrets in the
image config, a build context that leaves out the repository's other files, and packages
installed from a lock with hashes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
#: The image's locks, one per value of EXTRAS (tests/unit/test_locks.py checks their content).
IMAGE_LOCKS = ("requirements/runtime.txt", "requirements/trace.txt")
SECRET_WORDS = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|PRIVATE|CREDENTIAL", re.I)


@dataclass(frozen=True)
class Instruction:
    command: str  # upper case, e.g. FROM
    args: str
    stage: int  # index of the FROM it belongs to; -1 before the first


def parse(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped, as the builder does."""
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            current += line[:-1].rstrip() + " "
            continue
        logical.append(current + line)
        current = ""
    assert not current, "the Dockerfile ends inside a continued line"
    out = []
    stage = -1
    for line in logical:
        command, _, args = line.partition(" ")
        command = command.upper()
        if command == "FROM":
            stage += 1
        out.append(Instruction(command, args.strip(), stage))
    return out


INSTRUCTIONS = parse(DOCKERFILE.read_text())
FINAL = max(i.stage for i in INSTRUCTIONS)


def _in_final(command: str) -> list[Instruction]:
    return [i for i in INSTRUCTIONS if i.stage == FINAL and i.command == command]


def _global_args() -> dict[str, str]:
    """ARGs before the first FROM with their defaults: what FROM lines may use."""
    found = {}
    for i in INSTRUCTIONS:
        if i.command == "ARG" and i.stage == -1:
            name, _, default = i.args.partition("=")
            found[name] = default.strip('"')
    return found


def _bases() -> list[str]:
    args = _global_args()
    bases = []
    for i in INSTRUCTIONS:
        if i.command != "FROM":
            continue
        image = next(w for w in i.args.split() if not w.startswith("--"))
        bases.append(re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m[1] or m[2]], image))
    return bases


def test_parse_joins_continuations_and_skips_comments() -> None:
    parsed = parse("# c\nFROM a:1 AS x\nRUN one \\\n  # inside\n  two\nUSER 1\n")
    assert [(i.command, i.args, i.stage) for i in parsed] == [
        ("FROM", "a:1 AS x", 0),
        ("RUN", "one two", 0),
        ("USER", "1", 0),
    ]


def test_it_is_multi_stage_and_the_runtime_copies_from_the_build() -> None:
    stages = [i for i in INSTRUCTIONS if i.command == "FROM"]
    assert len(stages) >= 2
    copies = _in_final("COPY")
    assert any(c.args.startswith("--from=build ") for c in copies)
    assert not _in_final("RUN"), "the runtime stage runs nothing: no shell is needed"


@pytest.mark.parametrize("base", _bases())
def test_every_base_is_a_slim_python_pinned_by_version(base: str) -> None:
    if base in {"build"}:  # a stage name, not an image
        return
    name, _, tag = base.partition(":")
    assert "@sha256:" in base or tag, f"{base}: untagged base"
    assert tag != "latest" and "latest" not in tag, f"{base}: latest is not a version"
    assert name == "python"
    assert re.fullmatch(r"3\.\d+\.\d+-slim-[a-z]+", tag), f"{base}: not pinned to a patch release"


def test_the_runtime_user_is_numeric_and_not_root() -> None:
    users = _in_final("USER")
    assert users, "the runtime stage must set USER"
    user, _, group = users[-1].args.partition(":")
    assert user.isdigit() and int(user) > 0, users[-1].args
    assert not group or (group.isdigit() and int(group) > 0)
    # The user is set before the entrypoint, and nothing after it switches back.
    order = [i.command for i in INSTRUCTIONS if i.stage == FINAL]
    assert order.index("USER") < order.index("ENTRYPOINT")


def test_the_entrypoint_is_vramgate_in_exec_form() -> None:
    (entrypoint,) = _in_final("ENTRYPOINT")
    argv = json.loads(entrypoint.args)  # exec form is a JSON array; shell form would not parse
    assert isinstance(argv, list) and argv[0].endswith("/vramgate") and len(argv) == 1
    for cmd in _in_final("CMD"):
        assert isinstance(json.loads(cmd.args), list)


def test_no_secrets_in_env_or_args() -> None:
    for i in INSTRUCTIONS:
        if i.command in {"ENV", "ARG", "LABEL"}:
            names = re.findall(r"(\w+)=", i.args) or [i.args.split("=")[0]]
            for name in names:
                assert not SECRET_WORDS.search(name), f"{i.command} {name}"
        if i.command in {"RUN", "ENV", "ARG"}:
            assert not re.search(r"(ghp_|glpat-|AKIA)[A-Za-z0-9]", i.args), i.args


def test_a_build_argument_adds_the_trace_extra() -> None:
    args = [i.args.split("=")[0] for i in INSTRUCTIONS if i.command == "ARG"]
    assert "EXTRAS" in args
    install = next(i for i in INSTRUCTIONS if i.command == "RUN" and "pip install" in i.args)
    assert "$EXTRAS" in install.args or "${EXTRAS" in install.args
    assert "trace" in DOCKERFILE.read_text()  # documented next to the argument
    assert "trace" in (REPO / "pyproject.toml").read_text()


def test_the_build_context_is_the_package_only() -> None:
    lines = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "start from nothing, then allow what the image needs"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "controller", *IMAGE_LOCKS}
    copied = [
        source
        for i in INSTRUCTIONS
        if i.command == "COPY" and "--from" not in i.args
        for source in i.args.split()[:-1]
    ]
    assert set(copied) == allowed


def test_the_image_installs_its_lock_with_hashes_then_the_package_alone() -> None:
    """The versions the suite tested, each file checked against its hash: nothing resolved at
    build time. The lock is picked by EXTRAS (empty: runtime.txt)."""
    (install,) = [i for i in INSTRUCTIONS if i.command == "RUN" and "pip install" in i.args]
    assert 'lock="requirements/${EXTRAS:-runtime}.txt"' in install.args
    steps = [s.strip() for s in install.args.split("&&")]
    locked = next(s for s in steps if "-r " in s)
    assert "--require-hashes" in locked and "--no-deps" in locked and '"$lock"' in locked
    package = steps[steps.index(locked) + 1]
    assert "pip install --no-deps --no-build-isolation" in package
    assert any(s.endswith("pip check") for s in steps)
    for extras in ("", "trace"):
        assert (REPO / f"requirements/{extras or 'runtime'}.txt").is_file()
