"""A partition's executor state in SQLite: one row per call key, holding its call state and
its approval book, beside the partition's switches and refused offsets.

Used by both backends with the same statements: the embedded log keeps these tables in its
ledger file (written in the same transaction as the outcome events), and the Kafka executor
keeps them in a local store per owned partition, a cache of the compacted state topic.

A row carries what the executor asks of the store without reading the state itself:

* ``tool`` and ``settled_at`` (epoch seconds of the state's last change, NULL while the call
  is PENDING or UNKNOWN; for a row with a book and no state, when the book settled): which
  keys' retention may have passed, asked per tool with the tool's *current* retention, so a
  changed retention applies to every stored key (the core decides with the whole entry);
* ``settled_at IS NULL AND state_json IS NOT NULL``: the unresolved keys, loaded at start
  (they are few: running or in doubt) and never evicted from the executor's cache.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from toolledger.processors.ledger import CallState
from toolledger.processors.ledger import settled_at as settled_of
from toolledger.processors.ledger.governance import ApprovalBook
from toolledger.processors.ports import CommitBatch, KeyEntry, Snapshot
from toolledger.processors.runtime.snapshot import (
    APPROVALS_PREFIX,
    REFUSED_KEY,
    SWITCH_PREFIX,
    restore,
    switch_pairs,
)
from toolledger.schemas.status import CallStatus

DDL = """
CREATE TABLE IF NOT EXISTS call_state (
    call_key TEXT PRIMARY KEY, partition INTEGER NOT NULL, tool TEXT, settled_at REAL,
    state_json TEXT, book_json TEXT);
CREATE INDEX IF NOT EXISTS call_state_due ON call_state (partition, tool, settled_at, call_key)
    WHERE settled_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS call_state_unresolved ON call_state (partition)
    WHERE settled_at IS NULL AND state_json IS NOT NULL;
CREATE TABLE IF NOT EXISTS executor_state (
    partition INTEGER NOT NULL, key TEXT NOT NULL, value_json TEXT NOT NULL,
    PRIMARY KEY (partition, key));
"""

# A call_state loaded in bulk (a Kafka executor's cold restore, into a new file): DDL's table,
# but with the key's uniqueness in an index of its own, built after the rows by one sort (a
# primary key's index would take the keys one random insert at a time). Reads and upserts
# (ON CONFLICT (call_key)) find either the same.
BULK_TABLE = """CREATE TABLE call_state (
    call_key TEXT NOT NULL, partition INTEGER NOT NULL, tool TEXT, settled_at REAL,
    state_json TEXT, book_json TEXT)"""
BULK_KEY_INDEX = "CREATE UNIQUE INDEX call_state_key ON call_state (call_key)"

_UNRESOLVED = frozenset({CallStatus.PENDING.value, CallStatus.UNKNOWN.value})
_READ_CHUNK = 500  # keys per statement: well under SQLite's limit of bound parameters


class transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on any error."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


class CallStates(Protocol):
    """Where a store's call states live and how it is asked for them (the rest of a key's
    entry, its approval book, and the switches and refused offsets are always in this
    module's tables). A Kafka local store keeps them here (:data:`IN_CALL_STATE`); the
    embedded ledger file keeps each once, in its read model's call rows
    (``projections.sqlite.SqliteProjection``), which its log writes in the same transaction."""

    def states(self, conn: sqlite3.Connection, keys: Sequence[str]) -> dict[str, CallState]:
        """The stored states of ``keys`` (a key with none is absent)."""

    def unresolved(self, conn: sqlite3.Connection, partition: int) -> dict[str, CallState]:
        """The partition's PENDING and UNKNOWN calls (few: running or in doubt)."""

    def due(
        self,
        conn: sqlite3.Connection,
        partition: int,
        tool: str,
        settled_before: float,
        after: tuple[float, str] | None,
        limit: int,
    ) -> list[tuple[float, str]]:
        """Keys of ``tool`` settled at or before ``settled_before`` (epoch seconds: their
        retention may have passed), oldest first, after the cursor ``after`` (the last one
        of the previous page)."""


def settled_at(status: str, updated_at: datetime) -> float | None:
    """:func:`processors.ledger.settled_at` in epoch seconds, from a state's two fields (a
    state topic's record read without a full validation)."""
    return None if status in _UNRESOLVED else updated_at.timestamp()


def _statements(script: str) -> list[str]:
    return [s for s in script.split(";") if s.strip()]


