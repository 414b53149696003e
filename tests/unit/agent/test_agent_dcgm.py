"""The dcgm backend against dcgm-exporter payloads laid out as the exporter's own template writes
them (``data/``): both host-label spellings, pod-mapped duplicates, MIG instances."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.agent.dcgm import DcgmBackend, fetch_url, parse_dcgm_metrics
from controller.agent.readings import BackendError, MigInstance

MIB = 2**20
DATA = Path(__file__).parent / "data"
H100 = (DATA / "dcgm-exporter-h100.txt").read_text()
A100_MIG = (DATA / "dcgm-exporter-a100-mig.txt").read_text()


def test_h100_node_in_bytes_with_reserved_and_total_from_the_three_gauges() -> None:
    gpus = parse_dcgm_metrics(H100, host="gpu-node-0")
    assert [g.index for g in gpus] == [0, 1]
    idle, busy = gpus
    assert idle.uuid == "GPU-6a7ad8f1-22b4-4c4e-9d1a-5e3f0b1c2d40"
    assert idle.product == "NVIDIA H100 80GB HBM3"
    assert (idle.free_bytes, idle.used_bytes, idle.reserved_bytes) == (81034 * MIB, 0, 525 * MIB)
    assert idle.total_bytes == 81559 * MIB  # free + used + reserved: H100's NVML total
    assert (busy.free_bytes, busy.used_bytes) == (40074 * MIB, 40960 * MIB)
    assert busy.processes == ()  # the exporter lists no processes
    assert busy.mig is None and busy.memory_info_supported


def test_the_total_gauge_wins_where_the_exporter_exports_it() -> None:
    text = H100 + (
        "# HELP DCGM_FI_DEV_FB_TOTAL Framebuffer memory total (in MiB).\n"
        "# TYPE DCGM_FI_DEV_FB_TOTAL gauge\n"
        'DCGM_FI_DEV_FB_TOTAL{gpu="0",UUID="GPU-6a7ad8f1-22b4-4c4e-9d1a-5e3f0b1c2d40",'
        'Hostname="gpu-node-0"} 81559\n'
    )
    assert parse_dcgm_metrics(text, "gpu-node-0")[0].total_bytes == 81559 * MIB


def test_lowercase_hostname_and_mig_instances_replace_their_parent() -> None:
    gpus = parse_dcgm_metrics(A100_MIG, host="mig-node")
    parent = "GPU-1f2e3d4c-5b6a-4978-8a9b-0c1d2e3f4a5b"
    assert [g.mig for g in gpus] == [MigInstance(parent, 1), MigInstance(parent, 2)]
    assert [g.uuid for g in gpus] == [f"{parent}/gi/1", f"{parent}/gi/2"]
    assert [(g.free_bytes, g.used_bytes) for g in gpus] == [
        (9856 * MIB, 9856 * MIB),
        (19712 * MIB, 0),
    ]
    assert all(g.reserved_bytes is None for g in gpus)  # not exported: unknown, not zero
    assert gpus[0].total_bytes == 19712 * MIB


def test_series_of_other_hosts_are_dropped() -> None:
    other_host = "\n".join(
        line.replace('gpu="0"', 'gpu="7"')
        .replace("2d40", "9999")
        .replace('Hostname="gpu-node-0"', 'Hostname="gpu-node-9"')
        for line in H100.splitlines()
        if line.startswith("DCGM_FI_DEV_FB")
    )
    gpus = parse_dcgm_metrics(H100 + other_host + "\n", host="gpu-node-0")
    assert [g.index for g in gpus] == [0, 1]
    with pytest.raises(BackendError, match=r"reports host\(s\) gpu-node-0, not 'elsewhere'"):
        parse_dcgm_metrics(H100, host="elsewhere")


def test_series_without_a_host_label_are_kept() -> None:
    text = H100.replace(',Hostname="gpu-node-0"', "")
    assert len(parse_dcgm_metrics(text, host="gpu-node-0")) == 2


def test_missing_framebuffer_gauges_and_garbage_are_backend_errors() -> None:
    no_fb = "\n".join(line for line in H100.splitlines() if "FB_USED" not in line) + "\n"
    with pytest.raises(BackendError, match="DCGM_FI_DEV_FB_FREE and DCGM_FI_DEV_FB_USED"):
        parse_dcgm_metrics(no_fb, host="gpu-node-0")
    with pytest.raises(BackendError, match="not valid"):
        parse_dcgm_metrics('DCGM_FI_DEV_FB_FREE{gpu="0" 1\n', host=None)


@pytest.fixture
def exporter() -> Iterator[str]:
    """A local HTTP server that serves the H100 payload at /metrics."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = H100.encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_backend_scrapes_over_http(exporter: str) -> None:
    backend = DcgmBackend(f"{exporter}/metrics", host="gpu-node-0", timeout_s=2)
    assert [g.index for g in backend.read()] == [0, 1]


def test_unreachable_or_failing_exporter_is_a_backend_error(exporter: str) -> None:
    with pytest.raises(BackendError, match=r"cannot scrape .*/nothing.*Not Found"):
        fetch_url(f"{exporter}/nothing", 2)
    with pytest.raises(BackendError, match="is dcgm-exporter running on this node"):
        fetch_url("http://127.0.0.1:1/metrics", 2)
