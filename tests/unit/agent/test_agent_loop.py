"""The poll loop with a fake clock: what it writes and when, retries, and the write rate."""

from __future__ import annotations

import dataclasses
import random
import threading
from datetime import datetime

import pytest

from controller.agent import change
from controller.agent.loop import Agent, LoopTiming
from controller.agent.metrics import AgentMetrics
from controller.agent.pods import PodResolver
from controller.agent.publisher import PublishError
from controller.agent.readings import BackendError, GpuProcess, GpuReading
from controller.agent.status import Observation
from controller.base.clock import FakeClock

MIB = 2**20
GIB = 2**30
TOTAL = 81559 * MIB
TIMING = LoopTiming(
    poll_interval_s=5,
    heartbeat_interval_s=30,
    change_threshold_bytes=256 * MIB,
    backoff_initial_s=1,
    backoff_max_s=60,
)


def gpu(index: int, used: int, processes: tuple[GpuProcess, ...] = ()) -> GpuReading:
    return GpuReading(
        index,
        f"GPU-{index}",
        "NVIDIA H100 80GB HBM3",
        TOTAL,
        TOTAL - used,
        used,
        processes=processes,
    )


class ScriptedBackend:
    """Returns what the test put in ``gpus``, or raises ``error``."""

    name = "scripted"

    def __init__(self, gpus: list[GpuReading]) -> None:
        self.gpus = gpus
        self.error: Exception | None = None
        self.reads = 0

    def read(self) -> list[GpuReading]:
        self.reads += 1
        if self.error is not None:
            raise self.error
        return list(self.gpus)


class RecordingPublisher:
    def __init__(self) -> None:
        self.written: list[tuple[Observation, datetime]] = []
        self.fail: str | None = None

    def publish(self, observation: Observation, now: datetime) -> None:
        if self.fail:
            raise PublishError(self.fail)
        self.written.append((observation, now))


def make_agent(
    gpus: list[GpuReading], timing: LoopTiming = TIMING
) -> tuple[Agent, ScriptedBackend, RecordingPublisher, FakeClock]:
    backend, publisher, clock = ScriptedBackend(gpus), RecordingPublisher(), FakeClock()
    agent = Agent(backend, PodResolver(), publisher, AgentMetrics("n", backend.name), timing, clock)
    agent.read_backoff.rand = agent.write_backoff.rand = lambda: 1.0  # no jitter in tests
    return agent, backend, publisher, clock


def poll(agent: Agent, clock: FakeClock, seconds: float = 5) -> str | None:
    clock.advance(seconds)
    return agent.step()


def test_first_poll_writes_then_small_jitter_waits_for_the_heartbeat() -> None:
    agent, backend, publisher, clock = make_agent([gpu(0, 10 * GIB)])
    assert agent.step() == change.INITIAL
    backend.gpus = [gpu(0, 10 * GIB + 200 * MIB)]  # under the 256 MiB threshold
    assert [poll(agent, clock) for _ in range(5)] == [None] * 5  # t = 5 .. 25
    assert poll(agent, clock) == change.HEARTBEAT  # t = 30
    assert publisher.written[-1][0].readings[0].used_bytes == 10 * GIB + 200 * MIB
    assert publisher.written[-1][1] == clock.wall()


def test_threshold_is_measured_from_the_last_write_so_drift_adds_up() -> None:
    agent, backend, _, clock = make_agent([gpu(0, 0)])
    agent.step()
    backend.gpus = [gpu(0, 200 * MIB)]
    assert poll(agent, clock) is None
    backend.gpus = [gpu(0, 400 * MIB)]  # 400 MiB from what was written, 200 from the last read
    assert poll(agent, clock) == change.MEMORY


def test_a_move_of_exactly_the_threshold_is_not_written() -> None:
    agent, backend, _, clock = make_agent([gpu(0, 0)])
    agent.step()
    backend.gpus = [gpu(0, 256 * MIB)]
    assert poll(agent, clock) is None
    backend.gpus = [gpu(0, 256 * MIB + 1)]
    assert poll(agent, clock) == change.MEMORY


