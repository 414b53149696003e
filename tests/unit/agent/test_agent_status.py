"""The GPUNode status the agent writes: valid for the API models, Ready kept or flipped, and
MIG devices, unified-memory parts and per-pod usage published rather than left out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from controller.agent.readings import GpuProcess, GpuReading, MigInstance
from controller.agent.status import (
    Observation,
    build_status,
    gpu_entries,
    left_out_reason,
    pod_usage,
)
from controller.api.conditions import (
    READY,
    REASON_AGENT_STOPPED,
    REASON_BACKEND_FAILED,
    REASON_GPUS_READ,
)
from controller.api.gpunode import GPUNodeStatus

GIB = 2**30
MIB = 2**20
T0 = datetime(2025, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
H100 = [
    GpuReading(0, "GPU-0", "NVIDIA H100 80GB HBM3", 80 * GIB, 70 * GIB, 10 * GIB),
    GpuReading(1, "GPU-1", "NVIDIA H100 80GB HBM3", 80 * GIB, 80 * GIB, 0),
]


def test_status_validates_against_the_api_model_and_sums_free_memory() -> None:
    body = build_status(Observation("static", tuple(H100)), T0, [], 1)
    GPUNodeStatus.model_validate(body)
    assert body["gpuCount"] == 2
    assert body["product"] == "NVIDIA H100 80GB HBM3"
    assert body["freeBytes"] == 150 * GIB
    assert body["free"] == "150.00 GiB"
    assert body["heartbeatTime"] == "2025-01-01T12:00:00Z"
    assert body["gpus"][0] == {
        "uuid": "GPU-0",
        "index": 0,
        "product": "NVIDIA H100 80GB HBM3",
        "memoryInfoSupported": True,
        "totalBytes": 80 * GIB,
        "freeBytes": 70 * GIB,
        "usedBytes": 10 * GIB,
    }
    (ready,) = body["conditions"]
    assert ready["type"] == READY == "Ready" and ready["status"] == "True"
    assert ready["reason"] == REASON_GPUS_READ
    assert ready["message"] == "read 2 GPU(s) through static"
    assert ready["observedGeneration"] == 1


def test_ready_keeps_its_transition_time_until_the_status_flips() -> None:
    first = build_status(Observation("nvml", tuple(H100)), T0, [], 1)["conditions"]
    later = build_status(Observation("nvml", tuple(H100)), T0 + timedelta(minutes=5), first, 1)
    assert later["conditions"][0]["lastTransitionTime"] == "2025-01-01T12:00:00Z"
    failed = build_status(
        Observation("nvml", tuple(H100), "nvml: Driver Not Loaded"),
        T0 + timedelta(minutes=6),
        later["conditions"],
        1,
    )
    (ready,) = failed["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", REASON_BACKEND_FAILED)
    assert ready["message"] == "nvml: Driver Not Loaded"
    assert ready["lastTransitionTime"] == "2025-01-01T12:06:00Z"
    assert failed["gpuCount"] == 2  # the last readings stay, marked stale by Ready=False


@pytest.mark.parametrize("error", [None, "nvml: Driver Not Loaded"])
def test_a_stopped_agent_says_so_in_ready_whatever_its_backend_said(error: str | None) -> None:
    body = build_status(Observation("nvml", tuple(H100), error, stopped=True), T0, [], 3)
    GPUNodeStatus.model_validate(body)
    (ready,) = body["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", REASON_AGENT_STOPPED)
    assert REASON_AGENT_STOPPED == "AgentStopped"
    assert ready["message"] == (
        "the node agent stopped (SIGTERM or SIGINT); status.gpus holds its last readings, and "
        "no new work is placed on this node until the agent runs again"
    )
    assert body["gpuCount"] == 2


POD_A = "0f4c4a5e-8a3a-4b7e-9a51-3c1d2e3f4a5b"
POD_B = "1e2d3c4b-0000-4000-8000-00000000000b"
MIXED = (
    *H100,
    GpuReading(
        2,
        "GPU-gb10",
        "NVIDIA GB10",
        None,
        None,
        None,
        memory_info_supported=False,
        processes=(GpuProcess(7, None, POD_B),),
    ),
    GpuReading(
        3,
        "MIG-3a",
        "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
        20 * GIB,
        12 * GIB,
        8 * GIB,
        reserved_bytes=0,
        mig=MigInstance("GPU-3", 1, 0),
        processes=(
            GpuProcess(10, 5 * GIB, POD_A),
            GpuProcess(11, 2 * GIB, POD_A),
            GpuProcess(12, 1 * GIB, None),
        ),
    ),
    GpuReading(
        3,
        "MIG-3b",
        "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
        20 * GIB,
        20 * GIB,
        0,
        mig=MigInstance("GPU-3", 2),
    ),
)


def test_mig_devices_unified_memory_and_pods_are_published() -> None:
    body = build_status(Observation("nvml", MIXED), T0, [], None)
    GPUNodeStatus.model_validate(body)
    gpus = {g["uuid"]: g for g in body["gpus"]}
    assert list(gpus) == ["GPU-0", "GPU-1", "GPU-gb10", "MIG-3a", "MIG-3b"]
    assert body["gpuCount"] == 5
    # A unified-memory part: listed, flagged, no memory figures at all (not zero).
    assert gpus["GPU-gb10"] == {
        "uuid": "GPU-gb10",
        "index": 2,
        "product": "NVIDIA GB10",
        "memoryInfoSupported": False,
        "pods": [{"uid": POD_B}],  # its pod is known, its bytes are not
    }
    # MIG devices share their parent's index and are told apart by uuid and mig.
    assert gpus["MIG-3a"] == {
        "uuid": "MIG-3a",
        "index": 3,
        "product": "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
        "memoryInfoSupported": True,
        "totalBytes": 20 * GIB,
        "freeBytes": 12 * GIB,
        "usedBytes": 8 * GIB,
        "driverReservedBytes": 0,
        "mig": {"parentUUID": "GPU-3", "gpuInstanceId": 1, "computeInstanceId": 0},
        "pods": [{"uid": POD_A, "usedBytes": 7 * GIB}],  # the pod-less process is not a pod
    }
    assert gpus["MIG-3b"]["mig"] == {"parentUUID": "GPU-3", "gpuInstanceId": 2}
    assert "pods" not in gpus["MIG-3b"]
    # The unified-memory part adds nothing to the node's free memory.
    assert body["freeBytes"] == (70 + 80 + 12 + 20) * GIB
    assert body["product"] == (
        "NVIDIA A100-SXM4-40GB MIG 3g.20gb, NVIDIA GB10, NVIDIA H100 80GB HBM3"
    )
    assert body["conditions"][0]["message"] == "read 5 GPU(s) through nvml"


def test_the_driver_reservation_is_published_apart_from_the_operators() -> None:
    reading = GpuReading(
        0,
        "GPU-0",
        "NVIDIA H100 80GB HBM3",
        81559 * MIB,
        (81559 - 475) * MIB,
        0,
        reserved_bytes=475 * MIB,
    )
    (gpu,) = build_status(Observation("nvml", (reading,)), T0, [], None)["gpus"]
    assert gpu["driverReservedBytes"] == 475 * MIB
    assert "reservedBytes" not in gpu  # the operator's field: never written by the agent


def test_pods_are_sorted_by_uid_and_absent_without_pod_processes() -> None:
    reading = GpuReading(
        0,
        "GPU-0",
        "H100",
        GIB,
        0,
        GIB,
        processes=(
            GpuProcess(1, 3, POD_B),
            GpuProcess(2, 4, POD_A),
            GpuProcess(3, 5, None),
        ),
    )
    ((gpu,), _) = gpu_entries((reading,))
    assert [(p.uid, p.used_bytes) for p in gpu.pods or []] == [(POD_A, 4), (POD_B, 3)]
    ((bare,), _) = gpu_entries(
        (GpuReading(0, "GPU-0", "H100", GIB, GIB, 0, processes=(GpuProcess(3, 5, None),)),)
    )
    assert bare.pods is None


@pytest.mark.parametrize(
    ("uuid", "published", "why"),
    [
        ("GPU-0", set(), None),
        ("MIG-3a", {"MIG-3b"}, None),
        ("", set(), "no UUID"),
        ("GPU-" + "x" * 200, set(), "UUID longer than 128 characters"),
        ("GPU-0", {"GPU-0"}, "duplicate UUID (index 0)"),
    ],
)
def test_left_out_reason(uuid: str, published: set[str], why: str | None) -> None:
    reading = GpuReading(0, uuid, "H100", GIB, GIB, 0)
    assert left_out_reason(reading, published) == why


def test_what_the_crd_cannot_key_is_named_instead_of_failing_the_whole_write() -> None:
    readings = (
        *H100,
        GpuReading(2, "GPU-0", "NVIDIA H100 80GB HBM3", 80 * GIB, 80 * GIB, 0),
        GpuReading(3, "", "NVIDIA H100 80GB HBM3", 80 * GIB, 80 * GIB, 0),
    )
    body = build_status(Observation("dcgm", readings), T0, [], None)
    assert [g["uuid"] for g in body["gpus"]] == ["GPU-0", "GPU-1"]
    assert body["conditions"][0]["message"] == (
        "read 2 GPU(s) through dcgm; not published: GPU-0: duplicate UUID (index 2); GPU 3: no UUID"
    )


def test_empty_node_has_zero_gpus_and_no_product() -> None:
    body = build_status(Observation("static", ()), T0, [], None)
    assert body["gpus"] == [] and body["gpuCount"] == 0 and "product" not in body


def test_pod_usage_sums_per_pod_and_keeps_unknown_apart() -> None:
    reading = GpuReading(
        0,
        "GPU-0",
        "H100",
        1,
        1,
        0,
        processes=(
            GpuProcess(1, 5, "a"),
            GpuProcess(2, 7, "a"),
            GpuProcess(3, None, "b"),
            GpuProcess(4, 9, None),
            GpuProcess(5, None, "a"),
        ),
    )
    assert pod_usage(reading) == {"a": 12, "b": None}
