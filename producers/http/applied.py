"""Read-your-writes for every request at once: waiting until the projection has applied the
events that answered them.

A front door answers a call from the projection once the projector has applied the call's
answering event, so that a ``GET`` of the call after the answer shows the same thing. On the
Kafka + PostgreSQL backend the projector is another process: the answer waits for it. Asking
for each request on its own (one query every 10 ms per request in flight) cost several
queries per call and most of a front door's CPU; :class:`AppliedWatch` asks for all of the
events awaited in one query per poll, and stops polling when nobody waits.
"""

from __future__ import annotations

import asyncio
import contextlib

from toolledger.schemas.calls import CallQueries

POLL_INTERVAL_S = 0.01


class AppliedWatch:
    """Waiters for events to be applied by the projection, polled together."""

    def __init__(self, queries: CallQueries, *, interval_s: float = POLL_INTERVAL_S) -> None:
        self._queries = queries
        self._interval_s = interval_s
        self._waiting: dict[str, list[asyncio.Future[bool]]] = {}
        self._poller: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        """Events awaited now."""
        return len(self._waiting)

    async def within(self, event_id: str, timeout_s: float) -> bool:
        """Whether the projection applies ``event_id`` within ``timeout_s``; an error of the
        read side (the database unreachable) is raised to every waiter of that poll."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(event_id, []).append(future)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            return False
        finally:
            self._forget(event_id, future)

    def _forget(self, event_id: str, future: asyncio.Future[bool]) -> None:
        waiters = self._waiting.get(event_id)
        if waiters is None:
            return
        with contextlib.suppress(ValueError):
            waiters.remove(future)
        if not waiters:
            del self._waiting[event_id]

    async def _poll(self) -> None:
        """One lookup of every awaited event per interval, while anyone waits. A waiter added
        during a lookup is in the next one."""
        while self._waiting:
            try:
                applied = await self._queries.applied_among(list(self._waiting))
            except Exception as exc:  # every waiter of this round gets it, as it would alone
                for waiters in list(self._waiting.values()):
                    for future in waiters:
                        if not future.done():
                            future.set_exception(exc)
                return
            for event_id in applied:
                for future in self._waiting.pop(event_id, []):
                    if not future.done():
                        future.set_result(True)
            if self._waiting:
                await self._queries.moved(self._interval_s)
