"""``create_app``: the HTTP API. Every route answers JSON or ``application/problem+json``;
bad input gets its documented 4xx and executes nothing."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producers.client import CallResult, LedgerClient, TrustedContext, result_of
from producers.governance import DEFAULT_TOKEN_TTL
from producers.http import governance
from producers.http.auth import Authenticator, AuthFailure, TokenStore, failure_counter
from producers.http.governance import RunBudget, SwitchCache
from producers.http.headers import (
    JsonBodyError,
    ambiguity,
    idempotency_key,
    strict_json,
    wait_seconds,
)
from producers.http.metrics import Metrics
from producers.http.problems import Problem, page, problem
from producers.http.ratelimit import RateLimiter, Refusal
from producers.http.responses import (
    JSON,
    PROBLEM,
    error_response,
    field_errors,
    not_found,
    problem_response,
    read_capped,
    validation_failed,
)
from schemas.calls import CallFilter, CallQueries, CallView, decode_cursor
from schemas.errors import ErrorCode, ErrorInfo
from schemas.events import EVENTS_BY_TYPE, ApprovalRequested
from schemas.keys import InvalidIdempotencyKey
from schemas.status import CallStatus

log = logging.getLogger("toolledger.http")

MAX_BODY_BYTES = (1 << 20) + (64 << 10)  # the 1 MiB argument limit plus room for the envelope
# refusals a caller may retry after a while: when (seconds)
RETRY_AFTER: dict[str, str] = {
    ErrorCode.IDEMPOTENCY_KEY_IN_USE: "1",
    ErrorCode.RATE_LIMITED: "1",
    ErrorCode.TOOL_DISABLED: "60",
}
CALL_ID = re.compile(r"call_[0-9a-f]{32}")  # CallKey.call_id: anything else is not a call


def _no_digest(_arguments: Any) -> str | None:
    return None


@dataclass(frozen=True, slots=True)
class ToolInfo:
    name: str
    keyed: bool  # needs an Idempotency-Key (mutation, long_running)
    manifest: dict[str, Any]
    # the args digest the executor will compute (None: invalid, the executor refuses them)
    digest: Callable[[Any], str | None] = _no_digest


@dataclass
class FrontDoor:
    """What the HTTP API needs; the composition root builds it for a backend."""

    client: LedgerClient
    queries: CallQueries
    tools: Mapping[str, ToolInfo]
    tokens: TokenStore  # the tokens file (the MCP server authenticates with it too)
    ready: Callable[[], Awaitable[dict[str, bool]]]
    key_retention: str = "forever"
    metrics: Metrics = field(default_factory=Metrics)
    limiter: RateLimiter | None = None
    # what the HTTP API authenticates with: the tokens file unless given (e.g. JWTs as well)
    authenticator: Authenticator | None = None
    budget: RunBudget | None = field(default_factory=RunBudget)
    approval_token_ttl: timedelta = DEFAULT_TOKEN_TTL
    switch_cache: SwitchCache = field(default_factory=SwitchCache)
    auth_failures: Counter = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.auth_failures = failure_counter(self.metrics.registry)


NO_CONTROL = r"^[^\x00-\x1F\x7F]+$"  # ids are stored as text: no NUL (PostgreSQL) nor controls


class CallBody(BaseModel):
    """The request body of ``POST /v1/tools/{tool}/calls``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    arguments: dict[str, Any]
    run_id: Annotated[str, Field(min_length=1, max_length=255, pattern=NO_CONTROL)] | None = None
    step_id: Annotated[str, Field(min_length=1, max_length=255, pattern=NO_CONTROL)] | None = None
    approval_token: Annotated[str, Field(min_length=1, max_length=4096)] | None = None


class EventPage(BaseModel):
    items: list[dict[str, Any]]
    next_cursor: str | None = None


class ToolPage(BaseModel):
    items: list[dict[str, Any]]
    next_cursor: str | None = None
    key_retention: str


