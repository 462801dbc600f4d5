"""``create_app``: the HTTP API. Every route answers JSON or ``application/problem+json``;
bad input gets its documented 4xx and executes nothing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from producers.client import CallResult, LedgerClient, TrustedContext
from producers.http.auth import TokenStore
from producers.http.headers import idempotency_key, wait_seconds
from producers.http.metrics import Metrics
from producers.http.problems import Problem, page, problem, problem_bytes
from schemas.calls import CallFilter, CallQueries, CallView, decode_cursor
from schemas.errors import ErrorCode, ErrorInfo
from schemas.keys import CallKey, InvalidIdempotencyKey
from schemas.status import CallStatus

PROBLEM = "application/problem+json"
JSON = "application/json"
MAX_BODY_BYTES = (1 << 20) + (64 << 10)  # the 1 MiB argument limit plus room for the envelope
PROJECTION_WAIT_S = 10.0


@dataclass(frozen=True, slots=True)
class ToolInfo:
    name: str
    keyed: bool  # needs an Idempotency-Key (mutation, long_running)
    manifest: dict[str, Any]


@dataclass
class FrontDoor:
    """What the HTTP API needs; the composition root builds it for a backend."""

    client: LedgerClient
    queries: CallQueries
    tools: Mapping[str, ToolInfo]
    tokens: TokenStore
    ready: Callable[[], Awaitable[dict[str, bool]]]
    key_retention: str = "forever"
    metrics: Metrics = field(default_factory=Metrics)


class CallBody(BaseModel):
    """The request body of ``POST /v1/tools/{tool}/calls``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    arguments: dict[str, Any]
    run_id: Annotated[str, Field(min_length=1, max_length=255)] | None = None
    step_id: Annotated[str, Field(min_length=1, max_length=255)] | None = None
    approval_token: Annotated[str, Field(min_length=1, max_length=4096)] | None = None


class CallPage(BaseModel):
    items: list[CallView]
    next_cursor: str | None


class EventPage(BaseModel):
    items: list[dict[str, Any]]
    next_cursor: str | None = None


class ToolPage(BaseModel):
    items: list[dict[str, Any]]
    next_cursor: str | None = None
    key_retention: str


_HIDDEN = {"last_event_id", "last_intent_id"}
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "content": {PROBLEM: {}}, "description": description}
    for status, description in [
        (400, "Invalid request"),
        (401, "Not authenticated"),
        (403, "Forbidden"),
        (404, "Not found"),
        (405, "Method not allowed"),
        (409, "Still running"),
        (413, "Too large"),
        (422, "Key reused"),
        (428, "Approval required"),
        (429, "Rate limited"),
        (502, "Downstream failure"),
        (503, "Unavailable"),
    ]
}


def _problem_response(p: Problem, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        problem_bytes(p), status_code=p.status, media_type=PROBLEM, headers=dict(headers or {})
    )


