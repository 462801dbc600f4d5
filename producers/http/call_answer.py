"""The answer to ``POST /v1/tools/{tool}/calls`` once the ledger has answered the call: the
Call resource (200, or 202 while it runs) or the executor's refusal as a problem."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.responses import Response

from toolledger.producers.client import CallResult, TrustedContext
from toolledger.producers.http import governance
from toolledger.producers.http.call_views import pending_view, projected, transient_view, view_bytes
from toolledger.producers.http.door import FrontDoor, ToolInfo
from toolledger.producers.http.problems import problem
from toolledger.producers.http.responses import JSON, error_response, problem_response
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.events import ApprovalRequested
from toolledger.schemas.status import CallStatus

# refusals a caller may retry after a while: when (seconds)
RETRY_AFTER: dict[str, str] = {
    ErrorCode.IDEMPOTENCY_KEY_IN_USE: "1",
    ErrorCode.RATE_LIMITED: "1",
    ErrorCode.TOOL_DISABLED: "60",
}


def retry_after(code: str) -> dict[str, str] | None:
    after = RETRY_AFTER.get(code)
    return {"Retry-After": after} if after else None


async def answer(
    door: FrontDoor,
    context: TrustedContext,
    tool: str,
    key: str | None,
    result: CallResult,
    wait: float,
) -> Response:
    call_id = result.call_id
    named = {"call_id": call_id or None}  # the call a problem is about, in the key's scope
    if result.rejected:
        assert result.error is not None
        body = problem(result.error, errors=list(result.field_errors)).model_copy(update=named)
        if isinstance(result.event, ApprovalRequested):
            body.approval_request = await governance.approval_request(door, result.event)
        return problem_response(body, retry_after(result.error.code))
    if result.status is CallStatus.PENDING and result.job is not None and result.event:
        # a long-running call's job runs: 202 with the job (a retry: the same job, replayed)
        view = await projected(door, context.tenant_id, call_id, result.event.event_id)
        if view is None:
            return error_response(
                ErrorCode.INTERNAL,
                "The job started; its record is not readable yet.",
                headers={"Retry-After": "1"},
            )
        headers = {"Idempotent-Replayed": "true"} if result.replayed else {}
        if view.status.is_final:  # it finished meanwhile: the outcome
            return Response(view_bytes(view), media_type=JSON, headers=headers)
        headers["Location"] = f"/v1/calls/{call_id}"
        return Response(view_bytes(view), status_code=202, media_type=JSON, headers=headers)
    if result.status is CallStatus.PENDING:
        assert result.error is not None
        retry = {"Retry-After": "1"}
        if result.error.code == ErrorCode.INTERNAL:  # not reached or not decided: retry
            return problem_response(problem(result.error).model_copy(update=named), retry)
        if not result.running:  # another call with this key and these arguments runs
            in_use = ErrorInfo.of(
                ErrorCode.IDEMPOTENCY_KEY_IN_USE,
                f"The call with this key is still running after {wait:g} s.",
            )
            return problem_response(problem(in_use).model_copy(update=named), retry)
        view = await door.queries.get(context.tenant_id, call_id) if key else None
        if view is not None and view.last_intent_id != result.intent_id:
            view = None  # the projection has not reached this call's own events yet
        if view is not None and view.status.is_final:
            # it finished between the end of the wait and this read: answer the outcome
            return Response(view_bytes(view), media_type=JSON)
        location = {"Location": f"/v1/calls/{call_id}"}
        if view is None:
            view = pending_view(context, tool, key, result)
        return Response(view_bytes(view), status_code=202, media_type=JSON, headers=location)
    assert result.event is not None
    if not key:  # read-only: answered, never ledgered
        view = transient_view(context.tenant_id, tool, result)
        return Response(view_bytes(view), media_type=JSON)
    view = await projected(door, context.tenant_id, call_id, result.event.event_id)
    if view is None:
        return error_response(
            ErrorCode.INTERNAL,
            "The call finished; its record is not readable yet.",
            headers={"Retry-After": "1"},
        )
    headers = {"Idempotent-Replayed": "true"} if result.replayed else {}
    return Response(view_bytes(view), media_type=JSON, headers=headers)


def queued_probe(
    door: FrontDoor, context: TrustedContext, info: ToolInfo, arguments: dict[str, Any]
) -> Callable[[str, str], Awaitable[bool]]:
    """Whether another intent holds the key with these same arguments and is running: then
    this call, queued behind it, is answered 409 when its wait runs out
    (docs/architecture.md#the-http-contract).
    Arguments that differ from the key's first ones are never "in use": the executor refuses
    them at once with 422, and the caller waits for that answer. Asked only once a wait has
    run out, so the digest is computed only then."""
    digests: list[str | None] = []

    async def queued(call_id: str, intent_id: str) -> bool:
        if not digests:
            digests.append(info.digest(arguments))
        digest = digests[0]
        if digest is None:
            return False
        view = await door.queries.get(context.tenant_id, call_id)
        return (
            view is not None
            and view.status is CallStatus.PENDING
            and view.job is None  # a running job is answered (202, the job), never "in use"
            and view.last_intent_id != intent_id
            and view.args_digest == digest
        )

    return queued
