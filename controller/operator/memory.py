"""Keep the operator's resident memory near what it holds, on glibc.

What the operator keeps is its caches; what glibc's malloc keeps besides is the problem.
Every list and watch response is a JSON body of up to megabytes, parsed into objects and
freed again, and the blocking API calls run in a few dozen threads: glibc gives threads
arenas of their own (up to eight per core) and returns freed memory from the middle of a
heap only when asked. Both leave freed pages resident, which the operator's memory limit
counts. So: two arenas, set before the threads start, and a trim now and then (glibc 2.8+
gives back the free pages of every arena; it runs in a worker thread, since it walks the
heap). Elsewhere (musl, macOS) both are no-ops.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging

log = logging.getLogger("vramgate.memory")

#: mallopt's parameter for the number of arenas (glibc's malloc.h).
M_ARENA_MAX = -8
ARENAS = 2
TRIM_EVERY_S = 30.0


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):  # not glibc: no mallopt, no malloc_trim
        return None
    return libc


_LIBC = _glibc()


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap malloc's arenas; call before threads start. False where malloc is not glibc's."""
    return _LIBC is not None and bool(_LIBC.mallopt(M_ARENA_MAX, arenas))


def trim() -> bool:
    """Return malloc's free pages to the system; True if any were."""
    return _LIBC is not None and bool(_LIBC.malloc_trim(0))


async def trim_every(seconds: float = TRIM_EVERY_S) -> None:
    """Trim every `seconds` for the operator's lifetime, off the event loop."""
    if _LIBC is None:
        return
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(seconds)
        try:
            await loop.run_in_executor(None, trim)
        except Exception:  # never worth stopping the operator for
            log.exception("malloc_trim failed")
