"""The call groups' read model: ``tool_call_groups`` (one row per group, its resource) and
``tool_call_group_steps`` (one row per step, for support staff's searches by call or tool).
Written in the group log's transaction with each group event, from the group's view; the
queries are written once over a :class:`~projections.dialect.Dialect`. The SQLite tables are
made here; PostgreSQL's by migration 0004."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from projections.dialect import SQLITE, Dialect, Query
from schemas.groups import GroupView

DDL = """
CREATE TABLE IF NOT EXISTS tool_call_groups (
    group_id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    run_id TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    view_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tool_call_groups_by_run ON tool_call_groups (tenant_id, run_id);
CREATE TABLE IF NOT EXISTS tool_call_group_steps (
    group_id TEXT NOT NULL,
    step_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    tool TEXT NOT NULL,
    status TEXT NOT NULL,
    call_id TEXT,
    compensation_status TEXT,
    compensation_call_id TEXT,
    PRIMARY KEY (group_id, step_id)
);
CREATE INDEX IF NOT EXISTS tool_call_group_steps_by_call ON tool_call_group_steps (call_id);
"""


def group_rows(d: Dialect, tenant_id: str, view: GroupView) -> list[Query]:
    """The upserts of one group's rows after an event: the group, then each step."""
    m = d.mark
    queries: list[Query] = [
        (
            "INSERT INTO tool_call_groups (group_id, tenant_id, idempotency_key, run_id, status,"
            f" created_at, updated_at, view_json) VALUES ({m}, {m}, {m}, {m}, {m}, {m}, {m}, {m})"
            " ON CONFLICT (group_id) DO UPDATE SET status = excluded.status,"
            " updated_at = excluded.updated_at, view_json = excluded.view_json",
            (
                view.group_id,
                tenant_id,
                view.idempotency_key,
                view.run_id,
                view.status,
                d.time(view.created_at),
                d.time(view.updated_at),
                view.model_dump_json(),
            ),
        )
    ]
    for position, step in enumerate(view.steps):
        compensation = step.compensation
        queries.append(
            (
                "INSERT INTO tool_call_group_steps (group_id, step_id, position, tool, status,"
                " call_id, compensation_status, compensation_call_id)"
                f" VALUES ({m}, {m}, {m}, {m}, {m}, {m}, {m}, {m})"
                " ON CONFLICT (group_id, step_id) DO UPDATE SET status = excluded.status,"
                " call_id = excluded.call_id,"
                " compensation_status = excluded.compensation_status,"
                " compensation_call_id = excluded.compensation_call_id",
                (
                    view.group_id,
                    step.id,
                    position,
                    step.tool,
                    step.status,
                    step.call_id,
                    compensation.status if compensation else None,
                    compensation.call_id if compensation else None,
                ),
            )
        )
    return queries


def search_groups(d: Dialect, tenant_id: str, run_id: str | None, limit: int) -> Query:
    """The groups of a tenant (of one run), newest first."""
    sql = f"SELECT view_json FROM tool_call_groups WHERE tenant_id = {d.mark}"
    params: list[object] = [tenant_id]
    if run_id is not None:
        sql += f" AND run_id = {d.mark}"
        params.append(run_id)
    sql += f" ORDER BY created_at DESC, group_id{d.collate} LIMIT {d.mark}"
    params.append(limit)
    return sql, params


def views(rows: Iterable[Sequence[Any]]) -> list[GroupView]:
    return [GroupView.model_validate(json.loads(row[0])) for row in rows]


class SqliteGroupProjection:
    """What the embedded group log is handed: the rows, in the log's transaction."""

    ddl = DDL

    def apply(self, conn: sqlite3.Connection, tenant_id: str, view: GroupView) -> None:
        for sql, params in group_rows(SQLITE, tenant_id, view):
            conn.execute(sql, params)


class SqliteGroupReads:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    async def search(self, tenant_id: str, run_id: str | None, limit: int) -> list[GroupView]:
        sql, params = search_groups(SQLITE, tenant_id, run_id, limit)
        return views(self._conn.execute(sql, params))
