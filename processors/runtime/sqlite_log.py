"""The embedded log: partitioned topics, consumer positions and call state in one SQLite file.

Same partitioning function, same encoded events and same offsets as on Kafka, so a file can
be exported and replayed into Kafka. Every write that matters is one SQLite transaction:
outcome events + call states + input position + projections together.

Two connections, so that the log's writes can run on a thread of their own (the embedded
runtime's writer) while the event loop reads: the log's own writes (:meth:`SqliteLog.write`,
:meth:`~SqliteLog.append`, :meth:`~SqliteLog.probe`, :meth:`~SqliteLog.prune`,
:meth:`~SqliteLog.vacuum`, :meth:`~SqliteLog.rebuild_projections`, and others' through
:meth:`~SqliteLog.locked_write`) go through a private write
connection, one at a time under a lock, from whichever thread calls them; ``conn`` is the
connection of the event loop's thread (reads, and what others write on their own, such as the
group log). An sqlite3 connection is never used by two threads at once, and SQLite's own
locking orders the two connections' transactions (WAL: a reader sees the last commit).

The projections (the read model in the same file) are not this module's: the log is handed a
:class:`LogProjection` (the composition root gives it ``projections.sqlite.SqliteProjection``)
and calls it inside its own transactions. See docs/architecture.md#the-event-flow.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol

from processors.ledger import CallState
from processors.ports import CommitBatch, Snapshot
from processors.runtime import state_table
from processors.runtime.ledger_file import (
    LedgerFileError,
    check_identity,
    check_readable,
    must_create,
    read_only,
    record_identity,
    traces,
    write_failure,
)
from processors.runtime.state_table import CallStates, Reader, transaction
from schemas.codec import CodecError, decode
from schemas.events import Event
from schemas.packing import EVENTS, unpack
from schemas.topics import Position

__all__ = [
    "EXECUTOR",
    "FORMAT",
    "INTENTS",
    "OUTCOMES",
    "OWN_KEY",
    "LedgerFileError",
    "LogProjection",
    "SqliteLog",
]

log = logging.getLogger("toolledger.embedded")

FORMAT = "toolledger-embedded/1"
INTENTS = "intents"
OUTCOMES = "outcomes"
EXECUTOR = "executor"
# The stored key of an outcome record: none, its event holds it (the call key). Outcomes are
# read by position (offsets, the audit rows' pointers), never by key, so the key is not
# stored twice. An intent's key is stored as its fingerprint (key_fingerprint): what the
# approval view finds a call's intents by, before it decodes them.
OWN_KEY = b""


def key_fingerprint(key: bytes) -> bytes:
    """What an intent's key is stored as (its event holds the key itself): ``k`` and 8 bytes
    of its BLAKE2b digest. The fixed first byte keeps the rule that only a packed value
    starts with ``schemas.packing.MARK`` in the file (a search of the file unpacks those)."""
    return b"k" + hashlib.blake2b(key, digest_size=8).digest()


WAL_SIZE_LIMIT = 64 << 20
MARK_INTERVAL_S = 60.0  # a partition's time index (per topic): one (offset, time) mark a minute

_DDL = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS log (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    key BLOB NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (topic, partition, offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log_marks (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (topic, partition, offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS positions (
    consumer TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL, PRIMARY KEY (consumer, topic, partition));
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, partition INTEGER NOT NULL,
    offset INTEGER NOT NULL, reason TEXT NOT NULL, value BLOB NOT NULL,
    UNIQUE (topic, partition, offset));
"""


