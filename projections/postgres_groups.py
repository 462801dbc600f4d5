"""The call groups' log and read model in PostgreSQL, for the Kafka + PostgreSQL front door.

A group is driven by one front door at a time: :meth:`PostgresGroupLog.claim` takes a
session-level advisory lock on the group id on a connection this log keeps open, so another
front door (or one started after a crash, once the old session is gone) drives it only when
the first no longer can.

``group_log`` is also the outbox of the groups topic (:mod:`projections.group_relay`);
``on_append`` tells the relay of each append.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from toolledger.processors.groups.views import GroupMeta
from toolledger.projections.dialect import POSTGRES, Query
from toolledger.projections.groups import (
    GROUP_IDS,
    UNFINISHED,
    appended,
    events_query,
    meta_of,
    meta_query,
    search_groups,
    views,
)
from toolledger.projections.postgres import PostgresProjection
from toolledger.schemas.groups import GroupView

_LOCK_CLASS = 0x7467  # "tg": the advisory lock class of group claims


class PostgresGroupLog:
    def __init__(
        self,
        projection: PostgresProjection,
        dsn: str,
        *,
        on_append: Callable[[], None] = lambda: None,
    ) -> None:
        self._projection = projection
        self._dsn = dsn
        self._on_append = on_append
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
            for sql, params in appended(POSTGRES, meta, events, view):
                await conn.execute(sql.encode(), params)
        self._on_append()

    async def load(self, group_id: str) -> tuple[GroupMeta, list[str]] | None:
        async with self._projection._transaction("read a group") as conn:
            sql, params = meta_query(POSTGRES, group_id)
            row = await (await conn.execute(sql.encode(), params)).fetchone()
            if row is None:
                return None
            sql, params = events_query(POSTGRES, group_id)
            texts = [r[0] for r in await (await conn.execute(sql.encode(), params)).fetchall()]
        return meta_of(group_id, row), texts

    async def unfinished(self) -> list[str]:
        async with self._projection._transaction("read unfinished groups") as conn:
            cur = await conn.execute(UNFINISHED[0].encode())
            return [r[0] for r in await cur.fetchall()]

    async def search(self, tenant_id: str, run_id: str | None, limit: int) -> list[GroupView]:
        sql, params = search_groups(POSTGRES, tenant_id, run_id, limit)
        async with self._projection._transaction("search groups") as conn:
            cur = await conn.execute(sql.encode(), params)
            return views(await cur.fetchall())

    async def group_ids(self) -> list[str]:
        async with self._projection._transaction("read group ids") as conn:
            cur = await conn.execute(GROUP_IDS[0].encode())
            return [r[0] for r in await cur.fetchall()]

    async def replace_read_model(self, queries: Sequence[Query]) -> None:
        async with self._projection._transaction("rebuild the group read model") as conn:
            for sql, params in queries:
                await conn.execute(sql.encode(), params)
