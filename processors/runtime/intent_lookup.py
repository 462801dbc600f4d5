"""Raw arguments of a call, read back from the embedded log's intents: what a human who
decides an approval is shown. Raw arguments live only in intents (their retention is the
retention of sensitive data); they are never copied into projections, logs or spans, so they
are read from the intents themselves, through a read-only connection of its own.

An intent is found by its call key (stored as its fingerprint: ``key_fingerprint``, then
checked in the decoded intent) in the intents partition of the key, near the time the
approval was requested: the partition's time index (one mark a minute, ``log_marks``) bounds
the range read, so a lookup reads a few minutes of one partition whatever the ledger's size.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from datetime import datetime, timedelta
from pathlib import Path

from processors.runtime.sqlite_log import INTENTS, key_fingerprint
from schemas.codec import CodecError, decode
from schemas.events import ToolCallRequested
from schemas.keys import partition_for
from schemas.packing import unpack

WINDOW = timedelta(minutes=2)  # before the request (an intent waits in the log that long)
MAX_CANDIDATES = 64  # intents of one key in the window: a key is asked again, not flooded


class SqliteIntentLookup:
    """``arguments(call_key, around)``: the raw ``arguments_json`` of the intents of a call key
    appended within :data:`WINDOW` of ``around``, newest first."""

    def __init__(self, path: Path, partitions: int) -> None:
        self._path = path
        self._partitions = partitions
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # one read at a time on the connection

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            uri = f"file:{self._path}?mode=ro"
            self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        return self._conn

    async def arguments(self, call_key: str, around: datetime) -> list[str]:
        return await asyncio.to_thread(self._read, call_key, around)

    def _read(self, call_key: str, around: datetime) -> list[str]:
        key = call_key.encode("utf-8")
        partition = partition_for(key, self._partitions)
        start, end = (around - WINDOW).timestamp(), (around + WINDOW).timestamp()
        with self._lock:
            conn = self._connection()
            low = conn.execute(
                "SELECT MAX(offset) FROM log_marks WHERE topic = ? AND partition = ? AND at <= ?",
                (INTENTS, partition, start),
            ).fetchone()[0]
            high = conn.execute(
                "SELECT MIN(offset) FROM log_marks WHERE topic = ? AND partition = ? AND at > ?",
                (INTENTS, partition, end),
            ).fetchone()[0]
            rows = conn.execute(
                "SELECT value FROM log WHERE topic = ? AND partition = ? AND offset >= ? "
                # the fingerprint, or the whole key (as a file made before stored it)
                "AND offset < ? AND key IN (?, ?) ORDER BY offset DESC LIMIT ?",
                (
                    INTENTS,
                    partition,
                    low if low is not None else 0,
                    high if high is not None else 1 << 62,
                    key_fingerprint(key),
                    key,
                    MAX_CANDIDATES,
                ),
            ).fetchall()
        found = []
        for (value,) in rows:
            try:
                event = decode(unpack(value))
            except CodecError:
                continue  # dead-lettered by the executor: never an approval's intent
            if isinstance(event, ToolCallRequested) and event.envelope.call_key == call_key:
                found.append(event.arguments_json)
        return found

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
