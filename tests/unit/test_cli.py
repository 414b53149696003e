"""The `vramgate estimate` / `vramgate presets` contract, for people and for scripts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from controller.cli import main
from tests.unit.conftest import LLAMA_31_8B


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "--model", "llama-3.1-8b", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["profile"] == "analytic"
    assert data["total_bytes"] == 7_780_056_064
    assert data["total_params"] == 8_030_261_248
    assert data["trainable_params"] == 41_943_040
    assert sum(data["components"].values()) == data["total_bytes"]
    assert "fit" not in data


def test_json_fit(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(
        capsys,
        "estimate",
        "--model",
        "llama-3.1-8b",
        "--method",
        "full",
        "--json",
        "--gpu-memory",
        "80GB",
    )
    fit = json.loads(out)["fit"]
    assert fit["fits"] is True and fit["min_gpus"] == 2
    assert fit["per_gpu_bytes"] == 50_819_784_704 and fit["reason"] == "fits"
    _, out, _ = run(
        capsys,
        "estimate",
        "--model",
        "llama-3.1-8b",
        "--method",
        "full",
        "--json",
        "--gpu-memory",
        "24GiB",
        "--gpus",
        "2",
    )
    fit = json.loads(out)["fit"]
    assert fit["fits"] is False and fit["min_gpus"] is None and fit["reason"]


def test_unsloth_profile_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(
        capsys,
        "estimate",
        "--model",
        "llama-3.1-8b",
        "--profile",
        "unsloth",
        "--batch",
        "4",
        "--gradient-checkpointing",
        "unsloth",
        "--optimizer",
        "adamw-8bit",
        "--targets",
        "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        "--json",
    )
    assert json.loads(out)["total_bytes"] == 9_644_988_825


def test_human_output_has_a_breakdown_and_a_fit_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu-memory", "24GiB")
    assert code == 0
    for word in ("weights", "logits", "total", "7.25", "█"):
        assert word in out
    assert "fits one 24GiB GPU" in out
    _, out, _ = run(
        capsys, "estimate", "--model", "llama-3.1-8b", "--method", "full", "--gpu-memory", "80GB"
    )
    assert "needs 2 x 80GB with FSDP" in out
    _, out, _ = run(
        capsys,
        "estimate",
        "--model",
        "llama-3.1-8b",
        "--method",
        "full",
        "--gpu-memory",
        "24GiB",
        "--seq-len",
        "131072",
        "--batch",
        "8",
    )
    assert "no number of 24GiB GPUs fits: activations alone need" in " ".join(out.split())


def test_config_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_31_8B))
    _, out, _ = run(capsys, "estimate", "--config", str(path), "--json")
    assert json.loads(out)["total_bytes"] == 7_780_056_064


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "llama-8b"], "--model: unknown preset 'llama-8b'; closest: llama-3.1-8b"),
        (["--model", "llama-3.1-8b", "--batch", "0"], "--batch: must be greater than or equal"),
        (["--model", "llama-3.1-8b", "--rank", "0"], "--rank: must be greater than or equal"),
        (["--model", "llama-3.1-8b", "--optimizer", "lion"], "--optimizer: unsupported value"),
        (["--model", "llama-3.1-8b", "--method", "dora"], "--method: unsupported value 'dora'"),
        (["--model", "llama-3.1-8b", "--seq-len", "999999"], "--seq-len: must be less than"),
        (["--model", "llama-3.1-8b", "--targets", "qkv"], "--targets: unknown module 'qkv'"),
        (["--model", "llama-3.1-8b", "--gpu-memory", "lots"], "--gpu-memory: invalid size"),
        (["--model", "llama-3.1-8b", "--gpus", "0"], "--gpus: must be greater than or equal"),
        (["--model", "llama-3.1-8b", "--parallelism", "tp"], "--parallelism: unsupported"),
        (["--model", "llama-3.1-8b", "--batch", "x"], "invalid int value: 'x'"),
        (["--config", "/nonexistent.json"], "--config: cannot read '/nonexistent.json'"),
        ([], "one of the arguments --model --config is required"),
        (["--model", "a", "--config", "b"], "not allowed with argument"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, "estimate", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


def test_bad_config_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text("{not json")
    code, _, err = run(capsys, "estimate", "--config", str(path))
    assert code == 2 and "is not valid JSON" in err and err.count("\n") == 1
    path.write_text(json.dumps({"hidden_size": 64}))
    code, _, err = run(capsys, "estimate", "--config", str(path))
    assert code == 2 and "config.num_hidden_layers: is required" in err


def test_presets_lists_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "presets", "--json")
    rows = json.loads(out)
    assert code == 0 and len(rows) >= 25
    llama = next(r for r in rows if r["name"] == "llama-3.1-8b")
    assert llama["params"] == 8_030_261_248 and llama["repo"] == "meta-llama/Llama-3.1-8B"
    code, out, _ = run(capsys, "presets")
    assert "llama-3.1-8b" in out and "8,030,261,248" in out


def test_console_script_is_installed() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "controller.cli", "estimate", "--model", "qwen2.5-0.5b", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["total_params"] == 494_032_768
