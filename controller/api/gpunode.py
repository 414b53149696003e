"""GPUNode (vramgate.dev/v1alpha1, cluster-scoped): the measured GPUs of one node.

The node agent writes one per node, named after the node and owned by it, with what NVML
reads: per GPU its index, UUID, product and total / free / used bytes, plus a heartbeat.
Free memory changes by the second, so it lives here and not in Node annotations, which every
Node watcher in the cluster would receive on each update.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from controller.api.base import ApiModel
from controller.api.conditions import Condition

KIND = "GPUNode"
PLURAL = "gpunodes"
SINGULAR = "gpunode"
SHORT_NAMES = ("gpun",)


class GPUNodeSpec(ApiModel):
    node_name: str | None = Field(
        None,
        max_length=253,
        description="nodeName is the Node these GPUs belong to; the object's name when omitted.",
    )


class GPUStatus(ApiModel):
    index: int = Field(ge=0, description="index is the GPU's NVML index on the node.")
    uuid: str = Field(description="uuid is the GPU's UUID (GPU-...), stable across reboots.")
    product: str = Field(description="product is the GPU's product name, e.g. NVIDIA H100.")
    total_bytes: int = Field(ge=0, description="totalBytes is the GPU's memory, in bytes.")
    free_bytes: int = Field(ge=0, description="freeBytes is the memory NVML reports free.")
    used_bytes: int = Field(ge=0, description="usedBytes is the memory NVML reports used.")
    reserved_bytes: int | None = Field(
        None,
        ge=0,
        description="reservedBytes is the memory admitted jobs reserved that NVML does not "
        "show as used yet (they have not allocated it).",
    )


class GPUNodeStatus(ApiModel):
    gpus: list[GPUStatus] | None = Field(
        None,
        description="gpus are the node's GPUs, one entry per NVML index.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["index"],
        },
    )
    gpu_count: int | None = Field(
        None, ge=0, description="gpuCount is the number of entries in gpus."
    )
    product: str | None = Field(
        None, description="product is the GPU product, or a comma-separated list if mixed."
    )
    free_bytes: int | None = Field(
        None, ge=0, description="freeBytes is the sum of freeBytes over gpus."
    )
    free_gib: str | None = Field(
        None, alias="freeGiB", description="freeGiB is freeBytes in GiB, for display."
    )
    heartbeat_time: datetime | None = Field(
        None,
        description="heartbeatTime is when the agent last read the GPUs; an old heartbeat "
        "means the figures are stale.",
    )
    conditions: list[Condition] | None = Field(
        None,
        description="conditions report the agent's health, as metav1.Condition.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
