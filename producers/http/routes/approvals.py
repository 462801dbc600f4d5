"""Approval requests: ``GET /v1/approval-requests`` (operators; one by id also for the
principal who asked), ``POST .../approve`` and ``POST .../deny``. Who decides is the request's
``approver_kind``: four eyes for ``operator`` (an operator other than the caller), the user
themself (or an operator) for ``user``; see ``producers.http.approval_decisions``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from toolledger.producers import governance
from toolledger.producers.http import approval_decisions
from toolledger.producers.http.access import Authenticated, Operator, tenant_of
from toolledger.producers.http.door import Door
from toolledger.producers.http.errors import refused
from toolledger.producers.http.openapi import documented, request_body
from toolledger.producers.http.operator_input import DecidableApproval, ReadableApproval, json_body
from toolledger.producers.http.responses import json_response
from toolledger.schemas.calls import decode_approval_cursor
from toolledger.schemas.errors import ErrorCode

router = APIRouter(tags=["approval requests"])


class DenyBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    reason: Annotated[str, Field(min_length=1, max_length=governance.MAX_REASON_CHARS)]


deny_body = json_body(DenyBody)


@router.get("/v1/approval-requests", operation_id="listApprovalRequests", responses=documented(200))
async def list_approvals(
    door: Door,
    context: Operator,
    status: Literal["pending", "approved", "denied", "consumed", "expired"] | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=512, pattern=r"^[A-Za-z0-9_-]+$")] = None,
) -> Response:
    if cursor is not None:
        try:
            decode_approval_cursor(cursor)
        except ValueError:
            raise refused(
                ErrorCode.VALIDATION_FAILED, "The cursor is not one this API gave out."
            ) from None
    page = await door.queries.approvals(
        tenant_of(context), status=status, now=datetime.now(UTC), limit=limit, after=cursor
    )
    return json_response(
        {"items": [v.to_json() for v in page.items], "next_cursor": page.next_cursor}
    )


@router.get(
    "/v1/approval-requests/{approval_id}",
    operation_id="getApprovalRequest",
    responses=documented(200),
)
async def get_approval(door: Door, context: Authenticated, view: ReadableApproval) -> Response:
    """One request: for the tenant's operators, and for the principal who asked for it. They
    also see ``raw_arguments``, the exact values (read from the intents; null once their
    retention dropped them), beside the redacted ``arguments`` of the audit trail."""
    body = view.to_json()
    if approval_decisions.may_see_action(context, view):
        body["raw_arguments"] = await approval_decisions.exact_arguments(door, view)
    response = json_response(body)
    response.headers["Cache-Control"] = "no-store"  # raw values: kept by no cache
    return response


@router.post(
    "/v1/approval-requests/{approval_id}/approve",
    operation_id="approveApprovalRequest",
    responses=documented(200, 202),
)
async def approve(door: Door, context: Authenticated, view: DecidableApproval) -> Response:
    """Grant the request. The grant sits in the call key's approval book: the caller's retry
    with the same key and arguments goes ahead without a token (the token in the answer is
    for out-of-band flows). Who may approve: ``producers.http.approval_decisions``."""
    decided = await approval_decisions.approve(door, context, view)
    assert decided.expires_at is not None
    body = {
        "approver": context.principal,
        "decided_at": decided.view.decided_at.isoformat() if decided.view.decided_at else None,
        "approval_token": decided.token,
        "expires_at": decided.expires_at.isoformat(),
        "approval_request": decided.view.to_json(),
        "confirmed": decided.confirmed,
    }
    # not confirmed: appended, it applies shortly (the retry may still find it pending)
    return json_response(body, status=200 if decided.confirmed else 202)


@router.post(
    "/v1/approval-requests/{approval_id}/deny",
    operation_id="denyApprovalRequest",
    responses=documented(200, 202),
    openapi_extra=request_body(DenyBody.model_json_schema()),
)
async def deny(
    door: Door,
    context: Authenticated,
    body: Annotated[DenyBody, Depends(deny_body)],
    view: DecidableApproval,
) -> Response:
    decided = await approval_decisions.deny(door, context, view, body.reason)
    return json_response(
        {
            "approver": context.principal,
            "decided_at": decided.view.decided_at.isoformat() if decided.view.decided_at else None,
            "approval_request": decided.view.to_json(),
            "confirmed": decided.confirmed,
        },
        status=200 if decided.confirmed else 202,
    )
