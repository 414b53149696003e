"""vramgate as a Kueue AdmissionCheck controller, as plain data: Workloads in, each check's
answer out, decided in one queue with the FineTuneJobs on one ledger (`admission.kueue`)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from controller.admission import kueue
from controller.admission.admission_pass import Estimated, PassInput, admission_pass
from controller.admission.cluster import ClusterObjects, snapshot
from controller.admission.failures import failure_of
from controller.base.errors import ConfigMapUnavailable
from controller.decision import AdmissionSettings
from controller.estimator import SpecErrors
from controller.jobs.spec import estimate_plan, translate
from tests.unit.builders.admission import (
    GIB,
    NOW,
    admitted,
    cluster,
    condition,
    estimated,
    ftj,
    status_after,
)

CHECK = "vram"
#: Llama-3.1-8B QLoRA r=16: about 11.6 GiB on one GPU.
FINETUNE = "model: {preset: llama-3.1-8b}\nmethod: QLoRA\nlora: {rank: 16}\n"


def admission_check(name: str = CHECK, controller: str = kueue.CONTROLLER) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"controllerName": controller}}


def workload(
    name: str,
    *,
    gpus: int = 1,
    count: int = 1,
    state: str = "Pending",
    annotation: str | None = FINETUNE,
    reserved: bool = True,
    minute: int = 0,
    updates: list[dict[str, Any]] | None = None,
    finished: bool = False,
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Workload Kueue made for a batch Job, its quota reserved, our check in `state`."""
    template: dict[str, Any] = {
        "metadata": {},
        "spec": {
            "containers": [
                {"name": "trainer", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}
            ]
        },
    }
    if annotation is not None:
        template["metadata"]["annotations"] = {kueue.SPEC_ANNOTATION: annotation}
    if node_selector:
        template["spec"]["nodeSelector"] = node_selector
    conditions = [{"type": "QuotaReserved", "status": "True" if reserved else "False"}]
    if finished:
        conditions.append({"type": "Finished", "status": "True"})
    entry: dict[str, Any] = {"name": CHECK, "state": state, "message": ""}
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": f"job-{name}"}
    owner["controller"] = True
    if updates is not None:
        entry["podSetUpdates"] = updates
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"wl-{name}",
            "generation": 1,
            "resourceVersion": "7",
            "creationTimestamp": f"2025-03-01T11:{minute:02d}:00Z",
            "ownerReferences": [owner],
        },
        "spec": {
            "active": True,
            "podSets": [{"name": "main", "count": count, "template": template}],
        },
        "status": {"conditions": conditions, "admissionChecks": [entry]},
    }


def with_kueue(objects: ClusterObjects, *workloads: dict[str, Any]) -> ClusterObjects:
    """`objects` with vramgate's check and `workloads`; each Node labelled with a hostname
    that is not its name (the kubelet's may differ), which is what pins a Workload."""
    for name, node in objects.nodes.items():
        node["metadata"]["labels"][kueue.HOSTNAME_LABEL] = f"host-{name}"
    objects.kueue_checks = kueue.our_checks([admission_check()])
    objects.kueue_workloads = {kueue.workload_key(w): w for w in workloads}
    return objects


def estimates_of(objects: ClusterObjects) -> dict[str, Estimated]:
    """Every FineTuneJob's and every pending Workload's estimate, as the scheduler makes them."""
    found = {key: estimated(job) for key, job in objects.jobs.items()}
    for key, wl in objects.kueue_workloads.items():
        if kueue.to_decide(wl, objects.kueue_checks):
            job = kueue.check_job(wl)
            plan, errors = translate(dict(job["spec"]))
            assert plan is not None, errors
            found[key] = Estimated(1, plan=plan, estimate=estimate_plan(plan))
    return found


def decide(objects: ClusterObjects, estimates: dict[str, Estimated] | None = None) -> Any:
    return admission_pass(
        PassInput(
            objects=objects,
            workloads={},
            job_pods={},
            estimates=estimates_of(objects) if estimates is None else estimates,
            settings=AdmissionSettings(),
            now=NOW,
        )
    )


def answers(out: Any) -> dict[str, kueue.CheckWrite]:
    return {w.name: w for w in out.checks}


# -- reading a Workload ----------------------------------------------------------------------


