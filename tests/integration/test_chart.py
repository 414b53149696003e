"""The Helm chart: rendered, linted, installed into the real local control plane, and its RBAC
proven enough (the operator and the agent run as the chart's ServiceAccounts) and not more
(`kubectl auth can-i --as`).

Render tests run the pinned helm on the chart alone; the install tests share one release in
a namespace of their own, in file order: install, run the operator and the agent as the
chart's ServiceAccounts, check their rights, upgrade, uninstall.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from controller.admission.kueue import CONTROLLER as KUEUE_CONTROLLER
from controller.api.base import GROUP, PRODUCT_LABEL, VERSION
from controller.operator.handlers import MUTATE_HANDLER, VALIDATE_HANDLER
from controller.webhook.registration import configurations
from e2e.build import ensure_binaries
from e2e.cluster import Cluster
from e2e.nodes import RUN_FOR_ANNOTATION
from e2e.wait import wait_until
from tests.integration.test_admission import QLORA, admitted, batch_job
from tests.integration.test_agent import gpunode as read_gpunode
from tests.integration.test_agent import gpus_yaml, wait_ready
from tests.integration.test_operator import OperatorProcess

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "vramgate"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
MONITORING = "monitoring.coreos.com/v1"
KUEUE_GROUP = "kueue.x-k8s.io"
RELEASE = "vg"
FULLNAME = "vg-vramgate"
OPERATOR_SA = f"{FULLNAME}-operator"
AGENT_SA = f"{FULLNAME}-agent"
CRD_NAMES = (
    "finetunejobs.vramgate.dev",
    "gpunodes.vramgate.dev",
    "learnedcorrections.vramgate.dev",
)


# -- rendering ------------------------------------------------------------------------------


@functools.cache
def _helm() -> str:
    return str(ensure_binaries(["helm"])["helm"])


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_helm(), *args], capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "HELM_CACHE_HOME": "/tmp/vramgate-helm-cache"},
    )  # fmt: skip


def render(*args: str, namespace: str = "vramgate") -> list[dict[str, Any]]:
    """The chart's objects for these helm arguments (--set, -f, --api-versions)."""
    done = helm("template", RELEASE, str(CHART), "--namespace", namespace, *args)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        o for o in objects
        if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]  # fmt: skip


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = find(objects, kind, name)
    return found


def operator_config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    config_map = one(objects, "ConfigMap", f"{FULLNAME}-operator-config")
    return dict(yaml.safe_load(config_map["data"]["operator.yaml"]))


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.name if v else "defaults")
def test_helm_lint_strict_passes_with_the_schema(values: Path | None) -> None:
    extra = ["--values", str(values)] if values else []
    done = helm("lint", "--strict", str(CHART), *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    # Lint only logs a template's `fail`; rendering must pass too, with the monitoring API.
    render(*extra, "--api-versions", MONITORING)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "operator.replicass=2"], "additional properties 'replicass' not allowed"),
        (["--set", "operator.config.gpuModes=dra"], "additional properties 'gpuModes'"),
        (["--set", "operator.replicas=two"], "got string, want integer"),
        (["--set-string", "crds.install=yes"], "got string, want boolean"),
        (["--set", "webhook.failurePolicy=Sometimes"], "failurePolicy"),
        (["--set", "operator.config.headroomPercent=80"], "maximum"),
        (["--set", "agent.backend=cuda"], "backend"),
        (["--set", "agent.backend=static"], "minItems"),  # static needs its GPUs
        (["--set", "agent.backend=dcgm"], "dcgmUrl"),  # dcgm needs the exporter's URL
        (["--set", "webhook.timeoutSeconds=60"], "timeoutSeconds"),
        (["--set", "operator.config.namespaces={Team_A}"], "namespaces"),
        (["--set", "operator.config.leaseName=My_Lease"], "leaseName"),
        (["--set", "nameOverride=Vram.gate"], "nameOverride"),
        (["--set", "fullnameOverride=-x"], "fullnameOverride"),
        (["--set", "dashboard.namespace=Grafana"], "namespace"),
        (["--set", "image.digest=sha256:abc"], "digest"),
        (["--set-string", "operator.podDisruptionBudget.minAvailable=one"], "minAvailable"),
        # The ServiceMonitor CRD's Duration: no fractions, no units below ms (it refused
        # 1.5m at install, after the schema had let it through).
        (["--set-string", "metrics.serviceMonitor.interval=1.5m"], "interval"),
        (["--set", "agent.maxUnavailable=0"], "maxUnavailable"),
        (["--set-string", "agent.maxUnavailable=some"], "maxUnavailable"),
        # Labels written beside matchLabels, not in it: a selector that matches everything.
        (["--set", "webhook.namespaceSelector.gpu=allowed"], "additional properties 'gpu'"),
        (["--set", "kueue.admissionCheck.retrySeconds=0"], "retrySeconds"),
        (["--set", "kueue.admissionCheck.retrySeconds=3601"], "retrySeconds"),
        (["--set-json", "kueue.admissionCheck.retrySeconds=1.5"], "retrySeconds"),
        (["--set", "kueue.admissionCheck.name=VRAM_check"], "admissionCheck/name"),
        # One way to set each: the kueue block, which the chart writes into the config.
        (["--set", "operator.config.kueueAdmissionCheck=true"],
         "additional properties 'kueueAdmissionCheck' not allowed"),
        (["--set", "operator.config.kueueRetrySeconds=60"],
         "additional properties 'kueueRetrySeconds' not allowed"),
    ],
    ids=["unknown-key", "unknown-config-key", "int-type", "bool-type", "enum", "maximum",
         "backend-enum", "static-needs-gpus", "dcgm-needs-url", "timeout-range",
         "namespace-name", "lease-name", "name-override", "fullname-override",
         "dashboard-namespace", "digest", "min-available-string", "monitor-interval",
         "max-unavailable-zero", "max-unavailable-word", "namespace-selector-bare-label",
         "kueue-retry-zero", "kueue-retry-above-an-hour", "kueue-retry-fraction",
         "kueue-check-name", "kueue-config-key", "kueue-retry-config-key"],
)  # fmt: skip
def test_the_schema_refuses_unknown_keys_and_wrong_types(args: list[str], message: str) -> None:
    done = helm("template", RELEASE, str(CHART), *args)
    assert done.returncode != 0
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert message in done.stderr, done.stderr


def test_more_than_one_replica_without_leader_election_is_refused() -> None:
    done = helm("template", RELEASE, str(CHART), "--set", "operator.config.leaderElection=false")
    assert done.returncode != 0
    (line,) = [x for x in done.stderr.splitlines() if "leaderElection" in x]
    assert "operator.replicas=2" in line and "operator.config.leaderElection=true" in line
    # One replica without the Lease is fine.
    render("--set", "operator.config.leaderElection=false", "--set", "operator.replicas=1")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--set", "operator.ports.probes=8080"], ["webhook=9443", "metrics=8080", "probes=8080"]),
        (["--set", "operator.podDisruptionBudget.minAvailable=2"],
         ["minAvailable=2", "operator.replicas=2"]),
        (["--set-string", "operator.podDisruptionBudget.minAvailable=100%"],
         ["minAvailable=100%", "operator.replicas=2"]),
        (["--set", "agent.config.pollIntervalSeconds=60"],
         ["pollIntervalSeconds=60", "heartbeatIntervalSeconds=30"]),
        (["--set", "operator.config.heartbeatTtlSeconds=50"],
         ["heartbeatIntervalSeconds=30", "heartbeatTtlSeconds=50"]),
        (["--set", "agent.config.backoffInitialSeconds=120"],
         ["backoffInitialSeconds=120", "backoffMaxSeconds=60"]),
        (["--set", "commonLabels.app\\.kubernetes\\.io/name=mine"],
         ["commonLabels.app.kubernetes.io/name"]),
        (["--set", "commonLabels.helm\\.sh/chart=mine"], ["commonLabels.helm.sh/chart"]),
        # The selector's own label, overridden in the pod template: a Deployment that does
        # not select its pods.
        (["--set", "operator.podLabels.app\\.kubernetes\\.io/name=mine"],
         ["operator.podLabels.app.kubernetes.io/name"]),
        (["--set", "agent.podLabels.app\\.kubernetes\\.io/instance=mine"],
         ["agent.podLabels.app.kubernetes.io/instance"]),
        # Rounded up as the disruption controller does: 99% of 2 replicas is 2.
        (["--set-string", "operator.podDisruptionBudget.minAvailable=99%"],
         ["minAvailable=99%", "operator.replicas=2"]),
        (["--set", "image.trace=true", "--set", "image.digest=sha256:" + "a" * 64],
         ["image.traceDigest", "image.digest"]),
        # The operator refuses this combination at start: the chart says so at install.
        (["--set", "kueue.admissionCheck.enabled=true",
          "--set", "operator.config.gpuMode=visibleDevices"],
         ["kueue.admissionCheck.enabled", "gpuMode=devicePlugin", "visibleDevices"]),
    ],
    ids=["ports-repeat", "pdb-all-replicas", "pdb-100-percent", "poll-above-heartbeat",
         "heartbeat-above-half-the-ttl", "backoff-initial-above-max",
         "common-label-app", "common-label-chart", "pod-label-operator", "pod-label-agent",
         "pdb-rounds-up", "trace-image-by-digest", "kueue-check-needs-device-plugin"],
)  # fmt: skip
def test_inconsistent_values_fail_in_one_line(args: list[str], words: list[str]) -> None:
    done = helm("template", RELEASE, str(CHART), *args)
    assert done.returncode != 0
    (line,) = [x for x in done.stderr.splitlines() if words[0] in x]
    assert all(w in line for w in words), line
    assert "execution error" in line, line


