"""The node agent against the real control plane: it creates and keeps a simulated node's
GPUNode, publishes MIG devices, unified-memory parts and per-pod usage through the generated
CRD, reports a failing backend in Ready, shares the status with the operator through
server-side apply, and its GPUNode is garbage-collected with the Node."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from controller.agent.loop import Agent, LoopTiming
from controller.agent.metrics import AgentMetrics, agent_registry
from controller.agent.pods import PodResolver
from controller.agent.publisher import FIELD_MANAGER, GpuNodePublisher
from controller.agent.static import StaticBackend
from controller.api.base import API_VERSION, GROUP, VERSION
from controller.api.conditions import (
    READY,
    REASON_AGENT_STOPPED,
    REASON_BACKEND_FAILED,
    REASON_GPUS_READ,
)
from controller.api.gpunode import PLURAL
from controller.base.clock import SystemClock
from e2e.cluster import Cluster
from e2e.wait import wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "charts" / "vramgate" / "crds" / "gpunodes.vramgate.dev.yaml"
GIB = 2**30
MIB = 2**20
FAST = LoopTiming(
    poll_interval_s=0.2,
    heartbeat_interval_s=1.0,
    change_threshold_bytes=256 * MIB,
    backoff_initial_s=0.2,
    backoff_max_s=1.0,
)


GPU_UUID = "GPU-00000000-0000-4000-8000-{:012d}"


def gpus_yaml(used_gib: list[int]) -> str:
    gpus = [
        {
            "index": i,
            "uuid": GPU_UUID.format(i),
            "product": "NVIDIA H100 80GB HBM3",
            "totalBytes": "81559MiB",
            "usedBytes": f"{used}GiB",
            "driverReservedBytes": "475MiB",
        }
        for i, used in enumerate(used_gib)
    ]
    return yaml.safe_dump({"gpus": gpus})


@pytest.fixture(scope="module")
def gpunode_crd(cluster: Cluster, api_client: client.ApiClient) -> None:
    """The generated GPUNode CRD, installed and established."""
    applied = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    assert applied.returncode == 0, applied.stderr
    waited = cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "crd/gpunodes.vramgate.dev"
    )
    assert waited.returncode == 0, waited.stderr


@pytest.fixture
def node(cluster: Cluster, api_client: client.ApiClient, gpunode_crd: None) -> Iterator[str]:
    """A fresh simulated GPU node of this test's own, removed with its GPUNode afterwards so
    that later tests see only their own GPUs."""
    (name,) = cluster.create_gpu_nodes(1, name_prefix=f"agent-{uuid.uuid4().hex[:6]}")
    yield name
    for delete in (
        lambda: client.CustomObjectsApi(api_client).delete_cluster_custom_object(
            GROUP, VERSION, PLURAL, name
        ),
        lambda: client.CoreV1Api(api_client).delete_node(name),
    ):
        try:
            delete()
        except ApiException as error:
            if error.status != 404:
                raise


@pytest.fixture
def agent_client(cluster: Cluster) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        yield api
    finally:
        api.close()


class RunningAgent:
    def __init__(self, agent: Agent, metrics: AgentMetrics) -> None:
        self.agent = agent
        self.metrics = metrics
        self.stop = threading.Event()
        self.thread = threading.Thread(target=agent.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


@pytest.fixture
def run_agent(agent_client: client.ApiClient, tmp_path: Path) -> Iterator[Any]:
    """Starts the agent (static backend) in a thread; stops it after the test.

    Processes are mapped to pods under ``proc_root`` (an empty folder unless given), never
    under this machine's own /proc, whose PIDs are not the static file's."""
    running: list[RunningAgent] = []

    def start(node_name: str, static_file: Path, proc_root: Path | None = None) -> RunningAgent:
        if proc_root is None:
            proc_root = tmp_path / "no-proc"
            proc_root.mkdir(exist_ok=True)
        backend = StaticBackend(static_file)
        metrics = AgentMetrics(node_name, backend.name)
        agent = Agent(
            backend,
            PodResolver(proc_root),
            GpuNodePublisher(agent_client, node_name),
            metrics,
            FAST,
            SystemClock(),
        )
        running.append(RunningAgent(agent, metrics))
        return running[-1]

    yield start
    for agent in running:
        agent.close()


def find_gpunode(api: client.ApiClient, name: str) -> dict[str, Any] | None:
    try:
        obj = client.CustomObjectsApi(api).get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return cast(dict[str, Any], obj)


def gpunode(api: client.ApiClient, name: str) -> dict[str, Any]:
    obj = find_gpunode(api, name)
    assert obj is not None, f"GPUNode {name} does not exist"
    return obj


def ready(obj: dict[str, Any] | None) -> dict[str, Any]:
    """The Ready condition, or {} when there is none (yet)."""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == READY), {})


def wait_ready(api: client.ApiClient, name: str, status: str, what: str) -> dict[str, Any]:
    """Wait for Ready=<status> on the GPUNode; returns the condition."""

    def condition() -> dict[str, Any]:
        found = ready(find_gpunode(api, name))
        return found if found.get("status") == status else {}

    return wait_until(condition, timeout=30, what=what)


def test_agent_creates_and_updates_the_gpunode_and_the_heartbeat_advances(
    api_client: client.ApiClient, node: str, run_agent: Any, tmp_path: Path
) -> None:
    static = tmp_path / "gpus.yaml"
    static.write_text(gpus_yaml([0] * 8))
    run_agent(node, static)

    cond = wait_ready(api_client, node, "True", f"GPUNode {node} with Ready=True")
    obj = gpunode(api_client, node)
    owner = client.CoreV1Api(api_client).read_node(node).metadata
    assert owner is not None
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": node, "uid": owner.uid}
    ]
    assert obj["spec"] == {"nodeName": node}
    status = obj["status"]
    assert status["gpuCount"] == 8
    assert status["product"] == "NVIDIA H100 80GB HBM3"
    assert status["gpus"][3]["totalBytes"] == 81559 * MIB
    assert status["gpus"][3]["freeBytes"] == (81559 - 475) * MIB
    assert status["gpus"][3]["driverReservedBytes"] == 475 * MIB
    assert "reservedBytes" not in status["gpus"][3]  # the operator's field, not the driver's
    assert cond["reason"] == REASON_GPUS_READ
    assert cond["message"] == "read 8 GPU(s) through static"

    static.write_text(gpus_yaml([0, 0, 0, 40, 0, 0, 0, 0]))
    wait_until(
        lambda: gpunode(api_client, node)["status"]["gpus"][3]["usedBytes"] == 40 * GIB,
        timeout=10,
        what="the 40 GiB used on GPU 3 to reach the GPUNode",
    )

    first = gpunode(api_client, node)["status"]["heartbeatTime"]
    wait_until(
        lambda: gpunode(api_client, node)["status"]["heartbeatTime"] > first,
        timeout=10,
        what="the heartbeat to advance",
    )
    assert ready(gpunode(api_client, node))["lastTransitionTime"] == cond["lastTransitionTime"]


POD_A = "0f4c4a5e-8a3a-4b7e-9a51-3c1d2e3f4a5b"
POD_B = "7d3b0a3e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
POD_C = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
GB10_UUID = "GPU-9b100000-0000-4000-8000-000000000001"
MIG_PARENT = "GPU-a1000000-0000-4000-8000-000000000002"
MIG_1 = "MIG-a1000000-0000-4000-8000-000000000021"
MIG_2 = "MIG-a1000000-0000-4000-8000-000000000022"


def mixed_yaml(pod_a_running: bool = True) -> str:
    """A whole H100 with two pods' processes and a host process, a unified-memory GB10, and an
    A100 in MIG mode, listed as its two MIG devices (both at the parent's index 2)."""
    h100_processes: list[dict[str, Any]] = [
        {"pid": 4243, "usedBytes": "3GiB", "podUID": POD_B},
        {"pid": 99, "usedBytes": "1GiB"},  # outside any pod
    ]
    if pod_a_running:  # no podUID: the agent finds it in /proc/4242/cgroup
        h100_processes.insert(0, {"pid": 4242, "usedBytes": "12GiB"})
    gpus = [
        {
            "index": 0,
            "uuid": GPU_UUID.format(0),
            "product": "NVIDIA H100 80GB HBM3",
            "totalBytes": "81559MiB",
            "usedBytes": "16GiB",
            "driverReservedBytes": "475MiB",
            "processes": h100_processes,
        },
        {
            "index": 1,
            "uuid": GB10_UUID,
            "product": "NVIDIA GB10",
            "memoryInfoSupported": False,
            "processes": [{"pid": 500, "podUID": POD_C}],
        },
        {
            "index": 2,
            "uuid": MIG_1,
            "product": "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
            "totalBytes": "20096MiB",
            "usedBytes": "5GiB",
            "driverReservedBytes": 0,
            "mig": {"parentUUID": MIG_PARENT, "gpuInstanceId": 1, "computeInstanceId": 0},
            "processes": [{"pid": 600, "podUID": POD_C}],  # MIG: no per-process bytes
        },
        {
            "index": 2,
            "uuid": MIG_2,
            "product": "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
            "totalBytes": "20096MiB",
            "usedBytes": 0,
            "mig": {"parentUUID": MIG_PARENT, "gpuInstanceId": 2},
        },
    ]
    return yaml.safe_dump({"gpus": gpus})


def test_mig_devices_unified_memory_and_pod_usage_round_trip_through_the_api_server(
    api_client: client.ApiClient, node: str, run_agent: Any, tmp_path: Path
) -> None:
    """What the API server keeps is exactly what the agent wrote: two MIG devices at one
    index (refused while gpus was keyed by index), a part without memory figures, the driver's
    reservation, and per-pod bytes, one pod mapped through its process's cgroup."""
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{POD_A.replace('-', '_')}.slice/cri-containerd-0123abcd.scope\n"
    )
    static = tmp_path / "gpus.yaml"
    static.write_text(mixed_yaml())
    run_agent(node, static, proc)

    cond = wait_ready(api_client, node, "True", f"GPUNode {node} with Ready=True")
    assert cond["message"] == "read 4 GPU(s) through static"
    status = gpunode(api_client, node)["status"]
    assert status["gpuCount"] == 4
    h100_free = (81559 - 475) * MIB - 16 * GIB
    assert status["freeBytes"] == h100_free + 2 * 20096 * MIB - 5 * GIB  # nothing from GB10
    gpus = {g["uuid"]: g for g in status["gpus"]}
    assert list(gpus) == [GPU_UUID.format(0), GB10_UUID, MIG_1, MIG_2]
    assert gpus[GPU_UUID.format(0)] == {
        "uuid": GPU_UUID.format(0),
        "index": 0,
        "product": "NVIDIA H100 80GB HBM3",
        "memoryInfoSupported": True,
        "totalBytes": 81559 * MIB,
        "freeBytes": h100_free,
        "usedBytes": 16 * GIB,
        "driverReservedBytes": 475 * MIB,
        "pods": [{"uid": POD_A, "usedBytes": 12 * GIB}, {"uid": POD_B, "usedBytes": 3 * GIB}],
    }
    assert gpus[GB10_UUID] == {
        "uuid": GB10_UUID,
        "index": 1,
        "product": "NVIDIA GB10",
        "memoryInfoSupported": False,
        "pods": [{"uid": POD_C}],
    }
    assert gpus[MIG_1] == {
        "uuid": MIG_1,
        "index": 2,
        "product": "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
        "memoryInfoSupported": True,
        "totalBytes": 20096 * MIB,
        "freeBytes": 20096 * MIB - 5 * GIB,
        "usedBytes": 5 * GIB,
        "driverReservedBytes": 0,
        "mig": {"parentUUID": MIG_PARENT, "gpuInstanceId": 1, "computeInstanceId": 0},
        "pods": [{"uid": POD_C}],
    }
    assert gpus[MIG_2]["index"] == 2
    assert gpus[MIG_2]["mig"] == {"parentUUID": MIG_PARENT, "gpuInstanceId": 2}
    assert "pods" not in gpus[MIG_2] and "driverReservedBytes" not in gpus[MIG_2]

    # The operator reserves on a MIG device; then pod A's process exits. The agent's next
    # apply drops the pod it no longer sees and leaves the operator's field alone.
    operator_patch = {
        "apiVersion": API_VERSION,
        "kind": "GPUNode",
        "metadata": {"name": node},
        "status": {"gpus": [{"uuid": MIG_2, "reservedBytes": 10 * GIB}]},
    }
    client.CustomObjectsApi(api_client).patch_cluster_custom_object_status(
        GROUP,
        VERSION,
        PLURAL,
        node,
        operator_patch,
        field_manager="vramgate-operator",
        _content_type="application/apply-patch+yaml",
    )
    static.write_text(mixed_yaml(pod_a_running=False))

    def h100_pods() -> list[dict[str, Any]]:
        h100 = next(g for g in gpunode(api_client, node)["status"]["gpus"] if g["index"] == 0)
        pods: list[dict[str, Any]] = h100.get("pods", [])
        return pods if [p["uid"] for p in pods] == [POD_B] else []

    pods = wait_until(h100_pods, timeout=10, what="pod A to leave the H100's pods")
    assert pods == [{"uid": POD_B, "usedBytes": 3 * GIB}]
    gpus = {g["uuid"]: g for g in gpunode(api_client, node)["status"]["gpus"]}
    assert gpus[MIG_2]["reservedBytes"] == 10 * GIB