def test_a_workload_reads_as_the_finetunejob_its_annotation_and_podsets_say() -> None:
    job = kueue.check_job(workload("w", gpus=2, count=2, node_selector={"pool": "a"}))
    assert job["spec"]["model"] == {"preset": "llama-3.1-8b"}
    assert job["spec"]["resources"] == {"gpus": 4}  # 2 pods x 2 GPUs, never resized
    assert job["spec"]["admissionPolicy"] == "Enforce"
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "a"}
    assert job["metadata"]["uid"] == "wl-w"


@pytest.mark.parametrize(
    ("annotation", "said"),
    [
        (None, "metadata.annotations[vramgate.dev/finetune] is required"),
        ("model: [", "must be YAML or JSON"),
        ("- a list", "must be a mapping of FineTuneJob spec fields"),
        (FINETUNE + "resources: {gpus: 8}\n", "resources may set only minGPUs and maxGPUs"),
        (FINETUNE + "template: {}\n", "template may not be set here"),
    ],
)
def test_a_workload_whose_annotation_cannot_be_read_is_rejected_naming_the_field(
    annotation: str | None, said: str
) -> None:
    objects = with_kueue(cluster(), workload("w", annotation=annotation))
    out = decide(objects, estimates={})
    write = answers(out)["w"]
    assert write.entry["state"] == kueue.REJECTED
    assert said in write.entry["message"]
    assert "podSet main" in write.entry["message"]
    assert write.entry["message"] == f"InvalidSpec: {write.event}"  # said on the Job too
    assert write.rejected
    assert write.owner is not None and write.owner["kind"] == "Job"


def test_an_invalid_spec_in_the_annotation_is_rejected_with_the_spec_error() -> None:
    wl = workload("w", annotation="model: {preset: llama-3.1-8b}\nmethod: Sideways\n")
    objects = with_kueue(cluster(), wl)
    job = kueue.check_job(wl)
    _, errors = translate(dict(job["spec"]))
    assert errors
    failure = failure_of(SpecErrors(errors), temporary_retry_s=30)
    assert failure.reason == "InvalidSpec" and "spec.method" in failure.message
    out = decide(objects, estimates={kueue.workload_key(wl): Estimated(1, failure=failure)})
    write = answers(out)["w"]
    assert write.entry["state"] == kueue.REJECTED
    assert write.entry["message"].startswith(failure.reason)


def test_a_missing_configmap_is_retried_not_rejected() -> None:
    wl = workload("w")
    objects = with_kueue(cluster(), wl)
    failure = failure_of(ConfigMapUnavailable("ConfigMap ns/cfg not found"), temporary_retry_s=30)
    out = decide(objects, estimates={kueue.workload_key(wl): Estimated(1, failure=failure)})
    write = answers(out)["w"]
    assert write.entry["state"] == kueue.RETRY
    assert write.entry["requeueAfterSeconds"] == 30
    assert not write.rejected  # said on the Job as a Normal Event


def test_only_pending_checks_with_quota_reserved_are_decided() -> None:
    objects = with_kueue(
        cluster(),
        workload("unreserved", reserved=False),
        workload("retrying", state="Retry"),
        workload("done", finished=True),
    )
    assert decide(objects).checks == []
    other = with_kueue(cluster(), workload("w"))
    other.kueue_checks = kueue.our_checks([admission_check(controller="example.com/other")])
    assert decide(other).checks == []


# -- the answers ------------------------------------------------------------------------------


def test_a_workload_that_fits_is_ready_pinned_to_its_node_with_its_placement() -> None:
    objects = with_kueue(cluster(gpus={"n1": [5], "n2": [80]}), workload("w"))
    write = answers(decide(objects))["w"]
    assert write.entry["state"] == kueue.READY
    assert write.entry["message"].startswith("Fits: ")
    (update,) = write.entry["podSetUpdates"]
    assert update["name"] == "main"
    assert update["nodeSelector"] == {kueue.HOSTNAME_LABEL: "host-n2"}
    assert update["labels"] == {kueue.WORKLOAD_UID_LABEL: "wl-w"}
    placement = json.loads(update["annotations"][kueue.PLACEMENT_ANNOTATION])
    assert placement["nodes"] == [{"node": "n2", "gpuIndices": [0], "gpuUUIDs": ["GPU-n2-0"]}]
    assert 10 * GIB < placement["perGpuBytes"] < 13 * GIB
    assert update["annotations"][kueue.UUIDS_ANNOTATION] == "GPU-n2-0"
    assert write.resource_version == "7"  # a decision on a stale Workload must fail


