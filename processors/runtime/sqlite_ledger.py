"""The embedded ledger file: one SQLite file holds the log, the executor's state and the read
model (docs/architecture.md#the-embedded-mode).

What the executor writes, in one transaction per batch (:meth:`SqliteLedger.write`):

* ``events``: every outcome event once, in commit order (``seq``), as JSON. It is the log and
  the audit trail's record of the event: nothing else stores an event;
* ``tool_calls``: one row per call key, the executor's state of the key *and* what readers
  read of the call (its columns, and ``state_json`` for the rest of the state);
* ``call_state`` (approval books) and ``executor_state`` (switches), the tables of
  :mod:`processors.runtime.state_table`;
* ``intents``: the raw arguments of a call that opened an approval request, for the human who
  decides it (raw arguments live nowhere else; they go after the intents retention);
* ``dead_letters``: records that could not be decided, with the reason.

The read model (the audit trail's index, the governance views) is not this module's: the
ledger is handed a :class:`ReadModel` (``projections.sqlite.SqliteReadModel``) and derives it
from ``events`` *after* the batches that wrote them, in transactions of its own
(:meth:`SqliteLedger.tail`), its position in ``positions`` in the same transaction: the hot
transaction writes the log and the state only. ``toolledger replay`` (:meth:`rebuild`) drops
and derives the read model again, and folds ``tool_calls`` from the log.

Two connections: the write connection, used one transaction at a time under a lock by the
runtime's writer thread (and by others' writes through :meth:`locked_write`), and ``conn``,
the event loop's (the executor's reads, the read side): a WAL reader sees the last commit.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol

from toolledger.processors.ledger import CallState, evolve
from toolledger.processors.ledger.rows import (
    CALL_FIELDS,
    STATE_SELECT,
    call_values,
    event_of_json,
    state_of_values,
)
from toolledger.processors.ports import CommitBatch, KeyEntry, Snapshot
from toolledger.processors.runtime import state_table
from toolledger.processors.runtime.ledger_file import (
    LedgerFileError,
    check_identity,
    check_readable,
    must_create,
    read_only,
    record_identity,
    write_failure,
)
from toolledger.processors.runtime.snapshot import restore
from toolledger.processors.runtime.state_table import transaction
from toolledger.schemas.events import Event, ToolCallKeyExpired, ToolCallRequested, ToolCallStarted
from toolledger.schemas.keys import DEFAULT_KEY_SCOPE, KeyScope, call_id_of

__all__ = ["FORMAT", "LedgerFileError", "ReadModel", "SqliteLedger", "create", "refold"]

log = logging.getLogger("toolledger.embedded")

FORMAT = "toolledger/1"
WAL_SIZE_LIMIT = 64 << 20
READ_MODEL = "read_model"  # the read model's position in ``positions``
_READ_CHUNK = 500  # keys per statement: well under SQLite's limit of bound parameters

_CALLS_DDL = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY, partition INTEGER NOT NULL, event TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tool_calls (
    call_id TEXT PRIMARY KEY, call_key TEXT NOT NULL, tenant_id TEXT NOT NULL,
    tool_name TEXT NOT NULL, tool_version TEXT NOT NULL, idempotency_key TEXT NOT NULL,
    args_digest TEXT NOT NULL, status TEXT NOT NULL, result_json TEXT, error_json TEXT,
    attempts INTEGER NOT NULL, rounds INTEGER NOT NULL, reconcile_attempts INTEGER NOT NULL,
    run_id TEXT, step_id TEXT, first_intent_id TEXT NOT NULL, last_intent_id TEXT NOT NULL,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL, last_event_id TEXT NOT NULL,
    state_json TEXT NOT NULL, expired_at TEXT, settled_at REAL);
CREATE INDEX IF NOT EXISTS tool_calls_due ON tool_calls (tool_name, settled_at, call_key)
    WHERE settled_at IS NOT NULL AND expired_at IS NULL;
CREATE INDEX IF NOT EXISTS tool_calls_unresolved ON tool_calls (created_at)
    WHERE settled_at IS NULL AND expired_at IS NULL;
CREATE INDEX IF NOT EXISTS tool_calls_recent ON tool_calls (tenant_id, created_at, call_id);
CREATE TABLE IF NOT EXISTS intents (
    seq INTEGER PRIMARY KEY, call_key TEXT NOT NULL, at REAL NOT NULL,
    arguments_json TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS intents_by_key ON intents (call_key, at);
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY AUTOINCREMENT, partition INTEGER NOT NULL, offset INTEGER,
    reason TEXT NOT NULL, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS positions (consumer TEXT PRIMARY KEY, position INTEGER NOT NULL);
"""

