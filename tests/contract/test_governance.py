"""Approvals and kill switches live in the log: the same behaviour on every backend."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel

from tests.contract.conftest import IN_PROCESS_BACKENDS, open_harness
from tests.contract.harness import ACME, GLOBEX, Harness, eventually, register_tool
from toolledger.processors.tools.manifest import ToolContext
from toolledger.producers import governance
from toolledger.producers.client import CallResult, TrustedContext
from toolledger.schemas.events import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    ToolCallRejected,
    ToolDisabled,
    ToolEnabled,
)


@pytest.fixture(params=IN_PROCESS_BACKENDS)
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    """These tests take the approval request from the call's own event: in-process only (the
    HTTP API's approvals have their suite in tests/http/test_governance.py)."""
    async for harness in open_harness(request, tmp_path):
        yield harness


CHARGE = {"customer_id": "cus_secret_42", "amount_cents": 1250, "currency": "EUR"}


def _request(result: CallResult) -> ApprovalRequested:
    assert result.rejected and result.error is not None, result
    assert result.error.code == "APPROVAL_REQUIRED" and not result.error.retryable
    assert isinstance(result.event, ApprovalRequested)
    return result.event


async def _approve(
    ledger: Harness, request: ApprovalRequested, ttl: timedelta = timedelta(minutes=10)
) -> tuple[Event | None, str]:
    record, token = governance.approve(
        governance.ApprovalTarget.of_request(request), "op@acme", datetime.now(UTC), ttl
    )
    return await ledger.client.command(record), token


async def _charge(
    ledger: Harness, key: str, token: str | None = None, args: dict[str, object] = CHARGE
) -> CallResult:
    return await ledger.client.call(
        "charge_card", args, idempotency_key=key, context=ACME, approval_token=token
    )


def _refused(result: CallResult, code: str) -> None:
    assert result.rejected and result.error is not None, result
    assert result.error.code == code, result.error


async def test_a_high_risk_call_waits_for_approval_then_runs_once(ledger: Harness) -> None:
    request = _request(await _charge(ledger, "pay-1"))
    assert ledger.effects("charge_card", "pay-1") == 0
    impact = json.loads(request.impact_json)
    assert impact["irreversible"] is True and impact["cost"] == "12.50 EUR"
    arguments = json.loads(request.arguments_redacted_json)
    assert arguments["amount_cents"] == 1250 and "cus_secret_42" not in json.dumps(arguments)
    # asking again answers with the same request
    assert _request(await _charge(ledger, "pay-1")).approval_id == request.approval_id

    granted, token = await _approve(ledger, request)
    assert isinstance(granted, ApprovalGranted) and granted.approver == "op@acme"
    assert token not in granted.model_dump_json()  # only its digest is in the log
    result = await _charge(ledger, "pay-1", token)
    assert result.ok and not result.replayed, result
    assert ledger.effects("charge_card", "pay-1") == 1

    # approval does not replace the key: the same call replays, with or without the token
    for again in (await _charge(ledger, "pay-1", token), await _charge(ledger, "pay-1")):
        assert again.ok and again.replayed and again.result == result.result
    assert ledger.effects("charge_card", "pay-1") == 1
    # a second use on another call: refused
    _refused(await _charge(ledger, "pay-2", token), "APPROVAL_INVALID")
    assert ledger.effects("charge_card", "pay-2") == 0


async def test_tokens_bind_to_the_exact_call(ledger: Harness) -> None:
    request = _request(await _charge(ledger, "pay-b"))
    _, token = await _approve(ledger, request)
    other_args = {**CHARGE, "amount_cents": 999_999}
    # other arguments under the request's key: a reused key, whatever token comes with them
    _refused(await _charge(ledger, "pay-b", token, other_args), "IDEMPOTENCY_KEY_REUSED")
    _refused(await _charge(ledger, "pay-b", token[:-4]), "APPROVAL_INVALID")  # truncated
    _refused(await _charge(ledger, "pay-b", "apt_forged"), "APPROVAL_INVALID")
    other_tenant = await ledger.client.call(
        "charge_card", CHARGE, idempotency_key="pay-b", context=GLOBEX, approval_token=token
    )
    _refused(other_tenant, "APPROVAL_INVALID")
    assert _total(ledger, "charge_card") == 0
    # the refusals consumed nothing: the right call still runs
    assert (await _charge(ledger, "pay-b", token)).ok
    assert ledger.effects("charge_card", "pay-b") == 1


async def test_other_arguments_on_a_key_with_only_an_approval_request_are_a_reused_key(
    ledger: Harness,
) -> None:
    request = _request(await _charge(ledger, "pay-taken"))
    # no call ran under the key, but its request took it for these arguments: other arguments
    # are refused at once, as against a finished call, and open no second request
    for amount in (999, 1_000_000):
        other = await _charge(ledger, "pay-taken", args={**CHARGE, "amount_cents": amount})
        _refused(other, "IDEMPOTENCY_KEY_REUSED")
        assert other.error is not None and "first used with other" in other.error.message
    assert _request(await _charge(ledger, "pay-taken")).approval_id == request.approval_id
    _, token = await _approve(ledger, request)
    _refused(
        await _charge(ledger, "pay-taken", token, {**CHARGE, "amount_cents": 999}),
        "IDEMPOTENCY_KEY_REUSED",
    )
    assert (await _charge(ledger, "pay-taken", token)).ok  # the request's own call runs, once
    assert ledger.effects("charge_card", "pay-taken") == 1


