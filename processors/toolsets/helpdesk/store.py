"""The helpdesk's downstream: a small SQLite system that records every real side effect.

It deliberately does *not* deduplicate by idempotency key: a double execution shows up as two
effects, which is what the tests and the demo count (by tenant, tool and key). It can be
queried by call id, the key the tools forward, which is what their reconcile hooks do: unlike
the caller's key it names one call whatever the key scope (under "tenant+principal", two
principals' calls may share a key).
"""

from __future__ import annotations

import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from toolledger.schemas.keys import CallKey

_DDL = """
CREATE TABLE IF NOT EXISTS effects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id TEXT NOT NULL, tool TEXT NOT NULL, idempotency_key TEXT NOT NULL,
    resource_id TEXT NOT NULL, data TEXT NOT NULL, call_id TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS effects_by_key ON effects (tenant_id, tool, idempotency_key);
CREATE TABLE IF NOT EXISTS tickets (
    ticket_id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, title TEXT NOT NULL,
    body TEXT NOT NULL, priority TEXT NOT NULL, status TEXT NOT NULL);
"""


def holds_effects(path: Path) -> bool:
    """Whether the store at ``path`` recorded a side effect, read without writing (no store,
    or one that cannot be read, holds none)."""
    if not path.is_file():
        return False
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return conn.execute("SELECT 1 FROM effects LIMIT 1").fetchone() is not None
        finally:
            conn.close()
    except sqlite3.Error:
        return False


class DeadlineExceeded(Exception):
    """The request arrived after its deadline: refused, nothing written."""


class HelpdeskStore:
    """The store in the SQLite file ``path``, made when it is first used (or :meth:`open`):
    loading the tools to read their manifests (``toolledger replay``) writes nothing."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._opened: sqlite3.Connection | None = None
        self._opening = threading.Lock()
        self._lock = threading.Lock()  # one write transaction at a time

    def open(self) -> HelpdeskStore:
        """Make the file now (its directory too): :class:`sqlite3.Error` if it cannot be."""
        with self._opening:
            if self._opened is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(
                    self.path, isolation_level=None, check_same_thread=False, timeout=30.0
                )
                try:
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.executescript(_DDL)
                    _add_call_ids(conn)
                    conn.execute("CREATE INDEX IF NOT EXISTS effects_by_call ON effects (call_id)")
                except BaseException:
                    conn.close()
                    raise
                self._opened = conn
        return self

    @property
    def _conn(self) -> sqlite3.Connection:
        if self._opened is None:
            self.open()
        assert self._opened is not None
        return self._opened

    def close(self) -> None:
        if self._opened is not None:
            self._opened.close()
            self._opened = None

    def record(
        self,
        tenant_id: str,
        tool: str,
        key: str,
        call_id: str,
        resource_id: str,
        data: str,
        ticket: tuple[str, str, str] | None = None,
        *,
        deadline: datetime | None = None,
    ) -> int:
        """One real side effect (and, for tickets, the ticket row) in one transaction.

        Like a downstream that honours request deadlines, it refuses a request whose deadline
        has passed, checked inside the write transaction: an executor paused past its
        deadline cannot add an effect after another owner took the call over.
        """
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                if deadline is not None and datetime.now(UTC) > deadline:
                    raise DeadlineExceeded(f"{tool}: the request arrived after its deadline")
                cur = self._conn.execute(
                    "INSERT INTO effects (tenant_id, tool, idempotency_key, call_id, resource_id, "
                    "data) VALUES (?, ?, ?, ?, ?, ?)",
                    (tenant_id, tool, key, call_id, resource_id, data),
                )
                if ticket is not None:
                    title, body, priority = ticket
                    self._conn.execute(
                        "INSERT INTO tickets VALUES (?, ?, ?, ?, ?, 'open')",
                        (resource_id, tenant_id, title, body, priority),
                    )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            return int(cur.lastrowid or 0)

    def find(self, call_id: str) -> tuple[str, str] | None:
        """The first effect recorded for this call: ``(resource_id, data)``."""
        row = self._conn.execute(
            "SELECT resource_id, data FROM effects WHERE call_id = ? ORDER BY seq LIMIT 1",
            (call_id,),
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    def effect_count(self, tenant_id: str, tool: str, key: str) -> int:
        row = self._conn.execute(
            "SELECT COUNT(*) FROM effects WHERE tenant_id = ? AND tool = ? AND idempotency_key = ?",
            (tenant_id, tool, key),
        ).fetchone()
        return int(row[0])

    def effect_counts(self) -> dict[tuple[str, str, str], int]:
        return {
            (t, tool, k): int(n)
            for t, tool, k, n in self._conn.execute(
                "SELECT tenant_id, tool, idempotency_key, COUNT(*) FROM effects "
                "GROUP BY tenant_id, tool, idempotency_key"
            )
        }

    def ticket(self, tenant_id: str, ticket_id: str) -> dict[str, Any] | None:
        row = self._conn.execute(
            "SELECT ticket_id, title, priority, status FROM tickets WHERE tenant_id = ? AND "
            "ticket_id = ?",
            (tenant_id, ticket_id),
        ).fetchone()
        if row is None:
            return None
        return {"ticket_id": row[0], "title": row[1], "priority": row[2], "status": row[3]}

    def tickets(self, tenant_id: str) -> list[dict[str, Any]]:
        return [
            {"ticket_id": r[0], "title": r[1], "priority": r[2], "status": r[3]}
            for r in self._conn.execute(
                "SELECT ticket_id, title, priority, status FROM tickets WHERE tenant_id = ? "
                "ORDER BY ticket_id",
                (tenant_id,),
            )
        ]

    def close_ticket(
        self,
        tenant_id: str,
        ticket_id: str,
        key: str,
        call_id: str,
        *,
        deadline: datetime | None = None,
    ) -> bool:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                if deadline is not None and datetime.now(UTC) > deadline:
                    raise DeadlineExceeded("close_ticket: the request arrived after its deadline")
                cur = self._conn.execute(
                    "UPDATE tickets SET status = 'closed' WHERE tenant_id = ? AND ticket_id = ?",
                    (tenant_id, ticket_id),
                )
                if cur.rowcount:
                    self._conn.execute(
                        "INSERT INTO effects (tenant_id, tool, idempotency_key, call_id, "
                        "resource_id, data) VALUES (?, 'close_ticket', ?, ?, ?, '{}')",
                        (tenant_id, key, call_id, ticket_id),
                    )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            return bool(cur.rowcount)


def _add_call_ids(conn: sqlite3.Connection) -> None:
    """A store made before effects named their call: its keys were the tenant's, so each
    effect's call id is its tenant-scoped key's."""
    conn.execute("BEGIN IMMEDIATE")  # all or nothing: a column half filled stays ''
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(effects)")}
        if "call_id" not in columns:
            conn.execute("ALTER TABLE effects ADD COLUMN call_id TEXT NOT NULL DEFAULT ''")
            rows = conn.execute(
                "SELECT seq, tenant_id, tool, idempotency_key FROM effects"
            ).fetchall()
            conn.executemany(
                "UPDATE effects SET call_id = ? WHERE seq = ?",
                [(CallKey(t, tool, key).call_id, seq) for seq, t, tool, key in rows],
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
