"""Exponential backoff with jitter, for retrying a failing backend or API server.

Why jitter: after an API server outage, 5,000 agents retrying on the same schedule would
arrive together; a random half of each delay spreads them out.
"""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    """Delays of ``initial``, ``2 x initial``, ... capped at ``maximum``; ``reset`` on success.

    Each delay is drawn from [d/2, d] ("equal jitter"), so it never drops below half the
    schedule and never exceeds the cap.
    """

    def __init__(
        self, initial: float, maximum: float, rand: Callable[[], float] = random.random
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self.rand = rand
        self.failures = 0

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * 2.0 ** min(self.failures, 62))
        self.failures += 1
        return ceiling / 2 + self.rand() * ceiling / 2

    def reset(self) -> None:
        self.failures = 0