async def test_racing_calls_cannot_both_use_a_token(ledger: Harness) -> None:
    request = _request(await _charge(ledger, "pay-race"))
    _, token = await _approve(ledger, request)
    same_key = [_charge(ledger, "pay-race", token) for _ in range(5)]
    other_keys = [_charge(ledger, f"pay-race-{i}", token) for i in range(5)]
    results = await asyncio.gather(*same_key, *other_keys)
    assert ledger.effects("charge_card", "pay-race") == 1
    assert _total(ledger, "charge_card") == 1
    for result in results[5:]:
        _refused(result, "APPROVAL_INVALID")


async def test_an_expired_token_is_refused(ledger: Harness) -> None:
    request = _request(await _charge(ledger, "pay-exp"))
    _, token = await _approve(ledger, request, ttl=timedelta(milliseconds=1))
    await asyncio.sleep(0.05)
    _refused(await _charge(ledger, "pay-exp", token), "APPROVAL_INVALID")
    assert ledger.effects("charge_card", "pay-exp") == 0


async def test_a_denied_call_stays_denied(ledger: Harness) -> None:
    request = _request(await _charge(ledger, "pay-d"))
    record = governance.deny(
        governance.ApprovalTarget.of_request(request),
        "op@acme",
        "Not agreed with the customer",
        _now(),
    )
    denied = await ledger.client.command(record)
    assert isinstance(denied, ApprovalDenied) and denied.reason == "Not agreed with the customer"
    again = await _charge(ledger, "pay-d")
    _refused(again, "APPROVAL_INVALID")
    assert again.error is not None and "Not agreed" in again.error.message
    late, _ = await _approve(ledger, request)  # a decided request cannot be decided again
    assert isinstance(late, ToolCallRejected) and late.error.code == "APPROVAL_INVALID"
    assert ledger.effects("charge_card", "pay-d") == 0


async def test_approvals_survive_a_restart(ledger: Harness) -> None:
    request = _request(await _charge(ledger, "pay-rs"))
    await ledger.restart(crash=True)
    granted, token = await _approve(ledger, request)
    assert isinstance(granted, ApprovalGranted)
    await ledger.restart()
    assert (await _charge(ledger, "pay-rs", token)).ok
    _refused(await _charge(ledger, "pay-rs-2", token), "APPROVAL_INVALID")
    assert _total(ledger, "charge_card") == 1


def _now() -> datetime:
    return datetime.now(UTC)


async def _switch(ledger: Harness, tenant: str, tool: str, enabled: bool) -> Event | None:
    record = governance.switch(
        tenant_id=tenant, tool=tool, enabled=enabled, actor="op", reason="incident 7", now=_now()
    )
    return await ledger.client.command(record, broadcast=True)


async def _ticket(ledger: Harness, key: str, context: TrustedContext = ACME) -> CallResult:
    return await ledger.client.call(
        "create_ticket", {"title": key}, idempotency_key=key, context=context
    )


def _total(ledger: Harness, tool: str) -> int:
    return sum(n for (_, name, _), n in ledger.store.effect_counts().items() if name == tool)


async def test_a_switched_off_tool_refuses_new_calls_but_replays(ledger: Harness) -> None:
    done = await _ticket(ledger, "t-before")
    assert done.ok
    assert isinstance(await _switch(ledger, "acme", "create_ticket", False), ToolDisabled)
    off = await _ticket(ledger, "t-during")
    _refused(off, "TOOL_DISABLED")
    assert off.error is not None and off.error.retryable and "incident 7" in off.error.message
    replay = await _ticket(ledger, "t-before")
    assert replay.ok and replay.replayed
    assert (await _ticket(ledger, "t-globex", GLOBEX)).ok  # another tenant is not affected
    await ledger.restart(crash=True)
    _refused(await _ticket(ledger, "t-during"), "TOOL_DISABLED")  # the switch is durable
    assert isinstance(await _switch(ledger, "acme", "create_ticket", True), ToolEnabled)
    assert (await _ticket(ledger, "t-during")).ok  # the refusal did not consume the key
    assert ledger.effects("create_ticket", "t-during") == 1


async def test_a_global_switch_covers_every_tenant_and_tool(ledger: Harness) -> None:
    await _switch(ledger, "*", "*", False)
    _refused(await _ticket(ledger, "g-1"), "TOOL_DISABLED")
    _refused(await _ticket(ledger, "g-2", GLOBEX), "TOOL_DISABLED")
    await _switch(ledger, "*", "*", True)
    assert (await _ticket(ledger, "g-1")).ok
    assert _total(ledger, "create_ticket") == 1


