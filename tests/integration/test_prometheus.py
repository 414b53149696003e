"""The dashboard and the alerts on a real Prometheus scraping the real operator and agents.

A scenario on the local control plane (e2e.demo.Stack: one `vramgate agent --backend static`
per simulated node, each on its own metrics port, simulated trainers whose per-pod bytes the
agents report, `vramgate operator` with its webhook, Prometheus with the chart's rule file):

* node A, 4 x 80 GiB, two GPUs 75 GiB full with memory outside vramgate's view: a job asking
  for 4 GPUs with admissionPolicy Resize is resized to 2;
* node B, 1 x 20 GiB: a job admitted and running at 112% of its estimate, a second one
  queued behind it, one rejected by the operator (its model in a ConfigMap, which the webhook
  does not read), one refused by the webhook at create;
* node C, 2 x 20 GiB: two jobs that finish (at 110% of their estimate) a few seconds apart,
  then a third admitted once Prometheus has seen the first ones;
* node D: a GPUNode whose agent went silent ten minutes ago.

Then every panel query of dashboard.json and every rule expression of alerts.yaml is
evaluated through the HTTP API, both parsed from the files so that a new panel or alert is
covered without touching this test: each returns numbers, or is listed in EXPECTED_EMPTY
with the reason this scenario gives it none.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from controller.api.base import GROUP, PRODUCT_LABEL, VERSION
from e2e.cluster import Cluster
from e2e.demo import USES_ANNOTATION, SimGpu, SimNode, Stack
from e2e.nodes import RUN_FOR_ANNOTATION
from e2e.prometheus import (
    dashboard_queries,
    has_numbers,
    rule_expressions,
    values,
)
from e2e.wait import wait_until
from tests.integration.gpunodes import gpu_status, publish
from tests.integration.test_operator import PLURAL, crds  # noqa: F401 - `crds` is a fixture

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "charts" / "vramgate" / "files" / "dashboard.json"
ALERTS = REPO / "charts" / "vramgate" / "files" / "alerts.yaml"
PRESET_405B = REPO / "controller" / "estimator" / "presets" / "llama-3.1-405b.json"
GIB = 2**30
DEADLINE_S = 60.0
#: A window as long as the scenario, as Grafana would pick for a panel showing all of it.
GRAFANA_BUILTINS = {"__rate_interval": "10m", "__interval": "15s", "__range": "10m"}

#: Queries that this scenario leaves without a result, and why. Anything else must return
#: at least one number.
EXPECTED_EMPTY = {
    "VramgateJobQueuedTooLong": "the queued job has waited seconds; the threshold is an hour",
    "VramgateEstimatorUnderPredicts": "2 finished jobs observed (both above the estimate); "
                                      "the alert needs at least 5 in a day",
    "VramgateJobRanOutOfGpuMemory": "no job ran out of GPU memory",
    "VramgateWebhookErrors": "no webhook request raised",
    "VramgateWebhookSlow": "the webhooks answer in milliseconds, far below the 1 s threshold",
    "VramgateNoLeader": "the operator holds its Lease",
}  # fmt: skip
#: Alerts whose condition this scenario creates: pending (their `for:` is minutes) or firing.
EXPECTED_ACTIVE = {
    "VramgateAgentHeartbeatStale": "node D's heartbeat is ten minutes old",
    "VramgateGpuMemoryOutsideReservation": "75 GiB used on two of node A's GPUs, none reserved",
    "VramgateJobAboveEstimate": "the running job uses 112% of its estimate",
    "VramgateLearnedRatioAboveOne": "the 2 finished jobs used more than their estimate: "
    "the keys they taught have a p95 ratio above 1",
}


@dataclass
class Scenario:
    stack: Stack
    namespace: str
    products: dict[str, str]
    nodes: dict[str, str]

    @property
    def prometheus(self) -> Any:
        assert self.stack.prometheus is not None
        return self.stack.prometheus


def ftj(name: str, product: str, runs_for: str = "24h", uses: float = 0.9,
        **spec: Any) -> dict[str, Any]:  # fmt: skip
    """QLoRA llama-3.1-8b on one GPU of `product` (11.64 GiB), a trainer pod that runs for
    `runs_for` and uses `uses` times its estimate."""
    resources = {"gpus": 1, "gpuSelector": {PRODUCT_LABEL: product}, **spec.pop("resources", {})}
    template = {
        "metadata": {"annotations": {RUN_FOR_ANNOTATION: runs_for, USES_ANNOTATION: str(uses)}},
        "spec": {"containers": [{"name": "trainer", "image": "trainer:v1"}]},
    }
    body = {"model": {"preset": "llama-3.1-8b"}, "method": "QLoRA", "lora": {"rank": 16}}
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "FineTuneJob", "metadata": {"name": name},
        "spec": {**body, "template": template, **spec, "resources": resources},
    }  # fmt: skip


def objects(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def create(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> None:
    objects(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def condition(api: client.ApiClient, namespace: str, name: str, kind: str) -> dict[str, Any]:
    job = objects(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    found = [c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == kind]
    return dict(found[0]) if found else {}


def wait_condition(api: client.ApiClient, namespace: str, name: str, kind: str, status: str,
                   reason: str | None = None, timeout: float = DEADLINE_S) -> None:  # fmt: skip
    def met() -> bool:
        found = condition(api, namespace, name, kind)
        return found.get("status") == status and reason in (None, found.get("reason"))

    wait_until(met, timeout=timeout, what=f"{name} {kind}={status} {reason or ''}")


def refused(api: client.ApiClient, namespace: str, body: dict[str, Any], dry_run: bool) -> str:
    """The webhook's refusal of `body`, or "" when it was let through."""
    try:
        objects(api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, **({"dry_run": "All"} if dry_run else {})
        )
    except ApiException as error:
        if error.status == 422:
            return str(error.body)
        raise
    if not dry_run:
        objects(api).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body["metadata"]["name"]
        )
    return ""


