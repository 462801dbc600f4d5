"""The call groups' log and read model, written once over a :class:`~projections.dialect.Dialect`.

- ``group_log``: the orchestrator's events, in order per group (the source of its state);
  ``group_meta``: who submitted the group, when, and whether it has finished;
- ``tool_call_groups`` (one row per group, its resource) and ``tool_call_group_steps`` (one
  row per step, for support staff's searches by call or tool): the read model, written in the
  same transaction as each event, from the group's view.

:class:`SqliteGroupLog` keeps them in the embedded ledger file (tables made here);
:mod:`projections.postgres_groups` in PostgreSQL (tables made by migration 0004)."""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from toolledger.processors.groups.codec import GroupDecodeError, appended_at, decode_event
from toolledger.processors.groups.core import fold
from toolledger.processors.groups.facts import StepTool
from toolledger.processors.groups.views import GroupMeta, group_view
from toolledger.projections.dialect import SQLITE, Dialect, Query
from toolledger.schemas.groups import GroupView

log_ = logging.getLogger("toolledger.groups")

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


def appended(d: Dialect, meta: GroupMeta, events: Sequence[str], view: GroupView) -> list[Query]:
    """One append: the group's meta (first time), its new events, whether it has finished,
    and its read-model rows. Run them in one transaction."""
    m = d.mark
    return [
        (
            "INSERT INTO group_meta (group_id, tenant_id, principal, scopes_json, group_key,"
            f" created_at) VALUES ({m}, {m}, {m}, {m}, {m}, {m})"
            " ON CONFLICT (group_id) DO NOTHING",
            (
                meta.group_id,
                meta.tenant_id,
                meta.principal,
                json.dumps(list(meta.scopes)),
                meta.group_key,
                d.time(meta.created_at),
            ),
        ),
        *(
            (f"INSERT INTO group_log (group_id, event_json) VALUES ({m}, {m})", (meta.group_id, e))
            for e in events
        ),
        (
            f"UPDATE group_meta SET finished = {m} WHERE group_id = {m}",
            (view.finished, meta.group_id),
        ),
        *group_rows(d, meta.tenant_id, view),
    ]


def meta_query(d: Dialect, group_id: str) -> Query:
    return (
        "SELECT tenant_id, principal, scopes_json, group_key, created_at FROM group_meta"
        f" WHERE group_id = {d.mark}",
        (group_id,),
    )


def events_query(d: Dialect, group_id: str) -> Query:
    return (f"SELECT event_json FROM group_log WHERE group_id = {d.mark} ORDER BY seq", (group_id,))


UNFINISHED: Query = (
    "SELECT group_id FROM group_meta WHERE finished = FALSE ORDER BY created_at",
    (),
)


def meta_of(group_id: str, row: Sequence[Any]) -> GroupMeta:
    created = row[4] if isinstance(row[4], datetime) else datetime.fromisoformat(row[4])
    return GroupMeta(group_id, row[0], row[1], tuple(json.loads(row[2])), row[3], created)


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


# -- rebuilding the read model from the group log (``toolledger replay``) --------------------

GROUP_IDS: Query = ("SELECT group_id FROM group_meta ORDER BY created_at, group_id", ())
CLEAR_READ_MODEL: tuple[Query, ...] = (
    ("DELETE FROM tool_call_group_steps", ()),
    ("DELETE FROM tool_call_groups", ()),
)
# a stored group was valid when it was accepted: a lower step limit set since must not make
# it unreadable (only a tool that is gone or changed does)
_STORED_MAX_STEPS = 1_000_000


def rebuilt_rows(
    d: Dialect, meta: GroupMeta, texts: Sequence[str], tools: Mapping[str, StepTool]
) -> list[Query]:
    """One group's read-model rows, folded again from its log, as they were after its last
    event (``updated_at`` is that event's time). Raises :class:`GroupDecodeError` if a stored
    event no longer decodes with ``tools``."""
    state = fold([decode_event(t, tools, _STORED_MAX_STEPS) for t in texts])
    if state is None:
        return []
    times = [at for at in map(appended_at, texts) if at is not None]
    return group_rows(
        d, meta.tenant_id, group_view(meta, state, times[-1] if times else meta.created_at, tools)
    )


class RebuildableGroupLog(Protocol):
    """What a rebuild needs of a backend's group log: read every group, then swap the read
    model in one transaction."""

    async def group_ids(self) -> list[str]: ...

    async def load(self, group_id: str) -> tuple[GroupMeta, list[str]] | None: ...

    async def replace_read_model(self, queries: Sequence[Query]) -> None: ...


@dataclass
class GroupRebuild:
    groups: int = 0
    unreadable: list[str] = field(default_factory=list)  # their rows are left out, logged


async def rebuild_read_model(
    log: RebuildableGroupLog, d: Dialect, tools: Mapping[str, StepTool]
) -> GroupRebuild:
    """Drop ``tool_call_groups`` and ``tool_call_group_steps`` and fold them again from the
    group log: the read model is a projection of the log, nothing in it is its own."""
    done = GroupRebuild()
    queries: list[Query] = list(CLEAR_READ_MODEL)
    for group_id in await log.group_ids():
        stored = await log.load(group_id)
        if stored is None:
            continue
        try:
            queries += rebuilt_rows(d, *stored, tools)
        except GroupDecodeError as exc:
            log_.error("group %s cannot be rebuilt: %s", group_id, exc)
            done.unreadable.append(group_id)
            continue
        done.groups += 1
    await log.replace_read_model(queries)
    return done


class SqliteGroupLog:
    """The group log in the embedded ledger file, written on the event loop (no await inside)
    in one short transaction per append, as the executor's commits are. One process holds the
    file (its lock), so it drives every group: a claim always holds."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        with self._transaction():
            for statement in DDL.split(";"):
                if statement.strip():
                    conn.execute(statement)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    async def claim(self, group_id: str) -> bool:
        return True

    async def append(self, meta: GroupMeta, events: Sequence[str], view: GroupView) -> None:
        with self._transaction():
            for sql, params in appended(SQLITE, meta, events, view):
                self._conn.execute(sql, params)

    async def load(self, group_id: str) -> tuple[GroupMeta, list[str]] | None:
        row = self._conn.execute(*meta_query(SQLITE, group_id)).fetchone()
        if row is None:
            return None
        events = [r[0] for r in self._conn.execute(*events_query(SQLITE, group_id))]
        return meta_of(group_id, row), events

    async def unfinished(self) -> list[str]:
        return [r[0] for r in self._conn.execute(*UNFINISHED)]

    async def search(self, tenant_id: str, run_id: str | None, limit: int) -> list[GroupView]:
        sql, params = search_groups(SQLITE, tenant_id, run_id, limit)
        return views(self._conn.execute(sql, params))

    async def group_ids(self) -> list[str]:
        return [r[0] for r in self._conn.execute(*GROUP_IDS)]

    async def replace_read_model(self, queries: Sequence[Query]) -> None:
        with self._transaction():
            for sql, params in queries:
                self._conn.execute(sql, params)
