"""The call groups' read model: ``tool_call_groups`` (one row per group, its resource) and
``tool_call_group_steps`` (one row per step, for support staff's searches by call or tool).
Written in the group log's transaction with each group event, from the group's view."""

from __future__ import annotations

import json
import sqlite3

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


class SqliteGroupProjection:
    ddl = DDL

    def apply(self, conn: sqlite3.Connection, tenant_id: str, view: GroupView) -> None:
        conn.execute(
            "INSERT INTO tool_call_groups (group_id, tenant_id, idempotency_key, run_id, status,"
            " created_at, updated_at, view_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (group_id) DO UPDATE SET status = excluded.status,"
            " updated_at = excluded.updated_at, view_json = excluded.view_json",
            (
                view.group_id,
                tenant_id,
                view.idempotency_key,
                view.run_id,
                view.status,
                view.created_at.isoformat(),
                view.updated_at.isoformat(),
                view.model_dump_json(),
            ),
        )
        conn.executemany(
            "INSERT INTO tool_call_group_steps (group_id, step_id, position, tool, status,"
            " call_id, compensation_status, compensation_call_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (group_id, step_id) DO UPDATE SET"
            " status = excluded.status, call_id = excluded.call_id,"
            " compensation_status = excluded.compensation_status,"
            " compensation_call_id = excluded.compensation_call_id",
            [
                (
                    view.group_id,
                    step.id,
                    position,
                    step.tool,
                    step.status,
                    step.call_id,
                    step.compensation.status if step.compensation else None,
                    step.compensation.call_id if step.compensation else None,
                )
                for position, step in enumerate(view.steps)
            ],
        )


class SqliteGroupReads:
    """Searches of the groups of one tenant (newest first)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    async def search(self, tenant_id: str, run_id: str | None, limit: int) -> list[GroupView]:
        sql = "SELECT view_json FROM tool_call_groups WHERE tenant_id = ?"
        params: list[object] = [tenant_id]
        if run_id is not None:
            sql += " AND run_id = ?"
            params.append(run_id)
        sql += " ORDER BY created_at DESC, group_id LIMIT ?"
        params.append(limit)
        return [
            GroupView.model_validate(json.loads(row[0])) for row in self._conn.execute(sql, params)
        ]