class LogProjection(CallStates, Protocol):
    """The read model the log keeps in its own file, written in the transaction of the
    events it folds (so it is never behind the log, nor ahead of it). Its call rows are the
    executor's call states too (:class:`~processors.runtime.state_table.CallStates`): the
    states it is handed in :meth:`apply` are the executor's, so each is stored once."""

    @property
    def ddl(self) -> str:
        """The tables, indexes and views, as one script (statements end with ``;`` and hold no
        other ``;``: a rebuild runs them one by one in a transaction)."""

    def migrate(self, conn: sqlite3.Connection) -> None:
        """Bring tables made by an earlier version up to date (inside a transaction)."""

    def apply(
        self,
        conn: sqlite3.Connection,
        events: Sequence[tuple[Event, Position]],
        states: Mapping[str, CallState] | None = None,
    ) -> None:
        """Fold ``events`` into the tables, inside the caller's transaction. ``states``: the
        call states after them, when the caller folded them already."""

    def drop(self, conn: sqlite3.Connection) -> None:
        """Drop every table and view of the read model (a rebuild creates them again)."""

    def put_states(
        self, conn: sqlite3.Connection, partition: int, states: Mapping[str, CallState]
    ) -> None:
        """Write executor states of ``partition`` as they are (a file whose states were kept
        in the executor's own table hands them over once)."""

    def keep_outcomes(self, conn: sqlite3.Connection, partition: int, first: int, stop: int) -> int:
        """Outcome records ``[first, stop)`` of ``partition`` are about to be deleted (inside
        the caller's transaction): copy what the read model still reads of them (its audit
        rows point at the records instead of holding a copy). Returns the records copied."""


