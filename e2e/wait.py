"""Polling with a deadline, for tests against an eventually consistent control plane.

Why not sleeps: a fixed sleep is either too short on a loaded 2-core CI machine or wastes
time everywhere else; polling returns as soon as the condition holds and names what never
happened when it times out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T], *, timeout: float, what: str, interval: float = 0.1
) -> T:
    """Call ``condition`` until it returns something truthy, and return that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
