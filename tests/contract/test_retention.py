"""Key retention on every backend: a finished call's key expires after its retention (from
its last terminal event, by log time) and then executes as a new call; a running call's key
does not expire; the expiry is on the log, survives a restart, and a rebuild of the
projections gives it back."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tests.contract.conftest import open_harness
from tests.contract.harness import ACME, Harness, eventually, register_tool
from toolledger.processors.ledger.commands import Found, Inconclusive, ReconcileOutcome
from toolledger.processors.tools.manifest import ToolContext
from toolledger.processors.tools.retention import FOREVER
from toolledger.schemas.keys import CallKey
from toolledger.schemas.status import CallStatus

RETENTION = timedelta(seconds=1)


class Slow(BaseModel):
    seconds: float


class Done(BaseModel):
    ran: int


def _slow_tool(ledger: Harness, runs: list[int]) -> None:
    """A tool of its own retention (1 s) whose call outlasts it while it runs."""

    async def handler(args: Slow, ctx: ToolContext) -> Done:
        runs.append(1)
        await asyncio.sleep(args.seconds)
        return Done(ran=len(runs))

    register_tool(ledger, "slow_op", Slow, Done, handler, timeout_s=10, key_retention=RETENTION)


async def _expired_row(ledger: Harness, call_id: str) -> dict[str, Any]:
    found: dict[str, Any] = {}

    async def expired() -> bool:
        row = await ledger.call_row(call_id)
        found.update(row or {})
        return row is not None and row.get("expired_at") is not None

    await eventually(expired, timeout_s=30)
    return found


async def test_a_finished_key_expires_then_executes_as_a_new_call(ledger: Harness) -> None:
    ledger.registry.set_default_key_retention(RETENTION)
    args = {"title": "kept for a second"}
    first = await ledger.client.call("create_ticket", args, idempotency_key="k-ret", context=ACME)
    assert first.ok and not first.replayed
    row = await _expired_row(ledger, first.call_id)  # the executor's sweeper expires it
    assert row["status"] == "SUCCEEDED"  # the finished call stays findable, marked expired
    # kept from now on: the new call's own expiry, a second later, is not what is counted here
    ledger.registry.set_default_key_retention(FOREVER)
    again = await ledger.client.call("create_ticket", args, idempotency_key="k-ret", context=ACME)
    assert again.ok and not again.replayed and again.attempts == 1
    assert again.result != first.result
    assert ledger.effects("create_ticket", "k-ret") == 2
    fresh = await ledger.call_row(first.call_id)
    assert fresh is not None and fresh["expired_at"] is None  # the new call's record
    kinds = [r["event_type"] for r in await ledger.event_rows() if r["call_id"] == first.call_id]
    assert kinds.count("ToolCallKeyExpired") == 1 and kinds.count("ToolCallSucceeded") == 2


async def test_within_its_retention_a_key_replays(ledger: Harness) -> None:
    ledger.registry.set_default_key_retention(timedelta(hours=1))
    args = {"title": "kept an hour"}
    first = await ledger.client.call("create_ticket", args, idempotency_key="k-hour", context=ACME)
    await asyncio.sleep(1.5)
    again = await ledger.client.call("create_ticket", args, idempotency_key="k-hour", context=ACME)
    assert again.replayed and again.result == first.result
    assert ledger.effects("create_ticket", "k-hour") == 1


async def test_a_running_call_does_not_expire_and_its_retention_counts_from_the_outcome(
    ledger: Harness,
) -> None:
    runs: list[int] = []
    _slow_tool(ledger, runs)
    running = asyncio.create_task(
        ledger.client.call(
            "slow_op", {"seconds": 2.5}, idempotency_key="k-long", context=ACME, wait=30
        )
    )
    await asyncio.sleep(1.8)  # past the retention, still running: the key holds
    duplicate = await ledger.client.call(
        "slow_op", {"seconds": 2.5}, idempotency_key="k-long", context=ACME, wait=30
    )
    first = await running
    assert duplicate.replayed and duplicate.result == first.result
    assert first.ok and not first.replayed
    replay = await ledger.client.call(
        "slow_op", {"seconds": 2.5}, idempotency_key="k-long", context=ACME
    )
    assert replay.replayed and replay.result == first.result  # counted from the outcome
    assert runs == [1]
    await _expired_row(ledger, first.call_id)
    other_args = await ledger.client.call(
        "slow_op", {"seconds": 0.1}, idempotency_key="k-long", context=ACME, wait=30
    )
    assert other_args.ok and not other_args.replayed  # a new call: other arguments are fine
    assert runs == [1, 1]


async def test_an_expiry_survives_a_restart_and_a_rebuild(ledger: Harness) -> None:
    ledger.registry.set_default_key_retention(RETENTION)
    args = {"title": "expired before the crash"}
    first = await ledger.client.call("create_ticket", args, idempotency_key="k-rs", context=ACME)
    await _expired_row(ledger, first.call_id)
    await ledger.restart(crash=True)
    ledger.registry.set_default_key_retention(timedelta(hours=1))  # nothing expires anew
    live = await ledger.call_rows()
    await ledger.rebuild()
    assert await ledger.call_rows() == live  # the expiry is on the log: a replay agrees
    again = await ledger.client.call("create_ticket", args, idempotency_key="k-rs", context=ACME)
    assert again.ok and not again.replayed
    assert ledger.effects("create_ticket", "k-rs") == 2
    assert CallKey("acme", "create_ticket", "k-rs", ACME.principal).call_id == first.call_id


def _opaque_tool(ledger: Harness, runs: list[int], known: list[bool]) -> None:
    """A tool whose calls time out (UNKNOWN) and whose downstream cannot say whether they
    happened until ``known`` holds True: the call stays UNKNOWN until then."""

    async def handler(args: Slow, ctx: ToolContext) -> Done:
        runs.append(1)
        await asyncio.sleep(3600)  # the timeout cancels it: the outcome is unknown
        return Done(ran=len(runs))

    async def reconcile(ctx: ToolContext) -> ReconcileOutcome:
        if not known:
            return Inconclusive("the downstream does not answer yet")
        return Found(result_json='{"ran":1}')

    register_tool(
        ledger,
        "opaque_op",
        Slow,
        Done,
        handler,
        timeout_s=0.3,
        reconcile=reconcile,
        key_retention=RETENTION,
    )


async def test_an_unknown_call_does_not_expire_until_it_is_resolved(ledger: Harness) -> None:
    runs: list[int] = []
    known: list[bool] = []
    _opaque_tool(ledger, runs, known)
    args = {"seconds": 0}
    first = await ledger.client.call("opaque_op", args, idempotency_key="k-opaque", context=ACME)
    assert first.status is CallStatus.UNKNOWN, first
    await asyncio.sleep(2.5)  # past the retention; the sweeper reconciles, inconclusively
    row = await ledger.call_row(first.call_id)
    assert row is not None and row["status"] == "UNKNOWN" and row["expired_at"] is None, row
    again = await ledger.client.call("opaque_op", args, idempotency_key="k-opaque", context=ACME)
    assert again.status is CallStatus.UNKNOWN and runs == [1], again  # reconciled, not re-run
    known.append(True)
    resolved = await ledger.client.call("opaque_op", args, idempotency_key="k-opaque", context=ACME)
    assert resolved.ok and resolved.result == {"ran": 1} and runs == [1], resolved
    await _expired_row(ledger, first.call_id)  # resolved: now its retention counts
    new = await ledger.client.call("opaque_op", args, idempotency_key="k-opaque", context=ACME)
    assert new.status is CallStatus.UNKNOWN and not new.replayed and runs == [1, 1], new


async def test_the_http_api_shows_that_a_key_expired(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``GET /v1/calls/{id}``: an expired key's call stays findable, with ``expired_at``."""
    async for ledger in open_harness(request, tmp_path, "http"):
        ledger.registry.set_default_key_retention(RETENTION)
        args = {"title": "read over HTTP"}
        first = await ledger.client.call("create_ticket", args, idempotency_key="k-h", context=ACME)
        assert first.ok
        api = ledger.client.http_ledger(ACME)  # type: ignore[attr-defined]  # the HTTP binding's
        view = await api.get_call(first.call_id)
        assert view is not None and view.get("expired_at") is None, view  # not expired yet
        await _expired_row(ledger, first.call_id)
        view = await api.get_call(first.call_id)
        assert view is not None and view["status"] == "SUCCEEDED", view
        assert view["expired_at"] is not None and view["idempotency_key"] == "k-h", view