_INSERT_EVENT = "INSERT INTO events VALUES (?, ?, ?)"
_UPSERT_CALL = (
    f"INSERT INTO tool_calls ({', '.join(CALL_FIELDS)}) "
    f"VALUES ({', '.join('?' for _ in CALL_FIELDS)}) ON CONFLICT (call_id) DO UPDATE SET "
    + ", ".join(
        f"{c} = excluded.{c}"
        for c in CALL_FIELDS
        if c not in ("call_id", "call_key", "tenant_id", "tool_name", "idempotency_key")
    )
)


# the columns a call's next state may change (its first intent and creation stay, as its
# identity), and then its call id: the parameters of _UPDATE_CALL, as indexes of CALL_FIELDS
_KEPT = (
    "call_id",
    "call_key",
    "tenant_id",
    "tool_name",
    "idempotency_key",
    "first_intent_id",
    "created_at",
)
_UPDATE_CALL = (
    "UPDATE tool_calls SET "
    + ", ".join(f"{c} = ?" for c in CALL_FIELDS if c not in _KEPT)
    + " WHERE call_id = ?"
)
_UPDATED = (
    *(i for i, c in enumerate(CALL_FIELDS) if c not in _KEPT),
    CALL_FIELDS.index("call_id"),
)


class ReadModel(Protocol):
    """The read model derived from the ledger's ``events`` (the composition root hands
    ``projections.sqlite.SqliteReadModel``)."""

    @property
    def ddl(self) -> str:
        """Its tables, indexes and views, as one script (statements end with ``;`` and hold
        no other ``;``)."""

    def derive(self, conn: sqlite3.Connection, events: Sequence[tuple[int, int, Event]]) -> None:
        """Derive the rows of ``events`` (``(seq, partition, event)``, in log order) inside
        the caller's transaction."""

    def drop(self, conn: sqlite3.Connection) -> None:
        """Drop every table and view of the read model (a rebuild creates them again)."""


