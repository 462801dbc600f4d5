"""A mixed workload on any backend of the contract suite (tests/contract): what the audit
order, the export and the evaluation report are tested on (issue 31).

Two runs. ``run-a`` (tenant acme) holds one of everything the report looks for: a success
and its replay, the same arguments again under another key, a refusal by validation, a
retry within a round that recovered, a final failure then a success of the same tool, a
read, an approval granted and one denied, a call refused for want of a scope, a switched-off
tool, and a key that ran out of rounds. ``run-b`` (tenant globex) is small and clean.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.contract.harness import ACME, GLOBEX, Harness
from toolledger.producers import governance
from toolledger.producers.client import CallResult, TrustedContext
from toolledger.schemas.events import ApprovalRequested

RUN_A = "run-a"
RUN_B = "run-b"
NO_SCOPES = TrustedContext("acme", "intruder@acme", scopes=frozenset())
CHARGE = {"customer_id": "cus_42", "amount_cents": 1250, "currency": "EUR"}
REDACTED_CUSTOMER = "cus_42"
"""A value the charge_card tool redacts: it must appear in no export (only its keyed hash)."""


def _request(result: CallResult) -> ApprovalRequested:
    assert isinstance(result.event, ApprovalRequested), result
    return result.event


async def _decide(harness: Harness, request: ApprovalRequested, grant: bool) -> None:
    target = governance.ApprovalTarget.of_request(request)
    now = datetime.now(UTC)
    if grant:
        record, _ = governance.approve(target, "op@acme", now, timedelta(hours=1))
        await harness.client.command(record)
    else:
        await harness.client.command(governance.deny(target, "op@acme", "not this one", now))


async def _switch(harness: Harness, enabled: bool) -> None:
    record = governance.switch(
        tenant_id="acme",
        tool="create_ticket",
        enabled=enabled,
        actor="op@acme",
        reason="incident 31",
        now=datetime.now(UTC),
    )
    await harness.client.command(record, broadcast=True)


async def mixed_workload(harness: Harness) -> None:
    """Drive both runs, one call after another (their order in the log is the order here)."""
    call = harness.client.call

    async def a(
        tool: str, args: dict[str, object], key: str | None, step: str, **kw: object
    ) -> CallResult:
        context = kw.pop("context", ACME)
        assert isinstance(context, TrustedContext)
        return await call(
            tool, args, idempotency_key=key, context=context, run_id=RUN_A, step_id=step
        )

    first = await a("create_ticket", {"title": "printer"}, "a-1", "s1")
    assert first.ok
    assert (await a("create_ticket", {"title": "printer"}, "a-1", "s1")).replayed
    assert (await a("create_ticket", {"title": "printer"}, "a-2", "s2")).ok  # unnecessary
    assert not (await a("create_ticket", {"title": ""}, "a-3", "s3")).ok  # validation
    assert (await a("flaky_write", {"payload": "x", "fault": "transient_once"}, "a-4", "s4")).ok
    assert not (await a("flaky_write", {"payload": "y", "fault": "final"}, "a-5", "s5")).ok
    assert (await a("flaky_write", {"payload": "y"}, "a-6", "s6")).ok  # recovered
    assert (await a("list_tickets", {}, None, "s7")).ok
    granted = _request(await a("charge_card", CHARGE, "a-7", "s8"))
    await _decide(harness, granted, grant=True)
    assert (await a("charge_card", CHARGE, "a-7", "s8")).ok
    denied = _request(await a("charge_card", {**CHARGE, "amount_cents": 99_000}, "a-8", "s9"))
    await _decide(harness, denied, grant=False)
    forbidden = await a("create_ticket", {"title": "no"}, "a-9", "s10", context=NO_SCOPES)
    assert forbidden.error is not None and forbidden.error.code == "FORBIDDEN"
    await _switch(harness, enabled=False)
    off = await a("create_ticket", {"title": "off"}, "a-10", "s11")
    assert off.error is not None and off.error.code == "TOOL_DISABLED"
    await _switch(harness, enabled=True)
    for _ in range(4):  # three rounds of retryable failures, then the retry limit
        last = await a("flaky_write", {"payload": "z", "fault": "retryable_always"}, "a-11", "s12")
    assert last.error is not None and last.error.code == "RETRY_LIMIT_EXCEEDED", last

    for n in range(3):
        done = await call(
            "create_ticket",
            {"title": f"globex {n}"},
            idempotency_key=f"b-{n}",
            context=GLOBEX,
            run_id=RUN_B,
            step_id=f"s{n}",
        )
        assert done.ok
