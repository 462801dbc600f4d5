"""The evaluation report of a run, or of every run in a time window (issue 31;
docs/evaluation.md): the offline checks of what an agent did with its tools, and the
production metrics, computed by pure functions from the rows of the read side.

What the report reads (:class:`EvaluationReads`) is served by both read models (SQLite and
PostgreSQL, ``projections.search``): the run's audit records (the redacted events, in audit
order), its keyed calls (``tool_calls``) and its call groups. Read-only calls are counted
from their one outcome event on every backend. The report holds no arguments or results:
ids, digests, codes and counts.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from toolledger.schemas.errors import ErrorCode
from toolledger.schemas.groups import GroupView

BUDGET_CODES = frozenset({ErrorCode.RATE_LIMITED.value, ErrorCode.RETRY_LIMIT_EXCEEDED.value})
"""Refusals for a budget: a rate limit, or a run's or a key's retries used up."""
PERMISSION_CODES = frozenset(
    {ErrorCode.FORBIDDEN.value, ErrorCode.UNAUTHENTICATED.value, ErrorCode.TOOL_DISABLED.value}
)
"""Refusals for a permission: a scope the caller lacks, or a tool switched off."""
ARGUMENT_CODES = frozenset({ErrorCode.VALIDATION_FAILED.value, ErrorCode.PAYLOAD_TOO_LARGE.value})
"""Refusals of the arguments themselves."""
FAILED_STATUSES = frozenset({"FAILED_FINAL", "FAILED_RETRYABLE"})
Format = Literal["json", "md", "html"]
FORMATS: tuple[Format, ...] = ("json", "md", "html")


# ---------------------------------------------------------------------------- what is read


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One event of the audit trail, as the report reads it (``seq``: its audit position)."""

    seq: int
    event_type: str
    occurred_at: datetime
    tenant_id: str
    tool: str
    call_id: str
    idempotency_key: str
    intent_id: str
    run_id: str | None
    args_digest: str
    error_code: str | None = None
    field_errors: tuple[tuple[str, str], ...] = ()  # (where, the validator's error type)
    disposition: str | None = None
    resolution: str | None = None  # of a ToolCallReconciled
    approval_id: str | None = None
    approver: str | None = None
    reason: str | None = None

    @classmethod
    def of(cls, seq: int, call_id: str, event: Mapping[str, Any]) -> AuditRecord:
        """The record of a whole event as the read side gives it (``type``, ``envelope``
        and the event's fields)."""
        env = event["envelope"]
        error = event.get("error") or {}
        occurred = env["occurred_at"]
        return cls(
            seq=seq,
            event_type=event["type"],
            occurred_at=occurred
            if isinstance(occurred, datetime)
            else datetime.fromisoformat(occurred),
            tenant_id=env["tenant_id"],
            tool=env["tool"],
            call_id=call_id,
            idempotency_key=env["idempotency_key"],
            intent_id=env["intent_id"],
            run_id=env.get("run_id"),
            args_digest=env["args_digest"],
            error_code=error.get("code"),
            field_errors=tuple((f["loc"], f["type"]) for f in event.get("field_errors") or ()),
            disposition=event.get("disposition"),
            resolution=event.get("resolution"),
            approval_id=event.get("approval_id"),
            approver=event.get("approver"),
            reason=event.get("reason"),
        )


@dataclass(frozen=True, slots=True)
class CallRecord:
    """A keyed call's row (``tool_calls``)."""

    call_id: str
    tenant_id: str
    tool: str
    idempotency_key: str
    args_digest: str
    status: str
    attempts: int
    run_id: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class EvaluationFacts:
    """What one report is computed from."""

    records: Sequence[AuditRecord]  # in audit order
    calls: Sequence[CallRecord]  # keyed calls
    groups: Sequence[GroupView] = ()


class EvaluationReads(Protocol):
    """The read side of the report (``tenant_id`` None: every tenant)."""

    async def run_facts(self, tenant_id: str | None, run_id: str) -> EvaluationFacts:
        """The run's audit records, keyed calls and call groups."""

    async def window_facts(
        self, tenant_id: str | None, since: datetime, until: datetime
    ) -> EvaluationFacts:
        """The audit records that occurred in ``[since, until)``, the keyed calls created
        then, and the call groups created then."""


# -------------------------------------------------------------------------------- the report


