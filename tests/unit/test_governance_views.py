"""The governance read side (approvals, switches, metrics, run budgets) over the embedded
SQLite projection.

The scenarios are written once (:data:`SCENARIOS`): each one builds outcome events, and its
``check`` asserts what the queries answer and returns what it saw.
``tests/integration/test_governance_views_pg.py`` runs the same scenarios against PostgreSQL
and asserts both databases answer the same.
"""

from __future__ import annotations

import itertools
import json
import re
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from toolledger.processors.ledger.rows import event_json, event_of_json
from toolledger.processors.runtime import sqlite_ledger
from toolledger.processors.runtime.sqlite_ledger import SqliteLedger
from toolledger.projections import governance
from toolledger.projections import sqlite as sqlite_projection
from toolledger.projections.rows import Position
from toolledger.projections.sqlite import SqliteCalls, SqliteReadModel
from toolledger.schemas.calls import (
    STAT_COUNTS,
    STAT_RATES,
    ApprovalView,
    CallQueries,
    RunUsage,
    Stats,
    SwitchView,
    ToolStats,
    effective_switch,
)
from toolledger.schemas.canonical import args_digest, canonical_json
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.events import (
    ApprovalConsumed,
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Envelope,
    Event,
    FailureDisposition,
    ToolCallFailed,
    ToolCallOutcomeUnknown,
    ToolCallRejected,
    ToolCallReplayed,
    ToolCallStarted,
    ToolCallSucceeded,
    ToolDisabled,
    ToolEnabled,
)
from toolledger.schemas.keys import CallKey, call_id_of
from toolledger.schemas.status import CallStatus

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
FAR_FUTURE = datetime(2999, 1, 1, tzinfo=UTC)
LONG_AGO = datetime(2001, 1, 1, tzinfo=UTC)
MIN = timedelta(minutes=1)
US = timedelta(microseconds=1)
PARTITIONS = 4

# ------------------------------------------------------------------------- event builders


@dataclass(frozen=True)
class Key:
    tenant: str
    tool: str
    idem: str
    run_id: str | None = None
    args: Any = None

    @property
    def call_key(self) -> str:
        return str(CallKey(self.tenant, self.tool, self.idem))

    @property
    def call_id(self) -> str:
        return call_id_of(self.call_key)

    @property
    def digest(self) -> str:
        return args_digest(self.args if self.args is not None else {"idem": self.idem})


class Log:
    """Outcome events in log order, each with its place: calls in their key's partition,
    switches once in every partition (the same intent id, other event ids)."""

    def __init__(self, name: str) -> None:
        self.name = name  # in the event ids: the scenarios' events can share one log
        self.batch: list[tuple[Event, Position]] = []
        self._next = [0] * PARTITIONS
        self._seq = 0
        self._cuts: list[int] = []

    def cut(self) -> None:
        """End a stage: the scenario looks at the projection between stages."""
        self._cuts.append(len(self.batch))

    def stages(self) -> list[list[tuple[Event, Position]]]:
        bounds = [0, *self._cuts, len(self.batch)]
        return [self.batch[a:b] for a, b in itertools.pairwise(bounds)]

    def _add(self, event: Event, partition: int) -> None:
        self.batch.append((event, Position(partition, self._next[partition])))
        self._next[partition] += 1

    def env(
        self, key: Key, intent: str, at: datetime, *, principal: str = "agent:planner"
    ) -> Envelope:
        self._seq += 1
        return Envelope(
            event_id=f"{self.name}:{intent}/{self._seq}",
            call_key=key.call_key,
            tenant_id=key.tenant,
            tool=key.tool,
            tool_version="1.0",
            idempotency_key=key.idem,
            args_digest=key.digest,
            intent_id=intent,
            run_id=key.run_id,
            step_id=key.idem,
            principal=principal,
            occurred_at=at,
            trace_id=f"trace-{intent}",
        )

    def call(self, event: Event) -> None:
        self._add(event, sum(event.call_key.encode()) % PARTITIONS)

    # calls
    def started(self, k: Key, intent: str, at: datetime, attempt: int = 1) -> None:
        self.call(
            ToolCallStarted(
                envelope=self.env(k, intent, at),
                attempt=attempt,
                round=1,
                executor_epoch=1,
                arguments_redacted_json=canonical_json(k.args or {}),
            )
        )

    def succeeded(self, k: Key, intent: str, at: datetime, attempt: int = 1) -> None:
        self.call(
            ToolCallSucceeded(
                envelope=self.env(k, intent, at),
                attempt=attempt,
                result_json='{"ok":true}',
                duration_ms=5,
            )
        )

    def failed(
        self,
        k: Key,
        intent: str,
        at: datetime,
        disposition: FailureDisposition,
        fingerprint: str,
        *,
        attempt: int = 1,
        code: ErrorCode | None = None,
    ) -> None:
        error = (
            ErrorInfo.of(code, "gave up")
            if code
            else ErrorInfo.downstream("TIMEOUT", "timed out", retryable=True, suggested_action="")
        )
        self.call(
            ToolCallFailed(
                envelope=self.env(k, intent, at),
                attempt=attempt,
                error=error,
                disposition=disposition,
                fingerprint=fingerprint,
                duration_ms=7,
            )
        )

    def unknown(self, k: Key, intent: str, at: datetime) -> None:
        self.call(ToolCallOutcomeUnknown(envelope=self.env(k, intent, at), attempt=1, reason="t/o"))

    def replayed(self, k: Key, intent: str, at: datetime, original: str) -> None:
        self.call(
            ToolCallReplayed(
                envelope=self.env(k, intent, at),
                status=CallStatus.SUCCEEDED,
                attempts=1,
                original_intent_id=original,
                result_json='{"ok":true}',
            )
        )

    def rejected(self, k: Key, intent: str, at: datetime, code: ErrorCode) -> None:
        self.call(
            ToolCallRejected(envelope=self.env(k, intent, at), error=ErrorInfo.of(code, "no"))
        )

    # approvals
    def requested(
        self,
        k: Key,
        intent: str,
        at: datetime,
        approval_id: str,
        expires_at: datetime,
        impact: dict[str, Any] | None = None,
    ) -> None:
        impact = impact or {"summary": f"{k.tool} {k.idem}", "irreversible": False}
        self.call(
            ApprovalRequested(
                envelope=self.env(k, intent, at),
                approval_id=approval_id,
                arguments_redacted_json=canonical_json(k.args or {}),
                impact_json=canonical_json(impact),
                expires_at=expires_at,
            )
        )

    def granted(
        self, k: Key, at: datetime, approval_id: str, token_expires_at: datetime, by: str
    ) -> None:
        self.call(
            ApprovalGranted(
                envelope=self.env(k, f"grant-{approval_id}", at, principal=by),
                approval_id=approval_id,
                approver=by,
                token_digest=f"tok-{approval_id}",
                expires_at=token_expires_at,
            )
        )

    def denied(self, k: Key, at: datetime, approval_id: str, by: str, reason: str) -> None:
        self.call(
            ApprovalDenied(
                envelope=self.env(k, f"deny-{approval_id}", at, principal=by),
                approval_id=approval_id,
                approver=by,
                reason=reason,
            )
        )

    def consumed(self, k: Key, intent: str, at: datetime, approval_id: str) -> None:
        self.call(ApprovalConsumed(envelope=self.env(k, intent, at), approval_id=approval_id))

    # switches
    def switch(
        self, tenant: str, tool: str, intent: str, at: datetime, *, enabled: bool, reason: str
    ) -> None:
        """Recorded once per partition, like the executor does, in partition order."""
        kind = ToolEnabled if enabled else ToolDisabled
        for partition in range(PARTITIONS):
            env = self.env(Key(tenant, tool, ""), intent, at, principal="ops:carol")
            event = kind(
                envelope=env,
                scope="global" if tenant == "*" else "tenant",
                actor="ops:carol",
                reason=reason,
            )
            self._add(event, partition)


