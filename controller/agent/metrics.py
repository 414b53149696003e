"""The agent's Prometheus metrics: measured GPU memory, and the agent's own health.

Why a custom collector: GPUs come and go (MIG reconfiguration, a lost GPU), and a collector
that renders the latest reading cannot leave a vanished GPU's series behind as labelled
gauges would. Label names follow dcgm-exporter (``gpu``, ``UUID``, ``modelName``, and
``GPU_I_ID`` for MIG) so dashboards can join the two; units are bytes and seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller.agent.change import REASONS
from controller.agent.readings import GpuReading
from controller.agent.status import pod_usage

GPU_LABELS = ["node", "gpu", "UUID", "modelName", "GPU_I_ID"]
MEMORY_SERIES = (
    ("total", "total_bytes", "Framebuffer memory of the GPU, in bytes."),
    ("free", "free_bytes", "Framebuffer memory free, in bytes, as the backend read it."),
    ("used", "used_bytes", "Framebuffer memory used, in bytes, as the backend read it."),
    (
        "reserved",
        "reserved_bytes",
        "Framebuffer memory the driver reserves (NVML v2 memory call), in bytes.",
    ),
)


class AgentMetrics(Collector):
    """Renders the agent's latest state on every scrape; the loop updates it."""

    def __init__(self, node: str, backend: str) -> None:
        self.node = node
        self.backend = backend
        self._lock = threading.Lock()
        self._readings: tuple[GpuReading, ...] = ()
        self._last_read: float | None = None
        self._scrape_errors = 0
        self._api_errors = 0
        self._writes = dict.fromkeys(REASONS, 0)

    def observe(self, readings: list[GpuReading], at: datetime) -> None:
        with self._lock:
            self._readings = tuple(readings)
            self._last_read = at.timestamp()

    def count_scrape_error(self) -> None:
        with self._lock:
            self._scrape_errors += 1

    def count_write(self, reason: str) -> None:
        with self._lock:
            self._writes[reason] += 1

    def count_api_error(self) -> None:
        with self._lock:
            self._api_errors += 1

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            readings, last_read = self._readings, self._last_read
            scrape_errors, api_errors = self._scrape_errors, self._api_errors
            writes = dict(self._writes)
        yield from self._memory(readings)
        yield from self._pods(readings)
        supported = GaugeMetricFamily(
            "vramgate_gpu_memory_info_supported",
            "1 where the GPU reports framebuffer memory; 0 on unified-memory parts.",
            labels=GPU_LABELS,
        )
        for r in readings:
            supported.add_metric(self._labels(r), 1.0 if r.memory_info_supported else 0.0)
        yield supported
        errors = CounterMetricFamily(
            "vramgate_agent_scrape_errors",
            "Reads of the GPU backend that failed.",
            labels=["node", "backend"],
        )
        errors.add_metric([self.node, self.backend], scrape_errors)
        yield errors
        api = CounterMetricFamily(
            "vramgate_agent_api_errors", "Writes of the GPUNode that failed.", labels=["node"]
        )
        api.add_metric([self.node], api_errors)
        yield api
        written = CounterMetricFamily(
            "vramgate_agent_status_writes",
            "GPUNode status writes, by why they were due (initial, ready, inventory, memory, "
            "pods, heartbeat).",
            labels=["node", "reason"],
        )
        for reason, count in writes.items():
            written.add_metric([self.node, reason], count)
        yield written
        if last_read is not None:
            yield GaugeMetricFamily(
                "vramgate_agent_last_successful_read_timestamp_seconds",
                "When the backend last answered, in seconds since the Unix epoch.",
                value=last_read,
            )

    def _labels(self, r: GpuReading) -> list[str]:
        gi = str(r.mig.gpu_instance_id) if r.mig else ""
        return [self.node, str(r.index), r.uuid, r.product, gi]

    def _memory(self, readings: tuple[GpuReading, ...]) -> Iterator[Metric]:
        for field, suffix, doc in MEMORY_SERIES:
            family = GaugeMetricFamily(f"vramgate_gpu_memory_{suffix}", doc, labels=GPU_LABELS)
            for r in readings:
                value = getattr(r, f"{field}_bytes")
                if value is not None:  # unknown is absent, never zero
                    family.add_metric(self._labels(r), float(value))
            yield family

    def _pods(self, readings: tuple[GpuReading, ...]) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "vramgate_gpu_pod_memory_used_bytes",
            "Framebuffer memory used by the processes of one pod on one GPU, in bytes.",
            labels=[*GPU_LABELS, "pod_uid"],
        )
        for r in readings:
            for uid, used in sorted(pod_usage(r).items()):
                if used is not None:
                    family.add_metric([*self._labels(r), uid], float(used))
        yield family


def agent_registry(metrics: AgentMetrics) -> CollectorRegistry:
    """A registry of its own, so tests and the process never share the global one."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return registry