def test_failing_backend_flips_ready_to_false_with_the_error_and_back(
    api_client: client.ApiClient, node: str, run_agent: Any, tmp_path: Path
) -> None:
    static = tmp_path / "gpus.yaml"
    static.write_text(gpus_yaml([1, 2]))
    run_agent(node, static)
    wait_ready(api_client, node, "True", "Ready=True")

    static.unlink()
    cond = wait_ready(api_client, node, "False", "Ready=False after the static file vanished")
    assert cond["reason"] == REASON_BACKEND_FAILED
    assert cond["message"] == f"static: cannot read {static}: No such file or directory"
    # The last readings stay, flagged stale by Ready=False.
    assert gpunode(api_client, node)["status"]["gpuCount"] == 2

    static.write_text(gpus_yaml([1, 2]))
    wait_ready(api_client, node, "True", "Ready=True once the file is back")


def test_operator_fields_survive_the_agents_writes(
    api_client: client.ApiClient, node: str, run_agent: Any, tmp_path: Path
) -> None:
    """Server-side apply: the agent changes only the fields it owns."""
    static = tmp_path / "gpus.yaml"
    static.write_text(gpus_yaml([0, 0]))
    run_agent(node, static)
    wait_ready(api_client, node, "True", "the GPUNode")
    operator_patch = {
        "apiVersion": API_VERSION,
        "kind": "GPUNode",
        "metadata": {"name": node},
        "status": {"gpus": [{"uuid": GPU_UUID.format(1), "reservedBytes": 30 * GIB}]},
    }
    client.CustomObjectsApi(api_client).patch_cluster_custom_object_status(
        GROUP,
        VERSION,
        PLURAL,
        node,
        operator_patch,
        field_manager="vramgate-operator",
        _content_type="application/apply-patch+yaml",
    )
    static.write_text(gpus_yaml([0, 20]))
    wait_until(
        lambda: gpunode(api_client, node)["status"]["gpus"][1]["usedBytes"] == 20 * GIB,
        timeout=10,
        what="the agent's next write",
    )
    gpu1 = gpunode(api_client, node)["status"]["gpus"][1]
    assert gpu1["reservedBytes"] == 30 * GIB
    managers = {m["manager"] for m in gpunode(api_client, node)["metadata"]["managedFields"]}
    assert {FIELD_MANAGER, "vramgate-operator"} <= managers


