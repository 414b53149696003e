"""A FineTuneJob handed to Kueue (spec.queueName), as plain data: its batch Job is created
suspended in the LocalQueue, vramgate's check places its Workload, and the job's status
follows Kueue (`admission_pass._kueue_job`)."""

from __future__ import annotations

import copy
import json
from typing import Any

from controller.admission import kueue
from controller.admission.admission_pass import Refused
from controller.admission.cluster import snapshot
from controller.api import conditions as cond
from controller.api.base import JOB_LABEL
from controller.jobs.spec import estimate_plan, translate
from controller.workload import QUEUE_LABEL
from tests.unit.admission.test_kueue import admission_check
from tests.unit.builders.admission import (
    GIB,
    NOW,
    cluster,
    condition,
    ftj,
    merge,
    run,
    status_after,
)

QUEUE = "team-a"


def queued(name: str = "a", **spec: Any) -> dict[str, Any]:
    return ftj(name, queueName=QUEUE, **spec)


def kueued(*jobs: dict[str, Any], **kw: Any) -> Any:
    """A cluster whose operator answers Kueue's AdmissionChecks (one names vramgate)."""
    objects = cluster(*jobs, **kw)
    objects.kueue_checks = kueue.our_checks([admission_check()])
    return objects


def handed(job: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job after the pass that handed it to Kueue, and its batch Job as created."""
    out = run(kueued(job))
    (create,) = out.creates
    (batch,) = create.objects
    after = copy.deepcopy(job)
    after["status"] = merge({}, out.writes[0].patch)
    return after, batch


def cached(batch: dict[str, Any], *, suspend: bool, placement: dict[str, Any] | None = None):
    """The batch Job as the operator's cache holds it (`caches.slim_workload`)."""
    found = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {**batch["metadata"], "uid": "batch-uid"},
        "spec": {"completions": 1, "parallelism": 1, "suspend": suspend},
        "status": {},
    }  # fmt: skip
    if placement is not None:
        found["spec"]["template"] = {
            "metadata": {"annotations": {kueue.PLACEMENT_ANNOTATION: json.dumps(placement)}}
        }
    return found


PLACEMENT = {
    "perGpuBytes": 12 * GIB,
    "nodes": [{"node": "n1", "gpuIndices": [0], "gpuUUIDs": ["GPU-n1-0"]}],
}


def test_an_estimated_job_is_handed_to_its_localqueue_suspended_and_holds_nothing() -> None:
    job = queued()
    out = run(kueued(job, ftj("b", minute=5), gpus={"n1": [20]}))
    status = status_after(out, "ns/a")
    admitted = condition(status, "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", cond.REASON_QUEUED_IN_KUEUE)
    assert QUEUE in admitted["message"]
    assert "placement" not in status and status["workloadRef"]["name"] == "a"
    (create,) = [c for c in out.creates if c.key == "ns/a"]
    (batch,) = create.objects
    assert batch["spec"]["suspend"] is True
    assert batch["metadata"]["labels"][QUEUE_LABEL] == QUEUE
    pod = batch["spec"]["template"]
    assert "affinity" not in pod["spec"]  # pinned by the check, not here
    trainer = pod["spec"]["containers"][0]
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "1"
    uuids = [e for e in trainer["env"] if e["name"] == "VRAMGATE_GPU_UUIDS"]
    assert uuids == [{"name": "VRAMGATE_GPU_UUIDS", "valueFrom": {"fieldRef": {
        "fieldPath": f"metadata.annotations['{kueue.UUIDS_ANNOTATION}']"}}}]  # fmt: skip
    # b, created later, is admitted by vramgate itself on the memory a does not hold.
    assert status_after(out, "ns/b")["placement"]["nodes"][0]["node"] == "n1"


def test_without_vramgates_check_in_the_cluster_it_is_not_handed_to_kueue() -> None:
    out = run(cluster(queued()))
    assert out.creates == []
    admitted = condition(status_after(out, "ns/a"), "Admitted")
    assert admitted["reason"] == cond.REASON_QUEUED_IN_KUEUE
    assert "not handed to Kueue until vramgate answers its AdmissionChecks" in admitted["message"]