def test_inventory_and_pod_changes_are_written_at_once() -> None:
    agent, backend, _, clock = make_agent([gpu(0, 0)])
    agent.step()
    backend.gpus = [gpu(0, 0), gpu(1, 0)]
    assert poll(agent, clock) == change.INVENTORY
    backend.gpus = [gpu(0, 0, (GpuProcess(1, 10 * MIB, "pod-a"),)), gpu(1, 0)]
    assert poll(agent, clock) == change.PODS  # a new pod, however small
    backend.gpus = [gpu(0, 0, (GpuProcess(1, 900 * MIB, "pod-a"),)), gpu(1, 0)]
    assert poll(agent, clock) == change.MEMORY  # that pod's usage moved past the threshold


def test_backend_failure_flips_ready_keeps_the_last_readings_and_heals() -> None:
    agent, backend, publisher, clock = make_agent([gpu(0, GIB)])
    agent.step()
    backend.error = BackendError("nvml: Driver Not Loaded (check nvidia-smi on the host)")
    assert poll(agent, clock) == change.READY_CHANGED
    failed = publisher.written[-1][0]
    assert not failed.ready and failed.error and "Driver Not Loaded" in failed.error
    assert failed.readings == (gpu(0, GIB),)
    backend.error = None
    # Retries wait for the backoff (1 s, 2 s, 4 s ... here every poll is past it).
    assert poll(agent, clock) == change.READY_CHANGED
    assert publisher.written[-1][0].ready


def test_backend_retries_back_off_but_heartbeats_continue() -> None:
    timing = dataclasses.replace(TIMING, backoff_initial_s=20, backoff_max_s=40)
    agent, backend, publisher, clock = make_agent([gpu(0, 0)], timing)
    backend.error = BackendError("static: cannot read /x")
    agent.step()  # t=0: read fails, next read after 20 s
    reads = backend.reads
    for _ in range(3):  # t = 5, 10, 15
        poll(agent, clock)
    assert backend.reads == reads
    poll(agent, clock)  # t = 20: retry (fails), next after 40 s
    assert backend.reads == reads + 1
    assert poll(agent, clock, 10) == change.HEARTBEAT  # t = 30: written though not read
    assert not publisher.written[-1][0].ready


def test_unexpected_backend_exception_does_not_end_the_agent() -> None:
    agent, backend, publisher, _ = make_agent([gpu(0, 0)])
    backend.error = ZeroDivisionError("bug")
    assert agent.step() == change.INITIAL
    error = publisher.written[-1][0].error
    assert error == "scripted: unexpected error: ZeroDivisionError('bug')"


def test_api_failures_are_retried_with_backoff_and_the_write_still_lands() -> None:
    agent, _, publisher, clock = make_agent([gpu(0, 0)])
    publisher.fail = "GPUNode n: cannot reach the API server: connection refused"
    assert agent.step() is None
    assert poll(agent, clock, 0.5) is None  # backoff 1 s not over yet; nothing attempted
    publisher.fail = None
    assert poll(agent, clock, 0.5) == change.INITIAL
    assert len(publisher.written) == 1


def test_api_backoff_doubles_up_to_the_cap() -> None:
    agent, _, publisher, clock = make_agent([gpu(0, 0)])
    publisher.fail = "down"
    attempts = []
    for second in range(200):
        before = agent.write_backoff.failures
        agent.step()
        if agent.write_backoff.failures != before:
            attempts.append(second)
        clock.advance(1)
    assert attempts[:6] == [0, 1, 3, 7, 15, 31]
    assert attempts[6:] == [63, 123, 183]  # then capped at 60 s


# -- write rate ---------------------------------------------------------------------------


