"""The `vramgate estimate` / `vramgate presets` contract, for people and for scripts."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from controller.base.units import GIB
from controller.cli import main
from controller.jobs.profiles import trace_extra_installed
from tests.unit.conftest import LLAMA_31_8B, NOT_A_FAMILY, PYTHIA_69B


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


FULL_8B = ("--model", "llama-3.1-8b", "--method", "full", "--profile", "analytic")
FULL_8B_BYTES = 108_901_487_411  # 101.42 GiB: the whole job, what one GPU (or each, DDP) holds
FULL_8B_ON_2 = 55_901_763_174  # 52.06 GiB: sharded / 2 + replicated, with the 1.1 margin


def test_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "estimate", "--model", "llama-3.1-8b", "--profile", "analytic", "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert data["profile"] == "analytic"
    assert data["total_bytes"] == 7_780_056_064
    assert data["total_params"] == 8_030_261_248
    assert data["trainable_params"] == 41_943_040
    assert sum(data["components"].values()) == data["total_bytes"]
    assert data["gpus"] == 1 and data["per_gpu_bytes"] == data["total_bytes"]
    assert "fit" not in data


def test_the_default_profile_is_the_operators(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "estimate", "--model", "llama-3.1-8b", "--json")
    assert json.loads(out)["profile"] == "calibrated"


def fit_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, _ = run(capsys, "estimate", *FULL_8B, "--json", *argv)
    assert code == 0
    data = json.loads(out)
    assert data["fit"]["gpus"] == data["gpus"]
    assert data["fit"]["per_gpu_bytes"] == data["per_gpu_bytes"]
    return data


def test_json_answers_for_the_gpus_asked_and_names_the_fewest_that_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    one = fit_json(capsys, "--gpu-memory", "80GB")
    assert one["gpus"] == 1 and one["per_gpu_bytes"] == FULL_8B_BYTES
    assert one["fit"] == {
        "fits": False,
        "gpus": 1,
        "per_gpu_bytes": FULL_8B_BYTES,
        "min_gpus": 2,
        "min_gpus_per_gpu_bytes": FULL_8B_ON_2,
        "reason": "needs 101.42 GiB per GPU on 1 GPU with FSDP; the largest GPU has 74.51 GiB "
        "(2 GPUs would fit with FSDP, 52.06 GiB each)",
    }
    two = fit_json(capsys, "--gpu-memory", "80GB", "--gpus", "2")
    assert two["per_gpu_bytes"] == FULL_8B_ON_2
    assert two["fit"]["fits"] is True and two["fit"]["reason"] == "fits"
    assert two["fit"]["min_gpus"] == 2 and two["fit"]["min_gpus_per_gpu_bytes"] == FULL_8B_ON_2


def test_the_fewest_gpus_are_searched_beyond_the_count_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    small = fit_json(capsys, "--gpu-memory", "24GiB", "--gpus", "2")["fit"]
    assert small["fits"] is False and small["min_gpus"] == 5
    assert small["min_gpus_per_gpu_bytes"] <= 24 * GIB
    # DDP holds the whole job on every GPU: no count fits what one GPU does not.
    ddp = fit_json(capsys, "--gpu-memory", "80GB", "--parallelism", "ddp", "--gpus", "8")["fit"]
    assert ddp["fits"] is False and ddp["min_gpus"] is None
    assert ddp["per_gpu_bytes"] == FULL_8B_BYTES and ddp["min_gpus_per_gpu_bytes"] is None
    # The search goes up to the API's cap, and stays fast there.
    start = time.perf_counter()
    far = fit_json(capsys, "--gpu-memory", "1GiB", "--seq-len", "16", "--gpus", "4096")["fit"]
    assert far["fits"] is True and 100 < far["min_gpus"] < 4096
    assert time.perf_counter() - start < 2


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


def human(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The human output with rich's line wrapping undone."""
    code, out, err = run(capsys, "estimate", *argv)
    assert code == 0 and err == ""
    return " ".join(out.split())


