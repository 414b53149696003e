"""The static backend: GPUs described in a YAML or JSON file, re-read on every poll.

Why: simulated nodes (kwok), demos and tests need an agent that publishes believable GPUs
without a GPU; editing the file while the agent runs changes what it publishes, and a
missing or broken file is a backend failure like NVML failing to initialise. Sizes are bytes
(integers) or size strings such as ``80GiB`` or ``81559MiB``::

    gpus:
      - index: 0
        uuid: GPU-6a7ad8f1-0000-4c4e-9d1a-000000000000
        product: NVIDIA H100 80GB HBM3
        totalBytes: 81559MiB
        usedBytes: 20GiB
        reservedBytes: 475MiB        # optional; freeBytes defaults to total - used - reserved
        processes:                    # optional
          - {pid: 4242, usedBytes: 19GiB, podUID: 0f4c4a5e-8a3a-4b7e-9a51-3c1d2e3f4a5b}
      - {index: 1, uuid: GPU-..., product: NVIDIA GB10, memoryInfoSupported: false}
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controller.agent.readings import BackendError, GpuProcess, GpuReading, MigInstance
from controller.agent.sizes import ByteSize


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class _Process(_Model):
    pid: int = Field(ge=0)
    usedBytes: ByteSize | None = None
    podUID: str | None = None


class _Mig(_Model):
    parentUUID: str
    gpuInstanceId: int = Field(ge=0)
    computeInstanceId: int | None = None


class _Gpu(_Model):
    index: int = Field(ge=0)
    uuid: str = Field(min_length=1)
    product: str
    memoryInfoSupported: bool = True
    totalBytes: ByteSize | None = None
    usedBytes: ByteSize | None = None
    reservedBytes: ByteSize | None = None
    freeBytes: ByteSize | None = None
    mig: _Mig | None = None
    processes: list[_Process] = []


class _File(_Model):
    gpus: list[_Gpu]


def _reading(gpu: _Gpu) -> GpuReading:
    mig = (MigInstance(gpu.mig.parentUUID, gpu.mig.gpuInstanceId, gpu.mig.computeInstanceId)
           if gpu.mig else None)
    processes = tuple(GpuProcess(p.pid, p.usedBytes, p.podUID) for p in gpu.processes)
    if not gpu.memoryInfoSupported:
        return GpuReading(gpu.index, gpu.uuid, gpu.product, None, None, None, None,
                          memory_info_supported=False, mig=mig, processes=processes)
    if gpu.totalBytes is None or gpu.usedBytes is None:
        raise ValueError(f"GPU {gpu.uuid}: totalBytes and usedBytes are required "
                         "unless memoryInfoSupported is false")
    free = gpu.freeBytes
    if free is None:
        free = gpu.totalBytes - gpu.usedBytes - (gpu.reservedBytes or 0)
    if free < 0:
        raise ValueError(f"GPU {gpu.uuid}: usedBytes + reservedBytes exceed totalBytes")
    return GpuReading(gpu.index, gpu.uuid, gpu.product, gpu.totalBytes, free, gpu.usedBytes,
                      gpu.reservedBytes, mig=mig, processes=processes)


def _location(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text.lstrip(".")


def parse_static(text: str, source: str) -> list[GpuReading]:
    """GPUs described by ``text``; BackendError naming ``source`` and the field when invalid."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise BackendError(f"static: {source} is not valid YAML or JSON: {error}") from None
    try:
        parsed = _File.model_validate(data)
        return [_reading(gpu) for gpu in parsed.gpus]
    except ValidationError as error:
        first = error.errors()[0]
        where = _location(first["loc"]) or "the file"
        message = (first["msg"].replace("Input should be", "must be")
                   .replace("Value error, ", "")
                   .replace("Extra inputs are not permitted", "unknown field"))
        if not first["loc"]:
            message = "must be a mapping with a gpus list"
        raise BackendError(f"static: {source}: {where}: {message}") from None
    except ValueError as error:
        raise BackendError(f"static: {source}: {error}") from None


class StaticBackend:
    """Reads ``path`` on every read, so edits show up on the next poll."""

    name = "static"

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> list[GpuReading]:
        try:
            text = self.path.read_text()
        except OSError as error:
            raise BackendError(f"static: cannot read {self.path}: {error.strerror}") from None
        return parse_static(text, str(self.path))
