"""The audit trail's own retention (``--audit-retention``, default forever).

The audit trail is the read model's ``tool_call_events`` and ``tool_calls``. Past the
retention, a finished call whose key has expired loses its record: its row and its events,
once the row was last updated before the cutoff. A key still alive keeps its record (its
replays are answered from the row), so a key kept forever keeps its audit trail forever.
Events without a row (refusals, approvals of calls that never started) and read-only calls
(no key: nothing replays them) go once they are older than the cutoff. A PENDING or UNKNOWN call
keeps its whole record, however old: it is still to be resolved, and support staff need it.

Each round walks the events in time order from the start, a window of :data:`BATCH` rows a
pass, and stops at the first event newer than the cutoff: on SQLite in ``seq`` order (the
order the file's one writer appended them in: no index on time to keep up), on PostgreSQL
by ``occurred_at`` (indexed; its ``seq`` interleaves the log partitions by offset, which
does not follow time across partitions). What it keeps (open calls) it passes over; as the
head of the table holds only such records after a round, a round reads little more than what
it deletes.
The queries are written once over the :class:`~projections.dialect.Dialect`; an adapter
runs them in one transaction per window.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from toolledger.projections.dialect import POSTGRES, SQLITE, Dialect, Query

BATCH = 1_000
OPEN_STATUSES = ("PENDING", "UNKNOWN")


Walk = tuple[str, ...]
"""The columns the events are walked in the order of, ``seq`` last."""
BY_SEQ: Walk = ("seq",)
BY_TIME: Walk = ("occurred_at", "seq")


def window_sql(d: Dialect, walk: Walk, after: Sequence[Any], limit: int = BATCH) -> Query:
    """The next window of events in the order of ``walk``, after the values ``after`` of its
    columns: their seq, call and time."""
    columns = ", ".join(walk)
    marks = ", ".join([d.mark] * len(walk))
    return (
        f"SELECT seq, call_id, occurred_at FROM tool_call_events WHERE ({columns}) > ({marks}) "
        f"ORDER BY {columns} LIMIT {d.mark}",
        [*after, limit],
    )


def start(d: Dialect, walk: Walk) -> tuple[Any, ...]:
    """The values ``walk``'s columns are after at the start of a round (before every event)."""
    return tuple(
        d.time(datetime.min.replace(tzinfo=UTC)) if c == "occurred_at" else -1 for c in walk
    )


def kept_calls_sql(d: Dialect, call_ids: Sequence[str], cutoff: datetime) -> Query:
    """Of ``call_ids``, the calls whose record stays: open, updated since the cutoff, or with
    a key still alive (its replays are answered from this row)."""
    marks = ", ".join([d.mark] * len(call_ids))
    opened = ", ".join(f"'{s}'" for s in OPEN_STATUSES)
    return (
        f"SELECT call_id FROM tool_calls WHERE call_id IN ({marks}) "
        f"AND (status IN ({opened}) OR (expired_at IS NULL AND idempotency_key <> '') "
        f"OR updated_at >= {d.mark})",
        [*call_ids, d.time(cutoff)],
    )


def delete_sql(
    d: Dialect, seqs: Sequence[int], call_ids: Sequence[str], event_tables: Sequence[str]
) -> list[Query]:
    """Delete these events (from every table of ``event_tables`` that holds them) and these
    calls' rows."""
    queries: list[Query] = []
    if seqs:
        marks = ", ".join([d.mark] * len(seqs))
        for table in event_tables:
            queries.append((f"DELETE FROM {table} WHERE seq IN ({marks})", list(seqs)))
    if call_ids:
        marks = ", ".join([d.mark] * len(call_ids))
        queries.append((f"DELETE FROM tool_calls WHERE call_id IN ({marks})", list(call_ids)))
    return queries


@dataclass(frozen=True, slots=True)
class Pass:
    """What one window decided."""

    deleted_events: list[int]
    deleted_calls: list[str]
    cursor: tuple[Any, ...]  # the walk's values of the last event looked at
    done: bool  # the window reached the cutoff (or the end): stop until the next round


