"""The calls half of the read side (get, search, recent, events, applied), written once over
a :class:`~projections.dialect.Dialect`: the SQLite and PostgreSQL adapters only run the
queries (:meth:`CallReads._fetch`, :meth:`CallReads._read`)."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

from toolledger.projections import evaluation, export
from toolledger.projections.dialect import Dialect, Query, parsed_time, within
from toolledger.projections.rows import AUDIT_SELECT, audit_payload
from toolledger.schemas.calls import (
    CallFilter,
    CallView,
    Page,
    decode_recent_cursor,
    encode_cursor,
    encode_recent_cursor,
)
from toolledger.schemas.evaluation import AuditRecord, CallRecord, EvaluationFacts
from toolledger.schemas.groups import GroupView

CALL_SELECT = (
    "SELECT call_id, tenant_id, tool_name, tool_version, idempotency_key, args_digest, status, "
    "result_json, error_json, attempts, run_id, step_id, created_at, updated_at, "
    "last_event_id, last_intent_id, expired_at, state_json, call_key FROM tool_calls"
)


def get_sql(d: Dialect, tenant_id: str, call_id: str) -> Query:
    return f"{CALL_SELECT} WHERE tenant_id = {d.mark} AND call_id = {d.mark}", (tenant_id, call_id)


def search_sql(
    d: Dialect, tenant_id: str, where: CallFilter, limit: int, after: str | None
) -> Query:
    # keyed calls: a read's row (PostgreSQL keeps one for analysts) is found by its id only
    clauses, params = [f"tenant_id = {d.mark}", "idempotency_key <> ''"], [tenant_id]
    for column, value in (
        ("tool_name", where.tool),
        ("idempotency_key", where.idempotency_key),
        ("run_id", where.run_id),
        ("status", where.status.value if where.status else None),
        ("call_id", after),
    ):
        if value is not None:
            clauses.append(f"{column} {'>' if column == 'call_id' else '='} {d.mark}")
            params.append(value)
    if where.reader is not None:
        clauses.append(f"({d.key_principal} IS NULL OR {d.key_principal} = {d.mark})")
        params.append(where.reader)
    sql = f"{CALL_SELECT} WHERE {' AND '.join(clauses)} ORDER BY call_id LIMIT {int(limit) + 1}"
    return sql, params


def page_of(rows: Sequence[dict[str, Any]], limit: int) -> Page:
    views = [CallView.from_row(r) for r in rows[:limit]]
    more = len(rows) > limit
    return Page(views, encode_cursor(views[-1].call_id) if more and views else None)


def recent_sql(d: Dialect, tenant_id: str, limit: int, before: str | None) -> Query:
    """The tenant's calls newest first, after the cursor ``before`` (``ValueError``: not a
    cursor of :func:`recent_page_of`). PostgreSQL reads a page from the index
    ``tool_calls_recent`` (migration 0006); the embedded file has no such index yet and sorts
    the tenant's calls, which is why the adapters run it as a scan (:meth:`CallReads._read`)."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    m, c = d.mark, d.collate
    clauses, params = [f"tenant_id = {m}"], [tenant_id]
    if before is not None:
        at, call_id = decode_recent_cursor(before)
        clauses.append(f"(created_at < {m} OR (created_at = {m} AND call_id{c} < {m}))")
        params += [d.table_time(at), d.table_time(at), call_id]
    sql = (
        f"{CALL_SELECT} WHERE {' AND '.join(clauses)} "
        f"ORDER BY created_at DESC, call_id{c} DESC LIMIT {int(limit) + 1}"
    )
    return sql, params


def recent_page_of(rows: Sequence[dict[str, Any]], limit: int) -> Page:
    views = [CallView.from_row(r) for r in rows[:limit]]
    more = len(rows) > limit
    return Page(views, encode_recent_cursor(views[-1]) if more and views else None)


def events_sql(d: Dialect, tenant_id: str, call_id: str) -> Query:
    return (
        f"SELECT {AUDIT_SELECT} FROM tool_call_events WHERE tenant_id = {d.mark} "
        f"AND call_id = {d.mark} ORDER BY seq",
        (tenant_id, call_id),
    )