class SqliteLedger:
    def __init__(
        self,
        path: Path,
        *,
        read_model: ReadModel,
        partitions: int = 4,
        synchronous: str = "FULL",
        create: bool | None = None,
        key_scope: KeyScope | None = None,
    ) -> None:
        """Open the ledger at ``path``. ``create``: True to make it if it does not exist, False
        never to, None (default) only in a new, empty directory. ``key_scope``: the scope of
        the tools' keys, recorded when the ledger is made (None: :data:`DEFAULT_KEY_SCOPE`; a
        ledger made before scopes were recorded: "tenant", as its keys are) and kept for its
        life (:attr:`key_scope`); another one asked of an existing ledger is refused. Raises
        :class:`LedgerFileError` (one line naming the file) and then has written nothing."""
        self.read_model = read_model
        self.path = Path(path)
        new = must_create(self.path, create)  # before the lock: a refusal leaves no trace
        self._lock_file: IO[str] | None = None
        self._lock()
        try:
            if not new:
                check_readable(self.path)
                check_identity(self.path, self._check_format(key_scope))
            try:
                self._writes = self._open(synchronous)
                kept = DEFAULT_KEY_SCOPE if new else KeyScope.TENANT  # as _check_format
                self.partitions = self._init_meta(partitions, key_scope or kept)
                self.key_scope = KeyScope(_meta(self._writes, self.path, "key_scope"))
                self.epoch = self._bump_epoch()
                self.conn = _connect(self.path, synchronous)
                record_identity(self.path, self.meta("ledger_id"))
            except (sqlite3.Error, OSError) as exc:
                raise write_failure(self.path, exc) from None
        except BaseException:
            self._unlock()
            raise
        self._synchronous = synchronous
        # held for every use of the write connection (one transaction at a time)
        self._write_lock = threading.Lock()
        self._derived = self._position(self._writes)  # the read model's position (writer's)
        self.last_seq = self._last_seq(self._writes)
        # the events of the last write, to derive from as they are (else read from the log)
        self._written: list[tuple[int, int, Event]] = []

    # -- opening ----------------------------------------------------------------------------

    def _lock(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(f"{self.path}.lock", "w")  # noqa: SIM115 - held for the ledger's life
        except OSError as exc:
            raise write_failure(self.path, exc) from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise LedgerFileError(
                f"{self.path} is in use by another toolledger process (embedded mode is "
                "single-node: one executor per file)"
            ) from None
        self._lock_file = handle

    def _unlock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def _check_format(self, key_scope: KeyScope | None) -> str | None:
        """A ledger of this format and, if ``key_scope`` is given, of that key scope, read
        only: another application's database is refused. Returns the ledger's id."""
        conn = read_only(self.path)
        try:
            tables = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            if "meta" not in tables:
                raise LedgerFileError(
                    f"{self.path} is an SQLite database of another application "
                    f"(tables {sorted(tables)[:5]}); it was left untouched"
                )
            row = conn.execute("SELECT v FROM meta WHERE k = 'format'").fetchone()
            identity = conn.execute("SELECT v FROM meta WHERE k = 'ledger_id'").fetchone()
            scoped = conn.execute("SELECT v FROM meta WHERE k = 'key_scope'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise LedgerFileError(
                f"{self.path} cannot be read ({exc}); it was left untouched"
            ) from None
        finally:
            conn.close()
        if row is None or row[0] != FORMAT:
            raise LedgerFileError(
                f"{self.path} has format {row[0] if row else None!r}, "
                f"expected {FORMAT!r}; it was left untouched"
            )
        # a ledger made before key scopes were recorded made its keys the tenant's
        recorded = KeyScope.TENANT.value if scoped is None else scoped[0]
        if key_scope is not None and recorded != key_scope.value:
            raise LedgerFileError(
                f"{self.path} scopes keys by {recorded}, not {key_scope.value}: a ledger keeps "
                "the key scope it was made with (its keys would name other calls); leave "
                "--key-scope out or make a new ledger. It was left untouched"
            )
        return None if identity is None else str(identity[0])

    def _open(self, synchronous: str) -> sqlite3.Connection:
        conn = _connect(self.path, synchronous)
        with transaction(conn):
            create(conn, self.read_model)
        return conn

    def _init_meta(self, partitions: int, key_scope: KeyScope) -> int:
        # here and in _bump_epoch, no lock: nothing else has the ledger before __init__ returns
        with transaction(self._writes) as conn:
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (FORMAT,))
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('partitions', ?)", (str(partitions),))
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('key_scope', ?)", (key_scope.value,))
            conn.execute(
                "INSERT OR IGNORE INTO meta VALUES ('redaction_secret', ?)",
                (secrets.token_hex(32),),
            )
            conn.execute(
                "INSERT OR IGNORE INTO meta VALUES ('ledger_id', ?)", (secrets.token_hex(16),)
            )
        return int(_meta(self._writes, self.path, "partitions"))

    def _bump_epoch(self) -> int:
        with transaction(self._writes) as conn:
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('epoch', '0')")
            conn.execute("UPDATE meta SET v = CAST(v AS INTEGER) + 1 WHERE k = 'epoch'")
        return int(_meta(self._writes, self.path, "epoch"))

    def meta(self, key: str) -> str:
        return _meta(self.conn, self.path, key)

    # -- the executor's store (reads on the loop's connection) --------------------------------

    def load(self) -> Snapshot:
        """The unresolved calls with their books, and the switches (of every partition)."""
        snapshot = Snapshot()
        conn = self.conn
        snapshot.states.update(
            _states(
                conn,
                f"SELECT {STATE_SELECT} FROM tool_calls "
                "WHERE settled_at IS NULL AND expired_at IS NULL",
                (),
            )
        )
        for key, entry in self.read(list(snapshot.states)).items():
            if entry.book is not None:
                snapshot.approvals[key] = entry.book
        for partition, key, value_json in conn.execute(
            "SELECT partition, key, value_json FROM executor_state"
        ):
            restore(snapshot, partition, key, value_json)
        return snapshot

    def read(self, keys: Sequence[str]) -> Mapping[str, KeyEntry]:
        """The stored entries of ``keys``, as of the last commit (an expired key's row keeps
        its last call for support, but the key is new again: absent)."""
        conn = self.conn
        found: dict[str, CallState] = {}
        books = {}
        for start in range(0, len(keys), _READ_CHUNK):
            chunk = keys[start : start + _READ_CHUNK]
            marks = ",".join("?" * len(chunk))
            found.update(
                _states(
                    conn,
                    f"SELECT {STATE_SELECT} FROM tool_calls WHERE call_id IN ({marks}) "
                    "AND expired_at IS NULL",
                    [call_id_of(k) for k in chunk],
                )
            )
            books.update(state_table.read_books(conn, chunk))
        return {k: KeyEntry(found.get(k), books.get(k)) for k in keys if k in found or k in books}

    def due(
        self, tool: str, settled_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[tuple[float, str]]:
        """Keys of ``tool`` settled at or before ``settled_before``: calls and keys that only
        have a book, merged in order (a page of at most ``limit``; one cursor for both)."""
        cursor, params = "", [tool, settled_before]
        if after is not None:
            cursor, params = "AND (settled_at, call_key) > (?, ?) ", [*params, *after]
        conn = self.conn
        conn.execute("BEGIN")
        try:
            calls = conn.execute(
                "SELECT settled_at, call_key FROM tool_calls WHERE tool_name = ? "
                "AND settled_at IS NOT NULL AND expired_at IS NULL AND settled_at <= ? "
                f"{cursor}ORDER BY settled_at, call_key LIMIT ?",
                [*params, limit],
            ).fetchall()
            books = state_table.due_books(conn, tool, settled_before, after, limit)
        finally:
            conn.execute("COMMIT")
        return sorted([*((float(s), str(k)) for s, k in calls), *books])[:limit]

    # -- writes (the writer thread) ---------------------------------------------------------

    def write(self, batch: CommitBatch, encoded: Sequence[tuple[int, str]]) -> None:
        """One batch in one transaction: its events (``encoded``: ``(partition, JSON)`` each,
        in order), call states, books, switches, raw intents of approval requests and dead
        letters. Safe from any thread (the runtime's writer thread calls it)."""
        with self._write_lock:
            before = self.last_seq
            try:
                with transaction(self._writes) as conn:
                    if encoded:
                        conn.executemany(
                            _INSERT_EVENT,
                            [(before + 1 + n, p, text) for n, (p, text) in enumerate(encoded)],
                        )
                    self._put_states(conn, batch)
                    state_table.put_batch(conn, batch)
                    if batch.approval_intents:
                        conn.executemany(
                            "INSERT INTO intents (call_key, at, arguments_json) VALUES (?, ?, ?)",
                            [_intent_row(i) for i in batch.approval_intents],
                        )
                    if batch.dead_letters:
                        conn.executemany(
                            "INSERT INTO dead_letters (partition, offset, reason, value) "
                            "VALUES (?, ?, ?, ?)",
                            [
                                (d.partition, d.offset, d.reason, d.value)
                                for d in batch.dead_letters
                            ],
                        )
            except BaseException:
                self.last_seq = before
                raise
            self.last_seq = before + len(encoded)
            self._written = [
                (before + 1 + n, partition, event)
                for n, (event, partition) in enumerate(
                    zip(batch.events, batch.partitions, strict=True)
                )
            ]

    @staticmethod
    def _put_states(conn: sqlite3.Connection, batch: CommitBatch) -> None:
        if batch.expired:
            # the row keeps its last call for support; the key is new again
            expired_at = {
                e.call_key: e.envelope.occurred_at.isoformat()
                for e in batch.events
                if isinstance(e, ToolCallKeyExpired)
            }
            conn.executemany(
                "UPDATE tool_calls SET expired_at = ?, settled_at = NULL WHERE call_id = ?",
                [(expired_at.get(k), call_id_of(k)) for k in batch.expired],
            )
        if batch.states:
            created, changed = [], []
            for key, state in batch.states.items():
                values = call_values(key, state)
                if key in batch.created:  # a new call (its key may have a row: expired)
                    created.append(values)
                else:  # a call's next state: what can change, its indexed identity kept
                    changed.append(tuple(values[i] for i in _UPDATED))
            if created:
                conn.executemany(_UPSERT_CALL, created)
            if changed:
                conn.executemany(_UPDATE_CALL, changed)

    def tail(self, limit: int = 4096) -> int:
        """Derive the read model of events written since its position (at most ``limit``),
        in one transaction that moves its position; returns how many. The events of the
        last write are taken as they are; any before them (a derivation that failed, or a
        crash after the write) are read back from the log. Not fsynced: a crash loses at
        most this work, done again from the position (the next synced commit syncs it with
        its own)."""
        with self._write_lock:
            after = self._derived
            if after >= self.last_seq:
                return 0
            written = self._written
            if written and written[0][0] == after + 1:
                events = written[:limit]
            else:
                events = [
                    (seq, partition, self._decoded(seq, partition, text))
                    for seq, partition, text in self._writes.execute(
                        "SELECT seq, partition, event FROM events WHERE seq > ? "
                        "ORDER BY seq LIMIT ?",
                        (after, limit),
                    )
                ]
            if not events:  # deleted meanwhile (retention): nothing to derive up to there
                self._derived = self.last_seq
                return 0
            upto = events[-1][0]
            conn = self._writes
            conn.execute("PRAGMA synchronous=OFF")
            try:
                with transaction(conn):
                    self.read_model.derive(conn, events)
                    conn.execute(
                        "INSERT INTO positions VALUES (?, ?) ON CONFLICT (consumer) "
                        "DO UPDATE SET position = excluded.position",
                        (READ_MODEL, upto),
                    )
            finally:
                conn.execute(f"PRAGMA synchronous={self._synchronous}")
            self._derived = upto
            return len(events)

    @property
    def derived(self) -> int:
        """The read model's position: events with ``seq`` up to this are in it."""
        return self._derived

    def probe(self) -> None:
        """One small committed write (raises if the ledger cannot commit now: a full disk, a
        read-only file system)."""
        with self._write_lock, transaction(self._writes) as conn:
            conn.execute(
                "INSERT INTO meta VALUES ('write_probe', '1') ON CONFLICT (k) "
                "DO UPDATE SET v = CAST(v AS INTEGER) + 1"
            )

    @contextlib.contextmanager
    def locked_write(self) -> Iterator[sqlite3.Connection]:
        """The write connection inside a transaction, under the ledger's write lock: for what
        another module writes to the file in the ledger's process (the audit retention),
        ordered with the writer's transactions rather than racing them."""
        with self._write_lock, transaction(self._writes) as conn:
            yield conn

    def prune_intents(self, before: float, limit: int = 5_000) -> int:
        """Delete raw intents recorded before ``before`` (epoch seconds): their retention is
        the retention of sensitive data. Returns how many went."""
        with self._write_lock, transaction(self._writes) as conn:
            return conn.execute(
                "DELETE FROM intents WHERE seq IN "
                "(SELECT seq FROM intents WHERE at < ? ORDER BY seq LIMIT ?)",
                (before, limit),
            ).rowcount

    def vacuum(self) -> tuple[int, int]:
        """Checkpoint the WAL and rewrite the file without its free pages; returns the bytes
        before and after."""
        before = self.size()
        with self._write_lock:
            self._writes.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._writes.execute("VACUUM")
            self._writes.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return before, self.size()

    def size(self) -> int:
        """Bytes on disk: the file and its WAL."""
        return sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal")) if p.exists())

    def close(self) -> None:
        """Checkpoint the WAL into the file, close, release the lock."""
        with self._write_lock:
            try:
                self.conn.close()  # first: an open read would hold the checkpoint back
                self._writes.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:  # e.g. a full disk: the WAL stays, and is replayed
                log.warning(
                    "WAL checkpoint failed", extra={"path": str(self.path), "error": str(exc)}
                )
            finally:
                self._writes.close()
                self._unlock()

    # -- the log ----------------------------------------------------------------------------

    def events(self) -> Iterator[tuple[int, int, Event]]:
        """Every event in log order: ``(seq, partition, event)``."""
        after = 0
        while rows := self.conn.execute(
            "SELECT seq, partition, event FROM events WHERE seq > ? ORDER BY seq LIMIT 512",
            (after,),
        ).fetchall():
            for seq, partition, text in rows:
                yield seq, partition, self._decoded(seq, partition, text)
            after = rows[-1][0]

    def rebuild(self) -> int:
        """``toolledger replay``: fold ``tool_calls`` from the log (an expired key's row keeps
        its last call) and derive the read model again; returns the events read. Nothing is
        decided meanwhile: the CLI opens the file itself (no executor), a running ledger
        drains its executor first."""
        with self._write_lock, transaction(self._writes) as conn:
            events = [
                self._decoded(seq, partition, text)
                for seq, partition, text in conn.execute(
                    "SELECT seq, partition, event FROM events ORDER BY seq"
                )
            ]
            refold(conn, self.read_model, events)
            self._derived = 0
            self._written = []
        while self.tail():
            pass
        return len(events)

    def _decoded(self, seq: int, partition: int, text: str) -> Event:
        try:
            return event_of_json(text)
        except (ValueError, KeyError) as exc:
            raise LedgerFileError(
                f"{self.path}: the event at seq {seq} (partition {partition}) does not "
                f"decode: {exc}"
            ) from None

    @staticmethod
    def _position(conn: sqlite3.Connection) -> int:
        row = conn.execute(
            "SELECT position FROM positions WHERE consumer = ?", (READ_MODEL,)
        ).fetchone()
        return 0 if row is None else int(row[0])

    def _last_seq(self, conn: sqlite3.Connection) -> int:
        """The last ``seq`` given: the log's last, or the read model's position if the
        retention deleted every event up to it (a ``seq`` is never given twice, so the
        position only moves forward)."""
        row = conn.execute("SELECT MAX(seq) FROM events").fetchone()
        return max(self._derived, 0 if row[0] is None else int(row[0]))


def create(conn: sqlite3.Connection, read_model: ReadModel) -> None:
    """The ledger's tables and the read model's, inside the caller's transaction."""
    _run(conn, _CALLS_DDL)
    state_table.create(conn)
    _run(conn, read_model.ddl)


def refold(conn: sqlite3.Connection, read_model: ReadModel, events: Sequence[Event]) -> None:
    """``tool_calls`` folded from ``events`` (the whole log, in order) and the read model
    dropped, to be derived again from the start; inside the caller's transaction."""
    read_model.drop(conn)
    _run(conn, read_model.ddl)
    conn.execute("DELETE FROM tool_calls")
    states = _fold_keeping_last(events)
    conn.executemany(_UPSERT_CALL, [call_values(k, s) for k, s in states.items()])
    conn.executemany(
        "UPDATE tool_calls SET expired_at = ?, settled_at = NULL WHERE call_id = ?",
        [(when, call_id_of(key)) for key, when in _expiries(events)],
    )
    conn.execute("DELETE FROM positions WHERE consumer = ?", (READ_MODEL,))


def _connect(path: Path, synchronous: str) -> sqlite3.Connection:
    """A connection with the ledger's settings (each connection has its own)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    # the WAL is reused after each checkpoint; past this size it is cut back, so a burst does
    # not leave a WAL of its peak size behind
    conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
    return conn


def _run(conn: sqlite3.Connection, script: str) -> None:
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def _meta(conn: sqlite3.Connection, path: Path, key: str) -> str:
    row = conn.execute("SELECT v FROM meta WHERE k = ?", (key,)).fetchone()
    if row is None:
        raise LedgerFileError(f"{path}: meta key {key!r} is missing")
    return str(row[0])


def _states(conn: sqlite3.Connection, sql: str, params: Sequence[object]) -> dict[str, CallState]:
    found: dict[str, CallState] = {}
    for values in conn.execute(sql, params):
        state = state_of_values(values)
        found[state.context.call_key] = state
    return found


def _intent_row(intent: ToolCallRequested) -> tuple[str, float, str]:
    return intent.call_key, time.time(), intent.arguments_json


def _fold_keeping_last(events: Sequence[Event]) -> dict[str, CallState]:
    """Each key's state after the log, or its last call's when the key expired."""
    current: dict[str, CallState] = {}
    last: dict[str, CallState] = {}
    for event in events:
        if not event.envelope.idempotency_key:
            continue
        key = event.call_key
        after = evolve(current.get(key), event)
        if after is None:
            current.pop(key, None)
        else:
            current[key] = last[key] = after
    return last


def _expiries(events: Sequence[Event]) -> list[tuple[str, str]]:
    """``(call_key, when)`` of the keys whose last word is an expiry (no call after it)."""
    last: dict[str, str | None] = {}
    for event in events:
        if isinstance(event, ToolCallKeyExpired):
            last[event.call_key] = event.envelope.occurred_at.isoformat()
        elif isinstance(event, ToolCallStarted):
            last[event.call_key] = None
    return [(key, when) for key, when in last.items() if when is not None]
