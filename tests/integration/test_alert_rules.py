"""The alert rules as promtool sees them: the file is valid, and every alert fires in its unit
test (tests/promtool/alerts_test.yaml) and stays quiet in the case next to it.

No control plane needed; here because promtool is a real external binary like the cluster's
(installed by `make prometheus`), and a missing one fails the run instead of skipping it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.prometheus import PrometheusMissing, find_binaries, promtool

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "charts" / "vramgate" / "files" / "alerts.yaml"
UNIT_TESTS = REPO / "tests" / "promtool" / "alerts_test.yaml"


@pytest.fixture(scope="module", autouse=True)
def binaries() -> None:
    problem = ""
    try:
        find_binaries()
    except PrometheusMissing as error:
        problem = str(error)
    if problem:
        pytest.fail(problem, pytrace=False)


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
        assert "`kubectl" in rule["annotations"]["description"] or "dashboard" in \
            rule["annotations"]["description"], f"{name}: the description says what to run"  # fmt: skip
        # A counter's increase over an hour needs no `for:`; every state-based alert has one.
        assert "for" in rule or "increase(" in rule["expr"], name