# ------------------------------------------------------------------------------- scenarios


Batch = list[tuple[Event, Position]]
Advance = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Scenario:
    """``stages()``: the events, in stages; ``check(calls, advance)``: ``await advance()``
    applies the next stage to the projection that ``calls`` reads."""

    name: str
    stages: Callable[[], list[Batch]]
    check: Callable[[CallQueries, Advance], Awaitable[Any]]

    def events(self) -> Batch:
        return [e for stage in self.stages() for e in stage]

    async def run(self, calls: CallQueries, load: Callable[[Batch], Awaitable[None]]) -> Any:
        stages = iter(self.stages())

        async def advance() -> None:
            await load(next(stages))

        seen = await self.check(calls, advance)
        assert next(stages, None) is None, "the check did not apply every stage"
        return seen

    def __str__(self) -> str:
        return self.name


WIRE = "wire_money"
IMPACT_1 = {
    "summary": "Pay 1250.50 EUR to Société Générale",
    "target": "iban:FR76…",
    "scope": "one payment",
    "cost": 1250.5,
    "irreversible": True,
    "extra": "not rendered",
}
K1 = Key("acme", WIRE, "k1", "run-1", {"amount": 1250.5, "iban": "hmac:0a1b"})
K2 = Key("acme", WIRE, "k2", "run-1")
K3 = Key("acme", WIRE, "k3")
K4 = Key("acme", WIRE, "k4")
K5 = Key("acme", WIRE, "k5")
K6A = Key("acme", WIRE, "k6a")
K6B = Key("acme", WIRE, "k6b")
KG = Key("globex", WIRE, "kg")
PLUS_2 = timezone(timedelta(hours=2))


def approval_events() -> list[Batch]:
    log = Log("approvals")
    # ap-1: requested (and again: the first request stands), granted, consumed
    log.requested(K1, "i1", T0, "ap-1", T0 + 60 * MIN, IMPACT_1)
    log.requested(K1, "i1b", T0 + 5 * MIN, "ap-1", T0 + 120 * MIN, {"summary": "again"})
    log.cut()
    log.granted(K1, T0 + 10 * MIN, "ap-1", T0 + 40 * MIN, "human:alice")
    log.cut()
    log.consumed(K1, "i1c", T0 + 20 * MIN, "ap-1")
    log.started(K1, "i1c", T0 + 20 * MIN)
    log.succeeded(K1, "i1c", T0 + 21 * MIN)
    # ap-2: denied with a reason
    log.requested(K2, "i2", T0 + 1 * MIN + 7 * US, "ap-2", T0 + 61 * MIN)
    log.denied(K2, T0 + 2 * MIN, "ap-2", "human:bob", "too expensive")
    # ap-3: stays pending; expires at a whole second (no fraction in the JSON)
    log.requested(K3, "i3", T0 + 2 * MIN, "ap-3", T0 + 62 * MIN)
    # ap-4: approved, the token expires before the request would have
    log.requested(K4, "i4", T0 + 3 * MIN, "ap-4", T0 + 60 * MIN)
    log.granted(K4, T0 + 4 * MIN, "ap-4", T0 + 30 * MIN, "human:alice")
    # ap-5: requested with a +02:00 offset, approved, the token outlives the request
    log.requested(K5, "i5", (T0 + 4 * MIN).astimezone(PLUS_2), "ap-5", T0 + 10 * MIN)
    log.granted(K5, T0 + 5 * MIN, "ap-5", T0 + 180 * MIN, "human:alice")
    # two requests at the same instant: ordered by approval id
    log.requested(K6B, "i6b", T0 + 6 * MIN, "ap-6b", T0 + 600 * MIN)
    log.requested(K6A, "i6a", T0 + 6 * MIN, "ap-6a", T0 + 600 * MIN)
    # another tenant
    log.requested(KG, "ig", T0 + 7 * MIN, "ap-g", T0 + 600 * MIN)
    return log.stages()


