"""What a GPU backend reports, and the one-method interface every backend implements.

Why one small interface: NVML needs a GPU, dcgm-exporter needs the NVIDIA GPU Operator and a
static file needs neither; the publisher and the metrics must not care which one answered.
All sizes are integer bytes (NVML's unit); ``None`` means "this part cannot tell", which is
different from zero (a unified-memory part has no framebuffer figures at all).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from controller.base.errors import TemporaryError


class BackendError(TemporaryError):
    """A backend could not read the GPUs; the message names the likely cause and the fix.

    The agent retries it with backoff and reports it in the GPUNode's ``Ready`` condition.
    """


@dataclass(frozen=True)
class GpuProcess:
    """One compute process on a GPU.

    ``used_bytes`` is None where the driver does not account per process (e.g. MIG without
    per-instance accounting). ``pod_uid`` is filled by the backend when it knows it (static
    files) or later from the process's cgroup (see ``pods.py``).
    """

    pid: int
    used_bytes: int | None
    pod_uid: str | None = None


@dataclass(frozen=True)
class MigInstance:
    """Where a MIG device lives: its physical GPU and its GPU instance on it."""

    parent_uuid: str
    gpu_instance_id: int
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class GpuReading:
    """One GPU (or one MIG device, which the scheduler sees as a GPU of its own).

    ``index`` is the NVML index of the physical GPU, so MIG devices share their parent's
    index and are told apart by ``uuid`` and ``mig``. Memory fields are None exactly when
    ``memory_info_supported`` is False, and ``reserved_bytes`` is also None where the driver
    only offers the v1 memory call (which counts reserved memory as used). ``reserved_bytes``
    is the driver's own reservation, published as ``driverReservedBytes``; the GPUNode's
    ``reservedBytes`` is the operator's and never comes from a reading.
    """

    index: int
    uuid: str
    product: str
    total_bytes: int | None
    free_bytes: int | None
    used_bytes: int | None
    reserved_bytes: int | None = None
    memory_info_supported: bool = True
    mig: MigInstance | None = None
    processes: tuple[GpuProcess, ...] = field(default_factory=tuple)


class GpuBackend(Protocol):
    """Reads every GPU of this node; raises BackendError when it cannot."""

    name: str

    def read(self) -> list[GpuReading]: ...
