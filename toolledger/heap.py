"""Freed memory handed back to the operating system, every few seconds: what the
``toolledger`` server commands (serve, mcp, executor, projector) do for their process. The
library never does it on its own: a host application that wants it runs
:func:`releasing_free_memory` around its work.

An executor under steady load frees about as much as it allocates: keys expire, records are
pruned, the bounded cache evicts. But glibc's malloc keeps the pages it freed in its arenas
(one per thread that allocates: the event loop, the log's writer, ``asyncio.to_thread``'s
workers), so the resident size creeps up with their fragmentation while the live heap stays
flat. Measured with ``bench/scale.py``'s embedded run at a 30-second retention: 133 MB after
25,000 calls and 216 MB after 175,000 without trimming; 133 MB and 168-172 MB from 75,000
calls on with it, at the same calls/s. ``malloc_trim(0)`` returns the free pages of every
arena; it runs in a thread, so the loop never waits for it. Elsewhere than on glibc there is
nothing to call, and nothing is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

log = logging.getLogger("toolledger.heap")

T = TypeVar("T")

RELEASE_INTERVAL_S = 5.0


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): no such function
        return None
    return trim


_TRIM = _malloc_trim()


def release_free_memory() -> bool:
    """Hand the allocator's free pages back to the system; whether there was a way to."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


async def release_free_memory_every(interval_s: float = RELEASE_INTERVAL_S) -> None:
    """Run until cancelled: :func:`release_free_memory` in a thread every ``interval_s``."""
    if _TRIM is None:
        log.info("malloc_trim is not available here: freed memory is left to the allocator")
        return
    while True:
        await asyncio.sleep(interval_s)
        await asyncio.to_thread(release_free_memory)


async def releasing_free_memory(work: Awaitable[T], interval_s: float = RELEASE_INTERVAL_S) -> T:
    """``work``, with :func:`release_free_memory_every` beside it until it ends."""
    releaser = asyncio.create_task(release_free_memory_every(interval_s))
    try:
        return await work
    finally:
        releaser.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await releaser