def _rate(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


@dataclass(frozen=True, slots=True)
class Metrics:
    """The production metrics (docs/data-dictionary.md#metric-definitions): counts and rates
    (None when the denominator is 0)."""

    intents: int  # calls answered, each once (distinct intent ids)
    calls: int  # calls executed: keyed calls and reads
    finished: int  # of those, no longer PENDING
    succeeded: int
    validation_failures: int
    duplicates: int  # replays and "in use" answers of a same-key, same-arguments call
    approvals_granted: int
    approvals_denied: int
    unknown: int  # calls whose outcome is UNKNOWN now
    runs: int  # distinct run ids among the calls
    calls_in_runs: int

    @property
    def success_rate(self) -> float | None:
        return _rate(self.succeeded, self.finished)

    @property
    def validation_failure_rate(self) -> float | None:
        return _rate(self.validation_failures, self.intents)

    @property
    def duplicate_rate(self) -> float | None:
        return _rate(self.duplicates, self.intents)

    @property
    def human_rejection_rate(self) -> float | None:
        return _rate(self.approvals_denied, self.approvals_granted + self.approvals_denied)

    @property
    def average_calls_per_run(self) -> float | None:
        return _rate(self.calls_in_runs, self.runs)

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "success_rate": self.success_rate,
            "validation_failure_rate": self.validation_failure_rate,
            "duplicate_rate": self.duplicate_rate,
            "human_rejection_rate": self.human_rejection_rate,
            "average_calls_per_run": self.average_calls_per_run,
        }


@dataclass(frozen=True, slots=True)
class Report:
    """The checks and the metrics of a run (``run_id``) or a window (``since``, ``until``)."""

    tenant_id: str | None
    run_id: str | None
    since: datetime | None
    until: datetime | None
    metrics: Metrics
    argument_refusals: list[dict[str, Any]] = field(default_factory=list)
    repeated_calls: list[dict[str, Any]] = field(default_factory=list)
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    order: list[dict[str, Any]] = field(default_factory=list)
    groups_checked: int = 0
    budget_refusals: list[dict[str, Any]] = field(default_factory=list)
    permission_refusals: list[dict[str, Any]] = field(default_factory=list)
    human_rejections: list[dict[str, Any]] = field(default_factory=list)
    unknowns: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        scope: dict[str, Any] = {"tenant_id": self.tenant_id}
        if self.run_id is not None:
            scope["run_id"] = self.run_id
        else:
            scope["since"] = self.since.isoformat() if self.since else None
            scope["until"] = self.until.isoformat() if self.until else None
        return {
            "scope": scope,
            "metrics": self.metrics.to_json(),
            "checks": {
                "argument_refusals": self.argument_refusals,
                "repeated_calls": self.repeated_calls,
                "recoveries": self.recoveries,
                "order": {"groups_checked": self.groups_checked, "violations": self.order},
                "budget_refusals": self.budget_refusals,
                "permission_refusals": self.permission_refusals,
                "human_rejections": self.human_rejections,
                "unknowns": self.unknowns,
            },
        }


def _calls(facts: EvaluationFacts) -> list[CallRecord]:
    """The keyed calls, and each read as a call of its own (its one outcome event)."""
    reads = [
        CallRecord(
            call_id=r.call_id,
            tenant_id=r.tenant_id,
            tool=r.tool,
            idempotency_key="",
            args_digest=r.args_digest,
            status="SUCCEEDED" if r.event_type == "ToolCallSucceeded" else "FAILED_FINAL",
            attempts=1,
            run_id=r.run_id,
            created_at=r.occurred_at,
            updated_at=r.occurred_at,
        )
        for r in facts.records
        if not r.idempotency_key and r.event_type in ("ToolCallSucceeded", "ToolCallFailed")
    ]
    return [*facts.calls, *reads]


def metrics_of(facts: EvaluationFacts) -> Metrics:
    records, calls = facts.records, _calls(facts)
    types = Counter(r.event_type for r in records)
    rejected = Counter(r.error_code for r in records if r.event_type == "ToolCallRejected")
    in_runs = [c for c in calls if c.run_id is not None]
    return Metrics(
        intents=len(
            {
                r.intent_id
                for r in records
                if r.event_type.startswith("ToolCall") or r.event_type == "ApprovalRequested"
            }
        ),
        calls=len(calls),
        finished=sum(c.status != "PENDING" for c in calls),
        succeeded=sum(c.status == "SUCCEEDED" for c in calls),
        validation_failures=rejected[ErrorCode.VALIDATION_FAILED.value],
        duplicates=types["ToolCallReplayed"] + rejected[ErrorCode.IDEMPOTENCY_KEY_IN_USE.value],
        approvals_granted=types["ApprovalGranted"],
        approvals_denied=types["ApprovalDenied"],
        unknown=sum(c.status == "UNKNOWN" for c in calls),
        runs=len({c.run_id for c in in_runs}),
        calls_in_runs=len(in_runs),
    )


def _argument_refusals(records: Iterable[AuditRecord]) -> list[dict[str, Any]]:
    by_field: Counter[tuple[str, str, str, str]] = Counter()
    for r in records:
        if r.event_type == "ToolCallRejected" and r.error_code in ARGUMENT_CODES:
            for where, kind in r.field_errors or (("", ""),):
                by_field[(r.tool, r.error_code or "", where, kind)] += 1
    return [
        {"tool": tool, "code": code, "field": where, "error": kind, "refusals": n}
        for (tool, code, where, kind), n in sorted(by_field.items())
    ]


