"""The audit trail's retention on the PostgreSQL read model (``prune_postgres``), on a real
PostgreSQL: the same rules as on SQLite (tests/unit/test_audit_retention.py): an expired
key's finished record older than the cutoff goes, an open call and a live key keep theirs,
newer events stay; one pruner at a time (an advisory lock)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from tests.services import Services
from toolledger.distributed import run_projector
from toolledger.projections.audit_retention import prune_postgres
from toolledger.schemas.topics import Topics

pytestmark = pytest.mark.services

OLD = datetime(2026, 1, 1, tzinfo=UTC)
NOW = datetime.now(UTC)
LOCK = 0x746C_6175_6469_74  # projections.audit_retention's advisory lock
OFFSETS = itertools.count()  # each event at a log position of its own


async def _call(
    conn: psycopg.AsyncConnection[tuple[object, ...]],
    name: str,
    status: str,
    *,
    expired: bool,
    at: datetime = OLD,
    events: int = 2,
) -> None:
    await conn.execute(
        "INSERT INTO tool_calls (call_id, call_key, tenant_id, tool_name, tool_version, "
        "idempotency_key, args_digest, status, attempts, rounds, reconcile_attempts, "
        "first_intent_id, last_intent_id, created_at, updated_at, last_event_id, state_json, "
        "expired_at) VALUES (%s, %s, 'acme', 't', '1', %s, 'd', %s, 1, 1, 0, 'i', 'i', %s, %s, "
        "'e', '{}', %s)",
        [name, f"key-{name}", name, status, at, at, at if expired else None],
    )
    for n in range(events):
        await conn.execute(
            "INSERT INTO tool_call_events (event_id, log_partition, log_offset, call_id, "
            "call_key, tenant_id, tool_name, idempotency_key, intent_id, event_type, "
            "occurred_at, payload_json) VALUES (%s, 0, %s, %s, %s, 'acme', 't', %s, 'i', "
            "'ToolCallSucceeded', %s, '{}')",
            [f"{name}/{n}", next(OFFSETS), name, f"key-{name}", name, at],
        )


async def test_prune_postgres_keeps_open_calls_and_live_keys(services: Services) -> None:
    dsn = await services.fresh_database()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await _call(conn, "gone", "SUCCEEDED", expired=True)
        await _call(conn, "open", "UNKNOWN", expired=True)
        await _call(conn, "live", "SUCCEEDED", expired=False)
        await _call(conn, "recent", "SUCCEEDED", expired=True, at=NOW)

        assert await prune_postgres(dsn, OLD - timedelta(days=1)) == 0
        # another pruner holds the lock: this one skips its round
        await conn.execute("SELECT pg_advisory_lock(%s)", [LOCK])
        assert await prune_postgres(dsn, NOW - timedelta(hours=1)) == 0
        await conn.execute("SELECT pg_advisory_unlock(%s)", [LOCK])
        assert await prune_postgres(dsn, NOW - timedelta(hours=1), limit=3) == 2

        rows = await (await conn.execute("SELECT call_id FROM tool_calls ORDER BY 1")).fetchall()
        assert [r[0] for r in rows] == ["live", "open", "recent"]
        found = await conn.execute("SELECT DISTINCT call_id FROM tool_call_events ORDER BY 1")
        assert [r[0] for r in await found.fetchall()] == ["live", "open", "recent"]
        assert await prune_postgres(dsn, NOW - timedelta(hours=1)) == 0  # a round: idempotent


async def test_the_projector_prunes_the_audit_trail_when_told(services: Services) -> None:
    """``toolledger projector --audit-retention``: the projector, which owns the read model,
    runs the rounds (its first at start), so a deployment without a front door prunes too."""
    dsn = await services.fresh_database()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await _call(conn, "gone", "SUCCEEDED", expired=True)
        await _call(conn, "live", "SUCCEEDED", expired=False)
    topics = Topics(prefix=f"a{uuid.uuid4().hex[:10]}.", partitions=1)
    projector = asyncio.create_task(
        run_projector(
            services.kafka, dsn, topics, ready_file=None, audit_retention=timedelta(days=1)
        )
    )
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for _ in range(300):
                found = await conn.execute("SELECT DISTINCT call_id FROM tool_call_events")
                if {r[0] for r in await found.fetchall()} == {"live"}:
                    break
                assert not projector.done(), projector
                await asyncio.sleep(0.1)
            rows = await (await conn.execute("SELECT call_id FROM tool_calls")).fetchall()
            assert [r[0] for r in rows] == ["live"]
    finally:
        projector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await projector