def test_the_check_reads_the_same_training_from_the_jobs_annotation() -> None:
    job = queued(training={"microBatchSize": 2, "sequenceLength": 4096})
    _, batch = handed(job)
    said = batch["spec"]["template"]["metadata"]["annotations"][kueue.SPEC_ANNOTATION]
    workload = {
        "metadata": {"name": "job-a", "namespace": "ns", "uid": "w", "generation": 1},
        "spec": {"podSets": [{"name": "main", "count": 1, "template": batch["spec"]["template"]}]},
    }
    theirs, errors = translate(kueue.check_job(workload)["spec"])
    ours, _ = translate(job["spec"])
    assert theirs is not None and ours is not None, errors
    assert estimate_plan(theirs).per_gpu_bytes(1, theirs.parallelism) == estimate_plan(
        ours
    ).per_gpu_bytes(1, ours.parallelism)
    assert "sequenceLength: 4096" in said


def test_while_kueue_holds_it_the_status_says_the_checks_latest_answer() -> None:
    job, batch = handed(queued())
    objects = kueued(job)
    objects.kueue_workloads = {"Workload ns/job-a": {
        "metadata": {"name": "job-a", "namespace": "ns", "uid": "w",
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "a",
                                          "uid": "batch-uid", "controller": True}]},
        "spec": {"podSets": []},
        "status": {"admissionChecks": [{"name": "vram", "state": "Pending",
                                        "message": "WaitingForVRAM: needs 11.64 GiB"}]},
    }}  # fmt: skip
    out = run(objects, workloads={"ns/a": cached(batch, suspend=True)})
    admitted = condition(merge(job["status"], out.writes[0].patch), "Admitted")
    assert admitted["reason"] == cond.REASON_QUEUED_IN_KUEUE
    assert "WaitingForVRAM: needs 11.64 GiB" in admitted["message"]
    assert out.creates == []


def test_once_kueue_starts_it_the_job_is_admitted_on_the_checks_placement() -> None:
    job, batch = handed(queued())
    out = run(kueued(job), workloads={"ns/a": cached(batch, suspend=False, placement=PLACEMENT)})
    status = merge(job["status"], out.writes[0].patch)
    admitted = condition(status, "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("True", cond.REASON_FITS)
    assert "admitted by Kueue (LocalQueue team-a)" in admitted["message"]
    assert status["placement"]["nodes"] == PLACEMENT["nodes"]
    assert status["placement"]["perGpuBytes"] == 12 * GIB
    assert status["workloadRef"]["uid"] == "batch-uid"
    # Its hold is its Workload's: the job itself reserves nothing.
    assert snapshot(cluster({**job, "status": status}), NOW).reservations == ()


def test_a_kueue_preemption_sends_it_back_to_the_queue_holding_nothing() -> None:
    job, batch = handed(queued())
    started = run(kueued(job), workloads={"ns/a": cached(batch, suspend=False,
                                                         placement=PLACEMENT)})  # fmt: skip
    job["status"] = merge(job["status"], started.writes[0].patch)
    out = run(kueued(job), workloads={"ns/a": cached(batch, suspend=True, placement=PLACEMENT)})
    (write,) = out.writes
    status = merge(job["status"], write.patch)
    admitted = condition(status, "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", cond.REASON_QUEUED_IN_KUEUE)
    assert "preempted" in admitted["message"]
    assert "placement" not in status and write.releases
    assert out.deletes == [] and out.creates == []  # Kueue starts it again


def test_suspending_it_takes_its_job_out_of_kueue() -> None:
    job, batch = handed(queued())
    job["spec"]["suspend"] = True
    out = run(kueued(job), workloads={"ns/a": cached(batch, suspend=True)})
    (delete,) = out.deletes
    assert delete.objects[0]["metadata"] == {"namespace": "ns", "name": "a"}
    assert condition(merge(job["status"], out.writes[0].patch), "Admitted")["reason"] == (
        cond.REASON_SUSPENDED
    )


def test_its_batch_job_carries_the_finetunejob_label_so_its_pods_are_followed() -> None:
    _, batch = handed(queued())
    assert batch["spec"]["template"]["metadata"]["labels"][JOB_LABEL] == "a"


# -- after review: what moves the hold, what the user sees ------------------------------------


def test_a_refused_job_is_not_created_again_until_its_spec_changes() -> None:
    job, _ = handed(queued())
    refused = Refused("uid-a", 1, "metadata.labels: Invalid value")
    out = run(kueued(job), refused={"ns/a": refused}, workloads={})
    assert out.creates == []
    status = merge(job["status"], out.writes[0].patch)
    assert condition(status, "Admitted")["reason"] == cond.REASON_INVALID_TEMPLATE
    assert "queueName" not in status


def test_taking_the_queue_name_away_once_handed_moves_no_hold() -> None:
    job, batch = handed(queued())
    started = run(kueued(job), workloads={"ns/a": cached(batch, suspend=False,
                                                         placement=PLACEMENT)})  # fmt: skip
    job["status"] = merge(job["status"], started.writes[0].patch)
    assert job["status"]["queueName"] == QUEUE
    del job["spec"]["queueName"]
    job["metadata"]["generation"] = 2
    assert snapshot(kueued(job), NOW).reservations == ()  # its Workload holds it, not the job
    out = run(kueued(job), workloads={"ns/a": cached(batch, suspend=False, placement=PLACEMENT)})
    admitted = condition(merge(job["status"], out.writes[0].patch), "Admitted")
    assert admitted["reason"] == cond.REASON_SPEC_LOCKED


def test_naming_a_queue_after_vramgate_admitted_the_job_keeps_its_own_hold() -> None:
    job = ftj("a")
    first = run(cluster(job))
    job["status"] = merge({}, first.writes[0].patch)
    job["spec"]["queueName"] = QUEUE
    (hold,) = snapshot(kueued(job), NOW).reservations
    assert hold.job == "ns/a"


def test_a_job_kueue_starts_without_vramgates_check_is_followed_and_said_so() -> None:
    job, batch = handed(queued())
    out = run(kueued(job), workloads={"ns/a": cached(batch, suspend=False)})
    (write,) = out.writes
    status = merge(job["status"], write.patch)
    admitted = condition(status, "Admitted")
    assert admitted["reason"] == cond.REASON_QUEUED_IN_KUEUE
    assert "without vramgate's AdmissionCheck" in admitted["message"]
    assert [e.type for e in write.events] == ["Warning"]
    assert condition(status, "Running")["status"] in ("False", "Unknown", "True")


def kueue_workload_of_batch(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "job-a", "namespace": "ns", "uid": "w",
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "a",
                                          "uid": "batch-uid", "controller": True}]},
        "spec": {"podSets": [], "active": status.pop("active", True)},
        "status": status,
    }  # fmt: skip


