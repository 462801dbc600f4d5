"""A Kafka executor's local store of one owned partition: what Kafka Streams keeps in RocksDB.

The tables of :mod:`processors.runtime.state_table` in an SQLite file on local disk, a cache
of the partition of the compacted ``state`` topic, with the changelog offset it reflects
(the *checkpoint*), written in the same transaction as the pairs it covers. So:

* a restart on the same disk reads only the topic's tail, from the checkpoint;
* a takeover on a new host (no file) restores the partition once, into a new file that
  takes the store's place once it is whole (:class:`ColdLoad`: rows appended in log order,
  indexes built after them by sorting, not a random index insert per key); the executor's
  memory holds only its working set (:mod:`processors.runtime.key_cache`);
* a file that does not belong to this topic partition (another cluster, group, topic or
  partition count), that is ahead of its topic (the topic was recreated), or that cannot be
  read is rebuilt from the topic, with a log line: it is only a cache, never the truth;
* one process at a time: a store is opened under an exclusive lock on ``<file>.lock`` (as
  Kafka Streams locks a task's state directory), held until it is closed. Executors on one
  host share a state directory by default, and a paused former owner may still hold its
  partition's store when the new owner takes over: the new owner gets :class:`StoreBusy`
  and restores into a store of its own instead (the executor does), never the same file.

Durability: ``synchronous=NORMAL`` in WAL mode (no fsync per commit). A crash of the process
loses nothing; a power loss may lose the last commits *with* their checkpoint, and the next
start reads them from the topic again.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain
from pathlib import Path

from toolledger.processors.ports import KeyEntry, Snapshot
from toolledger.processors.runtime import state_table
from toolledger.processors.runtime.state_table import IN_CALL_STATE, StateMeta, transaction

log = logging.getLogger("toolledger.kafka")

FORMAT = "toolledger-local-store/2"  # /2: 16 KiB pages (a store of /1 is rebuilt)
# A state is about 1 KB: a 4 KiB page holds three or four, and a restore's random key order
# rewrites a page of the key index per key; 16 KiB pages made a cold restore of 1,000,000
# keys into the store alone 30% faster (21 s against 30 s, measured with SQLite alone, no
# Kafka) and the file 13% smaller.
PAGE_SIZE = 16384
# Compaction removes a tombstone once it is older than the state topic's delete.retention.ms
# (24 h, set by ``toolledger topics``): a store whose checkpoint is older than this may have
# missed some, so it is rebuilt rather than read from its checkpoint.
TOMBSTONE_HORIZON_S = 20 * 3600.0

BULK_CACHE_KIB = 64 << 10  # SQLite's page cache while a restore writes (default: 2 MiB)

_META = "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)"


class StoreBusy(RuntimeError):
    """Another process (or another open store in this one) holds the store's lock."""


