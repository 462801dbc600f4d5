"""Waiting callers, resolved by intent id from the outcome stream (no consumer per call)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from schemas.events import Event, answers_intent


class OutcomeHub:
    def __init__(self) -> None:
        self._waiters: dict[str, list[asyncio.Future[Event]]] = {}

    def expect(self, intent_id: str) -> asyncio.Future[Event]:
        """Register interest *before* the intent is appended, so no answer can be missed."""
        future: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(intent_id, []).append(future)
        return future

    def forget(self, intent_id: str, future: asyncio.Future[Event]) -> None:
        waiters = self._waiters.get(intent_id)
        if waiters and future in waiters:
            waiters.remove(future)
            if not waiters:
                del self._waiters[intent_id]

    def publish(self, events: Iterable[Event]) -> None:
        for event in events:
            if not answers_intent(event):
                continue
            for future in self._waiters.pop(event.intent_id, ()):
                if not future.done():
                    future.set_result(event)

    def is_waiting(self, intent_id: str) -> bool:
        return intent_id in self._waiters

    @property
    def waiting(self) -> int:
        return len(self._waiters)