def test_a_workload_that_waits_for_memory_is_retried_after_the_configured_seconds() -> None:
    objects = with_kueue(cluster(gpus={"n1": [5]}), workload("w"))
    out = admission_pass(
        PassInput(
            objects=objects, workloads={}, job_pods={}, estimates=estimates_of(objects),
            settings=AdmissionSettings(), now=NOW, kueue_retry_seconds=45,
        )
    )  # fmt: skip
    write = answers(out)["w"]
    assert write.entry["state"] == kueue.RETRY
    assert write.entry["requeueAfterSeconds"] == 45
    assert "WaitingForVRAM" in write.entry["message"]
    assert "podSetUpdates" not in write.entry


def test_a_workload_that_never_fits_is_rejected_with_the_numbers() -> None:
    objects = with_kueue(cluster(gpus={"n1": [80]}), workload("w", gpus=3))
    write = answers(decide(objects))["w"]
    assert write.entry["state"] == kueue.REJECTED
    assert write.entry["message"] == f"{write.reason}: {write.event}"
    assert write.rejected and "GPU" in write.event


def test_a_workload_larger_than_every_node_is_rejected_not_placed_across_nodes() -> None:
    # Two pods of one GPU each; each node has one GPU: a FineTuneJob would span both, but a
    # Workload's pods are pinned by one nodeSelector.
    objects = with_kueue(cluster(gpus={"n1": [80], "n2": [80]}), workload("w", gpus=1, count=2))
    write = answers(decide(objects))["w"]
    assert write.entry["state"] == kueue.REJECTED
    assert "a Kueue Workload runs on one node" in write.entry["message"]


def test_its_pods_on_one_node_fit_where_that_node_has_the_gpus() -> None:
    objects = with_kueue(cluster(gpus={"n1": [80], "n2": [80, 80]}), workload("w", count=2))
    (update,) = answers(decide(objects))["w"].entry["podSetUpdates"]
    assert update["nodeSelector"] == {kueue.HOSTNAME_LABEL: "host-n2"}


def test_a_node_without_a_hostname_label_is_not_pinned_to() -> None:
    objects = with_kueue(cluster(gpus={"n1": [80]}), workload("w"))
    del objects.nodes["n1"]["metadata"]["labels"][kueue.HOSTNAME_LABEL]
    write = answers(decide(objects))["w"]
    assert write.entry["state"] == kueue.RETRY
    assert write.entry["message"].startswith("NoHostname: ")


def test_an_evicted_workload_is_not_decided_and_one_without_quota_holds_nothing() -> None:
    evicted = workload("w")
    evicted["status"]["conditions"].append({"type": "Evicted", "status": "True"})
    objects = with_kueue(cluster(), evicted)
    assert decide(objects).checks == []
    released = ready("v", "n1", 75 * GIB)
    released["status"]["conditions"][0]["status"] = "False"  # QuotaReserved
    assert snapshot(with_kueue(cluster(), released), NOW).reservations == ()


def test_a_podset_of_no_pods_asks_for_no_gpus_and_partial_admission_counts() -> None:
    wl = workload("w", count=4)
    wl["spec"]["podSets"].append(
        copy.deepcopy(wl["spec"]["podSets"][0]) | {"name": "x", "count": 0}
    )
    wl["status"]["admission"] = {"podSetAssignments": [{"name": "main", "count": 2}]}
    assert kueue.check_job(wl)["spec"]["resources"] == {"gpus": 2}


def test_an_annotation_with_aliases_or_too_large_is_rejected_before_it_is_read() -> None:
    bomb = 'a: &a ["x","x"]\nb: &b [*a,*a]\nc: &c [*b,*b]\n'
    with pytest.raises(kueue.CheckProblem, match="without aliases"):
        kueue.check_job(workload("w", annotation=bomb))
    large = FINETUNE + "# " + "x" * kueue.MAX_SPEC_BYTES + "\n"
    with pytest.raises(kueue.CheckProblem, match="at most 16 KiB"):
        kueue.check_job(workload("w", annotation=large))


