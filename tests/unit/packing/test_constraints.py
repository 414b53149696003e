"""A job is placed only where its pods can run: its pod template's nodeSelector, required
node affinity and tolerations are matched as kube-scheduler matches them. Placed elsewhere,
the job held GPUs while its pods stayed Pending (Unschedulable) forever."""

from __future__ import annotations

from typing import Any

import pytest

from controller.admission.cluster import ClusterObjects, job_request, snapshot
from controller.api import conditions as cond
from controller.base.units import GIB
from controller.decision import Outcome, decide
from controller.jobs.spec import translate
from controller.packing.constraints import (
    NodeConstraints,
    Requirement,
    Toleration,
    from_pod_template,
)
from controller.packing.inventory import GpuMode, NodeGpus, PackingSettings, Taint
from controller.workload.build import Admission, build_workload
from tests.unit.builders.decision import EXCLUSIVE, job, says
from tests.unit.builders.packing import SHARED, est, node, view

DEDICATED = Taint("dedicated", "team-x", "NoSchedule")


def template(**pod_spec: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "t", "image": "t:v1"}], **pod_spec}}


@pytest.mark.parametrize(
    ("operator", "values", "labels", "expected"),
    [
        ("In", ("a", "b"), {"k": "b"}, True),
        ("In", ("a",), {}, False),
        ("NotIn", ("a",), {"k": "b"}, True),
        ("NotIn", ("a",), {}, True),
        ("NotIn", ("a",), {"k": "a"}, False),
        ("Exists", (), {"k": ""}, True),
        ("DoesNotExist", (), {"k": "x"}, False),
        ("Gt", ("7",), {"k": "8"}, True),
        ("Gt", ("7",), {"k": "7"}, False),
        ("Lt", ("7",), {"k": "x"}, False),
        ("Sometimes", ("a",), {"k": "a"}, False),
    ],
)
def test_requirements_match_as_the_scheduler_matches_them(
    operator: str, values: tuple[str, ...], labels: dict[str, str], expected: bool
) -> None:
    assert Requirement("k", operator, values).matches(node("n", [80], labels=labels)) is expected


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        (Toleration("dedicated", "Equal", "team-x", "NoSchedule"), True),
        (Toleration("dedicated", "Equal", "team-y", "NoSchedule"), False),
        (Toleration("dedicated", "Exists"), True),
        (Toleration("dedicated", "Exists", effect="NoExecute"), False),
        (Toleration("", "Exists"), True),  # an empty key with Exists tolerates everything
        (Toleration("other", "Exists"), False),
    ],
)
def test_tolerations_match_as_the_scheduler_matches_them(
    toleration: Toleration, expected: bool
) -> None:
    assert toleration.tolerates(DEDICATED) is expected


def test_a_template_is_read_leniently_and_an_empty_term_matches_no_node() -> None:
    found = from_pod_template(template(
        nodeSelector={"pool": "a"},
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]},
                {},
            ]}}},
        tolerations=[{"key": "dedicated", "operator": "Exists"}, "not a toleration"],
    ))  # fmt: skip
    assert found.node_selector == (("pool", "a"),)
    assert found.terms == ((Requirement("metadata.name", "In", ("n",), on_name=True),), ())
    assert found.tolerations == (Toleration("dedicated", "Exists"),)
    assert found.admits(node("n", [80], labels={"pool": "a"}))
    assert not found.admits(node("m", [80], labels={"pool": "a"}))  # only the empty term left
    assert from_pod_template(None) == from_pod_template({"spec": 3}) == NodeConstraints()


def test_a_template_node_selector_outranks_the_best_fit() -> None:
    """node a fits tighter (the best fit), but the template's pods run only on b."""
    v = view(node("a", [10], labels={"pool": "x"}), node("b", [80], labels={"pool": "y"}))
    anywhere = decide(job("j", est(8)), v)
    assert anywhere.placement[0].node == "a"
    pinned = job("j", est(8), constraints=from_pod_template(template(nodeSelector={"pool": "y"})))
    decision = decide(pinned, v)
    assert decision.outcome is Outcome.ADMIT and decision.placement[0].node == "b"


