"""Who may decide an approval request: pure rules over the decider's trusted context and the
request as the ledger recorded it. Every front end that decides (the HTTP routes, the
operator console, the agent adapters, the MCP server's elicitation) asks these, so the rules
are written once.

Who decides is the request's ``approver_kind`` (the tool's rule chose it from the arguments):

- ``operator``: four eyes. An operator of the tenant (scope ``operator``, or
  ``operator:global``) approves, and never the principal who made the call.
- ``user``: the principal the call runs for confirms their own agent's action, with a
  credential the agent's token does not carry: the scope ``approvals:confirm`` (the user's own
  token, or a console session signed in with it), or an answer the user gave in person (an MCP
  client's elicitation, asked of its human: :func:`confirmed_in_person`). The token that made
  the call, without that scope, cannot confirm it. The tenant's operators may approve too (the
  user is not always there).

Whoever may approve a request may deny it, and so may every operator of the tenant (the
requester of a four-eyes request too, if it is an operator), and for a ``user`` request the
principal who asked, without the confirming scope too (refusing runs nothing). Nobody decides
another tenant's request but a global operator (``operator:global``): the HTTP API does not
even find it, and these rules refuse it for the front ends that hold the request in hand (the
SDK's in-process decisions).

Who reads a call of the tenant follows its key's scope (:func:`reads`): a call whose key is
scoped by principal is read by that principal and the tenant's operators only.
"""

from __future__ import annotations

from dataclasses import replace

from toolledger.producers.client import TrustedContext
from toolledger.schemas.calls import ApprovalView
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.keys import call_key_of

OPERATOR = "operator"
GLOBAL_OPERATOR = "operator:global"
CONFIRM = "approvals:confirm"  # a user's own credential: confirms what their agent asked


def is_operator(context: TrustedContext) -> bool:
    return OPERATOR in context.scopes or GLOBAL_OPERATOR in context.scopes


def reader_of(context: TrustedContext) -> str | None:
    """Whose calls ``context`` reads among its tenant's: an operator every call (None), any
    other caller the tenant's and its own (``CallFilter.reader``), so that a call whose key is
    scoped by principal is nobody else's to read."""
    return None if is_operator(context) else context.principal


def reads(context: TrustedContext, call_key: str) -> bool:
    """Whether ``context`` may read the call of ``call_key`` of its tenant (see
    :func:`reader_of`; a view that knows no key, such as a read's, is the tenant's)."""
    key = call_key_of(call_key)
    return is_operator(context) or key is None or key.visible_to(context.principal)


def is_requester(context: TrustedContext, view: ApprovalView) -> bool:
    return (view.tenant_id, view.requested_by) == (context.tenant_id, context.principal)


def confirmed_in_person(context: TrustedContext) -> TrustedContext:
    """``context`` deciding with the user's own confirmation: for a front end that asked the
    user in person (an MCP client's elicitation, answered by its human), not for a token."""
    return replace(context, scopes=context.scopes | {CONFIRM})


def tenant_refusal(context: TrustedContext, view: ApprovalView) -> ErrorInfo | None:
    """A request of another tenant: only a global operator decides it."""
    if view.tenant_id == context.tenant_id or GLOBAL_OPERATOR in context.scopes:
        return None
    return ErrorInfo.of(
        ErrorCode.FORBIDDEN,
        "This approval request belongs to another tenant.",
        suggested_action="Ask an operator of the tenant the call runs in.",
    )


def approve_refusal(context: TrustedContext, view: ApprovalView) -> ErrorInfo | None:
    """Why ``context`` may not approve ``view``; None: it may."""
    foreign = tenant_refusal(context, view)
    if foreign is not None:
        return foreign
    if view.approver_kind == "user":
        if is_operator(context) or (is_requester(context, view) and CONFIRM in context.scopes):
            return None
        if is_requester(context, view):
            return ErrorInfo.of(
                ErrorCode.FORBIDDEN,
                f"This request is for {view.requested_by!r} to confirm with their own "
                f"credential (scope '{CONFIRM}'); the token that made the call cannot.",
                suggested_action=f"Ask the user to confirm it with their token (scope "
                f"'{CONFIRM}') or in the console, or an operator of this tenant.",
            )
        return ErrorInfo.of(
            ErrorCode.FORBIDDEN,
            f"This request is for {view.requested_by!r} to confirm: another user cannot decide it.",
            suggested_action="Ask the user the call runs for, or an operator of this tenant.",
        )
    if not is_operator(context):
        return ErrorInfo.of(
            ErrorCode.FORBIDDEN,
            "An operator approves this request (the tool needs four eyes), and this token has "
            "no 'operator' scope.",
            suggested_action="Ask an operator of this tenant to approve it.",
        )
    if is_requester(context, view):
        return ErrorInfo.of(
            ErrorCode.FORBIDDEN,
            f"Four eyes: {context.principal!r} asked for this call, so another operator "
            "must approve it.",
            suggested_action="Ask another operator of this tenant to approve the request "
            "(a token with the 'operator' scope and another principal).",
        )
    return None


def deny_refusal(context: TrustedContext, view: ApprovalView) -> ErrorInfo | None:
    """Why ``context`` may not deny ``view``; None: it may (whoever may approve it, the
    tenant's operators, and the principal who asked for a ``user`` request)."""
    withdraws = view.approver_kind == "user" and is_requester(context, view)
    if (is_operator(context) or withdraws) and tenant_refusal(context, view) is None:
        return None
    return approve_refusal(context, view)
