"""vramgate as Kueue's AdmissionCheck controller, end to end, with the real Kueue controller.

`vramgate operator --kueue-admission-check` answers the AdmissionCheck whose controllerName
is vramgate.dev/vram: Kueue reserves quota for a suspended batch Job's Workload, vramgate
decides its GPU memory on the same inventory and ledger as its FineTuneJobs, and Kueue
admits it (Ready: pinned to the node chosen), asks again later (Retry) or gives up
(Rejected). Nodes are kwok nodes whose GPUNodes the test writes (`Gpus`), each test's of its
own GPU product, which its Jobs select, so tests sharing the operator never see each
other's GPUs.

The other kinds whose Workloads the check answers (JobSet, PyTorchJob, TrainJob) have one
test each of Ready and pinned, and a JobSet one of Rejected (a podSet of several pods runs on
one node): only their CRDs are installed (e2e/kueue.py), so Kueue starts them but no
controller makes their pods.

Reference job (calibrated profile): Llama-3.1-8B QLoRA r=16 needs 11.64 GiB on one GPU; Full
needs 86.09 GiB.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from controller.admission import kueue as check
from controller.api.base import JOB_LABEL
from e2e.cluster import Cluster
from e2e.kueue import QUEUE_NAME_LABEL, Kueue
from e2e.nodes import RUN_FOR_ANNOTATION
from e2e.wait import wait_until
from tests.integration.test_admission import (  # noqa: F401 - `gpus` is a fixture
    QLORA,
    QLORA_BYTES,
    Gpus,
    admitted,
    create,
    get,
    gpus,
)
from tests.integration.test_admission import job as finetunejob
from tests.integration.test_kueue_harness import Kueued, is_true
from tests.integration.test_operator import (  # noqa: F401 - `crds` is a fixture
    OperatorProcess,
    condition,
    crds,
    events_for,
    forget_webhook_configs,
)

pytestmark = pytest.mark.integration

WEBHOOK_CONFIG = "vramgate-kueue-tests.vramgate.dev"
CHECK = "vramgate-vram"
RETRY_S = 2
TIMEOUT_S = 40.0
FULL = {"model": {"preset": "llama-3.1-8b"}, "method": "Full"}


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster,
    api_client: client.ApiClient,
    kueue: Kueue,
    crds: None,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        cluster,
        api_client,
        tmp_path_factory.mktemp("kueue-check"),
        extra=("--resync-seconds", "1", "--heartbeat-ttl-seconds", "60",
               "--lease-name", "vramgate-kueue-tests", "--kueue-admission-check",
               "--kueue-retry-seconds", str(RETRY_S)),
        webhook_config=WEBHOOK_CONFIG,
    )  # fmt: skip
    process.start(webhook=True)  # the `gpus` fixture waits until the webhook sees its GPUs
    try:
        yield process
    finally:
        process.stop()
        forget_webhook_configs(api_client, WEBHOOK_CONFIG)


@pytest.fixture
def queue(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> Iterator[tuple[Kueued, str]]:
    """An AdmissionCheck of vramgate's, a ClusterQueue of 4 GPUs that lists it, a LocalQueue."""
    objects = Kueued(api_client)
    name = f"{CHECK}-{namespace}"
    objects.create_cluster(
        "AdmissionCheck", "admissionchecks", name, {"controllerName": check.CONTROLLER}
    )
    local = objects.queues(namespace, check=name, gpus="4")
    try:
        yield objects, local
    finally:
        objects.cleanup()


def train_job(
    namespace: str,
    name: str,
    queue: str,
    nodes: Gpus,
    finetune: dict[str, Any] | None = QLORA,
    gpus_per_pod: int = 1,
    runs_for: str = "600s",
) -> dict[str, Any]:
    """A suspended batch Job in `queue`, its pod selecting `nodes`' nodes, its training said in
    the annotation vramgate reads."""
    annotations = {RUN_FOR_ANNOTATION: runs_for}
    if finetune is not None:
        annotations[check.SPEC_ANNOTATION] = yaml.safe_dump(finetune)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {QUEUE_NAME_LABEL: queue}},
        "spec": {
            "suspend": True, "parallelism": 1, "completions": 1, "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": dict(nodes.selector),
                    "containers": [{
                        "name": "trainer", "image": "trainer:v1",
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus_per_pod)}},
                    }],
                },
            },
        },
    }  # fmt: skip


