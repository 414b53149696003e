"""GPUNodes for simulated nodes, written as the node agent writes them.

The agent's own round trip through the API server is tested in test_agent.py; here tests need
GPUs with chosen free memory on kwok nodes, and to change them (a job's pod using memory, an
agent going silent) at a moment of their choosing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from controller.api.base import GROUP, VERSION

GIB = 2**30
PLURAL = "gpunodes"


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpu_status(
    node: str,
    index: int,
    total_gib: float,
    free_gib: float | None = None,
    product: str = "NVIDIA-H100-80GB-HBM3",
    pods: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    total = int(total_gib * GIB)
    free = total if free_gib is None else int(free_gib * GIB)
    return {
        "uuid": f"GPU-{node}-{index}",
        "index": index,
        "product": product,
        "memoryInfoSupported": True,
        "totalBytes": total,
        "freeBytes": free,
        "usedBytes": total - free,
        "pods": [{"uid": uid, "usedBytes": int(b * GIB)} for uid, b in (pods or {}).items()],
    }


def publish(
    api: client.ApiClient,
    node: str,
    gpus: Sequence[Mapping[str, Any]],
    *,
    ready: bool = True,
    heartbeat: datetime | None = None,
) -> None:
    """Create or update the GPUNode of `node` with these GPUs, Ready and fresh by default."""
    objects = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    uid = core.read_node(node).metadata.uid
    beat = heartbeat or datetime.now(UTC) - timedelta(seconds=1)
    status = {
        "gpus": [dict(g) for g in gpus],
        "gpuCount": len(gpus),
        "heartbeatTime": rfc3339(beat),
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "reason": "GPUsRead" if ready else "BackendFailed",
                "message": "published by the test",
                "lastTransitionTime": rfc3339(beat),
            }
        ],
    }
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUNode",
        "metadata": {
            "name": node,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}],
        },
        "spec": {"nodeName": node},
    }
    try:
        objects.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    except ApiException as error:
        if error.status != 409:
            raise
    objects.patch_cluster_custom_object_status(GROUP, VERSION, PLURAL, node, {"status": status})


def h100s(
    node: str, count: int = 8, free_gib: Sequence[float] | None = None
) -> list[dict[str, Any]]:
    """`count` 80 GiB GPUs, with the given free memory each (default all free)."""
    frees = list(free_gib) if free_gib is not None else [None] * count
    return [gpu_status(node, i, 80, frees[i]) for i in range(count)]
