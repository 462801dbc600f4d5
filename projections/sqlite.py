"""SQLite projections for the embedded mode: applied inside the caller's transaction.

:class:`SqliteProjection` is what the embedded log is handed (its
:class:`~processors.runtime.sqlite_log.LogProjection`): the log calls it in its own
transactions, so the read model is committed with the events it folds.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from processors.ledger import CallState, settled_at
from projections import governance, search
from projections.dialect import SQLITE, Query
from projections.rows import (
    CALL_COLUMNS,
    EVENT_COLUMNS,
    STATE_COLUMNS,
    STATE_SELECT,
    Position,
    call_row,
    event_row,
    expiries,
    fold_new_events,
    state_of_row,
    whole_payload,
)
from schemas.codec import decode
from schemas.events import (
    ApprovalConsumed,
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    ToolCallFailed,
    ToolDisabled,
    ToolEnabled,
)
from schemas.keys import call_id_of
from schemas.packing import unpack

# The audit trail's table, by name: a migration makes it under another name first.
_EVENTS_TABLE = """CREATE TABLE IF NOT EXISTS {name} (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL,
    call_id TEXT NOT NULL,
    call_key TEXT,
    tenant_id TEXT NOT NULL,
    tool_name TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    intent_id TEXT NOT NULL,
    run_id TEXT,
    event_type TEXT NOT NULL,
    occurred_at TEXT NOT NULL,
    payload_json TEXT
)"""
# Of a row that points at its event's record (payload_json NULL), only what rows are found and
# counted by (call, tenant, tool, key, intent, run, type, time) and the event's id: its call
# key (tenant, tool and key again) is the record's, as the rest of its envelope.
_NOT_IN_POINTING_ROWS = ("call_key", "payload_json")

DDL = f"""
CREATE TABLE IF NOT EXISTS tool_calls (
    call_id TEXT PRIMARY KEY,
    call_key TEXT NOT NULL,
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
    expired_at TEXT,
    log_partition INTEGER,
    settled_at REAL,
    UNIQUE (tenant_id, tool_name, idempotency_key)
);
CREATE INDEX IF NOT EXISTS tool_calls_by_run ON tool_calls (tenant_id, run_id)
    WHERE run_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS tool_calls_by_status ON tool_calls (tenant_id, status);
CREATE INDEX IF NOT EXISTS tool_calls_due ON tool_calls (log_partition, tool_name, settled_at)
    WHERE settled_at IS NOT NULL AND expired_at IS NULL;
CREATE INDEX IF NOT EXISTS tool_calls_unresolved ON tool_calls (log_partition)
    WHERE settled_at IS NULL AND expired_at IS NULL;
{_EVENTS_TABLE.format(name="tool_call_events")};
CREATE INDEX IF NOT EXISTS tool_call_events_by_call ON tool_call_events (call_id, seq);
CREATE INDEX IF NOT EXISTS tool_call_events_in_log
    ON tool_call_events (log_partition, log_offset) WHERE payload_json IS NULL;
"""


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
_APPROVAL_TYPES = "'ApprovalRequested', 'ApprovalGranted', 'ApprovalDenied', 'ApprovalConsumed'"
_SWITCH_TYPES = "'ToolDisabled', 'ToolEnabled'"

# The governance read side (projections/governance.py; 0002_governance.sql for PostgreSQL):
# views over the two tables, so a rebuild gives them back by construction. The fact views
# below read the JSON payloads in SQLite's dialect, with every time as UTC text that sorts
# (_utc_text), the portable views on top are shared with PostgreSQL. Dropped and created at
# every open, so a new definition takes over. No ';' inside a statement:
# SqliteLog.rebuild_projections splits this text on it.
GOVERNANCE_VIEWS = (
    "approval_events",
    "switch_changes",
    "call_event_facts",
    *governance.PORTABLE_VIEWS,
)
GOVERNANCE_DDL = f"""
CREATE INDEX IF NOT EXISTS tool_call_events_by_run ON tool_call_events (tenant_id, run_id, seq)
    WHERE run_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS tool_call_events_by_approval
    ON tool_call_events ({_payload("approval_id")}, tenant_id, seq)
    WHERE event_type IN ({_APPROVAL_TYPES});
CREATE INDEX IF NOT EXISTS tool_call_events_governance
    ON tool_call_events (event_type, tenant_id, seq)
    WHERE event_type IN ({_APPROVAL_TYPES}, {_SWITCH_TYPES});
{"".join(f"DROP VIEW IF EXISTS {v};" for v in reversed(GOVERNANCE_VIEWS))}
CREATE VIEW approval_events AS
SELECT seq, tenant_id, tool_name, call_id, call_key, idempotency_key, run_id, event_type,
       {_utc_text("occurred_at")} AS occurred_at,
       {_payload("approval_id")} AS approval_id,
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

