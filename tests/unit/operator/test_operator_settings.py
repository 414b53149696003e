"""Operator settings: every field from a flag, VRAMGATE_OPERATOR_* and the config file; the
flags of earlier releases; one-line errors, exit 2."""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.cli import main
from controller.decision import QueueingStrategy
from controller.learning import Policy
from controller.operator.settings import (
    LOADER,
    OperatorSettings,
    SettingsError,
    WebhookMode,
    add_arguments,
    load_options,
    load_settings,
)
from controller.packing.inventory import GpuMode

GIB = 2**30

#: For each field: (flag/env text, file value, the value loaded), none of them the default.
SAMPLES: dict[str, tuple[str, Any, Any]] = {
    "namespaces": ("team-a", ["team-a"], ["team-a"]),
    "webhook": ("serve", "serve", WebhookMode.SERVE),
    "webhook_addr": ("127.0.0.1", "127.0.0.1", "127.0.0.1"),
    "webhook_port": ("8443", 8443, 8443),
    "webhook_host": ("example.test", "example.test", "example.test"),
    "webhook_config_name": ("vg.example", "vg.example", "vg.example"),
    "cert_dir": ("/certs", "/certs", Path("/certs")),
    "cert_hosts": ("svc.ns.svc", ["svc.ns.svc"], ["svc.ns.svc"]),
    "cert_secret_name": ("vg-tls", "vg-tls", "vg-tls"),
    "configmap_retry_seconds": ("4", 4, 4.0),
    "gpu_mode": ("dra", "dra", GpuMode.DRA),
    "queueing": ("StrictFIFO", "StrictFIFO", QueueingStrategy.STRICT_FIFO),
    "headroom": ("2GiB", "2GiB", 2 * GIB),
    "headroom_percent": ("5", 5, 5),
    "heartbeat_ttl_seconds": ("120", 120, 120),
    "raw_priority_namespaces": ("platform", ["platform"], ["platform"]),
    "learning_policy": ("raiseOnly", "raiseOnly", Policy.RAISE_ONLY),
    "learning_min_samples": ("3", 3, 3),
    "learning_percentile": ("90", 90, 90),
    "learning_margin_percent": ("10", 10, 10),
    "learning_half_life_seconds": ("3600", 3600, 3600),
    "learning_steady_seconds": ("60", 60, 60),
    "trace_workers": ("3", 3, 3),
    "resync_seconds": ("3", 3, 3.0),
    "leader_election": ("false", False, False),
    "lease_namespace": ("vg", "vg", "vg"),
    "lease_name": ("lease", "lease", "lease"),
    "identity": ("replica-1", "replica-1", "replica-1"),
    "metrics_addr": ("127.0.0.2", "127.0.0.2", "127.0.0.2"),
    "metrics_port": ("9090", 9090, 9090),
    "probe_addr": ("127.0.0.3", "127.0.0.3", "127.0.0.3"),
    "probe_port": ("9091", 9091, 9091),
    "kueue_admission_check": ("true", True, True),
    "kueue_retry_seconds": ("120", 120, 120),
    "train_job_sizing": ("true", True, True),
    "train_job_hold_seconds": ("30", 30, 30),
    "log_level": ("debug", "debug", "debug"),
}


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def flag_argv(name: str, text: str) -> list[str]:
    if name == "leader_election":
        return ["--no-leader-election"]
    if name == "kueue_admission_check":
        return ["--kueue-admission-check"]
    if name == "train_job_sizing":
        return ["--train-job-sizing"]
    return [LOADER.flag(name), text]


def test_the_samples_cover_exactly_the_fields() -> None:
    assert set(SAMPLES) == set(OperatorSettings.model_fields)


def test_the_config_keys_are_the_contracts() -> None:
    keys = (
        "namespaces webhook webhookAddr webhookPort webhookHost webhookConfigName certDir "
        "certHosts certSecretName configmapRetrySeconds gpuMode queueing headroom "
        "headroomPercent heartbeatTtlSeconds rawPriorityNamespaces traceWorkers resyncSeconds "
        "learningPolicy learningMinSamples learningPercentile learningMarginPercent "
        "learningHalfLifeSeconds learningSteadySeconds "
        "leaderElection "
        "leaseNamespace "
        "leaseName identity metricsAddr metricsPort probeAddr probePort logLevel "
        "kueueAdmissionCheck kueueRetrySeconds trainJobSizing trainJobHoldSeconds"
    )
    assert sorted(LOADER.key(n) for n in OperatorSettings.model_fields) == sorted(keys.split())


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_field_is_reachable_from_each_source(name: str, tmp_path: Path) -> None:
    text, in_file, expected = SAMPLES[name]
    default = getattr(load_settings(parse(), environ={}), name)
    assert default != expected
    from_flag = load_settings(parse(*flag_argv(name, text)), environ={})
    from_env = load_settings(parse(), environ={LOADER.env_var(name): text})
    config = tmp_path / "operator.yaml"
    config.write_text(yaml.safe_dump({LOADER.key(name): in_file}))
    from_file = load_settings(parse(), environ={"VRAMGATE_OPERATOR_CONFIG": str(config)})
    assert getattr(from_flag, name) == getattr(from_env, name) == expected
    assert getattr(from_file, name) == expected


