"""`make demo` as a user runs it (`python -m e2e.demo --once`): its own control plane, agents,
operator and Prometheus; the printed `kubectl get ftj` shows the four decisions, and nothing
it started outlives it. Beside the session's control plane: the demo brings its own."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that contain `text`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(cmdline)
    return found


def test_demo_prints_admit_resize_queue_and_reject_and_stops_everything() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "e2e.demo", "--once", "--prometheus-port", "0"],
        cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True,
        timeout=480, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    table = done.stdout.split("$ kubectl get ftj -A\n", 1)[1].split("\n\n", 1)[0]
    header, *lines = [line for line in table.splitlines() if line.strip()]
    # A column's cells start where its header does; an empty cell (no workload yet) is blank.
    starts = [header.index(name) for name in ("ADMITTED", "REASON", "WORKLOAD", "AGE")]
    rows = {
        line.split()[1]: [line[a:b].strip() for a, b in itertools.pairwise(starts)]
        for line in lines
    }
    assert rows["llama-qlora"][:2] == ["True", "Fits"]
    assert rows["llama-qlora"][2] in ("Starting", "Running")
    assert rows["llama-full"][:2] == ["True", "Resized"]
    assert rows["qwen-72b-lora"] == ["False", "WaitingForVRAM", ""]
    assert rows["llama-405b-full"] == ["False", "InsufficientVRAM", ""]
    assert "llama-full: resized 8 -> 4 GPUs (policy Resize)" in done.stdout
    assert "denied the request: vramgate: InsufficientVRAM" in done.stdout  # the preset, at apply
    assert "Prometheus: http://127.0.0.1:" in done.stdout
    # Everything it started ran from its work dir (control plane, agents' static files,
    # operator certs, Prometheus' TSDB): none of it runs now, and the dir is gone.
    kubeconfig = Path(done.stdout.split("KUBECONFIG=", 1)[1].split()[0])
    workdir = kubeconfig.parent.parent
    assert processes_mentioning(str(workdir)) == []
    assert not workdir.exists()
