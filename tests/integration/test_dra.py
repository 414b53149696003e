"""The workloads `build_workload` writes run where admission put them, on the real scheduler.

The kube-scheduler of the local control plane allocates DRA claims itself (structured
parameters): the test publishes what the NVIDIA DRA driver would (the `gpu.nvidia.com`
DeviceClass and one ResourceSlice per node, devices `gpu-<i>` with a `uuid` attribute), so
the claim's allocation shows which devices the UUID selector really picked. kwok plays the
kubelet, so pods run without a driver preparing the devices.

The tests at the end run the operator itself (`--gpu-mode dra`) and check that the claims it
creates get exactly the GPUs of its placement.

The owner is a real FineTuneJob (the CRDs are installed), as the API returns it: the input
`build_workload` gets from the operator, and the owner the garbage collector follows.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from controller.api.base import GPU_RESOURCE, GROUP, JOB_LABEL, VERSION
from controller.packing.inventory import GpuMode, NodeGpus
from controller.workload import (
    Admission,
    Phase,
    build_workload,
    job_label_value,
    workload_name,
    workload_state,
)
from e2e.cluster import Cluster
from e2e.nodes import RUN_FOR_ANNOTATION
from e2e.wait import wait_until
from tests.integration.test_admission import (
    DEADLINE_S,
    FULL,
    QLORA_BYTES,
    Gpus,
    admitted,
    create,
    job,
    placed,
)
from tests.integration.test_gpu_modes import (
    gpus_of_this_test,
    operator_in_mode,
    uuids_of,
    wait_seen,
)
from tests.integration.test_operator import OperatorProcess

pytestmark = pytest.mark.integration

CRD_DIR = Path(__file__).resolve().parents[2] / "charts" / "vramgate" / "crds"
RESOURCE = ("resource.k8s.io", "v1")
DRIVER = "gpu.nvidia.com"
GPUS_PER_NODE = 8
GIB = 2**30


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> None:
    applied = cluster.kubectl("apply", "--server-side", "-f", str(CRD_DIR))
    assert applied.returncode == 0, applied.stderr
    names = [f"crd/{p.name.removesuffix('.yaml')}" for p in sorted(CRD_DIR.glob("*.yaml"))]
    established = cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)
    assert established.returncode == 0, established.stderr


@pytest.fixture(scope="module")
def dra_nodes(cluster: Cluster, api_client: client.ApiClient) -> Iterator[list[str]]:
    """Two 8-GPU nodes of this module's own, deleted after it: they carry nvidia.com/gpu too,
    and other modules' GPU pods must not land on them."""
    names = cluster.create_gpu_nodes(2, name_prefix="dra-node")
    try:
        yield names
    finally:
        core = client.CoreV1Api(api_client)
        for name in names:
            core.delete_node(name)


@pytest.fixture(scope="module")
def gpu_uuids(api_client: client.ApiClient, dra_nodes: list[str]) -> Iterator[dict[str, list[str]]]:
    """What the NVIDIA DRA driver publishes: its DeviceClass, and per node a ResourceSlice
    (pool = node) of 8 GPUs `gpu-0..7` with their UUIDs. Returns node -> UUIDs by index."""
    custom = client.CustomObjectsApi(api_client)
    device_class = {
        "apiVersion": "/".join(RESOURCE),
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }
    try:
        custom.create_cluster_custom_object(*RESOURCE, "deviceclasses", device_class)
    except ApiException as error:
        if error.status != 409:  # another module's identical class
            raise
    uuids = {node: [f"GPU-{uuid.uuid4()}" for _ in range(GPUS_PER_NODE)] for node in dra_nodes}
    slices = []
    for node, node_uuids in uuids.items():
        body = {
            "apiVersion": "/".join(RESOURCE),
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": f"gpu-{i}",
                        "attributes": {
                            "type": {"string": "gpu"},
                            "uuid": {"string": gpu_uuid},
                            "productName": {"string": "NVIDIA H100 80GB HBM3"},
                        },
                        "capacity": {"memory": {"value": "80Gi"}},
                    }
                    for i, gpu_uuid in enumerate(node_uuids)
                ],
            },
        }
        custom.create_cluster_custom_object(*RESOURCE, "resourceslices", body)
        slices.append(body["metadata"]["name"])
    try:
        yield uuids
    finally:
        for name in slices:
            custom.delete_cluster_custom_object(*RESOURCE, "resourceslices", name)