def test_consistent_values_still_render() -> None:
    objects = render(
        "--set-string", "operator.podDisruptionBudget.minAvailable=50%",
        "--set", "agent.config.pollIntervalSeconds=30", "--set", "commonLabels.team=ml",
        "--set-string", "agent.maxUnavailable=10%", "--set", "operator.podLabels.team=ml",
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set-string", "metrics.serviceMonitor.interval=1d",
        "--set-json", 'webhook.namespaceSelector={"matchExpressions": [{"key": "gpu", '
        '"operator": "Exists"}]}',
        "--api-versions", MONITORING,
    )  # fmt: skip
    daemonset = one(objects, "DaemonSet")["spec"]
    assert daemonset["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == "10%"
    labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "ml" and labels["app.kubernetes.io/component"] == "operator"
    endpoints = [e for m in find(objects, "ServiceMonitor") for e in m["spec"]["endpoints"]]
    assert endpoints and {e["interval"] for e in endpoints} == {"1d"}


def test_an_image_digest_takes_precedence_over_the_tag() -> None:
    digest = "sha256:" + "a" * 64
    objects = render("--set", f"image.digest={digest}", "--set", "image.tag=1.2.3")
    for kind in ("Deployment", "DaemonSet"):
        (container,) = one(objects, kind)["spec"]["template"]["spec"]["containers"]
        assert container["image"] == f"ghcr.io/vramgate/vramgate@{digest}"
    (container,) = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("ghcr.io/vramgate/vramgate:")


def test_with_the_trace_image_only_the_operator_runs_it() -> None:
    def images(*args: str) -> tuple[str, str]:
        objects = render(*args)
        (operator,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
        (agent,) = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
        return operator["image"], agent["image"]

    repo = "ghcr.io/vramgate/vramgate"
    assert images("--set", "image.trace=true", "--set", "image.tag=1.2.3") == (
        f"{repo}:1.2.3-trace",
        f"{repo}:1.2.3",
    )
    plain, trace = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    pinned = ("--set", f"image.digest={plain}", "--set", f"image.traceDigest={trace}")
    assert images("--set", "image.trace=true", *pinned) == (f"{repo}@{trace}", f"{repo}@{plain}")
    assert images(*pinned) == (f"{repo}@{plain}", f"{repo}@{plain}")  # trace off: unused
    # A trace holds most of a GiB beside the operator: the trace image runs with more.
    for trace, limit in (("false", "1Gi"), ("true", "2560Mi")):
        (operator,) = one(render("--set", f"image.trace={trace}"), "Deployment")["spec"][
            "template"
        ]["spec"]["containers"]
        assert operator["resources"]["limits"]["memory"] == limit


def test_the_notes_warn_of_a_prometheus_rule_without_the_monitoring_api() -> None:
    def notes(*args: str) -> str:
        # (--dry-run=client renders NOTES.txt; the client's API versions lack monitoring.)
        done = helm("install", RELEASE, str(CHART), "--dry-run=client", *args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    rule = ("--set", "metrics.prometheusRule.enabled=true")
    assert "no PrometheusRule was created" in notes(*rule)
    assert "no PrometheusRule was created" not in notes()


def test_the_dcgm_example_reads_the_exporter_of_its_own_node() -> None:
    """The agent keeps only series whose Hostname is its node: the example's URL is a Service
    with internalTrafficPolicy Local (described in the file), not one that load-balances."""
    path = CHART / "ci" / "dcgm-agent-values.yaml"
    url = yaml.safe_load(path.read_text())["agent"]["config"]["dcgmUrl"]
    service, namespace = url.split("//")[1].split(".")[:2]
    described = yaml.safe_load("\n".join(
        line.removeprefix("#   ") for line in path.read_text().splitlines()
        if line.startswith("#   ")
    ))  # fmt: skip
    assert (described["kind"], described["metadata"]) == (
        "Service",
        {"name": service, "namespace": namespace},
    )
    assert described["spec"]["internalTrafficPolicy"] == "Local"
    agent = yaml.safe_load(one(render("-f", str(path)), "ConfigMap", f"{FULLNAME}-agent-config")[
        "data"]["agent.yaml"])  # fmt: skip
    assert agent["dcgmUrl"] == url


def test_the_example_static_gpus_get_uuids_of_their_node() -> None:
    """One ConfigMap for every node: {node} (the agent's node name) keeps the UUIDs unique
    across the cluster, which packing keys GPUs by. (The kind run's GPUs are the e2e suite's
    layout: test_e2e_suite checks them.)"""
    values = CHART / "ci" / "static-agent-values.yaml"
    config_map = one(render("-f", str(values)), "ConfigMap", f"{FULLNAME}-agent-config")
    gpus = yaml.safe_load(config_map["data"]["gpus.yaml"])["gpus"]
    assert gpus and all("{node}" in gpu["uuid"] for gpu in gpus), gpus
    commented = (CHART / "values.yaml").read_text().split("  static:")[0].splitlines()[-4:]
    assert "{node}" in "\n".join(commented)


def test_the_schema_forbids_unknown_keys_at_every_level() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node: dict[str, Any], path: str) -> Iterator[str]:
        if node.get("type") == "object" and "properties" in node:
            if node.get("additionalProperties") is not False:
                yield path
            for name, sub in node["properties"].items():
                yield from walk(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            yield from walk(node["items"], f"{path}[]")

    assert list(walk(schema, "")) == []
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def keys(tree: Any, node: dict[str, Any], path: str) -> Iterator[str]:
        """Every key of values.yaml is described by the schema."""
        if isinstance(tree, dict) and "properties" in node:
            for key, value in tree.items():
                assert key in node["properties"], f"{path}.{key} missing from the schema"
                yield f"{path}.{key}"
                yield from keys(value, node["properties"][key], f"{path}.{key}")

    assert len(list(keys(values, schema, ""))) > 60


def test_every_value_is_commented() -> None:
    """Each key of values.yaml has a comment on the lines just above it, or its parent has."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    commented: dict[int, bool] = {}  # indent -> whether the enclosing block is commented
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "-")) or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip())
        above = lines[i - 1].strip() if i else ""
        own = above.startswith("#")
        parent = any(v for k, v in commented.items() if k < indent)
        assert own or parent, f"values.yaml line {i + 1}: {stripped} has no comment"
        commented = {k: v for k, v in commented.items() if k < indent}
        commented[indent] = own


# -- paired render tests: X when enabled, nothing when disabled ------------------------------


def test_certificates_from_the_operator_by_default() -> None:
    objects = render()
    config = operator_config(objects)
    assert config["certSecretName"] == f"{FULLNAME}-webhook-tls"
    assert config["webhookConfigName"] == FULLNAME
    assert not find(objects, "Certificate") and not find(objects, "Issuer")
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        assert "annotations" not in one(objects, kind)["metadata"]
    volumes = {v["name"]: v for v in _pod(objects, "Deployment")["volumes"]}
    assert "emptyDir" in volumes["certs"]
    role = one(objects, "Role")
    assert {"secrets"} in [set(r["resources"]) for r in role["rules"]]


def test_certificates_from_cert_manager_when_enabled() -> None:
    objects = render("--set", "webhook.certManager.enabled=true")
    config = operator_config(objects)
    assert config["certSecretName"] is None
    certificate = one(objects, "Certificate")
    assert certificate["spec"]["secretName"] == f"{FULLNAME}-webhook-tls"
    assert f"{FULLNAME}-webhook.vramgate.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"] == {"kind": "Issuer", "name": f"{FULLNAME}-selfsigned"}
    assert one(objects, "Issuer")["spec"] == {"selfSigned": {}}
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        annotations = one(objects, kind)["metadata"]["annotations"]
        assert annotations == {"cert-manager.io/inject-ca-from": f"vramgate/{FULLNAME}-webhook"}
    pod = _pod(objects, "Deployment")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["certs"]["secret"] == {"secretName": f"{FULLNAME}-webhook-tls"}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "certs")
    assert mount == {"name": "certs", "mountPath": config["certDir"], "readOnly": True}
    # cert-manager owns the Secret: the operator gets no access to Secrets at all.
    role = one(objects, "Role")
    assert all("secrets" not in r["resources"] for r in role["rules"])
    cluster_role = one(objects, "ClusterRole", f"{FULLNAME}-operator")
    assert all("admissionregistration.k8s.io" not in r["apiGroups"] for r in cluster_role["rules"])
    # An existing issuer instead of the chart's own.
    issuer = {"kind": "ClusterIssuer", "name": "corp-ca", "group": "cert-manager.io"}
    objects = render("-f", str(CHART / "ci" / "cert-manager-issuer-values.yaml"))
    assert not find(objects, "Issuer")
    assert one(objects, "Certificate")["spec"]["issuerRef"] == issuer | {"name": "internal-ca"}


def test_no_webhook_objects_when_the_webhook_is_disabled() -> None:
    objects = render("--set", "webhook.enabled=false")
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "Certificate"):
        assert not find(objects, kind)
    assert not find(objects, "Service", f"{FULLNAME}-webhook")
    role = one(objects, "Role")
    assert all("secrets" not in r["resources"] for r in role["rules"])
    args = _pod(objects, "Deployment")["containers"][0]["args"]
    assert args == ["operator", "--webhook", "off"]


def test_the_webhooks_point_at_the_operators_handlers_and_fail_open() -> None:
    objects = render()
    service = one(objects, "Service", f"{FULLNAME}-webhook")
    assert service["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    paths = {}
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        config = one(objects, kind, FULLNAME)
        (webhook,) = config["webhooks"]
        assert webhook["clientConfig"]["service"]["name"] == f"{FULLNAME}-webhook"
        assert webhook["clientConfig"]["service"]["port"] == 443
        assert "caBundle" not in webhook["clientConfig"]  # injected, never reset by upgrades
        assert webhook["failurePolicy"] == "Ignore"
        assert webhook["sideEffects"] == "None"
        assert webhook["matchPolicy"] == "Equivalent"
        assert webhook["timeoutSeconds"] == 5
        assert webhook["admissionReviewVersions"] == ["v1"]
        paths[kind] = webhook["clientConfig"]["service"]["path"]
    assert paths == {
        "ValidatingWebhookConfiguration": f"/{VALIDATE_HANDLER}",
        "MutatingWebhookConfiguration": f"/{MUTATE_HANDLER}",
    }
    args = _pod(objects, "Deployment")["containers"][0]["args"]
    assert args == ["operator", "--webhook", "serve"]


@pytest.mark.parametrize("namespaces", [(), ("team-b", "team-a")], ids=["all-namespaces", "listed"])
def test_the_charts_webhooks_are_those_a_managed_operator_registers(
    namespaces: tuple[str, ...],
) -> None:
    """One set of facts in two places (YAML for helm, Python for `--webhook managed`): the
    conditions that decide when the API server calls a webhook, the writes it sees, and
    the namespaces whose jobs go through it."""
    listed = ["--set-json", f"operator.config.namespaces={json.dumps(namespaces)}"]
    objects = render(*listed)
    managed = configurations(FULLNAME, "https://127.0.0.1:9443", "Y2E=", namespaces)
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        (chart,) = one(objects, kind, FULLNAME)["webhooks"]
        (ours,) = managed[kind]["webhooks"]
        for field in ("matchConditions", "rules", "sideEffects", "failurePolicy", "matchPolicy"):
            assert chart[field] == ours[field], (kind, field)
        assert chart.get("namespaceSelector") == ours.get("namespaceSelector"), kind
        if namespaces:
            (listed_in,) = chart["namespaceSelector"]["matchExpressions"]
            assert listed_in["values"] == ["team-a", "team-b"]
        assert chart.get("reinvocationPolicy") == ours.get("reinvocationPolicy"), kind


# -- trainer.sizing: TrainJobs sized at create -------------------------------------------------


@pytest.mark.parametrize("namespaces", [(), ("team-b", "team-a")], ids=["all-namespaces", "listed"])
def test_trainer_sizing_renders_the_trainjob_webhook_and_the_config_when_enabled(
    namespaces: tuple[str, ...], tmp_path: Path
) -> None:
    """The chart's TrainJob webhook is the one a managed operator registers, beside the
    FineTuneJob one in the mutating configuration; the operator is told to serve it."""
    from controller.webhook.registration import MUTATE_TRAINJOB_HANDLER

    listed = ["--set-json", f"operator.config.namespaces={json.dumps(namespaces)}"]
    objects = render("--set", "trainer.sizing.enabled=true", *listed)
    managed = configurations(FULLNAME, "https://127.0.0.1:9443", "Y2E=", namespaces, True)
    chart = one(objects, "MutatingWebhookConfiguration", FULLNAME)["webhooks"]
    ours = managed["MutatingWebhookConfiguration"]["webhooks"]
    assert [w["clientConfig"]["service"]["path"] for w in chart] == [
        f"/{MUTATE_HANDLER}", f"/{MUTATE_TRAINJOB_HANDLER}"
    ]  # fmt: skip
    for made, registered in zip(chart, ours, strict=True):
        for field in ("matchConditions", "rules", "sideEffects", "failurePolicy", "matchPolicy",
                      "reinvocationPolicy", "admissionReviewVersions"):  # fmt: skip
            assert made[field] == registered[field], (made["name"], field)
        assert made.get("namespaceSelector") == registered.get("namespaceSelector")
    (validating,) = one(objects, "ValidatingWebhookConfiguration", FULLNAME)["webhooks"]
    assert validating["rules"][0]["resources"] == ["finetunejobs"]
    config = operator_config(objects)
    assert config["trainJobSizing"] is True
    assert config["trainJobHoldSeconds"] == 600  # the chart's default is the operator's
    loaded = _load_operator_settings(config, tmp_path)
    assert loaded.train_job_sizing is True and loaded.train_job_hold_seconds == 600
    # Read rights on Trainer's runtimes, which the operator caches: ClusterTrainingRuntimes
    # cluster-wide, TrainingRuntimes where the jobs are watched; and a list of the TrainJobs
    # there, by their hold's label (controller.admission.holds.looked_up).
    read = {"get", "list", "watch"}
    where_jobs = {"trainingruntimes": read, "trainjobs": {"list"}}
    cluster_role = one(objects, "ClusterRole", f"{FULLNAME}-operator")
    assert _trainer_rights(cluster_role) == {
        "clustertrainingruntimes": read, **({} if namespaces else where_jobs)
    }  # fmt: skip
    for listed_in in namespaces:
        role = next(r for r in find(objects, "Role")
                    if r["metadata"]["name"] == f"{FULLNAME}-operator-jobs"
                    and r["metadata"]["namespace"] == listed_in)  # fmt: skip
        assert _trainer_rights(role) == where_jobs


def _trainer_rights(role: dict[str, Any]) -> dict[str, set[str]]:
    return {
        resource: set(rule["verbs"])
        for rule in role["rules"] if "trainer.kubeflow.org" in rule["apiGroups"]
        for resource in rule["resources"]
    }  # fmt: skip


def test_trainer_sizing_renders_none_of_it_when_disabled_by_default(tmp_path: Path) -> None:
    objects = render()
    (mutating,) = one(objects, "MutatingWebhookConfiguration", FULLNAME)["webhooks"]
    assert mutating["rules"][0]["resources"] == ["finetunejobs"]
    config = operator_config(objects)
    assert config["trainJobSizing"] is False
    assert _load_operator_settings(config, tmp_path).train_job_sizing is False
    assert _trainer_rights(one(objects, "ClusterRole", f"{FULLNAME}-operator")) == {}


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--set", "webhook.enabled=false"], ["trainer.sizing.enabled", "webhook.enabled=true"]),
        (["--set", "operator.config.gpuMode=dra"],
         ["trainer.sizing.enabled", "gpuMode=devicePlugin, got dra"]),
    ],
    ids=["without-the-webhook", "dra"],
)  # fmt: skip
def test_trainer_sizing_without_what_it_needs_fails_in_one_line(
    args: list[str], words: list[str]
) -> None:
    done = helm("template", RELEASE, str(CHART), "--set", "trainer.sizing.enabled=true", *args)
    assert done.returncode != 0
    (line,) = [x for x in done.stderr.splitlines() if words[0] in x]
    assert all(w in line for w in words) and "execution error" in line, line


def test_trainer_sizing_hold_seconds_reach_the_operator_and_are_bounded(tmp_path: Path) -> None:
    objects = render(
        "--set", "trainer.sizing.enabled=true", "--set", "trainer.sizing.holdSeconds=0"
    )
    config = operator_config(objects)
    assert config["trainJobHoldSeconds"] == 0  # 0: nothing held
    assert _load_operator_settings(config, tmp_path).train_job_hold_seconds == 0
    done = helm("template", RELEASE, str(CHART), "--set", "trainer.sizing.holdSeconds=3601")
    assert done.returncode != 0 and "holdSeconds" in done.stderr, done.stderr
    done = helm("template", RELEASE, str(CHART), "--set", "trainer.sizing.holdSeconds=-1")
    assert done.returncode != 0 and "holdSeconds" in done.stderr, done.stderr


def test_trainer_sizing_is_set_in_the_trainer_block_only() -> None:
    done = helm("template", RELEASE, str(CHART), "--set", "operator.config.trainJobSizing=true")
    assert done.returncode != 0
    assert "additional properties 'trainJobSizing' not allowed" in done.stderr, done.stderr
    done = helm("template", RELEASE, str(CHART), "--set-string", "trainer.sizing.enabled=yes")
    assert done.returncode != 0 and "got string, want boolean" in done.stderr, done.stderr


@pytest.mark.parametrize("available", [True, False], ids=["api-served", "api-missing"])
def test_service_monitors_and_the_prometheus_rule_only_where_the_api_is_served(
    available: bool,
) -> None:
    api = ["--api-versions", MONITORING] if available else []
    enabled = render(*api, "-f", str(CHART / "ci" / "monitoring-values.yaml"))
    monitors = find(enabled, "ServiceMonitor")
    rules = find(enabled, "PrometheusRule")
    if not available:
        assert monitors == [] and rules == []
        return
    assert sorted(m["metadata"]["name"] for m in monitors) == [
        f"{FULLNAME}-agent",
        f"{FULLNAME}-operator",
    ]
    assert all(m["metadata"]["labels"]["release"] == "prometheus" for m in monitors)
    # The operator's `namespace`/`job` labels and the agent's `node` are the series' own.
    assert all(e["honorLabels"] is True for m in monitors for e in m["spec"]["endpoints"])
    alerts = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    assert one(enabled, "PrometheusRule")["spec"] == {"groups": alerts["groups"]}
    # The Services they select exist and name the metrics ports.
    for monitor in monitors:
        selector = monitor["spec"]["selector"]["matchLabels"]
        (service,) = [
            s for s in find(enabled, "Service")
            if selector.items() <= s["metadata"]["labels"].items()
            and s["metadata"]["name"].endswith("-metrics")
        ]  # fmt: skip
        assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]
    disabled = render(*api)
    assert find(disabled, "ServiceMonitor") == [] and find(disabled, "PrometheusRule") == []


def _kueue_rights(role: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (resource, verb)
        for rule in role["rules"] if KUEUE_GROUP in rule["apiGroups"]
        for resource in rule["resources"] for verb in rule["verbs"]
    }  # fmt: skip


def _read_and_patch_status(resource: str) -> set[tuple[str, str]]:
    return {
        (resource, "get"),
        (resource, "list"),
        (resource, "watch"),
        (f"{resource}/status", "patch"),
    }


def _job_patch(role: dict[str, Any]) -> bool:
    return any(
        "batch" in rule["apiGroups"] and "jobs" in rule["resources"] and "patch" in rule["verbs"]
        for rule in role["rules"]
    )


WORKLOAD_RIGHTS = _read_and_patch_status("workloads")
ADMISSION_CHECK_RIGHTS = _read_and_patch_status("admissionchecks")
FLAVOR_RIGHTS = {("resourceflavors", verb) for verb in ("get", "list", "watch")}


def test_kueue_renders_the_admission_check_its_rights_and_the_config_when_enabled(
    tmp_path: Path,
) -> None:
    objects = render("--set", "kueue.admissionCheck.enabled=true")
    check = one(objects, "AdmissionCheck")
    assert check["apiVersion"] == f"{KUEUE_GROUP}/v1beta2"
    assert check["metadata"]["name"] == "vramgate-vram" and "namespace" not in check["metadata"]
    assert check["spec"] == {"controllerName": KUEUE_CONTROLLER}
    config = operator_config(objects)
    assert (config["kueueAdmissionCheck"], config["kueueRetrySeconds"]) == (True, 30)
    settings = _load_operator_settings(config, tmp_path)
    assert settings.kueue_admission_check is True and settings.kueue_retry_seconds == 30
    # Exactly these rights: read Workloads, AdmissionChecks and ResourceFlavors, patch only
    # the first two's status; and patch batch Jobs (resize under Kueue: a gated Job's GPU
    # count and gate annotation), the one Job verb the operator's job rules lack.
    cluster_role = one(objects, "ClusterRole", f"{FULLNAME}-operator")
    assert _kueue_rights(cluster_role) == WORKLOAD_RIGHTS | ADMISSION_CHECK_RIGHTS | FLAVOR_RIGHTS
    assert _job_patch(cluster_role)
    # Rejections are Events on the Workload's owner (a batch Job): already an operator right.
    assert ("events", "create") in {
        (r, v) for rule in cluster_role["rules"] for r in rule["resources"] for v in rule["verbs"]
    }
    # Listed namespaces: Workloads and Jobs are namespaced (watched and patched there only),
    # AdmissionChecks and ResourceFlavors not.
    objects = render(
        "--set", "kueue.admissionCheck.enabled=true",
        "--set", "operator.config.namespaces={team-a,team-b}",
        "--set", "kueue.admissionCheck.name=gpu-memory",
        "--set", "kueue.admissionCheck.retrySeconds=120",
    )  # fmt: skip
    cluster_role = one(objects, "ClusterRole", f"{FULLNAME}-operator")
    assert _kueue_rights(cluster_role) == ADMISSION_CHECK_RIGHTS | FLAVOR_RIGHTS
    assert not _job_patch(cluster_role)
    roles = find(objects, "Role", f"{FULLNAME}-operator-jobs")
    assert len(roles) == 2 and all(_kueue_rights(r) == WORKLOAD_RIGHTS for r in roles)
    assert all(_job_patch(r) for r in roles)
    assert one(objects, "AdmissionCheck")["metadata"]["name"] == "gpu-memory"
    assert operator_config(objects)["kueueRetrySeconds"] == 120
    # create=false: the check is made elsewhere; the operator still answers it.
    objects = render(
        "--set", "kueue.admissionCheck.enabled=true", "--set", "kueue.admissionCheck.create=false"
    )  # fmt: skip
    assert not find(objects, "AdmissionCheck")
    assert operator_config(objects)["kueueAdmissionCheck"] is True
    assert _kueue_rights(one(objects, "ClusterRole", f"{FULLNAME}-operator"))


def test_kueue_renders_none_of_them_when_disabled_by_default(tmp_path: Path) -> None:
    for args in ([], ["--set", "kueue.admissionCheck.create=true"],
                 ["--set", "operator.config.namespaces={team-a}"]):  # fmt: skip
        objects = render(*args)
        assert not find(objects, "AdmissionCheck"), args
        for role in (*find(objects, "ClusterRole"), *find(objects, "Role")):
            assert not _kueue_rights(role), (args, role["metadata"]["name"])
            assert not _job_patch(role), (args, role["metadata"]["name"])
        config = operator_config(objects)
        assert config["kueueAdmissionCheck"] is False, args
    assert _load_operator_settings(config, tmp_path).kueue_admission_check is False


def test_the_dashboard_configmap_when_enabled() -> None:
    objects = render("--set", "dashboard.enabled=true")
    dashboard = one(objects, "ConfigMap", f"{FULLNAME}-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "files" / "dashboard.json").read_text())
    assert json.loads(dashboard["data"]["vramgate.json"]) == shipped
    assert not find(render(), "ConfigMap", f"{FULLNAME}-dashboard")


def _panel_exprs(title: str) -> list[str]:
    board = json.loads((CHART / "files" / "dashboard.json").read_text())
    panels = [p for row in board["panels"] for p in (row, *row.get("panels", []))]
    (panel,) = [p for p in panels if p["title"] == title]
    return [t["expr"] for t in panel["targets"]]


def test_the_dashboard_counts_histograms_over_its_range_and_only_queued_jobs_in_queue_age() -> None:
    """Quantiles of raw cumulative buckets would weigh every job since the operator started;
    rejected, invalid or suspended jobs are not queued (the queue-age alert counts the same)."""
    quantiles = _panel_exprs("Observed / predicted, finished jobs")
    assert len(quantiles) == 3
    windowed = (
        "sum by (profile, family, le) (increase(vramgate_estimate_accuracy_ratio_bucket[$__range]))"
    )
    assert all(windowed in expr for expr in quantiles), quantiles
    (age,) = _panel_exprs("Queue age")
    assert 'vramgate_pending_job_created_timestamp_seconds{reason=~"Waiting.*"}' in age
    (length,) = _panel_exprs("Pending FineTuneJobs by reason")
    assert length.startswith("sum by (reason) (")


def test_crds_are_templates_kept_on_uninstall_unless_turned_off() -> None:
    crds = find(render(), "CustomResourceDefinition")
    assert sorted(c["metadata"]["name"] for c in crds) == sorted(CRD_NAMES)
    for crd in crds:
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert crd["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    assert find(render("--set", "crds.install=false"), "CustomResourceDefinition") == []
    # Helm's crds/ folder (install once, never upgrade) is not used: .helmignore hides it.
    assert helm("show", "crds", str(CHART)).stdout.strip() == ""


def _pod(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return dict(one(objects, kind)["spec"]["template"]["spec"])


@pytest.mark.parametrize("kind", ["Deployment", "DaemonSet"])
def test_pods_run_locked_down(kind: str) -> None:
    pod = _pod(render(), kind)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert "privileged" not in json.dumps(pod)
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert all("hostPath" not in v for v in pod["volumes"])
    assert "/tmp" in [m["mountPath"] for m in container["volumeMounts"]]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_the_operator_deployment() -> None:
    objects = render()
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"webhook": 9443, "metrics": 8080, "probes": 8081}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "probes"}
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["VRAMGATE_OPERATOR_CONFIG"]["value"] == "/etc/vramgate/operator.yaml"
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert not find(render("--set", "operator.replicas=1"), "PodDisruptionBudget")
    config = operator_config(objects)
    assert config["leaseNamespace"] == "vramgate" and config["leaseName"] == f"{FULLNAME}-operator"
    assert one(objects, "Lease")["metadata"]["name"] == config["leaseName"]


def test_a_config_change_rolls_the_pods() -> None:
    def checksum(*args: str) -> tuple[str, str]:
        objects = render(*args)
        return tuple(  # type: ignore[return-value]
            one(objects, kind)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for kind in ("Deployment", "DaemonSet")
        )

    base = checksum()
    assert checksum() == base
    operator = checksum("--set", "operator.config.resyncSeconds=5")
    agent = checksum("--set", "agent.config.pollIntervalSeconds=2")
    assert operator[0] != base[0] and operator[1] == base[1]
    assert agent[1] != base[1] and agent[0] == base[0]


def _load_operator_settings(config: dict[str, Any], tmp_path: Path) -> Any:
    from controller.operator.settings import add_arguments, load_settings

    path = tmp_path / "operator.yaml"
    path.write_text(yaml.safe_dump(config))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    environ = {"VRAMGATE_OPERATOR_CONFIG": str(path), "POD_NAME": "p", "POD_NAMESPACE": "vramgate"}
    return load_settings(parser.parse_args([]), environ)


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.name if v else "defaults")
def test_the_rendered_config_files_load_in_the_operator_and_the_agent(
    values: Path | None, tmp_path: Path
) -> None:
    from controller.agent.settings import add_arguments, load_settings

    objects = render(*(["--values", str(values)] if values else []))
    settings = _load_operator_settings(operator_config(objects), tmp_path)
    assert settings.webhook_port == 9443 and settings.probe_port == 8081
    assert settings.lease_namespace == "vramgate"
    agent_cm = find(objects, "ConfigMap", f"{FULLNAME}-agent-config")
    if not agent_cm:
        return
    agent_file = tmp_path / "agent.yaml"
    agent_file.write_text(agent_cm[0]["data"]["agent.yaml"])
    if "gpus.yaml" in agent_cm[0]["data"]:
        (tmp_path / "gpus.yaml").write_text(agent_cm[0]["data"]["gpus.yaml"])
        agent_file.write_text(
            agent_file.read_text().replace("/etc/vramgate/gpus.yaml", str(tmp_path / "gpus.yaml"))
        )
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    environ = {"VRAMGATE_AGENT_CONFIG": str(agent_file), "VRAMGATE_AGENT_NODE_NAME": "n"}
    agent = load_settings(parser.parse_args([]), environ)
    assert agent.metrics_port == 9402


SIZES = ["2Gi", "2GiB", "2G", "2gb", "0.5Gi", "1.5 TB", "0", "2", "2 Gi", "lots", "2Gx", "-1G",
         "0GiB", "0.0", "0x", "２Gi"]  # fmt: skip


@pytest.mark.parametrize("size", SIZES)
def test_the_schema_and_the_binaries_agree_on_sizes(size: str, tmp_path: Path) -> None:
    """A size the schema lets through is one the operator and the agent load (else a good
    install crash-loops its pods), and one it refuses they refuse too."""
    from controller.agent.settings import AgentSettings

    done = helm("template", RELEASE, str(CHART), "--set-string",
                f"operator.config.headroom={size}")  # fmt: skip
    try:
        _load_operator_settings({"headroom": size}, tmp_path)
    except Exception as error:  # any refusal: both must refuse
        assert done.returncode != 0, f"the schema passes {size!r}, the operator says {error}"
    else:
        assert done.returncode == 0, done.stderr
    done = helm("template", RELEASE, str(CHART), "--set-string",
                f"agent.config.changeThresholdBytes={size}")  # fmt: skip
    try:
        AgentSettings(node_name="n", change_threshold_bytes=size)
    except Exception as error:  # any refusal
        assert done.returncode != 0, f"the schema passes {size!r}, the agent says {error}"
    else:
        assert done.returncode == 0, done.stderr


def _bounds(info: Any) -> dict[str, Any]:
    """A pydantic field's numeric bounds, as JSON Schema states them."""
    names = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
    return {
        names[key]: getattr(meta, key)
        for meta in info.metadata
        for key in names
        if getattr(meta, key, None) is not None
    }


def test_the_schema_bounds_numbers_as_the_binaries_do() -> None:
    """A number the schema lets through is one the operator and the agent take (an interval
    past a year overflowed the operator's dates: a crash loop after a good install)."""
    from controller.admission.config import MAX_HEADROOM_PERCENT
    from controller.agent.settings import AgentSettings
    from controller.operator.settings import OperatorSettings

    # Bounded by a validator of their own, for a message that states both ends.
    validated = {"headroomPercent": {"minimum": 0, "maximum": MAX_HEADROOM_PERCENT}}
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]
    checked = 0
    for component, model in (("operator", OperatorSettings), ("agent", AgentSettings)):
        properties = schema[component]["properties"]["config"]["properties"]
        for name, info in model.model_fields.items():
            key = info.alias or name
            if key not in properties or properties[key].get("type") not in ("integer", "number"):
                continue  # sizes are strings there: test_the_schema_and_the_binaries_agree_on_sizes
            stated = {k: v for k, v in properties[key].items() if "imum" in k}
            assert stated == validated.get(key, _bounds(info)), f"{component}.config.{key}"
            checked += 1
    assert checked >= 9
    # Set through the kueue block, not operator.config (the chart writes kueueRetrySeconds).
    retry = schema["kueue"]["properties"]["admissionCheck"]["properties"]["retrySeconds"]
    stated = {k: v for k, v in retry.items() if "imum" in k}
    assert stated == _bounds(OperatorSettings.model_fields["kueue_retry_seconds"])


def test_every_operator_setting_is_a_value_or_set_by_the_chart(tmp_path: Path) -> None:
    from controller.operator.settings import OperatorSettings

    config = operator_config(render())
    keys = {info.alias or name for name, info in OperatorSettings.model_fields.items()}
    # webhook comes from webhook.enabled (a flag), identity from the pod's name.
    assert keys - set(config) == {"webhook", "webhookHost", "identity"}
    values = yaml.safe_load((CHART / "values.yaml").read_text())["operator"]["config"]
    assert set(values) <= keys


def test_the_agent_runs_on_gpu_nodes_with_only_the_host_access_it_needs() -> None:
    pod = _pod(render(), "DaemonSet")
    assert pod["hostPID"] is True  # nvml: host PIDs -> /proc/<pid>/cgroup -> pod UID
    assert pod["runtimeClassName"] == "nvidia"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = [t["matchExpressions"][0]["key"] for t in terms["nodeSelectorTerms"]]
    assert keys == ["nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"]
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["VRAMGATE_AGENT_NODE_NAME"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "spec.nodeName"}
    }
    assert pod["containers"][0]["ports"] == [
        {"name": "metrics", "containerPort": 9402, "protocol": "TCP"}
    ]
    for backend in ("static", "dcgm"):
        args = ["-f", str(CHART / "ci" / f"{backend}-agent-values.yaml")]
        other = _pod(render(*args), "DaemonSet")
        assert "hostPID" not in other and "runtimeClassName" not in other, backend
    assert "hostPID" not in _pod(render("--set", "agent.podAttribution=false"), "DaemonSet")
    assert not find(render("--set", "agent.enabled=false"), "DaemonSet")


def test_dra_rights_only_in_dra_mode() -> None:
    def groups(*args: str) -> set[str]:
        role = one(render(*args), "ClusterRole", f"{FULLNAME}-operator")
        return {g for rule in role["rules"] for g in rule["apiGroups"]}

    assert "resource.k8s.io" not in groups()
    assert "resource.k8s.io" in groups("--set", "operator.config.gpuMode=dra")


def test_listed_namespaces_narrow_the_webhooks_and_the_operators_rights() -> None:
    watched = ["team-a", "team-b"]
    objects = render(
        "--set", "operator.config.namespaces={team-a,team-b}",
        "--set", "webhook.namespaceSelector.matchLabels.gpu=allowed",
    )  # fmt: skip
    expression = {"key": "kubernetes.io/metadata.name", "operator": "In", "values": watched}
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        (hook,) = one(objects, kind)["webhooks"]
        # Both apply: the user's selector and the watched namespaces.
        assert hook["namespaceSelector"] == {
            "matchLabels": {"gpu": "allowed"},
            "matchExpressions": [expression],
        }
    cluster_role = one(objects, "ClusterRole", f"{FULLNAME}-operator")
    cluster_wide = {r for rule in cluster_role["rules"] for r in rule["resources"]}
    assert cluster_wide == {
        "gpunodes", "nodes", "priorityclasses", "customresourcedefinitions", "namespaces",
        "validatingwebhookconfigurations", "mutatingwebhookconfigurations",
        "learnedcorrections", "learnedcorrections/status",
    }  # fmt: skip
    roles = find(objects, "Role", f"{FULLNAME}-operator-jobs")
    assert sorted(r["metadata"]["namespace"] for r in roles) == watched
    for role in roles:
        rights = {
            (r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]
        }
        assert {("finetunejobs", "watch"), ("finetunejobs/status", "patch"), ("pods", "list"),
                ("jobs", "create"), ("services", "create"), ("configmaps", "get"),
                ("events", "create")} <= rights  # fmt: skip
    bindings = find(objects, "RoleBinding", f"{FULLNAME}-operator-jobs")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == watched
    for binding in bindings:
        assert binding["roleRef"]["name"] == f"{FULLNAME}-operator-jobs"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": "vramgate"}
        ]
    # Every namespace: the same rights cluster-wide, no per-namespace Role, no selector.
    objects = render()
    assert not find(objects, "Role", f"{FULLNAME}-operator-jobs")
    assert "namespaceSelector" not in one(objects, "ValidatingWebhookConfiguration")["webhooks"][0]
    rules = one(objects, "ClusterRole", f"{FULLNAME}-operator")["rules"]
    assert {"finetunejobs", "pods", "jobs", "events"} <= {r for x in rules for r in x["resources"]}


