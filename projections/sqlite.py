"""The embedded ledger file's read model, and the read side over it.

:class:`SqliteReadModel` is what the embedded ledger (``processors.runtime.sqlite_ledger``) is
handed: it derives ``audit_events`` (the audit trail's index: one row per event, the columns
it is found and counted by) from the ledger's ``events`` in transactions of the ledger's
writer thread, *after* the batches that wrote them. An event is stored once, in ``events``;
the view ``tool_call_events`` joins the two, and the governance views read it. The call rows
(``tool_calls``) are the executor's own table, written with the events.

:class:`SqliteCalls` is the read side (:class:`schemas.calls.CallQueries`) over it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from toolledger.projections import governance, search
from toolledger.projections.dialect import SQLITE, Query
from toolledger.schemas.events import Event
from toolledger.schemas.keys import call_id_for

_APPROVAL_TYPES = "'ApprovalRequested', 'ApprovalGranted', 'ApprovalDenied', 'ApprovalConsumed'"
_SWITCH_TYPES = "'ToolDisabled', 'ToolEnabled'"

# The audit trail's index, derived from ``events``; ``log_partition`` and ``seq`` are the
# event's place in the log (its audit position: the same live and after any rebuild).
AUDIT_DDL = f"""
CREATE TABLE IF NOT EXISTS audit_events (
    seq INTEGER PRIMARY KEY,
    event_id TEXT NOT NULL UNIQUE,
    log_partition INTEGER NOT NULL,
    call_id TEXT NOT NULL,
    call_key TEXT NOT NULL,
    tenant_id TEXT NOT NULL,
    tool_name TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    intent_id TEXT NOT NULL,
    run_id TEXT,
    event_type TEXT NOT NULL,
    occurred_at TEXT NOT NULL,
    approval_id TEXT
);
CREATE INDEX IF NOT EXISTS audit_events_by_call ON audit_events (call_id, seq);
CREATE INDEX IF NOT EXISTS audit_events_by_run ON audit_events (tenant_id, run_id, seq)
    WHERE run_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS audit_events_by_approval ON audit_events (approval_id, tenant_id, seq)
    WHERE approval_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS audit_events_governance ON audit_events (event_type, tenant_id, seq)
    WHERE event_type IN ({_APPROVAL_TYPES}, {_SWITCH_TYPES});
DROP VIEW IF EXISTS tool_call_events;
CREATE VIEW tool_call_events AS
SELECT a.seq, a.event_id, a.log_partition, a.seq AS log_offset, a.call_id, a.call_key,
       a.tenant_id, a.tool_name, a.idempotency_key, a.intent_id, a.run_id, a.event_type,
       a.occurred_at, a.approval_id, e.event AS payload_json
  FROM audit_events a JOIN events e ON e.seq = a.seq;
"""

_DERIVE = (
    "INSERT INTO audit_events (seq, event_id, log_partition, call_id, call_key, tenant_id, "
    "tool_name, idempotency_key, intent_id, run_id, event_type, occurred_at, approval_id) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def audit_row(seq: int, partition: int, event: Event) -> tuple[Any, ...]:
    """The audit trail's row of the event at ``seq`` in the log (what it is found by)."""
    env = event.envelope
    return (
        seq,
        env.event_id,
        partition,
        call_id_for(env.call_key, env.idempotency_key, env.intent_id),
        env.call_key,
        env.tenant_id,
        env.tool,
        env.idempotency_key,
        env.intent_id,
        env.run_id,
        event.TYPE,
        env.occurred_at.isoformat(),
        getattr(event, "approval_id", None),
    )


def _utc_text(value: str) -> str:
    """SQL: an ISO 8601 time (``isoformat()`` or pydantic JSON: 0 or 6 fraction digits, any
    offset) as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` in UTC, which sorts and compares as text."""
    return (
        f"(strftime('%Y-%m-%dT%H:%M:%S', {value}) || CASE WHEN substr({value}, 20, 1) = '.' "
        f"THEN substr({value}, 20, 7) ELSE '.000000' END || 'Z')"
    )


def _payload(path: str) -> str:
    return f"json_extract(payload_json, '$.{path}')"


_NOW = "(strftime('%Y-%m-%dT%H:%M:%f', 'now') || '000Z')"

