"""The projection rows store each field once: an audit row's envelope ids and a call row's
state live in the row's columns, not again in its JSON, and the read side gives back the whole
thing. What ``GET /v1/calls/{id}/events`` answers equals the event on the outcome log, and a
call row read back is the fold of its key's events, however the log was cut into batches."""

from __future__ import annotations

import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.contract.harness import contract_registry
from tests.unit.test_ledger_properties import Op, Simulation, ops, policies
from toolledger import TrustedContext
from toolledger.embedded import EmbeddedLedger
from toolledger.processors.ledger import CallState, Policy, evolve, fold_all
from toolledger.processors.ledger.rows import call_row, event_json, state_of_row
from toolledger.processors.ports import CommitBatch
from toolledger.processors.runtime.sqlite_ledger import SqliteLedger
from toolledger.processors.toolsets.helpdesk import HelpdeskStore
from toolledger.projections.rows import Position, audit_payload, event_row
from toolledger.projections.sqlite import SqliteCalls, SqliteReadModel
from toolledger.schemas.events import Envelope, Event, ToolCallKeyExpired, ToolCallStarted
from toolledger.schemas.keys import call_id_for
from toolledger.settings import LedgerSettings

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
    settings = LedgerSettings(path=tmp_path / "ledger.db", create=True)
    ledger = EmbeddedLedger(settings, contract_registry(store))
    async with ledger:
        calls = [
            ("create_ticket", {"title": "printer", "body": "on fire"}, "t-1"),
            ("create_ticket", {"title": "printer", "body": "on fire"}, "t-1"),  # replayed
            ("create_ticket", {"title": "other", "body": "args"}, "t-1"),  # refused
            ("send_email", {"to": "bob@example.com", "subject": "hi", "body": "x"}, "e-1"),
        ]
        for tool, args, key in calls:
            await ledger.client.call(tool, args, idempotency_key=key, context=ALICE)
        assert ledger.file is not None and ledger.runtime is not None
        await ledger.runtime.drain()  # the read model derived
        logged = [event for _, _, event in ledger.file.events()]
        reads = SqliteCalls(ledger.file.conn)
        by_call: dict[str, list[dict[str, Any]]] = {}
        for event in logged:
            env = event.envelope
            call_id = call_id_for(env.call_key, env.idempotency_key, env.intent_id)
            by_call.setdefault(call_id, []).append(_whole(event))
        stored = ledger.file.conn.execute("SELECT event_type FROM tool_call_events").fetchall()
        audit_columns = {r[1] for r in ledger.file.conn.execute("PRAGMA table_info(audit_events)")}
        read = {c: await reads.events(ALICE.tenant_id, c) for c in by_call}
    assert len(logged) >= 5 and len(stored) == len(logged)
    # each event stored once: in the log; the audit trail's rows index it, they hold no copy
    assert "payload_json" not in audit_columns
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
    """Each batch reads the stored states back (as the executor reads a key it does not hold)
    and folds onto them: a field the row lost would change a later state."""
    sim = Simulation(policies)
    sim.run(operations)
    with tempfile.TemporaryDirectory() as scratch:
        ledger = SqliteLedger(Path(scratch) / "ledger.db", read_model=SqliteReadModel())
        try:
            for lo in range(0, len(sim.log), batch):
                chunk = sim.log[lo : lo + batch]
                keys = sorted({e.call_key for e in chunk if e.envelope.idempotency_key})
                stored = ledger.read(keys)
                states: dict[str, CallState | None] = {
                    k: stored[k].state if k in stored else None for k in keys
                }
                folded = CommitBatch()
                for event in chunk:
                    if event.call_key in states:
                        before = states.get(event.call_key)
                        after = evolve(before, event)
                        if before is None and after is not None:
                            folded.created.add(event.call_key)
                        states[event.call_key] = after
                        if isinstance(event, ToolCallKeyExpired):
                            folded.expired.add(event.call_key)
                            folded.states.pop(event.call_key, None)
                        elif after is not None:
                            folded.states[event.call_key] = after
                    folded.add(event, 0)
                ledger.write(folded, [(0, event_json(e)) for e in chunk])
            read = {k: e.state for k, e in ledger.read(sorted(fold_all(sim.log))).items()}
        finally:
            ledger.close()
    assert read == fold_all(sim.log)
    for key, state in read.items():  # and the row holds only what its columns do not
        assert state is not None
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
