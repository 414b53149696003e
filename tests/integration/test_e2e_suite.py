"""The end-to-end suite (`e2e/suite`, the scenarios `make kind` runs on kind) on the local
control plane, installed the way a platform team installs it.

The chart is installed by helm; `vramgate operator` runs with the chart's config file and a
token of the operator's ServiceAccount, `vramgate agent` (static backend, the suite's
layout) with the agent's, one per kwok GPU node. The operator serves its webhooks on the
webhook Service's ClusterIP, port 443: the local control plane's service and pod IPs are on
loopback, and the API server resolves a webhook's `service` reference to that ClusterIP, so
the API server calls the operator exactly as in a cluster, through the Service, checking the
certificate the operator made against the CA it injected. Only pods are simulated (kwok).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from controller.api.base import GROUP, PRODUCT_LABEL, REQUESTED_GPUS_ANNOTATION, VERSION
from e2e.cluster import Cluster
from e2e.suite import layout
from e2e.suite.scenarios import FULL, QLORA, SCENARIOS, finetunejob, wait_for_the_webhook
from e2e.suite.target import Target
from tests.integration.test_agent import wait_ready
from tests.integration.test_chart import (
    AGENT_SA,
    FULLNAME,
    REPO,
    Release,
    one,
    operator_as_the_chart_runs_it,
    release_in_its_namespace,
    render,
)
from tests.integration.test_operator import OperatorProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def installed(
    cluster: Cluster, api_client: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    workdir = tmp_path_factory.mktemp("e2e-suite")
    with release_in_its_namespace(cluster, api_client, workdir) as release:
        done = release.install("--set", "webhook.timeoutSeconds=10")
        assert done.returncode == 0, done.stderr
        yield release


@pytest.fixture(scope="module")
def suite_nodes(cluster: Cluster, api_client: client.ApiClient) -> Iterator[tuple[str, list[str]]]:
    """The layout's nodes, with a product label of their own (other tests' nodes share the
    cluster), deleted afterwards with their GPUNodes."""
    tag = uuid.uuid4().hex[:6]
    product = f"E2E-{tag}-80GB"
    names = cluster.create_gpu_nodes(
        layout.NODES, gpus_per_node=layout.GPUS_PER_NODE, product=product, name_prefix=f"e2e-{tag}"
    )
    yield product, sorted(names)
    objects, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    for name in names:
        for delete, args in (
            (objects.delete_cluster_custom_object, (GROUP, VERSION, "gpunodes", name)),
            (core.delete_node, (name,)),
        ):
            try:
                delete(*args)
            except client.ApiException as error:
                if error.status != 404:
                    raise


def _agent(node: str, static: Path, kubeconfig: Path) -> subprocess.Popen[bytes]:
    """The agent's log goes to a file beside its static file: a pipe nobody reads would
    fill and stop it in a long run."""
    argv = [
        sys.executable, "-m", "controller.cli", "agent", "--node-name", node,
        "--backend", "static", "--static-file", str(static), "--kubeconfig", str(kubeconfig),
        "--metrics-address", "127.0.0.1", "--metrics-port", "0",
        "--poll-interval-seconds", "1", "--heartbeat-interval-seconds", "5",
    ]  # fmt: skip
    with (static.parent / f"agent-{node}.log").open("wb") as log:
        return subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def agents(
    installed: Release, suite_nodes: tuple[str, list[str]], api_client: client.ApiClient
) -> Iterator[None]:
    """`vramgate agent` per node as the agent's ServiceAccount, publishing the layout."""
    product, names = suite_nodes
    static = installed.workdir / "layout.yaml"
    static.write_text(yaml.safe_dump({"gpus": layout.static_gpus(product)}))
    kubeconfig = installed.kubeconfig_for(AGENT_SA)
    procs = [_agent(name, static, kubeconfig) for name in names]
    try:
        for name in names:
            wait_ready(api_client, name, "True", f"{name}'s GPUNode from its agent")
        yield
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, name in zip(procs, names, strict=True):
            proc.wait(timeout=20)
            log = (static.parent / f"agent-{name}.log").read_text(errors="replace")
            assert proc.returncode == 0, log[-4000:]


@pytest.fixture(scope="module")
def operator(installed: Release, api_client: client.ApiClient) -> Iterator[OperatorProcess]:
    """The operator as the chart's pod runs it, serving the webhooks on the Service's
    ClusterIP:443 with the certificate it keeps in the chart's Secret."""
    if not _may_bind(443):  # fail in one line, not as a webhook that never answers
        pytest.fail("serving the webhook Service's port 443 needs root (or "
                    "net.ipv4.ip_unprivileged_port_start <= 443)", pytrace=False)  # fmt: skip
    service = client.CoreV1Api(api_client).read_namespaced_service(
        f"{FULLNAME}-webhook", installed.namespace
    )
    process = operator_as_the_chart_runs_it(
        installed, api_client, "--webhook-addr", service.spec.cluster_ip, "--webhook-port", "443"
    )
    try:
        yield process
    finally:
        process.stop()