def submit(api: client.ApiClient, body: dict[str, Any]) -> None:
    client.BatchV1Api(api).create_namespaced_job(body["metadata"]["namespace"], body)


#: The job kinds besides batch Jobs whose Workloads the check answers: (group, version, plural).
KINDS = {
    "JobSet": ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
    "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
}


def read(objects: Kueued, namespace: str, name: str, kind: str = "Job") -> dict[str, Any]:
    """The job `name` of `kind` (a batch Job or one of `KINDS`)."""
    if kind == "Job":
        return objects.read_job(namespace, name)
    group, version, plural = KINDS[kind]
    found: dict[str, Any] = objects.custom.get_namespaced_custom_object(
        group, version, namespace, plural, name
    )
    return found


def create_of(objects: Kueued, body: dict[str, Any]) -> None:
    """Create `body`, a job of one of `KINDS`."""
    group, version, plural = KINDS[body["kind"]]
    objects.custom.create_namespaced_custom_object(
        group, version, body["metadata"]["namespace"], plural, body
    )


def answered(
    objects: Kueued,
    namespace: str,
    name: str,
    state: str,
    timeout: float = TIMEOUT_S,
    kind: str = "Job",
) -> dict[str, Any]:
    """The Workload of the job `name` (of `kind`) once vramgate's check on it is `state`."""

    def found() -> dict[str, Any] | None:
        job = read(objects, namespace, name, kind)
        workload = objects.workload_of(job)
        for entry in (workload.get("status") or {}).get("admissionChecks") or []:
            if entry["name"].startswith(CHECK) and entry.get("state") == state:
                return workload
        return None

    return wait_until(found, timeout=timeout, what=f"check {state} on {namespace}/{name}")


def entry_of(workload: dict[str, Any]) -> dict[str, Any]:
    (found,) = [e for e in workload["status"]["admissionChecks"] if e["name"].startswith(CHECK)]
    return dict(found)


def event(
    api: client.ApiClient, namespace: str, name: str, reason: str, kind: str
) -> client.CoreV1Event:
    """The first Event of `reason` about the object `name`."""
    found = wait_until(
        lambda: [e for e in events_for(api, namespace, name)
                 if e.reason == reason and e.type == kind],
        timeout=TIMEOUT_S, what=f"a {kind} Event {reason} on {name}",
    )  # fmt: skip
    return found[0]


def pod_node(api: client.ApiClient, namespace: str, job: str) -> str:
    core = client.CoreV1Api(api)

    def scheduled() -> str | None:
        pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
        return pods[0].spec.node_name if pods and pods[0].spec.node_name else None

    return wait_until(scheduled, timeout=TIMEOUT_S, what=f"the pod of {job} to be scheduled")


# -- tests --------------------------------------------------------------------------------------


def test_the_check_is_made_active(queue: tuple[Kueued, str], api_client: client.ApiClient) -> None:
    objects, _ = queue
    name = objects.created[0][1]
    wait_until(
        lambda: is_true(objects.custom.get_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "admissionchecks", name), "Active"),
        timeout=TIMEOUT_S, what="the AdmissionCheck to be Active",
    )  # fmt: skip


