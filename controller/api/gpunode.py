"""GPUNode (vramgate.dev/v1alpha1, cluster-scoped): the measured GPUs of one node.

The node agent writes one per node, named after the node and owned by it, with what its
backend reads: per GPU (or MIG device) its UUID, NVML index, product, total / free / used
bytes (or that the part reports none), the driver's own reservation, the MIG instance it is,
and the bytes each pod's processes use, plus a heartbeat. Free memory changes by the second,
so it lives here and not in Node annotations, which every Node watcher in the cluster would
receive on each update.

``status.gpus`` is keyed by ``uuid``, not ``index``: MIG devices share their parent's NVML
index, and a list-map with duplicate keys is refused by server-side apply.
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

#: Longest device UUID accepted: NVML's are 40 characters (GPU-/MIG- and a UUID); older MIG
#: names (MIG-GPU-<uuid>/<gi>/<ci>) and the dcgm backend's <parent>/gi/<id> are longer.
MAX_UUID = 128
#: A pod UID: 36 characters, or 32 hex digits for static pods.
MAX_POD_UID = 36


class GPUNodeSpec(ApiModel):
    node_name: str | None = Field(
        None,
        max_length=253,
        description="nodeName is the Node these GPUs belong to; the object's name when omitted.",
    )


class MIGStatus(ApiModel):
    """Where a MIG device lives: its physical GPU and its instances there."""

    parent_uuid: str = Field(
        alias="parentUUID",
        min_length=1,
        max_length=MAX_UUID,
        description="parentUUID is the UUID of the physical GPU this MIG device is a slice of "
        "(GPU-..., at most 128 characters).",
    )
    gpu_instance_id: int = Field(
        ge=0,
        description="gpuInstanceId is the MIG GPU instance ID on the parent GPU (0 or more), "
        "as nvidia-smi mig -lgi lists it.",
    )
    compute_instance_id: int | None = Field(
        None,
        ge=0,
        description="computeInstanceId is the compute instance ID within the GPU instance "
        "(0 or more); absent where the backend does not report it (dcgm-exporter).",
    )


class PodUsageStatus(ApiModel):
    """What the processes of one pod use on one GPU."""

    uid: str = Field(
        min_length=1,
        max_length=MAX_POD_UID,
        description="uid is the pod's metadata.uid (36 characters; static pods: 32 hex digits), "
        "found from its processes' cgroups.",
    )
    used_bytes: int | None = Field(
        None,
        ge=0,
        description="usedBytes is the GPU memory the pod's processes use, in bytes (0 or more): "
        "the sum of what the driver reports per process. Absent when the driver accounts none "
        "of them (e.g. MIG without per-instance accounting).",
    )


class GPUStatus(ApiModel):
    uuid: str = Field(
        min_length=1,
        max_length=MAX_UUID,
        description="uuid is the device's UUID (GPU-... for a GPU, MIG-... for a MIG device; at "
        "most 128 characters), stable across reboots; the key of status.gpus.",
    )
    index: int = Field(
        ge=0,
        description="index is the NVML index (0 or more) of the physical GPU on the node; MIG "
        "devices share their parent's index.",
    )
    product: str = Field(
        description="product is the device's product name, e.g. NVIDIA H100 80GB HBM3, or a "
        "MIG profile such as NVIDIA A100-SXM4-40GB MIG 3g.20gb.",
    )
    memory_info_supported: bool = Field(
        True,
        description="memoryInfoSupported is false on parts that report no framebuffer memory "
        "of their own (unified memory: NVML answers NOT_SUPPORTED); totalBytes, freeBytes, "
        "usedBytes and driverReservedBytes are then absent, never zero. Default true.",
    )
    total_bytes: int | None = Field(
        None,
        ge=0,
        description="totalBytes is the device's framebuffer memory, in bytes (0 or more); "
        "absent when memoryInfoSupported is false.",
    )
    free_bytes: int | None = Field(
        None,
        ge=0,
        description="freeBytes is the memory the backend reports free, in bytes (0 or more); "
        "absent when memoryInfoSupported is false.",
    )
    used_bytes: int | None = Field(
        None,
        ge=0,
        description="usedBytes is the memory the backend reports used, in bytes (0 or more); "
        "it includes the driver's reservation where only NVML's v1 memory call is available. "
        "Absent when memoryInfoSupported is false.",
    )
    driver_reserved_bytes: int | None = Field(
        None,
        ge=0,
        description="driverReservedBytes is the memory the driver reserves for itself, in bytes "
        "(0 or more), as NVML's v2 memory call (reserved) or dcgm-exporter's FB_RESERVED "
        "reports it; absent where the backend cannot tell it apart from usedBytes.",
    )
    reserved_bytes: int | None = Field(
        None,
        ge=0,
        description="reservedBytes is the memory admitted jobs reserved that NVML does not "
        "show as used yet (they have not allocated it), in bytes (0 or more). Written by the "
        "operator; the agent leaves it alone.",
    )
    mig: MIGStatus | None = Field(
        None,
        description="mig locates a MIG device on its physical GPU; absent for a whole GPU.",
    )
    pods: list[PodUsageStatus] | None = Field(
        None,
        description="pods are the pods whose processes use this device, one entry per pod UID, "
        "with the bytes they use, so that memory of jobs the operator admitted can be told "
        "from anyone else's; the rest of usedBytes belongs to the driver, to processes outside "
        "pods, or to processes the agent cannot map to a pod. Absent when no pod's process is "
        "seen (the dcgm backend lists no processes).",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["uid"],
        },
    )


class GPUNodeStatus(ApiModel):
    gpus: list[GPUStatus] | None = Field(
        None,
        description="gpus are the node's GPUs, one entry per device UUID: a whole GPU, or each "
        "MIG device of a GPU in MIG mode (its parent is not listed itself).",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["uuid"],
        },
    )
    gpu_count: int | None = Field(
        None, ge=0, description="gpuCount is the number of entries in gpus (0 or more)."
    )
    product: str | None = Field(
        None, description="product is the GPU product, or a comma-separated list if mixed."
    )
    free_bytes: int | None = Field(
        None,
        ge=0,
        description="freeBytes is the sum of freeBytes over gpus, in bytes (0 or more); GPUs "
        "with memoryInfoSupported false add nothing.",
    )
    free_gib: str | None = Field(
        None, alias="free", description="free is freeBytes in GiB, for people (612.50 GiB)."
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
