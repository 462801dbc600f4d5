"""Deciding an approval request from the HTTP front ends (the routes and the operator
console): the decision sent to the ledger, and who may see the exact action. Who may decide is
``producers.approval_rules`` (shared with the adapters and the MCP server)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from toolledger.producers import governance
from toolledger.producers.approval_rules import (
    approve_refusal,
    deny_refusal,
    is_operator,
    is_requester,
)
from toolledger.producers.client import TrustedContext
from toolledger.producers.http.door import FrontDoor
from toolledger.producers.http.errors import ProblemError
from toolledger.producers.http.governance import command
from toolledger.producers.http.problems import problem
from toolledger.schemas.calls import ApprovalView
from toolledger.schemas.errors import ErrorInfo


@dataclass(frozen=True, slots=True)
class Decided:
    """A decision sent to the ledger."""

    view: ApprovalView  # the request after the decision (status, approver, decided_at, reason)
    confirmed: bool  # applied by the ledger; False: appended, it applies shortly
    token: str | None = None  # approve: the token for out-of-band flows
    expires_at: datetime | None = None  # approve: when the grant (and the token) expires


def may_see_action(context: TrustedContext, view: ApprovalView) -> bool:
    """Whether ``context`` may see the request's exact action (its raw arguments): those who
    may decide it or, for a four-eyes request, the principal who made the call."""
    return is_operator(context) or is_requester(context, view)


async def exact_arguments(door: FrontDoor, view: ApprovalView) -> Any | None:
    """The request's arguments as the caller sent them, read from the intents (where raw
    arguments live): the intent of the call key whose arguments have the request's digest.
    None when the backend cannot say or the intents' retention dropped them. Shown only to
    those :func:`may_see_action` allows, never stored or logged."""
    tool = door.tools.get(view.tool)
    if door.intents is None or tool is None:
        return None
    for arguments_json in await door.intents.arguments(view.call_key, view.requested_at):
        try:
            raw = json.loads(arguments_json)
        except ValueError:
            continue
        if tool.digest(raw) == view.args_digest:
            return raw
    return None


def _forbid(info: ErrorInfo | None) -> None:
    if info is not None:
        raise ProblemError(problem(info))


async def approve(door: FrontDoor, context: TrustedContext, view: ApprovalView) -> Decided:
    """Grant ``view`` (a pending request) as ``context``; 403 if it may not."""
    _forbid(approve_refusal(context, view))
    decided_at = datetime.now(UTC)
    record, token = governance.approve(
        governance.ApprovalTarget.of(view), context.principal, decided_at, door.approval_token_ttl
    )
    answer = await command(door, record)
    door.metrics.operator_actions.labels("approve").inc()
    update = {"status": "approved", "approver": context.principal, "decided_at": decided_at}
    expires_at = answer.expires_at if answer is not None else record.expires_at
    return Decided(
        view.model_copy(update={**update, "expires_at": expires_at}),
        answer is not None,
        token,
        expires_at,
    )


async def deny(
    door: FrontDoor, context: TrustedContext, view: ApprovalView, reason: str
) -> Decided:
    """Deny ``view`` (a pending request) as ``context`` with ``reason``; 403 if it may not."""
    _forbid(deny_refusal(context, view))
    decided_at = datetime.now(UTC)
    record = governance.deny(
        governance.ApprovalTarget.of(view), context.principal, reason, decided_at
    )
    answer = await command(door, record)
    door.metrics.operator_actions.labels("deny").inc()
    update = {
        "status": "denied",
        "reason": reason,
        "approver": context.principal,
        "decided_at": decided_at,
    }
    return Decided(view.model_copy(update=update), answer is not None)
