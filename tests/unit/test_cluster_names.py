"""A job's pods are found by the label vramgate gives them, whatever the job's name length."""

from __future__ import annotations

from typing import Any

from controller.api.base import JOB_LABEL
from controller.api.names import job_label_value
from controller.cluster import ClusterObjects, pods_key, snapshot


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