def test_a_job_that_fits_is_ready_and_its_pod_lands_on_the_chosen_node(
    queue: tuple[Kueued, str],
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,  # noqa: F811
) -> None:
    objects, local = queue
    # 14 GiB is the tightest GPU that holds 11.64 GiB; 10 GiB does not.
    small, tight, roomy = gpus.add([10], [14], [80])
    submit(api_client, train_job(namespace, "fits", local, gpus))
    workload = answered(objects, namespace, "fits", check.READY)
    entry = entry_of(workload)
    assert entry["message"].startswith("Fits: ")
    (update,) = entry["podSetUpdates"]
    assert update["nodeSelector"] == {check.HOSTNAME_LABEL: tight}
    placement = json.loads(update["annotations"][check.PLACEMENT_ANNOTATION])
    assert placement["perGpuBytes"] == QLORA_BYTES
    assert update["annotations"][check.UUIDS_ANNOTATION] == f"GPU-{tight}-0"
    assert pod_node(api_client, namespace, "fits") == tight
    job = objects.read_job(namespace, "fits")
    assert job["spec"]["suspend"] is False
    assert job["spec"]["template"]["spec"]["nodeSelector"][check.HOSTNAME_LABEL] == tight
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels[check.WORKLOAD_UID_LABEL] == workload["metadata"]["uid"]
    assert JOB_LABEL not in labels  # not a FineTuneJob's workload
    del small, roomy


def test_a_job_waits_with_retry_then_is_ready_once_the_one_before_finishes(
    queue: tuple[Kueued, str],
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,  # noqa: F811
) -> None:
    objects, local = queue
    (node,) = gpus.add([20])  # holds one 11.64 GiB job, not two
    submit(api_client, train_job(namespace, "first", local, gpus, runs_for="8s"))
    answered(objects, namespace, "first", check.READY)
    submit(api_client, train_job(namespace, "second", local, gpus))
    # Kueue turns a Retry back to Pending at once (its message with it): the reason stays in
    # the Event on the Job, and the wait Kueue was told in the entry.
    said = event(api_client, namespace, "second", "WaitingForVRAM", "Normal")
    assert "11.6" in said.message
    workload = objects.workload_of(objects.read_job(namespace, "second"))
    assert entry_of(workload).get("requeueAfterSeconds") == RETRY_S
    assert objects.read_job(namespace, "second")["spec"]["suspend"] is True
    # The first's pod ends (kwok, 8 s): its Workload finishes, its hold ends, and the second
    # is admitted on Kueue's next ask.
    ready = answered(objects, namespace, "second", check.READY, timeout=60)
    (update,) = entry_of(ready)["podSetUpdates"]
    assert update["nodeSelector"] == {check.HOSTNAME_LABEL: node}
    assert (entry_of(ready).get("retryCount") or 0) >= 1


def test_a_job_that_never_fits_is_rejected_with_the_numbers_on_the_workload_and_the_job(
    queue: tuple[Kueued, str],
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,  # noqa: F811
) -> None:
    objects, local = queue
    gpus.add([80])
    submit(api_client, train_job(namespace, "full", local, gpus, finetune=FULL))
    said = event(api_client, namespace, "full", "InsufficientVRAM", "Warning")
    assert "needs 86.09 GiB" in said.message
    # Kueue deactivates a Workload whose check is Rejected, and says our message on it.
    workload = wait_until(
        lambda: (w := objects.workload_of(objects.read_job(namespace, "full")))
        and w["spec"].get("active") is False and w,
        timeout=TIMEOUT_S, what="Kueue to deactivate the Workload",
    )  # fmt: skip
    kueue_said = event(
        api_client, namespace, workload["metadata"]["name"], "AdmissionCheckRejected", "Warning"
    )
    assert "InsufficientVRAM: " in kueue_said.message and "needs 86.09 GiB" in kueue_said.message
    assert objects.read_job(namespace, "full")["spec"]["suspend"] is True


def test_a_job_without_the_annotation_is_rejected_naming_the_field(
    queue: tuple[Kueued, str],
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,  # noqa: F811
) -> None:
    _, local = queue
    gpus.add([80])
    submit(api_client, train_job(namespace, "unsaid", local, gpus, finetune=None))
    said = event(api_client, namespace, "unsaid", "InvalidSpec", "Warning")
    assert f"metadata.annotations[{check.SPEC_ANNOTATION}] is required" in said.message


def test_a_ready_workload_holds_its_memory_against_finetunejobs(
    queue: tuple[Kueued, str],
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,  # noqa: F811
) -> None:
    objects, local = queue
    gpus.add([20])  # holds one 11.64 GiB job, of either kind
    submit(api_client, train_job(namespace, "kueued", local, gpus))
    answered(objects, namespace, "kueued", check.READY)
    create(api_client, namespace, finetunejob("ftj", gpus))
    obj = admitted(api_client, namespace, "ftj", "False", "WaitingForVRAM")
    assert "11.6" in str(obj["status"]["conditions"])