DNS_1035 = r"[a-z]([-a-z0-9]*[a-z0-9])?"


def test_a_release_name_of_53_characters_gives_names_within_63() -> None:
    """Helm allows 53-character release names; every object name (Services are DNS-1035
    labels) and every label of the certificate's hosts must still fit 63."""
    long_name = "r" * 53
    every = [
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.prometheusRule.enabled=true",
        "--set", "dashboard.enabled=true", "--api-versions", MONITORING,
    ]  # fmt: skip
    for extra in ([], ["--set", "webhook.certManager.enabled=true"]):
        done = helm("template", long_name, str(CHART), "--namespace", "vramgate", *every, *extra)
        assert done.returncode == 0, done.stderr
        objects = [d for d in yaml.safe_load_all(done.stdout) if d]
        names = {o["metadata"]["name"] for o in objects}
        assert max(len(n) for n in names) <= 63, sorted(names, key=len)[-3:]
        for service in find(objects, "Service"):
            assert re.fullmatch(DNS_1035, service["metadata"]["name"]), service["metadata"]
        (config_map,) = [
            o
            for o in find(objects, "ConfigMap")
            if o["metadata"]["name"].endswith("-config") and "operator.yaml" in o["data"]
        ]
        hosts = yaml.safe_load(config_map["data"]["operator.yaml"])["certHosts"]
        assert all(len(label) <= 63 for host in hosts for label in host.split(".")), hosts


