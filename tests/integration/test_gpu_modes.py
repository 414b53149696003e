"""The operator in GPU mode `visibleDevices`, end to end on the local control plane.

`vramgate operator --gpu-mode visibleDevices` admits by memory alone: the chosen UUIDs go into
the trainer's NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES, there is no nvidia.com/gpu
request, and a GPU holds as many jobs as its free memory does (devicePlugin mode would give
each job whole GPUs). This module runs its own operator (its own Lease and webhook
configuration) and its own nodes (their own GPU product), as test_admission.py does; the
helpers here also serve the operator tests of `--gpu-mode dra` in test_dra.py.

Reference job (calibrated profile): llama-3.1-8b QLoRA r=16 needs 11.64 GiB on each GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from controller.api.base import GPU_RESOURCE, GROUP, JOB_LABEL, PRODUCT_LABEL, VERSION
from e2e.cluster import Cluster
from e2e.wait import wait_until
from tests.integration.test_admission import (
    FULL,
    Gpus,
    admitted,
    batch_job,
    create,
    env,
    get,
    job,
    objects,
    placed,
    wait_seen,
)
from tests.integration.test_operator import (  # noqa: F401 - `crds` is a fixture
    PLURAL,
    OperatorProcess,
    condition,
    crds,
    forget_webhook_configs,
)

pytestmark = pytest.mark.integration

WEBHOOK_CONFIG = "vramgate-visible-devices.vramgate.dev"
LEASE = "vramgate-visible-devices-tests"


# -- shared with test_dra.py -----------------------------------------------------------------


def _foreign_unselected_jobs(api: client.ApiClient) -> list[str]:
    """FineTuneJobs left by other modules (in namespaces still being deleted) that select no
    GPU product: an operator started now could place them on this module's GPUs."""
    listed = objects(api).list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
    return [
        f"{j['metadata']['namespace']}/{j['metadata']['name']}"
        for j in listed
        if PRODUCT_LABEL
        not in ((j.get("spec") or {}).get("resources") or {}).get("gpuSelector", {})
    ]


@contextmanager
def operator_in_mode(
    cluster: Cluster,
    api: client.ApiClient,
    workdir: Path,
    mode: str,
    lease: str,
    webhook_config: str,
) -> Iterator[OperatorProcess]:
    """`vramgate operator --gpu-mode <mode>` with its own Lease and webhook configuration,
    started once no other module's job could land on this module's GPUs."""
    wait_until(lambda: not _foreign_unselected_jobs(api), timeout=120,
               what="other modules' FineTuneJobs without a gpuSelector to go")  # fmt: skip
    process = OperatorProcess(
        cluster, api, workdir,
        extra=("--gpu-mode", mode, "--resync-seconds", "2", "--heartbeat-ttl-seconds", "30",
               "--lease-name", lease),
        webhook_config=webhook_config,
    )  # fmt: skip
    process.start(webhook=True)
    try:
        yield process
    finally:
        process.stop()
        forget_webhook_configs(api, webhook_config)


@contextmanager
def gpus_of_this_test(cluster: Cluster, api: client.ApiClient) -> Iterator[Gpus]:
    made = Gpus(cluster, api)
    try:
        yield made
    finally:
        made.close()
        core = client.CoreV1Api(api)
        for name in made.nodes:
            try:
                core.delete_node(name)
            except ApiException as error:
                if error.status != 404:
                    raise


def pods_of(api: client.ApiClient, namespace: str, name: str) -> list[client.V1Pod]:
    return list(
        client.CoreV1Api(api)
        .list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}={name}")
        .items
    )


def running_pods(
    api: client.ApiClient, namespace: str, name: str, count: int, timeout: float = 60
) -> list[client.V1Pod]:
    def running() -> list[client.V1Pod] | None:
        pods = pods_of(api, namespace, name)
        ok = len(pods) == count and all(p.status.phase == "Running" for p in pods)
        return pods if ok else None

    return wait_until(running, timeout=timeout, what=f"{count} running pod(s) of {name}")