def _ids(views: Iterable[ApprovalView]) -> list[str]:
    return [v.approval_id for v in views]


async def _all_pages(
    calls: CallQueries, tenant: str | None, status: str | None, now: datetime, limit: int
) -> tuple[list[ApprovalView], int]:
    items: list[ApprovalView] = []
    after: str | None = None
    pages = 0
    while True:
        page = await calls.approvals(tenant, status=status, now=now, limit=limit, after=after)
        items += page.items
        pages += 1
        if page.next_cursor is None:
            return items, pages
        after = page.next_cursor


async def check_approvals(calls: CallQueries, advance: Advance) -> Any:
    seen: dict[str, Any] = {}

    async def status(approval_id: str, now: datetime) -> str | None:
        view = await calls.approval("acme", approval_id, now=now)
        seen[f"{approval_id}@{now.isoformat()}@{len(seen)}"] = view.to_json() if view else None
        return view.status if view else None

    assert await calls.approval(None, "ap-1", now=T0) is None
    await advance()
    # the life of ap-1: pending (asked twice: one request) -> approved -> consumed
    assert await status("ap-1", T0 + 1 * MIN) == "pending"
    assert await status("ap-1", T0 + 60 * MIN - US) == "pending"  # the first request's expiry
    assert await status("ap-1", T0 + 60 * MIN) == "expired"
    first = await calls.approvals("acme", status=None, now=T0, limit=10, after=None)
    assert [(v.approval_id, v.impact["summary"]) for v in first.items] == [
        ("ap-1", IMPACT_1["summary"])
    ]
    await advance()  # granted, with a token that expires at T0 + 40 min
    assert await status("ap-1", T0 + 15 * MIN) == "approved"
    assert await status("ap-1", T0 + 59 * MIN) == "expired"
    await advance()  # consumed: a consumed approval never expires
    assert await status("ap-1", T0 + 30 * MIN) == "consumed"
    assert await status("ap-1", T0 + 300 * MIN) == "consumed"
    assert await status("ap-2", T0 + 300 * MIN) == "denied"  # a denial never expires
    # pending until its expires_at, expired from then on
    assert await status("ap-3", T0 + 62 * MIN - US) == "pending"
    assert await status("ap-3", T0 + 62 * MIN) == "expired"
    # an approved request expires with its token: earlier or later than the request
    assert await status("ap-4", T0 + 30 * MIN - US) == "approved"
    assert await status("ap-4", T0 + 30 * MIN) == "expired"
    assert await status("ap-5", T0 + 179 * MIN) == "approved"
    assert await status("ap-5", T0 + 180 * MIN) == "expired"

    now = T0 + 30 * MIN
    one = await calls.approval("acme", "ap-1", now=now)
    assert one is not None
    assert one.to_json() == {
        "id": "ap-1",
        "tool": WIRE,
        "arguments": {"amount": 1250.5, "iban": "hmac:0a1b"},
        "args_digest": K1.digest,
        "approver_kind": "operator",
        "impact": {
            "summary": "Pay 1250.50 EUR to Société Générale",
            "target": "iban:FR76…",
            "scope": "one payment",
            "cost": 1250.5,
            "irreversible": True,
        },
        "status": "consumed",
        "expires_at": "2025-03-01T09:40:00Z",  # the token's expiry replaced the request's
        "tenant_id": "acme",
        "call_id": K1.call_id,
        "idempotency_key": "k1",
        "run_id": "run-1",
        "requested_by": "agent:planner",
        "requested_at": "2025-03-01T09:00:00Z",
        "approver": "human:alice",
        "decided_at": "2025-03-01T09:10:00Z",
        "reason": None,
        "consumed_at": "2025-03-01T09:20:00Z",
    }
    assert one.call_key == K1.call_key  # for routing; not rendered
    denied = await calls.approval("acme", "ap-2", now=now)
    assert denied is not None
    assert (denied.approver, denied.reason, denied.decided_at) == (
        "human:bob",
        "too expensive",
        T0 + 2 * MIN,
    )
    assert denied.requested_at == T0 + 1 * MIN + 7 * US  # microseconds kept
    assert denied.to_json()["impact"] == {
        "summary": "wire_money k2",
        "target": None,
        "scope": None,
        "cost": None,
        "irreversible": False,
    }
    ap5 = await calls.approval("acme", "ap-5", now=now)
    assert ap5 is not None and ap5.requested_at == T0 + 4 * MIN  # +02:00 read as the instant

    # tenant scoping: another tenant's approval is not found; None means any tenant
    assert await calls.approval("globex", "ap-1", now=now) is None
    assert await calls.approval("acme", "ap-g", now=now) is None
    assert await calls.approval("acme", "nope", now=now) is None
    other = await calls.approval(None, "ap-g", now=now)
    assert other is not None and other.tenant_id == "globex"

    # lists: one row per approval id, by requested_at then approval_id
    everything = await calls.approvals("acme", status=None, now=now, limit=100, after=None)
    assert everything.next_cursor is None
    expected = ["ap-1", "ap-2", "ap-3", "ap-4", "ap-5", "ap-6a", "ap-6b"]
    assert _ids(everything.items) == expected
    paged, pages = await _all_pages(calls, "acme", None, now, 2)
    assert (paged, pages) == (everything.items, 4)  # the tie ap-6a/ap-6b is split by a page
    assert _ids((await _all_pages(calls, None, None, now, 3))[0]) == [*expected, "ap-g"]
    by_status = {
        s: _ids((await calls.approvals("acme", status=s, now=now, limit=10, after=None)).items)
        for s in ("pending", "approved", "denied", "consumed", "expired")
    }
    assert by_status == {
        "pending": ["ap-3", "ap-6a", "ap-6b"],
        "approved": ["ap-5"],
        "denied": ["ap-2"],
        "consumed": ["ap-1"],
        "expired": ["ap-4"],
    }
    expired_later, _ = await _all_pages(calls, "acme", "expired", T0 + 700 * MIN, 1)
    assert _ids(expired_later) == ["ap-3", "ap-4", "ap-5", "ap-6a", "ap-6b"]
    assert (await calls.approvals("globex", status=None, now=now, limit=5, after=None)).items[
        0
    ].approval_id == "ap-g"

    for bad in ("garbage", "", "eyJ4IjoxfQ", governance_cursor_of_call()):
        with pytest.raises(ValueError):
            await calls.approvals("acme", status=None, now=now, limit=2, after=bad)
    with pytest.raises(ValueError):
        await calls.approvals("acme", status="lost", now=now, limit=2, after=None)
    with pytest.raises(ValueError):
        await calls.approval("acme", "ap-1", now=datetime(2025, 3, 1))  # naive
    seen["list"] = [v.to_json() for v in everything.items]
    seen["pages"] = [v.to_json() for v in paged]
    return seen


