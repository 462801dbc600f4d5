"""``toolledger demo``: a scripted agent session on the embedded backend, checked as it runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from toolledger.embedded import EmbeddedLedger
from toolledger.processors.groups import compensation_key, step_key
from toolledger.processors.tools.manifest import RetryPolicy
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
from toolledger.producers import governance
from toolledger.producers.client import CallResult, LedgerClient, TrustedContext
from toolledger.producers.keys import derive_idempotency_key
from toolledger.schemas.events import ApprovalDenied, ApprovalGranted, ApprovalRequested
from toolledger.schemas.status import CallStatus
from toolledger.settings import LedgerSettings

AGENT = TrustedContext("acme", "support-agent-7")
OPERATOR = "ops-lead-olga"
RUN = "run-2026-11-29-0001"


@dataclass
class Checks:
    failures: list[str] = field(default_factory=list)
    passed: int = 0

    def expect(self, ok: bool, what: str) -> None:
        if ok:
            self.passed += 1
        else:
            self.failures.append(what)


@dataclass
class Scene:
    title: str
    tool: str
    key: str
    run: Callable[[LedgerClient, Checks, str], Awaitable[None]]
    effects: int  # side effects the downstream must show for this key at the end


def _key(step: str) -> str:
    return derive_idempotency_key(RUN, step)


async def _retries(client: LedgerClient, checks: Checks, key: str) -> None:
    args = {"title": "Customer cannot log in", "priority": "high"}
    results = [
        await client.call("create_ticket", args, idempotency_key=key, context=AGENT)
        for _ in range(3)
    ]
    checks.expect(all(r.ok for r in results), "retries: every call succeeded")
    checks.expect(
        [r.replayed for r in results] == [False, True, True],
        "retries: only the first call executed",
    )
    checks.expect(len({json.dumps(r.result) for r in results}) == 1, "retries: one ticket id")


async def _parallel(client: LedgerClient, checks: Checks, key: str) -> None:
    args = {"payload": "parallel branch", "fault": "slow", "delay_ms": 200}
    results = await asyncio.gather(
        *(client.call("flaky_write", args, idempotency_key=key, context=AGENT) for _ in range(8))
    )
    checks.expect(all(r.ok for r in results), "parallel: all 8 succeeded")
    checks.expect(sum(not r.replayed for r in results) == 1, "parallel: exactly one executed")


async def _reuse(client: LedgerClient, checks: Checks, key: str) -> None:
    await client.call(
        "create_ticket", {"title": "Refund request"}, idempotency_key=key, context=AGENT
    )
    other = await client.call(
        "create_ticket", {"title": "Something else"}, idempotency_key=key, context=AGENT
    )
    checks.expect(
        other.error is not None and other.error.code == "IDEMPOTENCY_KEY_REUSED",
        "reuse: other arguments refused with IDEMPOTENCY_KEY_REUSED",
    )


async def _validation(client: LedgerClient, checks: Checks, key: str) -> None:
    bad = await client.call(
        "charge_card",
        {"customer_id": "cus_42", "amount_cents": 0, "currency": "GBP"},
        idempotency_key=key,
        context=AGENT,
    )
    checks.expect(
        bad.error is not None
        and bad.error.code == "VALIDATION_FAILED"
        and len(bad.field_errors) == 2,
        "validation: two field errors",
    )
    charge = {"customer_id": "cus_42", "amount_cents": 1999, "currency": "EUR"}
    asked = await client.call("charge_card", charge, idempotency_key=key, context=AGENT)
    request = asked.event
    checks.expect(
        isinstance(request, ApprovalRequested)
        and asked.error is not None
        and asked.error.code == "APPROVAL_REQUIRED",
        "approval: the corrected, irreversible charge waits for a human",
    )
    assert isinstance(request, ApprovalRequested)
    impact = json.loads(request.impact_json)
    checks.expect(
        impact["irreversible"] is True and impact["cost"] == "19.99 EUR",
        "approval: the request shows the cost and that it cannot be undone",
    )
    record, token = governance.approve(
        governance.ApprovalTarget.of_request(request), OPERATOR, datetime.now(UTC)
    )
    granted = await client.command(record)
    checks.expect(isinstance(granted, ApprovalGranted), "approval: the operator approved it")
    good = await client.call(
        "charge_card", charge, idempotency_key=key, context=AGENT, approval_token=token
    )
    checks.expect(good.ok and not good.replayed, "approval: the approved charge ran once")
    reused = await client.call(
        "charge_card", charge, idempotency_key=key + "-again", context=AGENT, approval_token=token
    )
    checks.expect(
        reused.error is not None and reused.error.code == "APPROVAL_INVALID",
        "approval: the token does not work a second time",
    )


async def _denied(client: LedgerClient, checks: Checks, key: str) -> None:
    email = {"to": "customer@example.com", "subject": "Your refund", "body": "It is on its way."}
    asked = await client.call("send_email", email, idempotency_key=key, context=AGENT)
    assert isinstance(asked.event, ApprovalRequested)
    record = governance.deny(
        governance.ApprovalTarget.of_request(asked.event),
        OPERATOR,
        "Refunds are announced by finance.",
        datetime.now(UTC),
    )
    checks.expect(
        isinstance(await client.command(record), ApprovalDenied), "denied: the operator said no"
    )
    again = await client.call("send_email", email, idempotency_key=key, context=AGENT)
    checks.expect(
        again.error is not None
        and again.error.code == "APPROVAL_INVALID"
        and "finance" in again.error.message,
        "denied: the agent is told why, and nothing was sent",
    )


async def _switch(client: LedgerClient, checks: Checks, key: str) -> None:
    async def flip(enabled: bool) -> None:
        record = governance.switch(
            tenant_id=AGENT.tenant_id,
            tool="create_ticket",
            enabled=enabled,
            actor=OPERATOR,
            reason="incident 42: duplicate tickets upstream",
            now=datetime.now(UTC),
        )
        await client.command(record, broadcast=True)

    args = {"title": "Printer on fire"}
    await flip(False)
    refused = await client.call("create_ticket", args, idempotency_key=key, context=AGENT)
    checks.expect(
        refused.error is not None and refused.error.code == "TOOL_DISABLED",
        "kill switch: a new call is refused while the tool is off",
    )
    replay = await client.call(
        "create_ticket",
        {"title": "Customer cannot log in", "priority": "high"},
        idempotency_key=_key("open-ticket"),
        context=AGENT,
    )
    checks.expect(replay.ok and replay.replayed, "kill switch: a replay is still answered")
    await flip(True)
    done = await client.call("create_ticket", args, idempotency_key=key, context=AGENT)
    checks.expect(done.ok and not done.replayed, "kill switch: back on, the same key runs once")


async def _transient(client: LedgerClient, checks: Checks, key: str) -> None:
    result = await client.call(
        "flaky_write",
        {"payload": "x", "fault": "transient_once"},
        idempotency_key=key,
        context=AGENT,
    )
    checks.expect(result.ok and result.attempts == 2, "transient: succeeded on attempt 2")


async def _final(client: LedgerClient, checks: Checks, key: str) -> None:
    args = {"payload": "x", "fault": "final"}
    first = await client.call("flaky_write", args, idempotency_key=key, context=AGENT)
    again = await client.call("flaky_write", args, idempotency_key=key, context=AGENT)
    checks.expect(
        first.status is CallStatus.FAILED_FINAL and not first.replayed,
        "final: first call failed for good",
    )
    checks.expect(
        again.status is CallStatus.FAILED_FINAL and again.replayed,
        "final: the retry got the stored failure",
    )


async def _unknown(client: LedgerClient, checks: Checks, key: str) -> None:
    args = {"payload": "x", "fault": "hang_after_effect"}
    first = await client.call("flaky_write", args, idempotency_key=key, context=AGENT)
    checks.expect(first.status is CallStatus.UNKNOWN, "unknown: the timeout left it UNKNOWN")
    again = await client.call("flaky_write", args, idempotency_key=key, context=AGENT)
    checks.expect(again.ok and again.replayed, "unknown: reconcile found the effect")


SCENES = [
    Scene("retry of the same intent (3 times)", "create_ticket", _key("open-ticket"), _retries, 1),
    Scene("8 parallel branches, one key", "flaky_write", _key("parallel-write"), _parallel, 1),
    Scene("key reused with other arguments", "create_ticket", _key("refund"), _reuse, 1),
    Scene(
        "validation failure, corrected, approved by a human",
        "charge_card",
        _key("charge"),
        _validation,
        1,
    ),
    Scene("approval denied: nothing sent", "send_email", _key("email"), _denied, 0),
    Scene("kill switch off, replay served, back on", "create_ticket", _key("new"), _switch, 1),
    Scene("transient failure retried", "flaky_write", _key("transient"), _transient, 1),
    Scene("final failure replayed", "flaky_write", _key("final"), _final, 0),
    Scene("hang after effect -> UNKNOWN -> reconciled", "flaky_write", _key("hang"), _unknown, 1),
]


GROUP_KEY = _key("onboarding-group")


async def _group(ledger: EmbeddedLedger, checks: Checks, store: HelpdeskStore) -> str:
    """A call group: open a ticket, then a write the downstream refuses: the group fails in
    the middle, the ticket is closed again (its compensation), and a replay runs nothing."""
    assert ledger.groups is not None
    body = {
        "run_id": RUN,
        "steps": [
            {"id": "ticket", "tool": "create_ticket", "arguments": {"title": "Onboard ACME"}},
            {
                "id": "write",
                "tool": "flaky_write",
                "arguments": {"payload": "account", "fault": "final"},
                "depends_on": ["ticket"],
            },
        ],
    }
    answers = [
        await ledger.groups.submit(
            tenant_id=AGENT.tenant_id,
            principal=AGENT.principal,
            scopes=sorted(AGENT.scopes),
            group_key=GROUP_KEY,
            body=body,
            wait_s=20,
        )
        for _ in range(2)
    ]
    first, again = answers
    status = first.view.status if first.view else str(first.error)
    checks.expect(status == "COMPENSATED", f"group: {status}, expected COMPENSATED")
    checks.expect(again.replayed, "group: the same key replays the group")
    opened = store.effect_count(AGENT.tenant_id, "create_ticket", step_key(GROUP_KEY, "ticket"))
    closed = store.effect_count(
        AGENT.tenant_id, "close_ticket", compensation_key(GROUP_KEY, "ticket")
    )
    checks.expect(opened == closed == 1, f"group: opened {opened}, closed {closed}, expected 1")
    return status


async def _job(ledger: EmbeddedLedger, checks: Checks, store: HelpdeskStore) -> str:
    """A long-running tool: the export starts a background job, a retry gets the same job and
    starts none, and once the sweeper's poll sees the file the retry gets its outcome."""
    key = _key("export-tickets")
    args = {"delay_ms": 300}
    first = await ledger.client.call("export_tickets", args, idempotency_key=key, context=AGENT)
    again = await ledger.client.call(
        "export_tickets", args, idempotency_key=key, context=AGENT, wait=0
    )
    job = first.job or {}
    checks.expect(first.status is CallStatus.PENDING and bool(job), "job: the call is PENDING")
    checks.expect((again.job or {}).get("id") == job.get("id"), "job: a retry gets the same job")
    final = again
    for _ in range(200):  # the sweeper polls the job; ask again until it has finished
        await asyncio.sleep(0.1)
        final = await ledger.client.call("export_tickets", args, idempotency_key=key, context=AGENT)
        if final.status is not CallStatus.PENDING:
            break
    checks.expect(final.ok, f"job: finished {final.status}, expected SUCCEEDED")
    started = store.effect_count(AGENT.tenant_id, "export_tickets", key)
    checks.expect(started == 1, f"job: {started} jobs started, expected 1")
    return str((final.result or {}).get("path", ""))