# An audit row stores its payload only if the views above read a field of it: approvals and
# switches (their whole payload), and any event with an error, a disposition or a fingerprint.
# Every other row (a call's Started and Succeeded: nearly all of them) points at the log's
# record of its event (log_partition, log_offset) in this same file, so the event is stored
# once; its views' fields read NULL, as they would from its payload.
_VIEWED_TYPES = frozenset(
    e.TYPE
    for e in (
        ApprovalRequested,
        ApprovalGranted,
        ApprovalDenied,
        ApprovalConsumed,
        ToolDisabled,
        ToolEnabled,
        ToolCallFailed,
    )
)


def _payload_stored(event: Event) -> bool:
    return event.TYPE in _VIEWED_TYPES or getattr(event, "error", None) is not None


DDL += GOVERNANCE_DDL

PROJECTION_TABLES = ("tool_calls", "tool_call_events")

_INSERT_EVENT = (
    f"INSERT OR IGNORE INTO tool_call_events ({', '.join(EVENT_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in EVENT_COLUMNS)})"
)
# A call row of the embedded file is also its executor's state (CallStates below): it says
# which log partition the key is in and, once the call is resolved, when its key's retention
# started (processors.ledger.settled_at, epoch seconds), for the executor's due keys.
_CALL_COLUMNS = (*CALL_COLUMNS, "log_partition", "settled_at")
_UPSERT_CALL = (
    f"INSERT INTO tool_calls ({', '.join(_CALL_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in _CALL_COLUMNS)}) "
    # the key's unique constraint: (tenant, tool, key) is what call_key and call_id derive from
    "ON CONFLICT (tenant_id, tool_name, idempotency_key) DO UPDATE SET "
    + ", ".join(
        f"{c} = excluded.{c}"
        for c in _CALL_COLUMNS
        if c not in ("call_id", "call_key", "tenant_id", "tool_name", "idempotency_key")
    )
)


def drop(conn: sqlite3.Connection) -> None:
    for view in reversed(GOVERNANCE_VIEWS):
        conn.execute(f"DROP VIEW IF EXISTS {view}")
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
    partitions = {e.call_key: p.partition for e, p in events}  # a state moves by its events
    if states is not None:
        conn.executemany(_INSERT_EVENT, [_row(e, p) for e, p in events])
        put_states(conn, partitions, states)
        _mark_expired(conn, [e for e, _ in events])
        return
    new = [e for e, p in events if conn.execute(_INSERT_EVENT, _row(e, p)).rowcount]
    stored = _states_of(conn, sorted({call_id_of(e.call_key) for e in new}))
    put_states(conn, partitions, fold_new_events(stored, new))
    _mark_expired(conn, new)


def put_states(
    conn: sqlite3.Connection, partitions: Mapping[str, int], states: Mapping[str, CallState]
) -> None:
    """Upsert the call rows of ``states``, each in its key's log partition."""
    rows = []
    for key, state in states.items():
        row = _sqlite(call_row(key, state))
        settled = settled_at(state)
        row["log_partition"] = partitions[key]
        row["settled_at"] = None if settled is None else settled.timestamp()
        rows.append(row)
    conn.executemany(_UPSERT_CALL, rows)