def said_while_queued(workload: dict[str, Any]) -> str:
    job, batch = handed(queued())
    objects = kueued(job)
    objects.kueue_workloads = {"Workload ns/job-a": workload}
    out = run(objects, workloads={"ns/a": cached(batch, suspend=True)})
    return str(condition(merge(job["status"], out.writes[0].patch), "Admitted")["message"])


def test_kueues_reset_message_is_not_taken_for_an_answer() -> None:
    reset = {"name": "vram", "state": "Pending",
             "message": "Reset to Pending after eviction. Previously: Retry"}  # fmt: skip
    said = said_while_queued(kueue_workload_of_batch(admissionChecks=[reset]))
    assert said == "waits in Kueue's LocalQueue team-a"


def test_a_missing_localqueue_and_a_deactivated_workload_are_said() -> None:
    missing = {"type": "QuotaReserved", "status": "False",
               "message": "LocalQueue team-a doesn't exist"}  # fmt: skip
    assert "Kueue: LocalQueue team-a doesn't exist" in said_while_queued(
        kueue_workload_of_batch(conditions=[missing])
    )
    assert "Kueue deactivated its Workload" in said_while_queued(
        kueue_workload_of_batch(active=False)
    )


def test_a_job_being_deleted_is_not_handed_again() -> None:
    job = queued()
    job["metadata"]["deletionTimestamp"] = "2025-03-01T12:00:00Z"
    assert run(kueued(job)).creates == []


def test_its_gpu_selector_priority_class_and_resize_policy_go_with_it() -> None:
    job = queued(
        admissionPolicy="Resize", priorityClassName="team-high",
        resources={"gpus": 4, "minGPUs": 1, "gpuSelector": {"pool": "a100"}},
    )  # fmt: skip
    _, batch = handed(job)
    pod = batch["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == {"pool": "a100"}
    assert pod["spec"]["priorityClassName"] == "team-high"
    assert batch["metadata"]["annotations"] == {kueue.GATE_ANNOTATION: kueue.CONTROLLER}
    said = pod["metadata"]["annotations"][kueue.SPEC_ANNOTATION]
    assert "minGPUs: 1" in said and "gpuSelector" not in said
