"""The governance read side (approvals, kill switches, metrics, run budgets), shared by the
SQLite and PostgreSQL adapters: only the SQL dialect differs between them.

Everything is a view over ``tool_calls`` and ``tool_call_events`` (nothing is written when an
event is applied), so ``toolledger replay`` gives the views back by construction. Each
database defines three *fact* views in its own dialect (JSON and time extraction):
``approval_events``, ``switch_changes`` and ``call_event_facts``; the views on top of them
are written once, here (:func:`portable_views`), and are the same text in both databases
(``projections/migrations/0002_governance.sql`` holds them for PostgreSQL; a test keeps the
two equal). The queries below read those views with the adapter's placeholder.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any

from schemas.calls import (
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

PORTABLE_VIEWS_SQL = """\
-- One row per approval request. The first ApprovalRequested of an approval id (log order)
-- defines the request, the latest grant, denial or consumption its state, a grant replaces
-- the expiry with the token's. status: the state, or 'expired' once a pending or approved
-- (not consumed) request's expires_at has come by the database's clock. The read side's
-- queries compute status for the caller's own "now" from state and expires_at instead.
CREATE VIEW approvals AS
SELECT a.*,
       CASE WHEN a.state IN ('pending', 'approved') AND a.expires_at <= {now}
            THEN 'expired' ELSE a.state END AS status
  FROM (SELECT r.tenant_id, r.approval_id, r.call_key, r.call_id, r.tool_name AS tool,
               r.idempotency_key, r.args_digest, r.run_id, r.arguments_json, r.impact_json,
               r.principal AS requested_by, r.occurred_at AS requested_at,
               CASE s.event_type WHEN 'ApprovalGranted' THEN 'approved'
                                 WHEN 'ApprovalDenied' THEN 'denied'
                                 WHEN 'ApprovalConsumed' THEN 'consumed'
                                 ELSE 'pending' END AS state,
               coalesce(g.expires_at, r.expires_at) AS expires_at,
               CASE d.event_type WHEN 'ApprovalGranted' THEN 'granted'
                                 WHEN 'ApprovalDenied' THEN 'denied' END AS decision,
               d.approver, d.occurred_at AS decided_at, d.reason,
               c.occurred_at AS consumed_at
          FROM (SELECT *, row_number() OVER (PARTITION BY tenant_id, approval_id
                                             ORDER BY seq) AS n
                  FROM approval_events WHERE event_type = 'ApprovalRequested') r
          LEFT JOIN (SELECT *, row_number() OVER (PARTITION BY tenant_id, approval_id
                                                  ORDER BY seq DESC) AS n
                       FROM approval_events WHERE event_type <> 'ApprovalRequested') s
                 ON s.tenant_id = r.tenant_id AND s.approval_id = r.approval_id AND s.n = 1
          LEFT JOIN (SELECT *, row_number() OVER (PARTITION BY tenant_id, approval_id
                                                  ORDER BY seq DESC) AS n
                       FROM approval_events WHERE event_type = 'ApprovalGranted') g
                 ON g.tenant_id = r.tenant_id AND g.approval_id = r.approval_id AND g.n = 1
          LEFT JOIN (SELECT *, row_number() OVER (PARTITION BY tenant_id, approval_id
                                                  ORDER BY seq DESC) AS n
                       FROM approval_events
                      WHERE event_type IN ('ApprovalGranted', 'ApprovalDenied')) d
                 ON d.tenant_id = r.tenant_id AND d.approval_id = r.approval_id AND d.n = 1
          LEFT JOIN (SELECT *, row_number() OVER (PARTITION BY tenant_id, approval_id
                                                  ORDER BY seq DESC) AS n
                       FROM approval_events WHERE event_type = 'ApprovalConsumed') c
                 ON c.tenant_id = r.tenant_id AND c.approval_id = r.approval_id AND c.n = 1
         WHERE r.n = 1) a;

-- The latest state of each (tenant_id, tool) switch ('*': every tenant, every tool): the
-- highest (changed_at, intent_id), the order the executor itself uses.
CREATE VIEW tool_switches AS
SELECT tenant_id, tool, enabled, scope, actor, reason, changed_at, intent_id
  FROM (SELECT *, row_number() OVER (PARTITION BY tenant_id, tool
                                     ORDER BY changed_at DESC, intent_id DESC) AS n
          FROM switch_changes) s
 WHERE n = 1;