def test_the_assigned_flavors_labels_and_tolerations_choose_the_node() -> None:
    objects = with_kueue(cluster(gpus={"n1": [80], "n2": [40]}), workload("w"))
    assert answers(decide(objects))["w"].entry["podSetUpdates"][0]["nodeSelector"] == {
        kueue.HOSTNAME_LABEL: "host-n2"
    }  # the tightest that holds it
    objects.nodes["n1"]["metadata"]["labels"]["pool"] = "big"
    objects.nodes["n1"]["spec"]["taints"] = [{"key": "big", "effect": "NoSchedule"}]
    toleration = {"key": "big", "operator": "Exists", "effect": "NoSchedule"}
    objects.kueue_flavors = {
        "big": {"spec": {"nodeLabels": {"pool": "big"}, "tolerations": [toleration]}}
    }
    objects.kueue_workloads["Workload ns/w"]["status"]["admission"] = {
        "podSetAssignments": [{"name": "main", "flavors": {"nvidia.com/gpu": "big"}}]
    }  # Kueue adds the flavor's labels and tolerations to the pods: only n1 may hold them
    assert answers(decide(objects))["w"].entry["podSetUpdates"][0]["nodeSelector"] == {
        kueue.HOSTNAME_LABEL: "host-n1"
    }


def test_kueues_priority_ranks_a_workload_among_finetunejobs() -> None:
    late = workload("w", minute=5)
    late["spec"]["priority"] = 1000
    objects = with_kueue(cluster(ftj("a", minute=1), gpus={"n1": [20]}), late)
    assert answers(decide(objects))["w"].entry["state"] == kueue.READY
    late["spec"]["priority"] = 0
    assert answers(decide(objects))["w"].entry["state"] == kueue.RETRY


def test_a_new_state_gets_a_new_transition_time() -> None:
    wl = workload("w", state="Pending")
    wl["status"]["admissionChecks"][0]["lastTransitionTime"] = "2025-03-01T10:00:00Z"
    objects = with_kueue(cluster(), wl)
    write = answers(decide(objects))["w"]
    assert write.entry["lastTransitionTime"] == NOW.strftime("%Y-%m-%dT%H:%M:%SZ")


# -- one ledger --------------------------------------------------------------------------------


def ready(name: str, node: str, per_gpu: int) -> dict[str, Any]:
    placement = {
        "perGpuBytes": per_gpu,
        "nodes": [{"node": node, "gpuIndices": [0], "gpuUUIDs": [f"GPU-{node}-0"]}],
    }
    update = {
        "name": "main",
        "labels": {kueue.WORKLOAD_UID_LABEL: f"wl-{name}"},
        "annotations": {kueue.PLACEMENT_ANNOTATION: json.dumps(placement)},
        "nodeSelector": {kueue.HOSTNAME_LABEL: node},
    }
    return workload(name, state="Ready", updates=[update])


def test_a_ready_workload_holds_its_gpu_against_finetunejobs() -> None:
    job = ftj("a")
    objects = with_kueue(cluster(job, gpus={"n1": [80]}), ready("w", "n1", 75 * GIB))
    held = snapshot(objects, NOW).reservations
    assert [(r.job, r.per_gpu_bytes) for r in held] == [("Workload ns/w", 75 * GIB)]
    out = decide(objects)
    assert condition(status_after(out, "ns/a"), "Admitted")["reason"] == "WaitingForVRAM"
    assert "placement" not in status_after(out, "ns/a")


def test_a_finished_workload_or_one_sent_back_to_pending_holds_nothing() -> None:
    done = ready("w", "n1", 75 * GIB)
    done["status"]["conditions"].append({"type": "Finished", "status": "True"})
    evicted = ready("v", "n1", 75 * GIB)
    evicted["status"]["admissionChecks"][0]["state"] = "Pending"  # preempted: Kueue resets it
    objects = with_kueue(cluster(gpus={"n1": [80]}), done, evicted)
    assert snapshot(objects, NOW).reservations == ()


def test_an_admitted_finetunejob_holds_its_gpu_against_workloads() -> None:
    job, _ = admitted("a", gpus={"n1": [20]})  # 11.6 of the 20 GiB free
    objects = with_kueue(cluster(job, gpus={"n1": [20]}), workload("w"))
    write = answers(decide(objects))["w"]
    assert write.entry["state"] == kueue.RETRY


def test_a_finetunejob_and_a_workload_never_get_the_same_memory_in_one_pass() -> None:
    objects = with_kueue(cluster(ftj("a", minute=1), gpus={"n1": [20]}), workload("w", minute=0))
    out = decide(objects)
    assert answers(out)["w"].entry["state"] == kueue.READY  # older: first in the queue
    assert [w for w in out.writes if w.resource_version is not None] == []  # it waits
    assert condition(status_after(out, "ns/a"), "Admitted")["reason"] == "WaitingForVRAM"