def simulate(hours: float, jobs_per_hour: int, seed: int = 7) -> int:
    """Writes in ``hours`` on an 8 x H100 node: +-64 MiB jitter on every read, and jobs that
    start on a free GPU, ramp to 30-70 GiB over a minute, run, and end."""
    rng = random.Random(seed)
    used = [0] * 8
    target = [0] * 8
    agent, backend, publisher, clock = make_agent([gpu(i, 0) for i in range(8)])
    steps = int(hours * 3600 / TIMING.poll_interval_s)
    job_every = int(3600 / TIMING.poll_interval_s / jobs_per_hour) if jobs_per_hour else 0
    for step in range(steps):
        if job_every and step % job_every == job_every // 2:
            index = rng.randrange(8)
            target[index] = 0 if target[index] else rng.randrange(30, 70) * GIB
        for i in range(8):
            used[i] += max(-4 * GIB, min(4 * GIB, target[i] - used[i]))  # ramps over ~1 min
        backend.gpus = [gpu(i, max(0, used[i] + rng.randrange(-64, 65) * MIB)) for i in range(8)]
        agent.step()
        clock.advance(TIMING.poll_interval_s)
    return len(publisher.written)


def test_write_rate_of_an_idle_node_is_one_per_heartbeat() -> None:
    writes = simulate(hours=1, jobs_per_hour=0)
    assert writes == 120  # one every 30 s: the first write at t=0, heartbeats after


def test_write_rate_of_a_busy_node_stays_near_the_heartbeat() -> None:
    writes = simulate(hours=1, jobs_per_hour=12)
    # Each job start or end adds a few writes while its memory ramps past the threshold.
    assert 120 < writes <= 120 + 12 * 16
    print(f"busy node: {writes} writes/hour = {writes / 3600:.4f} writes/s")


@pytest.mark.parametrize("threshold_mib", [0, 64])
def test_a_threshold_below_the_jitter_writes_every_poll(threshold_mib: int) -> None:
    timing = dataclasses.replace(TIMING, change_threshold_bytes=threshold_mib * MIB)
    agent, backend, publisher, clock = make_agent([gpu(0, 0)], timing)
    rng = random.Random(1)
    for _ in range(100):
        backend.gpus = [gpu(0, 10 * GIB + rng.choice([-1, 1]) * 200 * MIB)]
        agent.step()
        clock.advance(5)
    assert len(publisher.written) > 50


def test_an_unexpected_publisher_exception_is_retried_not_fatal() -> None:
    agent, _, publisher, clock = make_agent([gpu(0, 0)])

    def broken(observation: Observation, now: datetime) -> None:
        raise KeyError("bug")

    publisher.publish = broken  # type: ignore[method-assign]
    assert agent.step() is None
    assert agent.write_backoff.failures == 1
    del publisher.publish  # the class's method again
    assert poll(agent, clock, 1) == change.INITIAL


def test_a_clean_stop_writes_ready_false_once_with_the_last_readings() -> None:
    """SIGTERM sets the loop's stop event: the operator must stop placing work on the node
    at once, not only once the heartbeat is older than its TTL."""
    agent, _, publisher, clock = make_agent([gpu(0, 8 * GIB)])
    agent.step()
    clock.advance(1)
    stop = threading.Event()
    stop.set()
    agent.run(stop)
    assert len(publisher.written) == 2
    last, _ = publisher.written[-1]
    assert last.stopped and not last.ready
    assert last.readings == publisher.written[0][0].readings


def test_a_stop_before_any_write_writes_nothing_and_a_failed_one_is_not_retried() -> None:
    stop = threading.Event()
    stop.set()
    agent, _, publisher, _ = make_agent([gpu(0, 0)])
    agent.run(stop)
    assert publisher.written == []  # the GPUNode may not be this agent's to write
    agent.step()
    publisher.fail = "API server gone"
    assert agent.stopped() is False
    assert len(publisher.written) == 1
