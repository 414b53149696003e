"""The operator and its webhook against a real API server (the local control plane).

The operator runs as `vramgate operator` in a subprocess, as it would in a pod: real kopf,
real watches, the API server calling the webhook over TLS with the CA the operator generated.
Restarts are real process restarts. Every wait is a poll with a deadline.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from controller.api.base import GROUP, VERSION
from controller.estimator.presets import load_preset
from controller.jobs.spec import estimate_plan, translate
from controller.webhook.registration import (
    MATCH_CONDITIONS,
    MUTATE_HANDLER,
    VALIDATE_HANDLER,
    Registrar,
)
from e2e.cluster import Cluster
from e2e.wait import wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "charts" / "vramgate" / "crds"
PLURAL = "finetunejobs"
WEBHOOK_CONFIG = "vramgate-integration.vramgate.dev"
WEBHOOK_NAME = f"validate-finetunejob.{WEBHOOK_CONFIG}"
LLAMA_QLORA_BYTES = 7_780_056_064
STATUS_DEADLINE_S = 10.0


# -- the operator process -------------------------------------------------------------------


def _free_port() -> int:
    """A port free now, for a program that cannot bind port 0 and say which it got (kopf's
    liveness endpoint): another program may take it before it is bound, so a start that
    finds it taken is retried (`OperatorProcess.start`)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: The operator's log line naming the port its metrics server bound (--metrics-port 0).
METRICS_AT = re.compile(r"metrics on http://127\.0\.0\.1:(\d+)/metrics")
#: How a bind fails on a port another program took (Python's and Go's words).
PORT_TAKEN = "address already in use"
START_TRIES = 3


class PortTaken(Exception):
    """The operator exited at start because a port chosen for it was taken meanwhile."""