def test_required_node_affinity_keeps_a_job_off_the_nodes_it_excludes() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "pool", "operator": "NotIn", "values": ["x"]}]}]}}}  # fmt: skip
    v = view(node("a", [10], labels={"pool": "x"}), node("b", [80], labels={"pool": "y"}))
    constraints = from_pod_template(template(affinity=affinity))
    decision = decide(job("j", est(8), constraints=constraints), v)
    assert decision.placement[0].node == "b"


def test_a_taint_the_template_does_not_tolerate_keeps_the_job_off_the_node() -> None:
    tainted = node("a", [80], taints=(DEDICATED,))
    v = view(tainted, node("b", [40]))
    decision = decide(job("j", est(50), constraints=NodeConstraints()), v)
    assert decision.outcome is Outcome.QUEUE, "a has room, but its taint keeps the pods off"
    tolerates = [{"key": "dedicated", "operator": "Exists"}]
    tolerated = from_pod_template(template(tolerations=tolerates))
    decision = decide(job("j", est(50), constraints=tolerated), v)
    assert decision.outcome is Outcome.ADMIT and decision.placement[0].node == "a"


def test_where_every_node_is_tainted_the_job_waits_naming_the_taints() -> None:
    """A taint comes and goes as a cordon does (maintenance, a drain, a scale-down): the job
    waits, never refused; a nodeSelector that no node matches refuses it."""
    v = view(node("a", [80], taints=(DEDICATED,)), node("b", [80], taints=(DEDICATED,)))
    decision = decide(job("j", est(8), constraints=NodeConstraints()), v)
    assert (decision.outcome, decision.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_NODES)
    says(
        decision,
        "it would fit now on a, which takes no work now (taint "
        "dedicated=team-x:NoSchedule, which its pod template does not tolerate)",
    )
    too_big = decide(job("j", est(100), gpus=1, constraints=NodeConstraints()), v)
    assert (too_big.outcome, too_big.reason) == (Outcome.REJECT, cond.REASON_INSUFFICIENT_VRAM)
    full = view(node("a", [8], taints=(DEDICATED,)), node("b", [8], taints=(DEDICATED,)))
    waits = decide(job("j", est(20), constraints=NodeConstraints()), full)
    assert (waits.outcome, waits.reason) == (Outcome.QUEUE, cond.REASON_WAITING_FOR_VRAM)
    says(
        waits,
        "no matching GPU takes work now",
        "(2 matching nodes take no work now: "
        "a: taint dedicated=team-x:NoSchedule, which its pod template does not tolerate; b: ",
    )
    selected = from_pod_template(template(nodeSelector={"pool": "z"}))
    refused = decide(job("j", est(8), constraints=selected), v)
    assert (refused.outcome, refused.reason) == (Outcome.REJECT, cond.REASON_NO_MATCHING_GPU)
    says(
        refused,
        "no GPU node matches the pod template's nodeSelector {pool=z}; the cluster's GPUs are",
    )


def test_a_tainted_node_still_counts_for_what_the_cluster_can_ever_hold() -> None:
    """16 GPUs on two 8-GPU nodes, one of them tainted for maintenance: the job waits for
    it, where judging the empty cluster without it refused the job (and the Resize webhook
    rewrote 16 to 8 for good)."""
    maintenance = Taint("maintenance", "true", "NoSchedule")
    v = view(node("a", [80] * 8, taints=(maintenance,)), node("b", [80] * 8), settings=EXCLUSIVE)
    decision = decide(job("j", est(16 * 70), gpus=16, constraints=NodeConstraints()), v)
    assert decision.outcome is Outcome.QUEUE, decision.message


def test_a_job_without_a_template_runs_no_pods_so_no_taint_keeps_it_off() -> None:
    v = view(node("a", [80], taints=(DEDICATED,)))
    assert decide(job("j", est(8)), v).outcome is Outcome.ADMIT  # constraints None


