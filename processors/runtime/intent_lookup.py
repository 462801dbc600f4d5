"""Raw arguments of a call that asked for approval, read back from the embedded ledger's
``intents``: what a human who decides an approval is shown. Raw arguments are stored only
there, and only for calls that opened an approval request (their retention is the retention
of sensitive data); they are never copied into the log, the read model, logs or spans. They
are read through a read-only connection of their own.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from datetime import datetime, timedelta
from pathlib import Path

WINDOW = timedelta(minutes=2)  # around the request (an intent waits for its batch that long)
MAX_CANDIDATES = 64  # intents of one key in the window: a key is asked again, not flooded


class SqliteIntentLookup:
    """``arguments(call_key, around)``: the raw ``arguments_json`` of the intents of a call key
    recorded within :data:`WINDOW` of ``around``, newest first."""

    def __init__(self, path: Path) -> None:
        self._path = path
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
        start, end = (around - WINDOW).timestamp(), (around + WINDOW).timestamp()
        with self._lock:
            rows = self._connection().execute(
                "SELECT arguments_json FROM intents WHERE call_key = ? AND at >= ? AND at <= ? "
                "ORDER BY seq DESC LIMIT ?",
                (call_key, start, end, MAX_CANDIDATES),
            )
            return [str(arguments) for (arguments,) in rows]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