def test_human_output_has_a_breakdown_and_a_fit_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = human(capsys, "--model", "llama-3.1-8b", "--profile", "analytic", "--gpu-memory", "24GiB")
    for word in ("weights", "logits", "total", "7.25", "█"):
        assert word in out
    assert "per GPU on 1 GPU: 7.25 GiB" in out and "fits one 24GiB GPU" in out
    out = human(capsys, *FULL_8B, "--gpu-memory", "80GB", "--gpus", "2")
    assert out.endswith(
        "per GPU on 2 GPUs with FSDP: 52.06 GiB (2.70 GiB of it FSDP does not divide) "
        "fits 2 x 80GB with FSDP"
    )
    out = human(capsys, *FULL_8B, "--gpu-memory", "80GB")
    assert "per GPU on 1 GPU: 101.42 GiB does not fit one 80GB GPU: needs 101.42 GiB" in out
    assert out.endswith("(2 GPUs would fit with FSDP, 52.06 GiB each)")
    out = human(capsys, *FULL_8B, "--gpu-memory", "24GiB", "--seq-len", "131072", "--batch", "8")
    assert "no number of 24GiB GPUs fits: even on 4,096 GPUs each needs" in out


def test_one_per_gpu_figure_for_the_count_asked(capsys: pytest.CaptureFixture[str]) -> None:
    out = human(capsys, *FULL_8B, "--gpus", "2")
    assert out.endswith("on 2 GPUs with FSDP: 52.06 GiB (2.70 GiB of it FSDP does not divide)")
    assert "per GPU" not in human(capsys, *FULL_8B)  # one GPU: the total is the figure