def create(conn: sqlite3.Connection) -> None:
    for statement in _statements(DDL):
        conn.execute(statement)


# -- writes -------------------------------------------------------------------------------


def put_batch(
    conn: sqlite3.Connection, batch: CommitBatch, *, states_partition: int | None = None
) -> None:
    """The batch's state changes, in the caller's transaction. An expired key's row goes
    first: a book the new call with the key opened in the same batch is written after it.

    ``states_partition``: the partition whose call states these are, written here (a Kafka
    local store); None: the states are written elsewhere in the same transaction (the
    embedded ledger file's call rows), so only books, switches and refused offsets are."""
    p = 0 if states_partition is None else states_partition
    if batch.expired:
        conn.executemany("DELETE FROM call_state WHERE call_key = ?", [(k,) for k in batch.expired])
    if states_partition is not None:
        for key, state in batch.states.items():
            _upsert_state(conn, key, p, state.model_dump_json(), state)
    conn.executemany(
        _UPSERT_BOOK,
        [
            (key, p, *book_meta(book), book.model_dump_json())
            for key, book in batch.approvals.items()
        ],
    )
    for partition in {q for q, _ in batch.switches} | set(batch.refused):
        put_governance(conn, partition, switch_pairs(batch, partition))


StateMeta = tuple[str, float | None]  # (tool, settled_at): what a row needs of a state


def state_meta(state: CallState) -> StateMeta:
    settled = settled_of(state)
    return state.context.tool, None if settled is None else settled.timestamp()


def book_meta(book: ApprovalBook) -> tuple[str | None, float | None]:
    """A book's row fields, used while its key has no state: a key that only had approval
    requests is due by when its book settled (unknown for a book stored without its times)."""
    settled = book.settled_at()
    tool = None if book.context is None else book.context.tool
    return tool, None if settled is None else settled.timestamp()


@dataclass(slots=True)
class PairRows:
    """Pairs of the state topic as rows of the tables: the last pair of each key only (it
    replaces the earlier ones), split by what it is. A ``None`` text is a tombstone."""

    states: list[tuple[str, int, str | None, float | None, str | None]] = field(
        default_factory=list
    )  # (call key, partition, tool, settled_at, state JSON)
    books: list[tuple[str, str | None, float | None, str | None]] = field(
        default_factory=list
    )  # (call key, tool, settled_at, book JSON): book_meta's fields
    governance: list[tuple[str, str | None]] = field(default_factory=list)  # (key, JSON)


def pair_rows(
    pairs: Iterable[tuple[str, bytes | None, StateMeta | None]],
    partition: int,
    *,
    last_only: bool = True,
) -> PairRows:
    """Pairs of the state topic in log order, with each state's row fields when the record
    carried them (else they are read from its JSON), as :class:`PairRows`. ``last_only``
    False: every pair, in order (for a loader that keeps the last row of each key itself)."""
    if last_only:
        last: dict[str, tuple[bytes | None, StateMeta | None]] = {}
        for key, value, meta in pairs:
            last.pop(key, None)
            last[key] = (value, meta)
        pairs = ((key, value, meta) for key, (value, meta) in last.items())
    rows = PairRows()
    states, books, governance = rows.states, rows.books, rows.governance
    for key, value, meta in pairs:
        text = None if value is None else value.decode("utf-8")
        if key.startswith(APPROVALS_PREFIX):
            of_book = (
                (None, None) if text is None else book_meta(ApprovalBook.model_validate_json(text))
            )
            books.append((key.removeprefix(APPROVALS_PREFIX), *of_book, text))
        elif key.startswith(SWITCH_PREFIX) or key == REFUSED_KEY:
            governance.append((key, text))
        elif text is None:
            states.append((key, partition, None, None, None))
        else:
            tool, settled = meta if meta is not None else _meta_of_json(text)
            states.append((key, partition, tool, settled, text))
    return rows


