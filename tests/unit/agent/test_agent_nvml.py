"""The NVML backend driven through the fake pynvml module: the real code paths without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pynvml
import pytest

from controller.agent.fake_nvml import (
    FakeGpu,
    FakeMemory,
    FakeMigDevice,
    FakeNvml,
    FakeProcess,
    h100,
)
from controller.agent.nvml import NvmlBackend
from controller.agent.pods import PodResolver
from controller.agent.readings import BackendError, GpuProcess, MigInstance
from controller.agent.status import Observation, build_status
from controller.api.gpunode import GPUNodeStatus
from controller.base.units import GIB, MIB


def test_fake_answers_like_pynvml_before_init() -> None:
    """The fake's uninitialised and missing-library behaviour matches the real module's here
    (no NVIDIA driver on the test machine)."""
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        FakeNvml([h100(0)]).nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND).nvmlInit()


def test_fake_returns_pynvml_structures() -> None:
    lib = FakeNvml([h100(0, used=GIB)])
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(lib.nvmlDeviceGetMemoryInfo(handle), pynvml.c_nvmlMemory_t)
    v2 = lib.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert isinstance(v2, pynvml.c_nvmlMemory_v2_t)
    assert v2.total == v2.free + v2.used + v2.reserved
    with pytest.raises(AttributeError, match="does not model"):
        lib.nvmlDeviceGetPowerUsage  # noqa: B018


def test_reads_every_gpu_with_the_v2_memory_call() -> None:
    lib = FakeNvml([h100(0), h100(1, used=30 * GIB)])
    gpus = NvmlBackend(lib).read()
    assert [g.index for g in gpus] == [0, 1]
    busy = gpus[1]
    assert busy.uuid == "GPU-6a7ad8f1-0000-4c4e-9d1a-000000000001"
    assert busy.product == "NVIDIA H100 80GB HBM3"
    assert busy.total_bytes == 81559 * MIB
    assert busy.used_bytes == 30 * GIB
    assert busy.reserved_bytes == 475 * MIB
    assert busy.free_bytes == 81559 * MIB - 475 * MIB - 30 * GIB
    assert "nvmlDeviceGetMemoryInfo(version=None)" not in lib.calls


def test_falls_back_to_v1_on_drivers_without_the_v2_call_and_remembers() -> None:
    old = [
        FakeGpu(
            "GPU-a",
            "Tesla V100-SXM2-32GB",
            FakeMemory(32 * GIB, 2 * GIB, 300 * MIB),
            v2_memory=False,
        )
    ]
    lib = FakeNvml(old)
    backend = NvmlBackend(lib)
    (gpu,) = backend.read()
    # v1 counts the reserved memory as used, and cannot tell it apart.
    assert gpu.used_bytes == 2 * GIB + 300 * MIB
    assert gpu.reserved_bytes is None
    assert gpu.free_bytes == 32 * GIB - 2 * GIB - 300 * MIB
    backend.read()
    v2_calls = [c for c in lib.calls if c.endswith(f"(version={pynvml.nvmlMemory_v2})")]
    assert len(v2_calls) == 1
    assert backend.memory_call == "v1"


def test_unified_memory_part_is_reported_as_unsupported_not_as_zero() -> None:
    lib = FakeNvml([FakeGpu("GPU-gb10", "NVIDIA GB10", memory=None)])
    (gpu,) = NvmlBackend(lib).read()
    assert not gpu.memory_info_supported
    assert (gpu.total_bytes, gpu.free_bytes, gpu.used_bytes) == (None, None, None)


def test_mig_devices_are_entries_of_their_own_and_the_parent_is_not() -> None:
    parent = FakeGpu(
        "GPU-a100",
        "NVIDIA A100-SXM4-40GB",
        FakeMemory(40 * GIB, 10 * GIB),
        mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE,
        mig_devices=[
            FakeMigDevice(
                0,
                "MIG-1111",
                "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
                FakeMemory(20 * GIB, 9 * GIB),
                gpu_instance_id=1,
                processes=[FakeProcess(4242, None)],
            ),
            # slot 1 empty: slots need not be filled in order
            FakeMigDevice(
                2,
                "MIG-2222",
                "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
                FakeMemory(20 * GIB, 0),
                gpu_instance_id=2,
            ),
        ],
    )
    whole = FakeGpu("GPU-b", "NVIDIA A100-SXM4-40GB", FakeMemory(40 * GIB, 0), mig_mode=0)
    gpus = NvmlBackend(FakeNvml([parent, whole])).read()
    assert [(g.index, g.uuid) for g in gpus] == [(0, "MIG-1111"), (0, "MIG-2222"), (1, "GPU-b")]
    assert gpus[0].mig == MigInstance("GPU-a100", 1, 0)
    assert gpus[0].used_bytes == 9 * GIB
    # MIG without per-process accounting: the process is listed, its usage unknown.
    assert gpus[0].processes == (GpuProcess(4242, None),)
    assert gpus[2].mig is None


def test_what_nvml_reads_reaches_the_gpunode_status(tmp_path: Path) -> None:
    """NVML -> cgroup pod mapping -> status: MIG devices, a unified-memory part, the driver's
    reservation and per-pod bytes are all published, valid for the CRD's model."""
    pod = "0f4c4a5e-8a3a-4b7e-9a51-3c1d2e3f4a5b"
    for pid in (4242, 101):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-pod{pod.replace('-', '_')}.slice/cri-containerd-1.scope\n"
        )
    a100 = FakeGpu(
        "GPU-a100",
        "NVIDIA A100-SXM4-40GB",
        FakeMemory(40 * GIB, 10 * GIB),
        mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE,
        mig_devices=[
            FakeMigDevice(
                0,
                "MIG-1111",
                "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
                FakeMemory(20 * GIB, 9 * GIB),
                gpu_instance_id=1,
                processes=[FakeProcess(4242, None)],
            ),
            FakeMigDevice(
                1,
                "MIG-2222",
                "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
                FakeMemory(20 * GIB, 0),
                gpu_instance_id=2,
            ),
        ],
    )
    gb10 = FakeGpu("GPU-gb10", "NVIDIA GB10", None)
    busy = h100(2, used=20 * GIB, processes=[FakeProcess(101, 12 * GIB), FakeProcess(7, GIB)])
    readings = PodResolver(tmp_path).attribute(NvmlBackend(FakeNvml([a100, gb10, busy])).read())
    body = build_status(Observation("nvml", tuple(readings)), datetime.now(UTC), [], None)
    GPUNodeStatus.model_validate(body)
    gpus = {g["uuid"]: g for g in body["gpus"]}
    assert [(g["uuid"], g["index"]) for g in body["gpus"]] == [
        ("MIG-1111", 0),
        ("MIG-2222", 0),
        ("GPU-gb10", 1),
        (busy.uuid, 2),
    ]
    assert gpus["MIG-1111"]["mig"] == {
        "parentUUID": "GPU-a100",
        "gpuInstanceId": 1,
        "computeInstanceId": 0,
    }
    assert gpus["MIG-1111"]["pods"] == [{"uid": pod}]  # MIG: per-process bytes unknown
    assert gpus["GPU-gb10"] == {
        "uuid": "GPU-gb10",
        "index": 1,
        "product": "NVIDIA GB10",
        "memoryInfoSupported": False,
    }
    assert gpus[busy.uuid]["driverReservedBytes"] == 475 * MIB
    assert gpus[busy.uuid]["pods"] == [{"uid": pod, "usedBytes": 12 * GIB}]
    assert body["conditions"][0]["message"] == "read 4 GPU(s) through nvml"


