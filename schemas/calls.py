"""The Call resource and support-staff search: the read contract every projection serves."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict

from toolledger.schemas.errors import ErrorInfo
from toolledger.schemas.evaluation import EvaluationReads
from toolledger.schemas.events import JobInfo
from toolledger.schemas.status import CallStatus


class CallView(BaseModel):
    """The Call resource. Built from the projection row, so a replay renders byte for byte the
    same as the first completed response (a replay does not change the row)."""

    model_config = ConfigDict(frozen=True)

    call_id: str
    tenant_id: str
    tool: str
    tool_version: str
    idempotency_key: str
    args_digest: str
    status: CallStatus
    ok: bool
    result: Any = None
    error: ErrorInfo | None = None
    attempts: int
    run_id: str | None = None
    step_id: str | None = None
    created_at: datetime
    updated_at: datetime
    # when the key passed its retention: the call stays findable, a new call with the key
    # executes as a new call (and replaces this record)
    expired_at: datetime | None = None
    # a long-running call's job: id, status, progress, started_at, updated_at (rendered only
    # for calls that have one)
    job: JobInfo | None = None
    # a call that waits for a human (it has not started): its approval request, as
    # ApprovalView.to_json renders it (rendered only for such calls)
    approval: dict[str, Any] | None = None
    last_event_id: str  # internal: not rendered
    last_intent_id: str  # internal: not rendered
    # internal, not rendered: the call's key (whose call it is, under "tenant+principal")
    call_key: str = ""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CallView:
        status = CallStatus(row["status"])
        return cls(
            call_id=row["call_id"],
            tenant_id=row["tenant_id"],
            tool=row["tool_name"],
            tool_version=row["tool_version"],
            idempotency_key=row["idempotency_key"],
            args_digest=row["args_digest"],
            status=status,
            ok=status is CallStatus.SUCCEEDED,
            result=json.loads(row["result_json"]) if row["result_json"] else None,
            error=ErrorInfo.model_validate_json(row["error_json"]) if row["error_json"] else None,
            attempts=row["attempts"],
            run_id=row["run_id"],
            step_id=row["step_id"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            expired_at=row.get("expired_at"),
            job=_job_of(row.get("state_json")),
            last_event_id=row["last_event_id"],
            last_intent_id=row["last_intent_id"],
            call_key=row["call_key"],
        )


def _job_of(state_json: str | None) -> JobInfo | None:
    """The job in a row's folded state (the state is the executor's own ``CallState``)."""
    if not state_json:
        return None
    job = json.loads(state_json).get("job")
    return JobInfo.model_validate(job) if job else None


@dataclass(frozen=True, slots=True)
class CallFilter:
    tool: str | None = None
    idempotency_key: str | None = None
    run_id: str | None = None
    status: CallStatus | None = None
    # only the calls this principal reads (CallView.visible_to): the tenant's, and its own of
    # keys scoped by principal; None: every call of the tenant (an operator's search)
    reader: str | None = None


@dataclass(frozen=True, slots=True)
class Page:
    items: list[CallView]
    next_cursor: str | None


def encode_cursor(call_id: str) -> str:
    return base64.urlsafe_b64encode(call_id.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    """Raises ``ValueError`` for a cursor this API did not hand out."""
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    if not raw.startswith("call_") or len(raw) > 64:
        raise ValueError("not a cursor of this API")
    return raw


# --------------------------------------------------------------------------- governance reads

APPROVAL_STATUSES: tuple[str, ...] = ("pending", "approved", "denied", "consumed", "expired")
ApprovalStatusName = Literal["pending", "approved", "denied", "consumed", "expired"]
IMPACT_FIELDS: tuple[str, ...] = ("summary", "target", "scope", "cost", "irreversible")
# who decides a request: "operator" (four eyes) or "user" (the principal the call runs for);
# carried in the request's impact (requests made before it existed: an operator)
APPROVER_KINDS: tuple[str, ...] = ("user", "operator")
ANY = "*"
"""A switch's ``tenant_id`` or ``tool`` that stands for every tenant or every tool."""


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("naive datetime: times of the read side are timezone-aware")
    return value.astimezone(UTC)


UtcDatetime = Annotated[datetime, AfterValidator(_utc)]