def put_pairs(
    conn: sqlite3.Connection,
    partition: int,
    pairs: Iterable[tuple[str, bytes | None, StateMeta | None]],
) -> None:
    """Pairs of the state topic in log order (a ``None`` value is a tombstone), with each
    state's row fields when the record carried them (else they are read from its JSON).

    A call key's state and its book are separate columns, so the pairs are written in bulk:
    tombstones, the rows left empty dropped, then upserts (a key's last pair of each column
    is one or the other; a book written after its key's state was cleared is due by itself)."""
    rows = pair_rows(pairs, partition)
    cleared_states = [(key,) for key, _, _, _, text in rows.states if text is None]
    cleared_books = [(key,) for key, _, _, text in rows.books if text is None]
    clear_states(conn, [key for (key,) in cleared_states])
    conn.executemany("UPDATE call_state SET book_json = NULL WHERE call_key = ?", cleared_books)
    conn.executemany(
        "DELETE FROM call_state WHERE call_key = ? AND state_json IS NULL AND book_json IS NULL",
        cleared_states + cleared_books,
    )
    conn.executemany(_UPSERT_STATE, [row for row in rows.states if row[4] is not None])
    conn.executemany(
        _UPSERT_BOOK,
        [(key, partition, *meta, text) for key, *meta, text in rows.books if text is not None],
    )
    put_governance(conn, partition, rows.governance)


def clear_states(conn: sqlite3.Connection, keys: Sequence[str]) -> None:
    """Drop the states of ``keys`` from their rows; a book left in a row is then due by
    itself (its row fields set as a book's write sets them)."""
    for key in keys:
        conn.execute(
            "UPDATE call_state SET state_json = NULL, tool = NULL, settled_at = NULL "
            "WHERE call_key = ?",
            (key,),
        )
        row = conn.execute(
            "SELECT partition, book_json FROM call_state WHERE call_key = ? "
            "AND book_json IS NOT NULL",
            (key,),
        ).fetchone()
        if row is not None:
            _upsert_book(conn, key, row[0], row[1])


def _meta_of_json(state_json: str) -> StateMeta:
    """Only the fields a row needs, not a full validation (a record without headers)."""
    raw = json.loads(state_json)
    return raw["context"]["tool"], settled_at(
        raw["status"], datetime.fromisoformat(raw["updated_at"])
    )


_UPSERT_STATE = (
    "INSERT INTO call_state (call_key, partition, tool, settled_at, state_json) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (call_key) DO UPDATE SET tool = excluded.tool, "
    "settled_at = excluded.settled_at, state_json = excluded.state_json"
)
# a book's tool and settled_at fill its row's only while the key has no state (a state's
# own are what its row is due by; the core then decides with the book too)
_UPSERT_BOOK = (
    "INSERT INTO call_state (call_key, partition, tool, settled_at, book_json) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (call_key) DO UPDATE SET "
    "book_json = excluded.book_json, "
    "tool = CASE WHEN state_json IS NULL THEN excluded.tool ELSE tool END, "
    "settled_at = CASE WHEN state_json IS NULL THEN excluded.settled_at ELSE settled_at END"
)


def _upsert_state(
    conn: sqlite3.Connection, key: str, partition: int, state_json: str | bytes, state: CallState
) -> None:
    conn.execute(_UPSERT_STATE, (key, partition, *state_meta(state), state_json))


def _upsert_book(conn: sqlite3.Connection, key: str, partition: int, book_json: str) -> None:
    book = ApprovalBook.model_validate_json(book_json)
    conn.execute(_UPSERT_BOOK, (key, partition, *book_meta(book), book_json))


def put_governance(
    conn: sqlite3.Connection, partition: int, pairs: Iterable[tuple[str, str | None]]
) -> None:
    """Switches and refused offsets (a ``None`` value: the pair is gone)."""
    pairs = list(pairs)
    conn.executemany(
        "INSERT INTO executor_state VALUES (?, ?, ?) ON CONFLICT (partition, key) "
        "DO UPDATE SET value_json = excluded.value_json",
        [(partition, k, v) for k, v in pairs if v is not None],
    )
    conn.executemany(
        "DELETE FROM executor_state WHERE partition = ? AND key = ?",
        [(partition, k) for k, v in pairs if v is None],
    )


# -- reads --------------------------------------------------------------------------------


def read(conn: sqlite3.Connection, keys: Sequence[str], states: CallStates) -> dict[str, KeyEntry]:
    """The stored entries of ``keys`` (a key with neither a state nor a book is absent)."""
    found = states.states(conn, keys)
    books: dict[str, ApprovalBook] = {}
    for start in range(0, len(keys), _READ_CHUNK):
        books.update(read_books(conn, keys[start : start + _READ_CHUNK]))
    return {k: KeyEntry(found.get(k), books.get(k)) for k in keys if k in found or k in books}


def read_books(conn: sqlite3.Connection, keys: Sequence[str]) -> dict[str, ApprovalBook]:
    """The stored approval books of ``keys`` (at most :data:`_READ_CHUNK` of them)."""
    marks = ",".join("?" * len(keys))
    return {
        key: ApprovalBook.model_validate_json(book_json)
        for key, book_json in conn.execute(
            f"SELECT call_key, book_json FROM call_state WHERE call_key IN ({marks}) "
            "AND book_json IS NOT NULL",
            keys,
        )
    }


