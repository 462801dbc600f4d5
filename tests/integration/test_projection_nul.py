"""A NUL in an id (PostgreSQL text cannot hold one) is stored as U+FFFD in every text column
of both tables, and in the JSON columns (jsonb cannot hold U+0000 either, escaped or not),
while a JSON text that only spells a backslash before "u0000" keeps it: the projection never
stops on it."""

from __future__ import annotations

import json

import pytest

from tests import postgres_reads
from tests.integration.test_postgres_projection import (  # noqa: F401 (fixtures dsn, projection)
    CONSUMER,
    TOPIC,
    Call,
    History,
    dsn,
    projection,
)
from toolledger.projections.postgres import PostgresProjection
from toolledger.projections.rows import Position

pytestmark = pytest.mark.services


async def test_a_nul_in_ids_is_stored_as_a_replacement_character(
    projection: PostgresProjection,  # noqa: F811 (the imported fixture)
) -> None:
    h = History()
    call = Call.of("ten\x00ant", "send\x00mail", "key\x00one")
    plain = Call.of("tenant", "send_mail", "key-two")
    events = [
        (h.started(call, "in\x00tent", 0, 1), Position(0, 0)),
        (h.succeeded(call, "in\x00tent", 1, 1), Position(0, 1)),
        (h.started(plain, "intent-2", 0, 1), Position(0, 2)),
    ]
    result = await projection.apply(events, CONSUMER, TOPIC)
    assert result.new_events == 3 and result.calls_changed == 2
    calls = {r["idempotency_key"]: r for r in await postgres_reads.call_rows(projection)}
    row = calls["key\ufffdone"]
    assert (row["tenant_id"], row["tool_name"]) == ("ten\ufffdant", "send\ufffdmail")
    assert row["last_intent_id"] == "in\ufffdtent" and row["status"] == "SUCCEEDED"
    assert json.loads(row["state_json"])["context"]["tool"] == "send\ufffdmail"
    assert calls["key-two"]["tool_name"] == "send_mail"
    stored = {r["event_id"]: r for r in await postgres_reads.event_rows(projection)}
    assert set(stored) == {"in\ufffdtent/0", "in\ufffdtent/1", "intent-2/0"}
    assert stored["in\ufffdtent/1"]["intent_id"] == "in\ufffdtent"
    assert json.loads(stored["in\ufffdtent/1"]["payload_json"])["envelope"]["intent_id"] == (
        "in\ufffdtent"
    )


async def test_an_escaped_backslash_before_u0000_is_not_a_nul(
    projection: PostgresProjection,  # noqa: F811 (the imported fixture)
) -> None:
    h = History()
    call = Call.of("tenant", "send_mail", "key-three")
    succeeded = h.succeeded(call, "intent-3", 1, 1).model_copy(
        update={"result_json": '{"path":"C:\\\\u0000","nul":"\\u0000"}'}
    )
    await projection.apply(
        [(h.started(call, "intent-3", 0, 1), Position(0, 0)), (succeeded, Position(0, 1))],
        CONSUMER,
        TOPIC,
    )
    (row,) = await postgres_reads.call_rows(projection)
    assert json.loads(row["result_json"]) == {"path": "C:\\u0000", "nul": "\ufffd"}