class ApprovalView(BaseModel):
    """One approval request, as the projections fold it from the approval events.

    The first ``ApprovalRequested`` of an ``approval_id`` (in log order) defines the request;
    the latest ``ApprovalGranted``/``ApprovalDenied``/``ApprovalConsumed`` its state. A grant
    replaces ``expires_at`` with the token's expiry. ``status`` is ``expired`` when the request
    is pending, or approved but not consumed, and ``expires_at <= now`` (``now``: the caller's,
    given to the query). Times are UTC.
    """

    model_config = ConfigDict(frozen=True)

    approval_id: str
    call_key: str  # internal: lets a caller route to the key's partition; not rendered
    call_id: str
    tenant_id: str
    tool: str
    idempotency_key: str
    args_digest: str
    arguments: Any
    impact: dict[str, Any]
    status: ApprovalStatusName
    requested_by: str | None
    requested_at: UtcDatetime
    expires_at: UtcDatetime
    approver: str | None = None
    decided_at: UtcDatetime | None = None
    reason: str | None = None
    consumed_at: UtcDatetime | None = None
    run_id: str | None = None

    @property
    def approver_kind(self) -> str:
        """Who decides: "user" or "operator" (the request's impact says; requests made before
        approver kinds existed were an operator's)."""
        kind = self.impact.get("approver_kind")
        return kind if kind in APPROVER_KINDS else "operator"

    def to_json(self) -> dict[str, Any]:
        """The approval request of the HTTP contract (``id``, ``tool``, ``arguments``,
        ``args_digest``, ``impact`` {summary, target, scope, cost, irreversible: bool},
        ``approver_kind``, ``status``, ``expires_at``) followed by the audit fields. See
        docs/architecture.md#the-http-contract."""
        raw = self.model_dump(mode="json", exclude={"call_key"})
        impact = {name: self.impact.get(name) for name in IMPACT_FIELDS}
        impact["irreversible"] = bool(impact["irreversible"])
        return {
            "id": raw["approval_id"],
            "tool": raw["tool"],
            "arguments": raw["arguments"],
            "args_digest": raw["args_digest"],
            "impact": impact,
            "approver_kind": self.approver_kind,
            "status": raw["status"],
            "expires_at": raw["expires_at"],
            **{
                name: raw[name]
                for name in (
                    "tenant_id",
                    "call_id",
                    "idempotency_key",
                    "run_id",
                    "requested_by",
                    "requested_at",
                    "approver",
                    "decided_at",
                    "reason",
                    "consumed_at",
                )
            },
        }


@dataclass(frozen=True, slots=True)
class ApprovalPage:
    items: list[ApprovalView]
    next_cursor: str | None


_APPROVAL_CURSOR = "apr1"
_RECENT_CURSOR = "new1"