def test_compute_processes_with_their_memory() -> None:
    lib = FakeNvml(
        [h100(0, used=20 * GIB, processes=[FakeProcess(101, 12 * GIB), FakeProcess(202, 8 * GIB)])]
    )
    (gpu,) = NvmlBackend(lib).read()
    assert gpu.processes == (GpuProcess(101, 12 * GIB), GpuProcess(202, 8 * GIB))


def test_process_list_refused_is_no_processes_not_a_failure() -> None:
    gpu = h100(0)
    gpu.processes_error = pynvml.NVML_ERROR_NO_PERMISSION
    (reading,) = NvmlBackend(FakeNvml([gpu])).read()
    assert reading.processes == ()


@pytest.mark.parametrize(
    ("code", "hint"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVIDIA container runtime"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "differ in version"),
        (pynvml.NVML_ERROR_UNKNOWN, "Unknown Error"),
    ],
)
def test_init_failures_are_backend_errors_with_a_hint(code: int, hint: str) -> None:
    with pytest.raises(BackendError, match=hint) as info:
        NvmlBackend(FakeNvml([], init_error=code)).read()
    assert str(info.value).startswith("nvml: ")


def test_recovers_when_the_library_comes_back() -> None:
    lib = FakeNvml([h100(0)], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    backend = NvmlBackend(lib)
    with pytest.raises(BackendError):
        backend.read()
    lib.init_error = None
    assert len(backend.read()) == 1
    assert lib.init_count == 1  # initialised once, kept between reads
    backend.read()
    assert lib.calls.count("nvmlInit") == 2


def test_lost_gpu_fails_the_read_and_reinitialises_next_time() -> None:
    lib = FakeNvml([h100(0), h100(1)])
    backend = NvmlBackend(lib)
    backend.read()
    lib.gpus[1].lost = True
    with pytest.raises(BackendError, match="fell off the bus"):
        backend.read()
    assert lib.init_count == 0  # shut down after the error
    lib.gpus[1].lost = False
    assert len(backend.read()) == 2
    backend.close()
    assert lib.init_count == 0


def test_uninitialised_mid_read_is_a_backend_error() -> None:
    lib = FakeNvml([h100(0)])
    backend = NvmlBackend(lib)
    backend.read()
    lib.init_count = 0  # someone shut the library down under us
    with pytest.raises(BackendError, match="Uninitialized"):
        backend.read()
    assert len(backend.read()) == 1


def test_the_gpu_check_script_runs_against_the_fake() -> None:
    """scripts/nvml_check.py is for GPU machines; here it must at least run and print JSON."""
    script = Path(__file__).resolve().parents[3] / "scripts" / "nvml_check.py"
    result = subprocess.run(
        [sys.executable, str(script), "--fake"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["memory_call"] == "v2"
    assert [g["index"] for g in report["gpus"]] == [0, 1]
    assert report["gpunode_status"]["gpuCount"] == 2