def governance_cursor_of_call() -> str:
    """A cursor of the calls list: not one of the approvals list."""
    from toolledger.schemas.calls import encode_cursor

    return encode_cursor("call_0123")


def switch_events() -> list[Batch]:
    log = Log("switches")
    # appended out of time order: the latest by time wins, not the last appended
    log.switch("acme", "send_email", "sw-2", T0 + 2 * MIN, enabled=True, reason="fixed")
    log.switch("acme", "send_email", "sw-1", T0 + 1 * MIN, enabled=False, reason="spam")
    log.switch("*", "send_email", "sw-3", T0 + 3 * MIN, enabled=False, reason="provider down")
    log.switch("acme", "*", "sw-4", T0 + 4 * MIN, enabled=False, reason="audit")
    log.switch("acme", "*", "sw-5", T0 + 5 * MIN, enabled=True, reason="audit over")
    log.switch("globex", "charge_card", "sw-6", T0 + 6 * MIN, enabled=False, reason="fraud")
    log.switch("*", "*", "sw-7", T0 + 7 * MIN, enabled=False, reason="incident")
    log.switch("*", "*", "sw-8", T0 + 8 * MIN, enabled=True, reason="incident over")
    # two changes of one switch at the same instant: the higher intent id wins, as in the
    # executor, whatever the log order
    log.switch("globex", "*", "sw-9b", T0 + 9 * MIN, enabled=False, reason="b")
    log.switch("globex", "*", "sw-9a", T0 + 9 * MIN, enabled=True, reason="a")
    return log.stages()


async def check_switches(calls: CallQueries, advance: Advance) -> Any:
    assert await calls.switches("acme") == []
    await advance()
    acme = await calls.switches("acme")
    summary = [(s.tenant_id, s.tool, s.enabled, s.reason) for s in acme]
    assert summary == [
        ("*", "*", True, "incident over"),
        ("*", "send_email", False, "provider down"),
        ("acme", "*", True, "audit over"),
        ("acme", "send_email", True, "fixed"),
    ]
    assert acme[1] == SwitchView(
        tenant_id="*",
        tool="send_email",
        enabled=False,
        reason="provider down",
        actor="ops:carol",
        changed_at=T0 + 3 * MIN,
    )
    # acme's own switch is on, but the global one for the tool is off
    assert effective_switch(acme, "acme", "send_email") == acme[1]
    assert effective_switch(acme, "acme", "charge_card") is None
    globex = await calls.switches("globex")
    assert [(s.tenant_id, s.tool, s.enabled, s.reason) for s in globex] == [
        ("*", "*", True, "incident over"),
        ("*", "send_email", False, "provider down"),
        ("globex", "*", False, "b"),
        ("globex", "charge_card", False, "fraud"),
    ]
    found = effective_switch(globex, "globex", "charge_card")
    assert found is not None and found.reason == "fraud"
    found = effective_switch(globex, "globex", "anything")
    assert found is not None and found.reason == "b"
    assert [s.tenant_id for s in await calls.switches("initech")] == ["*", "*"]
    return {t: [s.to_json() for s in await calls.switches(t)] for t in ("acme", "globex")}


SEND = "send_email"
CHARGE = "charge_card"