def _repeated(calls: Iterable[CallRecord]) -> list[dict[str, Any]]:
    """Keyed calls of one tool with the same arguments (digest) under different keys."""
    by_args: dict[tuple[str, str, str], list[CallRecord]] = {}
    for c in calls:
        if c.idempotency_key:
            by_args.setdefault((c.tenant_id, c.tool, c.args_digest), []).append(c)
    return [
        {
            "tenant_id": tenant,
            "tool": tool,
            "args_digest": digest,
            "keys": sorted(c.idempotency_key for c in same),
            "call_ids": [c.call_id for c in sorted(same, key=lambda c: c.created_at)],
        }
        for (tenant, tool, digest), same in sorted(by_args.items())
        if len(same) > 1
    ]


def _recoveries(
    records: Sequence[AuditRecord], calls: Sequence[CallRecord]
) -> list[dict[str, Any]]:
    """A call that failed (an attempt, a round, or its outcome unknown) and then succeeded;
    and a call that ended failed, followed in its run by a successful call of the same tool."""
    troubled = {
        r.call_id: r.error_code or r.event_type
        for r in records
        if r.event_type in ("ToolCallFailed", "ToolCallOutcomeUnknown")
    }
    found: list[dict[str, Any]] = []
    ordered = sorted(calls, key=lambda c: (c.created_at, c.call_id))
    for c in ordered:
        if c.status == "SUCCEEDED" and c.call_id in troubled:
            found.append(
                {
                    "tool": c.tool,
                    "call_id": c.call_id,
                    "failed_with": troubled[c.call_id],
                    "recovered_by": c.call_id,
                    "how": "retried in the call",
                }
            )
        if c.status in FAILED_STATUSES:
            later = next(
                (
                    o
                    for o in ordered
                    if o.tool == c.tool
                    and o.tenant_id == c.tenant_id
                    and o.run_id == c.run_id
                    and o.status == "SUCCEEDED"
                    and o.created_at > c.updated_at
                ),
                None,
            )
            if later is not None:
                found.append(
                    {
                        "tool": c.tool,
                        "call_id": c.call_id,
                        "failed_with": troubled.get(c.call_id, c.status),
                        "recovered_by": later.call_id,
                        "how": "a later call",
                    }
                )
    return found


def _order(records: Sequence[AuditRecord], groups: Iterable[GroupView]) -> list[dict[str, Any]]:
    """Steps of the run's groups whose call started before every step it depends on had
    succeeded (or although one never did)."""
    started: dict[str, datetime] = {}
    succeeded: dict[str, datetime] = {}
    for r in records:
        if r.event_type == "ToolCallStarted":
            started.setdefault(r.call_id, r.occurred_at)
        elif r.event_type == "ToolCallSucceeded" or (
            r.event_type == "ToolCallReconciled" and r.resolution == "SUCCEEDED"
        ):
            succeeded.setdefault(r.call_id, r.occurred_at)
    found: list[dict[str, Any]] = []
    for group in groups:
        steps = {s.id: s for s in group.steps}
        for step in group.steps:
            began = started.get(step.call_id or "")
            if began is None:
                continue
            for dep in step.depends_on:
                dep_call = steps[dep].call_id if dep in steps else None
                done = succeeded.get(dep_call or "")
                if done is None or done > began:
                    found.append(
                        {
                            "group_id": group.group_id,
                            "step": step.id,
                            "tool": step.tool,
                            "call_id": step.call_id,
                            "depends_on": dep,
                            "problem": "started before its dependency succeeded"
                            if done is not None
                            else "started although its dependency never succeeded",
                        }
                    )
    return found


def _refusals(records: Iterable[AuditRecord], codes: frozenset[str]) -> list[dict[str, Any]]:
    return [
        {
            "tool": r.tool,
            "call_id": r.call_id,
            "idempotency_key": r.idempotency_key,
            "code": r.error_code,
            "event": r.event_type,
            "at": r.occurred_at.isoformat(),
        }
        for r in records
        if r.event_type in ("ToolCallRejected", "ToolCallFailed") and r.error_code in codes
    ]


