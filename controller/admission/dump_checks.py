"""What the API server guarantees of the objects `vramgate plan` reads from files, checked.

The operator reads objects the API server has validated: a GPUNode's status against its
CRD, a Pod against the Pod schema. A cluster dump given to plan may have been edited by hand,
so plan checks the fields admission reads, with the types the API server would have stored
(numbers as numbers, times as RFC 3339, nvidia.com/gpu as a whole number), and names the
object and the field, instead of failing deep inside the snapshot. Fields admission does not
read are not checked: a hand-written dump need not carry a condition's reason or message,
nor other resources' quantities in any particular form.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
)

from controller.api.base import GPU_RESOURCE

Count = Annotated[StrictInt, Field(ge=0)]


def _quantities(value: object) -> object:
    """Resources as maps; of their quantities only nvidia.com/gpu is read, as a whole
    number: the API server serves it as a string ("8"), a file may hold an integer."""
    if not isinstance(value, Mapping):
        raise ValueError("must be a map of resource names to quantities")
    gpus = value.get(GPU_RESOURCE)
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, str | int)):
        raise ValueError(f"{GPU_RESOURCE}: must be a whole number of GPUs, got {gpus!r}")
    return value


Quantities = Annotated[dict[str, Any], BeforeValidator(_quantities)]


class _Shape(BaseModel):
    """The fields admission reads, under their wire names; every other field is the API
    server's business."""

    model_config = ConfigDict(extra="allow")


class _Meta(_Shape):
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    labels: dict[str, str] | None = None
    creationTimestamp: AwareDatetime | None = None
    deletionTimestamp: AwareDatetime | None = None


class _Condition(_Shape):
    type: str
    status: str


# -- Nodes and Pods -----------------------------------------------------------------------


class _Resources(_Shape):
    limits: Quantities | None = None
    requests: Quantities | None = None


class _Container(_Shape):
    resources: _Resources | None = None


class _PodSpec(_Shape):
    nodeName: str | None = None
    containers: list[_Container] | None = None
    initContainers: list[_Container] | None = None


class _Phase(_Shape):
    phase: str | None = None


class _Pod(_Shape):
    metadata: _Meta
    spec: _PodSpec | None = None
    status: _Phase | None = None


class _NodeSpec(_Shape):
    unschedulable: StrictBool | None = None


class _NodeStatus(_Shape):
    conditions: list[_Condition] | None = None
    allocatable: Quantities | None = None
    capacity: Quantities | None = None


class _Node(_Shape):
    metadata: _Meta
    spec: _NodeSpec | None = None
    status: _NodeStatus | None = None


# -- GPUNodes and FineTuneJobs (their CRDs' fields that admission reads) --------------------


class _PodUsage(_Shape):
    uid: str
    usedBytes: Count | None = None


class _Gpu(_Shape):
    uuid: str
    index: Count
    product: str | None = None
    memoryInfoSupported: StrictBool | None = None
    totalBytes: Count | None = None
    freeBytes: Count | None = None
    pods: list[_PodUsage] | None = None
    mig: dict[str, Any] | None = None


class _GPUNodeStatus(_Shape):
    heartbeatTime: AwareDatetime | None = None
    conditions: list[_Condition] | None = None
    gpus: list[_Gpu] | None = None


class _GPUNode(_Shape):
    metadata: _Meta
    status: _GPUNodeStatus | None = None


class _NodePlacement(_Shape):
    node: str
    gpuIndices: list[Count] | None = None
    gpuUUIDs: list[str] | None = None


class _Placement(_Shape):
    nodes: list[_NodePlacement] | None = None
    perGpuBytes: Count | None = None


class _Observed(_Shape):
    """What a waiting job's learned key reads of the jobs that ran (`learned.image_digests`)."""

    imageDigest: str | None = None
    imageDigestTime: AwareDatetime | None = None


class _JobStatus(_Shape):
    conditions: list[_Condition] | None = None
    placement: _Placement | None = None
    observed: _Observed | None = None


class _FineTuneJob(_Shape):
    metadata: _Meta
    status: _JobStatus | None = None


class _PriorityClass(_Shape):
    """What ranks the jobs (`controller.admission.priority`): an int32 value the API server
    requires."""

    metadata: _Meta
    value: StrictInt = Field(ge=-(2**31), lt=2**31)
    globalDefault: StrictBool | None = None


_SHAPES: dict[str, type[_Shape]] = {
    "Node": _Node,
    "GPUNode": _GPUNode,
    "Pod": _Pod,
    "FineTuneJob": _FineTuneJob,
    "PriorityClass": _PriorityClass,
}


def object_problem(obj: Mapping[str, Any]) -> str | None:
    """`field: what is wrong` for the first field of `obj` admission reads that the API
    server would not have stored as it is; None when it reads as the API server serves it."""
    shape = _SHAPES.get(str(obj.get("kind")))
    if shape is None:
        return None
    try:
        shape.model_validate(obj)
    except ValidationError as error:
        first = error.errors()[0]
        path = ".".join(
            f"[{part}]" if isinstance(part, int) else str(part) for part in first["loc"]
        ).replace(".[", "[")
        value = first.get("input")
        got = "" if isinstance(value, Mapping | list) else f", got {value!r}"
        return f"{path}: {first['msg'].removeprefix('Value error, ')}{got}"
    return None
