"""The governance read side (approvals, kill switches, metrics, run budgets), shared by the
SQLite and PostgreSQL adapters: only the SQL dialect differs between them.

Everything is a view over ``tool_calls`` and ``tool_call_events`` (nothing is written when an
event is applied), so ``toolledger replay`` gives the views back by construction. Each
database defines three *fact* views in its own dialect (JSON and time extraction):
``approval_events``, ``switch_changes`` and ``call_event_facts``; the views on top of them
are written once, here (:func:`portable_views`), and are the same text in both databases
(``projections/migrations/0002_governance.sql`` holds them for PostgreSQL; a test keeps the
two equal). The queries below read those views, written once over the adapter's
:class:`~projections.dialect.Dialect`.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from toolledger.projections.dialect import Dialect, Query, aware
from toolledger.schemas.calls import (
    APPROVAL_STATUSES,
    STAT_COUNTS,
    ApprovalPage,
    ApprovalView,
    RunUsage,
    Stats,
    SwitchView,
    ToolStats,
    decode_approval_cursor,
    encode_approval_cursor,
)

# ------------------------------------------------------------------------------ the views


def _portable_block(migration: str, name: str) -> str:
    """The statements between the ``-- BEGIN name`` and ``-- END name`` markers of a
    migration."""
    text = (Path(__file__).parent / "migrations" / migration).read_text()
    found = re.search(rf"^-- BEGIN {name}.*?\n(.*)^-- END {name}$", text, re.M | re.S)
    if found is None:
        raise RuntimeError(f"migration {migration} lost its {name} block")
    return found.group(1)


def _portable_views_sql() -> str:
    """The views between the BEGIN and END markers of migration 0002, with the database's
    clock (``now()`` there) as the placeholder ``{now}``: one text for both databases."""
    block = _portable_block("0002_governance.sql", "portable views")
    if block.count("now()") != 1:
        raise RuntimeError("migration 0002 lost its portable views block")
    return block.replace("now()", "{now}")


PORTABLE_VIEWS_SQL = _portable_views_sql()
"""The views written once for both databases, in creation order, over the fact views
``approval_events``, ``switch_changes`` and ``call_event_facts``. ``{now}``: the database's
clock. No ';' except at the end of each statement (the SQLite rebuild splits on it)."""

PORTABLE_VIEWS: tuple[str, ...] = tuple(
    re.findall(r"^CREATE VIEW (\w+) AS$", PORTABLE_VIEWS_SQL, re.M)
)


DAILY_VIEWS_SQL = _portable_block("0008_analytics.sql", "portable daily views")
"""``tool_metrics_daily`` (migration 0008), one text for both databases (no clock, no
dialect), over two day fact views a database defines in its own dialect: ``call_day_facts``
(tenant_id, tool_name, day, status, run_id: every ``tool_calls`` row on the UTC day it was
created) and ``event_day_facts`` (tenant_id, tool_name, day, intent_id, event_type,
error_code, duration_ms: every call event on the UTC day it occurred)."""


def portable_views(now: str) -> str:
    """:data:`PORTABLE_VIEWS_SQL` for a database whose clock is the SQL expression ``now``."""
    return PORTABLE_VIEWS_SQL.replace("{now}", now)


# ---------------------------------------------------------------------------- reading times


def _time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise TypeError(f"not a time: {value!r}")
    return aware(value)


# ------------------------------------------------------------------------------ approvals

_APPROVAL_COLUMNS = (
    "tenant_id, approval_id, call_key, call_id, tool, idempotency_key, args_digest, run_id, "
    "arguments_json, impact_json, requested_by, requested_at, state, expires_at, approver, "
    "decided_at, reason, consumed_at"
)


def _status_at(d: Dialect) -> str:
    return (
        f"CASE WHEN state IN ('pending', 'approved') AND expires_at <= {d.mark} "
        "THEN 'expired' ELSE state END"
    )


def approval_sql(
    d: Dialect, tenant_id: str | None, approval_id: str, now: datetime
) -> tuple[str, list[Any]]:
    where, params = [f"approval_id = {d.mark}"], [d.time(now), approval_id]
    if tenant_id is not None:
        where.append(f"tenant_id = {d.mark}")
        params.append(tenant_id)
    sql = (
        f"SELECT {_APPROVAL_COLUMNS}, {_status_at(d)} AS status_at FROM approvals "
        f"WHERE {' AND '.join(where)} ORDER BY requested_at, tenant_id{d.collate} LIMIT 1"
    )
    return sql, params


def call_approval_sql(
    d: Dialect, tenant_id: str, call_id: str, now: datetime
) -> tuple[str, list[Any]]:
    """The latest approval request of one call (a call key asks again with new arguments:
    the newest request is the one that answers it)."""
    return _latest_approval_sql(d, {"tenant_id": tenant_id, "call_id": call_id}, now)


def key_approval_sql(
    d: Dialect, tenant_id: str, tool: str, idempotency_key: str, now: datetime
) -> tuple[str, list[Any]]:
    """The latest approval request under a tool's key, of whichever principal."""
    where = {"tenant_id": tenant_id, "tool": tool, "idempotency_key": idempotency_key}
    return _latest_approval_sql(d, where, now)