def uuids_of(obj: dict[str, Any]) -> list[str]:
    return [u for part in obj["status"]["placement"]["nodes"] for u in part["gpuUUIDs"]]


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def visible(
    cluster: Cluster,
    api_client: client.ApiClient,
    crds: None,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    with operator_in_mode(cluster, api_client, tmp_path_factory.mktemp("visible"),
                          "visibleDevices", LEASE, WEBHOOK_CONFIG) as process:  # fmt: skip
        yield process


@pytest.fixture
def gpus(cluster: Cluster, api_client: client.ApiClient) -> Iterator[Gpus]:
    with gpus_of_this_test(cluster, api_client) as made:
        yield made


#: The QLoRA job of test_admission under DDP on 2 GPUs (status.estimate.perGpuBytes).
QLORA_DDP_BYTES = 12_970_190_422


# -- tests -----------------------------------------------------------------------------------


def test_visible_devices_names_the_chosen_uuids_in_order_and_requests_no_gpu(
    visible: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    (other,) = gpus.add([80, 80, 80, 80])
    (node,) = gpus.add([80, 20, 13, 60])
    wait_seen(gpus, [other, node])
    body = job("pinned", gpus, parallelism="DDP", resources={"gpus": 2})
    # A template that asks for a GPU by count: visibleDevices drops the request.
    body["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {GPU_RESOURCE: "2", "cpu": "1"}}  # fmt: skip
    create(api_client, namespace, body)
    obj = admitted(api_client, namespace, "pinned", "True", "Fits")
    # The two tightest GPUs that hold 11.64 GiB, tightest first: 13 GiB, then 20 GiB free.
    assert placed(obj) == [(node, [2, 1])]
    assert uuids_of(obj) == [f"GPU-{node}-2", f"GPU-{node}-1"]
    # DDP on two GPUs: the whole job on each, plus its gradient buckets (with their share of
    # the allocator's reserve) and NCCL's buffers
    assert obj["status"]["placement"]["perGpuBytes"] == QLORA_DDP_BYTES

    workload = batch_job(api_client, namespace, "pinned")
    trainer = workload.spec.template.spec.containers[0]
    values = env(trainer)
    visible_devices = f"GPU-{node}-2,GPU-{node}-1"
    assert values["NVIDIA_VISIBLE_DEVICES"] == visible_devices
    assert values["CUDA_VISIBLE_DEVICES"] == visible_devices
    assert values["VRAMGATE_GPU_UUIDS"] == visible_devices
    assert trainer.resources.limits == {"cpu": "1"}
    assert not (trainer.resources.requests or {}).get(GPU_RESOURCE)
    assert workload.spec.template.spec.resource_claims is None
    (pod,) = running_pods(api_client, namespace, "pinned", 1)
    assert pod.spec.node_name == node


def test_two_jobs_share_one_gpu_by_memory_and_a_third_waits_for_it(
    visible: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    (node,) = gpus.add([30])  # one GPU, 30 GiB free: room for two 11.64 GiB jobs, not three
    wait_seen(gpus, [node])
    for name in ("share-a", "share-b"):
        create(api_client, namespace, job(name, gpus))
        obj = admitted(api_client, namespace, name, "True", "Fits")
        assert placed(obj) == [(node, [0])]
        assert env(batch_job(api_client, namespace, name).spec.template.spec.containers[0])[
            "NVIDIA_VISIBLE_DEVICES"] == f"GPU-{node}-0"  # fmt: skip
    for name in ("share-a", "share-b"):
        (pod,) = running_pods(api_client, namespace, name, 1)
        assert pod.spec.node_name == node

    create(api_client, namespace, job("share-c", gpus))
    waiting = admitted(api_client, namespace, "share-c", "False", "WaitingForVRAM")
    assert "placement" not in waiting["status"]
    objects(api_client).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "share-a"
    )
    # share-a's reservation goes with it: share-c takes the same GPU beside share-b.
    obj = admitted(api_client, namespace, "share-c", "True", "Fits", timeout=60)
    assert placed(obj) == [(node, [0])]
    assert (condition(get(api_client, namespace, "share-b"), "Admitted") or {})["status"] == "True"


def test_a_job_that_needs_two_nodes_is_refused_in_visible_devices_mode(
    visible: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    nodes = gpus.add([80, 80], [80, 80])
    wait_seen(gpus, nodes)
    # 4 GPUs with FSDP fit two of these nodes (devicePlugin and dra would admit it), but the
    # UUIDs of one pod's NVIDIA_VISIBLE_DEVICES are on one node: it can never fit.
    body = job("spread", gpus, **FULL, resources={"gpus": 4})
    with pytest.raises(ApiException) as refused:
        create(api_client, namespace, body)
    assert refused.value.status == 422
    message = str(refused.value.body)
    assert "InsufficientGPUs" in message
    assert "GPU mode visibleDevices keeps a job on one node" in message
    assert "at most 2 GPUs each" in message
