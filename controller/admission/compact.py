"""`vramgate plan`'s compact cluster description: a cluster that does not exist yet.

    nodes:
    - name: node-a
      labels: {nvidia.com/gpu.product: NVIDIA-L4}
      gpus:
      - {memory: 24GiB, free: 20GiB}      # free defaults to memory
      - {memory: 24GiB, uuid: GPU-1234, allocated: true}
    - name: node-b
      gpus: {count: 8, memory: 80GiB}

Read into the same `NodeState`s as the API's Nodes and GPUNodes (`cluster.py`), every GPU
Ready and fresh. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from controller.api.base import PRODUCT_LABEL
from controller.api.finetunejob import DNS_SUBDOMAIN_PATTERN
from controller.base.units import Bytes
from controller.packing.inventory import GpuDevice, NodeState


class CompactGpu(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: Sizes with their units, as people write them: a bare number is ambiguous.
    memory: Annotated[int, Bytes(unit=True, integers=False, zero=False)]
    #: 0 in any unit: a full GPU's free memory.
    free: Annotated[int, Bytes(unit=True, integers=False)] | None = None
    uuid: str | None = Field(None, min_length=1, max_length=128)
    product: str | None = Field(None, min_length=1)
    count: int = Field(1, ge=1, le=4096)
    #: A pod holds the GPU (what is not free is its): with the device plugin or DRA it takes
    #: no other job, and the device plugin hands it to no other pod.
    allocated: StrictBool = False

    @model_validator(mode="after")
    def _uuid_of_one(self) -> CompactGpu:
        if self.uuid is not None and self.count > 1:
            raise ValueError(
                f"uuid names one GPU, but count is {self.count}: give each GPU its own entry"
            )
        return self


class CompactNode(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: list[CompactGpu] = Field(min_length=1)
    ready: bool = True
    cordoned: bool = False

    @field_validator("gpus", mode="before")
    @classmethod
    def _one_kind(cls, value: object) -> object:
        """`gpus: {count: 8, memory: 80GiB}` is a list of one kind of GPU."""
        return [value] if isinstance(value, Mapping) else value


class CompactCluster(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: list[CompactNode] = Field(min_length=1)


#: The model each key's items are, for naming the keys a mapping allows.
_COMPACT_MODELS: dict[str, type[BaseModel]] = {"nodes": CompactNode, "gpus": CompactGpu}
#: pydantic's wording, and what a person writing the file needs to read instead.
_COMPACT_MESSAGES = {
    "missing": "required",
    "string_pattern_mismatch": "must be a DNS-1123 subdomain (lower-case letters, digits, '-' "
    "and '.'), as a node's name is",
}


def _compact_problem(first: Any) -> str:
    """`path: what is wrong`, an unknown key with the keys allowed there."""
    loc = first["loc"]
    path = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[")
    message = _COMPACT_MESSAGES.get(first["type"], first["msg"].removeprefix("Value error, "))
    if first["type"] == "extra_forbidden":
        parent = next((p for p in reversed(loc[:-1]) if isinstance(p, str)), "")
        model = _COMPACT_MODELS.get(parent, CompactCluster)
        message = f"unknown key; allowed: {', '.join(model.model_fields)}"
    return f"{path}: {message}"


#: The pod a compact file's `allocated: true` GPU is held by (no pod of any job).
_HOLDER = "allocated-in-the-cluster-file"


class CompactProblem(ValueError):
    """What is wrong with a compact description, in one line (`path: what is wrong`)."""


def compact_nodes(document: Mapping[str, Any]) -> list[NodeState]:
    """Nodes from the compact form; every GPU is Ready and fresh, its free memory as given."""
    try:
        cluster = CompactCluster.model_validate(document)
    except ValidationError as error:
        raise CompactProblem(_compact_problem(error.errors()[0])) from None
    out = []
    for node in cluster.nodes:
        gpus = node.gpus
        product = node.labels.get(PRODUCT_LABEL, "GPU")
        devices: list[GpuDevice] = []
        for gpu in gpus:
            for _ in range(gpu.count):
                i = len(devices)
                if gpu.free is not None and gpu.free > gpu.memory:
                    raise CompactProblem(f"nodes {node.name} GPU {i}: free must be at most memory")
                free = gpu.memory if gpu.free is None else gpu.free
                devices.append(
                    GpuDevice(
                        uuid=gpu.uuid if gpu.uuid and gpu.count == 1 else f"{node.name}-gpu{i}",
                        index=i,
                        product=gpu.product or product,
                        total_bytes=gpu.memory,
                        free_bytes=free,
                        pod_used_bytes={_HOLDER: gpu.memory - free} if gpu.allocated else {},
                    )
                )
        out.append(
            NodeState(
                node.name,
                tuple(devices),
                # The labels every kubelet sets, which pod templates select on; the file's win.
                labels={
                    "kubernetes.io/hostname": node.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **node.labels,
                },
                ready=node.ready,
                cordoned=node.cordoned,
                gpu_allocatable=len(devices),
                gpu_allocated=sum(1 for device in devices if device.pod_used_bytes),
            )
        )
    return out