def test_a_base_name_that_is_no_dns_label_fails_in_one_line() -> None:
    done = helm("template", "9lives", str(CHART))
    assert done.returncode != 0
    (line,) = [x for x in done.stderr.splitlines() if "DNS-1035" in x]
    assert '"9lives-vramgate"' in line


# -- installed into the local control plane ---------------------------------------------------


class Release:
    """One installed release in its own namespace, and kubeconfigs for its ServiceAccounts."""

    def __init__(self, cluster: Cluster, api: client.ApiClient, workdir: Path) -> None:
        self.cluster, self.api, self.workdir = cluster, api, workdir
        self.namespace = f"chart-{uuid.uuid4().hex[:8]}"
        self.installed = False

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.cluster.helm(*args, "--namespace", self.namespace)

    def install(self, *values: str) -> subprocess.CompletedProcess[str]:
        done = self.helm("install", RELEASE, str(CHART), "--create-namespace", *values)
        self.installed = self.installed or done.returncode == 0
        return done

    def kubeconfig_for(self, service_account: str) -> Path:
        """A kubeconfig that authenticates with a TokenRequest token of `service_account`."""
        token = client.CoreV1Api(self.api).create_namespaced_service_account_token(
            service_account, self.namespace, {"spec": {"expirationSeconds": 3600}}
        )
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "sa",
            "clusters": [{"name": "local", "cluster": {
                "server": self.cluster.server,
                "certificate-authority-data": base64.b64encode(
                    self.cluster.ca_path.read_bytes()).decode(),
            }}],
            "users": [{"name": service_account, "user": {"token": token.status.token}}],
            "contexts": [{"name": "sa", "context": {"cluster": "local", "user": service_account}}],
        }  # fmt: skip
        path = self.workdir / f"{service_account}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def can_i(self, service_account: str, *args: str) -> bool:
        user = f"system:serviceaccount:{self.namespace}:{service_account}"
        done = self.cluster.kubectl("auth", "can-i", *args, "--as", user)
        assert done.returncode in (0, 1), done.stderr
        return done.returncode == 0

    def config_file(self) -> Path:
        """The operator config file as the chart installed it (its ConfigMap's data)."""
        config_map = client.CoreV1Api(self.api).read_namespaced_config_map(
            f"{FULLNAME}-operator-config", self.namespace
        )
        path = self.workdir / "operator.yaml"
        path.write_text(config_map.data["operator.yaml"])
        return path