def _latest_approval_sql(
    d: Dialect, where: Mapping[str, str], now: datetime
) -> tuple[str, list[Any]]:
    clauses = " AND ".join(f"{column} = {d.mark}" for column in where)
    sql = (
        f"SELECT {_APPROVAL_COLUMNS}, {_status_at(d)} AS status_at FROM approvals "
        f"WHERE {clauses} ORDER BY requested_at DESC, approval_id{d.collate} DESC LIMIT 1"
    )
    return sql, [d.time(now), *where.values()]


def approvals_sql(
    d: Dialect,
    tenant_id: str | None,
    status: str | None,
    now: datetime,
    limit: int,
    after: str | None,
) -> tuple[str, list[Any]]:
    """``ValueError``: an unknown ``status`` or a bad cursor."""
    if status is not None and status not in APPROVAL_STATUSES:
        raise ValueError(f"unknown approval status {status!r}")
    if limit < 1:
        raise ValueError("limit must be at least 1")
    m, c = d.mark, d.collate
    inner: list[Any] = [d.time(now)]
    inner_where = ""
    if tenant_id is not None:
        inner_where = f" WHERE tenant_id = {m}"
        inner.append(tenant_id)
    outer: list[str] = []
    params: list[Any] = []
    if status is not None:
        outer.append(f"status_at = {m}")
        params.append(status)
    if after is not None:
        at, approval_id, tenant = decode_approval_cursor(after)
        outer.append(
            f"(requested_at > {m} OR (requested_at = {m} AND (approval_id{c} > {m} "
            f"OR (approval_id = {m} AND tenant_id{c} > {m}))))"
        )
        params += [d.time(at), d.time(at), approval_id, approval_id, tenant]
    sql = (
        f"SELECT * FROM (SELECT {_APPROVAL_COLUMNS}, {_status_at(d)} AS status_at "
        f"FROM approvals{inner_where}) x"
        + (f" WHERE {' AND '.join(outer)}" if outer else "")
        + f" ORDER BY requested_at, approval_id{c}, tenant_id{c} LIMIT {int(limit) + 1}"
    )
    return sql, inner + params


def _json(text: str | None) -> Any:
    return json.loads(text) if text is not None else None


def approval_of(row: Mapping[str, Any]) -> ApprovalView:
    impact = _json(row["impact_json"])
    return ApprovalView(
        approval_id=row["approval_id"],
        call_key=row["call_key"],
        call_id=row["call_id"],
        tenant_id=row["tenant_id"],
        tool=row["tool"],
        idempotency_key=row["idempotency_key"],
        args_digest=row["args_digest"],
        arguments=_json(row["arguments_json"]),
        impact=impact if isinstance(impact, dict) else {},
        status=row["status_at"],
        requested_by=row["requested_by"],
        requested_at=_time(row["requested_at"]),
        expires_at=_time(row["expires_at"]),
        approver=row["approver"],
        decided_at=_time(row["decided_at"]),
        reason=row["reason"],
        consumed_at=_time(row["consumed_at"]),
        run_id=row["run_id"],
    )


def approval_page_of(rows: Sequence[Mapping[str, Any]], limit: int) -> ApprovalPage:
    views = [approval_of(r) for r in rows[:limit]]
    more = len(rows) > limit
    return ApprovalPage(views, encode_approval_cursor(views[-1]) if more and views else None)


# ------------------------------------------------------------------------------- switches


def switches_sql(d: Dialect, tenant_id: str) -> tuple[str, list[Any]]:
    return (
        "SELECT tenant_id, tool, enabled, reason, actor, changed_at FROM tool_switches "
        f"WHERE tenant_id IN ({d.mark}, '*') ORDER BY tenant_id{d.collate}, tool{d.collate}",
        [tenant_id],
    )


def switch_of(row: Mapping[str, Any]) -> SwitchView:
    return SwitchView(
        tenant_id=row["tenant_id"],
        tool=row["tool"],
        enabled=bool(row["enabled"]),
        reason=row["reason"],
        actor=row["actor"],
        changed_at=_time(row["changed_at"]),
    )


# -------------------------------------------------------------------------------- metrics

_COUNT_COLUMNS = ", ".join(STAT_COUNTS)


def tool_stats_sql(d: Dialect, tenant_id: str | None) -> tuple[str, list[Any]]:
    where, params = ("", []) if tenant_id is None else (f" WHERE tenant_id = {d.mark}", [tenant_id])
    return f"SELECT tool_name, {_COUNT_COLUMNS} FROM tool_metrics{where}", params