def test_only_the_health_and_cordon_taints_are_left_to_their_own_checks() -> None:
    pressure = Taint("node.kubernetes.io/memory-pressure", "", "NoSchedule")
    not_ready = Taint("node.kubernetes.io/not-ready", "", "NoExecute")
    templated = NodeConstraints()
    assert (
        decide(
            job("j", est(8), constraints=templated), view(node("a", [80], taints=(not_ready,)))
        ).outcome
        is Outcome.ADMIT
    )
    assert decide(job("j", est(8), constraints=templated),
                  view(node("a", [80], taints=(pressure,)))).outcome is Outcome.QUEUE  # fmt: skip


@pytest.mark.parametrize("label", ["1_0", "+10", "١٠", "99999999999999999999"])
def test_gt_reads_numbers_as_kube_scheduler_does(label: str) -> None:
    """Go's ParseInt: no underscores, signs other than '-', other scripts' digits, or int64
    overflow; such a label matches no Gt or Lt."""
    assert not Requirement("k", "Gt", ("5",)).matches(node("n", [80], labels={"k": label}))
    assert Requirement("k", "Gt", ("5",)).matches(node("n", [80], labels={"k": "10"}))


@pytest.mark.parametrize(("settings", "admitted"), [(EXCLUSIVE, True), (SHARED, False)])
def test_the_gpu_taint_is_tolerated_where_the_workload_requests_nvidia_gpu(
    settings: PackingSettings, admitted: bool
) -> None:
    """devicePlugin workloads carry the toleration the ExtendedResourceToleration admission
    plugin would add; visibleDevices ones request no nvidia.com/gpu, so they need their own."""
    gpu_taint = Taint("nvidia.com/gpu", "present", "NoSchedule")
    v = view(node("a", [80], taints=(gpu_taint,), gpu_allocatable=1), settings=settings)
    decision = decide(job("j", est(8), constraints=NodeConstraints()), v)
    assert (decision.outcome is Outcome.ADMIT) is admitted


def test_the_devicePlugin_workload_carries_the_gpu_toleration_once() -> None:
    spec = {
        "model": {"preset": "llama-3.2-1b"},
        "method": "QLoRA",
        "lora": {"rank": 8},
        "template": template(tolerations=[{"key": "dedicated", "operator": "Exists"}]),
    }
    body = {"apiVersion": "vramgate.dev/v1alpha1", "kind": "FineTuneJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u"}, "spec": spec}  # fmt: skip
    admission = Admission((NodeGpus("a", (0,), ("u0",)),), 1, GpuMode.DEVICE_PLUGIN)
    built = build_workload(body, admission)
    tolerations = built[0]["spec"]["template"]["spec"]["tolerations"]
    assert tolerations == [
        {"key": "dedicated", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    again = dict(body, spec=dict(spec, template=built[0]["spec"]["template"]))
    rebuilt = build_workload(again, admission)
    assert rebuilt[0]["spec"]["template"]["spec"]["tolerations"] == tolerations


def test_a_dumped_nodes_taints_and_a_jobs_template_reach_the_decision() -> None:
    """From API objects: the Node's spec.taints into the snapshot, the job's template into its
    request (the operator, the webhook and plan all build them so)."""
    taint = {"key": "dedicated", "value": "team-x", "effect": "NoSchedule"}
    nodes = {"a": {"kind": "Node", "metadata": {"name": "a"}, "spec": {"taints": [taint]}}}
    device = {"uuid": "u0", "index": 0, "product": "H100", "totalBytes": 80 * GIB,
              "freeBytes": 80 * GIB}  # fmt: skip
    gpunodes = {"a": {"kind": "GPUNode", "metadata": {"name": "a"}, "status": {"gpus": [device]}}}
    snap = snapshot(ClusterObjects(nodes=nodes, gpunodes=gpunodes), None)
    assert snap.nodes[0].taints == (DEDICATED,)
    spec = {
        "model": {"preset": "llama-3.2-1b"},
        "method": "QLoRA",
        "lora": {"rank": 8},
        "template": template(tolerations=[{"key": "dedicated", "operator": "Exists"}]),
    }
    body = {"metadata": {"name": "j", "namespace": "ns"}, "spec": spec}
    plan, errors = translate(spec)
    assert plan is not None and errors == []
    request = job_request(body, plan, est(1))
    assert request.constraints.tolerations == (Toleration("dedicated", "Exists"),)