def test_flag_beats_env_beats_file_beats_default(tmp_path: Path) -> None:
    config = tmp_path / "operator.yaml"
    config.write_text(
        "webhookPort: 1111\nresyncSeconds: 7\nnamespaces: [a, b]\nleaderElection: false\n"
    )
    env = {"VRAMGATE_OPERATOR_WEBHOOK_PORT": "2222", "VRAMGATE_OPERATOR_RESYNC_SECONDS": "8",
           "VRAMGATE_OPERATOR_NAMESPACES": "c,d"}  # fmt: skip
    s = load_settings(parse("--config", str(config), "--webhook-port", "3333", "-n", "e"), env)
    assert s.webhook_port == 3333
    assert s.resync_seconds == 8.0
    assert s.namespaces == ["e"]
    assert s.leader_election is False  # file over default
    assert s.metrics_port == 8080  # default
    assert load_settings(parse("--config", str(config), "--leader-election"), env).leader_election


def test_the_earlier_flags_keep_working() -> None:
    argv = parse(
        "-n", "a", "--namespace", "b", "--webhook", "serve", "--webhook-addr", "127.0.0.1",
        "--webhook-port", "9444", "--webhook-host", "h", "--webhook-config-name", "cfg",
        "--cert-dir", "/c", "--cert-host", "x", "--cert-host", "y",
        "--configmap-retry-seconds", "2", "--gpu-mode", "visibleDevices",
        "--queueing", "StrictFIFO", "--headroom", "1GiB", "--headroom-percent", "3",
        "--heartbeat-ttl-seconds", "61", "--resync-seconds", "4", "--no-leader-election",
        "--lease-namespace", "ln", "--lease-name", "l", "--identity", "i",
        "--liveness", "http://127.0.0.1:1234/healthz", "-v",
    )  # fmt: skip
    o = load_options(argv, environ={})
    assert o.namespaces == ("a", "b")
    assert (o.webhook, o.webhook_addr, o.webhook_port, o.webhook_host) == (
        WebhookMode.SERVE, "127.0.0.1", 9444, "h",
    )  # fmt: skip
    assert (o.webhook_config, o.cert_dir, o.cert_hosts) == ("cfg", Path("/c"), ("x", "y"))
    assert (o.configmap_retry_s, o.resync_s) == (2.0, 4.0)
    packing = o.admission.packing
    assert packing.gpu_mode is GpuMode.VISIBLE_DEVICES
    assert (packing.headroom_bytes, packing.headroom_percent) == (GIB, 3)
    assert packing.heartbeat_ttl.total_seconds() == 61
    assert o.admission.queueing is QueueingStrategy.STRICT_FIFO
    assert (o.leader_election, o.lease_namespace, o.lease_name, o.identity) == (
        False, "ln", "l", "i",
    )  # fmt: skip
    assert o.liveness == "http://127.0.0.1:1234/healthz"
    assert (o.verbose, o.debug) == (True, False)
    assert load_options(parse("--debug"), environ={}).debug
    assert load_options(parse("-A"), environ={"VRAMGATE_OPERATOR_NAMESPACES": "a"}).namespaces == ()


def test_defaults_come_from_the_pod() -> None:
    env = {"POD_NAMESPACE": "vramgate", "POD_NAME": "vramgate-operator-abc"}
    o = load_options(parse(), environ=env)
    assert (o.lease_namespace, o.identity, o.own_namespace) == (
        "vramgate", "vramgate-operator-abc", "vramgate",
    )  # fmt: skip
    assert load_options(parse(), environ={}).lease_namespace == "default"
    # Outside a pod, two operators on one host must not share a holder name in the Lease.
    assert load_options(parse(), environ={}).identity == f"{socket.gethostname()}-{os.getpid()}"
    assert o.liveness == "http://0.0.0.0:8081/healthz"
    assert (o.metrics_addr, o.metrics_port) == ("0.0.0.0", 8080)
    assert o.cert_secret_name is None
    assert load_options(parse("--probe-addr", "::1"), environ={}).liveness == (
        "http://[::1]:8081/healthz"
    )