def test_quota_comes_first_a_job_over_it_is_never_asked_about(
    queue: tuple[Kueued, str],
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,  # noqa: F811
) -> None:
    objects, local = queue
    gpus.add([80, 80, 80, 80, 80])  # five GPUs of one node hold it; the quota is 4
    submit(api_client, train_job(namespace, "big", local, gpus, gpus_per_pod=5))
    workload = wait_until(
        lambda: objects.workload_of(objects.read_job(namespace, "big")),
        timeout=TIMEOUT_S, what="the Workload of big",
    )  # fmt: skip
    # Kueue says why it reserves nothing; vramgate is not asked meanwhile.
    wait_until(
        lambda: (w := objects.workload_of(objects.read_job(namespace, "big")))
        and (w.get("status") or {}).get("conditions"),
        timeout=TIMEOUT_S, what="Kueue to say why big waits",
    )  # fmt: skip
    workload = objects.workload_of(objects.read_job(namespace, "big"))
    assert not is_true(workload, "QuotaReserved")
    states = [e.get("state") for e in (workload["status"].get("admissionChecks") or [])]
    assert set(states) <= {check.PENDING}
    assert objects.read_job(namespace, "big")["spec"]["suspend"] is True


def test_a_kueue_preemption_releases_the_reservation_and_the_preemptor_gets_the_gpu(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,  # noqa: F811
) -> None:
    objects = Kueued(api_client)
    try:
        name = f"{CHECK}-p-{namespace}"
        objects.create_cluster(
            "AdmissionCheck", "admissionchecks", name, {"controllerName": check.CONTROLLER}
        )
        objects.create_cluster("ResourceFlavor", "resourceflavors", name, {})
        objects.create_cluster("ClusterQueue", "clusterqueues", name, {
            "namespaceSelector": {},
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "admissionChecksStrategy": {"admissionChecks": [{"name": name}]},
            "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                {"name": name, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "1"}]}
            ]}],
        })  # fmt: skip
        for priority, value in (("low", 10), ("high", 1000)):
            body = {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": f"{priority}-{namespace}"},
                "value": value,
            }
            objects.custom.create_cluster_custom_object(
                "kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses", body
            )
            objects.created.append(("workloadpriorityclasses", f"{priority}-{namespace}"))
        local = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                 "metadata": {"name": "preempting", "namespace": namespace},
                 "spec": {"clusterQueue": name}}  # fmt: skip
        objects.custom.create_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", namespace, "localqueues", local
        )
        (node,) = gpus.add([80])
        low = train_job(namespace, "low", "preempting", gpus)
        low["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = f"low-{namespace}"
        submit(api_client, low)
        answered(objects, namespace, "low", check.READY)
        assert pod_node(api_client, namespace, "low") == node
        high = train_job(namespace, "high", "preempting", gpus)
        high["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = f"high-{namespace}"
        submit(api_client, high)
        # Kueue evicts low (its check back to Pending: its hold ends) and reserves the one GPU
        # of quota for high; vramgate admits high once low's pod has given the GPU back.
        ready = answered(objects, namespace, "high", check.READY, timeout=60)
        assert entry_of(ready)["podSetUpdates"][0]["nodeSelector"] == {check.HOSTNAME_LABEL: node}
        evicted = objects.workload_of(objects.read_job(namespace, "low"))
        assert is_true(evicted, "Evicted") or not is_true(evicted, "Admitted")
        assert entry_of(evicted)["state"] != check.READY
        assert pod_node(api_client, namespace, "high") == node
    finally:
        objects.cleanup()


def test_a_gated_job_is_resized_to_what_fits_then_admitted_through_the_check(
    queue: tuple[Kueued, str],
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,  # noqa: F811
) -> None:
    objects, local = queue
    (node,) = gpus.add([80, 80])  # two GPUs: the Job asks four, and may run on one to four
    body = train_job(namespace, "elastic", local, gpus, finetune={**QLORA, "resources": {
        "minGPUs": 1}}, gpus_per_pod=4)  # fmt: skip
    body["metadata"]["annotations"] = {check.GATE_ANNOTATION: check.CONTROLLER}
    submit(api_client, body)
    said = event(api_client, namespace, "elastic", "Resized", "Normal")
    assert said.message.startswith("resized from 4 to 2 GPUs")
    job = objects.read_job(namespace, "elastic")
    assert check.GATE_ANNOTATION not in (job["metadata"].get("annotations") or {})
    (trainer,) = job["spec"]["template"]["spec"]["containers"]
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "2"
    ready = answered(objects, namespace, "elastic", check.READY)
    placement = json.loads(entry_of(ready)["podSetUpdates"][0]["annotations"][
        check.PLACEMENT_ANNOTATION])  # fmt: skip
    assert [(p["node"], p["gpuIndices"]) for p in placement["nodes"]] == [(node, [0, 1])]
    assert pod_node(api_client, namespace, "elastic") == node


def test_a_finetunejob_with_a_queue_name_runs_through_kueue_and_vramgates_check(
    queue: tuple[Kueued, str],
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,  # noqa: F811
) -> None:
    objects, local = queue
    (node,) = gpus.add([20])  # holds one 11.64 GiB job
    submit(api_client, train_job(namespace, "blocker", local, gpus, runs_for="8s"))
    answered(objects, namespace, "blocker", check.READY)
    body = finetunejob("queued", gpus, runs_for="600s")
    body["spec"]["queueName"] = local
    create(api_client, namespace, body)
    # Handed to Kueue: its Job waits suspended while the check answers WaitingForVRAM.
    waiting = admitted(api_client, namespace, "queued", "False", "QueuedInKueue")
    assert f"LocalQueue {local}" in condition(waiting, "Admitted")["message"]
    assert objects.read_job(namespace, "queued")["spec"]["suspend"] is True
    event(api_client, namespace, "queued", "WaitingForVRAM", "Normal")
    # The blocker ends: the check places the FineTuneJob's Workload, Kueue starts its Job,
    # and the FineTuneJob is admitted on that placement and runs there.
    obj = admitted(api_client, namespace, "queued", "True", "Fits", timeout=60)
    assert obj["status"]["placement"]["nodes"][0]["node"] == node
    assert obj["status"]["placement"]["perGpuBytes"] == QLORA_BYTES
    assert pod_node(api_client, namespace, "queued") == node
    wait_until(
        lambda: (c := condition(get(api_client, namespace, "queued"), "Running"))
        and c["status"] == "True",
        timeout=TIMEOUT_S, what="Running=True",
    )  # fmt: skip


# -- other job kinds: one Workload of several podSets ----------------------------------------


def gpu_template(
    nodes: Gpus,
    per_pod: int = 1,
    finetune: dict[str, Any] | None = QLORA,
    container: str = "trainer",
) -> dict[str, Any]:
    """A pod template selecting `nodes`' nodes, asking for `per_pod` GPUs, its training said
    in the annotation vramgate reads."""
    annotations = {check.SPEC_ANNOTATION: yaml.safe_dump(finetune)} if finetune else {}
    return {
        "metadata": {"annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": dict(nodes.selector),
            "containers": [{"name": container, "image": "trainer:v1",
                            "resources": {"limits": {"nvidia.com/gpu": str(per_pod)}}}],
        },
    }  # fmt: skip


def replicated_job(name: str, pods: int, template: dict[str, Any]) -> dict[str, Any]:
    spec = {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": template}
    return {"name": name, "replicas": 1, "template": {"spec": spec}}


def jobset(namespace: str, name: str, queue: str, nodes: Gpus, pods: int) -> dict[str, Any]:
    """A suspended JobSet in `queue`: a CPU-only initializer of one pod, then a trainer of
    `pods` pods of one GPU each, whose template carries the annotation."""
    init = {"name": "init", "image": "init:v1", "resources": {"requests": {"cpu": "1"}}}
    initializer = {"spec": {"restartPolicy": "Never", "containers": [init]}}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace, "labels": {QUEUE_NAME_LABEL: queue}},
        "spec": {"suspend": True, "replicatedJobs": [
            replicated_job("initializer", 1, initializer),
            replicated_job("trainer", pods, gpu_template(nodes)),
        ]},
    }  # fmt: skip


def test_a_jobset_is_ready_with_only_its_gpu_podset_pinned_all_its_pods_on_one_node(
    queue: tuple[Kueued, str],
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,  # noqa: F811
) -> None:
    objects, local = queue
    # The trainer's two pods of one GPU each (FSDP over two GPUs: 14.13 GiB on each): on one
    # node of two GPUs, the tightest (one nodeSelector per podSet pins them together).
    (one,) = gpus.add([80])
    tight, roomy = gpus.add([16, 16], [80, 80])
    create_of(objects, jobset(namespace, "js", local, gpus, pods=2))
    workload = answered(objects, namespace, "js", check.READY, kind="JobSet")
    assert [(p["name"], p["count"]) for p in workload["spec"]["podSets"]] == [
        ("initializer", 1), ("trainer", 2)]  # fmt: skip
    (update,) = entry_of(workload)["podSetUpdates"]  # the initializer asks no GPU: not pinned
    assert update["name"] == "trainer"
    assert update["nodeSelector"] == {check.HOSTNAME_LABEL: tight}
    placement = json.loads(update["annotations"][check.PLACEMENT_ANNOTATION])
    assert [(p["node"], p["gpuIndices"]) for p in placement["nodes"]] == [(tight, [0, 1])]
    # Kueue starts the JobSet with the updates in the trainer's pod template only.
    started = wait_until(
        lambda: (j := read(objects, namespace, "js", "JobSet"))["spec"].get("suspend") is False
        and j, timeout=TIMEOUT_S, what="Kueue to start the JobSet")  # fmt: skip
    initializer, trainer = (r["template"]["spec"]["template"] for r in
                            started["spec"]["replicatedJobs"])  # fmt: skip
    assert trainer["spec"]["nodeSelector"][check.HOSTNAME_LABEL] == tight
    assert trainer["metadata"]["labels"][check.WORKLOAD_UID_LABEL] == workload["metadata"]["uid"]
    assert check.PLACEMENT_ANNOTATION in trainer["metadata"]["annotations"]
    assert check.HOSTNAME_LABEL not in (initializer["spec"].get("nodeSelector") or {})
    assert check.WORKLOAD_UID_LABEL not in (initializer.get("metadata") or {}).get("labels", {})
    del one, roomy


def test_a_jobset_whose_gpu_podset_no_node_holds_is_rejected_though_two_nodes_would(
    queue: tuple[Kueued, str],
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,  # noqa: F811
) -> None:
    objects, local = queue
    gpus.add([80], [80])  # two pods of one GPU would fit, one on each: not pinnable so
    create_of(objects, jobset(namespace, "wide", local, gpus, pods=2))
    said = wait_until(
        lambda: [e for e in events_for(api_client, namespace, "wide") if e.type == "Warning"],
        timeout=TIMEOUT_S, what="a Warning Event on the JobSet")[0]  # fmt: skip
    assert said.reason == "InsufficientGPUs"
    assert "a Kueue Workload runs on one node" in said.message
    # Rejected: Kueue deactivates the Workload, and the JobSet stays suspended.
    wait_until(
        lambda: objects.workload_of(read(objects, namespace, "wide", "JobSet"))["spec"].get(
            "active") is False,
        timeout=TIMEOUT_S, what="Kueue to deactivate the Workload",
    )  # fmt: skip
    assert read(objects, namespace, "wide", "JobSet")["spec"]["suspend"] is True


def test_a_pytorchjob_is_ready_with_its_master_and_worker_pinned_to_one_node(
    queue: tuple[Kueued, str],
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,  # noqa: F811
) -> None:
    objects, local = queue
    (small,) = gpus.add([80])
    (node,) = gpus.add([80, 80])  # master and worker: one GPU each, on one node
    replica = {"replicas": 1, "restartPolicy": "Never",
               "template": gpu_template(gpus, container="pytorch")}  # fmt: skip
    create_of(objects, {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "pt", "namespace": namespace, "labels": {QUEUE_NAME_LABEL: local}},
        "spec": {"runPolicy": {"suspend": True},
                 "pytorchReplicaSpecs": {"Master": replica, "Worker": replica}},
    })  # fmt: skip
    workload = answered(objects, namespace, "pt", check.READY, kind="PyTorchJob")
    updates = {u["name"]: u for u in entry_of(workload)["podSetUpdates"]}
    assert set(updates) == {"master", "worker"}
    assert {u["nodeSelector"][check.HOSTNAME_LABEL] for u in updates.values()} == {node}
    placement = json.loads(updates["worker"]["annotations"][check.PLACEMENT_ANNOTATION])
    assert [(p["node"], p["gpuIndices"]) for p in placement["nodes"]] == [(node, [0, 1])]
    started = wait_until(
        lambda: (j := read(objects, namespace, "pt", "PyTorchJob"))["spec"]["runPolicy"]
        .get("suspend") is False and j,
        timeout=TIMEOUT_S, what="Kueue to start the PyTorchJob",
    )  # fmt: skip
    for spec in started["spec"]["pytorchReplicaSpecs"].values():
        assert spec["template"]["spec"]["nodeSelector"][check.HOSTNAME_LABEL] == node
    del small


