"""Deciding an approval request from an agent runtime: the ``Approvals`` surface the adapters
and the MCP server use to grant or deny the ledger's request for the exact call they made.

A call that needs a human answers ``APPROVAL_REQUIRED`` with an approval request;
:func:`pending_approval` reads it from the :class:`~producers.client.CallResult` (in-process
from the answering ``ApprovalRequested`` event, over HTTP from the 428 body). Once it is
granted, the same key with the same arguments goes ahead without a token (the grant sits in
the key's approval book); once denied, the same call answers ``APPROVAL_INVALID`` with the
reason. So an adapter decides, then makes the same call again.

Two implementations, one rule (:mod:`producers.approval_rules`):

- :class:`LedgerApprovals`: in-process, over a client's ``command`` path (embedded or Kafka
  :class:`~producers.client.LedgerClient`): the rule is checked here against the request as the
  ledger recorded it, then the decision is appended and the executor applies it (or refuses
  it: expired, already decided);
- ``producers.http_client.HttpLedgerClient``: ``POST /v1/approval-requests/{id}/approve`` and
  ``/deny`` with the client's own token; the server checks the same rule.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from toolledger.producers import governance
from toolledger.producers.approval_rules import approve_refusal, deny_refusal
from toolledger.producers.client import CallResult, TransportError, TrustedContext
from toolledger.schemas.calls import ApprovalView
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.events import ApprovalRequested, Event, ToolCallRejected
from toolledger.schemas.keys import call_id_of

__all__ = [
    "Approvals",
    "Approve",
    "Decision",
    "Deny",
    "LedgerApprovals",
    "PendingApproval",
    "apply_decision",
    "approvals_for",
    "decide_as_named",
    "deny_reason",
    "pending_approval",
]


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """An approval request a call answered, as the ledger shows it (``request``: ``id``,
    ``tool``, ``arguments`` redacted, ``args_digest``, ``impact``, ``approver_kind``,
    ``status``, ``expires_at``, ``call_id``). ``view``: in-process, the request as the
    ledger recorded it (tenant, key, requester), which an in-process decision needs."""

    request: Mapping[str, Any]
    view: ApprovalView | None = None

    @property
    def id(self) -> str:
        return str(self.request["id"])

    @property
    def tool(self) -> str:
        return str(self.request.get("tool", ""))

    @property
    def approver_kind(self) -> str:
        """Who decides: "user" (the principal the call runs for) or "operator" (four eyes)."""
        return "user" if self.request.get("approver_kind") == "user" else "operator"

    @property
    def impact(self) -> Mapping[str, Any]:
        impact = self.request.get("impact")
        return impact if isinstance(impact, Mapping) else {}


def pending_approval(result: CallResult) -> PendingApproval | None:
    """The approval request an ``APPROVAL_REQUIRED`` answer opened; None for any other."""
    if result.error is None or result.error.code != ErrorCode.APPROVAL_REQUIRED:
        return None
    if isinstance(result.event, ApprovalRequested):
        event = result.event
        return PendingApproval(governance.approval_request_json(event), _view_of(event))
    if result.approval_request is not None and "id" in result.approval_request:
        return PendingApproval(result.approval_request)
    return None


def _view_of(event: ApprovalRequested) -> ApprovalView:
    env = event.envelope
    return ApprovalView(
        approval_id=event.approval_id,
        call_key=env.call_key,
        call_id=call_id_of(env.call_key),
        tenant_id=env.tenant_id,
        tool=env.tool,
        idempotency_key=env.idempotency_key,
        args_digest=env.args_digest,
        arguments=json.loads(event.arguments_redacted_json),
        impact=json.loads(event.impact_json),
        status="pending",
        requested_by=env.principal,
        requested_at=env.occurred_at,
        expires_at=event.expires_at,
        run_id=env.run_id,
    )


@dataclass(frozen=True, slots=True)
class Approve:
    """A human's grant of a pending request."""


@dataclass(frozen=True, slots=True)
class Deny:
    """A human's refusal of a pending request, and why (the agent reads it)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Decision:
    """What became of a decision: applied (``error`` None; ``confirmed`` False: appended, it
    applies shortly) or refused (``FORBIDDEN``: this decider may not; ``APPROVAL_INVALID``: the
    request is no longer pending; ``INTERNAL``: the ledger could not be reached)."""

    approval_id: str
    error: ErrorInfo | None = None
    confirmed: bool = True

    @property
    def ok(self) -> bool:
        return self.error is None


@runtime_checkable
class Approvals(Protocol):
    """Grants or denies a pending request as ``context``: the human who decides (the user the
    call runs for, or an operator). Over HTTP the client's token says who decides."""

    async def approve(self, request: PendingApproval, context: TrustedContext) -> Decision: ...

    async def deny(
        self, request: PendingApproval, context: TrustedContext, reason: str
    ) -> Decision: ...


