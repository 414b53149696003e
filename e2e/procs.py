"""Start, track and stop the control plane's processes.

Why a pid file with start times: ``down`` may run in another Python process long after
``up``, and must stop exactly the processes ``up`` started. A pid alone can be reused by an
unrelated process; the pair (pid, kernel start time) cannot.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


@dataclass(frozen=True)
class ManagedProcess:
    """One process this harness started."""

    name: str
    pid: int
    start_time: int
    log: str


def _proc_stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; fields after it are fixed.
    return raw[raw.rindex(")") + 2 :].split()


def process_start_time(pid: int) -> int | None:
    fields = _proc_stat(pid)
    return int(fields[19]) if fields else None


# Popen objects of the processes this Python process started, so they can be reaped.
_children: dict[int, subprocess.Popen[bytes]] = {}


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our child, so it stops being a zombie."""
    child = _children.get(pid)
    if child is not None:
        child.poll()


def is_running(proc: ManagedProcess) -> bool:
    """True while the very process we started (not a pid reuse) is alive."""
    _reap(proc.pid)
    fields = _proc_stat(proc.pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return int(fields[19]) == proc.start_time


def _kill_with_parent() -> None:
    """Runs in the child before exec: the kernel sends SIGKILL when the parent dies.

    SIGKILL, not SIGTERM: all components get it at once, and a kube-apiserver whose etcd
    is gone hangs in graceful shutdown instead of exiting.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def start(
    name: str,
    argv: list[str],
    log: Path,
    cwd: Path,
    *,
    env: dict[str, str] | None = None,
    die_with_parent: bool = False,
) -> ManagedProcess:
    """Start a process in its own session, detached from our stdin and terminal signals.

    Its own session: ``python -m e2e.cluster up`` exits while the control plane keeps
    running, and a Ctrl-C in the test terminal reaches pytest (which then tears down in
    order) rather than killing etcd under a live API server. ``die_with_parent`` is for
    test sessions: should pytest itself be killed, no component outlives it.
    """
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_kill_with_parent if die_with_parent else None,
        )
    _children[popen.pid] = popen
    start_time = process_start_time(popen.pid)
    return ManagedProcess(name, popen.pid, start_time or -1, str(log))


def stop(proc: ManagedProcess, timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; a no-op for a process that is gone."""
    if not is_running(proc):
        return
    os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_running(proc):
            return
        time.sleep(0.05)
    if is_running(proc):
        os.kill(proc.pid, signal.SIGKILL)
    while is_running(proc):
        time.sleep(0.05)


def stop_all(procs: list[ManagedProcess]) -> None:
    """Stop in reverse start order: clients before the API server, etcd last."""
    for proc in reversed(procs):
        stop(proc)


def write_pidfile(path: Path, procs: list[ManagedProcess]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([asdict(p) for p in procs], indent=2) + "\n")
    tmp.replace(path)


def read_pidfile(path: Path) -> list[ManagedProcess]:
    if not path.exists():
        return []
    return [ManagedProcess(**entry) for entry in json.loads(path.read_text())]


#: How a listener fails on a port another program took between `free_ports` and its bind
#: (Go's and Python's words: etcd, the Kubernetes components, Prometheus, aiohttp).
PORT_TAKEN = "address already in use"
#: Starts tried with fresh ports before a taken port fails the start.
PORT_TRIES = 3


def port_taken(log: str | Path) -> bool:
    """Whether the process logging to `log` failed to listen on a port that was taken."""
    return PORT_TAKEN in log_tail(log).lower()


def free_ports(count: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1, held open together so none repeats.

    Free now only: another program may bind one before the process given it does. Programs
    of ours bind port 0 and say which they got; for the others (etcd, the Kubernetes
    components, Prometheus), a start that fails with `port_taken` is tried again."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def log_tail(path: str | Path, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
