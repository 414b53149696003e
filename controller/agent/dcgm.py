"""The dcgm backend: scrapes an existing dcgm-exporter for its framebuffer gauges.

Why: clusters with the NVIDIA GPU Operator already run dcgm-exporter on every GPU node, with
the driver and DCGM set up; reading its /metrics needs no NVIDIA runtime for the agent. The
exporter reports in MiB (``DCGM_FI_DEV_FB_FREE``, ``_USED``, ``_RESERVED``, and ``_TOTAL``
where its counters CSV enables it); the agent converts to bytes at once. It lists no
processes, so per-pod usage is not available from this backend. MIG instances are told apart
by the ``GPU_I_ID`` label and carry their parent's UUID (the exporter does not name MIG UUIDs).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from controller.agent.readings import BackendError, GpuReading, MigInstance
from controller.base.units import MIB

FIELDS = {
    "DCGM_FI_DEV_FB_FREE": "free",
    "DCGM_FI_DEV_FB_USED": "used",
    "DCGM_FI_DEV_FB_RESERVED": "reserved",
    "DCGM_FI_DEV_FB_TOTAL": "total",
}
# Spelled either way across exporter versions (2.x wrote `uuid`; its template makes the UUID
# label's name configurable).
HOST_LABELS = ("Hostname", "hostname")
UUID_LABELS = ("UUID", "uuid")


@dataclass
class _Device:
    index: int
    uuid: str
    product: str
    gpu_instance_id: int | None
    mib: dict[str, int] = field(default_factory=dict)


def parse_dcgm_metrics(text: str, host: str | None) -> list[GpuReading]:
    """GPUs in a dcgm-exporter exposition; ``host``: keep only series of that host.

    Series without a host label are kept. Raises BackendError on a payload that is not
    Prometheus text, that has no framebuffer gauges, or whose hosts are all other nodes.
    """
    devices: dict[tuple[str, int | None], _Device] = {}
    hosts_seen: set[str] = set()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = FIELDS.get(sample.name)
                if name is None:
                    continue
                labels = sample.labels
                sample_host = next((labels[k] for k in HOST_LABELS if k in labels), None)
                if sample_host is not None:
                    hosts_seen.add(sample_host)
                    if host is not None and sample_host != host:
                        continue
                gi = labels.get("GPU_I_ID") or None
                uuid = next((labels[k] for k in UUID_LABELS if k in labels), "")
                key = (uuid, int(gi) if gi else None)
                device = devices.setdefault(
                    key,
                    _Device(
                        int(labels.get("gpu", "0")), key[0], labels.get("modelName", ""), key[1]
                    ),
                )
                # Pod-mapped exporters repeat a GPU's series per pod: the first value stands.
                device.mib.setdefault(name, round(sample.value))
    except ValueError as error:
        raise BackendError(f"dcgm: the exporter's answer is not valid: {error}") from None
    # A MIG-enabled GPU is listed by its instances; its own whole-GPU series would count them
    # all again.
    mig_parents = {uuid for uuid, gi in devices if gi is not None}
    readings = [
        _reading(d)
        for (uuid, gi), d in devices.items()
        if {"free", "used"} <= d.mib.keys() and not (gi is None and uuid in mig_parents)
    ]
    if not readings:
        if hosts_seen and host not in hosts_seen:
            raise BackendError(
                f"dcgm: the exporter reports host(s) {', '.join(sorted(hosts_seen))}, not "
                f"{host!r}: point --dcgm-url at this node's exporter or set --dcgm-host"
            )
        raise BackendError(
            "dcgm: the exporter exports no DCGM_FI_DEV_FB_FREE and DCGM_FI_DEV_FB_USED: "
            "enable both in its counters CSV"
        )
    return sorted(readings, key=lambda r: (r.index, r.uuid))


def _reading(device: _Device) -> GpuReading:
    mib = device.mib
    reserved = mib.get("reserved")
    total = mib.get("total", mib["free"] + mib["used"] + (reserved or 0))
    mig = None
    uuid = device.uuid
    if device.gpu_instance_id is not None:
        mig = MigInstance(parent_uuid=device.uuid, gpu_instance_id=device.gpu_instance_id)
        uuid = f"{device.uuid}/gi/{device.gpu_instance_id}"
    return GpuReading(
        index=device.index,
        uuid=uuid,
        product=device.product,
        total_bytes=total * MIB,
        free_bytes=mib["free"] * MIB,
        used_bytes=mib["used"] * MIB,
        reserved_bytes=None if reserved is None else reserved * MIB,
        mig=mig,
    )


def fetch_url(url: str, timeout_s: float) -> str:
    """GET ``url`` as text; BackendError with the reason when it cannot."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return str(response.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise BackendError(
            f"dcgm: cannot scrape {url}: {reason} (is dcgm-exporter running on this node? "
            "set --dcgm-url)"
        ) from None


class DcgmBackend:
    """Scrapes ``url`` on every read."""

    name = "dcgm"

    def __init__(
        self,
        url: str,
        host: str | None,
        timeout_s: float = 5.0,
        fetch: Callable[[str, float], str] = fetch_url,
    ) -> None:
        self.url = url
        self.host = host
        self.timeout_s = timeout_s
        self.fetch = fetch

    def read(self) -> list[GpuReading]:
        return parse_dcgm_metrics(self.fetch(self.url, self.timeout_s), self.host)