_HIDDEN = {"last_event_id", "last_intent_id"}
_NO_CALL = "Check the call id (calls of other tenants are not visible to this token)."

# The Call resource as rendered (CallView without its internal fields), for the OpenAPI document.
Call: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "Call",
    __doc__="The Call resource: the ledger's record of one call key.",
    **{n: (f.annotation, f) for n, f in CallView.model_fields.items() if n not in _HIDDEN},
)


class CallList(BaseModel):
    items: list[Call]
    next_cursor: str | None


def _header(description: str) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "string"}}


_RETRY_AFTER = {"Retry-After": _header("Seconds to wait before retrying with the same key.")}
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


def _call_responses() -> dict[int | str, dict[str, Any]]:
    """The responses of ``POST /v1/tools/{tool}/calls``, with the headers they carry."""
    responses: dict[int | str, dict[str, Any]] = {
        200: {
            "model": Call,
            "description": "The call finished (or a replay of its stored outcome)",
            "headers": {
                "Idempotent-Replayed": _header("'true' on a replay; absent on a first execution.")
            },
        },
        202: {
            "model": Call,
            "description": "Still running after the wait: status PENDING",
            "headers": {"Location": _header("/v1/calls/{call_id}: where the outcome appears.")},
        },
        **_ERRORS,
    }
    for status in (409, 429, 503):
        responses[status] = {**responses[status], "headers": _RETRY_AFTER}
    return responses


def _problem_media(schema: dict[str, Any]) -> None:
    """Document problems under ``application/problem+json`` (the media type they are sent with)
    and drop FastAPI's default 422 (this API answers invalid requests with 400)."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            default_422 = responses.get("422", {}).get("content", {}).get(JSON, {})
            if default_422.get("schema", {}).get("$ref", "").endswith("/HTTPValidationError"):
                del responses["422"]
            for response in responses.values():
                content = response.get("content", {})
                if PROBLEM not in content or "schema" in content[PROBLEM]:
                    continue
                for media in [m for m in content if m != PROBLEM]:
                    if content[media].get("schema", {}).get("$ref", "").endswith("/Problem"):
                        content[PROBLEM] = content.pop(media)
    components = schema.get("components", {}).get("schemas", {})
    if "HTTPValidationError" not in json.dumps(schema.get("paths", {})):
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)


def _unauthenticated(door: FrontDoor, request: Request, failure: AuthFailure) -> Response:
    """401, counted and logged (never with the token)."""
    door.auth_failures.labels(failure.reason, failure.kind).inc()
    log.log(
        logging.INFO if failure.reason == "missing" else logging.WARNING,
        "authentication failed",
        extra={
            "reason": failure.reason,
            "token_kind": failure.kind,
            "method": request.method,
            "path": request.url.path[:256],
            "client": request.client.host if request.client else None,
        },
    )
    challenge = "Bearer" if failure.reason == "missing" else 'Bearer error="invalid_token"'
    return error_response(
        ErrorCode.UNAUTHENTICATED, failure.detail, headers={"WWW-Authenticate": challenge}
    )


def _rate_limited(
    door: FrontDoor, context: TrustedContext, tool: str, refusal: Refusal
) -> tuple[Response, ErrorInfo]:
    """429 before anything is appended, counted and logged."""
    door.metrics.rejections.labels(tool, ErrorCode.RATE_LIMITED.value).inc()
    door.metrics.calls.labels(tool, "REJECTED", "429").inc()
    log.info(
        "rate limited",
        extra={
            "tenant": context.tenant_id,
            "tool": tool,
            "bucket": refusal.scope,
            "retry_after_s": refusal.retry_after_s,
        },
    )
    error = ErrorInfo.of(
        ErrorCode.RATE_LIMITED, f"{refusal.detail} Retry in {refusal.retry_after_s} s."
    )
    headers = {"Retry-After": str(refusal.retry_after_s)}
    return problem_response(problem(error), headers), error


class _AnswerErrors:
    """An error no route answered becomes a 503 problem sent here, so the exception never
    reaches the server, which would drop the keep-alive connection without saying so; a
    client that went away mid-request is logged once, at INFO, without a traceback."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        ambiguous = ambiguity(scope["headers"])
        if ambiguous is not None:  # refused before any route reads it: nothing can run
            refused = problem_response(
                problem(
                    ErrorInfo.of(
                        ErrorCode.VALIDATION_FAILED,
                        ambiguous,
                        suggested_action="Send each of these headers once, and a body framed "
                        "one way; then call again.",
                    )
                )
            )
            await refused(scope, receive, send)
            return
        try:
            await self.app(scope, receive, tracked)
        except ClientDisconnect:
            log.info("client disconnected before its request was read", extra=_where(scope))
        except Exception as exc:
            # never a stack trace or a driver message to the caller; the log has the details
            log.error("unhandled error", exc_info=exc, extra=_where(scope))
            if started:
                raise
            answer = error_response(
                ErrorCode.INTERNAL,
                "The ledger could not answer this request.",
                headers={"Retry-After": "1"},
            )
            await answer(scope, receive, send)


