"""The real Kueue controller on the local control plane (e2e/kueue.py), and the AdmissionCheck
protocol vramgate is to speak with it.

The second test plays the check's controller by hand: it marks the AdmissionCheck Active,
waits for Kueue to hold the Workload with quota reserved and the check Pending, then applies
the check's state Ready with a podSetUpdate, as the operator will. Its patches are the
shapes the operator must send (see `ready_patch` and `active_patch`).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from e2e.kueue import API_VERSION, QUEUE_NAME_LABEL, Kueue
from e2e.wait import wait_until

pytestmark = pytest.mark.integration

GROUP, VERSION = API_VERSION.split("/")
GPU = "nvidia.com/gpu"
CONTROLLER_NAME = "vramgate.dev/vram"
CHECK_MANAGER = "test-check"
APPLY = "application/apply-patch+yaml"
#: Kueue names a batch Job's only PodSet so.
POD_SET = "main"
JOB = "train"
TIMEOUT_S = 30.0


# -- objects ------------------------------------------------------------------------------


class Kueued:
    """Creates Kueue objects; deletes the cluster-scoped ones it created at the end."""

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.batch = client.BatchV1Api(api)
        self.created: list[tuple[str, str]] = []

    def create_cluster(self, kind: str, plural: str, name: str, spec: dict[str, Any]) -> None:
        body = {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name},
                "spec": spec}  # fmt: skip
        self.custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
        self.created.append((plural, name))

    def queues(self, namespace: str, check: str | None = None, gpus: str = "8") -> str:
        """A ResourceFlavor, a ClusterQueue of `gpus` GPUs (and the check, if given) for every
        namespace, and a LocalQueue in `namespace`; the LocalQueue's name."""
        name = f"q-{namespace}"
        self.create_cluster("ResourceFlavor", "resourceflavors", name, {})
        quota = {"cpu": "100", "memory": "1000Gi", GPU: gpus}
        spec: dict[str, Any] = {
            "namespaceSelector": {},
            "resourceGroups": [{
                "coveredResources": list(quota),
                "flavors": [{"name": name, "resources": [
                    {"name": resource, "nominalQuota": value} for resource, value in quota.items()
                ]}],
            }],
        }  # fmt: skip
        if check is not None:
            spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": check}]}
        self.create_cluster("ClusterQueue", "clusterqueues", name, spec)
        local = {"apiVersion": API_VERSION, "kind": "LocalQueue",
                 "metadata": {"name": "team", "namespace": namespace},
                 "spec": {"clusterQueue": name}}  # fmt: skip
        self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "localqueues", local)
        return "team"

    def job(self, namespace: str, queue: str) -> dict[str, Any]:
        """A suspended batch Job of one pod that asks for one GPU, in `queue`."""
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": JOB, "namespace": namespace,
                         "labels": {QUEUE_NAME_LABEL: queue}},
            "spec": {
                "suspend": True, "parallelism": 1, "completions": 1, "backoffLimit": 0,
                "template": {"spec": {"restartPolicy": "Never", "containers": [{
                    "name": "main", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi", GPU: "1"},
                                  "limits": {GPU: "1"}},
                }]}},
            },
        }  # fmt: skip
        self.batch.create_namespaced_job(namespace, body)
        return self.read_job(namespace, JOB)

    def read_job(self, namespace: str, name: str) -> dict[str, Any]:
        job: dict[str, Any] = self.batch.api_client.sanitize_for_serialization(
            self.batch.read_namespaced_job(name, namespace)
        )
        return job

    def workload_of(self, job: dict[str, Any]) -> dict[str, Any]:
        """The Workload Kueue made for `job` (its owner); empty until it exists."""
        namespace, uid = job["metadata"]["namespace"], job["metadata"]["uid"]
        listed: dict[str, Any] = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "workloads"
        )
        for workload in listed["items"]:
            owners = workload["metadata"].get("ownerReferences", [])
            if any(owner["uid"] == uid for owner in owners):
                return dict(workload)
        return {}

    def cleanup(self) -> None:
        for plural, name in reversed(self.created):
            try:
                self.custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
            except ApiException as error:  # pragma: no cover - best effort
                if error.status != 404:
                    raise


@pytest.fixture
def kueued(kueue: Kueue, api_client: client.ApiClient) -> Iterator[Kueued]:
    objects = Kueued(api_client)
    try:
        yield objects
    finally:
        objects.cleanup()


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    """`obj`'s condition of type `kind`; empty if it has none."""
    conditions = obj.get("status", {}).get("conditions", [])
    return next((dict(c) for c in conditions if c["type"] == kind), {})


def is_true(obj: dict[str, Any], kind: str) -> bool:
    return condition(obj, kind).get("status") == "True"


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the patches the check's controller sends ------------------------------------------------


def active_patch(check: str) -> dict[str, Any]:
    """AdmissionCheck status: Kueue leaves every ClusterQueue that names a check inactive
    (reason AdmissionCheckInactive) until the check's controller sets Active=True."""
    return {
        "apiVersion": API_VERSION,
        "kind": "AdmissionCheck",
        "metadata": {"name": check},
        "status": {"conditions": [{
            "type": "Active", "status": "True", "reason": "Active",
            "message": "vramgate is ready to evaluate checks", "lastTransitionTime": now(),
        }]},
    }  # fmt: skip