def stats_events() -> list[Batch]:
    log = Log("stats")
    t = T0
    s1, s2 = Key("acme", SEND, "s1", "r1"), Key("acme", SEND, "s2", "r1")
    s3, s4 = Key("acme", SEND, "s3", "r2"), Key("acme", SEND, "s4", "r2")
    s5 = Key("acme", SEND, "s5")  # no run
    log.started(s1, "i1", t)
    log.succeeded(s1, "i1", t)
    log.replayed(s1, "i1b", t, "i1")  # a duplicate
    log.started(s2, "i2", t)
    log.failed(s2, "i2", t, FailureDisposition.RETRY, "fp-x")
    log.started(s2, "i2", t, attempt=2)
    log.failed(s2, "i2", t, FailureDisposition.RETRYABLE, "fp-x", attempt=2)
    log.started(s3, "i3", t)
    log.failed(s3, "i3", t, FailureDisposition.FINAL, "fp-y", code=ErrorCode.RETRY_LIMIT_EXCEEDED)
    log.started(s4, "i4", t)
    log.unknown(s4, "i4", t)
    log.started(s5, "i5", t)  # still pending
    log.rejected(s5, "i8", t, ErrorCode.IDEMPOTENCY_KEY_IN_USE)  # a duplicate
    log.rejected(Key("acme", SEND, "s6"), "i6", t, ErrorCode.VALIDATION_FAILED)
    log.rejected(s1, "i7", t, ErrorCode.IDEMPOTENCY_KEY_REUSED)  # not a duplicate
    log.rejected(Key("acme", SEND, "s7"), "i15", t, ErrorCode.RETRY_LIMIT_EXCEEDED)
    # charge_card: approvals
    c8, c9 = Key("acme", CHARGE, "c8", "r1"), Key("acme", CHARGE, "c9", "r3")
    c10, c11 = Key("acme", CHARGE, "c10"), Key("acme", CHARGE, "c11")
    log.requested(c8, "i9", t, "ap-c8", FAR_FUTURE)
    log.requested(c8, "i10", t, "ap-c8", FAR_FUTURE)  # asked again while pending
    log.granted(c8, t, "ap-c8", FAR_FUTURE, "human:alice")
    log.consumed(c8, "i11", t, "ap-c8")
    log.started(c8, "i11", t)
    log.succeeded(c8, "i11", t)
    log.requested(c9, "i12", t, "ap-c9", FAR_FUTURE)
    log.denied(c9, t, "ap-c9", "human:bob", "no")
    log.requested(c10, "i13", t, "ap-c10", FAR_FUTURE)  # pending
    log.requested(c11, "i14", t, "ap-c11", LONG_AGO)  # expired: not pending
    # switches are no calls: no row for tenant '*', nothing counted
    log.switch("*", SEND, "sw", t, enabled=False, reason="x")
    log.switch("acme", "*", "sw2", t, enabled=False, reason="x")
    # another tenant
    g = Key("globex", SEND, "g1", "r1")
    log.started(g, "ig", t)
    log.succeeded(g, "ig", t)
    return log.stages()


ACME_SEND = ToolStats(
    SEND,
    calls=5,
    succeeded=1,
    failed_final=1,
    failed_retryable=1,
    unknown=1,
    pending=1,
    intents=10,  # i1 i1b i2 i3 i4 i5 i6 i7 i8 i15
    validation_failures=1,
    duplicates=2,
    retry_limit_refusals=2,
    calls_in_runs=4,
    runs=2,
)
ACME_CHARGE = ToolStats(
    CHARGE,
    calls=1,
    succeeded=1,
    intents=6,  # i9 i10 i11 i12 i13 i14 (approvers' decisions are no calls)
    calls_in_runs=1,
    runs=1,
    approvals_pending=1,
    approvals_granted=1,
    approvals_denied=1,
)
GLOBEX_SEND = ToolStats(SEND, calls=1, succeeded=1, intents=1, calls_in_runs=1, runs=1)


async def check_stats(calls: CallQueries, advance: Advance) -> Any:
    assert await calls.stats(None) == Stats(None, [], ToolStats("*"))
    await advance()
    acme = await calls.stats("acme")
    assert acme == Stats(
        "acme",
        [ACME_CHARGE, ACME_SEND],
        ToolStats(
            "*",
            calls=6,
            succeeded=2,
            failed_final=1,
            failed_retryable=1,
            unknown=1,
            pending=1,
            intents=16,
            validation_failures=1,
            duplicates=2,
            retry_limit_refusals=2,
            calls_in_runs=5,
            runs=2,  # r1 (both tools) and r2: not 3
            approvals_pending=1,
            approvals_granted=1,
            approvals_denied=1,
        ),
    )
    send, charge, total = acme.tools[1], acme.tools[0], acme.totals
    assert (send.success_rate, send.validation_failure_rate, send.duplicate_rate) == (
        0.25,
        0.1,
        0.2,
    )
    assert (send.human_rejection_rate, send.calls_per_run) == (None, 2.0)
    assert (charge.success_rate, charge.human_rejection_rate, charge.duplicate_rate) == (
        1.0,
        0.5,
        0.0,
    )
    assert (total.success_rate, total.calls_per_run, total.duplicate_rate) == (0.4, 2.5, 0.125)
    assert total.validation_failure_rate == 1 / 16

    everyone = await calls.stats(None)
    assert everyone.tenant_id is None
    assert everyone.tools == [
        ACME_CHARGE,
        ToolStats(
            SEND,
            calls=6,
            succeeded=2,
            failed_final=1,
            failed_retryable=1,
            unknown=1,
            pending=1,
            intents=11,
            validation_failures=1,
            duplicates=2,
            retry_limit_refusals=2,
            calls_in_runs=5,
            runs=3,  # acme r1, acme r2, globex r1: run ids belong to a tenant
        ),
    ]
    assert (everyone.totals.calls, everyone.totals.runs, everyone.totals.intents) == (7, 3, 17)
    assert everyone.totals.calls_per_run == 2.0
    assert (await calls.stats("globex")).tools == [GLOBEX_SEND]
    nobody = await calls.stats("initech")
    assert nobody == Stats("initech", [], ToolStats("*"))
    assert nobody.totals.to_json() == {
        "tool": "*",
        **dict.fromkeys(STAT_COUNTS, 0),
    } | dict.fromkeys(STAT_RATES)
    rendered = acme.to_json()
    assert rendered["totals"]["calls_per_run"] == 2.5 and rendered["tenant_id"] == "acme"
    assert list(rendered["tools"][1]) == ["tool", *STAT_COUNTS, *STAT_RATES]
    return {"acme": rendered, "all": everyone.to_json(), "nobody": nobody.to_json()}


