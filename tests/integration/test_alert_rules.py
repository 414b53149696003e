"""The alert rules and the dashboard as promtool sees them: the rule file is valid, every
alert fires in its unit test (tests/promtool/alerts_test.yaml) and stays quiet in the case
next to it, and every dashboard query parses. (What they return on real metrics:
test_prometheus.py.)

No control plane needed; here because promtool is a real external binary like the cluster's
(installed by `make prometheus`), and a missing one fails the run instead of skipping it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.prometheus import dashboard_queries, promtool

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "charts" / "vramgate" / "files" / "alerts.yaml"
UNIT_TESTS = REPO / "tests" / "promtool" / "alerts_test.yaml"
DASHBOARD = REPO / "charts" / "vramgate" / "files" / "dashboard.json"
GRAFANA_BUILTINS = {"__rate_interval": "5m", "__interval": "1m", "__range": "6h"}


@pytest.fixture(scope="module", autouse=True)
def binaries(prometheus_binaries: None) -> None:
    """Every test here runs promtool."""


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_accepts_the_rule_file() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


def test_promtool_unit_tests_pass() -> None:
    ran = promtool("test", "rules", UNIT_TESTS.name, cwd=UNIT_TESTS.parent)
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_every_alert_fires_in_a_unit_test_and_is_quiet_in_another() -> None:
    """A new alert without a firing case and a quiet case fails here, not in production."""
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert names - firing == set(), "alerts no unit test makes fire"
    assert names - quiet == set(), "alerts no unit test shows quiet"


def test_every_alert_has_a_severity_a_for_or_a_reason_and_actionable_annotations() -> None:
    for rule in alerts():
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert set(rule["annotations"]) == {"summary", "description"}, name
        description = rule["annotations"]["description"]
        assert "`kubectl" in description or "dashboard" in description, \
            f"{name}: the description says what to look at"  # fmt: skip
        # A counter's increase over an hour needs no `for:`; every state-based alert has one.
        assert "for" in rule or "increase(" in rule["expr"], name


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """Each query as a recording rule: promtool parses it with Prometheus' own parser."""
    queries = dashboard_queries(dashboard(), GRAFANA_BUILTINS)
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": q.expr} for i, q in enumerate(queries)
    ]}]}  # fmt: skip
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    checked = promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(queries)} rules found" in checked.stdout


def test_the_dashboard_asks_for_its_datasource_node_and_product_and_uses_them() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("node", "modelName"):
        assert variables[name]["type"] == "query"
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        assert panel["description"], panel["title"]
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    for metric in (
        "vramgate_job_predicted_bytes",
        "vramgate_gpu_reservation_bytes",
        "vramgate_gpu_memory_free_bytes",
        "vramgate_gpu_schedulable_free_bytes",
        "vramgate_pending_jobs",
        "vramgate_pending_job_created_timestamp_seconds",
        "vramgate_decisions_total",
        "vramgate_estimate_accuracy_ratio_bucket",
        "vramgate_job_observed_ratio",
        "vramgate_gpunode_heartbeat_timestamp_seconds",
        "vramgate_webhook_request_duration_seconds_bucket",
        "vramgate_decision_latency_seconds_bucket",
    ):
        assert metric in exprs, f"no panel shows {metric}"
    assert "$node" in exprs and "$modelName" in exprs