def test_deleting_the_node_garbage_collects_its_gpunode_and_the_agent_does_not_revive_it(
    api_client: client.ApiClient, node: str, run_agent: Any, tmp_path: Path
) -> None:
    static = tmp_path / "gpus.yaml"
    static.write_text(gpus_yaml([0]))
    running = run_agent(node, static)
    wait_ready(api_client, node, "True", f"GPUNode {node}")

    client.CoreV1Api(api_client).delete_node(node)
    wait_until(
        lambda: find_gpunode(api_client, node) is None,
        timeout=60,
        what=f"the garbage collector to delete GPUNode {node}",
    )
    # The agent keeps trying (Node not found) and counts its failures, but creates nothing.
    registry = agent_registry(running.metrics)

    def api_errors() -> float:
        return registry.get_sample_value("vramgate_agent_api_errors_total", {"node": node}) or 0

    wait_until(lambda: api_errors() >= 2, timeout=15, what="the agent to retry its write")
    assert find_gpunode(api_client, node) is None


#: The agent's start line, with the port its metrics server bound (--metrics-port 0).
METRICS_AT = re.compile(r"metrics on 127\.0\.0\.1:(\d+),")


def test_vramgate_agent_command_publishes_serves_metrics_and_marks_ready_false_on_sigterm(
    cluster: Cluster, api_client: client.ApiClient, node: str, tmp_path: Path
) -> None:
    """The real command: its GPUNode, its metrics on the port it bound (port 0, read back
    from its log: a port chosen free beforehand may be taken by then), and on SIGTERM the
    GPUNode's Ready turns False at once (AgentStopped), not when the heartbeat goes stale."""
    static = tmp_path / "gpus.yaml"
    static.write_text(gpus_yaml([0, 8]))
    env = {**os.environ, "VRAMGATE_AGENT_POLL_INTERVAL_SECONDS": "0.5"}
    argv = [sys.executable, "-m", "controller.cli", "agent", "--node-name", node,
            "--backend", "static", "--static-file", str(static),
            "--kubeconfig", str(cluster.kubeconfig),
            "--metrics-address", "127.0.0.1", "--metrics-port", "0",
            "--heartbeat-interval-seconds", "2"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(proc.stderr or ()), daemon=True)
    reader.start()
    try:
        wait_ready(api_client, node, "True", "the GPUNode written by `vramgate agent`")
        port = int(
            wait_until(
                lambda: next((m[1] for line in said if (m := METRICS_AT.search(line))), None),
                timeout=10,
                what="the agent to log its metrics port",
            )
        )

        def scrape() -> dict[str, float]:
            url = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
            return {
                f"{s.name}{{{s.labels.get('gpu', '')}}}": s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }

        samples = scrape()
        assert samples["vramgate_gpu_memory_used_bytes{1}"] == 8 * GIB
        assert samples["vramgate_gpu_memory_total_bytes{0}"] == 81559 * MIB
        assert samples["vramgate_agent_scrape_errors_total{}"] == 0
        assert samples["vramgate_agent_last_successful_read_timestamp_seconds{}"] > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        reader.join(timeout=5)
    stderr = "".join(said)
    assert proc.returncode == 0, stderr
    assert "received SIGTERM, stopping" in stderr
    # Written before it exited: no waiting for a heartbeat TTL.
    stopped = ready(gpunode(api_client, node))
    assert (stopped["status"], stopped["reason"]) == ("False", REASON_AGENT_STOPPED), stopped
    assert "the node agent stopped" in stopped["message"]
    assert gpunode(api_client, node)["status"]["gpuCount"] == 2  # its last readings stay