# The governance read side (projections/governance.py; 0002_governance.sql for PostgreSQL):
# views over tool_calls and tool_call_events, so a rebuild gives them back by construction.
# The fact views below read the JSON payloads in SQLite's dialect, with every time as UTC text
# that sorts (_utc_text); the portable views on top are shared with PostgreSQL. Dropped and
# created at every open, so a new definition takes over. No ';' inside a statement: the
# ledger splits this text on it.
GOVERNANCE_VIEWS = (
    "approval_events",
    "switch_changes",
    "call_event_facts",
    *governance.PORTABLE_VIEWS,
    "call_day_facts",
    "event_day_facts",
    "tool_metrics_daily",
)
GOVERNANCE_DDL = f"""
{"".join(f"DROP VIEW IF EXISTS {v};" for v in reversed(GOVERNANCE_VIEWS))}
CREATE VIEW approval_events AS
SELECT seq, tenant_id, tool_name, call_id, call_key, idempotency_key, run_id, event_type,
       {_utc_text("occurred_at")} AS occurred_at,
       approval_id,
       {_payload("envelope.args_digest")} AS args_digest,
       {_payload("envelope.principal")} AS principal,
       {_payload("arguments_redacted_json")} AS arguments_json,
       {_payload("impact_json")} AS impact_json,
       {_utc_text(_payload("expires_at"))} AS expires_at,
       {_payload("approver")} AS approver,
       {_payload("reason")} AS reason
  FROM tool_call_events
 WHERE event_type IN ({_APPROVAL_TYPES});
CREATE VIEW switch_changes AS
SELECT tenant_id, tool, enabled, scope, actor, reason, changed_at, intent_id
  FROM (SELECT tenant_id, tool_name AS tool, event_type = 'ToolEnabled' AS enabled,
               {_payload("scope")} AS scope, {_payload("actor")} AS actor,
               {_payload("reason")} AS reason, {_utc_text("occurred_at")} AS changed_at,
               intent_id, row_number() OVER (PARTITION BY tenant_id, tool_name, intent_id
                                           ORDER BY seq) AS n
          FROM tool_call_events WHERE event_type IN ({_SWITCH_TYPES}))
 WHERE n = 1;
CREATE VIEW call_event_facts AS
SELECT seq, tenant_id, tool_name, run_id, intent_id, event_type,
       {_payload("error.code")} AS error_code,
       {_payload("disposition")} AS disposition,
       {_payload("fingerprint")} AS fingerprint
  FROM tool_call_events
 WHERE event_type NOT IN ({_SWITCH_TYPES});
"""
GOVERNANCE_DDL += governance.portable_views(_NOW)
# the day facts in SQLite's dialect (days in UTC), under the daily metrics written once for both
# databases (migration 0008 for PostgreSQL)
GOVERNANCE_DDL += f"""
CREATE VIEW call_day_facts AS
SELECT tenant_id, tool_name, substr({_utc_text("created_at")}, 1, 10) AS day, status, run_id
  FROM tool_calls;
CREATE VIEW event_day_facts AS
SELECT tenant_id, tool_name, substr({_utc_text("occurred_at")}, 1, 10) AS day, intent_id,
       event_type, {_payload("error.code")} AS error_code, {_payload("duration_ms")} AS duration_ms
  FROM tool_call_events
 WHERE event_type NOT IN ({_SWITCH_TYPES});
"""
GOVERNANCE_DDL += governance.DAILY_VIEWS_SQL


DDL = AUDIT_DDL + GOVERNANCE_DDL


def drop(conn: sqlite3.Connection) -> None:
    for view in (*reversed(GOVERNANCE_VIEWS), "tool_call_events"):
        conn.execute(f"DROP VIEW IF EXISTS {view}")
    conn.execute("DROP TABLE IF EXISTS audit_events")


class SqliteReadModel:
    """The read model of an embedded ledger file, derived from its log (see the module)."""

    ddl = DDL

    def derive(self, conn: sqlite3.Connection, events: Sequence[tuple[int, int, Event]]) -> None:
        conn.executemany(_DERIVE, [audit_row(seq, p, event) for seq, p, event in events])

    def drop(self, conn: sqlite3.Connection) -> None:
        drop(conn)


CAUGHT_UP_WAIT_S = 2.0  # how long a read of the audit trail waits for the read model, at most


class SqliteCalls(search.CallReads, governance.GovernanceReads):
    """The read side (:class:`schemas.calls.CallQueries`) over the embedded projection."""

    dialect = SQLITE
    calls_lag = False  # the call rows are the executor's, written with the events

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        path: Path | None = None,
        moved: Callable[[float], Awaitable[None]] | None = None,
        caught_up: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        """``conn``: the ledger's connection, for the indexed lookups by id and key. With the
        ledger file's ``path``, the governance views (approvals, stats, switches, budgets),
        which scan the audit trail, are read in a thread on a read-only connection of their
        own, so a large ledger never stalls the event loop (WAL: readers do not block the
        writer). ``moved``: returns when the ledger derives its read model further (else
        :meth:`moved` waits its timeout out). ``caught_up``: returns once the read model holds
        the events written so far (bounded): the audit trail and the governance views are read
        after it, so a caller reads the events that answered it."""
        self._moved = moved
        self._caught_up = caught_up
        self._conn = conn
        self._path = path
        self._reader: sqlite3.Connection | None = None
        self._reader_lock = threading.Lock()

    async def moved(self, timeout_s: float) -> None:
        if self._moved is None:
            await super().moved(timeout_s)
        else:
            await self._moved(timeout_s)

    async def _fetch(self, query: Query) -> list[dict[str, Any]]:
        """On the ledger's connection: an indexed lookup never stalls the event loop long."""
        return self._rows(self._conn, *query)

    async def events(self, tenant_id: str, call_id: str) -> list[dict[str, Any]] | None:
        if self._caught_up is not None:
            await self._caught_up(CAUGHT_UP_WAIT_S)
        return await super().events(tenant_id, call_id)

    async def _read(self, *queries: Query) -> list[list[dict[str, Any]]]:
        if self._caught_up is not None:
            await self._caught_up(CAUGHT_UP_WAIT_S)
        if self._path is None:
            # no await between them: nothing is written in between, one snapshot
            return [self._rows(self._conn, sql, params) for sql, params in queries]
        return await asyncio.to_thread(self._read_in_thread, queries)

    def _read_in_thread(self, queries: Sequence[Query]) -> list[list[dict[str, Any]]]:
        with self._reader_lock:
            if self._reader is None:
                self._reader = sqlite3.connect(
                    f"file:{self._path}?mode=ro", uri=True, check_same_thread=False
                )
            self._reader.execute("BEGIN")  # one snapshot for all the queries
            try:
                return [self._rows(self._reader, sql, params) for sql, params in queries]
            finally:
                self._reader.execute("COMMIT")

    def close(self) -> None:
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None

    @staticmethod
    def _rows(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        cursor = conn.execute(sql, params)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]
