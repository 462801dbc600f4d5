"""A Kafka executor's local store of one owned partition: what Kafka Streams keeps in RocksDB.

The tables of :mod:`processors.runtime.state_table` in an SQLite file on local disk, a cache
of the partition of the compacted ``state`` topic, with the changelog offset it reflects
(the *checkpoint*), written in the same transaction as the pairs it covers. So:

* a restart on the same disk reads only the topic's tail, from the checkpoint;
* a takeover on a new host (no file) restores the partition once, into the file; the
  executor's memory holds only its working set (:mod:`processors.runtime.key_cache`);
* a file that does not belong to this topic partition (another cluster, group, topic or
  partition count), that is ahead of its topic (the topic was recreated), or that cannot be
  read is rebuilt from the topic, with a log line: it is only a cache, never the truth.

Durability: ``synchronous=NORMAL`` in WAL mode (no fsync per commit). A crash of the process
loses nothing; a power loss may lose the last commits *with* their checkpoint, and the next
start reads them from the topic again.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from processors.ports import Snapshot
from processors.runtime import state_table
from processors.runtime.state_table import Reader, StateMeta, transaction

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


class LocalStore:
    def __init__(self, path: Path, identity: Mapping[str, str]) -> None:
        """Open the store at ``path`` for the partition ``identity`` names (cluster, group,
        topic, partition, partition count); a store of anything else is rebuilt empty."""
        self.path = Path(path)
        self.identity = {"format": FORMAT, **identity}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = self._open()
        except sqlite3.DatabaseError as exc:
            self.rebuild(f"it cannot be read ({exc})")
        self._reader = Reader(self.path)

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
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        return self._open()

    def close(self) -> None:
        self._reader.close()
        self.conn.close()

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

    # -- reads --------------------------------------------------------------------------------

    def live(self) -> Snapshot:
        return state_table.live(self.conn, self.identity_partition)

    @property
    def reader(self) -> Reader:
        """Key states for the worker's threads."""
        return self._reader


class _Mismatch(Exception):
    pass


def _render(identity: Mapping[str, str]) -> str:
    return ",".join(f"{k}={identity[k]}" for k in sorted(identity))