def _pack(*parts: str) -> str:
    """A cursor: ``parts`` (a tag first) as URL-safe base64 of a JSON list."""
    raw = json.dumps(parts, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _unpack(cursor: str, tag: str, size: int) -> list[str]:
    """The parts after the tag of a cursor :func:`_pack` made with ``tag`` and ``size`` parts
    in all; ``ValueError`` for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("utf-8")
        parts = json.loads(raw)
    except ValueError as exc:  # binascii, UTF-8, JSON
        raise ValueError("not a cursor of this API") from exc
    if (
        not isinstance(parts, list)
        or len(parts) != size
        or parts[0] != tag
        or not all(isinstance(p, str) for p in parts)
    ):
        raise ValueError("not a cursor of this API")
    return parts[1:]


def encode_approval_cursor(view: ApprovalView) -> str:
    """The position after ``view`` in the order (requested_at, approval_id, tenant_id)."""
    return _pack(_APPROVAL_CURSOR, view.requested_at.isoformat(), view.approval_id, view.tenant_id)


def decode_approval_cursor(cursor: str) -> tuple[datetime, str, str]:
    """(requested_at, approval_id, tenant_id); ``ValueError`` for a cursor this API did not
    hand out."""
    at, approval_id, tenant_id = _unpack(cursor, _APPROVAL_CURSOR, 4)
    try:
        return _utc(datetime.fromisoformat(at)), approval_id, tenant_id
    except ValueError as exc:  # not ISO 8601, or naive
        raise ValueError("not a cursor of this API") from exc


def encode_recent_cursor(view: CallView) -> str:
    """The position after ``view`` in the order newest first (created_at, then call_id, both
    descending). The time keeps its offset: the embedded tables compare it as the text
    ``isoformat()`` wrote."""
    return _pack(_RECENT_CURSOR, view.created_at.isoformat(), view.call_id)


def decode_recent_cursor(cursor: str) -> tuple[datetime, str]:
    """(created_at, call_id); ``ValueError`` for a cursor this API did not hand out."""
    at, call_id = _unpack(cursor, _RECENT_CURSOR, 3)
    try:
        created_at = datetime.fromisoformat(at)
    except ValueError as exc:
        raise ValueError("not a cursor of this API") from exc
    if created_at.tzinfo is None or not call_id.startswith("call_") or len(call_id) > 64:
        raise ValueError("not a cursor of this API")
    return created_at, call_id


class SwitchView(BaseModel):
    """The latest state of one kill switch. ``tenant_id``/``tool`` ``"*"``: every tenant/tool.
    Latest = the highest (``changed_at``, intent id): the executor's own order, the same
    however the switch's copies were spread over the log partitions."""

    model_config = ConfigDict(frozen=True)

    tenant_id: str
    tool: str
    enabled: bool
    reason: str
    actor: str
    changed_at: UtcDatetime

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def effective_switch(
    switches: Iterable[SwitchView], tenant_id: str, tool: str
) -> SwitchView | None:
    """The switch that keeps ``tool`` off for ``tenant_id``, if any.

    Each pair of :func:`switch_scopes` is looked at on its own, in that order, by its latest
    state (several states of one pair: the latest counts); the first one that is disabled is
    returned.
    """
    latest: dict[tuple[str, str], SwitchView] = {}
    for switch in switches:
        key = (switch.tenant_id, switch.tool)
        current = latest.get(key)
        if current is None or switch.changed_at >= current.changed_at:
            latest[key] = switch
    for scope in switch_scopes(tenant_id, tool):
        found = latest.get(scope)
        if found is not None and not found.enabled:
            return found
    return None


def switch_scopes(tenant_id: str, tool: str) -> tuple[tuple[str, str], ...]:
    """The (tenant, tool) pairs whose switch applies to a call, most specific first: the
    tenant's and the global ones, for the tool and for every tool."""
    return ((tenant_id, tool), (tenant_id, ANY), (ANY, tool), (ANY, ANY))


def _rate(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


@dataclass(frozen=True, slots=True)
class ToolStats:
    """Counts for one tool (``tool == "*"``: all tools) and the rates derived from them.

    Counts, from the projection (SQL views ``tool_metrics`` and ``tenant_metrics``):

    - ``calls``: ``tool_calls`` rows (call keys that executed); ``succeeded``,
      ``failed_final``, ``failed_retryable``, ``unknown``, ``pending``: those rows by status.
    - ``intents``: the calls the ledger answered, each counted once: distinct intent ids among
      the ``ToolCall*`` and ``ApprovalRequested`` events (executions, refusals, replays,
      approval requests).
    - ``validation_failures``: ``ToolCallRejected`` events with ``VALIDATION_FAILED``.
    - ``duplicates``: ``ToolCallReplayed`` events plus ``ToolCallRejected`` with
      ``IDEMPOTENCY_KEY_IN_USE`` (a same-key, same-arguments call answered without running).
    - ``retry_limit_refusals``: ``ToolCallFailed`` or ``ToolCallRejected`` events with
      ``RETRY_LIMIT_EXCEEDED``.
    - ``calls_in_runs``: calls with a run id; ``runs``: distinct run ids among them.
    - ``approvals_granted``/``approvals_denied``: approval requests whose latest decision is a
      grant/denial; ``approvals_pending``: requests still pending and not expired (by the
      database's clock).

    Rates (``None`` when the denominator is 0):

    - ``success_rate`` = succeeded / finished calls (``calls - pending``).
    - ``validation_failure_rate`` = validation_failures / intents.
    - ``duplicate_rate`` = duplicates / intents.
    - ``human_rejection_rate`` = approvals_denied / (approvals_granted + approvals_denied).
    - ``calls_per_run`` = calls_in_runs / runs.
    """

    tool: str
    calls: int = 0
    succeeded: int = 0
    failed_final: int = 0
    failed_retryable: int = 0
    unknown: int = 0
    pending: int = 0
    intents: int = 0
    validation_failures: int = 0
    duplicates: int = 0
    retry_limit_refusals: int = 0
    calls_in_runs: int = 0
    runs: int = 0
    approvals_pending: int = 0
    approvals_granted: int = 0
    approvals_denied: int = 0

    @property
    def success_rate(self) -> float | None:
        return _rate(self.succeeded, self.calls - self.pending)

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
    def calls_per_run(self) -> float | None:
        return _rate(self.calls_in_runs, self.runs)

    def to_json(self) -> dict[str, Any]:
        counts = {name: getattr(self, name) for name in STAT_COUNTS}
        rates = {name: getattr(self, name) for name in STAT_RATES}
        return {"tool": self.tool, **counts, **rates}


STAT_COUNTS: tuple[str, ...] = tuple(
    name for name in ToolStats.__dataclass_fields__ if name != "tool"
)
"""The count fields of :class:`ToolStats`: also the count columns of the metrics views."""
STAT_RATES: tuple[str, ...] = (
    "success_rate",
    "validation_failure_rate",
    "duplicate_rate",
    "human_rejection_rate",
    "calls_per_run",
)
"""The rate properties of :class:`ToolStats`: also the rate columns of the metrics views."""


@dataclass(frozen=True, slots=True)
class Stats:
    """Metrics of one tenant (``tenant_id``; ``None``: every tenant), per tool and in total."""

    tenant_id: str | None
    tools: list[ToolStats]
    totals: ToolStats

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "tools": [t.to_json() for t in self.tools],
            "totals": self.totals.to_json(),
        }


@dataclass(frozen=True, slots=True)
class RunUsage:
    """What a run has used so far: ``attempts``, its ``ToolCallStarted`` events (all tools),
    and ``repeats``, the most failures of one tool sharing one ``fingerprint`` that ended a
    round (``ToolCallFailed`` with disposition RETRYABLE or FINAL: a failure the executor
    retried within the round and that then recovered does not count; ties: the smallest
    fingerprint; none: 0 and ``None``)."""

    attempts: int
    repeats: int
    fingerprint: str | None


class CallQueries(EvaluationReads, Protocol):
    """Reads scoped to one tenant: another tenant's call is simply not found. With the
    evaluation report's reads (:class:`schemas.evaluation.EvaluationReads`)."""

    # whether a call's row may lag the events that answered it (a projector of its own);
    # False: the row is written with them (the embedded file), readable once answered
    calls_lag: bool

    async def get(self, tenant_id: str, call_id: str) -> CallView | None: ...

    async def search(
        self, tenant_id: str, where: CallFilter, *, limit: int, after: str | None
    ) -> Page: ...

    async def recent(self, tenant_id: str, *, limit: int, before: str | None) -> Page:
        """The tenant's calls, newest first (by creation time, then call id); ``before``: a
        ``next_cursor`` of this query (``ValueError`` if it is not one)."""

    async def events(self, tenant_id: str, call_id: str) -> list[dict[str, Any]] | None: ...

    async def applied(self, event_id: str) -> bool:
        """Whether the projection has applied this event yet."""

    async def applied_among(self, event_ids: Sequence[str]) -> set[str]:
        """Which of these events the projection has applied yet (one lookup for many)."""

    async def moved(self, timeout_s: float) -> None:
        """Returns when the projection may have applied more events, at the latest after
        ``timeout_s`` (a projection that cannot tell: after ``timeout_s``)."""

    async def approval(
        self, tenant_id: str | None, approval_id: str, *, now: datetime
    ) -> ApprovalView | None:
        """One approval request (``tenant_id`` None: of any tenant), its status as of ``now``."""

    async def call_approval(
        self, tenant_id: str, call_id: str, *, now: datetime
    ) -> ApprovalView | None:
        """The latest approval request of a call, its status as of ``now``."""

    async def key_approval(
        self, tenant_id: str, tool: str, idempotency_key: str, *, now: datetime
    ) -> ApprovalView | None:
        """The latest approval request under ``tool``'s ``idempotency_key``, of whichever
        principal (an operator finds a call waiting for a human by its key)."""

    async def approvals(
        self,
        tenant_id: str | None,
        *,
        status: str | None,
        now: datetime,
        limit: int,
        after: str | None,
    ) -> ApprovalPage:
        """Approval requests by (requested_at, approval_id), optionally of one status as of
        ``now``; ``after``: a ``next_cursor`` (``ValueError`` if it is not one)."""

    async def switches(self, tenant_id: str) -> list[SwitchView]:
        """The latest state of every switch that applies to the tenant: its own, global ones."""

    async def stats(self, tenant_id: str | None) -> Stats:
        """Metrics per tool and in total, of one tenant (None: of every tenant)."""

    async def run_usage(self, tenant_id: str, run_id: str, tool: str) -> RunUsage:
        """Budget counters of a run (see :class:`RunUsage`)."""
