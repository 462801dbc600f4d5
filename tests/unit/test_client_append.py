"""A log that does not take an intent (a broker down, a partition without a leader) never
holds a caller past its wait: the caller hears PENDING and the append goes on."""

from __future__ import annotations

import asyncio
import time

import pytest

from toolledger.producers import client as client_module
from toolledger.producers.client import LedgerClient, TrustedContext
from toolledger.producers.outcomes import OutcomeHub
from toolledger.schemas.errors import ErrorCode
from toolledger.schemas.events import Event
from toolledger.schemas.status import CallStatus

ALICE = TrustedContext("acme", "alice")


class StuckLog:
    """A transport whose appends complete only when ``release`` is set."""

    def __init__(self) -> None:
        self.outcomes = OutcomeHub()
        self.release = asyncio.Event()
        self.appended: list[Event] = []

    async def send(self, intent: Event) -> None:
        await self.release.wait()
        self.appended.append(intent)

    async def broadcast(self, record: Event) -> None:
        await self.send(record)


async def test_a_call_whose_append_hangs_is_pending_after_the_longer_of_wait_and_append_bound() -> (
    None
):
    log = StuckLog()
    client = LedgerClient(log, append_wait_s=0.3)
    began = time.monotonic()
    result = await client.call(
        "create_ticket", {"title": "t"}, idempotency_key="k-1", context=ALICE, wait=0.05
    )
    took = time.monotonic() - began
    assert result.status is CallStatus.PENDING
    assert result.error is not None and result.error.code == ErrorCode.INTERNAL
    assert result.error.retryable
    assert "did not take the intent within 0.3 s" in result.error.message
    assert 0.25 < took < 5, took  # bounded by the append bound, not by the log
    assert log.appended == []
    assert not log.outcomes._waiters  # the waiter is forgotten


async def test_once_appended_the_answer_is_awaited_for_what_is_left_of_the_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The append's longer bound is not the caller's wait: once the log has the intent, the
    caller waits for the answer only as long as it asked (then for the decision)."""
    monkeypatch.setattr(client_module, "DECISION_WAIT_S", 0.1)
    log = StuckLog()
    log.release.set()
    client = LedgerClient(log, append_wait_s=30.0)
    began = time.monotonic()
    result = await client.call(
        "create_ticket", {"title": "t"}, idempotency_key="k-2", context=ALICE, wait=0.1
    )
    took = time.monotonic() - began
    assert result.status is CallStatus.PENDING  # appended, never answered: undecided
    assert result.error is not None and "has not decided" in result.error.message
    assert took < 10, took
    assert [e.envelope.idempotency_key for e in log.appended] == ["k-2"]


async def test_a_command_whose_append_hangs_returns_none_within_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client_module, "DECISION_WAIT_S", 0.0)
    log = StuckLog()
    log.release.set()
    client = LedgerClient(log, append_wait_s=0.2)
    await client.call("create_ticket", {"title": "t"}, idempotency_key="k-3", context=ALICE, wait=0)
    record = log.appended[0]
    stuck = StuckLog()
    began = time.monotonic()
    answer = await LedgerClient(stuck, append_wait_s=0.2).command(record, wait=0.05)
    assert answer is None
    assert 0.15 < time.monotonic() - began < 5
    assert stuck.appended == []