# -- helpers ----------------------------------------------------------------------------------


def _finetunejob(
    api: client.ApiClient, namespace: str, name: str, run_for: str = "10m"
) -> dict[str, Any]:
    """A FineTuneJob with a trainer template whose pods run for `run_for` (kwok)."""
    trainer = {
        "name": "trainer",
        "image": "registry.invalid/trainer:never-pulled",
        "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
    }
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "FineTuneJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"preset": "llama-3.1-8b"},
            "method": "QLoRA",
            "lora": {"rank": 16},
            "template": {
                "metadata": {"annotations": {RUN_FOR_ANNOTATION: run_for}},
                "spec": {"containers": [trainer]},
            },
        },
    }
    created = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "finetunejobs", body
    )
    return dict(created)


def _admission(
    mode: GpuMode, uuids: dict[str, list[str]], chosen: dict[str, list[int]]
) -> Admission:
    nodes = tuple(
        NodeGpus(node, tuple(indices), tuple(uuids[node][i] for i in indices))
        for node, indices in chosen.items()
    )
    return Admission(nodes=nodes, per_gpu_bytes=12 * GIB, mode=mode)


def _create(api: client.ApiClient, namespace: str, objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        kind = obj["kind"]
        if kind == "Job":
            client.BatchV1Api(api).create_namespaced_job(namespace, obj)
        elif kind == "Service":
            client.CoreV1Api(api).create_namespaced_service(namespace, obj)
        else:
            plural = {
                "ResourceClaim": "resourceclaims",
                "ResourceClaimTemplate": "resourceclaimtemplates",
            }[kind]
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                *RESOURCE, namespace, plural, obj
            )


def _pods(api: client.ApiClient, namespace: str, label: str) -> list[dict[str, Any]]:
    pods = (
        client.CoreV1Api(api)
        .list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}={label}")
        .items
    )
    return [api.sanitize_for_serialization(pod) for pod in pods]


def _running_pods(api: client.ApiClient, namespace: str, job_name: str, count: int) -> Any:
    def running() -> list[dict[str, Any]] | None:
        pods = _pods(api, namespace, job_name)
        ok = len(pods) == count and all(p["status"].get("phase") == "Running" for p in pods)
        return pods if ok else None

    return wait_until(running, timeout=90, what=f"{count} running pod(s) of {job_name}")


