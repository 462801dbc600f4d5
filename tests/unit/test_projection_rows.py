"""The projection rows store each field once: an audit row's envelope ids and a call row's
state live in the row's columns, not again in its JSON, and the read side gives back the whole
thing. What ``GET /v1/calls/{id}/events`` answers equals the event on the outcome log, and a
call row read back is the fold of its key's events, however the log was cut into batches."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.ledger import CallState, Policy, fold_all
from processors.toolsets.helpdesk import HelpdeskStore
from projections import sqlite as sqlite_projection
from projections.rows import (
    ENVELOPE_COLUMNS,
    STATE_COLUMNS,
    Position,
    audit_payload,
    call_row,
    event_row,
    state_of_row,
)
from projections.sqlite import SqliteCalls
from schemas.events import Envelope, Event, ToolCallStarted
from schemas.keys import call_id_for
from tests.contract.harness import contract_registry
from tests.unit.test_ledger_properties import Op, Simulation, ops, policies
from toolledger import TrustedContext
from toolledger.embedded import EmbeddedLedger

ALICE = TrustedContext("acme", "alice")


def _whole(event: Event) -> dict[str, Any]:
    """The event as the audit trail held it before its ids became columns only."""
    return {"type": event.TYPE, **json.loads(event.model_dump_json())}


def _started(**ids: str) -> ToolCallStarted:
    fields = {
        "event_id": "intent-1/started/1",
        "call_key": '["acme","send_email","k1"]',
        "tenant_id": "acme",
        "tool": "send_email",
        "idempotency_key": "k1",
        "intent_id": "intent-1",
        **ids,
    }
    envelope = Envelope(
        **fields,
        tool_version="1",
        args_digest="sha256:00",
        principal="alice",
        occurred_at=datetime(2026, 12, 3, 12, 0, tzinfo=UTC),
    )
    return ToolCallStarted(
        envelope=envelope,
        attempt=1,
        round=1,
        executor_epoch=1,
        arguments_redacted_json='{"to":"a@example.com"}',
    )


async def test_every_event_read_back_equals_the_event_on_the_log(tmp_path: Path) -> None:
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    ledger = EmbeddedLedger(tmp_path / "ledger.db", contract_registry(store), create=True)
    async with ledger:
        calls = [
            ("create_ticket", {"title": "printer", "body": "on fire"}, "t-1"),
            ("create_ticket", {"title": "printer", "body": "on fire"}, "t-1"),  # replayed
            ("create_ticket", {"title": "other", "body": "args"}, "t-1"),  # refused
            ("send_email", {"to": "bob@example.com", "subject": "hi", "body": "x"}, "e-1"),
        ]
        for tool, args, key in calls:
            await ledger.client.call(tool, args, idempotency_key=key, context=ALICE)
        assert ledger.log is not None
        logged = list(ledger.log.events())
        reads = SqliteCalls(ledger.log.conn)
        by_call: dict[str, list[dict[str, Any]]] = {}
        for event, _ in logged:
            env = event.envelope
            call_id = call_id_for(env.call_key, env.idempotency_key, env.intent_id)
            by_call.setdefault(call_id, []).append(_whole(event))
        stored = ledger.log.conn.execute(
            "SELECT event_type, payload_json FROM tool_call_events"
        ).fetchall()
        read = {c: await reads.events(ALICE.tenant_id, c) for c in by_call}
    assert len(logged) >= 5 and len(stored) == len(logged)
    in_log = set()
    for event_type, payload in stored:
        if payload is None:  # the event is the log's record its row points at: stored once
            in_log.add(event_type)
            continue
        # each id once: in its column, not again in the payload
        assert not set(ENVELOPE_COLUMNS) & set(json.loads(payload)["envelope"])
    assert {"ToolCallStarted", "ToolCallSucceeded"} <= in_log
    assert "ToolCallRejected" not in in_log  # a view reads its error code
    for call_id, events in by_call.items():
        answer = read[call_id]
        assert answer is not None
        assert [list(e["envelope"]) for e in answer] == [list(Envelope.model_fields)] * len(answer)
        assert answer == events, call_id


def test_an_id_holding_a_nul_keeps_the_whole_envelope_in_the_payload() -> None:
    event = _started(idempotency_key="k\x00one", call_key='["acme","send_email","k\\u0000one"]')
    row = event_row(event, Position(0, 7))
    assert json.loads(row["payload_json"])["envelope"]["idempotency_key"] == "k\x00one"
    row["idempotency_key"] = "k\ufffdone"  # what a PostgreSQL text column keeps
    assert audit_payload(row) == _whole(event)


def test_a_row_written_with_its_whole_envelope_reads_as_it_was() -> None:
    event = _started()
    row = event_row(event, Position(0, 7))
    plain = audit_payload(row)
    row["payload_json"] = json.dumps(_whole(event))  # a row stored before this change
    assert audit_payload(row) == plain == _whole(event)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies=policies, operations=ops(), batch=st.integers(1, 9))
def test_call_rows_folded_in_batches_read_back_as_the_fold_of_the_log(
    policies: list[Policy], operations: list[Op], batch: int
) -> None:
    """Each batch reads the stored states back (:func:`state_of_row`) and folds onto them: a
    field the row lost would change a later state."""
    sim = Simulation(policies)
    sim.run(operations)
    events = [(e, Position(0, n)) for n, e in enumerate(sim.log)]
    conn = sqlite3.connect(":memory:")
    conn.executescript(sqlite_projection.DDL)
    for lo in range(0, len(events), batch):
        sqlite_projection.apply(conn, events[lo : lo + batch])
    select = f"SELECT {', '.join(STATE_COLUMNS)} FROM tool_calls"
    read = {
        row["call_key"]: state_of_row(row)
        for row in (dict(zip(STATE_COLUMNS, v, strict=True)) for v in conn.execute(select))
    }
    assert read == fold_all(sim.log)
    for key, state in read.items():  # and the row holds only what its columns do not
        assert set(json.loads(call_row(key, state)["state_json"])) <= {
            "context",
            "round_attempts",
            "job",
            "job_updates",
        }


def test_a_call_row_holding_a_nul_keeps_the_whole_state() -> None:
    event = _started(tool="send\x00mail", call_key='["acme","send\\u0000mail","k1"]')
    state = fold_all([event])[event.call_key]
    row = call_row(event.call_key, state)
    assert CallState.model_validate_json(row["state_json"]) == state
    row["tool_name"] = "send\ufffdmail"  # what a PostgreSQL text column keeps
    assert state_of_row(row) == state


_OLD_EVENTS_TABLE = """CREATE TABLE tool_call_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL UNIQUE,
    log_partition INTEGER NOT NULL, log_offset INTEGER NOT NULL, call_id TEXT NOT NULL,
    call_key TEXT NOT NULL, tenant_id TEXT NOT NULL, tool_name TEXT NOT NULL,
    idempotency_key TEXT NOT NULL, intent_id TEXT NOT NULL, run_id TEXT,
    event_type TEXT NOT NULL, occurred_at TEXT NOT NULL, payload_json TEXT NOT NULL)"""


async def test_a_file_whose_audit_rows_all_hold_their_payload_is_migrated(tmp_path: Path) -> None:
    """A ledger file made before audit rows pointed at the log (payload_json NOT NULL, every
    payload stored, run indexes over every row) opens: its rows are copied into the table as
    it is now, they read as they did, and the calls made after it point at the log."""
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    path = tmp_path / "ledger.db"
    args = {"title": "printer", "body": "on fire"}
    async with EmbeddedLedger(path, contract_registry(store), create=True) as ledger:
        await ledger.client.call("create_ticket", args, idempotency_key="t-1", context=ALICE)
        assert ledger.log is not None
        conn = ledger.log.conn
        call_id = conn.execute("SELECT call_id FROM tool_calls").fetchone()[0]
        before = await SqliteCalls(conn).events(ALICE.tenant_id, call_id)
    conn = sqlite3.connect(path, isolation_level=None)  # the earlier layout, by hand
    rows = conn.execute("SELECT * FROM tool_call_events ORDER BY seq").fetchall()
    logged = sqlite_projection.logged_events(
        conn, [Position(r[2], r[3]) for r in rows if r[13] is None]
    )
    for view in reversed(sqlite_projection.GOVERNANCE_VIEWS):
        conn.execute(f"DROP VIEW {view}")
    conn.execute("DROP TABLE tool_call_events")
    conn.execute(_OLD_EVENTS_TABLE)
    for row in rows:
        values = list(row)
        if row[13] is None:  # each row held its keys and whole event
            whole = logged[Position(row[2], row[3])]
            values[5] = whole["envelope"]["call_key"]
            values[13] = json.dumps(whole)
        marks = ", ".join("?" * 14)
        conn.execute(f"INSERT INTO tool_call_events VALUES ({marks})", values)
    conn.execute("DROP INDEX tool_calls_by_run")
    conn.execute("CREATE INDEX tool_calls_by_run ON tool_calls (tenant_id, run_id)")
    conn.close()
    async with EmbeddedLedger(path, contract_registry(store)) as ledger:
        assert ledger.log is not None
        conn = ledger.log.conn
        assert await SqliteCalls(conn).events(ALICE.tenant_id, call_id) == before
        assert conn.execute("SELECT COUNT(*) FROM tool_call_events").fetchone()[0] == len(rows)
        again = await ledger.client.call(
            "create_ticket", args, idempotency_key="t-2", context=ALICE
        )
        assert again.ok
        pointing = conn.execute(
            "SELECT COUNT(*) FROM tool_call_events WHERE payload_json IS NULL"
        ).fetchone()[0]
        assert pointing == 2  # the new call's Started and Succeeded
        indexes = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'"))
        assert "WHERE run_id IS NOT NULL" in indexes["tool_calls_by_run"]
        assert "WHERE run_id IS NOT NULL" in indexes["tool_call_events_by_run"]
        assert "tool_call_events_in_log" in indexes