async def run_demo(workdir: Path, console: Console) -> Checks:
    store = HelpdeskStore(workdir / "downstream.db")
    registry = helpdesk_registry(store, flaky_timeout_s=1.0, retry=RetryPolicy(backoff_base_s=0.05))
    checks = Checks()
    settings = LedgerSettings(path=workdir / "ledger.db", sweep_interval_s=0.2, create=True)
    async with EmbeddedLedger(settings, registry) as ledger:
        for number, scene in enumerate(SCENES, 1):
            with console.status(f"[bold]scene {number}/{len(SCENES)}[/]: {scene.title}"):
                await scene.run(ledger.client, checks, scene.key)
            effects = store.effect_count(AGENT.tenant_id, scene.tool, scene.key)
            checks.expect(
                effects == scene.effects,
                f"{scene.title}: {effects} side effects, expected {scene.effects}",
            )
            console.print(
                f"[green]✓[/] scene {number}: {scene.title} "
                f"({effects} side effect{'s' if effects != 1 else ''})"
            )
        with console.status("[bold]call group[/]: a failure in the middle is compensated"):
            status = await _group(ledger, checks, store)
        console.print(
            f"[green]✓[/] call group: ticket opened, write refused, ticket closed again ({status})"
        )
        with console.status("[bold]long-running job[/]: one export, however often it is asked"):
            path = await _job(ledger, checks, store)
        console.print(f"[green]✓[/] long-running job: one export, the same job on retry ({path})")
        assert ledger.runtime is not None and ledger.file is not None
        await ledger.runtime.drain()
        console.print(_audit_table(ledger, {s.key for s in SCENES}))
        console.print(_effects_table(store))
    store.close()
    return checks


