"""The GPUNode status the agent writes: valid for the API models, Ready kept or flipped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controller.agent.readings import GpuProcess, GpuReading, MigInstance
from controller.agent.status import (
    REASON_BACKEND_FAILED,
    REASON_GPUS_READ,
    Observation,
    build_status,
    pod_usage,
)
from controller.api.gpunode import GPUNodeStatus

GIB = 2**30
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
    assert body["freeGiB"] == "150.00 GiB"
    assert body["heartbeatTime"] == "2025-01-01T12:00:00Z"
    assert body["gpus"][0] == {"index": 0, "uuid": "GPU-0", "product": "NVIDIA H100 80GB HBM3",
                               "totalBytes": 80 * GIB, "freeBytes": 70 * GIB,
                               "usedBytes": 10 * GIB}
    (ready,) = body["conditions"]
    assert ready["type"] == "Ready" and ready["status"] == "True"
    assert ready["reason"] == REASON_GPUS_READ
    assert ready["message"] == "read 2 GPU(s) through static"
    assert ready["observedGeneration"] == 1


def test_ready_keeps_its_transition_time_until_the_status_flips() -> None:
    first = build_status(Observation("nvml", tuple(H100)), T0, [], 1)["conditions"]
    later = build_status(Observation("nvml", tuple(H100)), T0 + timedelta(minutes=5), first, 1)
    assert later["conditions"][0]["lastTransitionTime"] == "2025-01-01T12:00:00Z"
    failed = build_status(
        Observation("nvml", tuple(H100), "nvml: Driver Not Loaded"),
        T0 + timedelta(minutes=6), later["conditions"], 1,
    )
    (ready,) = failed["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", REASON_BACKEND_FAILED)
    assert ready["message"] == "nvml: Driver Not Loaded"
    assert ready["lastTransitionTime"] == "2025-01-01T12:06:00Z"
    assert failed["gpuCount"] == 2  # the last readings stay, marked stale by Ready=False


def test_parts_the_crd_cannot_hold_yet_are_named_not_published_as_zero() -> None:
    readings = (
        *H100,
        GpuReading(2, "GPU-gb10", "NVIDIA GB10", None, None, None, memory_info_supported=False),
        GpuReading(3, "MIG-1", "A100 MIG", 20 * GIB, 20 * GIB, 0, mig=MigInstance("GPU-3", 1)),
    )
    body = build_status(Observation("nvml", readings), T0, [], None)
    assert [g["uuid"] for g in body["gpus"]] == ["GPU-0", "GPU-1"]
    message = body["conditions"][0]["message"]
    assert message == (
        "read 2 GPU(s) through nvml; not published: GPU-gb10: memory info not supported "
        "(unified memory); MIG-1: MIG device on GPU 3"
    )


def test_empty_node_has_zero_gpus_and_no_product() -> None:
    body = build_status(Observation("static", ()), T0, [], None)
    assert body["gpus"] == [] and body["gpuCount"] == 0 and "product" not in body


def test_pod_usage_sums_per_pod_and_keeps_unknown_apart() -> None:
    reading = GpuReading(0, "GPU-0", "H100", 1, 1, 0, processes=(
        GpuProcess(1, 5, "a"), GpuProcess(2, 7, "a"), GpuProcess(3, None, "b"),
        GpuProcess(4, 9, None), GpuProcess(5, None, "a"),
    ))
    assert pod_usage(reading) == {"a": 12, "b": None}