def events_of(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The whole events of audit rows."""
    return [audit_payload(r) for r in rows] or None


def applied_sql(d: Dialect, event_id: str) -> Query:
    return f"SELECT 1 FROM tool_call_events WHERE event_id = {d.mark}", (event_id,)


APPLIED_AMONG_MAX = 500  # event ids per lookup (one placeholder each)


def applied_among_sql(d: Dialect, event_ids: Sequence[str]) -> Query:
    marks = ", ".join([d.mark] * len(event_ids))
    return f"SELECT event_id FROM tool_call_events WHERE event_id IN ({marks})", tuple(event_ids)


class CallReads(ABC):
    """The calls half of :class:`schemas.calls.CallQueries`, written once: an adapter gives
    its dialect and how it runs one indexed lookup."""

    dialect: Dialect
    calls_lag = True

    @abstractmethod
    async def _fetch(self, query: Query) -> list[dict[str, Any]]:
        """The rows of one lookup by id or key, as dicts by column name."""

    @abstractmethod
    async def _read(self, *queries: Query) -> list[list[dict[str, Any]]]:
        """The rows of each query, from one snapshot, run as a scan may be: off the event loop
        on the embedded file (the governance reads run the same way)."""

    async def get(self, tenant_id: str, call_id: str) -> CallView | None:
        rows = await self._fetch(get_sql(self.dialect, tenant_id, call_id))
        return CallView.from_row(rows[0]) if rows else None

    async def search(
        self, tenant_id: str, where: CallFilter, *, limit: int, after: str | None
    ) -> Page:
        rows = await self._fetch(search_sql(self.dialect, tenant_id, where, limit, after))
        return page_of(rows, limit)

    async def recent(self, tenant_id: str, *, limit: int, before: str | None) -> Page:
        (rows,) = await self._read(recent_sql(self.dialect, tenant_id, limit, before))
        return recent_page_of(rows, limit)

    async def events(self, tenant_id: str, call_id: str) -> list[dict[str, Any]] | None:
        return events_of(await self._fetch(events_sql(self.dialect, tenant_id, call_id)))

    async def moved(self, timeout_s: float) -> None:
        await asyncio.sleep(timeout_s)

    async def _groups(self, query: Query) -> list[GroupView]:
        d = self.dialect
        (found,) = await self._read((d.table_exists, (evaluation.GROUPS_TABLE,)))
        if not found:
            return []  # an embedded ledger that never ran a group
        (rows,) = await self._read(query)
        return evaluation.groups_of(rows)

    async def _facts(
        self, events: Query, calls: Query
    ) -> tuple[list[AuditRecord], list[CallRecord]]:
        """The audit records and the keyed calls of two queries, from one snapshot."""
        event_rows, call_rows = await self._read(events, calls)
        records = evaluation.records_of(event_rows, events_of(event_rows) or [])
        return records, evaluation.calls_of(call_rows)

    async def run_facts(self, tenant_id: str | None, run_id: str) -> EvaluationFacts:
        """:meth:`schemas.evaluation.EvaluationReads.run_facts`."""
        d = self.dialect
        records, calls = await self._facts(
            evaluation.run_events_sql(d, tenant_id, run_id),
            evaluation.run_calls_sql(d, tenant_id, run_id),
        )
        groups = await self._groups(evaluation.run_groups_sql(d, tenant_id, run_id))
        return EvaluationFacts(records, calls, groups)

    async def window_facts(
        self, tenant_id: str | None, since: datetime, until: datetime
    ) -> EvaluationFacts:
        """:meth:`schemas.evaluation.EvaluationReads.window_facts`."""
        d = self.dialect
        records, calls = await self._facts(
            evaluation.window_events_sql(d, tenant_id, since, until),
            evaluation.window_calls_sql(d, tenant_id, since, until),
        )
        groups = await self._groups(evaluation.window_groups_sql(d, tenant_id, since, until))
        return EvaluationFacts(
            records=[r for r in records if within(since, until, r.occurred_at)],
            calls=[c for c in calls if within(since, until, c.created_at)],
            groups=[g for g in groups if within(since, until, g.created_at)],
        )

    async def export_events(
        self, tenant_id: str | None, since: datetime, until: datetime
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """The audit rows of events that occurred in ``[since, until)``, a page at a time in
        audit order, each with its whole event (:data:`projections.export.EVENT_FIELDS`)."""
        after = -1
        while True:
            (rows,) = await self._read(
                export.events_page_sql(self.dialect, tenant_id, since, until, after)
            )
            if not rows:
                return
            yield [
                export.event_of(row, event)
                for row, event in zip(rows, events_of(rows) or [], strict=True)
                if within(since, until, parsed_time(row["occurred_at"]))
            ]
            after = int(rows[-1]["seq"])

    async def export_calls(
        self, tenant_id: str | None, since: datetime, until: datetime
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """The calls created in ``[since, until)``, a page at a time by call id
        (:data:`projections.export.CALL_FIELDS`)."""
        after = ""
        while True:
            (rows,) = await self._read(
                export.calls_page_sql(self.dialect, tenant_id, since, until, after)
            )
            if not rows:
                return
            yield [
                export.call_of(row)
                for row in rows
                if within(since, until, parsed_time(row["created_at"]))
            ]
            after = str(rows[-1]["call_id"])

    async def applied(self, event_id: str) -> bool:
        return bool(await self._fetch(applied_sql(self.dialect, event_id)))

    async def applied_among(self, event_ids: Sequence[str]) -> set[str]:
        found: set[str] = set()
        for i in range(0, len(event_ids), APPLIED_AMONG_MAX):
            chunk = event_ids[i : i + APPLIED_AMONG_MAX]
            rows = await self._fetch(applied_among_sql(self.dialect, chunk))
            found.update(str(row["event_id"]) for row in rows)
        return found
