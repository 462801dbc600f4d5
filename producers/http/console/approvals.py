"""Approval requests: the queue (pending first, oldest first), a request's page with the exact
action and its impact, and approve / deny with a reason. The request is looked up as the API
does (``operator_input``: 404 another tenant's, 409 no longer pending) and decided by
``approval_decisions``, which holds the user and four-eyes rules (403)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from toolledger.producers import approval_rules, governance
from toolledger.producers.http import approval_decisions
from toolledger.producers.http.access import tenant_of
from toolledger.producers.http.console.guard import (
    PREFIX,
    CheckedForm,
    ConsoleRoute,
    Refused,
    Signed,
    redirect,
    require_operator,
)
from toolledger.producers.http.console.pages import render
from toolledger.producers.http.door import FrontDoor
from toolledger.producers.http.operator_input import decidable_approval, readable_approval
from toolledger.schemas.calls import APPROVAL_STATUSES, ApprovalView, decode_approval_cursor

QUEUE = f"{PREFIX}/approvals"
PAGE = 50

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


@router.get(QUEUE)
async def queue(
    request: Request,
    session: Signed,
    status: Annotated[str, Query(max_length=16)] = "pending",
    cursor: Annotated[str, Query(max_length=512)] = "",
) -> Response:
    require_operator(session, "approvals queue")
    door: FrontDoor = request.app.state.door
    chosen = status if status in APPROVAL_STATUSES else None
    if cursor:
        try:
            decode_approval_cursor(cursor)
        except ValueError:
            raise Refused(
                400, "Invalid", "The page link is not one this console gave out."
            ) from None
    page = await door.queries.approvals(
        tenant_of(session.context),
        status=chosen,
        now=datetime.now(UTC),
        limit=PAGE,
        after=cursor or None,
    )
    items = sorted(page.items, key=lambda v: v.status != "pending")  # stable: pending first
    return render(
        request,
        "approvals.html",
        session,
        items=items,
        status=chosen or "",
        statuses=APPROVAL_STATUSES,
        next_cursor=page.next_cursor,
    )


async def exact_action(door: FrontDoor, view: ApprovalView) -> Any:
    """The arguments shown to the one deciding (the page is readable only by them and the
    user it is for): the exact values from the intents, or the redacted ones once the
    intents' retention dropped them."""
    raw = await approval_decisions.exact_arguments(door, view)
    return view.arguments if raw is None else raw


@router.get(f"{QUEUE}/{{approval_id}}")
async def approval_page(
    request: Request, session: Signed, approval_id: str, done: str = ""
) -> Response:
    door: FrontDoor = request.app.state.door
    view = await readable_approval(approval_id, door, session.context)
    pending = view.status == "pending"
    may_deny = pending and approval_rules.deny_refusal(session.context, view) is None
    refusal = approval_rules.approve_refusal(session.context, view)
    return render(
        request,
        "approval.html",
        session,
        view=view,
        impact=view.to_json()["impact"],
        arguments=await exact_action(door, view),
        may_deny=may_deny,
        approve_refusal=refusal.message if refusal is not None else None,
        done=done if done in {"approved", "approved-later", "denied", "denied-later"} else "",
        max_reason=governance.MAX_REASON_CHARS,
    )


@router.post(f"{QUEUE}/{{approval_id}}/approve")
async def approve(
    request: Request, session: Signed, form: CheckedForm, approval_id: str
) -> Response:
    door: FrontDoor = request.app.state.door
    view = await decidable_approval(approval_id, door, session.context)
    decided = await approval_decisions.approve(door, session.context, view)
    done = "approved" if decided.confirmed else "approved-later"
    return redirect(f"{QUEUE}/{view.approval_id}?done={done}", request)


@router.post(f"{QUEUE}/{{approval_id}}/deny")
async def deny(request: Request, session: Signed, form: CheckedForm, approval_id: str) -> Response:
    reason = form.get("reason", "").strip()
    if not 1 <= len(reason) <= governance.MAX_REASON_CHARS:
        raise Refused(
            400, "Invalid", f"Give a reason of 1 to {governance.MAX_REASON_CHARS} characters."
        )
    door: FrontDoor = request.app.state.door
    view = await decidable_approval(approval_id, door, session.context)
    decided = await approval_decisions.deny(door, session.context, view, reason)
    done = "denied" if decided.confirmed else "denied-later"
    return redirect(f"{QUEUE}/{view.approval_id}?done={done}", request)
