"""SQL of the read side, shared by the SQLite and PostgreSQL adapters (placeholder varies)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from schemas.calls import CallFilter, CallView, Page, encode_cursor

CALL_SELECT = (
    "SELECT call_id, tenant_id, tool_name, tool_version, idempotency_key, args_digest, status, "
    "result_json, error_json, attempts, run_id, step_id, created_at, updated_at, "
    "last_event_id, last_intent_id, expired_at FROM tool_calls"
)


def get_sql(mark: str) -> str:
    return f"{CALL_SELECT} WHERE tenant_id = {mark} AND call_id = {mark}"


def search_sql(
    mark: str, tenant_id: str, where: CallFilter, limit: int, after: str | None
) -> tuple[str, list[Any]]:
    clauses, params = [f"tenant_id = {mark}"], [tenant_id]
    for column, value in (
        ("tool_name", where.tool),
        ("idempotency_key", where.idempotency_key),
        ("run_id", where.run_id),
        ("status", where.status.value if where.status else None),
        ("call_id", after),
    ):
        if value is not None:
            clauses.append(f"{column} {'>' if column == 'call_id' else '='} {mark}")
            params.append(value)
    sql = f"{CALL_SELECT} WHERE {' AND '.join(clauses)} ORDER BY call_id LIMIT {int(limit) + 1}"
    return sql, params


def page_of(rows: Sequence[dict[str, Any]], limit: int) -> Page:
    views = [CallView.from_row(r) for r in rows[:limit]]
    more = len(rows) > limit
    return Page(views, encode_cursor(views[-1].call_id) if more and views else None)


def events_sql(mark: str) -> str:
    return (
        f"SELECT payload_json FROM tool_call_events WHERE tenant_id = {mark} "
        f"AND call_id = {mark} ORDER BY seq"
    )


def events_of(payloads: Sequence[str]) -> list[dict[str, Any]] | None:
    return [json.loads(p) for p in payloads] or None


def applied_sql(mark: str) -> str:
    return f"SELECT 1 FROM tool_call_events WHERE event_id = {mark}"