def due_books(
    conn: sqlite3.Connection,
    tool: str,
    settled_before: float,
    after: tuple[float, str] | None,
    limit: int,
) -> list[tuple[float, str]]:
    """Keys of ``tool`` that only have a book, settled at or before ``settled_before``, of
    every partition (an embedded file's: its states are in its call rows)."""
    cursor, params = "", [tool, settled_before]
    if after is not None:
        cursor, params = "AND (settled_at, call_key) > (?, ?) ", [*params, *after]
    rows = conn.execute(
        "SELECT settled_at, call_key FROM call_state WHERE tool = ? AND settled_at IS NOT NULL "
        f"AND settled_at <= ? AND state_json IS NULL {cursor}ORDER BY settled_at, call_key LIMIT ?",
        [*params, limit],
    )
    return [(float(s), str(k)) for s, k in rows]


def stored_state(stored: str | bytes) -> CallState:
    """A row's state: the JSON text of a state topic's record (as a restore writes it)."""
    return CallState.model_validate_json(stored)


def live(conn: sqlite3.Connection, partition: int, states: CallStates) -> Snapshot:
    """What a partition's executor holds from the start: its unresolved calls (with their
    books), its switches and its refused offsets; every other key is read when it is used."""
    snapshot = Snapshot()
    snapshot.states.update(states.unresolved(conn, partition))
    for key, entry in read(conn, list(snapshot.states), states).items():
        if entry.book is not None:
            snapshot.approvals[key] = entry.book
    for key, value_json in conn.execute(
        "SELECT key, value_json FROM executor_state WHERE partition = ?", (partition,)
    ):
        restore(snapshot, partition, key, value_json)
    return snapshot


class _InCallState:
    """:class:`CallStates` in ``call_state.state_json`` (with its ``tool`` and ``settled_at``
    columns for the due keys): a Kafka local store's, a cache of its state topic."""

    def states(self, conn: sqlite3.Connection, keys: Sequence[str]) -> dict[str, CallState]:
        found: dict[str, CallState] = {}
        for start in range(0, len(keys), _READ_CHUNK):
            chunk = keys[start : start + _READ_CHUNK]
            marks = ",".join("?" * len(chunk))
            for key, state_json in conn.execute(
                f"SELECT call_key, state_json FROM call_state WHERE call_key IN ({marks}) "
                "AND state_json IS NOT NULL",
                chunk,
            ):
                found[key] = stored_state(state_json)
        return found

    def unresolved(self, conn: sqlite3.Connection, partition: int) -> dict[str, CallState]:
        return {
            key: stored_state(state_json)
            for key, state_json in conn.execute(
                "SELECT call_key, state_json FROM call_state "
                "WHERE partition = ? AND settled_at IS NULL AND state_json IS NOT NULL",
                (partition,),
            )
        }

    def due(
        self,
        conn: sqlite3.Connection,
        partition: int,
        tool: str,
        settled_before: float,
        after: tuple[float, str] | None,
        limit: int,
    ) -> list[tuple[float, str]]:
        return due_rows(
            conn, "state_json IS NOT NULL", partition, tool, settled_before, after, limit
        )


def due_rows(
    conn: sqlite3.Connection,
    which: str,
    partition: int,
    tool: str,
    settled_before: float,
    after: tuple[float, str] | None,
    limit: int,
) -> list[tuple[float, str]]:
    """Rows of ``tool`` settled at or before ``settled_before``, oldest first, after the
    cursor ``after``: those with a state (``which``: ``state_json IS NOT NULL``), or those
    whose key has only a book here (``state_json IS NULL``; in an embedded file every book
    row, its states being in the read model)."""
    cursor, params = "", [partition, tool, settled_before]
    if after is not None:
        cursor, params = "AND (settled_at, call_key) > (?, ?) ", [*params, *after]
    rows = conn.execute(
        "SELECT settled_at, call_key FROM call_state WHERE partition = ? AND tool = ? "
        f"AND settled_at IS NOT NULL AND settled_at <= ? AND {which} "
        f"{cursor}ORDER BY settled_at, call_key LIMIT ?",
        [*params, limit],
    )
    return [(float(s), str(k)) for s, k in rows]


IN_CALL_STATE: CallStates = _InCallState()