def test_a_pods_usage_is_read_against_its_workloads_reservation_not_twice() -> None:
    wl = ready("w", "n1", 30 * GIB)
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "pod-1",
                     "labels": {kueue.WORKLOAD_UID_LABEL: "wl-w"}},
        "spec": {"nodeName": "n1", "containers": [
            {"name": "t", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"},
    }  # fmt: skip
    objects = with_kueue(cluster(gpus={"n1": [80]}), wl)
    objects.pods = [pod]
    (held,) = snapshot(objects, NOW).reservations
    assert held.pod_uids == frozenset({"pod-1"})
    assert held.allocated_gpus == {"n1": 1}


def test_a_placement_written_by_another_hand_is_not_read() -> None:
    wl = ready("w", "n1", GIB)
    wl["status"]["admissionChecks"][0]["podSetUpdates"][0]["annotations"] = {
        kueue.PLACEMENT_ANNOTATION: "{not json"
    }
    objects = with_kueue(cluster(), copy.deepcopy(wl))
    assert snapshot(objects, NOW).reservations == ()


def test_active_is_read_from_the_condition() -> None:
    check = admission_check()
    assert not kueue.active(check)
    check["status"] = {"conditions": [kueue.active_condition(NOW)]}
    assert kueue.active(check)


# -- resize through Kueue's admission gate ----------------------------------------------------


def gated(name: str, gpus: int, gates: str = kueue.CONTROLLER, bounds: str = "") -> dict[str, Any]:
    """A Workload Kueue holds for vramgate (no quota yet), of a Job of one pod asking `gpus`."""
    annotation = FINETUNE + (f"resources: {{{bounds}}}\n" if bounds else "")
    wl = workload(name, gpus=gpus, annotation=annotation, reserved=False)
    wl["metadata"]["annotations"] = {kueue.GATE_ANNOTATION: gates}
    wl["status"]["admissionChecks"] = []
    return wl


def resized(objects: ClusterObjects) -> dict[str, kueue.ResizeWrite]:
    return {w.name: w for w in decide(objects).resizes}


def estimates_with_gated(objects: ClusterObjects) -> dict[str, Estimated]:
    found = estimates_of(objects)
    for key, wl in objects.kueue_workloads.items():
        if kueue.to_resize(wl):
            plan, errors = translate(dict(kueue.check_job(wl)["spec"]))
            assert plan is not None, errors
            found[key] = Estimated(1, plan=plan, estimate=estimate_plan(plan))
    return found


def test_a_gated_job_is_resized_to_the_count_that_fits_now_and_its_gate_removed() -> None:
    objects = with_kueue(
        cluster(gpus={"n1": [80, 80], "n2": [5, 5]}), gated("w", 4, bounds="minGPUs: 1")
    )
    (write,) = decide(objects, estimates_with_gated(objects)).resizes
    assert (write.name, write.uid, write.container, write.gpus) == ("w", "job-w", 0, 2)
    assert write.parts == ("requests",) and write.gates_before == kueue.CONTROLLER
    assert write.gates is None  # vramgate's was the only gate
    assert write.message.startswith("resized from 4 to 2 GPUs")


def test_other_controllers_gates_stay() -> None:
    wl = gated("w", 1, gates=f"example.com/quota, {kueue.CONTROLLER}")
    objects = with_kueue(cluster(), wl)
    (write,) = decide(objects, estimates_with_gated(objects)).resizes
    assert write.gpus == 1 and write.gates == "example.com/quota"


def test_a_gated_job_that_waits_keeps_its_gate_and_one_that_never_fits_loses_it_as_it_is() -> None:
    busy = with_kueue(cluster(gpus={"n1": [5]}), gated("w", 1))
    assert decide(busy, estimates_with_gated(busy)).resizes == []  # waits, gated, no quota
    never = with_kueue(cluster(gpus={"n1": [80]}), gated("w", 4, bounds="minGPUs: 2"))
    (write,) = decide(never, estimates_with_gated(never)).resizes
    assert write.gpus is None and write.gates is None  # the check will say why, with numbers


def test_a_resize_holds_nothing_a_finetunejob_may_take_the_memory() -> None:
    objects = with_kueue(cluster(ftj("a"), gpus={"n1": [20]}), gated("w", 1))
    out = decide(objects, estimates_with_gated(objects))
    assert [w for w in out.writes if w.resource_version is not None]  # a admitted
    assert out.resizes == []  # and w, sized on what is left, waits


def test_only_a_batch_job_is_resized() -> None:
    wl = gated("w", 1)
    wl["metadata"]["ownerReferences"][0].update(
        apiVersion="jobset.x-k8s.io/v1alpha2", kind="JobSet"
    )
    assert not kueue.to_resize(wl)


# -- Workloads of several podSets (JobSet, PyTorchJob, TrainJob) -----------------------------


def pod_set(name: str, count: int, gpus: int, annotation: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "resources": {"requests": {"cpu": "1"}}}
    if gpus:
        container["resources"]["limits"] = {"nvidia.com/gpu": str(gpus)}
    template: dict[str, Any] = {"metadata": {}, "spec": {"containers": [container]}}
    if annotation is not None:
        template["metadata"]["annotations"] = {kueue.SPEC_ANNOTATION: annotation}
    return {"name": name, "count": count, "template": template}


def with_pod_sets(*pod_sets: dict[str, Any]) -> dict[str, Any]:
    wl = workload("w")
    wl["spec"]["podSets"] = list(pod_sets)
    return wl


def test_a_cpu_podset_is_neither_counted_nor_pinned_and_a_gpu_podsets_pods_share_a_node() -> None:
    # A JobSet: a CPU-only initializer, then a trainer of two pods of one GPU each.
    wl = with_pod_sets(pod_set("initializer", 1, 0), pod_set("trainer", 2, 1, FINETUNE))
    assert kueue.check_job(wl)["spec"]["resources"] == {"gpus": 2}
    objects = with_kueue(cluster(gpus={"n1": [80], "n2": [80, 80]}), wl)
    (update,) = answers(decide(objects))["w"].entry["podSetUpdates"]
    assert update["name"] == "trainer"
    assert update["nodeSelector"] == {kueue.HOSTNAME_LABEL: "host-n2"}


def test_gpu_podsets_are_one_training_said_once_or_alike_and_pinned_together() -> None:
    # A PyTorchJob: its master and worker are ranks of one training, whichever says it.
    wl = with_pod_sets(pod_set("master", 1, 1), pod_set("worker", 1, 1, FINETUNE))
    assert kueue.check_job(wl)["spec"]["resources"] == {"gpus": 2}
    objects = with_kueue(cluster(gpus={"n1": [80, 80]}), wl)
    updates = answers(decide(objects))["w"].entry["podSetUpdates"]
    assert [u["name"] for u in updates] == ["master", "worker"]
    assert {u["nodeSelector"][kueue.HOSTNAME_LABEL] for u in updates} == {"host-n1"}
    same = with_pod_sets(
        pod_set("master", 1, 1, FINETUNE),
        pod_set("worker", 1, 1, "{method: QLoRA, lora: {rank: 16}, model: {preset: llama-3.1-8b}}"),
    )
    assert kueue.check_job(same)["spec"]["method"] == "QLoRA"  # the same spec, written apart
    other = with_pod_sets(
        pod_set("master", 1, 1, FINETUNE),
        pod_set("worker", 1, 1, FINETUNE.replace("rank: 16", "rank: 64")),
    )
    with pytest.raises(kueue.CheckProblem, match=r"podSet master, worker: .* must say the same"):
        kueue.check_job(other)


def test_gpu_podsets_that_select_different_nodes_are_rejected_not_pinned_to_one() -> None:
    # Pinned together, the worker (pool b) could never run on the master's node (pool a),
    # while its memory stayed held in the ledger.
    master, worker = pod_set("master", 1, 1, FINETUNE), pod_set("worker", 1, 1)
    master["template"]["spec"]["nodeSelector"] = {"pool": "a"}
    worker["template"]["spec"]["nodeSelector"] = {"pool": "b"}
    with pytest.raises(kueue.CheckProblem, match=r"podSet master, worker: must select the same"):
        kueue.check_job(with_pod_sets(master, worker))
    worker["template"]["spec"]["nodeSelector"] = {"pool": "a"}
    master["template"]["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
    with pytest.raises(kueue.CheckProblem, match=r"must select the same nodes"):
        kueue.check_job(with_pod_sets(master, worker))
    worker["template"]["spec"]["tolerations"] = [{"operator": "Exists", "key": "gpu"}]
    assert kueue.check_job(with_pod_sets(master, worker))["spec"]["template"]["spec"][
        "nodeSelector"
    ] == {"pool": "a"}  # the same selection, written apart