class _AsServiceAccount:
    """What OperatorProcess needs of a cluster: an environment, here with the ServiceAccount's
    kubeconfig and the pod's downward-API variables and config file, as in the chart's pod."""

    def __init__(self, kubeconfig: Path, extra: dict[str, str]) -> None:
        self.kubeconfig, self.extra = kubeconfig, extra

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.extra}


def _adopt_existing_crds(cluster: Cluster, namespace: str) -> None:
    """CRDs applied by earlier test modules (kubectl apply) are adopted into the release, the
    way a cluster admin hands existing CRDs over to Helm."""
    for name in CRD_NAMES:
        if cluster.kubectl("get", "crd", name).returncode != 0:
            continue
        for args in (
            ("annotate", "--overwrite", "crd", name, f"meta.helm.sh/release-name={RELEASE}",
             f"meta.helm.sh/release-namespace={namespace}"),
            ("label", "--overwrite", "crd", name, "app.kubernetes.io/managed-by=Helm"),
        ):  # fmt: skip
            done = cluster.kubectl(*args)
            assert done.returncode == 0, done.stderr


@contextlib.contextmanager
def release_in_its_namespace(
    cluster: Cluster, api_client: client.ApiClient, workdir: Path
) -> Iterator[Release]:
    """A release (installed by the caller) in a namespace of its own, adopting the CRDs
    earlier modules applied; uninstalled, if installed, and its namespace deleted after."""
    made = Release(cluster, api_client, workdir)
    _adopt_existing_crds(cluster, made.namespace)
    try:
        yield made
    finally:
        if made.installed:
            made.helm("uninstall", RELEASE)
        client.CoreV1Api(api_client).delete_namespace(made.namespace)