def query(scenario: Scenario, expr: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = scenario.prometheus.query(expr)
    return result


def number(scenario: Scenario, expr: str) -> float:
    found = values(query(scenario, expr))
    return found[0] if found else math.nan


@pytest.fixture(scope="module")
def scenario(
    cluster: Cluster,
    api_client: client.ApiClient,
    crds: None,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
    prometheus_binaries: None,
) -> Iterator[Scenario]:
    tag = uuid.uuid4().hex[:6]
    products = {k: f"PROM-{tag}-{k}" for k in "ABCD"}
    sim = [
        SimNode(f"prom-{tag}-a", products["A"],
                [SimGpu(f"GPU-prom-{tag}-a-{i}", 80 * GIB, 75 * GIB if i >= 2 else 0, i >= 2)
                 for i in range(4)]),  # GPUs 2 and 3 held by a pod outside vramgate
        SimNode(f"prom-{tag}-b", products["B"], [SimGpu(f"GPU-prom-{tag}-b-0", 20 * GIB)]),
        SimNode(f"prom-{tag}-c", products["C"],
                [SimGpu(f"GPU-prom-{tag}-c-{i}", 20 * GIB) for i in range(2)]),
    ]  # fmt: skip
    core = client.CoreV1Api(api_client)
    namespace = f"prom-{tag}"
    core.create_namespace({"metadata": {"name": namespace}})
    stack = Stack(cluster, tmp_path_factory.mktemp("prometheus"), sim,
                  operator_args=("--resync-seconds", "2", "--heartbeat-ttl-seconds", "30"),
                  lease_name=f"vramgate-prometheus-{tag}",
                  webhook_config=f"vramgate-prometheus-{tag}.vramgate.dev")  # fmt: skip
    stale: list[str] = []
    try:
        stale = cluster.create_gpu_nodes(1, gpus_per_node=1, product=products["D"],
                                         name_prefix=f"prom-{tag}-d")  # fmt: skip
        publish(api_client, stale[0], [gpu_status(stale[0], 0, 80, product=products["D"])],
                heartbeat=datetime.now(UTC) - timedelta(minutes=10))  # fmt: skip
        stack.start()
        nodes = {k: n.name for k, n in zip("ABC", sim, strict=True)} | {"D": stale[0]}
        made = Scenario(stack, namespace, products, nodes)
        run_scenario(made, api_client)
        yield made
    finally:
        stack.stop()
        core.delete_namespace(namespace)
        for name in [n.name for n in sim] + stale:
            try:
                core.delete_node(name)
            except ApiException as error:
                if error.status != 404:
                    raise


def run_scenario(s: Scenario, api: client.ApiClient) -> None:
    ns, p = s.namespace, s.products
    too_big = ftj("too-big", p["B"], model={"preset": "llama-3.1-70b"}, method="Full")
    too_big["spec"].pop("lora")
    # The webhook judges against the operator's view: wait until it holds node B's GPU.
    wait_until(lambda: "InsufficientVRAM" in refused(api, ns, too_big, dry_run=True),
               timeout=DEADLINE_S, what="the webhook to know node B")  # fmt: skip

    create(api, ns, ftj("running", p["B"], uses=1.12))
    create(api, ns, ftj("short", p["C"], runs_for="15s", uses=1.1))
    create(api, ns, ftj("long", p["C"], runs_for="30s", uses=1.1))
    create(api, ns, ftj("resized", p["A"], admissionPolicy="Resize",
                        resources={"gpus": 4, "minGPUs": 1}))  # fmt: skip
    wait_condition(api, ns, "running", "Admitted", "True", "Fits")
    create(api, ns, ftj("queued", p["B"]))
    config = json.loads(PRESET_405B.read_text())["config"]
    client.CoreV1Api(api).create_namespaced_config_map(
        ns, {"metadata": {"name": "llama-405b"}, "data": {"config.json": json.dumps(config)}}
    )
    rejected = ftj("rejected", p["B"], model={"configMapRef": {"name": "llama-405b"}},
                   method="Full")  # fmt: skip
    rejected["spec"].pop("lora")
    create(api, ns, rejected)
    assert "InsufficientVRAM" in refused(api, ns, too_big, dry_run=False)

    wait_condition(api, ns, "resized", "Admitted", "True", "Resized")
    wait_condition(api, ns, "queued", "Admitted", "False", "WaitingForVRAM")
    wait_condition(api, ns, "rejected", "Admitted", "False", "InsufficientVRAM")
    for name in ("short", "long"):
        wait_condition(api, ns, name, "Succeeded", "True", timeout=90)

    def scraped() -> bool:
        decisions = {r["metric"].get("decision") for r in
                     query(s, "sum by (decision) (vramgate_decisions_total)")}  # fmt: skip
        return (
            {"Admit", "Resize", "Queue", "Reject"} <= decisions
            and number(s, 'max(vramgate_job_observed_ratio{job="running"})') > 1.1
            and number(s, "sum(vramgate_estimate_accuracy_ratio_count)") >= 2
            and has_numbers(query(s, "vramgate:estimate_underpredicted:share1d"))
        )

    wait_until(scraped, timeout=DEADLINE_S, what="Prometheus to have the scenario's metrics",
               interval=1)  # fmt: skip

    # A second wave, now that Prometheus has seen the first: rates count from a series' first
    # scrape, so the histograms and counters created by the first wave need events after it.
    admits = number(s, 'sum(vramgate_decisions_total{decision="Admit"})')
    create(api, ns, ftj("late", p["C"], lora={"rank": 8}))  # a spec not estimated before
    wait_condition(api, ns, "late", "Admitted", "True", "Fits")
    wait_until(lambda: number(s, 'sum(vramgate_decisions_total{decision="Admit"})') > admits,
               timeout=DEADLINE_S, what="Prometheus to see the late job's decision")  # fmt: skip


def evaluate(scenario: Scenario, named: dict[str, str]) -> dict[str, str]:
    """What is wrong with each query's result: "" when it is as expected."""
    problems = {}
    for name, expr in named.items():
        result = query(scenario, expr)
        if name in EXPECTED_EMPTY:
            problem = f"expected empty ({EXPECTED_EMPTY[name]}), got {result}" if result else ""
        else:
            problem = "" if has_numbers(result) else f"no numbers: {result} from {expr}"
        if problem:
            problems[name] = problem
    return problems


def test_every_dashboard_panel_query_returns_numbers(scenario: Scenario) -> None:
    board = json.loads(DASHBOARD.read_text())
    queries = dashboard_queries(board, GRAFANA_BUILTINS)
    assert len(queries) >= 20
    problems = evaluate(scenario, {q.name: q.expr for q in queries})
    assert problems == {}, "\n".join(f"{k}: {v}" for k, v in problems.items())


def test_every_rule_expression_returns_numbers_or_the_expected_nothing(
    scenario: Scenario,
) -> None:
    rules = rule_expressions(yaml.safe_load(ALERTS.read_text()))
    assert set(EXPECTED_EMPTY) | set(EXPECTED_ACTIVE) <= set(rules)
    problems = evaluate(scenario, rules)
    assert problems == {}, "\n".join(f"{k}: {v}" for k, v in problems.items())


def test_the_rules_evaluate_cleanly_and_the_scenarios_alerts_are_active(
    scenario: Scenario,
) -> None:
    prometheus = scenario.prometheus
    rules = wait_until(
        lambda: (found := prometheus.rules())
        and all(r["lastEvaluation"] > "2000" for r in found) and found,
        timeout=30, what="every rule evaluated once",
    )  # fmt: skip
    assert {r["name"]: r["health"] for r in rules if r["health"] != "ok"} == {}
    active = {r["name"]: r for r in rules if r.get("type") == "alerting" and r["alerts"]}
    assert set(active) == set(EXPECTED_ACTIVE), {n: r["alerts"] for n, r in active.items()}
    stale = [a["labels"] for a in active["VramgateAgentHeartbeatStale"]["alerts"]]
    assert {"node": scenario.nodes["D"]} in [{"node": a["node"]} for a in stale]
    outside = active["VramgateGpuMemoryOutsideReservation"]["alerts"]
    assert {(a["labels"]["node"], a["labels"]["gpu"]) for a in outside} >= {
        (scenario.nodes["A"], "2"), (scenario.nodes["A"], "3")}  # fmt: skip
    above = active["VramgateJobAboveEstimate"]["alerts"]
    assert [(a["labels"]["namespace"], a["labels"]["job"]) for a in above] == [
        (scenario.namespace, "running")]  # fmt: skip
    assert "uses 112% of its estimate" in above[0]["annotations"]["summary"]


def test_operator_and_agent_series_join_on_the_gpu_labels(scenario: Scenario) -> None:
    """The dashboard's joins hold: the operator labels a GPU as its agent does."""
    node_b = scenario.nodes["B"]
    predicted = query(scenario, 'vramgate_job_predicted_bytes{job="running"}')
    assert len(predicted) == 1
    labels = predicted[0]["metric"]
    assert (labels["node"], labels["gpu"], labels["UUID"]) == (node_b, "0", f"GPU-{node_b}-0")
    assert labels["modelName"] == scenario.products["B"]
    assert labels["namespace"] == scenario.namespace  # honor_labels: not exported_namespace
    used = query(scenario, f'vramgate_gpu_pod_memory_used_bytes{{node="{node_b}"}}')
    assert len(used) == 1
    assert float(used[0]["value"][1]) == pytest.approx(1.12 * float(predicted[0]["value"][1]),
                                                       rel=1e-6)  # fmt: skip