def _where(scope: Scope) -> dict[str, Any]:
    return {"method": scope.get("method"), "path": str(scope.get("path", ""))[:256]}


def _view_bytes(view: CallView) -> bytes:
    # expired_at only once the key has expired: a live call renders as it always did
    hidden = _HIDDEN if view.expired_at is not None else _HIDDEN | {"expired_at"}
    return view.model_dump_json(exclude=hidden).encode()


def create_app(door: FrontDoor) -> FastAPI:
    app = FastAPI(
        title="toolledger",
        version="1",
        description="An execution ledger for AI agents' tool calls: at most once per "
        "idempotency key, replays answered from the ledger.",
    )

    def authenticate(request: Request) -> TrustedContext | Response:
        authenticator = door.tokens if door.authenticator is None else door.authenticator
        context = authenticator.check(request.headers.get("authorization"))
        if isinstance(context, AuthFailure):
            return _unauthenticated(door, request, context)
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
        return problem_response(p, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        return validation_failed("The request is invalid:", field_errors(exc.errors()))

    app.add_middleware(_AnswerErrors)

    original_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _problem_media(original_openapi())
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]

    @app.post(
        "/v1/tools/{tool}/calls",
        responses=_call_responses(),
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
        idempotency_key_header: Annotated[
            str | None,
            Header(
                alias="Idempotency-Key",
                description="Required for mutation and long_running tools: 1..255 printable "
                'ASCII characters; "K" and K are the same key. Ignored for read_only tools.',
                # documented only: checked by the handler (400 IDEMPOTENCY_KEY_INVALID)
                json_schema_extra={"minLength": 1, "maxLength": 255, "pattern": "^[ -~]+$"},
            ),
        ] = None,
        prefer: Annotated[
            str | None, Header(description="wait=<seconds>: how long to wait (default 10, max 60).")
        ] = None,
    ) -> Response:
        started = time.monotonic()
        context = authenticate(request)
        if isinstance(context, Response):
            return context
        info = door.tools.get(tool)
        if info is None:
            return error_response(ErrorCode.TOOL_NOT_FOUND, f"There is no tool named {tool!r}.")
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != JSON:
            return error_response(ErrorCode.VALIDATION_FAILED, "Send the body as application/json.")
        raw = await read_capped(request, MAX_BODY_BYTES)
        if raw is None:
            return error_response(
                ErrorCode.PAYLOAD_TOO_LARGE, f"The body is larger than {MAX_BODY_BYTES} bytes."
            )
        try:
            body = CallBody.model_validate(strict_json(raw))
        except JsonBodyError as exc:
            return error_response(ErrorCode.VALIDATION_FAILED, str(exc))
        except ValidationError as exc:
            return validation_failed("The body is not a valid call:", field_errors(exc.errors()))
        key: str | None = None
        if info.keyed:
            try:
                key = idempotency_key(request.headers.getlist("idempotency-key"))
            except InvalidIdempotencyKey as exc:
                return error_response(
                    ErrorCode.IDEMPOTENCY_KEY_INVALID, str(exc).capitalize() + "."
                )
            if key is None:
                return error_response(
                    ErrorCode.IDEMPOTENCY_KEY_MISSING,
                    f"{tool} changes something: send an Idempotency-Key header.",
                )
        def audited(error: ErrorInfo) -> ErrorInfo:
            """A refusal of the front door's own, in the audit trail (the key stays unused)."""
            door.client.record_refusal(
                tool, key, context, error, run_id=body.run_id, step_id=body.step_id
            )
            return error

        missing = sorted(set(info.manifest.get("scopes", ())) - context.scopes)
        if missing:  # before the limits and pre-checks, which would tell it more
            door.metrics.rejections.labels(tool, ErrorCode.FORBIDDEN.value).inc()
            message = f"{tool} needs the scope(s) {missing}, which this caller lacks."
            return problem_response(problem(audited(ErrorInfo.of(ErrorCode.FORBIDDEN, message))))
        if door.limiter is not None:
            refusal = door.limiter.acquire(context.tenant_id, tool)
            if refusal is not None:  # nothing appended: the key stays unused
                response, error = _rate_limited(door, context, tool, refusal)
                audited(error)
                return response
        refused = await governance.precheck(door, context, tool, key, body.run_id)
        if refused is not None:
            after = RETRY_AFTER.get(audited(refused).code)
            return problem_response(problem(refused), {"Retry-After": after} if after else None)
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
            queued=_queued_probe(door, context, info, body.arguments) if key else None,
        )
        response = await _answer(door, context, tool, key, result, wait)
        door.metrics.observe(tool, response.status_code, result, time.monotonic() - started)
        return response

    governance.add_routes(app, door, authenticate, _ERRORS)

    @app.get("/v1/calls/{call_id}", responses={200: {"model": Call}, **_ERRORS})
    async def get_call(call_id: str, request: Request) -> Response:
        context = authenticate(request)
        if isinstance(context, Response):
            return context
        view = None
        if CALL_ID.fullmatch(call_id):
            view = await door.queries.get(context.tenant_id, call_id)
            view = view or await _read_only_view(door, context.tenant_id, call_id)
        if view is None:  # another tenant's call is not found, never forbidden
            return not_found("No call with this id.", _NO_CALL)
        return Response(_view_bytes(view), media_type=JSON)

    @app.get("/v1/calls", responses={200: {"model": CallList}, **_ERRORS})
    async def search_calls(
        request: Request,
        tool: Annotated[str | None, Query(max_length=64, pattern=NO_CONTROL)] = None,
        idempotency_key: Annotated[
            str | None, Query(min_length=1, max_length=255, pattern=r"^[ -~]+$")
        ] = None,
        run_id: Annotated[str | None, Query(max_length=255, pattern=NO_CONTROL)] = None,
        status: CallStatus | None = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: Annotated[str | None, Query(max_length=128, pattern=r"^[A-Za-z0-9_-]+$")] = None,
    ) -> Response:
        context = authenticate(request)
        if isinstance(context, Response):
            return context
        try:
            after = decode_cursor(cursor) if cursor else None
        except ValueError:
            return error_response(
                ErrorCode.VALIDATION_FAILED, "The cursor is not one this API gave out."
            )
        found = await door.queries.search(
            context.tenant_id,
            CallFilter(tool, idempotency_key, run_id, status),
            limit=limit,
            after=after,
        )
        body = {
            "items": [json.loads(_view_bytes(v)) for v in found.items],
            "next_cursor": found.next_cursor,
        }
        return Response(json.dumps(body, separators=(",", ":")).encode(), media_type=JSON)

    @app.get("/v1/calls/{call_id}/events", responses={200: {"model": EventPage}, **_ERRORS})
    async def call_events(call_id: str, request: Request) -> Response:
        context = authenticate(request)
        if isinstance(context, Response):
            return context
        events = (
            await door.queries.events(context.tenant_id, call_id)
            if CALL_ID.fullmatch(call_id)
            else None
        )
        if events is None:
            return not_found("No call with this id.", _NO_CALL)
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
            return not_found("No such problem type.", "See /openapi.json for the error codes.")
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
    call_id = result.call_id
    if result.rejected:
        assert result.error is not None
        retry_after = RETRY_AFTER.get(result.error.code)
        body = problem(result.error, errors=list(result.field_errors))
        if isinstance(result.event, ApprovalRequested):
            body.approval_request = await governance.approval_request(door, result.event)
        return problem_response(body, {"Retry-After": retry_after} if retry_after else None)
    if result.status is CallStatus.PENDING:
        assert result.error is not None
        if result.error.code == ErrorCode.INTERNAL:  # not reached or not decided: retry
            return problem_response(problem(result.error), {"Retry-After": "1"})
        if not result.running:  # another call with this key and these arguments runs
            return error_response(
                ErrorCode.IDEMPOTENCY_KEY_IN_USE,
                f"The call with this key is still running after {wait:g} s.",
                headers={"Retry-After": "1"},
            )
        view = await door.queries.get(context.tenant_id, call_id) if key else None
        if view is not None and view.last_intent_id != result.intent_id:
            view = None  # the projection has not reached this call's own events yet
        if view is not None and view.status.is_final:
            # it finished between the end of the wait and this read: answer the outcome
            return Response(_view_bytes(view), media_type=JSON)
        location = {"Location": f"/v1/calls/{call_id}"}
        if view is None:
            view = _pending_view(context, tool, key, result)
        return Response(_view_bytes(view), status_code=202, media_type=JSON, headers=location)
    assert result.event is not None
    if not key:  # read-only: answered, never ledgered
        view = _transient_view(context.tenant_id, tool, result)
        return Response(_view_bytes(view), media_type=JSON)
    view = await _projected(door, context.tenant_id, call_id, result.event.event_id)
    if view is None:
        return error_response(
            ErrorCode.INTERNAL,
            "The call finished; its record is not readable yet.",
            headers={"Retry-After": "1"},
        )
    headers = {"Idempotent-Replayed": "true"} if result.replayed else {}
    return Response(_view_bytes(view), media_type=JSON, headers=headers)