def test_the_webhook_may_take_any_free_port() -> None:
    """Port 0: bound by the server itself, which logs (and in managed mode registers) the
    port it got; a port chosen free beforehand may be taken by another program meanwhile."""
    assert load_options(parse("--webhook-port", "0"), environ={}).webhook_port == 0


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            (),
            {"VRAMGATE_OPERATOR_WEBHOOK_PORT": "70000"},
            "VRAMGATE_OPERATOR_WEBHOOK_PORT: must be less than or equal to 65535, got '70000'",
        ),
        (
            (),
            {"VRAMGATE_OPERATOR_WEBHOOK_PORT": "-1"},
            "VRAMGATE_OPERATOR_WEBHOOK_PORT: must be greater than or equal to 0, got '-1'",
        ),
        (
            (),
            {"VRAMGATE_OPERATOR_WEBHOOK": "sometimes"},
            "VRAMGATE_OPERATOR_WEBHOOK: must be 'managed', 'serve' or 'off', got 'sometimes'",
        ),
        (
            (),
            {"VRAMGATE_OPERATOR_HEADROOM": "2"},
            "VRAMGATE_OPERATOR_HEADROOM: invalid size '2': needs a unit",
        ),
        (
            (),
            {"VRAMGATE_OPERATOR_LEADER_ELECTION": "perhaps"},
            "VRAMGATE_OPERATOR_LEADER_ELECTION: must be a valid boolean",
        ),
        (("--log-level", "trace"), {}, "argument --log-level: invalid choice: 'trace'"),
        (("--metrics-port", "70000"), {}, "--metrics-port: must be less than or equal to 65535"),
        (("--liveness", "http://x/healthz"), {}, "--liveness: must be http://ADDR:PORT/healthz"),
        (("-A", "-n", "a"), {}, "-A/--all-namespaces: not allowed with -n/--namespace"),
        (
            ("-n", "team-a", "-n", "Team_A"),
            {},
            "operator: --namespace: each namespace must be a DNS-1123 label",
        ),
        (
            (),
            {"VRAMGATE_OPERATOR_NAMESPACES": '["a","b"]'},
            "VRAMGATE_OPERATOR_NAMESPACES: each namespace must be a DNS-1123 label",
        ),
        (
            ("--raw-priority-namespace", "Platform"),
            {},
            "operator: --raw-priority-namespace: each namespace must be a DNS-1123 label",
        ),
    ],
)
def test_bad_settings_exit_2_with_one_line_naming_the_source(
    argv: tuple[str, ...], env: dict[str, str], message: str,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["operator", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_bad_namespace_in_the_config_file_names_the_file_and_the_name(tmp_path: Path) -> None:
    config = tmp_path / "operator.yaml"
    config.write_text("namespaces: [team-a, Team_A]\n")
    with pytest.raises(SettingsError) as raised:
        load_settings(parse("--config", str(config)), environ={})
    assert str(raised.value).startswith(f"namespaces in {config}: each namespace must be")
    assert str(raised.value).endswith("got 'Team_A'")
    ok = load_settings(parse("-n", "team-a", "-n", "b" * 63), environ={})
    assert ok.namespaces == ["team-a", "b" * 63]


def test_an_unknown_config_key_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "operator.yaml"
    config.write_text("webhookPort: 9443\nliveness: http://0.0.0.0:8081/healthz\n")
    with pytest.raises(SettingsError, match="unknown key 'liveness'; allowed: certDir"):
        load_settings(parse("--config", str(config)), environ={})


def test_help_documents_every_setting_with_its_env_var(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["operator", "--help"])
    flat = "".join(capsys.readouterr().out.split())
    for name in OperatorSettings.model_fields:
        assert LOADER.flag(name) in flat
        assert LOADER.env_var(name) in flat


def test_the_kueue_check_needs_the_device_plugin_and_says_so_in_one_line() -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings(parse("--kueue-admission-check", "--gpu-mode", "visibleDevices"), {})
    assert str(refused.value) == (
        "kueueAdmissionCheck: needs gpuMode devicePlugin (a Kueue Workload's GPUs are its "
        "pods' nvidia.com/gpu requests), got gpuMode visibleDevices"
    )
    assert load_settings(parse("--kueue-admission-check"), {}).kueue_admission_check


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--webhook", "off"], "trainJobSizing: needs the webhook (webhook managed or serve)"),
        (["--gpu-mode", "dra"], "trainJobSizing: needs gpuMode devicePlugin"),
    ],
    ids=["webhook-off", "dra"],
)
def test_trainjob_sizing_needs_the_webhook_and_the_device_plugin(
    argv: list[str], words: str
) -> None:
    """TrainJobs are sized by the mutating webhook, and their GPUs are their pods'
    nvidia.com/gpu: either missing, it would do nothing, so it is refused at start."""
    with pytest.raises(SettingsError) as refused:
        load_settings(parse("--train-job-sizing", *argv), {})
    assert words in str(refused.value) and "\n" not in str(refused.value)
    options = load_options(parse("--train-job-sizing", "--webhook", "serve"), {})
    assert options.train_job_sizing is True
