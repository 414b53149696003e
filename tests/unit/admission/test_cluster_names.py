"""A job's pods are found by the labels vramgate gives them, whatever the job's name length,
and a deleted namesake's pods are not the job's."""

from __future__ import annotations

from typing import Any

from controller.admission.cluster import ClusterObjects, pods_by_job, pods_key, snapshot
from controller.api.base import JOB_LABEL, JOB_UID_LABEL
from controller.api.names import job_label_value
from controller.operator.caches import Caches


def admitted_job(name: str) -> dict[str, Any]:
    return {
        "kind": "FineTuneJob",
        "metadata": {"name": name, "namespace": "ns", "uid": "u"},
        "status": {
            "conditions": [{"type": "Admitted", "status": "True", "reason": "Fits"}],
            "placement": {
                "nodes": [{"node": "a", "gpuIndices": [0], "gpuUUIDs": ["GPU-a-0"]}],
                "perGpuBytes": 10,
            },
        },
    }


def pod(label: str) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "pod-1", "labels": {JOB_LABEL: label}},
        "spec": {"nodeName": "a"},
        "status": {"phase": "Running"},
    }


def test_a_long_named_jobs_pods_are_found_by_their_label_value() -> None:
    name = "fine-tune-" + "x" * 80  # too long for a label value
    label = job_label_value(name)
    assert label != name and len(label) <= 63
    assert pods_key(admitted_job(name)) == f"ns/{label}"
    objects = ClusterObjects(jobs={f"ns/{name}": admitted_job(name)}, pods=[pod(label)])
    (held,) = snapshot(objects, None).reservations
    assert held.pod_uids == frozenset({"pod-1"})


def test_a_short_named_jobs_pods_carry_its_name() -> None:
    objects = ClusterObjects(jobs={"ns/short": admitted_job("short")}, pods=[pod("short")])
    (held,) = snapshot(objects, None).reservations
    assert held.pod_uids == frozenset({"pod-1"})


def test_a_deleted_namesakes_pods_and_workload_are_not_the_recreated_jobs() -> None:
    """Delete and apply again: the old Job and its pods (still terminating) carry the same
    name label. Taken for the new job's, the old Job's end would end it before it ran, and
    the old pods' GPU memory would pass for its own."""
    job = admitted_job("llama")  # uid "u"
    old_pod, new_pod, unlabelled = pod("llama"), pod("llama"), pod("llama")
    old_pod["metadata"] |= {"uid": "pod-old", "labels": {JOB_LABEL: "llama", JOB_UID_LABEL: "old"}}
    new_pod["metadata"] |= {"uid": "pod-new", "labels": {JOB_LABEL: "llama", JOB_UID_LABEL: "u"}}
    unlabelled["metadata"]["uid"] = "pod-before-the-label"  # an older operator's workload
    pods = [old_pod, new_pod, unlabelled]
    found = pods_by_job(pods, {"ns/llama": job})
    assert [p["metadata"]["uid"] for p in found["ns/llama"]] == ["pod-new", "pod-before-the-label"]
    (held,) = snapshot(ClusterObjects(jobs={"ns/llama": job}, pods=pods), None).reservations
    assert held.pod_uids == frozenset({"pod-new", "pod-before-the-label"})

    def workload(owner_uid: str) -> dict[str, Any]:
        refs = [{"kind": "FineTuneJob", "name": "llama", "uid": owner_uid, "controller": True}]
        return {"kind": "Job", "metadata": {"name": "llama", "namespace": "ns",
                                            "ownerReferences": refs}}  # fmt: skip

    def read(*workloads: dict[str, Any]) -> Any:
        caches = Caches({"ns/llama": [job]}, {}, {}, {p["metadata"]["uid"]: [p] for p in pods},
                        {"ns/llama": list(workloads)})  # fmt: skip
        return caches.objects()

    _, workloads, job_pods = read(workload("old"))
    assert workloads == {}, "the old one's Job: the new job's is still to be created"
    assert len(job_pods["ns/llama"]) == 2
    _, workloads, _ = read(workload("old"), workload("u"))
    assert workloads["ns/llama"]["metadata"]["ownerReferences"][0]["uid"] == "u"


def test_a_new_leaders_fresh_list_is_what_workloads_are_matched_against() -> None:
    """A new leader decides on jobs listed from the API server, not on its cache: if the job
    was deleted and applied again meanwhile, the cache still holds the old one, whose Job
    must not pass for the new job's."""
    cached, listed = admitted_job("llama"), admitted_job("llama")
    cached["metadata"]["uid"], listed["metadata"]["uid"] = "old", "new"
    refs = [{"kind": "FineTuneJob", "name": "llama", "uid": "old", "controller": True}]
    old_workload = {"kind": "Job", "metadata": {"name": "llama", "namespace": "ns",
                                                "ownerReferences": refs}}  # fmt: skip
    caches = Caches({"ns/llama": [cached]}, {}, {}, {}, {"ns/llama": [old_workload]})
    assert "ns/llama" in caches.objects()[1], "against the cache, the old Job is the job's"
    objects, workloads, _ = caches.objects([listed])
    assert objects.jobs["ns/llama"]["metadata"]["uid"] == "new"
    assert workloads == {}, "the listed job's own Job is still to be created"