@pytest.fixture(scope="module")
def release(
    cluster: Cluster, api_client: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    with release_in_its_namespace(cluster, api_client, tmp_path_factory.mktemp("chart")) as made:
        yield made


def test_helm_install_refuses_an_unknown_value(release: Release) -> None:
    done = release.install("--set", "agent.hostNetwork=true", "--dry-run=server")
    assert done.returncode != 0
    assert "additional properties 'hostNetwork' not allowed" in done.stderr


def test_helm_install_succeeds(release: Release, cluster: Cluster) -> None:
    done = release.install()
    assert done.returncode == 0, done.stderr
    assert "kubectl get gpunodes" in done.stdout  # NOTES.txt says what to run next
    for name in CRD_NAMES:
        waited = cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}")
        assert waited.returncode == 0, waited.stderr
    listed = release.helm("status", RELEASE, "-o", "json")
    assert json.loads(listed.stdout)["info"]["status"] == "deployed"
    got = cluster.kubectl(
        "get", "deployment,daemonset,service,configmap,secret,lease,serviceaccount,role,"
        "rolebinding,poddisruptionbudget", "-n", release.namespace, "-o", "name",
        "-l", f"app.kubernetes.io/instance={RELEASE}",
    )  # fmt: skip
    assert sorted(got.stdout.split()) == sorted([
        f"deployment.apps/{FULLNAME}-operator",
        f"daemonset.apps/{FULLNAME}-agent",
        f"service/{FULLNAME}-webhook",
        f"service/{FULLNAME}-operator-metrics",
        f"service/{FULLNAME}-agent-metrics",
        f"configmap/{FULLNAME}-operator-config",
        f"configmap/{FULLNAME}-agent-config",
        f"lease.coordination.k8s.io/{FULLNAME}-operator",
        f"serviceaccount/{OPERATOR_SA}",
        f"serviceaccount/{AGENT_SA}",
        f"role.rbac.authorization.k8s.io/{FULLNAME}-operator",
        f"rolebinding.rbac.authorization.k8s.io/{FULLNAME}-operator",
        f"poddisruptionbudget.policy/{FULLNAME}-operator",
    ])  # fmt: skip


def test_users_bound_to_the_builtin_roles_may_submit_or_read_jobs_never_write_status(
    release: Release, cluster: Cluster
) -> None:
    """The chart's user roles are aggregated into `edit` and `view`: a namespace's editors
    submit jobs there without a custom role, and nobody but the operator writes status."""
    for role, user in (("edit", "alice"), ("view", "bob")):
        done = cluster.kubectl("create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}",
                               f"--user={user}", "-n", release.namespace)  # fmt: skip
        assert done.returncode == 0, done.stderr

    def may(user: str, *args: str) -> bool:
        done = cluster.kubectl("auth", "can-i", *args, "finetunejobs.vramgate.dev",
                               "--as", user, "-n", release.namespace)  # fmt: skip
        assert done.returncode in (0, 1), done.stderr
        return done.returncode == 0

    # The aggregation controller fills `edit` and `view` a moment after the install.
    wait_until(lambda: may("alice", "create") and may("bob", "list"), timeout=30,
               what="the user roles aggregated into edit and view")  # fmt: skip
    for verb in ("get", "list", "watch", "create", "update", "patch", "delete"):
        assert may("alice", verb), verb
    for verb in ("get", "list", "watch"):
        assert may("bob", verb), verb
    for verb in ("create", "patch", "delete"):
        assert not may("bob", verb), verb
    for user in ("alice", "bob"):
        assert not may(user, "patch", "--subresource=status")
        assert not may(user, "update", "--subresource=status")
    assert not may("carol", "get")  # bound to nothing


@pytest.fixture(scope="module")
def gpu_node(release: Release, cluster: Cluster, api_client: client.ApiClient) -> Iterator[str]:
    """A simulated GPU node with a product label of its own, removed afterwards."""
    product = f"CHART-{uuid.uuid4().hex[:6]}-80GB"
    (name,) = cluster.create_gpu_nodes(
        1, gpus_per_node=2, product=product, name_prefix=f"chart-{uuid.uuid4().hex[:6]}"
    )
    yield name
    for delete in (
        lambda: client.CustomObjectsApi(api_client).delete_cluster_custom_object(
            GROUP, VERSION, "gpunodes", name
        ),
        lambda: client.CoreV1Api(api_client).delete_node(name),
    ):
        try:
            delete()
        except ApiException as error:
            if error.status != 404:
                raise


