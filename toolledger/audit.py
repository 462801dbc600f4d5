"""The audit trail's retention as a background task of the process that serves the read model
(``--audit-retention``; default forever: no task). Each round deletes what is past the
retention (``projections.audit_retention``), then waits for the next round."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

log = logging.getLogger("toolledger.audit")

ROUND_INTERVAL_S = 60.0

Prune = Callable[[datetime], Awaitable[int]]  # cutoff -> events deleted


async def _rounds(prune: Prune, retention: timedelta, every_s: float) -> None:
    while True:
        try:
            deleted = await prune(datetime.now(UTC) - retention)
            if deleted:
                log.info("audit retention", extra={"deleted_events": deleted})
        except Exception:  # a failing round must not stop the server; the next one retries
            log.exception("audit retention round failed")
        await asyncio.sleep(every_s)


@contextlib.asynccontextmanager
async def audit_retention(
    prune: Prune, retention: timedelta | None, every_s: float = ROUND_INTERVAL_S
) -> AsyncIterator[None]:
    """Prune the audit trail every ``every_s`` while the block runs (``retention`` None:
    forever, nothing runs)."""
    if retention is None:
        yield
        return
    task = asyncio.create_task(_rounds(prune, retention, every_s))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
