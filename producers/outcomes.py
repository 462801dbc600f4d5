"""Waiting callers, resolved by intent id from the outcome stream (no consumer per call).

A waiter learns two things about its intent: that the executor *started* it (its
``ToolCallStarted`` was committed: the call is running and is the caller's own), and its
*answer*. Both come from the same stream, so a caller can tell a call
that is running from one that has not been decided yet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

from toolledger.schemas.events import Event, ToolCallStarted, answers_intent


@dataclass(slots=True)
class Waiter:
    answer: asyncio.Future[Event]
    started: bool = False
    # made only by a caller that waits for the start (most callers wait for the answer only)
    _start_signal: asyncio.Event | None = field(default=None, repr=False)

    def mark_started(self) -> None:
        self.started = True
        if self._start_signal is not None:
            self._start_signal.set()

    def start_signal(self) -> asyncio.Event:
        """Set once the call is started (its Started event committed)."""
        if self._start_signal is None:
            self._start_signal = asyncio.Event()
            if self.started:
                self._start_signal.set()
        return self._start_signal


class OutcomeHub:
    def __init__(self) -> None:
        self._waiters: dict[str, list[Waiter]] = {}

    def expect(self, intent_id: str) -> Waiter:
        """Register interest *before* the intent is appended, so no answer can be missed."""
        waiter = Waiter(asyncio.get_running_loop().create_future())
        self._waiters.setdefault(intent_id, []).append(waiter)
        return waiter

    def forget(self, intent_id: str, waiter: Waiter) -> None:
        waiters = self._waiters.get(intent_id)
        if waiters and waiter in waiters:
            waiters.remove(waiter)
            if not waiters:
                del self._waiters[intent_id]

    def publish(self, events: Iterable[Event]) -> None:
        for event in events:
            if answers_intent(event):
                for waiter in self._waiters.pop(event.intent_id, ()):
                    waiter.mark_started()
                    if not waiter.answer.done():
                        waiter.answer.set_result(event)
            elif isinstance(event, ToolCallStarted):
                for waiter in self._waiters.get(event.intent_id, ()):
                    waiter.mark_started()

    def fail(self, intent_ids: Iterable[str], error: BaseException) -> None:
        """The intents will not be answered (not durably decided): their callers get
        ``error`` and may call again with the same key."""
        for intent_id in intent_ids:
            for waiter in self._waiters.pop(intent_id, ()):
                if not waiter.answer.done():
                    waiter.answer.set_exception(error)

    def is_waiting(self, intent_id: str) -> bool:
        return intent_id in self._waiters

    @property
    def waiting(self) -> int:
        return len(self._waiters)