def test_a_trainjob_is_ready_and_its_trainer_pinned_through_kueues_runtime_patch(
    queue: tuple[Kueued, str],
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,  # noqa: F811
) -> None:
    objects, local = queue
    small, node = gpus.add([10], [80])
    runtime = f"torch-{namespace}"
    trainer = replicated_job("node", 1, gpu_template(gpus, finetune=None, container="node"))
    trainer["template"]["metadata"] = {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step":
                                                  "trainer"}}  # fmt: skip
    objects.custom.create_cluster_custom_object("trainer.kubeflow.org", "v1alpha1",
        "clustertrainingruntimes", {
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": runtime},
            "spec": {"mlPolicy": {"numNodes": 1, "torch": {}},
                     "template": {"spec": {"replicatedJobs": [trainer]}}},
        })  # fmt: skip
    try:
        # Without Kueue's webhook, the TrainJob carries the empty runtime patch Kueue writes
        # its podSetUpdates into; the training is said in a patch of the user's.
        said = {"template": {"metadata": {"annotations": {
            check.SPEC_ANNOTATION: yaml.safe_dump(QLORA)}}}}  # fmt: skip
        create_of(objects, {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "tj", "namespace": namespace,
                         "labels": {QUEUE_NAME_LABEL: local}},
            "spec": {
                "suspend": True,
                "runtimeRef": {"name": runtime, "apiGroup": "trainer.kubeflow.org",
                               "kind": "ClusterTrainingRuntime"},
                "runtimePatches": [
                    {"manager": "kueue.x-k8s.io/manager",
                     "trainingRuntimeSpec": {"template": {"spec": {}}}},
                    {"manager": "example.com/team",
                     "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
                         {"name": "node", "template": {"spec": said}}]}}}},
                ],
            },
        })  # fmt: skip
        workload = answered(objects, namespace, "tj", check.READY, kind="TrainJob")
        (update,) = entry_of(workload)["podSetUpdates"]
        assert update["name"] == "node"
        assert update["nodeSelector"] == {check.HOSTNAME_LABEL: node}
        started = wait_until(
            lambda: (j := read(objects, namespace, "tj", "TrainJob"))["spec"].get("suspend")
            is False and j, timeout=TIMEOUT_S, what="Kueue to start the TrainJob")  # fmt: skip
        (patch,) = [p for p in started["spec"]["runtimePatches"]
                    if p["manager"] == "kueue.x-k8s.io/manager"]  # fmt: skip
        (pinned,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        pod = pinned["template"]["spec"]["template"]
        assert pod["spec"]["nodeSelector"] == {check.HOSTNAME_LABEL: node}
        assert pod["metadata"]["labels"][check.WORKLOAD_UID_LABEL] == workload["metadata"]["uid"]
    finally:
        objects.custom.delete_cluster_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", runtime
        )
    del small
