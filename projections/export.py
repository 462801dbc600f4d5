"""What ``toolledger export`` reads (docs/data-dictionary.md#export), written once over a
:class:`~projections.dialect.Dialect`: the audit trail (every event as the trail holds it,
redacted) and the calls, a page at a time in a stable order, in a time window.
:class:`projections.search.CallReads` runs these queries for both read models.

The window is widened by a second in SQL and applied exactly on the parsed times, as the
report's (:mod:`projections.evaluation`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from toolledger.projections.dialect import Dialect, Query, parsed_time
from toolledger.projections.rows import AUDIT_SELECT

PAGE = 5_000
_SLACK = timedelta(seconds=1)

EVENT_FIELDS = (
    "seq",
    "event_id",
    "log_partition",
    "log_offset",
    "call_id",
    "call_key",
    "tenant_id",
    "tool_name",
    "idempotency_key",
    "intent_id",
    "run_id",
    "event_type",
    "occurred_at",
    "duration_ms",
    "payload_json",
)
"""An exported audit row: the columns of ``tool_call_events``; ``payload_json`` the whole
event as the audit trail holds it (outcome events carry arguments redacted)."""
CALL_FIELDS = (
    "call_id",
    "call_key",
    "tenant_id",
    "tool_name",
    "tool_version",
    "idempotency_key",
    "args_digest",
    "status",
    "result_json",
    "error_json",
    "attempts",
    "rounds",
    "reconcile_attempts",
    "run_id",
    "step_id",
    "first_intent_id",
    "last_intent_id",
    "created_at",
    "updated_at",
    "expired_at",
)
"""An exported call row: the columns of ``tool_calls`` but the executor's internal state."""


def _scope(d: Dialect, tenant_id: str | None) -> tuple[str, list[Any]]:
    return ("", []) if tenant_id is None else (f" AND tenant_id = {d.mark}", [tenant_id])


def events_page_sql(
    d: Dialect, tenant_id: str | None, since: datetime, until: datetime, after_seq: int
) -> Query:
    """The next page of audit rows of the window, by ``seq`` (after ``after_seq``)."""
    tenant, params = _scope(d, tenant_id)
    return (
        f"SELECT seq, log_partition, log_offset, call_id, run_id, event_type, occurred_at, "
        f"{AUDIT_SELECT} "
        f"FROM tool_call_events WHERE seq > {d.mark} AND occurred_at >= {d.mark} "
        f"AND occurred_at < {d.mark}{tenant} ORDER BY seq LIMIT {PAGE}",
        [after_seq, d.time(since - _SLACK), d.time(until + _SLACK), *params],
    )


def calls_page_sql(
    d: Dialect, tenant_id: str | None, since: datetime, until: datetime, after: str
) -> Query:
    """The next page of the calls created in the window, by ``call_id`` (after ``after``)."""
    tenant, params = _scope(d, tenant_id)
    return (
        f"SELECT {', '.join(CALL_FIELDS)} FROM tool_calls WHERE call_id > {d.mark} "
        f"AND created_at >= {d.mark} AND created_at < {d.mark}{tenant} "
        f"ORDER BY call_id LIMIT {PAGE}",
        [after, d.time(since - _SLACK), d.time(until + _SLACK), *params],
    )


def event_of(row: Mapping[str, Any], event: Mapping[str, Any]) -> dict[str, Any]:
    """An exported audit row: the row's columns and its whole ``event``."""
    duration = event.get("duration_ms")
    return {
        "seq": int(row["seq"]),
        "event_id": row["event_id"],
        "log_partition": int(row["log_partition"]),
        "log_offset": int(row["log_offset"]),
        "call_id": row["call_id"],
        "call_key": event["envelope"]["call_key"],
        "tenant_id": row["tenant_id"],
        "tool_name": row["tool_name"],
        "idempotency_key": row["idempotency_key"],
        "intent_id": row["intent_id"],
        "run_id": row["run_id"],
        "event_type": row["event_type"],
        "occurred_at": parsed_time(row["occurred_at"]),
        "duration_ms": None if duration is None else float(duration),
        "payload_json": json.dumps(event, separators=(",", ":"), ensure_ascii=False),
    }


def call_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """An exported call row."""
    out = {name: row[name] for name in CALL_FIELDS}
    for name in ("created_at", "updated_at", "expired_at"):
        out[name] = parsed_time(row[name])
    return out
