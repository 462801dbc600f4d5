"""SQLite projections for the embedded mode: applied inside the caller's transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from processors.ledger import CallState
from projections import search
from projections.rows import (
    CALL_COLUMNS,
    EVENT_COLUMNS,
    Position,
    call_row,
    event_row,
    fold_new_events,
)
from schemas.calls import CallFilter, CallView, Page
from schemas.events import Event

DDL = """
CREATE TABLE IF NOT EXISTS tool_calls (
    call_id TEXT PRIMARY KEY,
    call_key TEXT NOT NULL UNIQUE,
    tenant_id TEXT NOT NULL,
    tool_name TEXT NOT NULL,
    tool_version TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    status TEXT NOT NULL,
    result_json TEXT,
    error_json TEXT,
    attempts INTEGER NOT NULL,
    rounds INTEGER NOT NULL,
    reconcile_attempts INTEGER NOT NULL,
    run_id TEXT,
    step_id TEXT,
    first_intent_id TEXT NOT NULL,
    last_intent_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    last_event_id TEXT NOT NULL,
    state_json TEXT NOT NULL,
    UNIQUE (tenant_id, tool_name, idempotency_key)
);
CREATE INDEX IF NOT EXISTS tool_calls_by_run ON tool_calls (tenant_id, run_id);
CREATE INDEX IF NOT EXISTS tool_calls_by_status ON tool_calls (tenant_id, status);
CREATE TABLE IF NOT EXISTS tool_call_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL,
    call_id TEXT NOT NULL,
    call_key TEXT NOT NULL,
    tenant_id TEXT NOT NULL,
    tool_name TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    intent_id TEXT NOT NULL,
    run_id TEXT,
    event_type TEXT NOT NULL,
    occurred_at TEXT NOT NULL,
    payload_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tool_call_events_by_call ON tool_call_events (call_id, seq);
CREATE INDEX IF NOT EXISTS tool_call_events_by_key
    ON tool_call_events (tenant_id, tool_name, idempotency_key);
"""

PROJECTION_TABLES = ("tool_calls", "tool_call_events")

_INSERT_EVENT = (
    f"INSERT OR IGNORE INTO tool_call_events ({', '.join(EVENT_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in EVENT_COLUMNS)})"
)
_UPSERT_CALL = (
    f"INSERT INTO tool_calls ({', '.join(CALL_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in CALL_COLUMNS)}) "
    "ON CONFLICT (call_key) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in CALL_COLUMNS if c not in ("call_id", "call_key"))
)


def drop(conn: sqlite3.Connection) -> None:
    for table in PROJECTION_TABLES:
        conn.execute(f"DROP TABLE IF EXISTS {table}")


def apply(
    conn: sqlite3.Connection,
    events: Sequence[tuple[Event, Position]],
    states: Mapping[str, CallState] | None = None,
) -> None:
    """Fold events into the tables. Call inside the transaction that records their position.

    ``states``: the states after these events, when the caller (the embedded executor) has
    already folded them with the same ``evolve``; otherwise they are folded here, from the
    stored row, skipping events already applied.
    """
    if states is not None:
        conn.executemany(_INSERT_EVENT, [_sqlite(event_row(e, p)) for e, p in events])
        conn.executemany(_UPSERT_CALL, [_sqlite(call_row(k, s)) for k, s in states.items()])
        return
    new = [e for e, p in events if conn.execute(_INSERT_EVENT, _sqlite(event_row(e, p))).rowcount]
    keys = sorted({e.call_key for e in new})
    stored: dict[str, CallState] = {}
    for start in range(0, len(keys), 500):  # SQLite's parameter limit
        chunk = keys[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        for key, state_json in conn.execute(
            f"SELECT call_key, state_json FROM tool_calls WHERE call_key IN ({marks})", chunk
        ):
            stored[key] = CallState.model_validate_json(state_json)
    changed = fold_new_events(stored, new)
    conn.executemany(_UPSERT_CALL, [_sqlite(call_row(k, s)) for k, s in changed.items()])


_TIMES = ("created_at", "updated_at", "occurred_at")


def _sqlite(row: dict[str, Any]) -> dict[str, Any]:
    for name in _TIMES:
        if name in row:
            row[name] = row[name].isoformat()
    return row


class SqliteCalls:
    """The read side (:class:`schemas.calls.CallQueries`) over the embedded projection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def _rows(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        cursor = self._conn.execute(sql, params)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]

    async def get(self, tenant_id: str, call_id: str) -> CallView | None:
        rows = self._rows(search.get_sql("?"), (tenant_id, call_id))
        return CallView.from_row(rows[0]) if rows else None

    async def search(
        self, tenant_id: str, where: CallFilter, *, limit: int, after: str | None
    ) -> Page:
        sql, params = search.search_sql("?", tenant_id, where, limit, after)
        return search.page_of(self._rows(sql, params), limit)

    async def events(self, tenant_id: str, call_id: str) -> list[dict[str, Any]] | None:
        rows = self._conn.execute(search.events_sql("?"), (tenant_id, call_id)).fetchall()
        return search.events_of([r[0] for r in rows])

    async def applied(self, event_id: str) -> bool:
        return self._conn.execute(search.applied_sql("?"), (event_id,)).fetchone() is not None
