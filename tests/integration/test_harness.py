"""The local control plane behaves like a real cluster in the ways vramgate relies on.

Each test checks one component doing its real job: the API server answering, the
controller manager creating ServiceAccounts, running Jobs and collecting garbage, the
scheduler placing GPU pods, kwok running them, and kubectl speaking OpenAPI to the server.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

import e2e.cluster
import e2e.procs
from e2e.cluster import Cluster
from e2e.nodes import GPU_RESOURCE, RUN_FOR_ANNOTATION
from e2e.wait import wait_until

pytestmark = pytest.mark.integration


def test_apiserver_is_ready(cluster: Cluster) -> None:
    assert "readyz check passed" in cluster.readyz()
    assert cluster.server.startswith("https://127.0.0.1:")


def test_controller_manager_created_the_default_service_account(
    api_client: client.ApiClient,
) -> None:
    account = client.CoreV1Api(api_client).read_namespaced_service_account("default", "default")
    assert account.metadata.name == "default"


def test_simulated_gpu_nodes_carry_gpu_capacity_and_labels(
    api_client: client.ApiClient, gpu_nodes: list[str]
) -> None:
    core = client.CoreV1Api(api_client)
    for name in gpu_nodes:
        node = core.read_node(name)
        assert node.status.capacity[GPU_RESOURCE] == "8"
        assert node.status.allocatable[GPU_RESOURCE] == "8"
        assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert node.metadata.labels["nvidia.com/gpu.memory"] == "81559"
        assert node.metadata.labels["nvidia.com/gpu.count"] == "8"
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True"


def _gpu_job(name: str, annotations: dict[str, str] | None = None) -> dict[str, object]:
    container = {
        "name": "train",
        "image": "registry.invalid/train:never-pulled",
        "resources": {"limits": {GPU_RESOURCE: "1"}},
    }
    template = {
        "metadata": {"annotations": annotations or {}},
        "spec": {"restartPolicy": "Never", "containers": [container]},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": template},
    }


def _job_pod_phase(core: client.CoreV1Api, namespace: str, job: str) -> str:
    pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
    return str(pods[0].status.phase) if pods else ""


def test_gpu_job_is_scheduled_onto_a_gpu_node_and_completes(
    api_client: client.ApiClient, gpu_nodes: list[str], namespace: str
) -> None:
    batch = client.BatchV1Api(api_client)
    core = client.CoreV1Api(api_client)
    batch.create_namespaced_job(namespace, _gpu_job("gpu-job"))

    def succeeded() -> int:
        return int(batch.read_namespaced_job("gpu-job", namespace).status.succeeded or 0)

    assert wait_until(succeeded, timeout=60, what="Job gpu-job to succeed") == 1

    pods = core.list_namespaced_pod(namespace, label_selector="job-name=gpu-job").items
    assert len(pods) == 1
    assert pods[0].spec.node_name in gpu_nodes
    assert pods[0].status.phase == "Succeeded"


def test_annotated_job_pod_keeps_running_for_its_delay(
    api_client: client.ApiClient, gpu_nodes: list[str], namespace: str
) -> None:
    batch = client.BatchV1Api(api_client)
    core = client.CoreV1Api(api_client)
    batch.create_namespaced_job(namespace, _gpu_job("long", {RUN_FOR_ANNOTATION: "3s"}))

    wait_until(
        lambda: _job_pod_phase(core, namespace, "long") == "Running",
        timeout=60,
        what="the pod of Job long to run",
    )
    running_since = time.monotonic()
    wait_until(
        lambda: _job_pod_phase(core, namespace, "long") == "Succeeded",
        timeout=60,
        what="the pod of Job long to succeed",
    )
    # Generous lower bound: kwok counts the delay from its own observation of Running.
    assert time.monotonic() - running_since >= 1.5


def test_deleting_an_owner_garbage_collects_its_dependent(
    api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner.metadata.uid,
    }
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "dependent", "ownerReferences": [reference]}}
    )
    core.delete_namespaced_config_map("owner", namespace)

    def dependent_gone() -> bool:
        try:
            core.read_namespaced_config_map("dependent", namespace)
        except ApiException as err:
            return err.status == 404
        return False

    wait_until(dependent_gone, timeout=60, what="the garbage collector to delete 'dependent'")


DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: web}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      containers:
      - name: web
        image: registry.invalid/web:never-pulled
"""


def test_kubectl_apply_validates_and_patches_with_openapi(
    cluster: Cluster, api_client: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    manifest = tmp_path / "deployment.yaml"
    for replicas in (1, 3):
        manifest.write_text(DEPLOYMENT.format(replicas=replicas))
        # --validate=strict checks fields against the server's OpenAPI schema, and the
        # second apply computes its strategic-merge patch from that schema.
        result = cluster.kubectl("apply", "--validate=strict", "-n", namespace, "-f", str(manifest))
        assert result.returncode == 0, result.stderr
    deployment = client.AppsV1Api(api_client).read_namespaced_deployment("web", namespace)
    assert deployment.spec.replicas == 3

    manifest.write_text(DEPLOYMENT.format(replicas=1).replace("replicas:", "replicaz:"))
    rejected = cluster.kubectl("apply", "--validate=strict", "-n", namespace, "-f", str(manifest))
    assert rejected.returncode != 0
    assert "replicaz" in rejected.stderr


def test_helm_reaches_the_cluster(cluster: Cluster) -> None:
    result = cluster.helm("list", "--all-namespaces")
    assert result.returncode == 0, result.stderr


def test_a_port_taken_before_its_component_binds_it_starts_the_control_plane_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """etcd and the Kubernetes components cannot bind port 0 and say which port they got:
    ports are chosen free, and another program may take one before it is bound (another
    test run on the machine). Such a start is tried again on other ports."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        chosen: list[list[int]] = []

        def first_taken(count: int) -> list[int]:
            ports = e2e.procs.free_ports(count)
            if not chosen:
                ports[0] = held.getsockname()[1]  # etcd's client port, taken meanwhile
            chosen.append(ports)
            return ports

        monkeypatch.setattr(e2e.cluster, "free_ports", first_taken)
        said: list[str] = []
        cluster = Cluster(tmp_path / "cluster", log=said.append, die_with_parent=True)
        try:
            cluster.start()
            assert "readyz check passed" in cluster.readyz()
        finally:
            cluster.stop()
    assert len(chosen) == 2
    assert any("etcd exited during startup" in line and "starting again" in line
               for line in said), said  # fmt: skip
