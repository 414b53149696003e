"""The handler's error classes: spec errors recorded, ConfigMap trouble retried, bugs recorded.

The handler runs here without kopf's reactor: a real `kopf.Patch`, a fake ConfigMap reader,
and `kopf.event` captured. The same handler against a real API server is in
tests/integration/test_operator.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kopf
import pytest
from kubernetes.client.rest import ApiException

from controller.cli import main
from controller.errors import ProfileUnavailable
from controller.jobspec import ConfigMapKey
from controller.operator import handlers
from controller.operator.configmaps import ConfigMapUnavailable, read_model_config
from controller.operator.errors import PROFILE_RETRY_S
from tests.unit.conftest import QWEN25_05B

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


class FakeConfigMaps:
    """`CoreV1Api.read_namespaced_config_map` over a dict of name -> data."""

    def __init__(self, maps: dict[str, dict[str, str]]) -> None:
        self.maps = maps
        self.reads = 0

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        self.reads += 1
        if name not in self.maps:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=self.maps[name])


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    posted: list[tuple[str, str, str]] = []

    def capture(body: Any, *, type: str, reason: str, message: str = "") -> None:
        posted.append((type, reason, message))

    monkeypatch.setattr(kopf, "event", capture)
    return posted


def _reconcile(
    spec: dict[str, Any], maps: FakeConfigMaps | None = None, status: dict[str, Any] | None = None
) -> kopf.Patch:
    body = {
        "apiVersion": "vramgate.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": "j", "namespace": "ns", "generation": 3, "uid": "u"},
        "spec": spec,
        "status": status or {},
    }
    patch = kopf.Patch()
    asyncio.run(
        handlers.reconcile(
            body=kopf.Body(body),
            spec=spec,
            meta=body["metadata"],
            status=body["status"],
            namespace="ns",
            patch=patch,
            memo=kopf.Memo(core=maps or FakeConfigMaps({})),
            logger=logging.getLogger("test"),
            now=lambda: NOW,
            configmap_retry_s=7,
        )
    )
    return patch


def _condition(patch: kopf.Patch, type_: str) -> dict[str, Any]:
    return next(c for c in patch["status"]["conditions"] if c["type"] == type_)


def test_a_valid_job_is_estimated(events: list[tuple[str, str, str]]) -> None:
    patch = _reconcile(
        {
            "model": {"preset": "llama-3.1-8b"},
            "method": "QLoRA",
            "lora": {"rank": 16},
            "estimator": {"profile": "Analytic"},
        }
    )
    assert patch["status"]["estimate"]["totalBytes"] == 7_780_056_064
    assert patch["status"]["observedGeneration"] == 3
    assert _condition(patch, "Estimated")["observedGeneration"] == 3
    assert [e[:2] for e in events] == [("Normal", "Estimated")]


def test_an_invalid_spec_is_recorded_not_raised(events: list[tuple[str, str, str]]) -> None:
    patch = _reconcile({"model": {"preset": "nope"}, "method": "QLoRA", "lora": {"rank": 16}})
    assert _condition(patch, "Estimated")["reason"] == "InvalidSpec"
    assert events[0][:2] == ("Warning", "InvalidSpec")


def test_an_unchanged_job_writes_nothing(events: list[tuple[str, str, str]]) -> None:
    spec = {"model": {"preset": "llama-3.1-8b"}, "method": "QLoRA", "lora": {"rank": 16}}
    status = _reconcile(spec)["status"]
    events.clear()
    assert _reconcile(spec, status=status) == {}
    assert events == []


def test_a_missing_configmap_is_recorded_and_retried(events: list[tuple[str, str, str]]) -> None:
    spec = {"model": {"configMapRef": {"name": "cfg"}}, "method": "LoRA"}
    with pytest.raises(kopf.TemporaryError) as caught:
        _reconcile(spec)
    assert caught.value.delay == 7
    assert str(caught.value) == "spec.model.configMapRef.name: ConfigMap ns/cfg not found"


def test_the_status_is_patched_before_the_retry(
    events: list[tuple[str, str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    patches: list[kopf.Patch] = []
    original = kopf.Patch

    def recording_patch() -> kopf.Patch:
        patches.append(original())
        return patches[-1]

    monkeypatch.setattr(kopf, "Patch", recording_patch)
    with pytest.raises(kopf.TemporaryError):
        _reconcile({"model": {"configMapRef": {"name": "cfg"}}, "method": "LoRA"})
    assert _condition(patches[0], "Estimated")["reason"] == "ConfigMapUnavailable"
    assert events[0][:2] == ("Warning", "ConfigMapUnavailable")


def test_a_configmap_model_is_read_and_estimated(events: list[tuple[str, str, str]]) -> None:
    maps = FakeConfigMaps({"cfg": {"model.json": json.dumps(QWEN25_05B)}})
    spec = {
        "model": {"configMapRef": {"name": "cfg", "key": "model.json"}},
        "method": "LoRA",
        "lora": {"rank": 8},
    }
    patch = _reconcile(spec, maps)
    assert patch["status"]["estimate"]["model"] == "configmaps/cfg[model.json]"
    assert maps.reads == 1


def test_an_estimator_bug_is_recorded_once_not_retried(
    events: list[tuple[str, str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(plan: Any) -> Any:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(handlers, "estimate_plan", broken)
    patch = _reconcile(
        {"model": {"preset": "llama-3.1-8b"}, "method": "QLoRA", "lora": {"rank": 16}}
    )
    estimated = _condition(patch, "Estimated")
    assert estimated["reason"] == "EstimationFailed"
    assert estimated["message"] == "the estimator failed: ZeroDivisionError: division by zero"


def test_a_profile_the_operator_lacks_is_recorded_and_retried_later(
    events: list[tuple[str, str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_trace(plan: Any) -> Any:
        raise ProfileUnavailable("spec.estimator.profile: trace needs the `trace` extra")

    monkeypatch.setattr(handlers, "estimate_plan", no_trace)
    patches: list[kopf.Patch] = []
    original = kopf.Patch

    def recording_patch() -> kopf.Patch:
        patches.append(original())
        return patches[-1]

    monkeypatch.setattr(kopf, "Patch", recording_patch)
    with pytest.raises(kopf.TemporaryError) as caught:
        _reconcile({"model": {"preset": "llama-3.1-8b"}, "method": "LoRA", "lora": {"rank": 8}})
    assert caught.value.delay == PROFILE_RETRY_S
    assert _condition(patches[0], "Estimated")["reason"] == "ProfileUnavailable"
    assert _condition(patches[0], "Admitted")["reason"] == "Pending"
    assert events[0][:2] == ("Warning", "ProfileUnavailable")


@pytest.mark.parametrize(
    ("maps", "ref", "message"),
    [
        ({}, ConfigMapKey("cfg"), "spec.model.configMapRef.name: ConfigMap ns/cfg not found"),
        (
            {"cfg": {"other": "{}"}},
            ConfigMapKey("cfg"),
            "spec.model.configMapRef.key: ConfigMap ns/cfg has no key 'config.json' (keys: other)",
        ),
        (
            {"cfg": {"config.json": "{not json"}},
            ConfigMapKey("cfg"),
            "spec.model.configMapRef.key: ConfigMap ns/cfg key 'config.json' is not valid JSON",
        ),
        (
            {"cfg": {"config.json": "[1, 2]"}},
            ConfigMapKey("cfg"),
            "spec.model.configMapRef.key: ConfigMap ns/cfg key 'config.json' must hold a JSON "
            "object",
        ),
    ],
)
def test_configmap_problems_name_the_field(
    maps: dict[str, dict[str, str]], ref: ConfigMapKey, message: str
) -> None:
    with pytest.raises(ConfigMapUnavailable) as caught:
        read_model_config(FakeConfigMaps(maps), "ns", ref)
    assert str(caught.value).startswith(message)


def test_a_forbidden_read_says_so() -> None:
    class Forbidden(FakeConfigMaps):
        def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
            raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(ConfigMapUnavailable, match="cannot read ConfigMap ns/cfg: 403 Forbidden"):
        read_model_config(Forbidden({}), "ns", ConfigMapKey("cfg"))


def test_registration_covers_create_update_resume_and_the_webhook() -> None:
    registry = kopf.OperatorRegistry()
    handlers.register(registry, validating_webhook=True)
    changing = registry._changing.get_all_handlers()
    assert {str(h.reason) for h in changing if h.reason} == {"create", "update"}
    assert [h.id for h in changing if h.initial] == [handlers.ESTIMATE_HANDLER], "resume"
    (webhook,) = registry._webhooks.get_all_handlers()
    assert webhook.id == handlers.VALIDATE_HANDLER and webhook.ignore_failures
    bare = kopf.OperatorRegistry()
    handlers.register(bare, validating_webhook=False)
    assert bare._webhooks.get_all_handlers() == []


# -- `vramgate operator` start-up errors -------------------------------------------------


def test_no_credentials_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert main(["operator", "--webhook", "off"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("vramgate operator: no Kubernetes credentials: ")


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--webhook-port=0", "--webhook-port: must be between 1 and 65535, got 0"),
        ("--configmap-retry-seconds=0", "--configmap-retry-seconds: must be greater than 0"),
        ("--webhook=sometimes", "argument --webhook: invalid choice: 'sometimes'"),
    ],
)
def test_bad_flags_exit_2(flag: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["operator", flag]) == 2
    assert message in capsys.readouterr().err