-- Counts per (tenant, tool), see schemas.calls.ToolStats:
--   calls, succeeded, failed_final, failed_retryable, unknown, pending: tool_calls rows
--   calls_in_runs: calls with a run id, runs: distinct run ids among them
--   intents: calls answered, each once: distinct intent ids of ToolCall* + ApprovalRequested
--   validation_failures: ToolCallRejected VALIDATION_FAILED
--   duplicates: ToolCallReplayed + ToolCallRejected IDEMPOTENCY_KEY_IN_USE
--   retry_limit_refusals: ToolCallFailed or ToolCallRejected RETRY_LIMIT_EXCEEDED
--   approvals_pending (status, by the database's clock), approvals_granted/_denied (decision)
CREATE VIEW tool_metric_counts AS
SELECT k.tenant_id, k.tool_name,
       coalesce(c.calls, 0) AS calls,
       coalesce(c.succeeded, 0) AS succeeded,
       coalesce(c.failed_final, 0) AS failed_final,
       coalesce(c.failed_retryable, 0) AS failed_retryable,
       coalesce(c.unknown, 0) AS unknown,
       coalesce(c.pending, 0) AS pending,
       coalesce(e.intents, 0) AS intents,
       coalesce(e.validation_failures, 0) AS validation_failures,
       coalesce(e.duplicates, 0) AS duplicates,
       coalesce(e.retry_limit_refusals, 0) AS retry_limit_refusals,
       coalesce(c.calls_in_runs, 0) AS calls_in_runs,
       coalesce(c.runs, 0) AS runs,
       coalesce(a.approvals_pending, 0) AS approvals_pending,
       coalesce(a.approvals_granted, 0) AS approvals_granted,
       coalesce(a.approvals_denied, 0) AS approvals_denied
  FROM (SELECT tenant_id, tool_name FROM tool_calls
        UNION SELECT tenant_id, tool_name FROM call_event_facts) k
  LEFT JOIN (SELECT tenant_id, tool_name,
                    count(*) AS calls,
                    count(*) FILTER (WHERE status = 'SUCCEEDED') AS succeeded,
                    count(*) FILTER (WHERE status = 'FAILED_FINAL') AS failed_final,
                    count(*) FILTER (WHERE status = 'FAILED_RETRYABLE') AS failed_retryable,
                    count(*) FILTER (WHERE status = 'UNKNOWN') AS unknown,
                    count(*) FILTER (WHERE status = 'PENDING') AS pending,
                    count(run_id) AS calls_in_runs,
                    count(DISTINCT run_id) AS runs
               FROM tool_calls GROUP BY tenant_id, tool_name) c
         ON c.tenant_id = k.tenant_id AND c.tool_name = k.tool_name
  LEFT JOIN (SELECT tenant_id, tool_name,
                    count(DISTINCT CASE WHEN event_type LIKE 'ToolCall%'
                                          OR event_type = 'ApprovalRequested'
                                        THEN intent_id END) AS intents,
                    count(*) FILTER (WHERE event_type = 'ToolCallRejected'
                                       AND error_code = 'VALIDATION_FAILED')
                      AS validation_failures,
                    count(*) FILTER (WHERE event_type = 'ToolCallReplayed'
                                        OR (event_type = 'ToolCallRejected'
                                            AND error_code = 'IDEMPOTENCY_KEY_IN_USE'))
                      AS duplicates,
                    count(*) FILTER (WHERE event_type IN ('ToolCallFailed', 'ToolCallRejected')
                                       AND error_code = 'RETRY_LIMIT_EXCEEDED')
                      AS retry_limit_refusals
               FROM call_event_facts GROUP BY tenant_id, tool_name) e
         ON e.tenant_id = k.tenant_id AND e.tool_name = k.tool_name
  LEFT JOIN (SELECT tenant_id, tool AS tool_name,
                    count(*) FILTER (WHERE status = 'pending') AS approvals_pending,
                    count(*) FILTER (WHERE decision = 'granted') AS approvals_granted,
                    count(*) FILTER (WHERE decision = 'denied') AS approvals_denied
               FROM approvals GROUP BY tenant_id, tool) a
         ON a.tenant_id = k.tenant_id AND a.tool_name = k.tool_name;

-- The same counts per tenant: sums over its tools, but runs counted once per tenant.
CREATE VIEW tenant_metric_counts AS
SELECT t.tenant_id,
       CAST(sum(t.calls) AS BIGINT) AS calls,
       CAST(sum(t.succeeded) AS BIGINT) AS succeeded,
       CAST(sum(t.failed_final) AS BIGINT) AS failed_final,
       CAST(sum(t.failed_retryable) AS BIGINT) AS failed_retryable,
       CAST(sum(t.unknown) AS BIGINT) AS unknown,
       CAST(sum(t.pending) AS BIGINT) AS pending,
       CAST(sum(t.intents) AS BIGINT) AS intents,
       CAST(sum(t.validation_failures) AS BIGINT) AS validation_failures,
       CAST(sum(t.duplicates) AS BIGINT) AS duplicates,
       CAST(sum(t.retry_limit_refusals) AS BIGINT) AS retry_limit_refusals,
       CAST(sum(t.calls_in_runs) AS BIGINT) AS calls_in_runs,
       coalesce(max(r.runs), 0) AS runs,
       CAST(sum(t.approvals_pending) AS BIGINT) AS approvals_pending,
       CAST(sum(t.approvals_granted) AS BIGINT) AS approvals_granted,
       CAST(sum(t.approvals_denied) AS BIGINT) AS approvals_denied
  FROM tool_metric_counts t
  LEFT JOIN (SELECT tenant_id, count(DISTINCT run_id) AS runs
               FROM tool_calls GROUP BY tenant_id) r ON r.tenant_id = t.tenant_id
 GROUP BY t.tenant_id;

-- The counts and the rates (NULL when the denominator is 0):
--   success_rate = succeeded / (calls - pending), that is of the finished calls
--   validation_failure_rate = validation_failures / intents
--   duplicate_rate = duplicates / intents
--   human_rejection_rate = approvals_denied / (approvals_granted + approvals_denied)
--   calls_per_run = calls_in_runs / runs
CREATE VIEW tool_metrics AS
SELECT m.*,
       CAST(succeeded AS DOUBLE PRECISION) / NULLIF(calls - pending, 0) AS success_rate,
       CAST(validation_failures AS DOUBLE PRECISION) / NULLIF(intents, 0)
         AS validation_failure_rate,
       CAST(duplicates AS DOUBLE PRECISION) / NULLIF(intents, 0) AS duplicate_rate,
       CAST(approvals_denied AS DOUBLE PRECISION)
         / NULLIF(approvals_granted + approvals_denied, 0) AS human_rejection_rate,
       CAST(calls_in_runs AS DOUBLE PRECISION) / NULLIF(runs, 0) AS calls_per_run
  FROM tool_metric_counts m;

CREATE VIEW tenant_metrics AS
SELECT m.*,
       CAST(succeeded AS DOUBLE PRECISION) / NULLIF(calls - pending, 0) AS success_rate,
       CAST(validation_failures AS DOUBLE PRECISION) / NULLIF(intents, 0)
         AS validation_failure_rate,
       CAST(duplicates AS DOUBLE PRECISION) / NULLIF(intents, 0) AS duplicate_rate,
       CAST(approvals_denied AS DOUBLE PRECISION)
         / NULLIF(approvals_granted + approvals_denied, 0) AS human_rejection_rate,
       CAST(calls_in_runs AS DOUBLE PRECISION) / NULLIF(runs, 0) AS calls_per_run
  FROM tenant_metric_counts m;
"""
"""The views written once for both databases, in creation order, over the fact views
``approval_events``, ``switch_changes`` and ``call_event_facts``. ``{now}``: the database's
clock. No ';' except at the end of each statement (the SQLite rebuild splits on it)."""

PORTABLE_VIEWS: tuple[str, ...] = tuple(
    re.findall(r"^CREATE VIEW (\w+) AS$", PORTABLE_VIEWS_SQL, re.M)
)


def portable_views(now: str) -> str:
    """:data:`PORTABLE_VIEWS_SQL` for a database whose clock is the SQL expression ``now``."""
    return PORTABLE_VIEWS_SQL.replace("{now}", now)


# ---------------------------------------------------------------------------- the dialects


@dataclass(frozen=True, slots=True)
class Dialect:
    mark: str  # the driver's placeholder
    collate: str  # appended to text comparisons and orderings: code point order everywhere
    time: Callable[[datetime], Any]  # a time parameter as the views' time columns hold it


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("naive datetime: give the read side timezone-aware times")
    return value.astimezone(UTC)


def sqlite_time(value: datetime) -> str:
    """The SQLite views' time text: ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` in UTC."""
    return _aware(value).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


SQLITE = Dialect("?", "", sqlite_time)
POSTGRES = Dialect("%s", ' COLLATE "C"', _aware)


def _time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise TypeError(f"not a time: {value!r}")
    return _aware(value)


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
        "AND event_type = 'ToolCallFailed' GROUP BY fingerprint "
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
