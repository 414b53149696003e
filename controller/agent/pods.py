"""Which pod a GPU process belongs to, from the process's cgroup.

Why: the controller must tell memory used by jobs it admitted (already covered by their
reservations) from memory used by anyone else, or it counts a running job twice. NVML gives
host PIDs; the kubelet puts every container in a cgroup whose path holds the pod UID:

* cgroupfs driver: ``/kubepods/burstable/pod<uid>/<container>`` (Guaranteed pods have no
  QoS level: ``/kubepods/pod<uid>/...``)
* systemd driver: ``/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid with _ for ->.slice/cri-containerd-<id>.scope``

in ``/proc/<pid>/cgroup`` as ``hierarchy:controllers:path`` lines (cgroup v1: one per
hierarchy; v2: the single ``0::`` line). Static pods' UIDs are 32 hex digits without dashes.
The agent needs the host's PID namespace (``hostPID: true``) or the host's /proc mounted and
named with ``--proc-root`` to read other containers' processes.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from controller.agent.readings import GpuReading

_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD_SEGMENT = re.compile(rf"(?:^|[/-])pod({_UUID}|[0-9a-f]{{32}})(?:\.slice)?(?=/|$)")


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in the contents of a ``/proc/<pid>/cgroup`` file, or None (not a pod)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        match = _POD_SEGMENT.search(path)
        if match:
            return match.group(1).replace("_", "-")
    return None


class PodResolver:
    """Maps host PIDs to pod UIDs by reading ``<proc_root>/<pid>/cgroup``."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root

    def pod_uid(self, pid: int) -> str | None:
        """None when the process has exited, is hidden from us, or runs outside any pod."""
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text()
        except OSError:
            return None
        return pod_uid_from_cgroup(text)

    def attribute(self, readings: list[GpuReading]) -> list[GpuReading]:
        """The readings with each process's ``pod_uid`` filled where the backend left it out."""
        result = []
        for reading in readings:
            processes = tuple(
                proc if proc.pod_uid else dataclasses.replace(proc, pod_uid=self.pod_uid(proc.pid))
                for proc in reading.processes
            )
            result.append(dataclasses.replace(reading, processes=processes))
        return result
