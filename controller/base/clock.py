"""Time, injected: the agent's heartbeats, thresholds and backoff, the operator's retries,
backoff and lookups (`controller.operator.scheduler`) and its hold on the Lease
(`controller.operator.leader`) take a clock, so tests of an hour of polling run in
milliseconds and never sleep. Each defaults to `SystemClock`."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds for intervals: never jumps when the wall clock is set."""
        ...

    def wall(self) -> datetime:
        """Wall-clock time (UTC) for what is written down: heartbeats, metrics timestamps."""
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> datetime:
        return datetime.now(UTC)


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: datetime = datetime(2025, 1, 1, tzinfo=UTC)) -> None:
        self._start = start
        self._elapsed = 0.0

    def advance(self, seconds: float) -> None:
        self._elapsed += seconds

    def monotonic(self) -> float:
        return self._elapsed

    def wall(self) -> datetime:
        return self._start + timedelta(seconds=self._elapsed)