def report_of(
    facts: EvaluationFacts,
    *,
    tenant_id: str | None,
    run_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Report:
    """The report of a run (``run_id``) or of the window ``[since, until)``, from its facts.
    Its lists are in time order (the audit order across log partitions interleaves them by
    offset; within a call key's partition the two agree)."""
    records = sorted(facts.records, key=lambda r: (r.occurred_at, r.seq))
    calls = _calls(facts)
    return Report(
        tenant_id=tenant_id,
        run_id=run_id,
        since=since,
        until=until,
        metrics=metrics_of(facts),
        argument_refusals=_argument_refusals(records),
        repeated_calls=_repeated(calls),
        recoveries=_recoveries(records, calls),
        order=_order(records, facts.groups),
        groups_checked=len(facts.groups),
        budget_refusals=_refusals(records, BUDGET_CODES),
        permission_refusals=_refusals(records, PERMISSION_CODES),
        human_rejections=[
            {
                "tool": r.tool,
                "call_id": r.call_id,
                "approval_id": r.approval_id,
                "approver": r.approver,
                "reason": r.reason,
                "at": r.occurred_at.isoformat(),
            }
            for r in records
            if r.event_type == "ApprovalDenied"
        ],
        unknowns=[
            {"tool": c.tool, "call_id": c.call_id, "idempotency_key": c.idempotency_key}
            for c in sorted(calls, key=lambda c: c.call_id)
            if c.status == "UNKNOWN"
        ],
    )


# ------------------------------------------------------------------------------- rendering

_SECTIONS = (
    ("argument_refusals", "Argument validity: refusals by field"),
    ("repeated_calls", "Repeated calls: the same arguments under different keys"),
    ("recoveries", "Recovery paths: failed, then succeeded"),
    ("order", "Order against the groups' declared dependencies"),
    ("budget_refusals", "Budget refusals"),
    ("permission_refusals", "Permission refusals"),
    ("human_rejections", "Human rejections"),
    ("unknowns", "UNKNOWN outcomes"),
)


def _title(report: Report) -> str:
    if report.run_id is not None:
        return f"Evaluation of run {report.run_id}"
    since = report.since.isoformat() if report.since else "the start"
    until = report.until.isoformat() if report.until else "now"
    return f"Evaluation from {since} to {until}"


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def _rows(report: Report, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = getattr(report, name)
    return rows


def to_markdown(report: Report) -> str:
    def md(value: Any) -> str:
        return _cell(value).replace("|", "\\|").replace("\n", " ")

    lines = [f"# {_title(report)}", ""]
    if report.tenant_id is not None:
        lines += [f"Tenant: {md(report.tenant_id)}", ""]
    lines += ["## Metrics", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {md(v)} |" for k, v in report.metrics.to_json().items()]
    for name, title in _SECTIONS:
        rows = _rows(report, name)
        lines += ["", f"## {title}", ""]
        if name == "order":
            lines += [f"Groups checked: {report.groups_checked}", ""]
        if not rows:
            lines.append("None.")
            continue
        columns = list(rows[0])
        lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(md(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def to_html_fragment(report: Report) -> str:
    """The report's sections as HTML (headings from ``h2``), for a page of one's own."""

    def h(value: Any) -> str:
        return html.escape(_cell(value))

    parts = [
        '<section class="report-metrics"><h2>Metrics</h2>'
        '<div class="table-wrap" tabindex="0" role="region" aria-label="Metrics"><table><tbody>'
    ]
    parts += [
        f'<tr><th scope="row">{h(k)}</th><td>{h(v)}</td></tr>'
        for k, v in report.metrics.to_json().items()
    ]
    parts.append("</tbody></table></div></section>")
    for name, title in _SECTIONS:
        rows = _rows(report, name)
        parts.append(f'<section class="report-{name.replace("_", "-")}"><h2>{h(title)}</h2>')
        if name == "order":
            parts.append(f"<p>Groups checked: {report.groups_checked}</p>")
        if not rows:
            parts.append("<p>None.</p></section>")
            continue
        columns = list(rows[0])
        parts.append(
            f'<div class="table-wrap" tabindex="0" role="region" aria-label="{h(title)}">'
            "<table><thead><tr>"
        )
        parts += [f'<th scope="col">{h(c)}</th>' for c in columns]
        parts.append("</tr></thead><tbody>")
        for r in rows:
            parts.append("<tr>" + "".join(f"<td>{h(r.get(c))}</td>" for c in columns) + "</tr>")
        parts.append("</tbody></table></div></section>")
    return "".join(parts)


def to_html(report: Report) -> str:
    """A whole HTML page of the report."""
    title = html.escape(_title(report))
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        "<style>body{font-family:sans-serif;margin:2rem}table{border-collapse:collapse}"
        "th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:left}"
        ".table-wrap{overflow-x:auto}</style></head>"
        f"<body><h1>{title}</h1>{to_html_fragment(report)}</body></html>\n"
    )


def render(report: Report, form: Format) -> str:
    """The report as JSON, Markdown or a whole HTML page."""
    if form == "md":
        return to_markdown(report)
    if form == "html":
        return to_html(report)
    return json.dumps(report.to_json(), indent=2, sort_keys=False) + "\n"