def _states_of(conn: sqlite3.Connection, call_ids: Sequence[str]) -> dict[str, CallState]:
    """The states of the call rows of ``call_ids`` whose key has not expired (an expired
    key's row keeps its last call for support, but the key is new again)."""
    found: dict[str, CallState] = {}
    for start in range(0, len(call_ids), 500):  # SQLite's parameter limit
        chunk = call_ids[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        found.update(
            _read_states(
                conn,
                f"SELECT {STATE_SELECT} FROM tool_calls WHERE call_id IN ({marks}) "
                "AND expired_at IS NULL",
                chunk,
            )
        )
    return found


def _read_states(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> dict[str, CallState]:
    found: dict[str, CallState] = {}
    for values in conn.execute(sql, params):
        row = dict(zip(STATE_COLUMNS, values, strict=True))
        found[row["call_key"]] = state_of_row(row)
    return found


def unresolved(conn: sqlite3.Connection, partition: int) -> dict[str, CallState]:
    """The partition's PENDING and UNKNOWN calls (their retention has not started)."""
    return _read_states(
        conn,
        f"SELECT {STATE_SELECT} FROM tool_calls WHERE log_partition = ? "
        "AND settled_at IS NULL AND expired_at IS NULL",
        (partition,),
    )


def due(
    conn: sqlite3.Connection,
    partition: int,
    tool: str,
    settled_before: float,
    after: tuple[float, str] | None,
    limit: int,
) -> list[tuple[float, str]]:
    """The partition's keys of ``tool`` settled at or before ``settled_before``, oldest
    first, after the cursor ``after`` (the last of the previous page)."""
    cursor, params = "", [partition, tool, settled_before]
    if after is not None:
        cursor, params = "AND (settled_at, call_key) > (?, ?) ", [*params, *after]
    rows = conn.execute(
        "SELECT settled_at, call_key FROM tool_calls WHERE log_partition = ? AND tool_name = ? "
        "AND settled_at IS NOT NULL AND expired_at IS NULL AND settled_at <= ? "
        f"{cursor}ORDER BY settled_at, call_key LIMIT ?",
        [*params, limit],
    )
    return [(float(s), str(k)) for s, k in rows]


def _row(event: Event, position: Position) -> dict[str, Any]:
    if _payload_stored(event):
        return _sqlite(event_row(event, position))
    row = _sqlite(event_row(event, position, payload=False))
    row.update(dict.fromkeys(_NOT_IN_POINTING_ROWS))
    return row


def logged_events(
    conn: sqlite3.Connection, positions: Sequence[Position]
) -> dict[Position, dict[str, Any]]:
    """The whole events (as :func:`~projections.rows.audit_payload` gives them) of the log's
    outcome records at ``positions``: the payloads of the audit rows that point at them. The
    read model is kept in its log's file (``log``: topic, partition, offset, key, value)."""
    found: dict[Position, dict[str, Any]] = {}
    by_partition: dict[int, list[int]] = {}
    for position in positions:
        by_partition.setdefault(position.partition, []).append(position.offset)
    for partition, offsets in by_partition.items():
        for start in range(0, len(offsets), 500):  # SQLite's parameter limit
            chunk = offsets[start : start + 500]
            marks = ", ".join("?" * len(chunk))
            for offset, value in conn.execute(
                "SELECT offset, value FROM log WHERE topic = 'outcomes' AND partition = ? "
                f"AND offset IN ({marks})",
                (partition, *chunk),
            ):
                found[Position(partition, offset)] = whole_payload(decode(unpack(value)))
    missing = set(positions) - found.keys()
    if missing:
        raise LookupError(f"audit rows point at outcome records no longer in the log: {missing}")
    return found


def keep_outcomes(conn: sqlite3.Connection, partition: int, first: int, stop: int) -> int:
    """Before the log deletes its outcome records ``[first, stop)`` of ``partition`` (their
    retention passed): the audit rows still pointing at them take their payloads (the audit
    trail has a retention of its own). Returns how many rows took theirs."""
    rows = conn.execute(
        "SELECT seq, log_offset FROM tool_call_events WHERE log_partition = ? "
        "AND log_offset >= ? AND log_offset < ? AND payload_json IS NULL",
        (partition, first, stop),
    ).fetchall()
    if not rows:
        return 0
    events = logged_events(conn, [Position(partition, offset) for _, offset in rows])
    conn.executemany(
        "UPDATE tool_call_events SET payload_json = ? WHERE seq = ?",
        [(_stored_payload(events[Position(partition, offset)]), seq) for seq, offset in rows],
    )
    return len(rows)


def _stored_payload(whole: dict[str, Any]) -> str:
    """A whole event as an audit row's payload (its whole envelope: it reads as it is)."""
    return json.dumps(whole, ensure_ascii=False, separators=(",", ":"))


def _mark_expired(conn: sqlite3.Connection, events: Sequence[Event]) -> None:
    expired = expiries(events)
    if expired:
        conn.executemany(
            "UPDATE tool_calls SET expired_at = ? WHERE call_id = ?",
            [(when.isoformat(), call_id_of(key)) for key, when in expired],
        )


def migrate(conn: sqlite3.Connection) -> None:
    """Columns added since a ledger file was made (CREATE TABLE IF NOT EXISTS keeps the old
    table; run before :data:`DDL`, whose indexes need them): ``tool_calls.expired_at``,
    ``log_partition`` and ``settled_at`` (filled when the log hands its states over);
    ``tool_call_events``' payload and keys made nullable (its
    rows copied once into the table as :data:`DDL` has it); the run indexes made partial; and
    the index dropped since."""
    columns = {r[1] for r in conn.execute("PRAGMA table_info(tool_calls)")}
    added = (("expired_at", "TEXT"), ("log_partition", "INTEGER"), ("settled_at", "REAL"))
    for column, kind in added:
        if columns and column not in columns:
            conn.execute(f"ALTER TABLE tool_calls ADD COLUMN {column} {kind}")
    required = {r[1]: r[3] for r in conn.execute("PRAGMA table_info(tool_call_events)")}
    if any(required.get(column) for column in _NOT_IN_POINTING_ROWS):
        _remake_events_table(conn)
    # the run indexes hold only calls with a run id (every query by run names one): made
    # again where an earlier version indexed every row
    for index, sql in conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE name IN "
        "('tool_calls_by_run', 'tool_call_events_by_run')"
    ).fetchall():
        if "WHERE" not in sql:
            conn.execute(f"DROP INDEX {index}")
            conn.execute(next(s for s in DDL.split(";") if f"EXISTS {index} " in s))
    # no query reads the events by key (a key's calls are found in tool_calls, its events by
    # call id): the index only cost two writes per call and 5% of the file
    conn.execute("DROP INDEX IF EXISTS tool_call_events_by_key")


def _remake_events_table(conn: sqlite3.Connection) -> None:
    """``tool_call_events`` as :data:`DDL` has it, with every row of the old table (SQLite
    cannot drop a column's NOT NULL in place): the views go first, and the table's indexes
    and the views are made again from :data:`DDL`."""
    for view in reversed(GOVERNANCE_VIEWS):
        conn.execute(f"DROP VIEW IF EXISTS {view}")
    conn.execute(_EVENTS_TABLE.format(name="tool_call_events_v2"))
    conn.execute("INSERT INTO tool_call_events_v2 SELECT * FROM tool_call_events")
    conn.execute("DROP TABLE tool_call_events")  # and its indexes
    conn.execute("ALTER TABLE tool_call_events_v2 RENAME TO tool_call_events")
    for statement in DDL.split(";"):
        if statement.strip():
            conn.execute(statement)


class SqliteProjection:
    """The read model of an embedded ledger file (``tool_calls``, ``tool_call_events`` and the
    governance views), as the embedded log writes it: :data:`DDL`, :func:`migrate`,
    :func:`apply` and :func:`drop`, inside the log's transactions."""

    ddl = DDL

    def migrate(self, conn: sqlite3.Connection) -> None:
        migrate(conn)

    def apply(
        self,
        conn: sqlite3.Connection,
        events: Sequence[tuple[Event, Position]],
        states: Mapping[str, CallState] | None = None,
    ) -> None:
        apply(conn, events, states)

    def drop(self, conn: sqlite3.Connection) -> None:
        drop(conn)

    def keep_outcomes(self, conn: sqlite3.Connection, partition: int, first: int, stop: int) -> int:
        return keep_outcomes(conn, partition, first, stop)

    # the executor's call states (processors.runtime.state_table.CallStates): its call rows

    def states(self, conn: sqlite3.Connection, keys: Sequence[str]) -> dict[str, CallState]:
        return _states_of(conn, [call_id_of(k) for k in keys])

    def unresolved(self, conn: sqlite3.Connection, partition: int) -> dict[str, CallState]:
        return unresolved(conn, partition)

    def due(
        self,
        conn: sqlite3.Connection,
        partition: int,
        tool: str,
        settled_before: float,
        after: tuple[float, str] | None,
        limit: int,
    ) -> list[tuple[float, str]]:
        return due(conn, partition, tool, settled_before, after, limit)

    def put_states(
        self, conn: sqlite3.Connection, partition: int, states: Mapping[str, CallState]
    ) -> None:
        put_states(conn, dict.fromkeys(states, partition), states)


_TIMES = ("created_at", "updated_at", "occurred_at", "expired_at")


def _sqlite(row: dict[str, Any]) -> dict[str, Any]:
    for name in _TIMES:
        if row.get(name) is not None:
            row[name] = row[name].isoformat()
    return row


class SqliteCalls(search.CallReads, governance.GovernanceReads):
    """The read side (:class:`schemas.calls.CallQueries`) over the embedded projection."""

    dialect = SQLITE

    def __init__(self, conn: sqlite3.Connection, *, path: Path | None = None) -> None:
        """``conn``: the ledger's connection, for the indexed lookups by id and key. With the
        ledger file's ``path``, the governance views (approvals, stats, switches, budgets),
        which scan the audit trail, are read in a thread on a read-only connection of their
        own, so a large ledger never stalls the event loop (WAL: readers do not block the
        writer)."""
        self._conn = conn
        self._path = path
        self._reader: sqlite3.Connection | None = None
        self._reader_lock = threading.Lock()

    async def _fetch(self, query: Query) -> list[dict[str, Any]]:
        """On the ledger's connection: an indexed lookup never stalls the event loop long."""
        return self._rows(self._conn, *query)

    async def _read(self, *queries: Query) -> list[list[dict[str, Any]]]:
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

    async def _logged(self, positions: Sequence[Position]) -> Mapping[Position, dict[str, Any]]:
        return logged_events(self._conn, positions)

    @staticmethod
    def _rows(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        cursor = conn.execute(sql, params)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]
