"""Migration 0008 on a read model written before it (issue 31): the JSON columns become jsonb
(an escaped NUL as U+FFFD, an escaped backslash before "u0000" kept), ``seq`` the log
position, ``duration_ms`` filled from the payloads as the projection folds it, and the views
answer over the converted rows. Applied by ``migrate`` as any deployment applies it."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.services import Services
from toolledger.projections.postgres import load_migrations, migrate

pytestmark = pytest.mark.services

_CALL = (
    "INSERT INTO tool_calls (call_id, call_key, tenant_id, tool_name, tool_version, "
    "idempotency_key, args_digest, status, result_json, attempts, rounds, reconcile_attempts, "
    "first_intent_id, last_intent_id, created_at, updated_at, last_event_id, state_json) "
    "VALUES (%s, %s, 'acme', 't', '1', %s, 'd', %s, %s, 1, 1, 0, 'i', 'i', now(), now(), 'e', "
    "'{}')"
)
_EVENT = (
    "INSERT INTO tool_call_events (event_id, log_partition, log_offset, call_id, call_key, "
    "tenant_id, tool_name, idempotency_key, intent_id, event_type, occurred_at, payload_json) "
    "VALUES (%s, %s, %s, %s, %s, 'acme', 't', %s, 'i', %s, now(), %s)"
)


async def test_0008_converts_what_was_written_before_it(services: Services) -> None:
    name = f"tl_up_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(services.postgres, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = make_conninfo(services.postgres, dbname=name)
    before = [m for m in load_migrations() if m.version < "0008"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE schema_migrations (version text PRIMARY KEY, name text NOT NULL, "
            "checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for m in before:  # as migrate() recorded them then
            conn.execute(m.sql.encode())
            conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (m.version, m.name, m.checksum),
            )
        result = '{"nul":"\\u0000","path":"C:\\\\u0000"}'
        conn.execute(_CALL, ("c-done", "k-done", "done", "SUCCEEDED", result))
        conn.execute(_CALL, ("c-again", "k-again", "again", "PENDING", None))
        events = [  # (partition, offset, call, type, payload)
            (1, 0, "c-done", "ToolCallStarted", '{"type":"ToolCallStarted"}'),
            (1, 1, "c-done", "ToolCallSucceeded", '{"duration_ms":12,"note":"\\u0000"}'),
            (0, 0, "c-again", "ToolCallStarted", '{"type":"ToolCallStarted"}'),
            (0, 1, "c-again", "ToolCallFailed", '{"duration_ms":5,"error":{"code":"X"}}'),
            (0, 2, "c-again", "ToolCallStarted", '{"type":"ToolCallStarted"}'),
        ]
        for partition, offset, call, kind, payload in events:
            key = "done" if call == "c-done" else "again"
            conn.execute(
                _EVENT,
                (f"{call}/{offset}", partition, offset, call, f"k-{key}", key, kind, payload),
            )

    assert await migrate(dsn) == [m.version for m in load_migrations() if m.version >= "0008"]

    with psycopg.connect(dsn) as conn:
        calls = conn.execute(
            "SELECT call_id, result_json, duration_ms FROM tool_calls ORDER BY call_id"
        ).fetchall()
        assert calls == [
            ("c-again", None, None),  # a run is under way: no duration
            ("c-done", {"nul": "\ufffd", "path": "C:\\u0000"}, 12.0),
        ]
        audit = conn.execute(
            "SELECT seq, event_id, duration_ms, payload_json ->> 'note' FROM tool_call_events "
            "ORDER BY seq"
        ).fetchall()
        assert audit == [
            (0, "c-again/0", None, None),
            (1, "c-done/0", None, None),
            (1048576, "c-again/1", 5.0, None),
            (1048577, "c-done/1", 12.0, "\ufffd"),
            (2097152, "c-again/2", None, None),
        ]
        facts = conn.execute(
            "SELECT error_code FROM call_event_facts WHERE event_type = 'ToolCallFailed'"
        ).fetchall()
        assert facts == [("X",)]
        daily = conn.execute("SELECT calls, p50_duration_ms FROM tool_metrics_daily").fetchall()
        assert daily == [(2, 5.0)]
    with psycopg.connect(services.postgres, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}"')