async def test_switch_and_approval_events_are_in_the_audit_trail(ledger: Harness) -> None:
    request = _request(await _charge(ledger, "pay-audit"))
    _, token = await _approve(ledger, request)
    assert (await _charge(ledger, "pay-audit", token)).ok
    await _switch(ledger, "acme", "send_email", False)

    async def recorded() -> set[str]:
        return {row["event_type"] for row in await ledger.event_rows()}

    deadline = asyncio.get_running_loop().time() + 20
    wanted = {"ApprovalRequested", "ApprovalGranted", "ApprovalConsumed", "ToolDisabled"}
    while not wanted <= await recorded():
        assert asyncio.get_running_loop().time() < deadline, await recorded()
        await asyncio.sleep(0.05)
    rows = [r for r in await ledger.event_rows() if r["event_type"] == "ApprovalGranted"]
    assert token not in json.dumps(rows, default=str)
    assert ledger.effects("charge_card", "pay-audit") == 1


class _Payout(BaseModel):
    amount: int


class _Paid(BaseModel):
    run: int


def _payout_tool(ledger: Harness, runs: list[int]) -> None:
    """A tool that needs an operator's approval above 1,000 and nobody's below."""

    async def handler(args: _Payout, ctx: ToolContext) -> _Paid:
        runs.append(args.amount)
        return _Paid(run=len(runs))

    register_tool(
        ledger,
        "payout",
        _Payout,
        _Paid,
        handler,
        approval=lambda args: "operator" if args.amount > 1_000 else None,
    )


async def test_an_open_approval_keeps_its_key_from_expiring(ledger: Harness) -> None:
    """A key with an approval still to be decided does not expire, whichever call asks: past
    its retention the same call is answered by the same request, and a small payout that
    needs no approval is refused as a reused key (the key is the large one's while it waits
    for its approval). Once the approval is decided, the key expires as any other, and the
    small payout runs as a new call."""
    runs: list[int] = []
    _payout_tool(ledger, runs)
    ledger.registry.set_default_key_retention(timedelta(seconds=1))

    async def pay(amount: int) -> CallResult:
        return await ledger.client.call(
            "payout", {"amount": amount}, idempotency_key="pay-keep", context=ACME
        )

    request = _request(await pay(5_000))
    _refused(await pay(10), "IDEMPOTENCY_KEY_REUSED")
    await asyncio.sleep(2.5)  # past the retention, twice over the executor's sweep
    assert _request(await pay(5_000)).approval_id == request.approval_id
    _refused(await pay(10), "IDEMPOTENCY_KEY_REUSED")
    assert runs == []

    record = governance.deny(
        governance.ApprovalTarget.of_request(request), "op@acme", "not this one", datetime.now(UTC)
    )
    assert isinstance(await ledger.client.command(record), ApprovalDenied)

    async def runs_as_new() -> bool:
        result = await pay(10)
        if result.error is not None and result.error.code == "IDEMPOTENCY_KEY_REUSED":
            return False  # the denial's retention has not passed yet
        assert result.ok and not result.replayed, result
        return True

    await eventually(runs_as_new)
    assert runs == [10]


async def test_a_key_that_only_had_approval_requests_expires(ledger: Harness) -> None:
    """A key under which no call ran, only an approval request: while the request waits, the
    key is kept (asked again, the same request answers). Once an operator denied it, the key
    settles, and after its retention the executor expires it on its own, recorded on the log:
    the denial is forgotten, and the same call asks for a new approval. Nothing ran."""
    runs: list[int] = []
    _payout_tool(ledger, runs)
    ledger.registry.set_default_key_retention(timedelta(seconds=1))

    async def pay() -> CallResult:
        return await ledger.client.call(
            "payout", {"amount": 5_000}, idempotency_key="pay-ask", context=ACME
        )

    async def expiries() -> list[dict[str, object]]:
        rows = await ledger.event_rows()
        return [r for r in rows if r["event_type"] == "ToolCallKeyExpired"]

    asked = await pay()
    first = _request(asked)
    await asyncio.sleep(2.5)  # past the retention, twice over the executor's sweep
    assert _request(await pay()).approval_id == first.approval_id  # kept while it waits
    assert await expiries() == []

    record = governance.deny(
        governance.ApprovalTarget.of_request(first), "op@acme", "not today", datetime.now(UTC)
    )
    assert isinstance(await ledger.client.command(record), ApprovalDenied)

    async def expired_by_the_executor() -> bool:
        return len(await expiries()) == 1

    await eventually(expired_by_the_executor)  # no call asked: the executor's sweep did
    (expiry,) = await expiries()
    assert (expiry["call_id"], expiry["idempotency_key"]) == (asked.call_id, "pay-ask"), expiry

    again = _request(await pay())  # asked again: a new request, the denial forgotten
    assert again.approval_id != first.approval_id
    assert runs == []
    assert len(await expiries()) == 1