def run_events() -> list[Batch]:
    log = Log("run_usage")
    t = T0
    fail = FailureDisposition
    a = Key("acme", SEND, "a", "r9")
    b = Key("acme", SEND, "b", "r9")
    c = Key("acme", CHARGE, "c", "r9")
    log.started(a, "ia", t)
    log.failed(a, "ia", t, fail.RETRY, "fp-b")
    log.started(a, "ia", t, attempt=2)
    log.failed(a, "ia", t, fail.RETRY, "fp-a", attempt=2)
    log.started(a, "ia", t, attempt=3)
    log.failed(a, "ia", t, fail.RETRYABLE, "fp-b", attempt=3)
    log.started(b, "ib", t)
    log.failed(b, "ib", t, fail.FINAL, "fp-a")
    for attempt in (1, 2, 3):
        log.started(c, "ic", t, attempt=attempt)
        log.failed(c, "ic", t, fail.RETRY if attempt < 3 else fail.FINAL, "fp-z", attempt=attempt)
    log.started(Key("acme", SEND, "d", "r10"), "id", t)
    g = Key("globex", SEND, "g", "r9")  # same run id, other tenant
    log.started(g, "ig", t)
    log.failed(g, "ig", t, fail.FINAL, "fp-a")
    return log.stages()


async def check_run_usage(calls: CallQueries, advance: Advance) -> Any:
    assert await calls.run_usage("acme", "r9", SEND) == RunUsage(0, 0, None)
    await advance()
    cases = {
        # only failures that ended a round count: fp-b (a's 3rd attempt) and fp-a (b) tie,
        # the smaller wins; c's three failures are one failed round
        ("acme", "r9", SEND): RunUsage(7, 1, "fp-a"),
        ("acme", "r9", CHARGE): RunUsage(7, 1, "fp-z"),
        ("acme", "r9", "other_tool"): RunUsage(7, 0, None),
        ("acme", "r10", SEND): RunUsage(1, 0, None),
        ("globex", "r9", SEND): RunUsage(1, 1, "fp-a"),
        ("acme", "nope", SEND): RunUsage(0, 0, None),
    }
    seen = {key: await calls.run_usage(*key) for key in cases}
    assert seen == cases
    return [[*key, *vars_of(usage)] for key, usage in seen.items()]


def vars_of(usage: RunUsage) -> list[Any]:
    return [usage.attempts, usage.repeats, usage.fingerprint]


def recent_events() -> list[Batch]:
    log = Log("recent")
    at = {"r1": T0, "r2": T0 + MIN, "r3": T0 + 2 * MIN, "r4": T0 + 2 * MIN, "r5": T0 + 2 * MIN + US}
    for idem, when in at.items():  # r3 and r4 were created at the same time
        log.started(Key("acme", SEND, idem), f"i-{idem}", when)
    log.started(Key("globex", SEND, "rg"), "i-rg", T0 + 3 * MIN)
    log.cut()
    log.started(Key("acme", SEND, "r6"), "i-r6", T0 + 10 * MIN)
    log.succeeded(Key("acme", SEND, "r1"), "i-r1", T0 + 20 * MIN)  # updated, not created
    return log.stages()


async def _recent_pages(calls: CallQueries, tenant: str, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    before: str | None = None
    while True:
        page = await calls.recent(tenant, limit=limit, before=before)
        pages.append([v.call_id for v in page.items])
        if page.next_cursor is None:
            return pages
        before = page.next_cursor


async def check_recent(calls: CallQueries, advance: Advance) -> Any:
    def ids(*idems: str) -> list[str]:
        return [Key("acme", SEND, i).call_id for i in idems]

    assert (await calls.recent("acme", limit=5, before=None)).items == []
    await advance()
    tied = sorted(ids("r3", "r4"), reverse=True)  # the same time: by call id, descending
    newest_first = [*ids("r5"), *tied, *ids("r2", "r1")]
    assert await _recent_pages(calls, "acme", 5) == [newest_first]
    assert await _recent_pages(calls, "acme", 2) == [
        newest_first[:2],
        newest_first[2:4],
        newest_first[4:],
    ]
    assert await _recent_pages(calls, "globex", 2) == [[Key("globex", SEND, "rg").call_id]]
    assert await _recent_pages(calls, "initech", 2) == [[]]
    first = await calls.recent("acme", limit=2, before=None)
    assert first.next_cursor is not None
    await advance()
    # a cursor handed out before goes on from where it was; a new first page has the new call
    after_it = await calls.recent("acme", limit=10, before=first.next_cursor)
    assert [v.call_id for v in after_it.items] == newest_first[2:]
    assert await _recent_pages(calls, "acme", 10) == [[*ids("r6"), *newest_first]]
    for bad in ("", "!!!", "eyJ4IjoxfQ", governance_cursor_of_call()):
        with pytest.raises(ValueError):
            await calls.recent("acme", limit=2, before=bad)
    with pytest.raises(ValueError):
        await calls.recent("acme", limit=0, before=None)
    return await _recent_pages(calls, "acme", 3)


APPROVALS = Scenario("approvals", approval_events, check_approvals)
SWITCHES = Scenario("switches", switch_events, check_switches)
STATS = Scenario("stats", stats_events, check_stats)
RUN_USAGE = Scenario("run_usage", run_events, check_run_usage)
RECENT = Scenario("recent", recent_events, check_recent)
SCENARIOS = [APPROVALS, SWITCHES, STATS, RUN_USAGE, RECENT]

# ------------------------------------------------------------------------------- SQLite


def sqlite_with(batch: Sequence[tuple[Event, Position]] = ()) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("BEGIN")
    sqlite_ledger.create(conn, READ_MODEL)
    conn.execute("COMMIT")
    sqlite_load(conn, batch)
    return conn


READ_MODEL = SqliteReadModel()


def sqlite_load(conn: sqlite3.Connection, batch: Sequence[tuple[Event, Position]]) -> None:
    """The events appended to an embedded ledger's log (in order, each in its partition),
    its call rows folded from the log and its read model derived, as the ledger has them."""
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO events (partition, event) VALUES (?, ?)",
        [(position.partition, event_json(event)) for event, position in batch],
    )
    logged = [
        (seq, partition, event_of_json(text))
        for seq, partition, text in conn.execute(
            "SELECT seq, partition, event FROM events ORDER BY seq"
        )
    ]
    sqlite_ledger.refold(conn, READ_MODEL, [event for _, _, event in logged])
    READ_MODEL.derive(conn, logged)
    conn.execute("COMMIT")


