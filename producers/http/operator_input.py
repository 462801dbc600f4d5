"""What an operator's request says, read by FastAPI dependencies: a small JSON body (400, 413),
an approval request that exists in the operator's reach (404) and is still pending (409), and
a tool that can be switched (404)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, TypeVar

from fastapi import Depends, Request
from pydantic import BaseModel, ValidationError

from toolledger.producers.http.access import (
    GLOBAL_OPERATOR,
    OPERATOR,
    Authenticated,
    Operator,
    tenant_of,
)
from toolledger.producers.http.door import Door
from toolledger.producers.http.errors import ProblemError, invalid, not_found, refused
from toolledger.producers.http.problems import problem
from toolledger.producers.http.responses import field_errors, read_capped
from toolledger.producers.http.validation import body_fix
from toolledger.schemas.calls import ApprovalView
from toolledger.schemas.errors import ErrorCode, ErrorInfo

MAX_OPERATOR_BODY = 16 << 10
APPROVAL_ID = re.compile(r"apr_[0-9a-f]{24}")
_LIST_THEM = "List them with GET /v1/approval-requests?status=pending."

Model = TypeVar("Model", bound=BaseModel)


def json_body(model: type[Model]) -> Callable[[Request], Awaitable[Model]]:
    """A dependency reading the body as ``model`` (an empty body is ``{}``)."""

    async def read(request: Request) -> Model:
        raw = await read_capped(request, MAX_OPERATOR_BODY)
        if raw is None:
            raise refused(
                ErrorCode.PAYLOAD_TOO_LARGE, f"The body is larger than {MAX_OPERATOR_BODY} bytes."
            )
        try:
            return model.model_validate_json(raw or b"{}")
        except ValidationError as exc:
            errors = field_errors(exc.errors())
            action = body_fix(errors, again="send the request again")
            raise invalid("The body is invalid:", errors, action) from None

    return read


async def _lookup(door: Door, tenant_id: str | None, approval_id: str) -> ApprovalView | None:
    if not APPROVAL_ID.fullmatch(approval_id):  # anything else was never handed out
        return None
    return await door.queries.approval(tenant_id, approval_id, now=datetime.now(UTC))


def _not_found() -> ProblemError:
    # another tenant's request is not found, never forbidden
    return not_found("No approval request with this id.", _LIST_THEM)


async def approval(approval_id: str, door: Door, context: Operator) -> ApprovalView:
    view = await _lookup(door, tenant_of(context), approval_id)
    if view is None:
        raise _not_found()
    return view


async def readable_approval(approval_id: str, door: Door, context: Authenticated) -> ApprovalView:
    """A request as its reader may see it: the tenant's operators see every one, the principal
    who asked sees its own (so an agent can follow the approval it waits for); to anyone else
    it is not found."""
    if OPERATOR in context.scopes or GLOBAL_OPERATOR in context.scopes:
        return await approval(approval_id, door, context)
    view = await _lookup(door, context.tenant_id, approval_id)
    if view is None or view.requested_by != context.principal:
        raise _not_found()
    return view


async def decidable_approval(approval_id: str, door: Door, context: Authenticated) -> ApprovalView:
    """A pending request of the caller's tenant (every tenant for a global operator): 404
    otherwise, 409 once decided or expired. Whether this caller may decide it is the
    decision's rule (``producers.http.approval_decisions``: 403)."""
    operator = OPERATOR in context.scopes or GLOBAL_OPERATOR in context.scopes
    view = await _lookup(door, tenant_of(context) if operator else context.tenant_id, approval_id)
    if view is None:
        raise _not_found()
    if view.status != "pending":
        raise ProblemError(
            problem(
                ErrorInfo.of(
                    ErrorCode.APPROVAL_INVALID,
                    f"The approval request is {view.status}: it cannot be decided again.",
                ),
                status=409,
            )
        )
    return view


async def switchable_tool(tool: str, door: Door) -> str:
    """A registered tool, or ``*`` (every tool)."""
    if tool != "*" and tool not in door.tools:
        raise refused(ErrorCode.TOOL_NOT_FOUND, f"There is no tool named {tool!r}.")
    return tool


Approval = Annotated[ApprovalView, Depends(approval)]
ReadableApproval = Annotated[ApprovalView, Depends(readable_approval)]
DecidableApproval = Annotated[ApprovalView, Depends(decidable_approval)]
SwitchableTool = Annotated[str, Depends(switchable_tool)]
