"""The agent's poll loop: read the GPUs, attribute processes to pods, write when due.

Why one ``step`` that the loop calls every poll interval: tests drive it with a fake clock
and a fake publisher, one step at a time, and the loop itself holds no logic. A failing
backend or API server is retried with backoff and never ends the loop: a node agent that
exits on a transient error turns a blip into a CrashLoopBackOff and a stale GPUNode.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from controller.agent.change import Written, write_reason
from controller.agent.metrics import AgentMetrics
from controller.agent.pods import PodResolver
from controller.agent.publisher import PublishError
from controller.agent.readings import BackendError, GpuBackend, GpuReading
from controller.agent.status import Observation
from controller.base.backoff import Backoff
from controller.base.clock import Clock

log = logging.getLogger(__name__)


class Publisher(Protocol):
    def publish(self, observation: Observation, now: datetime) -> None:
        """Write the observation; raise PublishError when the API cannot take it."""
        ...


@dataclass(frozen=True)
class LoopTiming:
    """The loop's intervals and threshold (see ``settings.AgentSettings`` for the why)."""

    poll_interval_s: float
    heartbeat_interval_s: float
    change_threshold_bytes: int
    backoff_initial_s: float
    backoff_max_s: float


class Agent:
    """One node's agent: the last good readings, the current error, and the last write."""

    def __init__(
        self,
        backend: GpuBackend,
        resolver: PodResolver,
        publisher: Publisher,
        metrics: AgentMetrics,
        timing: LoopTiming,
        clock: Clock,
    ) -> None:
        self.backend = backend
        self.resolver = resolver
        self.publisher = publisher
        self.metrics = metrics
        self.timing = timing
        self.clock = clock
        self.read_backoff = Backoff(timing.backoff_initial_s, timing.backoff_max_s)
        self.write_backoff = Backoff(timing.backoff_initial_s, timing.backoff_max_s)
        self.readings: tuple[GpuReading, ...] = ()
        self.error: str | None = None
        self.written: Written | None = None
        self._next_read = float("-inf")
        self._next_write = float("-inf")

    def step(self) -> str | None:
        """One poll; returns why it wrote (a reason from ``change``), or None."""
        now = self.clock.monotonic()
        if now >= self._next_read:
            self._read(now)
        observation = Observation(self.backend.name, self.readings, self.error)
        reason = write_reason(
            self.written,
            observation,
            now,
            self.timing.change_threshold_bytes,
            self.timing.heartbeat_interval_s,
        )
        if reason is None or now < self._next_write:
            return None
        try:
            self.publisher.publish(observation, self.clock.wall())
        except Exception as error:
            self.metrics.count_api_error()
            delay = self.write_backoff.next_delay()
            self._next_write = now + delay
            if isinstance(error, PublishError):
                log.warning("%s; retrying in %.1fs", error, delay)
            else:  # a bug, not the API: keep the traceback, keep the agent running
                log.exception("writing the GPUNode failed unexpectedly; retrying in %.1fs", delay)
            return None
        self.write_backoff.reset()
        self._next_write = float("-inf")
        self.written = Written(observation, now)
        self.metrics.count_write(reason)
        return reason

    def _read(self, now: float) -> None:
        try:
            readings = self.resolver.attribute(self.backend.read())
        except BackendError as error:
            self._failed(now, str(error))
            return
        except Exception as error:  # a backend bug must not end the agent: report it
            log.exception("backend %s failed unexpectedly", self.backend.name)
            self._failed(now, f"{self.backend.name}: unexpected error: {error!r}")
            return
        if self.error is not None:
            log.info("backend %s answers again", self.backend.name)
        self.readings, self.error = tuple(readings), None
        self.read_backoff.reset()
        self._next_read = float("-inf")
        self.metrics.observe(readings, self.clock.wall())

    def _failed(self, now: float, message: str) -> None:
        if message != self.error:
            log.warning("%s", message)
        self.error = message
        self.metrics.count_scrape_error()
        self._next_read = now + self.read_backoff.next_delay()

    def run(self, stop: threading.Event) -> None:
        """Step every poll interval until ``stop`` is set, then say so (``stopped``)."""
        while not stop.is_set():
            self.step()
            stop.wait(self.timing.poll_interval_s)
        self.stopped()

    def stopped(self) -> bool:
        """Write the GPUNode's Ready condition False (AgentStopped), so that the operator
        places nothing more on this node at once, not only once the heartbeat is older than
        its TTL (90 s). One try, as a stopping pod has seconds; nothing when this agent
        never wrote (the GPUNode may not be its to write). True when written."""
        if self.written is None:
            return False
        observation = Observation(self.backend.name, self.readings, self.error, stopped=True)
        try:
            self.publisher.publish(observation, self.clock.wall())
        except Exception as error:
            self.metrics.count_api_error()
            log.warning("cannot mark the GPUNode as stopped: %s", error)
            return False
        self.written = Written(observation, self.clock.monotonic())
        log.info("GPUNode marked Ready=False (AgentStopped)")
        return True