def tenant_stats_sql(d: Dialect, tenant_id: str | None) -> tuple[str, list[Any]]:
    where, params = ("", []) if tenant_id is None else (f" WHERE tenant_id = {d.mark}", [tenant_id])
    return f"SELECT {_COUNT_COLUMNS} FROM tenant_metrics{where}", params


def _summed(tool: str, rows: Iterable[Mapping[str, Any]]) -> ToolStats:
    total = ToolStats(tool)
    for row in rows:
        total = replace(total, **{n: getattr(total, n) + int(row[n]) for n in STAT_COUNTS})
    return total


def stats_of(
    tenant_id: str | None,
    tool_rows: Sequence[Mapping[str, Any]],
    tenant_rows: Sequence[Mapping[str, Any]],
) -> Stats:
    """Per tool: the ``tool_metrics`` rows of the tool summed over the tenants asked for (run
    ids belong to a tenant, so runs add up across tenants); totals: the ``tenant_metrics``
    rows summed (runs counted once per tenant, not once per tool). Rates: from the sums."""
    by_tool: dict[str, list[Mapping[str, Any]]] = {}
    for row in tool_rows:
        by_tool.setdefault(row["tool_name"], []).append(row)
    return Stats(
        tenant_id=tenant_id,
        tools=[_summed(tool, by_tool[tool]) for tool in sorted(by_tool)],
        totals=_summed("*", tenant_rows),
    )


assert {f.name for f in fields(ToolStats)} == {"tool", *STAT_COUNTS}

# ------------------------------------------------------------------------------ run usage


def run_usage_sql(d: Dialect, tenant_id: str, run_id: str, tool: str) -> tuple[str, list[Any]]:
    m = d.mark
    return (
        "SELECT a.attempts, f.fingerprint, f.repeats FROM (SELECT count(*) AS attempts "
        f"FROM tool_call_events WHERE tenant_id = {m} AND run_id = {m} "
        "AND event_type = 'ToolCallStarted') a LEFT JOIN (SELECT fingerprint, count(*) AS repeats "
        f"FROM call_event_facts WHERE tenant_id = {m} AND run_id = {m} AND tool_name = {m} "
        "AND event_type = 'ToolCallFailed' AND disposition <> 'RETRY' GROUP BY fingerprint "
        f"ORDER BY count(*) DESC, fingerprint{d.collate} LIMIT 1) f ON 1 = 1",
        [tenant_id, run_id, tenant_id, run_id, tool],
    )


def run_usage_of(rows: Sequence[Mapping[str, Any]]) -> RunUsage:
    row = rows[0]
    return RunUsage(
        attempts=int(row["attempts"]),
        repeats=int(row["repeats"] or 0),
        fingerprint=row["fingerprint"],
    )


class GovernanceReads(ABC):
    """The governance half of :class:`schemas.calls.CallQueries`, written once: an adapter
    gives its dialect and how it runs queries (several in one snapshot)."""

    dialect: Dialect

    @abstractmethod
    async def _read(self, *queries: Query) -> list[list[dict[str, Any]]]:
        """The rows of each query, all read from one snapshot of the projection."""

    async def approval(
        self, tenant_id: str | None, approval_id: str, *, now: datetime
    ) -> ApprovalView | None:
        (rows,) = await self._read(approval_sql(self.dialect, tenant_id, approval_id, now))
        return approval_of(rows[0]) if rows else None

    async def call_approval(
        self, tenant_id: str, call_id: str, *, now: datetime
    ) -> ApprovalView | None:
        (rows,) = await self._read(call_approval_sql(self.dialect, tenant_id, call_id, now))
        return approval_of(rows[0]) if rows else None

    async def key_approval(
        self, tenant_id: str, tool: str, idempotency_key: str, *, now: datetime
    ) -> ApprovalView | None:
        query = key_approval_sql(self.dialect, tenant_id, tool, idempotency_key, now)
        (rows,) = await self._read(query)
        return approval_of(rows[0]) if rows else None

    async def approvals(
        self,
        tenant_id: str | None,
        *,
        status: str | None,
        now: datetime,
        limit: int,
        after: str | None,
    ) -> ApprovalPage:
        query = approvals_sql(self.dialect, tenant_id, status, now, limit, after)
        (rows,) = await self._read(query)
        return approval_page_of(rows, limit)

    async def switches(self, tenant_id: str) -> list[SwitchView]:
        (rows,) = await self._read(switches_sql(self.dialect, tenant_id))
        return [switch_of(r) for r in rows]

    async def stats(self, tenant_id: str | None) -> Stats:
        tools, tenants = await self._read(
            tool_stats_sql(self.dialect, tenant_id), tenant_stats_sql(self.dialect, tenant_id)
        )
        return stats_of(tenant_id, tools, tenants)

    async def run_usage(self, tenant_id: str, run_id: str, tool: str) -> RunUsage:
        (rows,) = await self._read(run_usage_sql(self.dialect, tenant_id, run_id, tool))
        return run_usage_of(rows)
