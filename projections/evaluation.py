"""What the evaluation report reads (:class:`schemas.evaluation.EvaluationReads`), written
once over a :class:`~projections.dialect.Dialect`: the audit records, the keyed calls and
the call groups of a run or of a time window. :class:`projections.search.CallReads` runs
these queries for both read models (``run_facts``, ``window_facts``).

A window's bounds are applied twice: widened by a second in SQL (SQLite keeps times as ISO
text whose spelling, ``+00:00`` or not, ``.ffffff`` or not, does not sort exactly at the
bound) and exactly on the parsed times.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from toolledger.projections.dialect import Dialect, Query, parsed_time
from toolledger.projections.rows import AUDIT_SELECT
from toolledger.schemas.evaluation import AuditRecord, CallRecord
from toolledger.schemas.groups import GroupView

_SLACK = timedelta(seconds=1)
_CALL_SELECT = (
    "SELECT call_id, tenant_id, tool_name, idempotency_key, args_digest, status, attempts, "
    "run_id, created_at, updated_at FROM tool_calls"
)
GROUPS_TABLE = "tool_call_groups"


def _scoped(d: Dialect, where: list[str], params: list[Any], tenant_id: str | None) -> str:
    if tenant_id is not None:
        where.append(f"tenant_id = {d.mark}")
        params.append(tenant_id)
    return " AND ".join(where)


def run_events_sql(d: Dialect, tenant_id: str | None, run_id: str) -> Query:
    params: list[Any] = [run_id]
    where = _scoped(d, [f"run_id = {d.mark}"], params, tenant_id)
    return (
        f"SELECT seq, call_id, {AUDIT_SELECT} FROM tool_call_events WHERE {where} ORDER BY seq",
        params,
    )


def window_events_sql(d: Dialect, tenant_id: str | None, since: datetime, until: datetime) -> Query:
    params: list[Any] = [d.time(since - _SLACK), d.time(until + _SLACK)]
    where = _scoped(d, [f"occurred_at >= {d.mark}", f"occurred_at < {d.mark}"], params, tenant_id)
    return (
        f"SELECT seq, call_id, {AUDIT_SELECT} FROM tool_call_events WHERE {where} ORDER BY seq",
        params,
    )


def run_calls_sql(d: Dialect, tenant_id: str | None, run_id: str) -> Query:
    params: list[Any] = [run_id]
    where = _scoped(d, [f"run_id = {d.mark}", "idempotency_key <> ''"], params, tenant_id)
    return f"{_CALL_SELECT} WHERE {where} ORDER BY call_id", params


def window_calls_sql(d: Dialect, tenant_id: str | None, since: datetime, until: datetime) -> Query:
    params: list[Any] = [d.time(since - _SLACK), d.time(until + _SLACK)]
    clauses = [f"created_at >= {d.mark}", f"created_at < {d.mark}", "idempotency_key <> ''"]
    where = _scoped(d, clauses, params, tenant_id)
    return f"{_CALL_SELECT} WHERE {where} ORDER BY call_id", params


def run_groups_sql(d: Dialect, tenant_id: str | None, run_id: str) -> Query:
    params: list[Any] = [run_id]
    where = _scoped(d, [f"run_id = {d.mark}"], params, tenant_id)
    return f"SELECT view_json FROM {GROUPS_TABLE} WHERE {where} ORDER BY group_id", params


def window_groups_sql(d: Dialect, tenant_id: str | None, since: datetime, until: datetime) -> Query:
    params: list[Any] = [d.time(since - _SLACK), d.time(until + _SLACK)]
    where = _scoped(d, [f"created_at >= {d.mark}", f"created_at < {d.mark}"], params, tenant_id)
    return f"SELECT view_json FROM {GROUPS_TABLE} WHERE {where} ORDER BY group_id", params


def _time(value: Any) -> datetime:
    at = parsed_time(value)
    assert at is not None  # a NOT NULL column
    return at


def records_of(
    rows: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]]
) -> list[AuditRecord]:
    """The audit records of ``rows`` (their whole ``events``, in the same order)."""
    return [
        AuditRecord.of(int(row["seq"]), row["call_id"], event)
        for row, event in zip(rows, events, strict=True)
    ]


def calls_of(rows: Sequence[Mapping[str, Any]]) -> list[CallRecord]:
    return [
        CallRecord(
            call_id=r["call_id"],
            tenant_id=r["tenant_id"],
            tool=r["tool_name"],
            idempotency_key=r["idempotency_key"],
            args_digest=r["args_digest"],
            status=r["status"],
            attempts=int(r["attempts"]),
            run_id=r["run_id"],
            created_at=_time(r["created_at"]),
            updated_at=_time(r["updated_at"]),
        )
        for r in rows
    ]


def groups_of(rows: Sequence[Mapping[str, Any]]) -> list[GroupView]:
    return [GroupView.model_validate_json(r["view_json"]) for r in rows]