class OperatorProcess:
    """`vramgate operator` in a subprocess, with its log in a file."""

    def __init__(
        self,
        cluster: Cluster,
        api: client.ApiClient,
        workdir: Path,
        extra: tuple[str, ...] = (),
        webhook_config: str = WEBHOOK_CONFIG,
    ) -> None:
        self.extra = extra
        self.webhook_config = webhook_config
        self.cluster = cluster
        self.api = api
        self.workdir = workdir
        self.log_path = workdir / "operator.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.log_offset = 0
        self.metrics_port = 0

    def start(self, *, webhook: bool) -> None:
        """Start it and wait until it is live (and its webhook called, with `webhook`).

        Its webhook and metrics servers bind port 0 and say which port they got (the
        metrics one is read from the log); kopf's liveness endpoint cannot, so its port is
        chosen free beforehand, and a start that finds it taken is tried again."""
        for attempt in range(1, START_TRIES + 1):
            try:
                self._start(webhook=webhook)
                return
            except PortTaken:
                if attempt == START_TRIES:
                    raise AssertionError(
                        f"the operator found its ports taken {START_TRIES} times:\n"
                        f"{self.log()[-4000:]}"
                    ) from None

    def _start(self, *, webhook: bool) -> None:
        assert self.proc is None, "already running"
        liveness = _free_port()
        argv = [
            sys.executable, "-m", "controller.cli", "operator",
            "--webhook", "managed" if webhook else "off",
            "--webhook-addr", "127.0.0.1",
            "--webhook-port", "0",
            "--webhook-config-name", self.webhook_config,
            "--cert-dir", str(self.workdir / "certs"),
            "--liveness", f"http://127.0.0.1:{liveness}/healthz",
            # Its own metrics port, so replicas and parallel tests never contend for 8080.
            "--metrics-addr", "127.0.0.1",
            "--metrics-port", "0",
            "--configmap-retry-seconds", "1",
            "--identity", f"{self.workdir.name}-{self.starts}",
            *self.extra,
        ]  # fmt: skip
        self.starts += 1
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            log.write(f"=== start {self.starts} (webhook={webhook}) ===\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env={**self.cluster.env(), "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.metrics_port = int(self._wait(self._metrics_port, "metrics port in its log"))
        self._wait(lambda: _http_ok(f"http://127.0.0.1:{liveness}/healthz"), "liveness")
        if webhook:
            self._wait(self._webhook_refuses, "the webhook to refuse an invalid job")

    def _metrics_port(self) -> int | None:
        found = METRICS_AT.search(self.log_since_start())
        return int(found[1]) if found else None

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as when a node dies or the OOM killer strikes."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        """SIGTERM, as Kubernetes stops a pod; the operator then deletes its webhooks."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self, *, webhook: bool) -> None:
        self.stop()
        self.start(webhook=webhook)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def passes(self) -> int:
        """The admission passes it has made (its pass-duration histogram's count)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if line.startswith("vramgate_admission_pass_duration_seconds_count"):
                return int(float(line.split()[-1]))
        return 0

    def await_passes(self, count: int = 2) -> None:
        """Until `count` more passes have run: the last of them started after this call, so
        whatever a pass would do with the cluster as it is now, it has done (instead of a
        sleep that hopes so)."""
        start = self.passes()
        wait_until(lambda: self.passes() >= start + count, timeout=60,
                   what=f"{count} admission passes")  # fmt: skip

    def log_since_start(self) -> str:
        """What the running process has logged (not its predecessors)."""
        return self.log_path.read_bytes()[self.log_offset :].decode(errors="replace")

    def _wait(self, ready: Any, what: str, timeout: float = 60) -> Any:
        def check() -> Any:
            if self.proc is not None and self.proc.poll() is not None:
                self.proc = None
                if PORT_TAKEN in self.log_since_start().lower():
                    raise PortTaken()
                raise AssertionError(f"the operator exited:\n{self.log()[-4000:]}")
            return ready()

        return wait_until(check, timeout=timeout, what=f"the operator's {what}", interval=0.2)

    def _webhook_refuses(self) -> bool:
        """The API server has picked up the webhook configuration and reaches the server."""
        body = finetunejob("probe", model={"preset": "no-such-model"})
        try:
            _objects(self.api).create_namespaced_custom_object(
                GROUP, VERSION, "default", PLURAL, body, dry_run="All"
            )
        except ApiException as error:
            return f"validate-finetunejob.{self.webhook_config}" in (error.body or "")
        return False


def forget_webhook_configs(api: client.ApiClient, name: str) -> None:
    """Delete the validating and mutating configurations a managed-mode operator registered
    (the operator deletes them at a clean exit; a killed one leaves them behind)."""
    admission = client.AdmissionregistrationV1Api(api)
    for delete in (
        admission.delete_validating_webhook_configuration,
        admission.delete_mutating_webhook_configuration,
    ):
        try:
            delete(name)
        except ApiException as error:
            if error.status != 404:
                raise


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> None:
    applied = cluster.kubectl("apply", "--server-side", "-f", str(CRD_DIR))
    assert applied.returncode == 0, applied.stderr
    names = [f"crd/{p.name.removesuffix('.yaml')}" for p in sorted(CRD_DIR.glob("*.yaml"))]
    established = cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)
    assert established.returncode == 0, established.stderr
    # kubectl resolves `ftj` through discovery, which lags a moment behind Established.
    wait_until(
        lambda: cluster.kubectl("get", "ftj", "-A").returncode == 0,
        timeout=30,
        what="FineTuneJobs in discovery",
    )


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster,
    api_client: client.ApiClient,
    crds: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(cluster, api_client, tmp_path_factory.mktemp("operator"))
    process.start(webhook=True)
    try:
        yield process
    finally:
        process.stop()
        forget_webhook_configs(api_client, WEBHOOK_CONFIG)


def test_a_liveness_port_taken_before_the_operator_binds_it_starts_it_again(
    cluster: Cluster,
    api_client: client.ApiClient,
    crds: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf's liveness endpoint cannot bind port 0 and say which it got: its port is chosen
    free, and another program may take it first. The start is tried again; the metrics
    server binds port 0 and logs the port it got (the webhook's too: every test here)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        chosen: list[int] = []
        free = _free_port

        def first_taken() -> int:
            chosen.append(held.getsockname()[1] if not chosen else free())
            return chosen[-1]

        monkeypatch.setattr(sys.modules[__name__], "_free_port", first_taken)
        process = OperatorProcess(cluster, api_client, tmp_path)
        try:
            process.start(webhook=False)
            log = process.log()
            assert process.metrics_port > 0
            assert _http_ok(f"http://127.0.0.1:{process.metrics_port}/metrics")
        finally:
            process.stop()
    assert len(chosen) == 2
    assert log.count("=== start") == 2 and PORT_TAKEN in log.lower()


# -- objects and polling ---------------------------------------------------------------------


def _objects(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def finetunejob(name: str, **spec: Any) -> dict[str, Any]:
    """The reference job (llama-3.1-8b, QLoRA r=16, 2048 tokens, batch 1, analytic)."""
    base: dict[str, Any] = {
        "model": {"preset": "llama-3.1-8b"},
        "method": "QLoRA",
        "lora": {"rank": 16},
        "training": {"sequenceLength": 2048, "microBatchSize": 1},
        "estimator": {"profile": "Analytic"},
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "FineTuneJob",
        "metadata": {"name": name},
        "spec": {**base, **spec},
    }


def create(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    return dict(
        _objects(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    )


def get(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return dict(_objects(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))


def patch_spec(api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> None:
    _objects(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"spec": spec}
    )


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    conditions = obj.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == type_), None)


def expect_condition(
    api: client.ApiClient,
    namespace: str,
    name: str,
    type_: str,
    status: str,
    reason: str | None = None,
    timeout: float = STATUS_DEADLINE_S,
) -> dict[str, Any]:
    """Wait until the job's `type_` condition has `status` (and `reason`) for its current
    generation; returns the object."""

    def met() -> dict[str, Any] | None:
        obj = get(api, namespace, name)
        found = condition(obj, type_)
        current = found and found.get("observedGeneration") == obj["metadata"]["generation"]
        if current and found["status"] == status and reason in (None, found["reason"]):
            return obj
        return None

    want = f"{type_}={status}" + (f" ({reason})" if reason else "")
    return wait_until(met, timeout=timeout, what=f"{namespace}/{name} {want}")


def events_for(api: client.ApiClient, namespace: str, name: str) -> list[client.CoreV1Event]:
    listed = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    )
    return list(listed.items)


def expected_bytes(**spec: Any) -> int:
    plan, errors = translate(finetunejob("x", **spec)["spec"])
    assert plan is not None, errors
    return estimate_plan(plan).total_bytes


# -- tests ------------------------------------------------------------------------------------


def test_a_job_is_estimated_within_ten_seconds(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    created = time.monotonic()
    create(api_client, namespace, finetunejob("llama"))
    obj = expect_condition(api_client, namespace, "llama", "Estimated", "True", "Estimated")
    assert time.monotonic() - created < STATUS_DEADLINE_S
    status = obj["status"]
    assert status["estimate"]["totalBytes"] == LLAMA_QLORA_BYTES
    assert status["estimate"]["total"] == status["estimate"]["perGpu"] == "7.25 GiB"
    assert status["estimate"]["model"] == "llama-3.1-8b"
    assert status["observedGeneration"] == obj["metadata"]["generation"] == 1
    estimated = condition(obj, "Estimated")
    assert estimated is not None
    assert estimated["message"] == "7.25 GiB per GPU on 1 GPU with FSDP"
    admitted = condition(obj, "Admitted")
    assert admitted is not None and (admitted["status"], admitted["reason"]) == (
        "False",
        "NoTemplate",
    )
    assert admitted["message"].startswith("spec.template is empty, so there is nothing to run")
    # One Event for the write that carried both: the decision (the estimate is in its condition).
    event = wait_until(
        lambda: [e for e in events_for(api_client, namespace, "llama") if e.reason == "NoTemplate"],
        timeout=STATUS_DEADLINE_S,
        what="the NoTemplate event",
    )[0]
    assert event.type == "Normal" and event.message.startswith("spec.template is empty")
    assert not [e for e in events_for(api_client, namespace, "llama") if e.reason == "Estimated"]


def test_the_printer_columns_show_the_estimate(
    operator: OperatorProcess, cluster: Cluster, api_client: client.ApiClient, namespace: str
) -> None:
    create(api_client, namespace, finetunejob("shown"))
    expect_condition(api_client, namespace, "shown", "Estimated", "True")
    listed = cluster.kubectl("get", "ftj", "shown", "-n", namespace)
    header, row = listed.stdout.splitlines()
    assert header.split()[:7] == [
        "NAME",
        "METHOD",
        "MODEL",
        "GPUS",
        "VRAM/GPU",
        "ADMITTED",
        "REASON",
    ]
    shown = ["shown", "QLoRA", "llama-3.1-8b", "1", "7.25", "GiB", "False", "NoTemplate"]
    assert row.split()[:8] == shown


def test_a_spec_change_is_followed(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    create(api_client, namespace, finetunejob("grows"))
    before = expect_condition(api_client, namespace, "grows", "Estimated", "True")
    patch_spec(api_client, namespace, "grows", {"training": {"sequenceLength": 4096}})
    after = expect_condition(api_client, namespace, "grows", "Estimated", "True")
    assert after["metadata"]["generation"] == after["status"]["observedGeneration"] == 2
    total = after["status"]["estimate"]["totalBytes"]
    assert total == expected_bytes(training={"sequenceLength": 4096, "microBatchSize": 1})
    assert total > LLAMA_QLORA_BYTES
    was, now = condition(before, "Estimated"), condition(after, "Estimated")
    assert was is not None and now is not None
    assert now["lastTransitionTime"] == was["lastTransitionTime"], "status stayed True"


def test_the_webhook_refuses_invalid_specs_through_kubectl(
    operator: OperatorProcess, cluster: Cluster, namespace: str
) -> None:
    manifest = textwrap.dedent(
        """\
        apiVersion: vramgate.dev/v1alpha1
        kind: FineTuneJob
        metadata:
          name: too-long
        spec:
          model:
            preset: llama-3.1-8b
          method: QLoRA
          lora:
            rank: 16
            targetModules: [q_proj, attn]
          training:
            sequenceLength: 200000
        """
    )
    applied = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest)
    assert applied.returncode != 0
    assert f'admission webhook "{WEBHOOK_NAME}" denied the request: ' in applied.stderr
    assert (
        "spec.lora.targetModules: unknown module 'attn' for this model; allowed: all-linear"
        in applied.stderr
    )
    assert "sequenceLength" not in applied.stderr  # beyond the context is a warning, not an error
    assert cluster.kubectl("get", "ftj", "too-long", "-n", namespace).returncode != 0


def test_a_sequence_beyond_the_context_is_admitted_with_a_warning_kubectl_prints(
    operator: OperatorProcess, cluster: Cluster, namespace: str
) -> None:
    manifest = textwrap.dedent(
        """\
        apiVersion: vramgate.dev/v1alpha1
        kind: FineTuneJob
        metadata:
          name: long-context
        spec:
          model:
            preset: tinyllama-1.1b
          method: QLoRA
          lora:
            rank: 16
          training:
            sequenceLength: 4096
        """
    )
    # A model of 2,048 tokens: twice its context still fits any GPU node the cluster may hold.
    applied = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest)
    assert applied.returncode == 0, applied.stderr
    assert "Warning: vramgate: spec.training.sequenceLength: 4096 is longer than" in (
        applied.stderr
    )


def test_a_lora_job_without_a_rank_is_refused_at_apply(cluster: Cluster, namespace: str) -> None:
    """The CRD's own rule refuses it, so this holds even when the webhook is not running."""
    manifest = textwrap.dedent(
        """\
        apiVersion: vramgate.dev/v1alpha1
        kind: FineTuneJob
        metadata:
          name: no-rank
        spec:
          model:
            preset: llama-3.1-8b
          method: LoRA
        """
    )
    applied = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest)
    assert applied.returncode != 0
    assert "lora.rank is required when method is LoRA or QLoRA" in applied.stderr
    assert cluster.kubectl("get", "ftj", "no-rank", "-n", namespace).returncode != 0