class SqliteLog:
    def __init__(
        self,
        path: Path,
        *,
        projection: LogProjection,
        partitions: int = 4,
        synchronous: str = "FULL",
        create: bool | None = None,
    ) -> None:
        """Open the ledger at ``path``. ``create``: True to make it if it does not exist, False
        never to, None (default) only in a new, empty directory. ``projection``: the read model
        kept in the file, written in the log's transactions (the composition root hands it
        ``projections.sqlite.SqliteProjection``). Raises :class:`LedgerFileError` (one line
        naming the file) and then has written nothing."""
        self.projection = projection
        self.path = Path(path)
        new = must_create(self.path, create)  # before the lock: a refusal leaves no trace
        if new and traces(self.path):  # asked to, but a ledger was here: say so
            log.warning(
                "creating a new, empty ledger where one was before", extra={"path": str(path)}
            )
        self._lock_file: IO[str] | None = None
        self._lock()
        try:
            if not new:
                check_readable(self.path)
                check_identity(self.path, self._check_format())
            try:
                self._writes = self._open(synchronous)
                self.partitions = self._init_meta(partitions)
                self.epoch = self._bump_epoch()
                self.conn = self._connect(synchronous)
                record_identity(self.path, self.meta("ledger_id"))
            except (sqlite3.Error, OSError) as exc:
                raise write_failure(self.path, exc) from None
        except BaseException:
            self._unlock()
            raise
        # held for every use of the write connection and of the offsets below, which only its
        # transactions move
        self._write_lock = threading.Lock()
        self._next: dict[tuple[str, int], int] = {}
        self._marked: dict[tuple[str, int], float] = {}  # when each partition was last marked
        self.mark_interval_s = MARK_INTERVAL_S
        self.reader = Reader(self.path, projection)  # key states for the workers' threads

    # -- opening ----------------------------------------------------------------------------

    def _lock(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(f"{self.path}.lock", "w")  # noqa: SIM115 - held for the log's lifetime
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

    def _check_format(self) -> str | None:
        """A ledger of this format, read only: another application's database is refused.
        Returns the ledger's id (None: a file made before ledgers had one)."""
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
        return None if identity is None else str(identity[0])

    def _connect(self, synchronous: str) -> sqlite3.Connection:
        """A connection with the ledger's settings (each connection has its own: both write)."""
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        # the WAL is reused after each checkpoint; past this size it is cut back, so a burst
        # does not leave a WAL of its peak size behind
        conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def _open(self, synchronous: str) -> sqlite3.Connection:
        """The write connection, with the tables made and brought up to date: an earlier
        file's read model is migrated before the projection's DDL (whose indexes may need
        the columns a migration adds)."""
        conn = self._connect(synchronous)
        with transaction(conn):
            _run(conn, _DDL)
            state_table.migrate(conn)
            state_table.create(conn)
            self.projection.migrate(conn)
            _run(conn, self.projection.ddl)
            self._hand_over_states(conn)
        return conn

    def _hand_over_states(self, conn: sqlite3.Connection) -> None:
        """A file made before the read model's call rows held the executor's states has them
        in ``call_state``: they are written to the read model (as the executor's own commits
        would have) and cleared here, a chunk at a time, in the opening transaction."""
        after = -1
        while rows := conn.execute(
            "SELECT rowid, call_key, partition, state_json FROM call_state "
            "WHERE rowid > ? AND state_json IS NOT NULL ORDER BY rowid LIMIT 1000",
            (after,),
        ).fetchall():
            after = rows[-1][0]
            by_partition: dict[int, dict[str, CallState]] = {}
            for _, key, partition, stored in rows:
                by_partition.setdefault(partition, {})[key] = state_table.stored_state(stored)
            for partition, states in by_partition.items():
                self.projection.put_states(conn, partition, states)
            state_table.clear_states(conn, [key for _, key, _, _ in rows])
        conn.execute("DELETE FROM call_state WHERE state_json IS NULL AND book_json IS NULL")

    def _init_meta(self, partitions: int) -> int:
        # here and in _bump_epoch, no lock: nothing else has the log before __init__ returns
        with transaction(self._writes) as conn:
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (FORMAT,))
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('partitions', ?)", (str(partitions),))
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

    def probe(self) -> None:
        """One small committed write (raises if the ledger cannot commit now: a full disk, a
        read-only file system)."""
        with self._write_lock, transaction(self._writes) as conn:
            conn.execute(
                "INSERT INTO meta VALUES ('write_probe', '1') ON CONFLICT (k) "
                "DO UPDATE SET v = CAST(v AS INTEGER) + 1"
            )

    def vacuum(self) -> tuple[int, int]:
        """Checkpoint the WAL and rewrite the file without its free pages (space left by
        expired keys' states and by deleted records); returns the bytes before and after."""
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
        """Checkpoint the WAL into the file, close, release the lock. Waits for a write in
        progress on another thread; a write after this fails (the connection is closed)."""
        with self._write_lock:
            try:
                self.reader.close()
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

    def _next_offset(self, topic: str, partition: int) -> int:
        key = (topic, partition)
        if key not in self._next:
            row = self._writes.execute(
                "SELECT MAX(offset) FROM log WHERE topic = ? AND partition = ?", key
            ).fetchone()
            self._next[key] = 0 if row[0] is None else row[0] + 1
        return self._next[key]

    def _append(self, topic: str, records: Sequence[tuple[int, bytes, bytes]]) -> list[int]:
        offsets = []
        rows = []
        now = time.time()
        marks = []
        for partition, key, value in records:
            offset = self._next_offset(topic, partition)
            self._next[(topic, partition)] = offset + 1
            offsets.append(offset)
            stored_key = key_fingerprint(key) if topic == INTENTS else key
            rows.append((topic, partition, offset, stored_key, EVENTS.pack(value)))
            if now - self._marked.get((topic, partition), float("-inf")) >= self.mark_interval_s:
                self._marked[(topic, partition)] = now
                marks.append((topic, partition, offset, now))
        self._writes.executemany("INSERT INTO log VALUES (?, ?, ?, ?, ?)", rows)
        if marks:  # one per partition and mark interval: most appends have none
            self._writes.executemany("INSERT OR REPLACE INTO log_marks VALUES (?, ?, ?, ?)", marks)
        return offsets

    def prune(self, topic: str, before: float, limit: int = 5_000) -> int:
        """Delete records of ``topic`` appended before ``before`` (epoch seconds, judged by the
        partition's marks), at most ``limit`` per partition, as one range per partition in one
        transaction; returns how many were deleted. The last record of a partition is always
        kept (it carries the partition's next offset).

        * intents: only processed ones (below the executor's position). Raw arguments live
          only in intents: this is their retention.
        * outcomes: every outcome was folded into the read model in its own transaction, so
          any may go; the read model (the audit trail, with its own retention) keeps what it
          still reads of them (:meth:`LogProjection.keep_outcomes`: an audit row points at its
          event's record, and takes a copy only now). The first deletion is recorded
          (``outcomes_pruned``): from then on the read model cannot be rebuilt from the log,
          and :meth:`rebuild_projections` refuses to.
        """
        if topic not in (INTENTS, OUTCOMES):
            raise ValueError(f"no retention for topic {topic!r}")
        deleted = 0
        with self._write_lock, transaction(self._writes) as conn:
            for p in range(self.partitions):
                marked = conn.execute(
                    "SELECT MAX(offset) FROM log_marks WHERE topic = ? AND partition = ? "
                    "AND at <= ?",
                    (topic, p, before),
                ).fetchone()[0]
                first = conn.execute(
                    "SELECT MIN(offset) FROM log WHERE topic = ? AND partition = ?", (topic, p)
                ).fetchone()[0]
                if marked is None or first is None:
                    continue
                upto = min(marked, self._next_offset(topic, p) - 1)
                if topic == INTENTS:
                    upto = min(upto, _position(conn, EXECUTOR, INTENTS, p))
                stop = min(upto, first + limit)
                if stop <= first:
                    continue
                if topic == OUTCOMES:
                    self.projection.keep_outcomes(conn, p, first, stop)
                deleted += conn.execute(
                    "DELETE FROM log WHERE topic = ? AND partition = ? AND offset >= ? "
                    "AND offset < ?",
                    (topic, p, first, stop),
                ).rowcount
                conn.execute(
                    "DELETE FROM log_marks WHERE topic = ? AND partition = ? AND offset < ?",
                    (topic, p, stop),
                )
            if deleted and topic == OUTCOMES:
                conn.execute(
                    "INSERT OR IGNORE INTO meta VALUES ('outcomes_pruned', ?)", (str(time.time()),)
                )
        return deleted

    @contextlib.contextmanager
    def locked_write(self) -> Iterator[sqlite3.Connection]:
        """The write connection inside a transaction, under the log's write lock: for what
        another module writes to the file in the log's process (the audit trail's retention),
        ordered with the writer's transactions here rather than racing them through SQLite's
        busy handler, which a writer committing back to back starves."""
        with self._write_lock, transaction(self._writes) as conn:
            yield conn

    def append(self, topic: str, records: Sequence[tuple[int, bytes, bytes]]) -> list[int]:
        """Append ``(partition, key, value)`` records in one transaction; return their offsets."""
        with self._write_lock:
            try:
                with transaction(self._writes):
                    return self._append(topic, records)
            except BaseException:
                self._next.clear()
                self._marked.clear()
                raise

    def read(
        self, topic: str, partition: int, from_offset: int, limit: int = 512
    ) -> list[tuple[int, bytes]]:
        return _records(self.conn, topic, partition, from_offset, limit)

    def events(self, topic: str = OUTCOMES) -> Iterator[tuple[Event, Position]]:
        """Every event of a topic in log order; a record that does not decode is an error."""
        return self._events(self.conn, topic)

    def _events(self, conn: sqlite3.Connection, topic: str) -> Iterator[tuple[Event, Position]]:
        for partition in range(self.partitions):
            offset = 0
            while batch := _records(conn, topic, partition, offset, 512):
                for offset, value in batch:
                    try:
                        yield decode(value), Position(partition, offset)
                    except CodecError as exc:
                        raise LedgerFileError(
                            f"{self.path}: {topic}[{partition}] offset {offset} does not "
                            f"decode: {exc}"
                        ) from None
                offset += 1

    def position(self, consumer: str, topic: str, partition: int) -> int:
        return _position(self.conn, consumer, topic, partition)

    # -- executor state -----------------------------------------------------------------------

    def load(self, partition: int) -> Snapshot:
        return state_table.live(self.conn, partition, self.projection)

    def write(
        self,
        intents: Sequence[tuple[int, bytes, bytes]],
        batches: Sequence[tuple[CommitBatch, Sequence[bytes]]],
    ) -> list[int]:
        """One transaction (one fsync) for appended intents and executor batches of any
        partitions; returns the intents' offsets. Safe from any thread (the runtime calls it
        from its writer thread)."""
        with self._write_lock:
            try:
                with transaction(self._writes):
                    offsets = self._append(INTENTS, intents) if intents else []
                    for batch, encoded in batches:
                        self._commit_batch(batch, encoded)
                    return offsets
            except BaseException:
                self._next.clear()
                self._marked.clear()
                raise

    def _commit_batch(self, batch: CommitBatch, encoded: Sequence[bytes]) -> None:
        """Outcome events (``encoded``: each event's bytes), call states, dead letters,
        projections and the position."""
        conn = self._writes
        offsets = self._append(OUTCOMES, [(batch.partition, OWN_KEY, v) for v in encoded])
        # the states: in the read model's call rows (projection.apply, below); expired: the
        # book goes, not the audit
        state_table.put_batch(conn, batch, states=False)
        conn.executemany(
            "INSERT OR IGNORE INTO dead_letters (topic, partition, offset, reason, value) "
            "VALUES (?, ?, ?, ?, ?)",
            [(INTENTS, batch.partition, d.offset, d.reason, d.value) for d in batch.dead_letters],
        )
        if batch.next_offset is not None:
            conn.execute(
                "INSERT INTO positions VALUES (?, ?, ?, ?) ON CONFLICT "
                "(consumer, topic, partition) DO UPDATE SET next_offset = excluded.next_offset",
                (EXECUTOR, INTENTS, batch.partition, batch.next_offset),
            )
        self.projection.apply(
            conn,
            [
                (event, Position(batch.partition, offset))
                for event, offset in zip(batch.events, offsets, strict=True)
            ],
            batch.states,
        )

    def rebuild_projections(self) -> int:
        """Drop the projections and fold them again from the outcome log; returns events read.
        Refused (:class:`LedgerFileError`, nothing changed) once outcomes were pruned: a fold
        of what is left would drop the audit trail of every call before it."""
        with self._write_lock, transaction(self._writes) as conn:
            pruned = conn.execute("SELECT v FROM meta WHERE k = 'outcomes_pruned'").fetchone()
            if pruned is not None:
                raise LedgerFileError(
                    f"{self.path}: outcome records past their retention (--outcomes-retention) "
                    "were deleted, so the read model cannot be rebuilt from the log (it would "
                    "lose the audit trail before them); it was left as it is"
                )
            self.projection.drop(conn)
            _run(conn, self.projection.ddl)
            events = list(self._events(conn, OUTCOMES))
            self.projection.apply(conn, events)
        return len(events)


def _run(conn: sqlite3.Connection, script: str) -> None:
    """A script's statements, one by one, in the caller's transaction (no statement holds a
    ``;``: see :attr:`LogProjection.ddl`)."""
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def _meta(conn: sqlite3.Connection, path: Path, key: str) -> str:
    row = conn.execute("SELECT v FROM meta WHERE k = ?", (key,)).fetchone()
    if row is None:
        raise LedgerFileError(f"{path}: meta key {key!r} is missing")
    return str(row[0])


def _records(
    conn: sqlite3.Connection, topic: str, partition: int, from_offset: int, limit: int
) -> list[tuple[int, bytes]]:
    return [
        (int(o), unpack(v))
        for o, v in conn.execute(
            "SELECT offset, value FROM log WHERE topic = ? AND partition = ? AND offset >= ? "
            "ORDER BY offset LIMIT ?",
            (topic, partition, from_offset, limit),
        )
    ]


def _position(conn: sqlite3.Connection, consumer: str, topic: str, partition: int) -> int:
    row = conn.execute(
        "SELECT next_offset FROM positions WHERE consumer = ? AND topic = ? AND partition = ?",
        (consumer, topic, partition),
    ).fetchone()
    return 0 if row is None else int(row[0])