def test_the_per_gpu_figure_says_what_fsdp_does_not_divide(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without checkpointing backward holds a whole micro-batch of activations on every GPU:
    on 8 GPUs the need is over twice the total over 8, and the line says why."""
    full = ("estimate", "--model", "llama-3.1-8b", "--method", "full", "--gpus", "8")
    _, out, _ = run(capsys, *full, "--gradient-checkpointing", "off", "--json")
    data = json.loads(out)
    assert data["per_gpu_bytes"] > 2 * data["total_bytes"] // 8
    undivided = data["per_gpu_undivided_bytes"]
    assert 16 * GIB < undivided < data["per_gpu_bytes"]
    # The rest is the divided part's share: an eighth of what the moment holds beyond it.
    assert data["per_gpu_bytes"] - undivided < data["total_bytes"] // 8
    _, out, _ = run(capsys, *full, "--gradient-checkpointing", "off")
    assert f"({undivided / GIB:.2f} GiB of it FSDP does not divide)" in " ".join(out.split())
    _, out, _ = run(capsys, *full, "--parallelism", "ddp", "--json")
    assert json.loads(out)["per_gpu_undivided_bytes"] is None


def test_a_device_map_failure_names_the_binding_constraint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    common = ("--model", "llama-3.1-8b", "--profile", "analytic", "--parallelism", "device-map")
    out = human(capsys, *common, "--seq-len", "8192", "--gpus", "2", "--gpu-memory", "10GiB")
    assert out.endswith(
        "does not fit 2 x 10GiB with a device map: the pool of a device map suffices but a "
        "per-GPU minimum does not: the GPU with the LM head needs 13.08 GiB and has 10.00 GiB"
    )
    out = human(capsys, *common, "--gpu-memory", "6GiB")
    assert out.endswith(
        "does not fit one 6GiB GPU: the pool of a device map is short: needs 7.25 GiB in total, "
        "and the pool of 1 GPU is 6.00 GiB, the first in full and 85 % of each further one "
        "(2 GPUs would fit with a device map, 4.97 GiB each)"
    )


def test_config_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_31_8B))
    _, out, _ = run(capsys, "estimate", "--config", str(path), "--profile", "analytic", "--json")
    assert json.loads(out)["total_bytes"] == 7_780_056_064


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "llama-8b"], "--model: unknown preset 'llama-8b'; closest: llama-3.1-8b"),
        (["--model", "llama-3.1-8b", "--batch", "0"], "--batch: must be greater than or equal"),
        (["--model", "llama-3.1-8b", "--rank", "0"], "--rank: must be greater than or equal"),
        (["--model", "llama-3.1-8b", "--optimizer", "lion"], "--optimizer: unsupported value"),
        (["--model", "llama-3.1-8b", "--method", "dora"], "--method: unsupported value 'dora'"),
        (["--model", "llama-3.1-8b", "--seq-len", "99999999"], "--seq-len: must be less than"),
        (["--model", "llama-3.1-8b", "--targets", "qkv"], "--targets: unknown module 'qkv'"),
        (["--model", "llama-3.1-8b", "--gpu-memory", "lots"], "--gpu-memory: invalid size"),
        (["--model", "llama-3.1-8b", "--gpus", "0"], "--gpus: must be greater than or equal"),
        (
            ["--model", "llama-3.1-8b", "--gpus", "4097"],
            "--gpus: must be less than or equal to 4096, got 4097",
        ),
        (["--model", "llama-3.1-8b", "--gpu-memory", ""], "--gpu-memory: invalid size ''"),
        # a value with a leading dash is the option's value, not an option argparse looks up
        (
            ["--model", "llama-3.1-8b", "--gpu-memory", "-1GiB"],
            "--gpu-memory: invalid size '-1GiB'",
        ),
        (["--model", "llama-3.1-8b", "--gpu-memory", "-.5GiB"], "--gpu-memory: invalid size"),
        (
            ["--model", "llama-3.1-8b", "--gpu-memory", "80"],
            "--gpu-memory: invalid size '80': needs a unit, e.g. 80GB or 80GiB",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu-memory", "9" * 30 + "TB"],
            "--gpu-memory: invalid size",
        ),
        (
            ["--model", "llama-3.1-8b", "--method", "full", "--rank", "16"],
            "--rank: applies only with --method lora or qlora",
        ),
        (
            ["--model", "llama-3.1-8b", "--method", "full", "--targets", "q_proj"],
            "--targets: applies only with --method lora or qlora",
        ),
        (["--model", "llama-3.1-8b", "--batch", "-1"], "--batch: must be greater than or equal"),
        (["--model", "llama-3.1-8b", "--batch", "10000000"], "--batch: must be less than"),
        (["--model", "llama-3.1-8b", "--seq-len", "0"], "--seq-len: must be greater than"),
        (["--model", "llama-3.1-8b", "--rank", "99999999"], "--rank: must be less than"),
        (
            ["--model", "llama-3.1-8b", "--gradient-accumulation", "0"],
            "--gradient-accumulation: must be greater than or equal to 1",
        ),
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


def test_a_config_of_only_a_model_type_is_refused_and_defaults_read_are_warned_of(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`{"model_type": "llama"}` was estimated as Llama-2-7B without a word: it is refused,
    each dimension named on the one line; what the estimate does read from a default (a
    nested text_config's class defaults) is said on stderr."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama"}))
    code, out, err = run(capsys, "estimate", "--config", str(path), "--method", "full")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err.startswith(
        "vramgate: config.hidden_size: is required in a model config: the estimate depends on "
        "it (transformers' llama default, 4096, may be another model's); config.num_hidden_"
    )
    assert "; config.vocab_size: is required" in err
    text = {k: v for k, v in LLAMA_31_8B.items() if k != "num_attention_heads"}
    path.write_text(json.dumps({"model_type": "llava", "text_config": text}))
    code, out, err = run(capsys, "estimate", "--config", str(path), "--json")
    assert code == 0 and json.loads(out)["total_bytes"] > 0
    assert err == (
        "vramgate: warning: config.text_config: estimated with the defaults of transformers' "
        "llama config class for what the config leaves out (num_attention_heads=32), as "
        "transformers loads it; set them in the config if the model's differ\n"
    )


def test_a_model_family_without_a_hand_reading_is_read_from_the_built_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Pythia-6.9B was estimated as a Llama-style 9.00B model, then refused; with the trace
    extra it is read from the model transformers builds (6.86B, as published), and said so;
    without it the refusal says what would read it. Remote code is refused in one line."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(PYTHIA_69B))
    code, out, err = run(capsys, "estimate", "--config", str(path), "--method", "full")
    if trace_extra_installed():
        assert code == 0 and "6,857,302,016 total" in out
        assert "read generically from the model transformers builds" in err
    else:
        assert (code, out) == (2, "")
        assert err.startswith(f"vramgate: config.{NOT_A_FAMILY} (its layers may differ from")
        assert "trace extra" in err and err.count("\n") == 1
    path.write_text(json.dumps(PYTHIA_69B | {"model_type": "my_remote_llm"}))
    code, out, err = run(capsys, "estimate", "--config", str(path), "--method", "full")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err.startswith("vramgate: config.model_type: ")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nests too deeply to be a config.json"),
        (b'{"hidden_size": "\xff\xfe"}', "is not UTF-8 text (invalid start byte)"),
        (b'{"hidden_size": ' + b"9" * 5000 + b"}", "holds a number too long to read"),
        (b"[1, 2]", "must hold a JSON object (a config.json)"),
        (
            json.dumps(LLAMA_31_8B | {"num_hidden_layers": 10**6}).encode(),
            "config.num_hidden_layers: must be less than or equal to 4096, got 1000000",
        ),
        (
            json.dumps(LLAMA_31_8B | {"hidden_size": 10**30}).encode(),
            "config.hidden_size: must be less than or equal to 16777216",
        ),
        (
            json.dumps(LLAMA_31_8B | {"vocab_size": "x" * 10**6}).encode(),
            "config.vocab_size: must be an integer, got 'xxxx",
        ),
    ],
)
def test_a_hostile_config_file_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    code, out, err = run(capsys, "estimate", "--config", str(path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and len(err) < 300, err


def test_a_config_file_is_read_up_to_16_mib(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    huge = tmp_path / "model.safetensors"
    with huge.open("wb") as file:
        file.truncate(2**30)  # sparse: a 1 GiB file costs nothing to make
    start = time.perf_counter()
    code, _, err = run(capsys, "estimate", "--config", str(huge))
    assert code == 2 and "is larger than 16 MiB; a config.json is a few KiB" in err
    assert time.perf_counter() - start < 1
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(LLAMA_31_8B).encode())  # Windows editors
    code, out, _ = run(capsys, "estimate", "--config", str(bom), "--profile", "analytic", "--json")
    assert code == 0 and json.loads(out)["total_bytes"] == 7_780_056_064


def test_a_sequence_beyond_the_context_is_estimated_with_one_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(
        capsys, "estimate", "--model", "llama-3.1-8b", "--seq-len", "200000", "--json"
    )
    assert code == 0 and json.loads(out)["settings"]["seq_len"] == 200_000
    assert err == (
        "vramgate: warning: --seq-len: 200000 is longer than the model's context length "
        "(131072); estimating anyway\n"
    )
    _, _, err = run(capsys, "estimate", "--model", "llama-3.1-8b", "--seq-len", "131072")
    assert err == ""


def test_a_module_to_save_named_twice_is_counted_once(capsys: pytest.CaptureFixture[str]) -> None:
    totals = []
    for modules in ("lm_head", "lm_head,lm_head"):
        argv = ("--model", "llama-3.1-8b", "--method", "lora", "--modules-to-save", modules)
        code, out, _ = run(capsys, "estimate", *argv, "--json")
        assert code == 0
        totals.append(json.loads(out)["total_bytes"])
    assert totals[0] == totals[1]


def test_presets_lists_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "presets", "--json")
    rows = json.loads(out)
    assert code == 0 and len(rows) >= 25
    llama = next(r for r in rows if r["name"] == "llama-3.1-8b")
    assert llama["params"] == 8_030_261_248 and llama["repo"] == "meta-llama/Llama-3.1-8B"
    code, out, _ = run(capsys, "presets")
    assert "llama-3.1-8b" in out and "8,030,261,248" in out


def test_presets_say_how_each_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    from controller.estimator.model.families import SUPPORTED_MODEL_TYPES

    code, out, _ = run(capsys, "presets", "--json")
    assert code == 0
    for row in json.loads(out):
        hand = row["family"] in SUPPORTED_MODEL_TYPES
        assert row["reading"] == ("by hand" if hand else "generic"), row


def test_types_lists_the_hand_read_and_without_the_extra_says_what_it_adds(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from controller.estimator.model.families import SUPPORTED_MODEL_TYPES

    monkeypatch.setattr("controller.jobs.profiles.trace_extra_installed", lambda: False)
    code, out, err = run(capsys, "presets", "--types", "--json")
    rows = json.loads(out)
    assert code == 0 and {r["model_type"] for r in rows} == set(SUPPORTED_MODEL_TYPES)
    assert {r["reading"] for r in rows} == {"by hand"}
    assert "trace extra" in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(not trace_extra_installed(), reason="the generic reading needs the extra")
def test_types_lists_every_type_transformers_builds_with_its_reading(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from transformers.models.auto import modeling_auto

    code, out, _ = run(capsys, "presets", "--types", "--json")
    rows = {r["model_type"]: r for r in json.loads(out)}
    assert code == 0
    built = set(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    built |= set(modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    assert built <= set(rows)
    assert rows["llama"]["reading"] == "by hand" and rows["llama"]["built_as"] == ""
    assert rows["gpt_neox"] == {
        "model_type": "gpt_neox", "reading": "generic", "built_as": "causal_lm"
    }  # fmt: skip
    assert rows["qwen2_5_vl"]["built_as"] == "image_text_to_text"
    code, out, _ = run(capsys, "presets", "--types")
    hand = sum(r["reading"] == "by hand" for r in rows.values())
    assert f"{hand} by hand, {len(rows) - hand} generic" in out


@pytest.mark.parametrize("columns", ["80", "60"])
def test_presets_never_cuts_a_preset_name(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, columns: str
) -> None:
    from controller.estimator.presets import preset_names

    monkeypatch.setenv("COLUMNS", columns)
    code, out, _ = run(capsys, "presets")
    assert code == 0 and "…" not in out
    cells = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert set(preset_names()) <= cells


ANALYTIC = ("--profile", "analytic", "--json")


def test_console_script_is_installed() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "controller.cli", "estimate", "--model", "qwen2.5-0.5b", *ANALYTIC],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["total_params"] == 494_032_768


def test_an_unknown_attention_is_estimated_as_eager_with_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ("estimate", "--model", "llama-3.1-8b", "--profile", "analytic", "--json")
    code, out, err = run(capsys, *base, "--attention", "paged_attention")
    assert code == 0
    assert "--attention: 'paged_attention' is none of" in err
    assert "estimated as eager attention" in err
    _, eager, eager_err = run(capsys, *base, "--attention", "eager")
    assert not eager_err
    unknown = json.loads(out)
    assert unknown["total_bytes"] == json.loads(eager)["total_bytes"]


@pytest.mark.parametrize("json_flag", [("--json",), ()])
def test_a_reader_that_leaves_early_gets_no_traceback(
    tmp_path: Path, json_flag: tuple[str, ...]
) -> None:
    """`vramgate plan --json | head`: more output than a pipe holds, and the reader closes."""
    nodes = {"nodes": [{"name": "a", "gpus": {"count": 8, "memory": "80GiB"}}]}
    (tmp_path / "c.json").write_text(json.dumps(nodes))
    job = {
        "apiVersion": "vramgate.dev/v1alpha1",
        "kind": "FineTuneJob",
        "spec": {"model": {"preset": "llama-3.1-8b"}, "method": "QLoRA", "lora": {"rank": 16}},
    }
    items = [{**job, "metadata": {"name": f"job-{i}"}} for i in range(600)]
    (tmp_path / "j.json").write_text(json.dumps({"kind": "List", "items": items}))
    argv = ["plan", "--cluster", str(tmp_path / "c.json"), str(tmp_path / "j.json"), *json_flag]
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1
    assert err == ""


def test_after_a_double_dash_a_dashed_file_name_stays_a_file_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "plan", "--", "-1.yaml")
    assert code == 2 and "-1.yaml: cannot read" in err, err