def test_the_webhook_refuses_invalid_specs_through_the_python_client(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    with pytest.raises(ApiException) as caught:
        create(api_client, namespace, finetunejob("typo", model={"preset": "llama-8b"}))
    assert caught.value.status == 422
    message = json.loads(caught.value.body)["message"]
    assert message.startswith(f'admission webhook "{WEBHOOK_NAME}" denied the request: ')
    assert message.endswith(
        "spec.model.preset: unknown preset 'llama-8b'; closest: llama-3.1-8b, llama-3.2-3b, "
        "llama-3.2-1b, llama-3.3-70b, llama-3.1-70b (see `vramgate presets`)"
    )


def test_the_schema_refuses_an_ambiguous_model_without_the_webhook(
    crds: None, cluster: Cluster, namespace: str
) -> None:
    body = finetunejob("ambiguous", model={"preset": "llama-3.1-8b", "configMapRef": {"name": "c"}})
    applied = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(body))
    assert applied.returncode != 0
    assert "spec.model: Invalid value" in applied.stderr
    assert "must set exactly one of preset, config, configMapRef" in applied.stderr


def test_the_schema_refuses_a_gpu_count_outside_the_resize_bounds_without_the_webhook(
    crds: None, cluster: Cluster, namespace: str
) -> None:
    """Resize tries the asked count first, so a count outside its bounds would be admitted.
    Each error names the bound the count breaks, at spec.resources.gpus."""
    low = finetunejob("below", admissionPolicy="Resize", resources={"gpus": 1, "minGPUs": 2})
    high = finetunejob("above", resources={"gpus": 8, "maxGPUs": 4})
    inside = finetunejob("inside", resources={"gpus": 3, "minGPUs": 2, "maxGPUs": 4})
    for body, said in (
        (low, "must be greater than or equal to minGPUs"),
        (high, "must be less than or equal to maxGPUs"),
    ):
        applied = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(body))
        assert applied.returncode != 0
        assert "spec.resources.gpus: Invalid value" in applied.stderr
        assert said in applied.stderr
        assert applied.stderr.count("Invalid value") == 1, applied.stderr
    applied = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(inside))
    assert applied.returncode == 0, applied.stderr