def ready_patch(workload: dict[str, Any], check: str, node: str) -> dict[str, Any]:
    """Workload status: this check Ready, its pods pinned to `node`. Every field of the entry
    but podSetUpdates is required by the CRD. Applied with force: Kueue wrote the Pending
    entry (field manager `kueue`, an Update of the status), so another manager's apply
    conflicts on its state and message without force, as Kueue's own check controllers
    know (they apply with ForceOwnership)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {"name": workload["metadata"]["name"],
                     "namespace": workload["metadata"]["namespace"]},
        "status": {"admissionChecks": [{
            "name": check, "state": "Ready", "message": f"fits on {node}",
            "lastTransitionTime": now(),
            "podSetUpdates": [{"name": POD_SET,
                               "nodeSelector": {"kubernetes.io/hostname": node}}],
        }]},
    }  # fmt: skip


# -- tests ---------------------------------------------------------------------------------


def test_kueue_reserves_quota_and_unsuspends_a_job(kueued: Kueued, namespace: str) -> None:
    queue = kueued.queues(namespace)
    job = kueued.job(namespace, queue)

    def admitted() -> dict[str, Any]:
        workload = kueued.workload_of(job)
        return workload if is_true(workload, "Admitted") else {}

    workload = wait_until(admitted, timeout=TIMEOUT_S, what="Kueue to admit the Job's Workload")
    assert is_true(workload, "QuotaReserved")
    admission = workload["status"]["admission"]
    assert admission["clusterQueue"] == f"q-{namespace}"
    (assignment,) = admission["podSetAssignments"]
    assert assignment["name"] == POD_SET
    assert assignment["flavors"][GPU] == f"q-{namespace}"
    assert assignment["resourceUsage"][GPU] == "1"
    wait_until(
        lambda: kueued.read_job(namespace, JOB)["spec"]["suspend"] is False,
        timeout=TIMEOUT_S,
        what="Kueue to unsuspend the Job",
    )


def test_admission_check_holds_the_job_until_ready_with_a_node_selector(
    kueued: Kueued, namespace: str, gpu_nodes: list[str]
) -> None:
    check = f"vram-{namespace}"
    kueued.create_cluster("AdmissionCheck", "admissionchecks", check,
                          {"controllerName": CONTROLLER_NAME})  # fmt: skip
    queue = kueued.queues(namespace, check=check)
    custom = kueued.custom

    def cluster_queue() -> dict[str, Any]:
        found: dict[str, Any] = custom.get_cluster_custom_object(
            GROUP, VERSION, "clusterqueues", f"q-{namespace}"
        )
        return found

    # Until the check's controller says Active, Kueue keeps the ClusterQueue inactive.
    def active() -> dict[str, Any]:
        return condition(cluster_queue(), "Active")

    inactive = wait_until(
        lambda: active() if active().get("status") == "False" else {},
        timeout=TIMEOUT_S,
        what="the ClusterQueue to be inactive",
    )
    assert inactive["reason"] == "AdmissionCheckInactive", inactive
    custom.patch_cluster_custom_object_status(
        GROUP, VERSION, "admissionchecks", check, active_patch(check),
        field_manager=CHECK_MANAGER, _content_type=APPLY,
    )  # fmt: skip
    wait_until(lambda: active().get("status") == "True", timeout=TIMEOUT_S,
               what="the ClusterQueue to be active")  # fmt: skip

    job = kueued.job(namespace, queue)

    def pending() -> dict[str, Any]:
        workload = kueued.workload_of(job)
        checks = workload.get("status", {}).get("admissionChecks", [])
        return workload if is_true(workload, "QuotaReserved") and checks else {}

    workload = wait_until(pending, timeout=TIMEOUT_S, what="quota reserved and the check listed")
    (state,) = workload["status"]["admissionChecks"]
    assert (state["name"], state["state"]) == (check, "Pending"), state
    assert not is_true(workload, "Admitted")
    assert kueued.read_job(namespace, JOB)["spec"]["suspend"] is True

    node = gpu_nodes[0]
    patch = ready_patch(workload, check, node)
    name = workload["metadata"]["name"]
    with pytest.raises(ApiException) as refused:
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "workloads", name, patch,
            field_manager=CHECK_MANAGER, _content_type=APPLY,
        )  # fmt: skip
    assert refused.value.status == 409, refused.value.body
    causes = json.loads(refused.value.body)["details"]["causes"]
    assert f'.status.admissionChecks[name="{check}"].state' in {c["field"] for c in causes}
    assert all('conflict with "kueue"' in c["message"] for c in causes), causes
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "workloads", name, patch,
        field_manager=CHECK_MANAGER, force=True, _content_type=APPLY,
    )  # fmt: skip

    def unsuspended() -> dict[str, Any]:
        current = kueued.read_job(namespace, JOB)
        return current if current["spec"]["suspend"] is False else {}

    started = wait_until(unsuspended, timeout=TIMEOUT_S, what="Kueue to unsuspend the Job")
    assert started["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": node}
    workload = kueued.workload_of(job)
    assert is_true(workload, "Admitted")
    assert workload["status"]["admissionChecks"][0]["state"] == "Ready"
    core = client.CoreV1Api(custom.api_client)
    wait_until(
        lambda: [p.spec.node_name for p in core.list_namespaced_pod(
            namespace, label_selector=f"job-name={JOB}").items] == [node],
        timeout=TIMEOUT_S,
        what=f"the Job's pod to be scheduled on {node}",
    )  # fmt: skip