def _error(
    code: ErrorCode,
    message: str,
    *,
    status: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    return _problem_response(problem(ErrorInfo.of(code, message), status=status), headers)


def _view_bytes(view: CallView) -> bytes:
    return view.model_dump_json(exclude=_HIDDEN).encode()


async def _read_capped(request: Request, cap: int) -> bytes | None:
    """The body, or ``None`` if it is larger than ``cap`` (stops reading there)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > cap:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(door: FrontDoor) -> FastAPI:
    app = FastAPI(
        title="toolledger",
        version="1",
        description="An execution ledger for AI agents' tool calls: at most once per "
        "idempotency key, replays answered from the ledger.",
    )

    def authenticate(request: Request) -> TrustedContext | Response:
        context = door.tokens.authenticate(request.headers.get("authorization"))
        if context is None:
            return _error(
                ErrorCode.UNAUTHENTICATED,
                "Send 'Authorization: Bearer <token>'.",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return context

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = {405: "METHOD_NOT_ALLOWED", 404: "NOT_FOUND"}.get(exc.status_code, "INTERNAL")
        p = Problem(
            type=f"/problems/{code}",
            title=code.replace("_", " ").capitalize(),
            status=exc.status_code,
            detail=str(exc.detail),
            code=code,
            retryable=False,
            suggested_action="Check the method and the path against /openapi.json.",
        )
        return _problem_response(p, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        return _error(
            ErrorCode.VALIDATION_FAILED,
            "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()),
        )

    @app.post(
        "/v1/tools/{tool}/calls",
        responses={
            200: {"model": CallView, "description": "The call finished (or a replay)"},
            202: {"model": CallView, "description": "Still running after the wait"},
            **_ERRORS,
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {JSON: {"schema": CallBody.model_json_schema()}},
            }
        },
    )
    async def call_tool(
        tool: str,
        request: Request,
        idempotency_key_header: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
        prefer: Annotated[str | None, Header()] = None,
    ) -> Response:
        started = time.monotonic()
        context = authenticate(request)
        if isinstance(context, Response):
            return context
        info = door.tools.get(tool)
        if info is None:
            return _error(ErrorCode.TOOL_NOT_FOUND, f"There is no tool named {tool!r}.")
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != JSON:
            return _error(ErrorCode.VALIDATION_FAILED, "Send the body as application/json.")
        raw = await _read_capped(request, MAX_BODY_BYTES)
        if raw is None:
            return _error(
                ErrorCode.PAYLOAD_TOO_LARGE, f"The body is larger than {MAX_BODY_BYTES} bytes."
            )
        try:
            body = CallBody.model_validate_json(raw)
        except ValueError as exc:
            return _error(
                ErrorCode.VALIDATION_FAILED, f"The body is not a valid call: {exc}"[:2000]
            )
        key: str | None = None
        if info.keyed:
            try:
                key = idempotency_key(request.headers.getlist("idempotency-key"))
            except InvalidIdempotencyKey as exc:
                return _error(ErrorCode.IDEMPOTENCY_KEY_INVALID, str(exc).capitalize() + ".")
            if key is None:
                return _error(
                    ErrorCode.IDEMPOTENCY_KEY_MISSING,
                    f"{tool} changes something: send an Idempotency-Key header.",
                )
        wait = wait_seconds(request.headers.getlist("prefer"))
        result = await door.client.call(
            tool,
            body.arguments,
            idempotency_key=key,
            context=context,
            wait=wait,
            run_id=body.run_id,
            step_id=body.step_id,
            approval_token=body.approval_token,
        )
        response = await _answer(door, context, tool, key, result, wait)
        door.metrics.observe(tool, response.status_code, result, time.monotonic() - started)
        return response

    @app.get("/v1/calls/{call_id}", responses={200: {"model": CallView}, **_ERRORS})
    async def get_call(call_id: str, request: Request) -> Response:
        context = authenticate(request)
        if isinstance(context, Response):
            return context
        view = await door.queries.get(context.tenant_id, call_id)
        if view is None:  # another tenant's call is not found, never forbidden
            return _error(ErrorCode.TOOL_NOT_FOUND, "No call with this id.", status=404)
        return Response(_view_bytes(view), media_type=JSON)

    @app.get("/v1/calls", responses={200: {"model": CallPage}, **_ERRORS})
    async def search_calls(
        request: Request,
        tool: Annotated[str | None, Query(max_length=64)] = None,
        idempotency_key: Annotated[str | None, Query(max_length=255)] = None,
        run_id: Annotated[str | None, Query(max_length=255)] = None,
        status: CallStatus | None = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: Annotated[str | None, Query(max_length=128)] = None,
    ) -> Response:
        context = authenticate(request)
        if isinstance(context, Response):
            return context
        try:
            after = decode_cursor(cursor) if cursor else None
        except ValueError:
            return _error(ErrorCode.VALIDATION_FAILED, "The cursor is not one this API gave out.")
        found = await door.queries.search(
            context.tenant_id,
            CallFilter(tool, idempotency_key, run_id, status),
            limit=limit,
            after=after,
        )
        body = {
            "items": [v.model_dump(mode="json", exclude=_HIDDEN) for v in found.items],
            "next_cursor": found.next_cursor,
        }
        return Response(json.dumps(body, separators=(",", ":")).encode(), media_type=JSON)

    @app.get("/v1/calls/{call_id}/events", responses={200: {"model": EventPage}, **_ERRORS})
    async def call_events(call_id: str, request: Request) -> Response:
        context = authenticate(request)
        if isinstance(context, Response):
            return context
        events = await door.queries.events(context.tenant_id, call_id)
        if events is None:
            return _error(ErrorCode.TOOL_NOT_FOUND, "No call with this id.", status=404)
        body = {"items": events, "next_cursor": None}
        return Response(json.dumps(body, separators=(",", ":")).encode(), media_type=JSON)

    @app.get("/v1/tools", responses={200: {"model": ToolPage}, **_ERRORS})
    async def list_tools(request: Request) -> Response:
        context = authenticate(request)
        if isinstance(context, Response):
            return context
        body = {
            "items": [t.manifest for t in door.tools.values()],
            "next_cursor": None,
            "key_retention": door.key_retention,
        }
        return Response(json.dumps(body, separators=(",", ":")).encode(), media_type=JSON)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "A backend is not ready"}})
    async def readyz() -> Response:
        checks = await door.ready()
        ok = all(checks.values())
        return Response(
            json.dumps({"ready": ok, "checks": checks}).encode(),
            status_code=200 if ok else 503,
            media_type=JSON,
        )

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        return Response(door.metrics.render(), media_type=door.metrics.content_type)

    @app.get(
        "/problems/{code}",
        response_class=HTMLResponse,
        responses={404: {"model": Problem, "content": {PROBLEM: {}}}},
    )
    async def problem_page(code: str) -> Response:
        text = page(code)
        if text is None:
            return _error(ErrorCode.TOOL_NOT_FOUND, "No such problem type.", status=404)
        return HTMLResponse(text)

    return app


async def _answer(
    door: FrontDoor,
    context: TrustedContext,
    tool: str,
    key: str | None,
    result: CallResult,
    wait: float,
) -> Response:
    call_id = CallKey(context.tenant_id, tool, key or "").call_id
    if result.rejected:
        assert result.error is not None
        return _problem_response(problem(result.error, errors=list(result.field_errors)))
    if result.status is CallStatus.PENDING:
        if result.error is not None and result.error.code == ErrorCode.INTERNAL:
            return _problem_response(problem(result.error), {"Retry-After": "1"})
        view = await door.queries.get(context.tenant_id, call_id) if key else None
        if (
            view is not None
            and view.status is CallStatus.PENDING
            and not await _ours(door, view, result)
        ):
            return _error(
                ErrorCode.IDEMPOTENCY_KEY_IN_USE,
                f"The call with this key is still running after {wait:g} s.",
                headers={"Retry-After": "1"},
            )
        location = {"Location": f"/v1/calls/{call_id}"}
        if view is None:
            view = _pending_view(context, tool, key, result)
        return Response(_view_bytes(view), status_code=202, media_type=JSON, headers=location)
    assert result.event is not None
    if not key:  # read-only: answered, never ledgered
        return Response(_view_bytes(_transient_view(context, tool, result)), media_type=JSON)
    view = await _projected(door, context.tenant_id, call_id, result.event.event_id)
    if view is None:
        return _error(
            ErrorCode.INTERNAL,
            "The call finished; its record is not readable yet.",
            headers={"Retry-After": "1"},
        )
    headers = {"Idempotent-Replayed": "true"} if result.replayed else {}
    return Response(_view_bytes(view), media_type=JSON, headers=headers)


async def _ours(door: FrontDoor, view: CallView, result: CallResult) -> bool:
    return view.last_intent_id == result.intent_id


async def _projected(
    door: FrontDoor, tenant_id: str, call_id: str, event_id: str
) -> CallView | None:
    """The Call resource once the projection has applied the answering event (bounded)."""
    deadline = time.monotonic() + PROJECTION_WAIT_S
    while not await door.queries.applied(event_id):
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.01)
    return await door.queries.get(tenant_id, call_id)


def _pending_view(
    context: TrustedContext, tool: str, key: str | None, result: CallResult
) -> CallView:
    now = datetime.now(UTC)
    return CallView(
        call_id=result.call_id,
        tenant_id=context.tenant_id,
        tool=tool,
        tool_version="",
        idempotency_key=key or "",
        args_digest="",
        status=CallStatus.PENDING,
        ok=False,
        attempts=0,
        created_at=now,
        updated_at=now,
        last_event_id="",
        last_intent_id=result.intent_id,
    )


def _transient_view(context: TrustedContext, tool: str, result: CallResult) -> CallView:
    assert result.event is not None
    env = result.event.envelope
    assert result.status is not None
    return CallView(
        call_id=result.call_id,
        tenant_id=context.tenant_id,
        tool=tool,
        tool_version=env.tool_version,
        idempotency_key="",
        args_digest=env.args_digest,
        status=result.status,
        ok=result.status is CallStatus.SUCCEEDED,
        result=result.result,
        error=result.error,
        attempts=result.attempts,
        run_id=env.run_id,
        step_id=env.step_id,
        created_at=env.occurred_at,
        updated_at=env.occurred_at,
        last_event_id=env.event_id,
        last_intent_id=env.intent_id,
    )