def _queued_probe(
    door: FrontDoor, context: TrustedContext, info: ToolInfo, arguments: dict[str, Any]
) -> Callable[[str, str], Awaitable[bool]]:
    """Whether another intent holds the key with these same arguments and is running: then
    this call, queued behind it, is answered 409 when its wait runs out (DESIGN section 11).
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
            and view.last_intent_id != intent_id
            and view.args_digest == digest
        )

    return queued


async def _projected(
    door: FrontDoor, tenant_id: str, call_id: str, event_id: str
) -> CallView | None:
    """The Call resource once the projection has applied the answering event (bounded)."""
    if not await governance.applied_within(door.queries, event_id, governance.PROJECTION_WAIT_S):
        return None
    return await door.queries.get(tenant_id, call_id)


async def _read_only_view(door: FrontDoor, tenant_id: str, call_id: str) -> CallView | None:
    """A read-only call has no row of its own (it is answered, never ledgered as a state):
    its id names its one outcome event in the audit trail."""
    events = await door.queries.events(tenant_id, call_id)
    if not events or events[-1].get("envelope", {}).get("idempotency_key"):
        return None
    payload = dict(events[-1])
    event = EVENTS_BY_TYPE[payload.pop("type")].model_validate(payload)
    result = result_of(event)
    if result.status is None:
        return None
    return _transient_view(event.envelope.tenant_id, event.envelope.tool, result)


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


def _transient_view(tenant_id: str, tool: str, result: CallResult) -> CallView:
    assert result.event is not None
    env = result.event.envelope
    assert result.status is not None
    return CallView(
        call_id=result.call_id,
        tenant_id=tenant_id,
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