@runtime_checkable
class Commander(Protocol):
    """What appends a decision: :meth:`producers.client.LedgerClient.command`."""

    async def command(
        self, record: Event, *, broadcast: bool = False, wait: float | None = None
    ) -> Event | None: ...


class LedgerApprovals:
    """:class:`Approvals` in-process: the rule checked here, the decision appended through
    ``client.command`` (an embedded or Kafka ``LedgerClient``)."""

    def __init__(self, client: Commander, *, ttl: timedelta = governance.DEFAULT_TOKEN_TTL) -> None:
        self._client = client
        self._ttl = ttl

    async def approve(self, request: PendingApproval, context: TrustedContext) -> Decision:
        view = request.view
        if view is None:
            return _not_recorded(request)
        refused = approve_refusal(context, view)
        if refused is not None:
            return Decision(request.id, refused)
        record, _token = governance.approve(
            governance.ApprovalTarget.of(view), context.principal, datetime.now(UTC), self._ttl
        )
        return await self._send(request, record)

    async def deny(
        self, request: PendingApproval, context: TrustedContext, reason: str
    ) -> Decision:
        view = request.view
        if view is None:
            return _not_recorded(request)
        refused = deny_refusal(context, view)
        if refused is not None:
            return Decision(request.id, refused)
        record = governance.deny(
            governance.ApprovalTarget.of(view),
            context.principal,
            deny_reason(reason),
            datetime.now(UTC),
        )
        return await self._send(request, record)

    async def _send(self, request: PendingApproval, record: Event) -> Decision:
        try:
            answer = await self._client.command(record)
        except TransportError as exc:
            error = ErrorInfo.of(ErrorCode.INTERNAL, f"The ledger could not be reached: {exc}")
            return Decision(request.id, error)
        if isinstance(answer, ToolCallRejected):
            return Decision(request.id, answer.error)
        return Decision(request.id, confirmed=answer is not None)


def deny_reason(reason: str) -> str:
    """A denial's reason as the ledger takes it (1 to ``MAX_REASON_CHARS`` characters)."""
    return reason.strip()[: governance.MAX_REASON_CHARS] or "No reason given."


def _not_recorded(request: PendingApproval) -> Decision:
    error = ErrorInfo.of(
        ErrorCode.APPROVAL_INVALID,
        f"Approval request {request.id} came from a remote ledger: decide it there "
        "(HttpLedgerClient.approve or deny).",
    )
    return Decision(request.id, error)


def approvals_for(client: object) -> Approvals:
    """The approver of a client: the client itself when it decides (``HttpLedgerClient``,
    ``toolledger.Ledger``), a :class:`LedgerApprovals` over an in-process client's command
    path (``LedgerClient``); TypeError for a client with neither."""
    if isinstance(client, Approvals):
        return client
    if isinstance(client, Commander):
        return LedgerApprovals(client)
    raise TypeError(
        f"a {type(client).__name__} cannot decide approval requests: pass approvals=..."
    )


async def apply_decision(
    approvals: Approvals,
    request: PendingApproval,
    context: TrustedContext,
    decision: Approve | Deny,
) -> Decision:
    """Apply a human's decision through ``approvals``."""
    if isinstance(decision, Deny):
        return await approvals.deny(request, context, decision.reason)
    return await approvals.approve(request, context)


NO_DECIDER = ErrorInfo.of(
    ErrorCode.FORBIDDEN,
    "The application named nobody to decide this request, and the agent's own credential "
    "does not decide its calls.",
    suggested_action="Pass approver= (the deciding human's context: the user with the scope "
    "'approvals:confirm', or an operator) or approvals= (a client holding their token).",
)


async def decide_as_named(
    client: object,
    approvals: Approvals | None,
    approver: TrustedContext | None,
    context: TrustedContext,
    request: PendingApproval,
    decision: Approve | Deny,
) -> Decision:
    """A human's decision, as an agent runtime (the adapters) sends it: the application names
    the decider, ``approver`` (their context, decided through ``approvals`` or the client's
    own, :func:`approvals_for`) or ``approvals`` alone (a client that decides with its own
    token, e.g. an ``HttpLedgerClient`` of the human; in-process it decides as ``context``).
    An approval with neither is refused (:data:`NO_DECIDER`): ``context`` is the agent's, and
    the agent does not confirm its own calls; a denial with neither is the agent withdrawing
    its request, as ``context`` (refusing runs nothing)."""
    if approver is None and approvals is None and isinstance(decision, Approve):
        return Decision(request.id, NO_DECIDER)
    return await apply_decision(
        approvals or approvals_for(client), request, approver or context, decision
    )