async def run_on_sqlite(scenario: Scenario) -> tuple[sqlite3.Connection, Any]:
    conn = sqlite_with()

    async def load(batch: Batch) -> None:
        sqlite_load(conn, batch)

    return conn, await scenario.run(SqliteCalls(conn), load)


def view_rows(conn: sqlite3.Connection, view: str) -> list[dict[str, Any]]:
    cursor = conn.execute(f"SELECT * FROM {view}")
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor]


def rates_match(rows: Iterable[dict[str, Any]]) -> None:
    """The rate columns of a metrics view equal ToolStats' rates of its count columns."""
    for row in rows:
        stats = ToolStats("x", **{name: int(row[name]) for name in STAT_COUNTS})
        assert {name: row[name] for name in STAT_RATES} == {
            name: getattr(stats, name) for name in STAT_RATES
        }


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
async def test_scenario_on_sqlite(scenario: Scenario) -> None:
    await run_on_sqlite(scenario)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
async def test_a_rebuild_answers_the_same(scenario: Scenario) -> None:
    """Drop and rebuild the read model the way ``SqliteLedger.rebuild`` does (the DDL split
    on ';'): the same answers."""
    conn, _ = await run_on_sqlite(scenario)
    before = await snapshot(SqliteCalls(conn))
    conn.execute("BEGIN")
    sqlite_projection.drop(conn)
    assert conn.execute("SELECT name FROM sqlite_master WHERE type = 'view'").fetchall() == []
    conn.execute("COMMIT")
    sqlite_load(conn, [])
    assert await snapshot(SqliteCalls(conn)) == before


async def snapshot(calls: CallQueries) -> dict[str, Any]:
    """Everything the scanning reads (the governance queries, the recent calls) answer about
    the usual tenants, runs and tools."""
    tenants = ("acme", "globex", "initech")
    out: dict[str, Any] = {}
    for now in (T0, T0 + 30 * MIN, T0 + 700 * MIN):
        page = await calls.approvals(None, status=None, now=now, limit=1000, after=None)
        out[f"approvals@{now.isoformat()}"] = [v.to_json() for v in page.items]
    for tenant in tenants:
        out[f"switches/{tenant}"] = [s.to_json() for s in await calls.switches(tenant)]
        out[f"recent/{tenant}"] = await _recent_pages(calls, tenant, 4)
    for tenant_or_none in (None, *tenants):
        out[f"stats/{tenant_or_none}"] = (await calls.stats(tenant_or_none)).to_json()
    for tenant in tenants:
        for run in ("r1", "r2", "r9", "r10"):
            for tool in (SEND, CHARGE, WIRE):
                out[f"usage/{tenant}/{run}/{tool}"] = vars_of(
                    await calls.run_usage(tenant, run, tool)
                )
    return out


async def test_metrics_views_rates_are_the_models_rates() -> None:
    conn = sqlite_with(STATS.events())
    for view in ("tool_metrics", "tenant_metrics"):
        rows = view_rows(conn, view)
        assert rows and all(set(STAT_COUNTS) | set(STAT_RATES) <= set(r) for r in rows)
        rates_match(rows)
    acme = [r for r in view_rows(conn, "tenant_metrics") if r["tenant_id"] == "acme"]
    assert [(r["calls"], r["runs"], r["calls_per_run"]) for r in acme] == [(6, 2, 2.5)]
    assert {r["tenant_id"] for r in view_rows(conn, "tool_metrics")} == {"acme", "globex"}


async def test_approvals_view_status_uses_the_database_clock() -> None:
    conn = sqlite_with(STATS.events())
    rows = {r["approval_id"]: r for r in view_rows(conn, "approvals")}
    assert {k: (r["state"], r["status"]) for k, r in rows.items()} == {
        "ap-c8": ("consumed", "consumed"),
        "ap-c9": ("denied", "denied"),
        "ap-c10": ("pending", "pending"),
        "ap-c11": ("pending", "expired"),
    }
    assert rows["ap-c8"]["decision"] == "granted" and rows["ap-c9"]["decision"] == "denied"


