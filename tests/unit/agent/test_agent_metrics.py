"""The metrics endpoint serves the documented series, read back with prometheus-client's parser."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY, start_http_server
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from controller.agent.metrics import AgentMetrics, agent_registry
from controller.agent.readings import GpuProcess, GpuReading, MigInstance

MIB = 2**20
GIB = 2**30
READ_AT = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
READINGS = [
    GpuReading(
        0,
        "GPU-0",
        "NVIDIA H100 80GB HBM3",
        80 * GIB,
        50 * GIB,
        29 * GIB,
        GIB,
        processes=(
            GpuProcess(1, 20 * GIB, "pod-a"),
            GpuProcess(2, 8 * GIB, "pod-a"),
            GpuProcess(3, GIB, None),
            GpuProcess(4, None, "pod-b"),
        ),
    ),
    GpuReading(1, "GPU-gb10", "NVIDIA GB10", None, None, None, memory_info_supported=False),
    GpuReading(2, "MIG-1", "A100 MIG 3g.20gb", 20 * GIB, 20 * GIB, 0, mig=MigInstance("GPU-2", 5)),
]


@pytest.fixture
def scrape() -> Iterator[dict[str, list[Sample]]]:
    metrics = AgentMetrics("gpu-node-0", "nvml")
    metrics.observe(READINGS, READ_AT)
    metrics.count_scrape_error()
    metrics.count_scrape_error()
    metrics.count_write("initial")
    metrics.count_write("heartbeat")
    metrics.count_api_error()
    server, thread = start_http_server(0, "127.0.0.1", registry=agent_registry(metrics))
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        samples: dict[str, list[Sample]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append(sample)
        yield samples
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def by_uuid(samples: list[Sample]) -> dict[str, float]:
    return {s.labels["UUID"]: s.value for s in samples}


def test_memory_series_in_bytes_with_dcgm_exporter_labels(
    scrape: dict[str, list[Sample]],
) -> None:
    total = scrape["vramgate_gpu_memory_total_bytes"]
    assert total[0].labels == {
        "node": "gpu-node-0",
        "gpu": "0",
        "UUID": "GPU-0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "GPU_I_ID": "",
    }
    assert by_uuid(total) == {"GPU-0": 80 * GIB, "MIG-1": 20 * GIB}
    assert by_uuid(scrape["vramgate_gpu_memory_free_bytes"]) == {
        "GPU-0": 50 * GIB,
        "MIG-1": 20 * GIB,
    }
    assert by_uuid(scrape["vramgate_gpu_memory_used_bytes"]) == {"GPU-0": 29 * GIB, "MIG-1": 0}
    assert by_uuid(scrape["vramgate_gpu_memory_reserved_bytes"]) == {"GPU-0": GIB}
    assert [s.labels["GPU_I_ID"] for s in total] == ["", "5"]


def test_unified_memory_gpu_has_no_memory_series_only_its_flag(
    scrape: dict[str, list[Sample]],
) -> None:
    assert by_uuid(scrape["vramgate_gpu_memory_info_supported"]) == {
        "GPU-0": 1,
        "GPU-gb10": 0,
        "MIG-1": 1,
    }


def test_per_pod_usage_sums_a_pods_processes(scrape: dict[str, list[Sample]]) -> None:
    pods = scrape["vramgate_gpu_pod_memory_used_bytes"]
    assert [(s.labels["pod_uid"], s.value) for s in pods] == [("pod-a", 28 * GIB)]


def test_agent_health_series(scrape: dict[str, list[Sample]]) -> None:
    (errors,) = scrape["vramgate_agent_scrape_errors_total"]
    assert errors.labels == {"node": "gpu-node-0", "backend": "nvml"}
    assert errors.value == 2
    assert scrape["vramgate_agent_api_errors_total"][0].value == 1
    writes = {s.labels["reason"]: s.value for s in scrape["vramgate_agent_status_writes_total"]}
    assert writes == {
        "initial": 1,
        "ready": 0,
        "inventory": 0,
        "memory": 0,
        "pods": 0,
        "heartbeat": 1,
    }
    (last,) = scrape["vramgate_agent_last_successful_read_timestamp_seconds"]
    assert last.value == READ_AT.timestamp()


def test_before_the_first_read_there_is_no_last_read_time() -> None:
    metrics = AgentMetrics("n", "static")
    names = {m.name for m in metrics.collect()}
    assert "vramgate_agent_last_successful_read_timestamp_seconds" not in names
    assert "vramgate_agent_scrape_errors" in names


def test_the_global_registry_is_left_alone() -> None:
    agent_registry(AgentMetrics("n", "static"))
    assert (
        REGISTRY.get_sample_value(
            "vramgate_agent_scrape_errors_total", {"node": "n", "backend": "static"}
        )
        is None
    )
