"""Read this machine's GPUs through the agent's NVML backend and print what it found as JSON.

For a GPU machine (CI does not depend on it): after ``pip install -e .``, run
``python scripts/nvml_check.py``. It exercises
the same code the agent runs (v2 memory call or v1 fallback, MIG, NOT_SUPPORTED parts,
processes and their pods) and adds what a reviewer needs to judge the numbers: the driver
version, nvidia-smi's own view when it is installed, and how long a read takes.
``--fake`` runs it against the fake NVML module instead (to check the script itself).
Exit status: 0 when NVML answered, 1 when it did not (the error is in the JSON).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controller.agent.nvml import NvmlBackend
from controller.agent.pods import PodResolver
from controller.agent.readings import BackendError
from controller.agent.status import Observation, build_status, pod_usage

READS = 20  # enough to time a read; a poll does one


def _library(fake: bool) -> Any:
    if not fake:
        import pynvml

        return pynvml
    from controller.agent.fake_nvml import FakeNvml, FakeProcess, h100
    from controller.base.units import GIB

    return FakeNvml([h100(0), h100(1, used=30 * GIB, processes=[FakeProcess(1, 29 * GIB)])])


def _nvidia_smi() -> str | None:
    """nvidia-smi's memory columns, to compare with the backend's bytes (MiB there)."""
    if shutil.which("nvidia-smi") is None:
        return None
    query = "index,uuid,name,memory.total,memory.used,memory.free,memory.reserved"
    result = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return (result.stdout or result.stderr).strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", action="store_true", help="use the fake NVML module")
    parser.add_argument("--proc-root", default="/proc", help="for process -> pod mapping")
    args = parser.parse_args(argv)

    lib = _library(args.fake)
    backend = NvmlBackend(lib)
    report: dict[str, Any] = {
        "fake": args.fake,
        "host": Path("/etc/hostname").read_text().strip()
        if Path("/etc/hostname").exists()
        else None,
    }
    try:
        started = time.perf_counter()
        readings = PodResolver(Path(args.proc_root)).attribute(backend.read())
        report["first_read_s"] = round(time.perf_counter() - started, 4)
        report["driver"] = lib.nvmlSystemGetDriverVersion()
        started = time.perf_counter()
        for _ in range(READS):
            backend.read()
        report["read_s"] = round((time.perf_counter() - started) / READS, 5)
        report["memory_call"] = backend.memory_call
    except BackendError as error:
        report["error"] = str(error)
        print(json.dumps(report, indent=2))
        return 1
    finally:
        backend.close()
    report["gpus"] = [{**dataclasses.asdict(r), "pods": pod_usage(r)} for r in readings]
    report["gpunode_status"] = build_status(
        Observation(backend.name, tuple(readings)), datetime.now(UTC), [], None
    )
    report["nvidia_smi"] = None if args.fake else _nvidia_smi()
    print(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