def test_the_ddl_can_be_applied_again_and_views_are_recreated() -> None:
    conn = sqlite_with(SWITCHES.events())
    conn.executescript(sqlite_projection.DDL)
    views = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'view'")}
    assert views == {"tool_call_events", *sqlite_projection.GOVERNANCE_VIEWS}
    assert len(view_rows(conn, "tool_call_events")) == 10 * PARTITIONS
    assert len(view_rows(conn, "switch_changes")) == 10  # once per switch, not per partition
    assert len(view_rows(conn, "tool_switches")) == 6  # the latest per (tenant, tool)
    plan = " ".join(
        str(r[-1])
        for r in conn.execute(
            "EXPLAIN QUERY PLAN SELECT * FROM tool_call_events WHERE tenant_id = 'a' "
            "AND run_id = 'r' AND event_type = 'ToolCallStarted'"
        )
    )
    assert "audit_events_by_run" in plan


async def test_views_in_an_embedded_ledger_file(tmp_path: Path) -> None:
    """The views live in the embedded ledger's file: opened twice, rebuilt from the log."""
    SqliteLedger(tmp_path / "ledger.db", read_model=READ_MODEL).close()
    log = SqliteLedger(tmp_path / "ledger.db", read_model=READ_MODEL)
    try:
        assert log.rebuild() == 0
        views = {
            r[0] for r in log.conn.execute("SELECT name FROM sqlite_master WHERE type = 'view'")
        }
        assert views == {"tool_call_events", *sqlite_projection.GOVERNANCE_VIEWS}
        assert await SqliteCalls(log.conn).stats(None) == Stats(None, [], ToolStats("*"))
    finally:
        log.close()


def test_the_portable_views_are_the_migrations_text_with_the_dialects_clock() -> None:
    """SQLite runs the very views PostgreSQL's migration 0002 created, only the clock differs."""
    text = (Path(governance.__file__).parent / "migrations" / "0002_governance.sql").read_text(
        encoding="utf-8"
    )
    assert governance.portable_views("now()") in text
    assert governance.PORTABLE_VIEWS_SQL.count("{now}") == 1
    statements = [s for s in governance.PORTABLE_VIEWS_SQL.split(";") if s.strip()]
    assert len(statements) == len(governance.PORTABLE_VIEWS) == 6
    assert governance.PORTABLE_VIEWS == (
        "approvals", "tool_switches", "tool_metric_counts", "tenant_metric_counts",
        "tool_metrics", "tenant_metrics",
    )  # fmt: skip


# ------------------------------------------------------------------------------ pure parts


def _switch(tenant: str, tool: str, enabled: bool, minute: int) -> SwitchView:
    return SwitchView(
        tenant_id=tenant,
        tool=tool,
        enabled=enabled,
        reason=f"{tenant}/{tool}/{minute}",
        actor="ops",
        changed_at=T0 + minute * MIN,
    )


def test_effective_switch_looks_at_each_level_on_its_own() -> None:
    assert effective_switch([], "acme", "t") is None
    tenant_tool = _switch("acme", "t", False, 1)
    tenant_all = _switch("acme", "*", False, 2)
    global_tool = _switch("*", "t", False, 3)
    global_all = _switch("*", "*", False, 4)
    every = [global_all, global_tool, tenant_all, tenant_tool]
    assert effective_switch(every, "acme", "t") == tenant_tool
    assert effective_switch(every, "acme", "u") == tenant_all
    assert effective_switch(every, "globex", "t") == global_tool
    assert effective_switch(every, "globex", "u") == global_all
    # re-enabled later (the latest state counts, whatever the order given)
    on_again = _switch("acme", "t", True, 9)
    assert effective_switch([on_again, tenant_tool], "acme", "t") is None
    assert effective_switch([on_again, tenant_tool, global_all], "acme", "t") == global_all
    # another tenant's switch never applies
    assert effective_switch([_switch("globex", "*", False, 1)], "acme", "t") is None


def test_approval_cursor_round_trip_and_garbage() -> None:
    from toolledger.schemas.calls import decode_approval_cursor, encode_approval_cursor

    view = ApprovalView(
        approval_id="ap/ü",
        call_key="k",
        call_id="c",
        tenant_id="t",
        tool="x",
        idempotency_key="i",
        args_digest="d",
        arguments={},
        impact={},
        status="pending",
        requested_by=None,
        requested_at=(T0 + 7 * US).astimezone(PLUS_2),
        expires_at=T0,
    )
    assert view.requested_at.tzinfo is UTC
    cursor = encode_approval_cursor(view)
    assert re.fullmatch(r"[A-Za-z0-9_-]+", cursor)
    assert decode_approval_cursor(cursor) == (T0 + 7 * US, "ap/ü", "t")
    for bad in ("", "!!!", "eyJ4IjoxfQ", "WyJhcHIxIiwxLDIsM10"):
        with pytest.raises(ValueError):
            decode_approval_cursor(bad)
    assert json.loads(json.dumps(view.to_json()))["id"] == "ap/ü"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
async def test_reads_off_the_event_loop_answer_the_same(
    scenario: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given the file's path, the governance views are read in a thread on a read-only
    connection of their own: the same answers as on the loop, and never on its thread."""
    path = tmp_path / "views.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("BEGIN")
    sqlite_ledger.create(conn, READ_MODEL)
    conn.execute("COMMIT")

    async def load(batch: Batch) -> None:
        sqlite_load(conn, batch)

    await scenario.run(SqliteCalls(conn), load)
    threads: set[int] = set()
    rows = SqliteCalls._rows

    def recording(c: sqlite3.Connection, sql: str, params: Sequence[Any]) -> Any:
        threads.add(threading.get_ident())
        return rows(c, sql, params)

    monkeypatch.setattr(SqliteCalls, "_rows", staticmethod(recording))
    off_loop = SqliteCalls(conn, path=path)
    try:
        assert await snapshot(off_loop) == await snapshot(SqliteCalls(conn))
        threads.clear()
        await snapshot(off_loop)
        assert threads and threading.get_ident() not in threads
    finally:
        off_loop.close()
        conn.close()
