"""Reading calls: ``GET /v1/calls/{call_id}``, its audit trail ``.../events``, and the search
``GET /v1/calls``. Another tenant's call is not found, never forbidden."""

from __future__ import annotations

import json
import re
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from toolledger.producers.approval_rules import reader_of, reads
from toolledger.producers.http.access import Authenticated
from toolledger.producers.http.call_views import awaiting_approval_view, read_only_view, view_bytes
from toolledger.producers.http.door import Door
from toolledger.producers.http.errors import not_found, refused
from toolledger.producers.http.models import NO_CONTROL, Call, CallList, EventPage
from toolledger.producers.http.openapi import ERRORS
from toolledger.producers.http.responses import JSON
from toolledger.schemas.calls import CallFilter, decode_cursor
from toolledger.schemas.errors import ErrorCode
from toolledger.schemas.status import CallStatus

CALL_ID = re.compile(r"call_[0-9a-f]{32}")  # CallKey.call_id: anything else is not a call
_NO_CALL = "Check the call id (calls of other tenants are not visible to this token)."

router = APIRouter(tags=["calls"])


def _json(body: object) -> Response:
    return Response(json.dumps(body, separators=(",", ":")).encode(), media_type=JSON)


@router.get(
    "/v1/calls/{call_id}", operation_id="getCall", responses={200: {"model": Call}, **ERRORS}
)
async def get_call(call_id: str, door: Door, context: Authenticated) -> Response:
    view = None
    if CALL_ID.fullmatch(call_id):
        view = await door.queries.get(context.tenant_id, call_id)
        view = view or await read_only_view(door, context.tenant_id, call_id)
        view = view or await awaiting_approval_view(door, context.tenant_id, call_id)
    if view is None or not reads(context, view.call_key):
        raise not_found("No call with this id.", _NO_CALL)
    return Response(view_bytes(view), media_type=JSON)


@router.get("/v1/calls", operation_id="searchCalls", responses={200: {"model": CallList}, **ERRORS})
async def search_calls(
    door: Door,
    context: Authenticated,
    tool: Annotated[str | None, Query(max_length=64, pattern=NO_CONTROL)] = None,
    idempotency_key: Annotated[
        str | None, Query(min_length=1, max_length=255, pattern=r"^[ -~]+$")
    ] = None,
    run_id: Annotated[str | None, Query(max_length=255, pattern=NO_CONTROL)] = None,
    status: CallStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=128, pattern=r"^[A-Za-z0-9_-]+$")] = None,
) -> Response:
    try:
        after = decode_cursor(cursor) if cursor else None
    except ValueError:
        raise refused(
            ErrorCode.VALIDATION_FAILED, "The cursor is not one this API gave out."
        ) from None
    found = await door.queries.search(
        context.tenant_id,
        CallFilter(tool, idempotency_key, run_id, status, reader_of(context)),
        limit=limit,
        after=after,
    )
    items = [json.loads(view_bytes(v)) for v in found.items]
    return _json({"items": items, "next_cursor": found.next_cursor})


@router.get(
    "/v1/calls/{call_id}/events",
    operation_id="getCallEvents",
    responses={200: {"model": EventPage}, **ERRORS},
)
async def call_events(call_id: str, door: Door, context: Authenticated) -> Response:
    events = (
        await door.queries.events(context.tenant_id, call_id)
        if CALL_ID.fullmatch(call_id)
        else None
    )
    if events is not None and not reads(context, events[0]["envelope"]["call_key"]):
        events = None
    if events is None:
        raise not_found("No call with this id.", _NO_CALL)
    return _json({"items": events, "next_cursor": None})
