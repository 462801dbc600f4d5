"""An audit row stores its envelope's ids once, as columns, and the read side gives back the
whole event: what ``GET /v1/calls/{id}/events`` answers equals the event on the outcome log,
field for field and in the envelope's order."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from processors.toolsets.helpdesk import HelpdeskStore
from projections.rows import ENVELOPE_COLUMNS, Position, audit_payload, event_row
from projections.sqlite import SqliteCalls
from schemas.events import Envelope, Event, ToolCallStarted
from schemas.keys import call_id_for
from tests.contract.harness import contract_registry
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
        stored = ledger.log.conn.execute("SELECT payload_json FROM tool_call_events").fetchall()
        read = {c: await reads.events(ALICE.tenant_id, c) for c in by_call}
    assert len(logged) >= 5 and len(stored) == len(logged)
    for (payload,) in stored:  # each id once: in its column, not again in the payload
        assert not set(ENVELOPE_COLUMNS) & set(json.loads(payload)["envelope"])
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