def _audit_table(ledger: EmbeddedLedger, keys: set[str]) -> Table:
    assert ledger.file is not None
    table = Table(title="audit trail (tool_call_events, redacted)", show_lines=False)
    for column in ("#", "tool", "idempotency key", "event", "detail"):
        table.add_column(column)
    rows = ledger.file.conn.execute(
        "SELECT seq, tool_name, event_type, payload_json FROM tool_call_events ORDER BY seq"
    ).fetchall()
    for seq, tool, event_type, payload in rows:
        event = json.loads(payload)
        key = str(event["envelope"].get("idempotency_key") or "")
        table.add_row(str(seq), tool, key if key in keys else key[:20], event_type, _detail(event))
    return table


def _detail(payload: dict[str, object]) -> str:
    for name in ("error", "resolution", "status", "result_json", "reason"):
        value = payload.get(name)
        if isinstance(value, dict):
            return str(value.get("code"))
        if value:
            return str(value)[:60]
    attempt = payload.get("attempt")
    return f"attempt {attempt}" if attempt else ""


def _effects_table(store: HelpdeskStore) -> Table:
    table = Table(title="side effects at the downstream, per key")
    for column in ("tenant", "tool", "idempotency key", "effects"):
        table.add_column(column)
    for (tenant, tool, key), count in sorted(store.effect_counts().items()):
        table.add_row(tenant, tool, key, f"[{'green' if count == 1 else 'red'}]{count}[/]")
    return table


def print_result(console: Console, checks: Checks, result: CallResult | None = None) -> None:
    if checks.failures:
        for failure in checks.failures:
            console.print(f"[red]✗ {failure}[/]")
        console.print(f"[red bold]{len(checks.failures)} invariant check(s) failed[/]")
    else:
        console.print(f"[green bold]all {checks.passed} invariant checks passed[/]")
