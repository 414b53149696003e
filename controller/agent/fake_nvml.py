"""A fake of the ``pynvml`` module (nvidia-ml-py) that drives the real NVML backend without a GPU.

Why a fake module rather than a fake backend: the NVML backend's logic (the v2 memory call
and its v1 fallback, MIG walking, NOT_SUPPORTED parts, error mapping) is what needs testing,
so the fake answers the same calls as pynvml does: same function names and arguments, the
same ctypes structures and friendly objects back, and the same exception classes (re-used
from pynvml itself, so ``except pynvml.NVMLError_NotSupported`` matches both). Functions the
fake does not model raise AttributeError, so a backend that starts calling something new
fails its tests instead of silently passing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NoReturn

import pynvml

from controller.base.units import MIB


@dataclass
class FakeProcess:
    """A compute process; ``used_bytes`` None is NVML_VALUE_NOT_AVAILABLE (reported as None)."""

    pid: int
    used_bytes: int | None


@dataclass
class FakeMemory:
    """Framebuffer memory as the v2 call splits it; the v1 call reports used + reserved."""

    total: int
    used: int
    reserved: int = 0

    @property
    def free(self) -> int:
        return self.total - self.reserved - self.used


@dataclass
class FakeMigDevice:
    """A MIG device: answers memory and process calls of its own, like a small GPU."""

    slot: int
    uuid: str
    name: str
    memory: FakeMemory
    gpu_instance_id: int
    compute_instance_id: int = 0
    processes: list[FakeProcess] = field(default_factory=list)


@dataclass
class FakeGpu:
    """A physical GPU and how it behaves.

    ``memory`` None: memory info is NOT_SUPPORTED (unified-memory parts). ``v2_memory`` False:
    the driver predates nvmlDeviceGetMemoryInfo_v2 (FUNCTION_NOT_FOUND). ``mig_mode`` None:
    not MIG-capable (NOT_SUPPORTED), else the current mode. ``processes_error``: an NVML error
    code the process query fails with. ``lost``: every call on it fails with GPU_IS_LOST.
    """

    uuid: str
    name: str
    memory: FakeMemory | None
    v2_memory: bool = True
    mig_mode: int | None = None
    max_mig_devices: int = 7
    mig_devices: list[FakeMigDevice] = field(default_factory=list)
    processes: list[FakeProcess] = field(default_factory=list)
    processes_error: int | None = None
    lost: bool = False


class _Handle:
    """Opaque like pynvml's ``c_nvmlDevice_t``: callers may only pass it back."""

    def __init__(self, target: FakeGpu | FakeMigDevice, parent: _Handle | None = None) -> None:
        self.target = target
        self.parent = parent


def _raise(code: int) -> NoReturn:
    raise pynvml.NVMLError(code)


def _memory_struct(memory: FakeMemory, version: int | None) -> Any:
    if not version:
        v1 = pynvml.c_nvmlMemory_t()
        v1.total, v1.free, v1.used = memory.total, memory.free, memory.used + memory.reserved
        return v1
    if version != pynvml.nvmlMemory_v2:
        _raise(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    v2 = pynvml.c_nvmlMemory_v2_t()
    v2.version = version
    v2.total, v2.reserved, v2.free, v2.used = (
        memory.total,
        memory.reserved,
        memory.free,
        memory.used,
    )
    return v2


def _process_objects(processes: list[FakeProcess], gi: int, ci: int) -> list[Any]:
    objects = []
    for proc in processes:
        info = pynvml.c_nvmlProcessInfo_v2_t()
        info.pid = proc.pid
        info.usedGpuMemory = (
            pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
            if proc.used_bytes is None
            else proc.used_bytes
        )
        info.gpuInstanceId, info.computeInstanceId = gi, ci
        obj = pynvml.nvmlStructToFriendlyObject(info)
        if obj.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
            obj.usedGpuMemory = None  # what pynvml does, see its WDDM comment
        objects.append(obj)
    return objects


class FakeNvml:
    """Stands in for the ``pynvml`` module: pass an instance wherever the module goes.

    ``init_error``: an NVML error code nvmlInit fails with (e.g. NVML_ERROR_LIBRARY_NOT_FOUND on
    a node without the driver). Like the real library, every call before nvmlInit (or after
    the matching nvmlShutdown) fails with NVMLError_Uninitialized.
    """

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.init_count = 0  # reference count, as in the real library
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        """Constants, exception classes and structures come from pynvml itself."""
        if name.startswith(("NVML", "nvmlMemory_", "c_nvml")):
            return getattr(pynvml, name)
        raise AttributeError(f"FakeNvml does not model pynvml.{name}")

    # -- library -------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            _raise(self.init_error)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self._check_init("nvmlShutdown")
        self.init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init("nvmlSystemGetDriverVersion")
        return "570.124.06"

    def _check_init(self, call: str) -> None:
        self.calls.append(call)
        if self.init_count <= 0:
            _raise(pynvml.NVML_ERROR_UNINITIALIZED)

    def _device(self, handle: _Handle, call: str) -> FakeGpu | FakeMigDevice:
        self._check_init(call)
        if not isinstance(handle, _Handle):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = handle.parent.target if handle.parent else handle.target
        if isinstance(gpu, FakeGpu) and gpu.lost:
            _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        return handle.target

    def _physical(self, handle: _Handle, call: str) -> FakeGpu:
        device = self._device(handle, call)
        if not isinstance(device, FakeGpu):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return device

    # -- devices -------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._check_init("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check_init("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        return _Handle(self.gpus[index])

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        return self.gpus.index(self._physical(handle, "nvmlDeviceGetIndex"))

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._device(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._device(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        device = self._device(handle, f"nvmlDeviceGetMemoryInfo(version={version})")
        gpu = handle.parent.target if handle.parent else device
        assert isinstance(gpu, FakeGpu)
        if version and not gpu.v2_memory:
            _raise(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if device.memory is None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _memory_struct(device.memory, version)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        device = self._device(handle, "nvmlDeviceGetComputeRunningProcesses")
        if isinstance(device, FakeMigDevice):
            return _process_objects(
                device.processes, device.gpu_instance_id, device.compute_instance_id
            )
        if device.processes_error is not None:
            _raise(device.processes_error)
        na = pynvml.NVML_VALUE_NOT_AVAILABLE_uint.value
        return _process_objects(device.processes, na, na)

    # -- MIG -----------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        gpu = self._physical(handle, "nvmlDeviceGetMigMode")
        if gpu.mig_mode is None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_mode, gpu.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        gpu = self._physical(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return gpu.max_mig_devices if gpu.mig_mode is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        gpu = self._physical(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if gpu.mig_mode != pynvml.NVML_DEVICE_MIG_ENABLE:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for mig in gpu.mig_devices:
            if mig.slot == index:
                return _Handle(mig, parent=handle)
        _raise(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        device = self._device(handle, "nvmlDeviceGetGpuInstanceId")
        if not isinstance(device, FakeMigDevice):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return device.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:
        device = self._device(handle, "nvmlDeviceGetComputeInstanceId")
        if not isinstance(device, FakeMigDevice):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return device.compute_instance_id


def h100(index: int, used: int = 0, processes: list[FakeProcess] | None = None) -> FakeGpu:
    """An H100 80GB HBM3 as NVML reports it (total 81559 MiB, about 475 MiB reserved)."""
    return FakeGpu(
        uuid=f"GPU-6a7ad8f1-0000-4c4e-9d1a-00000000000{index}",
        name="NVIDIA H100 80GB HBM3",
        memory=FakeMemory(total=81559 * MIB, used=used, reserved=475 * MIB),
        processes=processes or [],
    )