@pytest.fixture(scope="module")
def agent_as_its_service_account(
    release: Release, gpu_node: str, api_client: client.ApiClient
) -> Iterator[subprocess.Popen[str]]:
    static = release.workdir / "gpus.yaml"
    static.write_text(gpus_yaml([0, 0]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller.cli", "agent", "--node-name", gpu_node,
         "--backend", "static", "--static-file", str(static),
         "--kubeconfig", str(release.kubeconfig_for(AGENT_SA)),
         "--metrics-address", "127.0.0.1", "--metrics-port", "0",
         "--poll-interval-seconds", "0.5", "--heartbeat-interval-seconds", "2"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, out


def test_the_agent_writes_its_gpunode_as_the_agent_service_account(
    release: Release,
    agent_as_its_service_account: subprocess.Popen[str],
    gpu_node: str,
    api_client: client.ApiClient,
) -> None:
    assert release.installed
    wait_ready(api_client, gpu_node, "True", "the GPUNode the agent's SA wrote")
    gpunode = read_gpunode(api_client, gpu_node)
    assert len(gpunode["status"]["gpus"]) == 2
    owner = gpunode["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Node", gpu_node)
    assert agent_as_its_service_account.poll() is None


def operator_as_the_chart_runs_it(
    release: Release, api_client: client.ApiClient, *listen: str
) -> OperatorProcess:
    """`vramgate operator` started with the release's config file, the operator
    ServiceAccount's token and the pod's environment, serving the webhooks (`--webhook
    serve`, so it keeps the certificate Secret and injects the CA as the pods do); `listen`
    adds flags such as the webhook's address."""
    environ = {
        "VRAMGATE_OPERATOR_CONFIG": str(release.config_file()),
        "POD_NAMESPACE": release.namespace,
    }
    process = OperatorProcess(
        _AsServiceAccount(release.kubeconfig_for(OPERATOR_SA), environ),  # type: ignore[arg-type]
        api_client,
        release.workdir,
        extra=("--webhook", "serve", "--resync-seconds", "2", *listen),
        webhook_config=FULLNAME,
    )
    process.start(webhook=False)  # started as `--webhook off`, then `--webhook serve` wins
    return process


@pytest.fixture(scope="module")
def operator_as_its_service_account(
    release: Release, api_client: client.ApiClient
) -> Iterator[OperatorProcess]:
    """`vramgate operator` with the chart's config file and the operator ServiceAccount's
    token. Only the listen addresses differ from the pod's (loopback, free ports); it serves
    its webhook, so it writes the certificate Secret and injects the CA like the pods do."""
    process = operator_as_the_chart_runs_it(release, api_client)
    try:
        yield process
    finally:
        process.stop()


def _ftj(name: str, product: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "FineTuneJob",
        "metadata": {"name": name},
        "spec": {
            **QLORA,
            "resources": {"gpus": 1, "gpuSelector": {PRODUCT_LABEL: product}},
            "template": {
                "metadata": {"annotations": {RUN_FOR_ANNOTATION: "600s"}},
                "spec": {"containers": [{"name": "trainer", "image": "trainer:v1"}]},
            },
        },
    }


def test_the_operator_admits_a_job_as_the_operator_service_account(
    release: Release,
    operator_as_its_service_account: OperatorProcess,
    agent_as_its_service_account: subprocess.Popen[str],
    gpu_node: str,
    api_client: client.ApiClient,
    namespace: str,
) -> None:
    node = client.CoreV1Api(api_client).read_node(gpu_node)
    product = node.metadata.labels[PRODUCT_LABEL]
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "finetunejobs", _ftj("via-chart-rbac", product)
    )
    job = admitted(api_client, namespace, "via-chart-rbac", "True", "Fits", timeout=30)
    assert job["status"]["placement"]["nodes"][0]["node"] == gpu_node
    assert batch_job(api_client, namespace, "via-chart-rbac").spec.backoff_limit == 0
    # It holds the chart's Lease, in the release namespace.
    lease = client.CoordinationV1Api(api_client).read_namespaced_lease(
        f"{FULLNAME}-operator", release.namespace
    )
    assert lease.spec.holder_identity == f"{release.workdir.name}-0"  # OperatorProcess's --identity


def test_the_operator_filled_the_certificate_secret_and_injected_its_ca(
    release: Release, operator_as_its_service_account: OperatorProcess, api_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(api_client)
    admission = client.AdmissionregistrationV1Api(api_client)

    def filled() -> client.V1Secret | None:
        secret = core.read_namespaced_secret(f"{FULLNAME}-webhook-tls", release.namespace)
        return secret if (secret.data or {}).get("ca.crt") else None

    secret = wait_until(filled, timeout=30, what="the operator to fill the webhook Secret")

    def injected() -> bool:
        configs = [
            admission.read_validating_webhook_configuration(FULLNAME),
            admission.read_mutating_webhook_configuration(FULLNAME),
        ]
        bundles = [c.webhooks[0].client_config.ca_bundle for c in configs]
        return bundles == [secret.data["ca.crt"]] * 2

    wait_until(injected, timeout=30, what="the CA in both webhook configurations")


def test_no_request_of_the_operator_was_refused_by_rbac(
    release: Release, operator_as_its_service_account: OperatorProcess, api_client: client.ApiClient
) -> None:
    """Stopped before the upgrade and uninstall take its rights away. Any 403 counts, whether
    or not the line names the ServiceAccount (kopf's "Failed to post an event" warnings and
    the cert Secret's errors do not), except a write into a namespace being deleted (another
    test's), which is no RBAC refusal."""
    operator_as_its_service_account.stop()
    denied = [
        line for line in operator_as_its_service_account.log().splitlines()
        if (f"system:serviceaccount:{release.namespace}:{OPERATOR_SA}" in line
            or "HTTP 403" in line or "Forbidden" in line or "Code: 403" in line)
        and "because it is being terminated" not in line
    ]  # fmt: skip
    assert denied == [], denied[:5]
    # The Secret it created is owned by the chart's Lease, so `helm uninstall` takes it too.
    core = client.CoreV1Api(api_client)
    secret = core.read_namespaced_secret(f"{FULLNAME}-webhook-tls", release.namespace)
    lease = client.CoordinationV1Api(api_client).read_namespaced_lease(
        f"{FULLNAME}-operator", release.namespace
    )
    owners = [
        (o.api_version, o.kind, o.name, o.uid) for o in secret.metadata.owner_references or []
    ]
    assert owners == [("coordination.k8s.io/v1", "Lease", lease.metadata.name, lease.metadata.uid)]


# The ServiceAccounts' rights: enough (above) and not more. (sa, can-i arguments, expected)
OPERATOR_CAN = [
    ("get", "finetunejobs.vramgate.dev", "-A"),
    ("watch", "finetunejobs.vramgate.dev", "-A"),
    ("patch", "finetunejobs.vramgate.dev", "--subresource=status", "-n", "any"),
    # blockOwnerDeletion on the workloads' ownerReferences (OwnerReferencesPermissionEnforcement,
    # on in the local control plane: the admit cycle above proves it enough).
    ("update", "finetunejobs.vramgate.dev", "--subresource=finalizers", "-n", "any"),
    ("list", "gpunodes.vramgate.dev"),
    ("watch", "learnedcorrections.vramgate.dev"),
    ("create", "learnedcorrections.vramgate.dev"),
    ("patch", "learnedcorrections.vramgate.dev", "--subresource=status"),
    # a configuration's key no job taught for 8 half-lives (controller.admission.learned)
    ("delete", "learnedcorrections.vramgate.dev"),
    ("watch", "pods", "-A"),
    ("get", "nodes"),
    ("watch", "priorityclasses.scheduling.k8s.io"),
    ("create", "jobs.batch", "-n", "any"),
    ("delete", "jobs.batch", "-n", "any"),
    ("create", "services", "-n", "any"),
    ("get", "services", "-n", "any"),  # whose object a workload's taken name is
    ("get", "configmaps", "-n", "any"),
    ("create", "events", "-n", "any"),
    ("list", "events", "-n", "any"),  # how a Job deleted unseen ended (workload/lost.py)
    ("get", "jobs.batch", "-n", "any"),
]
OPERATOR_CANNOT = [
    # kopf posts core v1 Events only.
    ("create", "events.events.k8s.io", "-n", "any"),
    ("get", "secrets", "-n", "default"),
    ("list", "secrets", "-A"),
    ("create", "secrets", "-n", "default"),
    ("create", "pods", "--subresource=exec", "-n", "any"),
    ("create", "pods", "-n", "any"),
    ("delete", "pods", "-n", "any"),
    ("update", "finetunejobs.vramgate.dev", "-n", "any"),
    ("patch", "finetunejobs.vramgate.dev", "-n", "any"),
    ("delete", "finetunejobs.vramgate.dev", "-n", "any"),
    # Only with kueue.admissionCheck.enabled (resize under Kueue), off in this release.
    ("patch", "jobs.batch", "-n", "any"),
    ("create", "gpunodes.vramgate.dev"),
    ("patch", "gpunodes.vramgate.dev", "--subresource=status"),
    # A key's spec (its pin, its reset) is a person's.
    ("patch", "learnedcorrections.vramgate.dev"),
    ("patch", "nodes"),
    ("create", "priorityclasses.scheduling.k8s.io"),
    ("list", "configmaps", "-A"),
    ("update", "configmaps", "-n", "any"),
    ("patch", "validatingwebhookconfigurations/some-other-webhook"),
    ("create", "validatingwebhookconfigurations"),
    ("create", "clusterroles"),
    ("create", "rolebindings", "-n", "any"),
    ("create", "deployments.apps", "-n", "any"),
    ("delete", "namespaces"),
    ("create", "serviceaccounts", "--subresource=token", "-n", "any"),
    ("impersonate", "users"),
    ("update", "leases.coordination.k8s.io", "-n", "kube-system"),
]
AGENT_CAN = [
    ("get", "gpunodes.vramgate.dev"),
    ("create", "gpunodes.vramgate.dev"),
    ("patch", "gpunodes.vramgate.dev", "--subresource=status"),
    ("get", "nodes"),
]
AGENT_CANNOT = [
    ("create", "finetunejobs.vramgate.dev", "-n", "any"),
    ("patch", "finetunejobs.vramgate.dev", "--subresource=status", "-n", "any"),
    ("list", "finetunejobs.vramgate.dev", "-A"),
    ("delete", "gpunodes.vramgate.dev"),
    ("update", "gpunodes.vramgate.dev"),
    ("list", "pods", "-A"),
    ("create", "pods", "--subresource=exec", "-n", "any"),
    ("get", "secrets", "-A"),
    ("list", "nodes"),
    ("patch", "nodes"),
    ("create", "events", "-n", "any"),
    ("get", "configmaps", "-n", "any"),
]


def _case_id(case: tuple[str, ...]) -> str:
    return " ".join(case).replace("--subresource=", "/")


@pytest.mark.parametrize("args", OPERATOR_CAN, ids=_case_id)
def test_the_operator_may(release: Release, args: tuple[str, ...]) -> None:
    assert release.can_i(OPERATOR_SA, *args)


@pytest.mark.parametrize("args", OPERATOR_CANNOT, ids=_case_id)
def test_the_operator_may_not(release: Release, args: tuple[str, ...]) -> None:
    assert not release.can_i(OPERATOR_SA, *args)


def test_the_operator_reaches_only_its_own_secret_lease_and_webhooks(release: Release) -> None:
    ns = ("-n", release.namespace)
    assert release.can_i(OPERATOR_SA, "get", f"secrets/{FULLNAME}-webhook-tls", *ns)
    assert release.can_i(OPERATOR_SA, "update", f"secrets/{FULLNAME}-webhook-tls", *ns)
    # Replaced (PUT), never patched; the webhook configurations are JSON-patched, never
    # replaced (controller/webhook/cert_secret.py).
    assert not release.can_i(OPERATOR_SA, "patch", f"secrets/{FULLNAME}-webhook-tls", *ns)
    assert not release.can_i(OPERATOR_SA, "get", "secrets/someone-elses", *ns)
    assert not release.can_i(OPERATOR_SA, "list", "secrets", *ns)
    assert release.can_i(OPERATOR_SA, "update", f"leases/{FULLNAME}-operator", *ns)
    assert not release.can_i(OPERATOR_SA, "update", "leases/another", *ns)
    assert not release.can_i(OPERATOR_SA, "create", "leases", *ns)
    for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
        assert release.can_i(OPERATOR_SA, "patch", f"{kind}/{FULLNAME}")
        assert not release.can_i(OPERATOR_SA, "patch", f"{kind}/other")
        assert not release.can_i(OPERATOR_SA, "update", f"{kind}/{FULLNAME}")


@pytest.mark.parametrize("args", AGENT_CAN, ids=_case_id)
def test_the_agent_may(release: Release, args: tuple[str, ...]) -> None:
    assert release.can_i(AGENT_SA, *args)


@pytest.mark.parametrize("args", AGENT_CANNOT, ids=_case_id)
def test_the_agent_may_not(release: Release, args: tuple[str, ...]) -> None:
    assert not release.can_i(AGENT_SA, *args)


def _ca_bundle(api: client.ApiClient) -> str | None:
    admission = client.AdmissionregistrationV1Api(api)
    config = admission.read_validating_webhook_configuration(FULLNAME)
    return config.webhooks[0].client_config.ca_bundle  # type: ignore[no-any-return]


def test_helm_upgrade_with_changed_values_rolls_the_operator_and_keeps_the_certificate(
    release: Release, cluster: Cluster, api_client: client.ApiClient
) -> None:
    apps = client.AppsV1Api(api_client)
    core = client.CoreV1Api(api_client)

    def checksum() -> str:
        deployment = apps.read_namespaced_deployment(f"{FULLNAME}-operator", release.namespace)
        return str(deployment.spec.template.metadata.annotations["checksum/config"])

    before = checksum()
    secret_before = core.read_namespaced_secret(f"{FULLNAME}-webhook-tls", release.namespace).data
    bundle_before = _ca_bundle(api_client)
    done = release.helm(
        "upgrade", RELEASE, str(CHART), "--reuse-values",
        "--set", "operator.config.resyncSeconds=5", "--set", "operator.config.headroom=1GiB",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert checksum() != before
    config = yaml.safe_load(
        core.read_namespaced_config_map(f"{FULLNAME}-operator-config", release.namespace).data[
            "operator.yaml"
        ]
    )
    assert (config["resyncSeconds"], config["headroom"]) == (5, "1GiB")
    # The certificate and the injected CA survive the upgrade (caBundle is not templated).
    secret = core.read_namespaced_secret(f"{FULLNAME}-webhook-tls", release.namespace)
    assert secret.data == secret_before
    assert _ca_bundle(api_client) == bundle_before
    history = json.loads(release.helm("history", RELEASE, "-o", "json").stdout)
    assert [h["status"] for h in history] == ["superseded", "deployed"]


def test_with_listed_namespaces_the_operator_may_act_only_in_them(release: Release) -> None:
    """The release's own namespace listed: the namespaced rights there, none elsewhere; the
    cluster-scoped reads stay."""
    done = release.helm(
        "upgrade", RELEASE, str(CHART), "--reuse-values",
        "--set", f"operator.config.namespaces={{{release.namespace}}}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    listed, other = ("-n", release.namespace), ("-n", "any")
    for args in (
        ("watch", "finetunejobs.vramgate.dev"),
        ("patch", "finetunejobs.vramgate.dev", "--subresource=status"),
        ("watch", "pods"),
        ("create", "jobs.batch"),
        ("create", "services"),
        ("get", "configmaps"),
        ("create", "events"),
    ):
        assert release.can_i(OPERATOR_SA, *args, *listed), args
        assert not release.can_i(OPERATOR_SA, *args, *other), args
    assert not release.can_i(OPERATOR_SA, "watch", "finetunejobs.vramgate.dev", "-A")
    for args in (("list", "gpunodes.vramgate.dev"), ("get", "nodes"), ("watch", "namespaces")):
        assert release.can_i(OPERATOR_SA, *args), args


def test_with_listed_namespaces_the_operator_decides_as_its_service_account(
    release: Release,
    agent_as_its_service_account: subprocess.Popen[str],
    gpu_node: str,
    api_client: client.ApiClient,
) -> None:
    """A new leader relists the jobs of its own namespaces: a cluster-wide list is one the
    narrowed rights refuse, and every pass used to fail on it while the job never got a
    status."""
    node = client.CoreV1Api(api_client).read_node(gpu_node)
    product = node.metadata.labels[PRODUCT_LABEL]
    process = operator_as_the_chart_runs_it(release, api_client)
    try:
        client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            GROUP, VERSION, release.namespace, "finetunejobs", _ftj("in-listed", product)
        )
        admitted(api_client, release.namespace, "in-listed", "True", "Fits", timeout=30)
    finally:
        process.stop()
    failed = [line for line in process.log().splitlines() if "pass failed" in line]
    assert failed == [], failed[:3]


def test_helm_uninstall_leaves_only_the_crds(release: Release, cluster: Cluster) -> None:
    done = release.helm("uninstall", RELEASE)
    assert done.returncode == 0, done.stderr
    release.installed = False
    assert "These resources were kept due to the resource policy" in done.stdout + done.stderr
    kinds = (
        "all,configmap,secret,lease,serviceaccount,role,rolebinding,poddisruptionbudget,"
        "clusterrole,clusterrolebinding,validatingwebhookconfiguration,"
        "mutatingwebhookconfiguration,customresourcedefinition"
    )
    crds = sorted(f"customresourcedefinition.apiextensions.k8s.io/{name}" for name in CRD_NAMES)

    def left() -> list[str]:
        listed = cluster.kubectl(
            "get", kinds, "-A", "-o", "name", "-l", f"app.kubernetes.io/instance={RELEASE}"
        )
        assert listed.returncode == 0, listed.stderr
        return sorted(listed.stdout.split())

    # Pods and ReplicaSets go by garbage collection, a moment after their owners.
    wait_until(lambda: left() == crds, timeout=60, what="only the CRDs left", interval=0.5)

    # By name too (the operator's writes replace the Lease's labels): the operator's own
    # certificate Secret is owned by the chart's Lease, so it goes by garbage collection too.
    def named() -> list[str]:
        leftover = cluster.kubectl(
            "get", "secret,lease,configmap,serviceaccount", "-n", release.namespace, "-o", "name"
        )
        return [n for n in leftover.stdout.split() if "vramgate" in n or FULLNAME in n]

    wait_until(lambda: named() == [], timeout=60, what="nothing of the release by name",
               interval=0.5)  # fmt: skip
    for name in (FULLNAME,):
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            assert cluster.kubectl("get", kind, name).returncode == 1
    for name in (f"{FULLNAME}-operator", f"{FULLNAME}-agent"):
        assert cluster.kubectl("get", "clusterrole", name).returncode == 1


def test_without_leader_election_uninstall_still_takes_the_certificate_secret(
    cluster: Cluster, api_client: client.ApiClient, tmp_path: Path
) -> None:
    """The Secret holds the webhook CA's private key. It is owned by the chart's Lease, which
    was rendered only for leader election: with one replica and no election, `helm
    uninstall` left the Secret behind. (After the release above is gone: same names.)"""
    core = client.CoreV1Api(api_client)
    with release_in_its_namespace(cluster, api_client, tmp_path) as made:
        done = made.install("--set", "operator.replicas=1",
                            "--set", "operator.config.leaderElection=false")  # fmt: skip
        assert done.returncode == 0, done.stderr
        process = operator_as_the_chart_runs_it(made, api_client)
        try:
            secret = wait_until(
                lambda: (found := core.read_namespaced_secret(
                    f"{FULLNAME}-webhook-tls", made.namespace))
                and (found.metadata.owner_references or []) and found,
                timeout=30, what="the Secret, owned",
            )  # fmt: skip
        finally:
            process.stop()
        assert [o.kind for o in secret.metadata.owner_references] == ["Lease"]
        assert made.helm("uninstall", RELEASE).returncode == 0
        made.installed = False

        def gone() -> bool:
            try:
                core.read_namespaced_secret(f"{FULLNAME}-webhook-tls", made.namespace)
            except ApiException as error:
                return error.status == 404
            return False

        wait_until(gone, timeout=60, what="the Secret gone with the release", interval=0.5)


# -- e2e/kind ---------------------------------------------------------------------------------


def test_the_kind_run_says_in_one_line_that_it_is_skipped_without_docker(tmp_path: Path) -> None:
    """CI here has no Docker: `make kind` must say so and pass, not fail or hang."""
    done = subprocess.run(
        [sys.executable, "-m", "e2e.kind"], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PATH": str(tmp_path)}, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["e2e/kind: skipped: docker not found"]
