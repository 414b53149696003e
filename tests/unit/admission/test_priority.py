"""Priority comes from a class an administrator defines, never from a number a job's author
writes: the resolution (`controller.admission.priority`), and the admission pass that ranks by it.

The pass is run as in test_admission_pass.py: jobs as the API holds them, PriorityClasses as
`kubectl get priorityclasses -o yaml` prints them.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller.admission.cluster import ClusterObjects
from controller.admission.priority import JobPriority, Priorities
from controller.api import conditions as cond
from controller.decision import AdmissionSettings, QueueingStrategy
from tests.unit.builders.admission import (
    cluster,
    condition,
    ftj,
    placed_on,
    reasons,
    run,
    status_after,
    write_for,
)

BILLION = 1_000_000_000
TEMPLATE_NAMING = {
    "spec": {
        "priorityClassName": "from-template",
        "containers": [{"name": "trainer", "image": "registry.invalid/train:1"}],
    }
}


def priority_class(name: str, value: int, default: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "globalDefault": default,
    }


def classes(*found: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in found}


SYSTEM = priority_class("system-node-critical", 2_000_001_000)
HIGH, LOW = priority_class("high", 1000), priority_class("low", -10)


# -- the resolution -------------------------------------------------------------------------


def test_a_job_ranks_by_the_value_of_the_class_it_names() -> None:
    ranks = Priorities(classes(HIGH, LOW))
    assert ranks.of("team", 0, "high") == JobPriority(1000)
    assert ranks.of("team", 0, "low") == JobPriority(-10)


def test_without_a_class_of_its_own_the_pod_templates_names_it() -> None:
    ranks = Priorities(classes(HIGH, priority_class("from-template", 7)))
    assert ranks.of("team", 0, None, TEMPLATE_NAMING) == JobPriority(7)
    assert ranks.of("team", 0, "high", TEMPLATE_NAMING) == JobPriority(1000), "its own first"


def test_no_class_named_takes_the_global_default_else_zero() -> None:
    assert Priorities(classes(HIGH)).of("team", 0, None) == JobPriority(0)
    ranks = Priorities(classes(HIGH, priority_class("normal", 100, default=True)))
    assert ranks.of("team", 0, None) == JobPriority(100)
    # Two defaults (a race the API server's check can lose): the lowest, as Kubernetes takes.
    two = classes(HIGH, priority_class("a", 100, default=True), priority_class("b", 5, True))
    assert Priorities(two).of("team", 0, None) == JobPriority(5)


def test_a_class_that_does_not_exist_leaves_the_job_without_a_rank() -> None:
    found = Priorities(classes(HIGH)).of("team", 0, "hgih")
    assert found.problem == (
        "spec.priorityClassName: no PriorityClass named 'hgih'; the job is decided once it "
        "exists (kubectl get priorityclasses lists those that do)"
    )
    found = Priorities(classes(HIGH)).of("team", 0, None, TEMPLATE_NAMING)
    assert found.problem is not None
    assert found.problem.startswith("spec.template.spec.priorityClassName: no PriorityClass")


def test_a_system_class_is_not_a_jobs_to_name() -> None:
    """They exist in every cluster, made by no administrator: naming one would put any
    author first again."""
    found = Priorities(classes(SYSTEM)).of("team", 0, "system-node-critical")
    assert found.problem == (
        "spec.priorityClassName: system-node-critical (2000001000) is a system class, kept "
        f"for the cluster's own components; name a class of at most {BILLION}"
    )
    assert Priorities(classes(priority_class("top", BILLION))).of("t", 0, "top").value == BILLION


def test_a_raw_priority_is_ignored_outside_the_namespaces_an_administrator_lists() -> None:
    ranks = Priorities(classes(HIGH), raw_namespaces=frozenset({"platform"}))
    ignored = ranks.of("tenant", BILLION, None)
    assert ignored.value == 0 and ignored.problem is None
    assert ignored.warnings == (
        f"spec.priority {BILLION} is ignored: only the namespaces an administrator lists in "
        "the operator's rawPriorityNamespaces may set a raw priority, and tenant is not one; "
        "name a PriorityClass in spec.priorityClassName",
    )
    assert ranks.of("tenant", BILLION, "high").value == 1000, "the class still counts"
    assert Priorities().of("platform", 5, None).warnings, "none allowed by default"


def test_where_allowed_a_raw_priority_takes_the_place_of_the_class() -> None:
    ranks = Priorities(classes(HIGH), raw_namespaces=frozenset({"platform"}))
    assert ranks.of("platform", -3, "high") == JobPriority(-3)
    assert ranks.of("platform", 5, "missing") == JobPriority(5), "no class to wait for"
    assert ranks.of("platform", 0, "high") == JobPriority(1000), "0 is unset: the class"


# -- the admission pass ---------------------------------------------------------------------


def in_namespace(namespace: str, job: dict[str, Any]) -> dict[str, Any]:
    job["metadata"]["namespace"] = namespace
    job["metadata"]["uid"] = f"uid-{namespace}-{job['metadata']['name']}"
    return job


def queue_of_three(**classes_given: Any) -> ClusterObjects:
    """On one free GPU: `older` in team-a, then in tenant `jumper` with spec.priority
    1,000,000,000 and `classy` naming the class `high`; all of one shape."""
    objects = cluster(
        in_namespace("team-a", ftj("older", minute=0)),
        in_namespace("tenant", ftj("jumper", minute=1, priority=BILLION)),
        in_namespace("tenant", ftj("classy", minute=2, priorityClassName="high")),
    )
    objects.priority_classes = dict(classes_given)
    return objects


def test_a_huge_spec_priority_does_not_jump_an_older_job_of_another_namespace() -> None:
    out = run(queue_of_three())
    admitted = [d.job for d in out.decisions if d.admitted]
    assert admitted == ["team-a/older"], "by creation time: the number ranks nothing"
    jumper = condition(status_after(out, "tenant/jumper"), cond.ADMITTED)
    assert jumper["reason"] == cond.REASON_WAITING_FOR_VRAM
    assert jumper["message"].endswith(
        "; warning: spec.priority 1000000000 is ignored: only the namespaces an administrator "
        "lists in the operator's rawPriorityNamespaces may set a raw priority, and tenant is "
        "not one; name a PriorityClass in spec.priorityClassName"
    )


def test_a_job_of_a_higher_class_goes_first_across_namespaces() -> None:
    out = run(queue_of_three(high=HIGH))
    assert [d.job for d in out.decisions] == ["tenant/classy", "team-a/older", "tenant/jumper"]
    assert placed_on(status_after(out, "tenant/classy")) == [("n1", [0])]


def test_an_administrators_namespace_may_still_set_a_raw_priority() -> None:
    settings = AdmissionSettings(raw_priority_namespaces=frozenset({"tenant"}))
    out = run(queue_of_three(high=HIGH), settings=settings)
    assert out.decisions[0].job == "tenant/jumper"
    jumper = condition(status_after(out, "tenant/jumper"), cond.ADMITTED)
    assert "warning" not in jumper["message"]


def test_a_job_naming_a_missing_class_waits_for_it_holds_nothing_and_says_why() -> None:
    objects = queue_of_three()  # no class `high`
    out = run(objects)
    status = status_after(out, "tenant/classy")
    found = condition(status, cond.ADMITTED)
    assert (found["status"], found["reason"]) == ("False", cond.REASON_PRIORITY_CLASS_UNAVAILABLE)
    assert found["message"].startswith("spec.priorityClassName: no PriorityClass named 'high'")
    assert ("Warning", cond.REASON_PRIORITY_CLASS_UNAVAILABLE) in reasons(
        write_for(out, "tenant/classy")
    )
    assert condition(status, cond.ESTIMATED)["status"] == "True", "its estimate stands"
    assert [c.key for c in out.creates] == ["team-a/older"]

    objects.priority_classes = classes(HIGH)  # the administrator creates it: decided, first
    out = run(objects)
    assert out.decisions[0].job == "tenant/classy" and out.decisions[0].admitted


@pytest.mark.parametrize("queueing", ["BestEffortFIFO", "StrictFIFO"])
def test_a_job_without_a_rank_is_in_no_jobs_way(queueing: str) -> None:
    objects = cluster(ftj("unranked", minute=0, priorityClassName="missing"), ftj("next", minute=1))
    out = run(objects, settings=AdmissionSettings(queueing=QueueingStrategy(queueing)))
    assert [d.job for d in out.decisions if d.admitted] == ["ns/next"]
