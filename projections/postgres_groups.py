"""The call groups' log and read model in PostgreSQL, for the Kafka + PostgreSQL front door.

A group is driven by one front door at a time: :meth:`PostgresGroupLog.claim` takes a
session-level advisory lock on the group id on a connection this log keeps open, so another
front door (or one started after a crash, once the old session is gone) drives it only when
the first no longer can.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from processors.groups.views import GroupMeta
from projections.dialect import POSTGRES
from projections.groups import group_rows, search_groups, views
from projections.postgres import PostgresProjection
from schemas.groups import GroupView

_FINISHED = {"SUCCEEDED", "FAILED", "COMPENSATED", "NEEDS_ATTENTION"}
_LOCK_CLASS = 0x7467  # "tg": the advisory lock class of group claims


class PostgresGroupLog:
    def __init__(self, projection: PostgresProjection, dsn: str) -> None:
        self._projection = projection
        self._dsn = dsn
        self._claims: psycopg.AsyncConnection[Any] | None = None

    async def open(self) -> None:
        self._claims = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True)

    async def close(self) -> None:
        if self._claims is not None:
            await self._claims.close()  # releases every claim of this front door
            self._claims = None

    async def claim(self, group_id: str) -> bool:
        assert self._claims is not None, "open() the group log first"
        key = int.from_bytes(hashlib.sha256(group_id.encode()).digest()[:4], "big", signed=True)
        cur = await self._claims.execute("SELECT pg_try_advisory_lock(%s, %s)", (_LOCK_CLASS, key))
        row = await cur.fetchone()
        return bool(row and row[0])

    async def append(self, meta: GroupMeta, events: Sequence[str], view: GroupView) -> None:
        async with self._projection._transaction("append group events") as conn:
            await conn.execute(
                "INSERT INTO group_meta (group_id, tenant_id, principal, scopes_json, group_key,"
                " created_at) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (group_id) DO NOTHING",
                (
                    meta.group_id,
                    meta.tenant_id,
                    meta.principal,
                    json.dumps(list(meta.scopes)),
                    meta.group_key,
                    meta.created_at,
                ),
            )
            async with conn.cursor() as cur:
                await cur.executemany(
                    "INSERT INTO group_log (group_id, event_json) VALUES (%s, %s)",
                    [(meta.group_id, e) for e in events],
                )
            await conn.execute(
                "UPDATE group_meta SET finished = %s WHERE group_id = %s",
                (view.status in _FINISHED, meta.group_id),
            )
            for sql, params in group_rows(POSTGRES, meta.tenant_id, view):
                await conn.execute(sql, params)

    async def load(self, group_id: str) -> tuple[GroupMeta, list[str]] | None:
        async with self._projection._transaction("read a group") as conn:
            cur = await conn.execute(
                "SELECT tenant_id, principal, scopes_json, group_key, created_at FROM group_meta"
                " WHERE group_id = %s",
                (group_id,),
            )
            row = await cur.fetchone()
            if row is None:
                return None
            events = await conn.execute(
                "SELECT event_json FROM group_log WHERE group_id = %s ORDER BY seq", (group_id,)
            )
            texts = [r[0] for r in await events.fetchall()]
        created: datetime = row[4]
        meta = GroupMeta(group_id, row[0], row[1], tuple(json.loads(row[2])), row[3], created)
        return meta, texts

    async def unfinished(self) -> list[str]:
        async with self._projection._transaction("read unfinished groups") as conn:
            cur = await conn.execute(
                "SELECT group_id FROM group_meta WHERE NOT finished ORDER BY created_at"
            )
            return [r[0] for r in await cur.fetchall()]

    async def search(self, tenant_id: str, run_id: str | None, limit: int) -> list[GroupView]:
        sql, params = search_groups(POSTGRES, tenant_id, run_id, limit)
        async with self._projection._transaction("search groups") as conn:
            cur = await conn.execute(sql.encode(), params)
            return views(await cur.fetchall())
