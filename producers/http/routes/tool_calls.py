"""``POST /v1/tools/{tool}/calls``: a tool call, executed at most once per idempotency key.

Refused before anything is appended, in this order: authentication (401), the tool (404), the
body (400, 413), the key (400), then, audited with the key left unused, the tool's scopes (403),
the rate limits (429), the kill switch and the run budget (503, 422).

A call that needs a human's approval answers 428 with the request; sent with ``Prefer: wait=N``
the answer waits for the decision and then answers the call (see ``approval_wait``)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.routing import Route

from toolledger.producers.client import CallResult
from toolledger.producers.http.access import Authenticated, bearer
from toolledger.producers.http.approval_wait import awaited_request, decided_within
from toolledger.producers.http.call_admission import AdmissionChecked, admit
from toolledger.producers.http.call_answer import answer, queued_probe
from toolledger.producers.http.call_input import (
    Body,
    DecisionWait,
    Key,
    KnownTool,
    Started,
    Wait,
    call_body,
    call_key,
    decision_wait_asked,
    known_tool,
    wait_asked,
)
from toolledger.producers.http.door import Door, door_of
from toolledger.producers.http.models import CallBody
from toolledger.producers.http.openapi import CALLS_PATH, call_responses, request_body

router = APIRouter(tags=["tool calls"])


@router.post(
    CALLS_PATH,
    operation_id="callTool",
    responses=call_responses(),
    openapi_extra=request_body(CallBody.model_json_schema()),
)
async def call_tool(
    started: Started,
    door: Door,
    context: Authenticated,
    info: KnownTool,
    body: Body,
    key: Key,
    _checked: AdmissionChecked,
    wait: Wait,
    decision_wait: DecisionWait,
) -> Response:
    deadline = started + wait

    async def call(token: str | None, deadline: float) -> CallResult:
        return await door.client.call(
            info.name,
            body.arguments,
            idempotency_key=key,
            context=context,
            wait=max(0.0, deadline - time.monotonic()),
            run_id=body.run_id,
            step_id=body.step_id,
            approval_token=token,
            queued=queued_probe(door, context, info, body.arguments) if key else None,
        )

    result = await call(body.approval_token, deadline)
    request = awaited_request(result)
    # Prefer: wait covers the human's decision too (producers/http/approval_wait.py); then
    # the grant is in the key's book, and the same call goes ahead without a token
    decision_deadline = started + decision_wait
    if (
        request is not None
        and time.monotonic() < decision_deadline
        and await decided_within(
            door.queries, context.tenant_id, request.approval_id, decision_deadline
        )
    ):
        result = await call(None, max(deadline, decision_deadline))
    response = await answer(door, context, info.name, key, result, wait)
    door.metrics.observe(info.name, response.status_code, result, time.monotonic() - started)
    return response


async def _call_tool_directly(request: Request) -> Response:
    """:func:`call_tool` with its parts read by the very functions its dependencies name,
    called here in the order FastAPI resolves them (so the same refusal wins), without
    FastAPI's dependency resolution: about a third of a call's CPU on the hot path. The
    FastAPI route stays registered behind it, for the OpenAPI document."""
    started = time.monotonic()
    door = await door_of(request)
    context = await bearer(request)
    info = await known_tool(request.path_params["tool"], door)
    body = await call_body(request, info)
    key = await call_key(request, info)
    await admit(door, context, info, body, key)
    wait = await wait_asked(request)
    decision_wait = await decision_wait_asked(request)
    return await call_tool(started, door, context, info, body, key, None, wait, decision_wait)


FAST_ROUTE = Route(CALLS_PATH, _call_tool_directly, methods=["POST"])