class LocalStore:
    def __init__(self, path: Path, identity: Mapping[str, str]) -> None:
        """Open the store at ``path`` for the partition ``identity`` names (cluster, group,
        topic, partition, partition count); a store of anything else is rebuilt empty.
        :class:`StoreBusy` if the store is open elsewhere (nothing is touched then)."""
        self.path = Path(path)
        self.identity = {"format": FORMAT, **identity}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = _locked(Path(f"{self.path}.lock"))
        try:
            try:
                self.conn = self._open()
            except sqlite3.DatabaseError as exc:
                self.rebuild(f"it cannot be read ({exc})")
        except BaseException:
            os.close(self._lock)
            raise

    # -- opening ----------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # a new file only: no-op otherwise
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(_META)
            stored = dict(conn.execute("SELECT k, v FROM meta").fetchall())
            if stored and stored.get("identity") != _render(self.identity):
                raise _Mismatch(stored.get("identity", "none"))
            conn.execute("BEGIN IMMEDIATE")
            state_table.create(conn)
            if not stored:
                conn.executemany(
                    "INSERT INTO meta VALUES (?, ?)",
                    [
                        ("identity", _render(self.identity)),
                        ("checkpoint", "0"),
                        ("checkpoint_at", repr(time.time())),
                    ],
                )
            conn.execute("COMMIT")
            return conn
        except _Mismatch as mismatch:
            conn.close()
            return self._rebuilt(f"it belongs to {mismatch}, not {_render(self.identity)}")
        except BaseException:
            conn.close()
            raise

    def rebuild(self, why: str) -> None:
        """Drop the file and start empty (checkpoint 0): the topic is read from its start."""
        self.conn = self._rebuilt(why)

    def _rebuilt(self, why: str) -> sqlite3.Connection:
        log.warning(
            "local state store %s rebuilt from the state topic: %s",
            self.path,
            why,
            extra={"path": str(self.path), "reason": why},
        )
        old = getattr(self, "conn", None)
        if old is not None:
            old.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        return self._open()

    def close(self) -> None:
        try:
            self.conn.close()
        finally:
            if self._lock >= 0:  # once: the number may belong to another file afterwards
                os.close(self._lock)  # and with it the lock: the next owner may open the store
                self._lock = -1

    @contextlib.contextmanager
    def bulk(self) -> Iterator[None]:
        """A larger page cache while a restore writes (its transactions touch a page of the
        key index per key: the cache holds the index's pages between them), the default
        again after it, so the working set, not the cache, is what an owner keeps."""
        default = self.conn.execute("PRAGMA cache_size").fetchone()[0]
        self.conn.execute(f"PRAGMA cache_size={-BULK_CACHE_KIB}")
        try:
            yield
        finally:
            self.conn.execute(f"PRAGMA cache_size={int(default)}")

    # -- the changelog ------------------------------------------------------------------------

    @property
    def checkpoint(self) -> int:
        """The next offset of the state topic partition this store has not seen."""
        row = self.conn.execute("SELECT v FROM meta WHERE k = 'checkpoint'").fetchone()
        return int(row[0])

    def apply(
        self, pairs: Iterable[tuple[str, bytes | None, StateMeta | None]], checkpoint: int | None
    ) -> None:
        """Pairs of the topic (read from it at a restore, or just committed to it by this
        owner), and the offset after them (None: unchanged), in one transaction."""
        with transaction(self.conn):
            state_table.put_pairs(self.conn, self.identity_partition, pairs)
            if checkpoint is not None:
                self._set_checkpoint(checkpoint)

    def _set_checkpoint(self, checkpoint: int) -> None:
        self.conn.executemany(
            "INSERT INTO meta VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v",
            [("checkpoint", str(checkpoint)), ("checkpoint_at", repr(time.time()))],
        )

    @property
    def checkpoint_age_s(self) -> float:
        """Seconds since the store last took a record of the topic (or was made)."""
        row = self.conn.execute("SELECT v FROM meta WHERE k = 'checkpoint_at'").fetchone()
        return 0.0 if row is None else max(0.0, time.time() - float(row[0]))

    @property
    def identity_partition(self) -> int:
        return int(self.identity["partition"])

    def cold_load(self) -> ColdLoad:
        """A load of the whole topic partition into a new file (:meth:`adopt` it once whole);
        for a store that has read nothing yet (checkpoint 0)."""
        return ColdLoad(Path(f"{self.path}.restoring"), self.identity_partition)

    def adopt(self, load: ColdLoad, checkpoint: int) -> None:
        """Make ``load``'s file this store, at ``checkpoint``: its indexes are built, it is
        synced, then renamed over the store's file (a crash before leaves the store as it
        was; the next cold restore starts its file again)."""
        load.finish(self.identity, checkpoint)
        self.conn.close()
        for suffix in ("-wal", "-shm"):  # never replayed onto the new file
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        os.replace(load.path, self.path)
        _sync_directory(self.path.parent)
        self.conn = self._open()

    # -- reads (the executor's, on its loop) ---------------------------------------------------

    def live(self) -> Snapshot:
        return state_table.live(self.conn, self.identity_partition, IN_CALL_STATE)

    def read(self, keys: Sequence[str]) -> Mapping[str, KeyEntry]:
        return state_table.read(self.conn, keys, IN_CALL_STATE)

    def due(
        self, tool: str, settled_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[tuple[float, str]]:
        """Keys of ``tool`` settled at or before ``settled_before``: calls and keys that only
        have a book, merged in order (one cursor for both)."""
        p = self.identity_partition
        states = IN_CALL_STATE.due(self.conn, p, tool, settled_before, after, limit)
        books = state_table.due_rows(
            self.conn, "state_json IS NULL", p, tool, settled_before, after, limit
        )
        return sorted([*states, *books])[:limit]


class ColdLoad:
    """A cold restore's file: the state topic's pairs appended in log order to tables
    without indexes (no syncs: until it is adopted the file is nobody's, and an unfinished one
    is started again), then indexed once, by sorting, in :meth:`finish`.

    The last pair of a key wins as it does in :func:`~processors.runtime.state_table.put_pairs`:
    a chunk keeps its last pair per key, chunks are appended in log order, and ``finish``
    keeps the last row per key (a tombstone's row too, then drops it). Books go to a table of
    their own and are merged into their keys' rows at the end; switches and refused offsets
    (a handful) are written as they come."""

    def __init__(self, path: Path, partition: int) -> None:
        self.path = path
        self._partition = partition
        self._tombstones = False  # whether a state's tombstone was appended
        self.abort()  # what an earlier, unfinished load left
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            for pragma in (
                f"page_size={PAGE_SIZE}",
                # a rollback journal in memory: appended pages need none, and a statement
                # that fails (the key index over a repeated key) is undone
                "journal_mode=MEMORY",
                "synchronous=OFF",
                f"cache_size={-BULK_CACHE_KIB}",
                "threads=2",  # the indexes' sorts in finish, on helper threads
            ):
                self._conn.execute(f"PRAGMA {pragma}")
            self._conn.execute(_META)
            self._conn.execute(state_table.BULK_TABLE)
            self._conn.execute(
                "CREATE TEMP TABLE restore_books "
                "(call_key TEXT NOT NULL, tool TEXT, settled_at REAL, book_json TEXT)"
            )
            state_table.create(self._conn)  # the rest: executor_state (indexes: in finish)
        except BaseException:
            self.abort()
            raise

    def add(self, pairs: Iterable[tuple[str, bytes | None, StateMeta | None]]) -> None:
        """Append pairs of the topic (every pair, in log order: :meth:`finish` keeps the last
        row of each key)."""
        rows = state_table.pair_rows(pairs, self._partition, last_only=False)
        self._tombstones = self._tombstones or any(row[4] is None for row in rows.states)
        with transaction(self._conn) as conn:
            _insert_many(
                conn, "INSERT INTO call_state VALUES ", "(?, ?, ?, ?, ?, NULL)", rows.states
            )
            conn.executemany("INSERT INTO restore_books VALUES (?, ?, ?, ?)", rows.books)
            # the last pair of each (a handful): written in place, not appended
            state_table.put_governance(conn, self._partition, dict(rows.governance).items())

    def finish(self, identity: Mapping[str, str], checkpoint: int) -> None:
        """The last row of each key, the books merged, the indexes, the meta; synced, closed."""
        conn = self._conn
        with transaction(conn):
            try:
                conn.execute(state_table.BULK_KEY_INDEX)
            except sqlite3.IntegrityError:  # a key more than once (the topic's uncompacted head)
                conn.execute(
                    "DELETE FROM call_state WHERE rowid NOT IN "
                    "(SELECT MAX(rowid) FROM call_state GROUP BY call_key)"
                )
                conn.execute(state_table.BULK_KEY_INDEX)
            if self._tombstones:  # (a scan of the whole table)
                conn.execute("DELETE FROM call_state WHERE state_json IS NULL")
            conn.execute(
                # a key's state, where it has one, is what its row is due by
                "INSERT INTO call_state (call_key, partition, tool, settled_at, book_json) "
                "SELECT call_key, ?, tool, settled_at, book_json FROM restore_books "
                "WHERE rowid IN (SELECT MAX(rowid) FROM restore_books GROUP BY call_key) "
                "AND book_json IS NOT NULL "
                "ON CONFLICT (call_key) DO UPDATE SET book_json = excluded.book_json",
                (self._partition,),
            )
            conn.execute("DROP TABLE restore_books")
            state_table.create(conn)  # the due and unresolved indexes
            conn.executemany(
                "INSERT INTO meta VALUES (?, ?)",
                [
                    ("identity", _render(identity)),
                    ("checkpoint", str(checkpoint)),
                    ("checkpoint_at", repr(time.time())),
                ],
            )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.close()
        with open(self.path, "rb") as handle:
            os.fsync(handle.fileno())

    def abort(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None:
            conn.close()
        for suffix in ("", "-journal", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)


_ROWS_PER_STATEMENT = 5000


def _insert_many(
    conn: sqlite3.Connection, insert: str, row: str, rows: Sequence[tuple[object, ...]]
) -> None:
    """``rows`` with up to :data:`_ROWS_PER_STATEMENT` rows per statement: sqlite3 releases
    the GIL for each step of a statement and takes it back after, so one step per row would
    queue this thread behind the event loop's (a restore fetches while it writes) once per
    row."""
    width = row.count("?")
    n = min(_ROWS_PER_STATEMENT, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width)
    whole = len(rows) - len(rows) % n
    if whole:
        many = insert + ", ".join([row] * n)
        conn.executemany(
            many, [tuple(chain.from_iterable(rows[i : i + n])) for i in range(0, whole, n)]
        )
    conn.executemany(insert + row, rows[whole:])


def _sync_directory(directory: Path) -> None:
    """A rename is durable once its directory is synced."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


class _Mismatch(Exception):
    pass


def _render(identity: Mapping[str, str]) -> str:
    return ",".join(f"{k}={identity[k]}" for k in sorted(identity))


def _locked(path: Path) -> int:
    """An open descriptor of ``path`` holding an exclusive lock on it (released when it is
    closed, or when the process ends however it ends), else :class:`StoreBusy`."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreBusy(f"{path.with_suffix('')} is open in another executor") from None
    return fd
