"""The embedded group log: group events in the ledger file, one row each, in order per group.

Written on the event loop (no await inside) in one short transaction with the group's
projection rows (as the executor's commits are), so a group's read model is never ahead of or
behind its events."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from processors.groups.views import GroupMeta
from processors.runtime.state_table import transaction
from schemas.groups import GroupView

DDL = """
CREATE TABLE IF NOT EXISTS group_log (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    group_id TEXT NOT NULL,
    event_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS group_log_by_group ON group_log (group_id, seq);
CREATE TABLE IF NOT EXISTS group_meta (
    group_id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    principal TEXT NOT NULL,
    scopes_json TEXT NOT NULL,
    group_key TEXT NOT NULL,
    created_at TEXT NOT NULL,
    finished INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS group_meta_unfinished ON group_meta (finished, group_id);
"""

_FINISHED = {"SUCCEEDED", "FAILED", "COMPENSATED", "NEEDS_ATTENTION"}


class GroupProjection(Protocol):
    ddl: str

    def apply(self, conn: sqlite3.Connection, tenant_id: str, view: GroupView) -> None: ...


class SqliteGroupLog:
    def __init__(self, conn: sqlite3.Connection, projection: GroupProjection) -> None:
        self._conn = conn
        self._projection = projection
        with transaction(conn):
            for statement in (DDL + projection.ddl).split(";"):
                if statement.strip():
                    conn.execute(statement)

    async def append(self, meta: GroupMeta, events: Sequence[str], view: GroupView) -> None:
        with transaction(self._conn):
            self._conn.execute(
                "INSERT INTO group_meta (group_id, tenant_id, principal, scopes_json, group_key,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (group_id) DO NOTHING",
                (
                    meta.group_id,
                    meta.tenant_id,
                    meta.principal,
                    json.dumps(list(meta.scopes)),
                    meta.group_key,
                    meta.created_at.isoformat(),
                ),
            )
            self._conn.executemany(
                "INSERT INTO group_log (group_id, event_json) VALUES (?, ?)",
                [(meta.group_id, e) for e in events],
            )
            self._conn.execute(
                "UPDATE group_meta SET finished = ? WHERE group_id = ?",
                (int(view.status in _FINISHED), meta.group_id),
            )
            self._projection.apply(self._conn, meta.tenant_id, view)

    async def load(self, group_id: str) -> tuple[GroupMeta, list[str]] | None:
        row = self._conn.execute(
            "SELECT tenant_id, principal, scopes_json, group_key, created_at FROM group_meta"
            " WHERE group_id = ?",
            (group_id,),
        ).fetchone()
        if row is None:
            return None
        meta = GroupMeta(
            group_id,
            row[0],
            row[1],
            tuple(json.loads(row[2])),
            row[3],
            datetime.fromisoformat(row[4]),
        )
        events = [
            r[0]
            for r in self._conn.execute(
                "SELECT event_json FROM group_log WHERE group_id = ? ORDER BY seq", (group_id,)
            )
        ]
        return meta, events

    async def claim(self, group_id: str) -> bool:
        return True  # one process holds the ledger file (its lock): it drives every group

    async def unfinished(self) -> list[str]:
        return [
            r[0]
            for r in self._conn.execute(
                "SELECT group_id FROM group_meta WHERE finished = 0 ORDER BY created_at"
            )
        ]
