"""Approval requests, decided by operators: ``GET /v1/approval-requests`` (and one by id),
``POST .../approve`` (answers the approval token the caller presents with its retry) and
``POST .../deny``. Four eyes: an operator cannot approve a request it made itself."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from producers import governance
from producers.http.access import Operator, tenant_of
from producers.http.door import Door
from producers.http.errors import ProblemError, refused
from producers.http.governance import command
from producers.http.openapi import documented, request_body
from producers.http.operator_input import PendingApproval, ReadableApproval, json_body
from producers.http.problems import problem
from producers.http.responses import json_response
from schemas.calls import ApprovalView, decode_approval_cursor
from schemas.errors import ErrorCode, ErrorInfo

router = APIRouter(tags=["approval requests"])


class DenyBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    reason: Annotated[str, Field(min_length=1, max_length=governance.MAX_REASON_CHARS)]


deny_body = json_body(DenyBody)


def _target(view: ApprovalView) -> governance.ApprovalTarget:
    return governance.ApprovalTarget(
        view.approval_id, view.tenant_id, view.tool, view.idempotency_key, view.args_digest
    )


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
async def get_approval(view: ReadableApproval) -> Response:
    """One request: for the tenant's operators, and for the principal who asked for it."""
    return json_response(view.to_json())


@router.post(
    "/v1/approval-requests/{approval_id}/approve",
    operation_id="approveApprovalRequest",
    responses=documented(200, 202),
)
async def approve(door: Door, context: Operator, view: PendingApproval) -> Response:
    if (view.tenant_id, view.requested_by) == (context.tenant_id, context.principal):
        four_eyes = ErrorInfo.of(
            ErrorCode.FORBIDDEN,
            f"Four eyes: {context.principal!r} asked for this call, so another operator "
            "must approve it.",
            suggested_action="Ask another operator of this tenant to approve the request "
            "(a token with the 'operator' scope and another principal).",
        )
        raise ProblemError(problem(four_eyes))
    decided_at = datetime.now(UTC)
    record, token = governance.approve(
        _target(view), context.principal, decided_at, door.approval_token_ttl
    )
    answer = await command(door, record)
    door.metrics.operator_actions.labels("approve").inc()
    body = {
        "approval_token": token,
        "expires_at": record.expires_at.isoformat(),
        "approval_request": view.model_copy(
            update={"status": "approved", "approver": context.principal, "decided_at": decided_at}
        ).to_json(),
    }
    if answer is None:  # appended, not confirmed yet: the token works once it applies
        return json_response({**body, "confirmed": False}, status=202)
    return json_response({**body, "expires_at": answer.expires_at.isoformat(), "confirmed": True})


@router.post(
    "/v1/approval-requests/{approval_id}/deny",
    operation_id="denyApprovalRequest",
    responses=documented(200, 202),
    openapi_extra=request_body(DenyBody.model_json_schema()),
)
async def deny(
    door: Door,
    context: Operator,
    body: Annotated[DenyBody, Depends(deny_body)],
    view: PendingApproval,
) -> Response:
    decided_at = datetime.now(UTC)
    record = governance.deny(_target(view), context.principal, body.reason, decided_at)
    answer = await command(door, record)
    door.metrics.operator_actions.labels("deny").inc()
    denied = view.model_copy(
        update={
            "status": "denied",
            "reason": body.reason,
            "approver": context.principal,
            "decided_at": decided_at,
        }
    )
    return json_response(
        {"approval_request": denied.to_json(), "confirmed": answer is not None},
        status=200 if answer is not None else 202,
    )
