"""The NVML backend: reads every GPU of this node through nvidia-ml-py (imported as pynvml).

Why NVML directly: it is what nvidia-smi and dcgm read, needs no extra daemon, and answers in
milliseconds. The library handle is kept between reads and re-opened after an error, so a
driver reload or a lost GPU heals without restarting the agent.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from controller.agent.readings import BackendError, GpuProcess, GpuReading, MigInstance


@dataclass(frozen=True)
class _Memory:
    total: int
    free: int
    used: int
    reserved: int | None


def _load_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as error:
        raise BackendError(
            "nvml: the Python package nvidia-ml-py is not installed: pip install nvidia-ml-py"
        ) from error
    return pynvml


class NvmlBackend:
    """Reads GPUs through ``lib``: the pynvml module, or a ``FakeNvml`` in tests."""

    name = "nvml"

    def __init__(self, lib: Any = None) -> None:
        self.lib = lib if lib is not None else _load_pynvml()
        self._initialised = False
        # Drivers before R510 lack nvmlDeviceGetMemoryInfo_v2; ask once, then stay on v1.
        self._v2_memory = True

    @property
    def memory_call(self) -> str:
        """``v2`` while the driver answers nvmlDeviceGetMemoryInfo_v2, else ``v1``."""
        return "v2" if self._v2_memory else "v1"

    def read(self) -> list[GpuReading]:
        lib = self.lib
        try:
            if not self._initialised:
                lib.nvmlInit()
                self._initialised = True
            readings: list[GpuReading] = []
            for index in range(lib.nvmlDeviceGetCount()):
                readings.extend(self._read_gpu(index, lib.nvmlDeviceGetHandleByIndex(index)))
            return readings
        except lib.NVMLError as error:
            self.close()
            raise BackendError(describe_nvml_error(lib, error)) from error

    def close(self) -> None:
        """Release the library; the next read initialises it again."""
        if self._initialised:
            self._initialised = False
            # Shutting down a broken library can fail too: there is nothing left to release.
            with contextlib.suppress(self.lib.NVMLError):
                self.lib.nvmlShutdown()

    def _read_gpu(self, index: int, handle: Any) -> list[GpuReading]:
        lib = self.lib
        if not self._mig_enabled(handle):
            return [self._reading(index, handle, mig=None)]
        # The parent's figures would count every instance again: list the instances only.
        parent_uuid = lib.nvmlDeviceGetUUID(handle)
        return [
            self._reading(
                index,
                mig_handle,
                MigInstance(
                    parent_uuid=parent_uuid,
                    gpu_instance_id=lib.nvmlDeviceGetGpuInstanceId(mig_handle),
                    compute_instance_id=lib.nvmlDeviceGetComputeInstanceId(mig_handle),
                ),
            )
            for mig_handle in self._mig_handles(handle)
        ]

    def _reading(self, index: int, handle: Any, mig: MigInstance | None) -> GpuReading:
        lib = self.lib
        memory = self._memory(handle)
        return GpuReading(
            index=index,
            uuid=lib.nvmlDeviceGetUUID(handle),
            product=lib.nvmlDeviceGetName(handle),
            total_bytes=memory.total if memory else None,
            free_bytes=memory.free if memory else None,
            used_bytes=memory.used if memory else None,
            reserved_bytes=memory.reserved if memory else None,
            memory_info_supported=memory is not None,
            mig=mig,
            processes=self._processes(handle),
        )

    def _mig_enabled(self, handle: Any) -> bool:
        lib = self.lib
        try:
            current, _pending = lib.nvmlDeviceGetMigMode(handle)
        except lib.NVMLError_NotSupported:
            return False  # not a MIG-capable part
        return bool(current == lib.NVML_DEVICE_MIG_ENABLE)

    def _mig_handles(self, handle: Any) -> list[Any]:
        lib = self.lib
        handles = []
        for slot in range(lib.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                handles.append(lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
            except lib.NVMLError_NotFound:
                continue  # an empty slot: MIG slots need not be filled in order
        return handles

    def _memory(self, handle: Any) -> _Memory | None:
        """v2 splits driver-reserved memory out of ``used``; v1 counts it as used.

        None: the part has no separate framebuffer to report (unified memory).
        """
        lib = self.lib
        if self._v2_memory:
            try:
                m = lib.nvmlDeviceGetMemoryInfo(handle, version=lib.nvmlMemory_v2)
                return _Memory(int(m.total), int(m.free), int(m.used), int(m.reserved))
            except (lib.NVMLError_FunctionNotFound, lib.NVMLError_ArgumentVersionMismatch):
                self._v2_memory = False
            except lib.NVMLError_NotSupported:
                pass  # this device only: v1 may still answer, or say NOT_SUPPORTED too
        try:
            m = lib.nvmlDeviceGetMemoryInfo(handle)
        except lib.NVMLError_NotSupported:
            return None
        return _Memory(int(m.total), int(m.free), int(m.used), None)

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        """Compute processes; empty where the driver will not list them to this agent."""
        lib = self.lib
        try:
            infos = lib.nvmlDeviceGetComputeRunningProcesses(handle)
        except (lib.NVMLError_NotSupported, lib.NVMLError_NoPermission):
            return ()
        return tuple(
            GpuProcess(
                pid=int(info.pid),
                used_bytes=None if info.usedGpuMemory is None else int(info.usedGpuMemory),
            )
            for info in infos
        )


def describe_nvml_error(lib: Any, error: Exception) -> str:
    """One line: what NVML said, its likely cause on a Kubernetes node, and what to do."""
    hints: list[tuple[str, str]] = [
        (
            "NVMLError_LibraryNotFound",
            "libnvidia-ml.so.1 is not visible to the agent: run it with the NVIDIA container "
            "runtime (runtimeClassName: nvidia) on a node with the NVIDIA driver",
        ),
        (
            "NVMLError_DriverNotLoaded",
            "the NVIDIA kernel driver is not loaded on this node: check nvidia-smi on the host",
        ),
        (
            "NVMLError_NoPermission",
            "the agent may not open /dev/nvidia*: run it with the NVIDIA container runtime",
        ),
        (
            "NVMLError_LibRmVersionMismatch",
            "the NVML library and the kernel driver differ in version: reboot the node or "
            "reinstall the driver",
        ),
        (
            "NVMLError_GpuIsLost",
            "a GPU fell off the bus: drain the node and reset the GPU (nvidia-smi -r) or reboot",
        ),
    ]
    for class_name, hint in hints:
        cls = getattr(lib, class_name, None)
        if cls is not None and isinstance(error, cls):
            return f"nvml: {error} ({hint})"
    return f"nvml: {error}"