def plan(
    d: Dialect,
    walk: Walk,
    after: tuple[Any, ...],
    window: Sequence[Mapping[str, Any]],
    kept: set[str],
    cutoff: datetime,
    limit: int = BATCH,
) -> Pass:
    """The events and rows of ``window`` (the events after ``after`` in the order of
    ``walk``) to delete: older than ``cutoff`` and not of a kept call. A row goes with its
    events; a finished call's events all precede its last update, so they are in this window
    or earlier ones. The walk follows time (closely, by ``seq``): a pass stops at the first
    recent event."""
    boundary = d.time(cutoff)
    events: list[int] = []
    calls: set[str] = set()
    cursor = after
    for row in window:
        if not _older(row["occurred_at"], boundary):
            return Pass(events, sorted(calls), cursor, True)
        cursor = tuple(row[c] for c in walk)
        if row["call_id"] not in kept:
            events.append(int(row["seq"]))
            calls.add(row["call_id"])
    return Pass(events, sorted(calls), cursor, len(window) < limit)


def _older(value: Any, boundary: Any) -> bool:
    """Whether an ``occurred_at`` as the database returns it is before the boundary (the
    dialect's time parameter: text in SQLite, an aware datetime in PostgreSQL)."""
    if isinstance(value, datetime) and isinstance(boundary, datetime):
        return value < boundary
    return str(value) < str(boundary)


Transaction = Callable[[], contextlib.AbstractContextManager[sqlite3.Connection]]
_SQLITE_EVENTS = ("audit_events", "events")


def prune_sqlite(transaction: Transaction, cutoff: datetime, limit: int = BATCH) -> int:
    """One round on a SQLite read model; returns the events deleted. Each window is read and
    deleted in one ``transaction()`` (a connection inside a write transaction): the embedded
    ledger hands its own (``SqliteLedger.locked_write``), so a window waits its turn behind the
    writer's transactions in the process. Through a connection of its own it raced them
    through SQLite's busy handler, which a writer committing back to back under load starved
    (every round failed with "database is locked")."""
    d, deleted = SQLITE, 0
    cursor = start(d, BY_SEQ)
    while True:
        with transaction() as conn:
            window = _rows(conn, window_sql(d, BY_SEQ, cursor, limit))
            ids = sorted({r["call_id"] for r in window})
            kept = (
                {r["call_id"] for r in _rows(conn, kept_calls_sql(d, ids, cutoff))}
                if ids
                else set()
            )
            step = plan(d, BY_SEQ, cursor, window, kept, cutoff, limit)
            # the embedded file: the audit trail's index and the log's records of the events
            deletes = delete_sql(d, step.deleted_events, step.deleted_calls, _SQLITE_EVENTS)
            for sql, params in deletes:
                conn.execute(sql, params)
        deleted += len(step.deleted_events)
        if step.done:
            return deleted
        cursor = step.cursor


def _rows(conn: sqlite3.Connection, query: Query) -> list[dict[str, Any]]:
    cursor = conn.execute(*query)
    names = [c[0] for c in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


async def prune_postgres(dsn: str, cutoff: datetime, limit: int = BATCH) -> int:
    """One round on the PostgreSQL read model, by one front door at a time (an advisory
    lock: the others skip the round); one transaction per window."""
    import psycopg
    from psycopg.rows import dict_row

    d, deleted = POSTGRES, 0
    cursor = start(d, BY_TIME)
    async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row) as conn:
        got = await (
            await conn.execute("SELECT pg_try_advisory_lock(%s) AS got", [_LOCK])
        ).fetchone()
        if not got or not got["got"]:
            return 0
        try:
            while True:
                async with conn.transaction():
                    query = window_sql(d, BY_TIME, cursor, limit)
                    window = await (await conn.execute(*query)).fetchall()
                    ids = sorted({r["call_id"] for r in window})
                    kept: set[str] = set()
                    if ids:
                        found = await conn.execute(*kept_calls_sql(d, ids, cutoff))
                        kept = {r["call_id"] for r in await found.fetchall()}
                    step = plan(d, BY_TIME, cursor, window, kept, cutoff, limit)
                    deletes = delete_sql(
                        d, step.deleted_events, step.deleted_calls, ("tool_call_events",)
                    )
                    for sql, params in deletes:
                        await conn.execute(sql, params)
                deleted += len(step.deleted_events)
                if step.done:
                    return deleted
                cursor = step.cursor
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", [_LOCK])


_LOCK = 0x746C_6175_6469_74  # "tlaudit": one pruner at a time per database