def test_the_schema_refuses_no_gpus_without_naming_bounds_nobody_set(
    crds: None, cluster: Cluster, namespace: str
) -> None:
    """The API server defaults minGPUs to 1 before the rules run: gpus 0 (or -1) without
    minGPUs or maxGPUs is told only the field's minimum, not that it lies outside them."""
    for gpus in (0, -1):
        body = finetunejob("zero" if gpus == 0 else "negative", resources={"gpus": gpus})
        applied = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(body))
        assert applied.returncode != 0
        assert "spec.resources.gpus: Invalid value" in applied.stderr
        assert "should be greater than or equal to 1" in applied.stderr
        assert "minGPUs" not in applied.stderr and "maxGPUs" not in applied.stderr, applied.stderr


def test_without_the_webhook_an_invalid_job_is_marked_invalid(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    message = (
        "spec.model.preset: unknown preset 'llama-8b'; closest: llama-3.1-8b, llama-3.2-3b, "
        "llama-3.2-1b, llama-3.3-70b, llama-3.1-70b (see `vramgate presets`)"
    )
    operator.restart(webhook=False)
    try:
        create(api_client, namespace, finetunejob("typo", model={"preset": "llama-8b"}))
        obj = expect_condition(api_client, namespace, "typo", "Estimated", "False", "InvalidSpec")
        # kopf posts events from a queue after the status write: wait for it before the
        # restart stops the operator that queued it (CI once stopped it first).
        warnings = wait_until(
            lambda: [e for e in events_for(api_client, namespace, "typo") if e.type == "Warning"],
            timeout=STATUS_DEADLINE_S,
            what="the InvalidSpec event",
        )
    finally:
        operator.restart(webhook=True)
    estimated, admitted = condition(obj, "Estimated"), condition(obj, "Admitted")
    assert estimated is not None and estimated["message"] == message
    assert admitted is not None and (admitted["status"], admitted["reason"]) == (
        "False",
        "InvalidSpec",
    )
    assert "estimate" not in obj["status"]
    assert warnings[0].reason == "InvalidSpec" and warnings[0].message == message

    # With the webhook back: metadata of the invalid object can still change, its spec
    # only to a valid one.
    _objects(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "typo", {"metadata": {"labels": {"team": "a"}}}
    )
    with pytest.raises(ApiException, match=r"spec\.model\.preset: unknown preset 'llama-8b'"):
        patch_spec(api_client, namespace, "typo", {"training": {"sequenceLength": 4096}})
    patch_spec(api_client, namespace, "typo", {"model": {"preset": "llama-3.1-8b"}})
    fixed = expect_condition(api_client, namespace, "typo", "Estimated", "True", "Estimated")
    assert fixed["status"]["estimate"]["totalBytes"] == LLAMA_QLORA_BYTES


def test_a_managed_operator_registers_the_charts_webhooks_and_removes_them_at_exit(
    operator: OperatorProcess, api_client: client.ApiClient
) -> None:
    """What `--webhook managed` registers is what the chart installs (the matchConditions
    above all: kopf's own configurations had none), calling this operator; a clean exit
    deletes both, and a start registers them again."""
    admission = client.AdmissionregistrationV1Api(api_client)

    def configs() -> list[Any]:
        found = []
        for read in (
            admission.read_validating_webhook_configuration,
            admission.read_mutating_webhook_configuration,
        ):
            try:
                found.append(api_client.sanitize_for_serialization(read(WEBHOOK_CONFIG)))
            except ApiException as error:
                assert error.status == 404
        return found

    validating, mutating = configs()
    for config, handler in ((validating, VALIDATE_HANDLER), (mutating, MUTATE_HANDLER)):
        (webhook,) = config["webhooks"]
        assert webhook["name"] == f"{handler}.{WEBHOOK_CONFIG}"
        assert webhook["matchConditions"] == MATCH_CONDITIONS[handler]
        assert webhook["clientConfig"]["url"].endswith(f"/{handler}")
        assert webhook["clientConfig"]["caBundle"]
        assert webhook["failurePolicy"] == "Ignore"
    operator.stop()
    assert configs() == [], "a clean exit leaves no configuration calling a dead port"
    operator.start(webhook=True)  # waits for the webhook to refuse an invalid job
    assert len(configs()) == 2


def test_a_registrar_deletes_only_the_configurations_that_still_call_its_server(
    api_client: client.ApiClient,
) -> None:
    """Two managed operators (replicas, or the old and new pod of a rolling update): the last
    to register is called, and the first one's exit leaves its configurations alone."""
    name = "vramgate-registrar-test.vramgate.dev"
    admission = client.AdmissionregistrationV1Api(api_client)
    first, second = Registrar(api_client, name), Registrar(api_client, name)

    def url() -> str:
        config = admission.read_validating_webhook_configuration(name)
        return str(config.webhooks[0].client_config.url)

    try:
        first.register("https://127.0.0.1:1001", None)
        second.register("https://127.0.0.1:1002", None)  # exists: replaced at its version
        assert url() == f"https://127.0.0.1:1002/{VALIDATE_HANDLER}"
        first.unregister()
        assert url() == f"https://127.0.0.1:1002/{VALIDATE_HANDLER}", "not first's any more"
        second.unregister()
        for read in (
            admission.read_validating_webhook_configuration,
            admission.read_mutating_webhook_configuration,
        ):
            with pytest.raises(ApiException) as gone:
                read(name)
            assert gone.value.status == 404
        second.unregister()  # nothing left: nothing to do, no error
    finally:
        forget_webhook_configs(api_client, name)


def test_a_restart_changes_nothing_already_recorded(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    create(api_client, namespace, finetunejob("steady"))
    create(api_client, namespace, finetunejob("edited"))
    before = expect_condition(api_client, namespace, "steady", "Estimated", "True")
    expect_condition(api_client, namespace, "edited", "Estimated", "True")

    operator.stop()
    patch_spec(api_client, namespace, "edited", {"training": {"microBatchSize": 2}})
    operator.start(webhook=True)

    edited = expect_condition(api_client, namespace, "edited", "Estimated", "True")
    assert edited["status"]["observedGeneration"] == 2, "a change made while down is picked up"
    # That write came from a pass over every job, the unchanged one included.
    after = get(api_client, namespace, "steady")
    assert after["status"] == before["status"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], (
        "nothing at all was written"
    )


def test_a_model_from_a_configmap_is_estimated_once_the_configmap_exists(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    spec = {"model": {"configMapRef": {"name": "qwen"}}, "method": "LoRA", "lora": {"rank": 8}}
    create(api_client, namespace, finetunejob("from-configmap", **spec))
    waiting = expect_condition(
        api_client, namespace, "from-configmap", "Estimated", "False", "ConfigMapUnavailable"
    )
    message = condition(waiting, "Estimated")["message"]  # type: ignore[index]
    assert message == f"spec.model.configMapRef.name: ConfigMap {namespace}/qwen not found"
    admitted = condition(waiting, "Admitted")  # what `kubectl get ftj` shows
    assert admitted is not None
    assert (admitted["status"], admitted["reason"]) == ("False", "ConfigMapUnavailable")
    assert admitted["message"] == f"not admitted until estimated: {message}"

    config = json.dumps(load_preset("qwen2.5-0.5b").config_dict())
    client.CoreV1Api(api_client).create_namespaced_config_map(
        namespace, {"metadata": {"name": "qwen"}, "data": {"config.json": config}}
    )
    obj = expect_condition(api_client, namespace, "from-configmap", "Estimated", "True")
    estimate = obj["status"]["estimate"]
    assert estimate["model"] == "configmaps/qwen[config.json]"
    assert estimate["totalBytes"] == expected_bytes(**{**spec, "model": {"preset": "qwen2.5-0.5b"}})


def test_a_waiting_jobs_configmap_is_read_again_when_it_changes(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    """The spec does not change when its ConfigMap does: a job estimated once was InvalidSpec
    for good after its config was fixed, and a queued job was admitted on the estimate of a
    config since replaced. While it waits, the ConfigMap is read again (here every 1 s, on
    the next pass)."""
    core = client.CoreV1Api(api_client)
    spec = {"model": {"configMapRef": {"name": "changing"}}, "method": "LoRA", "lora": {"rank": 8}}
    broken = {**load_preset("qwen2.5-0.5b").config_dict(), "hidden_size": -5}
    core.create_namespaced_config_map(namespace, {
        "metadata": {"name": "changing"}, "data": {"config.json": json.dumps(broken)}})  # fmt: skip
    create(api_client, namespace, finetunejob("follows-configmap", **spec))
    expect_condition(api_client, namespace, "follows-configmap", "Estimated", "False",
                     "InvalidSpec")  # fmt: skip
    for preset in ("qwen2.5-0.5b", "qwen2.5-1.5b"):  # fixed, then another model
        config = json.dumps(load_preset(preset).config_dict())
        core.patch_namespaced_config_map("changing", namespace, {"data": {"config.json": config}})
        expected = expected_bytes(**{**spec, "model": {"preset": preset}})
        wait_until(
            lambda want=expected: get(api_client, namespace, "follows-configmap")["status"]
            .get("estimate", {}).get("totalBytes") == want,
            # read again on the first pass 1 s after the last read: the resync's, 10 s apart
            timeout=STATUS_DEADLINE_S + 15, what=f"the estimate of {preset}'s config",
        )  # fmt: skip
        expect_condition(api_client, namespace, "follows-configmap", "Estimated", "True")
