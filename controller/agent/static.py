"""The static backend: GPUs described in a YAML or JSON file, re-read on every poll.

Why: simulated nodes (kwok), demos and tests need an agent that publishes believable GPUs
without a GPU; editing the file while the agent runs changes what it publishes, and a
missing or broken file is a backend failure like NVML failing to initialise. Sizes are bytes
(integers) or size strings such as ``80GiB`` or ``81559MiB``. The file describes what a
backend reads, so it can describe everything NVML can: MIG devices, unified-memory parts and
processes with their pods::

    gpus:
      - index: 0
        uuid: GPU-6a7ad8f1-0000-4c4e-9d1a-000000000000
        product: NVIDIA H100 80GB HBM3
        totalBytes: 81559MiB
        usedBytes: 20GiB
        driverReservedBytes: 475MiB  # optional; freeBytes defaults to total - used - reserved
        processes:                    # optional; published per pod as status.gpus[].pods
          - {pid: 4242, usedBytes: 19GiB, podUID: 0f4c4a5e-8a3a-4b7e-9a51-3c1d2e3f4a5b}
          - {pid: 17, usedBytes: 1GiB}   # no podUID: looked up in --proc-root, else no pod
      - {index: 1, uuid: GPU-..., product: NVIDIA GB10, memoryInfoSupported: false}
      - index: 2                      # a MIG device: its parent's index, its own UUID
        uuid: MIG-5c4d5d2a-0000-5a3e-9f1b-000000000000
        product: NVIDIA A100-SXM4-40GB MIG 3g.20gb
        totalBytes: 20096MiB
        usedBytes: 0
        mig: {parentUUID: GPU-..., gpuInstanceId: 1, computeInstanceId: 0}

Fields per GPU: ``index`` (NVML index, 0 or more; MIG devices repeat their parent's),
``uuid`` (unique in the file, at most 128 characters), ``product``, ``memoryInfoSupported``
(default true; when false the memory fields must be left out), ``totalBytes`` and
``usedBytes`` (required otherwise), ``freeBytes`` (optional), ``driverReservedBytes``
(optional: the driver's own reservation, NVML v2 ``reserved``; ``reservedBytes`` is the older
spelling of the same and still accepted), ``mig`` (optional: ``parentUUID``,
``gpuInstanceId``, optional ``computeInstanceId``) and ``processes`` (optional: ``pid``,
optional ``usedBytes``, optional ``podUID``, a pod's metadata.uid of at most 36 characters).

UUIDs must be unique across the cluster, not only in the file: the operator packs GPUs by
UUID cluster-wide, so two nodes reporting the same UUID collide. One file shared by many
nodes (the chart's ConfigMap) therefore writes ``{node}`` into each ``uuid`` and MIG
``parentUUID``, which the agent replaces with its node name (``GPU-{node}-0`` on node
``gpu-a`` is ``GPU-gpu-a-0``); the expanded UUID is held to the 128 characters too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from controller.agent.readings import BackendError, GpuProcess, GpuReading, MigInstance
from controller.api.gpunode import MAX_POD_UID, MAX_UUID
from controller.base.units import Bytes


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class _Process(_Model):
    pid: int = Field(ge=0)
    usedBytes: Annotated[int, Bytes()] | None = None
    podUID: str | None = Field(None, min_length=1, max_length=MAX_POD_UID)


class _Mig(_Model):
    parentUUID: str = Field(min_length=1, max_length=MAX_UUID)
    gpuInstanceId: int = Field(ge=0)
    computeInstanceId: int | None = Field(None, ge=0)


class _Gpu(_Model):
    index: int = Field(ge=0)
    uuid: str = Field(min_length=1, max_length=MAX_UUID)
    product: str
    memoryInfoSupported: bool = True
    totalBytes: Annotated[int, Bytes()] | None = None
    usedBytes: Annotated[int, Bytes()] | None = None
    driverReservedBytes: Annotated[int, Bytes()] | None = None
    # The older spelling of driverReservedBytes.
    reservedBytes: Annotated[int, Bytes()] | None = None
    freeBytes: Annotated[int, Bytes()] | None = None
    mig: _Mig | None = None
    processes: list[_Process] = []

    @model_validator(mode="after")
    def _one_spelling(self) -> _Gpu:
        if self.reservedBytes is not None:
            if self.driverReservedBytes is not None:
                raise ValueError(
                    "set driverReservedBytes or reservedBytes (its older spelling), not both"
                )
            self.driverReservedBytes = self.reservedBytes
        return self


class _File(_Model):
    gpus: list[_Gpu]


def _check_unique(gpus: list[_Gpu]) -> None:
    """GPUNode status.gpus is keyed by uuid: a repeated one would be refused by the API."""
    seen: dict[str, int] = {}
    for i, gpu in enumerate(gpus):
        if gpu.uuid in seen:
            raise ValueError(
                f"gpus[{i}].uuid: {gpu.uuid} is also gpus[{seen[gpu.uuid]}]'s; "
                "every GPU and MIG device needs a UUID of its own"
            )
        seen[gpu.uuid] = i


def _reading(gpu: _Gpu) -> GpuReading:
    mig = (
        MigInstance(gpu.mig.parentUUID, gpu.mig.gpuInstanceId, gpu.mig.computeInstanceId)
        if gpu.mig
        else None
    )
    processes = tuple(GpuProcess(p.pid, p.usedBytes, p.podUID) for p in gpu.processes)
    if not gpu.memoryInfoSupported:
        if any(
            v is not None
            for v in (gpu.totalBytes, gpu.usedBytes, gpu.freeBytes, gpu.driverReservedBytes)
        ):
            raise ValueError(
                f"GPU {gpu.uuid}: memoryInfoSupported is false, so totalBytes, "
                "usedBytes, freeBytes and driverReservedBytes must be left out"
            )
        return GpuReading(
            gpu.index,
            gpu.uuid,
            gpu.product,
            None,
            None,
            None,
            None,
            memory_info_supported=False,
            mig=mig,
            processes=processes,
        )
    if gpu.totalBytes is None or gpu.usedBytes is None:
        raise ValueError(
            f"GPU {gpu.uuid}: totalBytes and usedBytes are required "
            "unless memoryInfoSupported is false"
        )
    free = gpu.freeBytes
    if free is None:
        free = gpu.totalBytes - gpu.usedBytes - (gpu.driverReservedBytes or 0)
    if free < 0:
        raise ValueError(f"GPU {gpu.uuid}: usedBytes + driverReservedBytes exceed totalBytes")
    return GpuReading(
        gpu.index,
        gpu.uuid,
        gpu.product,
        gpu.totalBytes,
        free,
        gpu.usedBytes,
        gpu.driverReservedBytes,
        mig=mig,
        processes=processes,
    )


def _location(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text.lstrip(".")


#: Replaced by the agent's node name in each ``uuid`` and MIG ``parentUUID``.
NODE_PLACEHOLDER = "{node}"


def _expand_node(data: Any, node_name: str | None) -> Any:
    """``data`` with NODE_PLACEHOLDER in the GPUs' UUIDs replaced by ``node_name`` (left as
    it is when there is no node name or the shape is wrong: validation reports that)."""
    if node_name is None or not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        return data
    gpus = []
    for gpu in data["gpus"]:
        if isinstance(gpu, dict):
            gpu = dict(gpu)
            if isinstance(gpu.get("uuid"), str):
                gpu["uuid"] = gpu["uuid"].replace(NODE_PLACEHOLDER, node_name)
            mig = gpu.get("mig")
            if isinstance(mig, dict) and isinstance(mig.get("parentUUID"), str):
                gpu["mig"] = {
                    **mig,
                    "parentUUID": mig["parentUUID"].replace(NODE_PLACEHOLDER, node_name),
                }
        gpus.append(gpu)
    return {**data, "gpus": gpus}


def parse_static(text: str, source: str, node_name: str | None = None) -> list[GpuReading]:
    """GPUs described by ``text``, with ``{node}`` in their UUIDs replaced by ``node_name``;
    BackendError naming ``source`` and the field when invalid."""
    try:
        data = _expand_node(yaml.safe_load(text), node_name)
    except yaml.YAMLError as error:
        raise BackendError(f"static: {source} is not valid YAML or JSON: {error}") from None
    try:
        parsed = _File.model_validate(data)
        _check_unique(parsed.gpus)
        return [_reading(gpu) for gpu in parsed.gpus]
    except ValidationError as error:
        first = error.errors()[0]
        where = _location(first["loc"]) or "the file"
        message = (
            first["msg"]
            .replace("Input should be", "must be")
            .replace("Value error, ", "")
            .replace("Extra inputs are not permitted", "unknown field")
        )
        if not first["loc"]:
            message = "must be a mapping with a gpus list"
        raise BackendError(f"static: {source}: {where}: {message}") from None
    except ValueError as error:
        raise BackendError(f"static: {source}: {error}") from None


class StaticBackend:
    """Reads ``path`` on every read, so edits show up on the next poll; ``{node}`` in the
    UUIDs becomes ``node_name``."""

    name = "static"

    def __init__(self, path: Path, node_name: str | None = None) -> None:
        self.path = path
        self.node_name = node_name

    def read(self) -> list[GpuReading]:
        try:
            text = self.path.read_text()
        except OSError as error:
            raise BackendError(f"static: cannot read {self.path}: {error.strerror}") from None
        return parse_static(text, str(self.path), self.node_name)
