"""The harness's third-party servers start again when the port chosen for them is taken.

Prometheus cannot bind port 0 and say which port it got: the harness chooses a free port,
and another program on the machine may take it before Prometheus binds it. A stand-in
`prometheus` (and `promtool`) fails as the real one does on a taken port, so the retry is
tested here without the real binaries (tests/integration/test_prometheus.py runs those).
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

import e2e.procs
import e2e.prometheus
from e2e.prometheus import Prometheus

#: Fails as Prometheus does on a taken port (Go's words); else answers /-/ready.
FAKE_PROMETHEUS = """\
import http.server, socket, sys
address = next(a for a in sys.argv if a.startswith("--web.listen-address="))
host, port = address.split("=", 1)[1].rsplit(":", 1)

class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/-/ready" else 404)
        self.end_headers()

try:
    server = http.server.HTTPServer((host, int(port)), Ready)
except OSError:
    print(f'msg="Error listening" err="listen tcp {host}:{port}: bind: address already in '
          'use"', file=sys.stderr, flush=True)
    sys.exit(1)
server.serve_forever()
"""


def _tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)


@pytest.fixture
def fake_prometheus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "prometheus", FAKE_PROMETHEUS)
    _tool(bin_dir, "promtool", "import sys; sys.exit(0)\n")
    monkeypatch.setenv("VRAMGATE_PROMETHEUS_BIN_DIR", str(bin_dir))


def test_prometheus_starts_again_on_another_port_when_its_port_was_taken(
    fake_prometheus: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        chosen: list[int] = []

        def first_taken(count: int) -> list[int]:
            ports = [taken] if not chosen else e2e.procs.free_ports(count)
            chosen.extend(ports)
            return ports

        monkeypatch.setattr(e2e.prometheus, "free_ports", first_taken)
        prometheus = Prometheus(tmp_path / "prometheus", [])
        try:
            prometheus.start()
            assert prometheus.port == chosen[-1] != taken
        finally:
            prometheus.stop()
    assert len(chosen) == 2


def test_a_port_asked_for_and_taken_fails_the_start_with_the_log(
    fake_prometheus: None, tmp_path: Path
) -> None:
    """A port the caller asked for (the demo's bookmarkable URL) is never swapped."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        prometheus = Prometheus(tmp_path / "prometheus", [], port=held.getsockname()[1])
        with pytest.raises(RuntimeError, match="address already in use"):
            prometheus.start()