def _claim(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return dict(
        client.CustomObjectsApi(api).get_namespaced_custom_object(
            *RESOURCE, namespace, "resourceclaims", name
        )
    )


def _allocated(claim: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    """(request, driver, pool, device) of each device the scheduler allocated."""
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {})
    return {(r["request"], r["driver"], r["pool"], r["device"]) for r in results.get("results", [])}


def _job(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    job = client.BatchV1Api(api).read_namespaced_job(name, namespace)
    return dict(api.sanitize_for_serialization(job))


def _gone(read: Any) -> bool:
    try:
        read()
    except ApiException as error:
        return error.status == 404
    return False


# -- tests ------------------------------------------------------------------------------------


def test_the_apiserver_serves_dra_as_resource_k8s_io_v1(api_client: client.ApiClient) -> None:
    groups = client.ApisApi(api_client).get_api_versions().groups
    (resource,) = [group for group in groups if group.name == "resource.k8s.io"]
    assert "resource.k8s.io/v1" in [v.group_version for v in resource.versions]


def test_a_dra_claim_gets_exactly_the_chosen_gpus_and_the_pod_their_node(
    api_client: client.ApiClient,
    crds: None,
    gpu_uuids: dict[str, list[str]],
    namespace: str,
) -> None:
    node = sorted(gpu_uuids)[1]
    job = _finetunejob(api_client, namespace, "dra-one")
    admission = _admission(GpuMode.DRA, gpu_uuids, {node: [5, 2]})
    objects = build_workload(job, admission)
    assert [o["kind"] for o in objects] == ["ResourceClaim", "Job"]
    _create(api_client, namespace, objects)

    (pod,) = _running_pods(api_client, namespace, "dra-one", 1)
    assert pod["spec"]["nodeName"] == node
    claim = _claim(api_client, namespace, objects[0]["metadata"]["name"])
    assert _allocated(claim) == {("gpus", DRIVER, node, "gpu-2"), ("gpus", DRIVER, node, "gpu-5")}
    assert [r["name"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["name"]]
    assert GPU_RESOURCE not in pod["spec"]["containers"][0]["resources"].get("limits", {})

    state = workload_state(_job(api_client, namespace, "dra-one"), [pod])
    assert (state.phase, state.message) == (Phase.RUNNING, f"1 of 1 pods running on {node}")


def test_a_dra_job_across_two_nodes_gets_each_nodes_chosen_gpus(
    api_client: client.ApiClient,
    crds: None,
    gpu_uuids: dict[str, list[str]],
    namespace: str,
) -> None:
    first, second = sorted(gpu_uuids)
    chosen = {first: [1, 6], second: [4, 3]}
    job = _finetunejob(api_client, namespace, "dra-two")
    objects = build_workload(job, _admission(GpuMode.DRA, gpu_uuids, chosen))
    assert [o["kind"] for o in objects] == ["ResourceClaimTemplate", "Service", "Job"]
    _create(api_client, namespace, objects)

    pods = _running_pods(api_client, namespace, "dra-two", 2)
    by_node = {pod["spec"]["nodeName"]: pod for pod in pods}
    assert set(by_node) == {first, second}
    for node, indices in chosen.items():
        pod = by_node[node]
        (status,) = pod["status"]["resourceClaimStatuses"]
        allocated = _allocated(_claim(api_client, namespace, status["resourceClaimName"]))
        assert allocated == {("gpus", DRIVER, node, f"gpu-{i}") for i in indices}
        rank = pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (f"dra-two-{rank}", "dra-two")
    service = client.CoreV1Api(api_client).read_namespaced_service("dra-two", namespace)
    assert service.spec.cluster_ip == "None"


def test_a_device_plugin_job_lands_on_the_chosen_node_with_the_admitted_count(
    api_client: client.ApiClient,
    crds: None,
    gpu_uuids: dict[str, list[str]],
    namespace: str,
) -> None:
    node = sorted(gpu_uuids)[0]
    job = _finetunejob(api_client, namespace, "plugin")
    objects = build_workload(job, _admission(GpuMode.DEVICE_PLUGIN, gpu_uuids, {node: [0, 1, 2]}))
    assert [o["kind"] for o in objects] == ["Job"]
    _create(api_client, namespace, objects)

    (pod,) = _running_pods(api_client, namespace, "plugin", 1)
    assert pod["spec"]["nodeName"] == node
    assert pod["spec"]["containers"][0]["resources"]["limits"][GPU_RESOURCE] == "3"


def test_a_finished_workload_reads_as_succeeded_from_the_real_job_and_pods(
    api_client: client.ApiClient,
    crds: None,
    gpu_uuids: dict[str, list[str]],
    namespace: str,
) -> None:
    node = sorted(gpu_uuids)[1]
    job = _finetunejob(api_client, namespace, "done", run_for="0s")
    _create(
        api_client,
        namespace,
        build_workload(job, _admission(GpuMode.DEVICE_PLUGIN, gpu_uuids, {node: [6]})),
    )

    def finished() -> Any:
        state = workload_state(
            _job(api_client, namespace, "done"), _pods(api_client, namespace, "done")
        )
        return state if state.phase is Phase.SUCCEEDED else None

    state = wait_until(finished, timeout=90, what="the workload of done to succeed")
    assert state.message == "Job done completed: 1 of 1 pods succeeded"


def test_deleting_the_finetunejob_collects_its_workload(
    api_client: client.ApiClient,
    crds: None,
    gpu_uuids: dict[str, list[str]],
    namespace: str,
) -> None:
    node = sorted(gpu_uuids)[0]
    long_name = "x" * 70
    job = _finetunejob(api_client, namespace, long_name)
    objects = build_workload(job, _admission(GpuMode.DRA, gpu_uuids, {node: [7]}))
    _create(api_client, namespace, objects)
    name = workload_name(long_name)
    label = job_label_value(long_name)
    wait_until(lambda: _pods(api_client, namespace, label), timeout=60, what=f"a pod of {name}")

    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "finetunejobs", long_name
    )
    batch = client.BatchV1Api(api_client)
    wait_until(
        lambda: _gone(lambda: batch.read_namespaced_job(name, namespace)),
        timeout=60,
        what=f"the garbage collector to delete Job {name}",
    )
    wait_until(
        lambda: _gone(lambda: _claim(api_client, namespace, f"{name}-gpus")),
        timeout=60,
        what=f"the garbage collector to delete ResourceClaim {name}-gpus",
    )


# -- the operator in --gpu-mode dra -----------------------------------------------------------
#
# `vramgate operator --gpu-mode dra` decides, writes status.placement and creates the claim;
# the kube-scheduler allocates it. The ResourceSlices carry the GPUNodes' UUIDs under device
# names that are NOT `gpu-<index>` (device gpu-<n-1-i> is GPU i), as a driver's minor numbers
# need not follow NVML's indices: a claim that picked devices by index or by name instead of
# by the placement's UUIDs gets other devices and fails these tests.

OPERATOR_LEASE = "vramgate-dra-tests"
OPERATOR_WEBHOOK_CONFIG = "vramgate-dra.vramgate.dev"


def _ensure_device_class(api: client.ApiClient) -> None:
    device_class = {
        "apiVersion": "/".join(RESOURCE),
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }
    try:
        client.CustomObjectsApi(api).create_cluster_custom_object(
            *RESOURCE, "deviceclasses", device_class
        )
    except ApiException as error:
        if error.status != 409:  # another module's (or fixture's) identical class
            raise


@pytest.fixture(scope="module")
def dra_operator(
    cluster: Cluster,
    api_client: client.ApiClient,
    crds: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    _ensure_device_class(api_client)
    with operator_in_mode(cluster, api_client, tmp_path_factory.mktemp("dra-operator"),
                          "dra", OPERATOR_LEASE, OPERATOR_WEBHOOK_CONFIG) as process:  # fmt: skip
        yield process


@pytest.fixture
def dra_gpus(cluster: Cluster, api_client: client.ApiClient) -> Iterator[Gpus]:
    with gpus_of_this_test(cluster, api_client) as made:
        yield made


@pytest.fixture
def slices(api_client: client.ApiClient) -> Iterator[Any]:
    """Publishes, for each node given, the ResourceSlice the NVIDIA DRA driver would, with
    the UUIDs of its GPUNode; returns device name -> UUID. Deleted after the test."""
    custom = client.CustomObjectsApi(api_client)
    made: list[str] = []

    def publish(gpus: Gpus, nodes: list[str]) -> dict[str, str]:
        by_name = {}
        for node in nodes:
            frees, _total = gpus.published[node]
            count = len(frees)
            devices = []
            for i in range(count):
                name, gpu_uuid = f"gpu-{count - 1 - i}", f"GPU-{node}-{i}"  # as the GPUNode
                by_name[f"{node}/{name}"] = gpu_uuid
                devices.append({
                    "name": name,
                    "attributes": {"type": {"string": "gpu"}, "uuid": {"string": gpu_uuid},
                                   "productName": {"string": gpus.product}},
                    "capacity": {"memory": {"value": "80Gi"}},
                })  # fmt: skip
            body = {
                "apiVersion": "/".join(RESOURCE),
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-{DRIVER}"},
                "spec": {"driver": DRIVER, "nodeName": node, "devices": devices,
                         "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
            }  # fmt: skip
            custom.create_cluster_custom_object(*RESOURCE, "resourceslices", body)
            made.append(body["metadata"]["name"])
        return by_name

    yield publish
    for name in made:
        try:
            custom.delete_cluster_custom_object(*RESOURCE, "resourceslices", name)
        except ApiException as error:
            if error.status != 404:
                raise


def test_the_operator_in_dra_mode_claims_exactly_the_best_fitting_gpu(
    dra_operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    dra_gpus: Gpus,
    slices: Any,
) -> None:
    first, second = dra_gpus.add([80, 40, 60, 50], [30, 10, 13, 70])
    by_name = slices(dra_gpus, [first, second])
    wait_seen(dra_gpus, [first, second])
    create(api_client, namespace, job("dra-fit", dra_gpus))
    obj = admitted(api_client, namespace, "dra-fit", "True", "Fits")
    # 13 GiB free is the least that holds 11.64 GiB: GPU 2 of the second node (10 does not).
    assert placed(obj) == [(second, [2])]
    assert uuids_of(obj) == [f"GPU-{second}-2"]
    assert obj["status"]["placement"]["perGpuBytes"] == QLORA_BYTES

    claim = wait_until(lambda: _claim_or_none(api_client, namespace, "dra-fit-gpus"),
                       timeout=DEADLINE_S, what="the ResourceClaim dra-fit-gpus")  # fmt: skip
    assert claim["metadata"]["ownerReferences"][0]["kind"] == "FineTuneJob"
    (pod,) = _running_pods(api_client, namespace, "dra-fit", 1)
    assert pod["spec"]["nodeName"] == second
    trainer = pod["spec"]["containers"][0]
    assert GPU_RESOURCE not in (trainer["resources"].get("limits") or {})
    assert trainer["resources"]["claims"] == [{"name": "gpus"}]
    assert pod["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimName": "dra-fit-gpus"}]

    claim = _claim(api_client, namespace, "dra-fit-gpus")
    allocated = _allocated(claim)
    assert {(request, driver, pool) for request, driver, pool, _ in allocated} == {
        ("gpus", DRIVER, second)}  # fmt: skip
    assert [by_name[f"{second}/{device}"] for *_, device in allocated] == uuids_of(obj)
    assert [r["name"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["name"]]


def test_the_operator_in_dra_mode_runs_fsdp_on_two_nodes_with_a_claim_per_pod(
    dra_operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    dra_gpus: Gpus,
    slices: Any,
) -> None:
    first, second = dra_gpus.add([80, 10, 80, 5], [5, 80, 10, 80])
    by_name = slices(dra_gpus, [first, second])
    wait_seen(dra_gpus, [first, second])
    create(api_client, namespace, job("dra-spread", dra_gpus, **FULL, resources={"gpus": 4}))
    obj = admitted(api_client, namespace, "dra-spread", "True", "Fits")
    # 23.76 GiB per GPU on 4 with FSDP: only the 80 GiB GPUs hold it, two on each node.
    assert placed(obj) == [(first, [0, 2]), (second, [1, 3])]
    wanted = {part["node"]: set(part["gpuUUIDs"]) for part in obj["status"]["placement"]["nodes"]}
    assert wanted == {first: {f"GPU-{first}-0", f"GPU-{first}-2"},
                      second: {f"GPU-{second}-1", f"GPU-{second}-3"}}  # fmt: skip

    template = wait_until(
        lambda: _claim_template_or_none(api_client, namespace, "dra-spread-gpus"),
        timeout=DEADLINE_S, what="the ResourceClaimTemplate dra-spread-gpus",
    )  # fmt: skip
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["count"] == 2
    pods = _running_pods(api_client, namespace, "dra-spread", 2)
    by_node = {pod["spec"]["nodeName"]: pod for pod in pods}
    assert set(by_node) == {first, second}
    for node, uuids in wanted.items():
        (status,) = by_node[node]["status"]["resourceClaimStatuses"]
        allocated = _allocated(_claim(api_client, namespace, status["resourceClaimName"]))
        assert {pool for _, _, pool, _ in allocated} == {node}
        assert {by_name[f"{node}/{device}"] for *_, device in allocated} == uuids
        assert len(allocated) == 2
    service = client.CoreV1Api(api_client).read_namespaced_service("dra-spread", namespace)
    assert service.spec.cluster_ip == "None"


def _claim_or_none(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return _claim(api, namespace, name)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def _claim_template_or_none(
    api: client.ApiClient, namespace: str, name: str
) -> dict[str, Any] | None:
    try:
        return dict(
            client.CustomObjectsApi(api).get_namespaced_custom_object(
                *RESOURCE, namespace, "resourceclaimtemplates", name
            )
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise
