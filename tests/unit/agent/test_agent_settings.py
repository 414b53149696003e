"""Agent settings: flag > environment > config file > default, and one-line errors (exit 2)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from controller.agent.settings import (
    AgentSettings,
    SettingsError,
    add_arguments,
    load_settings,
)
from controller.cli import main

MIB = 2**20


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_and_their_types() -> None:
    s = load_settings(parse("--node-name", "n1"), environ={})
    assert s.backend == "nvml"
    assert s.poll_interval_seconds == 5.0
    assert s.heartbeat_interval_seconds == 30.0
    assert s.change_threshold_bytes == 256 * MIB
    assert s.metrics_port == 9402
    assert s.proc_root == Path("/proc")


def test_flag_beats_env_beats_file_beats_default(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(
        "nodeName: from-file\npollIntervalSeconds: 7\nheartbeatIntervalSeconds: 60\n"
        "changeThresholdBytes: 1GiB\n"
    )
    env = {"VRAMGATE_AGENT_POLL_INTERVAL_SECONDS": "3", "VRAMGATE_AGENT_NODE_NAME": "from-env"}
    s = load_settings(parse("--config", str(config), "--node-name", "from-flag"), environ=env)
    assert s.node_name == "from-flag"
    assert s.poll_interval_seconds == 3.0  # env over file
    assert s.heartbeat_interval_seconds == 60.0  # file over default
    assert s.change_threshold_bytes == 2**30
    assert (
        load_settings(
            parse("--node-name", "n", "--change-threshold-bytes", "0MiB"), environ={}
        ).change_threshold_bytes
        == 0
    )
    assert s.metrics_port == 9402  # default
    # The config file may also come from the environment.
    s = load_settings(parse(), environ={"VRAMGATE_AGENT_CONFIG": str(config)})
    assert s.node_name == "from-file"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            (),
            {},
            "--node-name is required (or VRAMGATE_AGENT_NODE_NAME, or nodeName in the config file)",
        ),
        (
            ("--node-name", "n", "--poll-interval-seconds", "0"),
            {},
            "--poll-interval-seconds: must be greater than 0, got '0'",
        ),
        (
            (
                "--node-name",
                "n",
            ),
            {"VRAMGATE_AGENT_METRICS_PORT": "http"},
            "VRAMGATE_AGENT_METRICS_PORT: must be a valid integer, unable to parse string as an "
            "integer, got 'http'",
        ),
        (
            ("--node-name", "n", "--backend", "rocm"),
            {},
            "--backend: must be 'nvml', 'dcgm' or 'static', got 'rocm'",
        ),
        (
            ("--node-name", "n", "--backend", "static"),
            {},
            "--static-file is required with --backend static",
        ),
        (
            ("--node-name", "n", "--heartbeat-interval-seconds", "1"),
            {},
            "heartbeatIntervalSeconds must not be less than pollIntervalSeconds",
        ),
        (
            ("--node-name", "n", "--change-threshold-bytes", "lots"),
            {},
            "--change-threshold-bytes: invalid size 'lots'",
        ),
    ],
)
def test_bad_settings_are_one_line_naming_their_source(
    argv: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(parse(*argv), environ=env)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_config_file_errors_name_the_file_and_the_key(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("nodeName: n\npollInterval: 5\n")
    with pytest.raises(SettingsError, match="unknown key 'pollInterval'; allowed: backend"):
        load_settings(parse("--config", str(config)), environ={})
    config.write_text("nodeName: n\nmetricsPort: 70000\n")
    expected = re.escape(f"metricsPort in {config}: must be less than")
    with pytest.raises(SettingsError, match=expected):
        load_settings(parse("--config", str(config)), environ={})
    with pytest.raises(SettingsError, match=r"cannot read /nonexistent\.yaml"):
        load_settings(parse("--config", "/nonexistent.yaml"), environ={})


def test_help_documents_every_setting_with_its_env_var(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["agent", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    flat = text.replace("\n", "").replace(" ", "")
    for name in AgentSettings.model_fields:
        assert "--" + name.replace("_", "-") in text
        assert "VRAMGATE_AGENT_" + name.upper() in flat


def test_cli_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "--node-name", "n", "--poll-interval-seconds", "-1"]) == 2
    err = capsys.readouterr().err
    assert err == "vramgate: agent: --poll-interval-seconds: must be greater than 0, got '-1'\n"