def _may_bind(port: int) -> bool:
    if os.geteuid() == 0:
        return True
    start = Path("/proc/sys/net/ipv4/ip_unprivileged_port_start")
    return start.exists() and int(start.read_text()) <= port


@pytest.fixture(scope="module")
def target(
    cluster: Cluster,
    suite_nodes: tuple[str, list[str]],
    agents: None,
    operator: OperatorProcess,
    api_client: client.ApiClient,
) -> Target:
    """The cluster as the suite sees it, once the webhook answers through its Service and
    judges the layout's GPUs (as `run_all` waits on kind)."""
    product, names = suite_nodes
    made = Target(str(cluster.binaries["kubectl"]), cluster.kubeconfig, names, product, log=print)
    wait_for_the_webhook(made)
    return made


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_scenario(target: Target, scenario: Callable[[Target], None]) -> None:
    scenario(target)


def webhook_calls(cluster: Cluster) -> dict[str, float]:
    """How often the API server has called each webhook, by its name (its own metric)."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    metric = re.compile(
        r'^apiserver_admission_webhook_admission_duration_seconds_count\{[^}]*name="([^"]+)"'
        r"[^}]*\} ([0-9.e+]+)$"
    )
    calls: dict[str, float] = {}
    for line in text.splitlines():
        if m := metric.match(line):
            calls[m[1]] = calls.get(m[1], 0.0) + float(m[2])
    return calls


def test_the_api_server_calls_a_webhook_only_for_a_write_it_may_change(
    target: Target, cluster: Cluster
) -> None:
    """The chart's matchConditions: the mutating webhook for a Resize job (or one whose count
    it rewrote) alone, the validating one for a create or a changed spec. Every other call
    is a TLS round trip in the way of a user's write, for nothing."""
    names = ("mutate-finetunejob.vramgate.dev", "validate-finetunejob.vramgate.dev")

    def calls(write: Callable[[], object]) -> tuple[float, float]:
        """(mutating, validating) calls the API server made for `write`."""
        before = webhook_calls(cluster)
        write()
        now = webhook_calls(cluster)
        mutating, validating = (now.get(n, 0) - before.get(n, 0) for n in names)
        return mutating, validating

    with target.namespace("match-conditions") as namespace:

        def kubectl(*args: str) -> Callable[[], object]:
            return lambda: target.kubectl(*args[:1], "-n", namespace, *args[1:])

        def apply(manifest: dict[str, Any]) -> Callable[[], object]:
            return lambda: target.kubectl("apply", "-n", namespace, "-f", "-",
                                          stdin=yaml.safe_dump(manifest))  # fmt: skip

        # Suspended: nothing runs, nothing is held; the webhooks judge them all the same.
        enforce = finetunejob(target, "enforce", QLORA, gpus=1, suspend=True)
        resize = finetunejob(target, "resize", FULL, gpus=1, suspend=True,
                             admissionPolicy="Resize", resources={"maxGPUs": 4})  # fmt: skip
        assert calls(apply(enforce)) == (0, 1)
        assert calls(apply(resize)) == (1, 1)
        stored = target.get("finetunejob", "resize", namespace)
        assert stored is not None and stored["spec"]["resources"]["gpus"] == 2, "rewritten"
        # Labels alone: nothing to judge, nothing to rewrite, even on a rewritten job.
        assert calls(kubectl("label", "ftj", "enforce", "team=a")) == (0, 0)
        assert calls(kubectl("label", "ftj", "resize", "team=a")) == (0, 0)
        # A rewritten job carries the count it asked for: made Enforce, its annotation still
        # brings the change to the mutating webhook, which forgets the count.
        enforced = '{"spec": {"admissionPolicy": "Enforce"}}'
        assert calls(kubectl("patch", "ftj", "resize", "--type=merge", "-p", enforced)) == (1, 1)
        stored = target.get("finetunejob", "resize", namespace)
        assert stored is not None
        assert REQUESTED_GPUS_ANNOTATION not in (stored["metadata"].get("annotations") or {})
        resume = '{"spec": {"suspend": false}}'
        assert calls(kubectl("patch", "ftj", "enforce", "--type=merge", "-p", resume)) == (0, 1)


def test_the_kind_run_installs_the_layout_the_suite_expects() -> None:
    """`e2e.kind` hands the chart the layout with --set-json: the agent's config file the
    chart renders from it is the file this module gives its agents."""
    objects = render("--values", str(REPO / "e2e" / "kind" / "values.yaml"), "--set-json",
                     f"agent.static.gpus={json.dumps(layout.static_gpus())}")  # fmt: skip
    config = one(objects, "ConfigMap", f"{FULLNAME}-agent-config")
    assert yaml.safe_load(config["data"]["gpus.yaml"]) == {"gpus": layout.static_gpus()}
    # and the kind cluster's GPU workers carry the product the scenarios select
    kind = yaml.safe_load((REPO / "e2e" / "kind" / "kind-config.yaml").read_text())
    workers = [n for n in kind["nodes"] if n["role"] == "worker"]
    assert len(workers) == layout.NODES
    assert all(w["labels"][PRODUCT_LABEL] == layout.PRODUCT for w in workers)
