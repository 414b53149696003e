"""The webhook imports the generic reading (transformers, torch) on a thread of its own at
start, so the first review of a family without a hand reading waits for no import."""

from __future__ import annotations

import subprocess
import sys

from tests.unit.trace_support import require_trace_extra

require_trace_extra()

PROGRAM = """
import sys
from controller.jobs.profiles import warm_generic_reading
assert "controller.trace.inventory" not in sys.modules
thread = warm_generic_reading()
assert thread is not None and thread.daemon
thread.join(120)
assert "controller.trace.inventory" in sys.modules and "torch" in sys.modules
print("warm")
"""


def test_the_generic_reading_is_imported_on_a_thread_of_its_own() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "warm"
