"""`vramgate estimate --framework` and the switch flags; `vramgate frameworks`."""

from __future__ import annotations

import json

import pytest

from controller.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


JOB = ("estimate", "--model", "llama-3.2-1b", "--method", "lora", "--seq-len", "8192")


def test_framework_and_flags_resolve_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *JOB, "--framework", "torchtune", "--json")
    assert code == 0
    settings = json.loads(out)["settings"]
    assert settings["framework"] == "torchtune"
    assert settings["switches"] == {
        "loss": "chunked",
        "compile": False,
        "loadPath": "meta-sharded",
        "activationOffloading": "none",
        "fsdpVersion": 2,
        "optimizerInBackward": False,
        "kbitPreparation": "none",
    }
    code, out, _ = run(capsys, *JOB, "--framework", "torchtune", "--loss", "fused", "--json")
    assert json.loads(out)["settings"]["switches"]["loss"] == "fused"
    code, out, _ = run(capsys, *JOB, "--framework", "torchtune")
    assert "trainer torchtune: loss chunked, compile off, loadPath meta-sharded" in out


def test_the_loss_flag_changes_the_figure(capsys: pytest.CaptureFixture[str]) -> None:
    totals = {}
    for loss in ("plain", "chunked", "fused"):
        _, out, _ = run(capsys, *JOB, "--loss", loss, "--json")
        totals[loss] = json.loads(out)["total_bytes"]
    assert totals["fused"] < totals["chunked"] < totals["plain"]
    _, out, _ = run(capsys, *JOB, "--json")
    assert json.loads(out)["total_bytes"] == totals["plain"]


def test_bad_switch_flags_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, *JOB, "--loss", "streamed")
    assert code == 2
    assert err.strip() == (
        "vramgate: --loss: unsupported value 'streamed'; allowed: plain, chunked, fused"
    )
    code, _, err = run(capsys, *JOB, "--fsdp-version", "3")
    assert err.strip() == "vramgate: --fsdp-version: unsupported value 3; allowed: 1, 2"
    code, _, err = run(capsys, *JOB, "--optimizer-in-backward", "--gradient-accumulation", "4")
    assert code == 2 and err.startswith("vramgate: --optimizer-in-backward: needs gradient")


@pytest.mark.parametrize("command", ["estimate", "trace"])
def test_a_message_about_a_switch_names_its_flag_in_the_text_too(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # The message names the switch it contradicts by the flag the user typed, as the field
    # does; `trace` validates the job before it needs torch.
    code, _, err = run(capsys, command, *JOB[1:], "--fused-loss", "--loss", "chunked")
    assert code == 2
    assert err.strip() == (
        "vramgate: --fused-loss: true contradicts --loss chunked; set only --loss"
    )
    if command == "estimate":  # (a trace of this job would run)
        _, _, err = run(capsys, command, *JOB[1:], "--compile")
        assert err.strip() == (
            "vramgate: warning: --compile: torch.compile is not priced; the estimate is of "
            "the eager step"
        )


def test_an_unknown_framework_is_warned_of(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, *JOB, "--framework", "my-loop")
    assert code == 0
    assert "warning: --framework: framework 'my-loop' is not one vramgate knows" in err


def test_frameworks_lists_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "frameworks", "--json")
    assert code == 0
    rows = {row["name"]: row for row in json.loads(out)}
    assert list(rows) == ["huggingface", "torchtune", "litgpt", "unsloth", "axolotl",
                          "llama-factory"]  # fmt: skip
    assert rows["unsloth"]["switches"]["loadPath"] == "WholeModelPerRank"
    assert "device_map" in rows["unsloth"]["sources"]["loadPath"]
    code, out, _ = run(capsys, "frameworks", "--sources")
    assert code == 0 and "llama-factory" in out and "fsdp_cpu_ram_efficient_loading" in out
