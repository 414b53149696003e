"""Simulated GPU nodes: real Node objects whose status kwok keeps alive.

Why Node objects with status set at creation: the API server keeps a new Node's status (the
kubelet registers the same way), kwok's node-initialize stage preserves the given capacity
and allocatable, so the real scheduler counts ``nvidia.com/gpu`` as on a GPU node with the
NVIDIA device plugin. The ``nvidia.com/gpu.*`` labels are those GPU feature discovery sets.
"""

from __future__ import annotations

from pathlib import Path

from kubernetes import client, config

from e2e.components import FAKE_NODE_ANNOTATION, FAKE_NODE_ANNOTATION_VALUE
from e2e.wait import wait_until

GPU_RESOURCE = "nvidia.com/gpu"
# Pod annotation read by e2e/kwok-stages.yaml: how long a Job's pod runs before it
# succeeds ("30s", "24h"); without it the pod succeeds as soon as it is Running.
RUN_FOR_ANNOTATION = "pod-complete.stage.kwok.x-k8s.io/delay"
# Taints the API server and node lifecycle controller put on a node until it is Ready.
STARTUP_TAINT_PREFIX = "node.kubernetes.io/"


def gpu_node(name: str, gpus_per_node: int, product: str, memory_mib: int) -> client.V1Node:
    resources = {"cpu": "96", "memory": "1Ti", "pods": "110", GPU_RESOURCE: str(gpus_per_node)}
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(memory_mib),
        "nvidia.com/gpu.count": str(gpus_per_node),
    }
    return client.V1Node(
        metadata=client.V1ObjectMeta(
            name=name,
            annotations={FAKE_NODE_ANNOTATION: FAKE_NODE_ANNOTATION_VALUE},
            labels=labels,
        ),
        status=client.V1NodeStatus(capacity=resources, allocatable=dict(resources)),
    )


def _schedulable(node: client.V1Node) -> bool:
    conditions = (node.status.conditions if node.status else None) or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    taints = (node.spec.taints if node.spec else None) or []
    return ready and not any(t.key.startswith(STARTUP_TAINT_PREFIX) for t in taints)


def create_gpu_nodes(
    kubeconfig: Path,
    count: int,
    *,
    gpus_per_node: int = 8,
    product: str = "NVIDIA-H100-80GB-HBM3",
    memory_mib: int = 81559,
    name_prefix: str = "gpu-node",
    timeout: float = 60.0,
) -> list[str]:
    """Create ``count`` nodes named ``<prefix>-<i>``; return once all are schedulable."""
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        core = client.CoreV1Api(api_client)
        names = [f"{name_prefix}-{i}" for i in range(count)]
        for name in names:
            core.create_node(gpu_node(name, gpus_per_node, product, memory_mib))

        def all_schedulable() -> bool:
            # One LIST per poll rather than a GET per node: callers create thousands.
            ready = {
                n.metadata.name for n in core.list_node().items if n.metadata and _schedulable(n)
            }
            return ready.issuperset(names)

        wait_until(
            all_schedulable,
            timeout=timeout,
            interval=0.2,
            what=f"{count} {name_prefix}-* nodes to be Ready and untainted "
            "(kwok.log in the state dir says why not)",
        )
        return names
    finally:
        api_client.close()
