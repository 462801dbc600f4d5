"""Operators' routes (approvals, kill switches), ``/v1/stats``, and the front door's
pre-checks that refuse a call before anything is appended (switch, run budget).

Scopes: ``operator`` decides approvals and switches tools for its own tenant and reads the
metrics of every tenant; ``operator:global`` also acts on other tenants' approvals and switches
tools off for every tenant. An operator cannot approve a request it made itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from processors.ledger.governance import disabled_error
from producers import governance
from producers.client import TransportError, TrustedContext
from producers.http.problems import problem
from producers.http.responses import (
    JSON,
    error_response,
    field_errors,
    not_found,
    problem_response,
    read_capped,
    validation_failed,
)
from schemas.calls import (
    ANY,
    ApprovalView,
    CallQueries,
    SwitchView,
    decode_approval_cursor,
    effective_switch,
)
from schemas.errors import ErrorCode, ErrorInfo
from schemas.events import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    ToolCallRejected,
    ToolDisabled,
    ToolEnabled,
)
from schemas.keys import CallKey
from schemas.status import CallStatus

if TYPE_CHECKING:
    from producers.http.app import FrontDoor

log = logging.getLogger("toolledger.http")

OPERATOR = "operator"
GLOBAL_OPERATOR = "operator:global"
MAX_OPERATOR_BODY = 16 << 10
SWITCH_CACHE_S = 1.0
PROJECTION_WAIT_S = 10.0
APPROVAL_ID = re.compile(r"apr_[0-9a-f]{24}")

Authenticate = Callable[[Request], TrustedContext | Response]


@dataclass(frozen=True, slots=True)
class RunBudget:
    """Per run: at most ``max_attempts`` handler attempts over all its calls, and no more
    calls of a tool once one failure fingerprint of that tool repeated ``max_repeats`` times."""

    max_attempts: int = 100
    max_repeats: int = 3


class DenyBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    reason: Annotated[str, Field(min_length=1, max_length=governance.MAX_REASON_CHARS)]


class SwitchBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    enabled: bool
    reason: Annotated[str, Field(min_length=1, max_length=governance.MAX_REASON_CHARS)]
    scope: Literal["tenant", "global"] = "tenant"


class SwitchCache:
    """The switches in force per tenant, read from the projection at most once a second.

    A pre-check only: the executor applies the switch authoritatively, in log order."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, list[SwitchView]]] = {}
        self._loading: dict[str, asyncio.Task[list[SwitchView]]] = {}

    async def get(
        self, tenant_id: str, load: Callable[[str], Awaitable[list[SwitchView]]]
    ) -> list[SwitchView]:
        """One read per tenant at a time: the callers that find the entry stale while it is
        read wait for that read (not 64 reads of the audit trail at once, every second)."""
        now = time.monotonic()
        cached = self._entries.get(tenant_id)
        if cached is not None and now - cached[0] < SWITCH_CACHE_S:
            return cached[1]
        loading = self._loading.get(tenant_id)
        if loading is None:
            loading = self._loading[tenant_id] = asyncio.ensure_future(load(tenant_id))
            loading.add_done_callback(lambda _: self._loading.pop(tenant_id, None))
        switches = await asyncio.shield(loading)
        self._entries[tenant_id] = (now, switches)
        return switches

    def clear(self) -> None:
        self._entries.clear()


def _dumps(body: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(body, separators=(",", ":"), default=str).encode(),
        status_code=status,
        media_type=JSON,
    )


def _forbidden(message: str) -> Response:
    return error_response(ErrorCode.FORBIDDEN, message)



async def precheck(
    door: FrontDoor, context: TrustedContext, tool: str, key: str | None, run_id: str | None
) -> ErrorInfo | None:
    """Refusals the front door can give before appending: the key stays unused.

    A call whose key the ledger already knows goes on to the executor even while the tool is
    off or the run over budget: it may be a replay, which executes nothing."""
    switches = await door.switch_cache.get(context.tenant_id, door.queries.switches)
    switch = effective_switch(switches, context.tenant_id, tool)
    over = None
    if run_id is not None and door.budget is not None:
        usage = await door.queries.run_usage(context.tenant_id, run_id, tool)
        if usage.attempts >= door.budget.max_attempts:
            over = f"Run {run_id!r} used its budget of {door.budget.max_attempts} attempts."
        elif usage.repeats >= door.budget.max_repeats:
            over = (
                f"{tool} failed {usage.repeats} times in run {run_id!r} with the same error "
                f"({usage.fingerprint})."
            )
    if switch is None and over is None:
        return None
    known = None
    if key:
        known = await door.queries.get(
            context.tenant_id, CallKey(context.tenant_id, tool, key).call_id
        )
    if known is not None and (known.status.is_final or known.status is CallStatus.PENDING):
        return None  # answered from the ledger (or "in progress"): nothing new runs
    if switch is not None:
        info = disabled_error(switch.tenant_id == ANY, switch.tool == ANY, tool, switch.reason)
    else:
        assert over is not None
        info = ErrorInfo.of(
            ErrorCode.RETRY_LIMIT_EXCEEDED,
            over,
            retryable=False,
            suggested_action="Stop this run and hand the task over to a human.",
        )
    door.metrics.rejections.labels(tool, info.code).inc()
    log.info(
        "refused before append",
        extra={"tenant": context.tenant_id, "tool": tool, "code": info.code, "run_id": run_id},
    )
    return info


def admission(door: FrontDoor) -> Callable[..., Awaitable[ErrorInfo | None]]:
    """The front door's refusals for another transport (MCP): rate limit, switch, budget."""

    async def admit(
        context: TrustedContext, tool: str, key: str | None, run_id: str | None
    ) -> ErrorInfo | None:
        refused: ErrorInfo | None = None
        if door.limiter is not None:
            limited = door.limiter.acquire(context.tenant_id, tool)
            if limited is not None:
                door.metrics.rejections.labels(tool, ErrorCode.RATE_LIMITED.value).inc()
                message = f"{limited.detail} Retry in {limited.retry_after_s} s."
                refused = ErrorInfo.of(ErrorCode.RATE_LIMITED, message)
        refused = refused or await precheck(door, context, tool, key, run_id)
        if refused is not None:  # in the audit trail; the key stays unused
            door.client.record_refusal(tool, key, context, refused, run_id=run_id)
        return refused

    return admit


async def approval_request(door: FrontDoor, event: ApprovalRequested) -> dict[str, Any]:
    """The approval request a ``428`` carries: as projected when the projection has it (its
    status may be ``approved`` already), else (projection late) as the answering event."""
    env = event.envelope
    # read-your-writes: an operator given this id can find the request once this returns
    if await applied_within(door.queries, event.event_id, PROJECTION_WAIT_S):
        now = datetime.now(UTC)
        view = await door.queries.approval(env.tenant_id, event.approval_id, now=now)
        if view is not None:
            return view.to_json()
    return governance.approval_request_json(event)


def add_routes(
    app: FastAPI,
    door: FrontDoor,
    authenticate: Authenticate,
    errors: dict[int | str, dict[str, Any]],
) -> None:
    """``errors``: the problem responses every route documents."""

    def documented(*codes: int) -> dict[int | str, dict[str, Any]]:
        return {code: {"description": "See the body"} for code in codes} | errors

    def operator(request: Request) -> TrustedContext | Response:
        context = authenticate(request)
        if isinstance(context, Response):
            return context
        if OPERATOR not in context.scopes and GLOBAL_OPERATOR not in context.scopes:
            door.metrics.rejections.labels("-", ErrorCode.FORBIDDEN.value).inc()
            return _forbidden("This needs the scope 'operator'.")
        return context

    def tenant_of(context: TrustedContext) -> str | None:
        return None if GLOBAL_OPERATOR in context.scopes else context.tenant_id

    async def body_of(request: Request, model: type[BaseModel]) -> BaseModel | Response:
        raw = await read_capped(request, MAX_OPERATOR_BODY)
        if raw is None:
            return error_response(
                ErrorCode.PAYLOAD_TOO_LARGE, f"The body is larger than {MAX_OPERATOR_BODY} bytes."
            )
        try:
            return model.model_validate_json(raw or b"{}")
        except ValidationError as exc:
            return validation_failed("The body is invalid:", field_errors(exc.errors()))

    async def find(context: TrustedContext, approval_id: str) -> ApprovalView | None:
        if not APPROVAL_ID.fullmatch(approval_id):  # anything else was never handed out
            return None
        return await door.queries.approval(tenant_of(context), approval_id, now=datetime.now(UTC))

    async def pending(context: TrustedContext, approval_id: str) -> ApprovalView | Response:
        view = await find(context, approval_id)
        if view is None:  # another tenant's request is not found, never forbidden
            return not_found(
                "No approval request with this id.",
                "List them with GET /v1/approval-requests?status=pending.",
            )
        if view.status != "pending":
            return problem_response(
                problem(
                    ErrorInfo.of(
                        ErrorCode.APPROVAL_INVALID,
                        f"The approval request is {view.status}: it cannot be decided again.",
                    ),
                    status=409,
                )
            )
        return view

    def target(view: ApprovalView) -> governance.ApprovalTarget:
        return governance.ApprovalTarget(
            view.approval_id, view.tenant_id, view.tool, view.idempotency_key, view.args_digest
        )

    @app.get("/v1/approval-requests", responses=documented(200))
    async def list_approvals(
        request: Request,
        status: Literal["pending", "approved", "denied", "consumed", "expired"] | None = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: Annotated[str | None, Query(max_length=512, pattern=r"^[A-Za-z0-9_-]+$")] = None,
    ) -> Response:
        context = operator(request)
        if isinstance(context, Response):
            return context
        if cursor is not None:
            try:
                decode_approval_cursor(cursor)
            except ValueError:
                return error_response(
                    ErrorCode.VALIDATION_FAILED, "The cursor is not one this API gave out."
                )
        page = await door.queries.approvals(
            tenant_of(context), status=status, now=datetime.now(UTC), limit=limit, after=cursor
        )
        return _dumps({"items": [v.to_json() for v in page.items], "next_cursor": page.next_cursor})

    @app.get("/v1/approval-requests/{approval_id}", responses=documented(200))
    async def get_approval(approval_id: str, request: Request) -> Response:
        context = operator(request)
        if isinstance(context, Response):
            return context
        view = await find(context, approval_id)
        if view is None:  # another tenant's request is not found, never forbidden
            return not_found(
                "No approval request with this id.",
                "List them with GET /v1/approval-requests?status=pending.",
            )
        return _dumps(view.to_json())

    @app.post("/v1/approval-requests/{approval_id}/approve", responses=documented(200, 202))
    async def approve(approval_id: str, request: Request) -> Response:
        context = operator(request)
        if isinstance(context, Response):
            return context
        view = await pending(context, approval_id)
        if isinstance(view, Response):
            return view
        if (view.tenant_id, view.requested_by) == (context.tenant_id, context.principal):
            four_eyes = ErrorInfo.of(
                ErrorCode.FORBIDDEN,
                f"Four eyes: {context.principal!r} asked for this call, so another operator "
                "must approve it.",
                suggested_action="Ask another operator of this tenant to approve the request "
                "(a token with the 'operator' scope and another principal).",
            )
            return problem_response(problem(four_eyes))
        decided_at = datetime.now(UTC)
        record, token = governance.approve(
            target(view), context.principal, decided_at, door.approval_token_ttl
        )
        answer = await _command(door, record)
        if isinstance(answer, Response):
            return answer
        door.metrics.operator_actions.labels("approve").inc()
        body = {
            "approval_token": token,
            "expires_at": record.expires_at.isoformat(),
            "approval_request": view.model_copy(
                update={
                    "status": "approved",
                    "approver": context.principal,
                    "decided_at": decided_at,
                }
            ).to_json(),
        }
        if answer is None:  # appended, not confirmed yet: the token works once it applies
            return _dumps({**body, "confirmed": False}, status=202)
        assert isinstance(answer, ApprovalGranted)
        return _dumps({**body, "expires_at": answer.expires_at.isoformat(), "confirmed": True})

    @app.post(
        "/v1/approval-requests/{approval_id}/deny",
        responses=documented(200, 202),
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {JSON: {"schema": DenyBody.model_json_schema()}},
            }
        },
    )
    async def deny(approval_id: str, request: Request) -> Response:
        context = operator(request)
        if isinstance(context, Response):
            return context
        parsed = await body_of(request, DenyBody)
        if isinstance(parsed, Response):
            return parsed
        assert isinstance(parsed, DenyBody)
        view = await pending(context, approval_id)
        if isinstance(view, Response):
            return view
        decided_at = datetime.now(UTC)
        record = governance.deny(target(view), context.principal, parsed.reason, decided_at)
        answer = await _command(door, record)
        if isinstance(answer, Response):
            return answer
        door.metrics.operator_actions.labels("deny").inc()
        denied = view.model_copy(
            update={
                "status": "denied",
                "reason": parsed.reason,
                "approver": context.principal,
                "decided_at": decided_at,
            }
        )
        return _dumps(
            {"approval_request": denied.to_json(), "confirmed": answer is not None},
            status=200 if answer is not None else 202,
        )

    @app.put(
        "/v1/tools/{tool}/switch",
        responses=documented(200, 202),
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {JSON: {"schema": SwitchBody.model_json_schema()}},
            }
        },
    )
    async def switch_tool(tool: str, request: Request) -> Response:
        context = operator(request)
        if isinstance(context, Response):
            return context
        if tool != "*" and tool not in door.tools:
            return error_response(ErrorCode.TOOL_NOT_FOUND, f"There is no tool named {tool!r}.")
        parsed = await body_of(request, SwitchBody)
        if isinstance(parsed, Response):
            return parsed
        assert isinstance(parsed, SwitchBody)
        if parsed.scope == "global" and GLOBAL_OPERATOR not in context.scopes:
            return _forbidden("Switching a tool off for every tenant needs 'operator:global'.")
        target = "*" if parsed.scope == "global" else context.tenant_id
        # the latest change wins by time: never stamp one before the change it follows, even
        # when this front door's clock is behind the one that made that change
        now = datetime.now(UTC)
        for seen in await door.queries.switches(context.tenant_id):
            if (seen.tenant_id, seen.tool) == (target, tool):
                now = max(now, seen.changed_at + timedelta(microseconds=1))
        record = governance.switch(
            tenant_id=target,
            tool=tool,
            enabled=parsed.enabled,
            actor=context.principal,
            reason=parsed.reason,
            now=now,
        )
        answer = await _command(door, record, broadcast=True)
        if isinstance(answer, Response):
            return answer
        if answer is not None:  # the front door's pre-check reads the projection: let it catch up
            await applied_within(door.queries, answer.event_id, PROJECTION_WAIT_S)
        door.switch_cache.clear()
        door.metrics.operator_actions.labels("enable" if parsed.enabled else "disable").inc()
        env = record.envelope
        view = SwitchView(
            tenant_id=env.tenant_id,
            tool=env.tool,
            enabled=parsed.enabled,
            reason=parsed.reason,
            actor=context.principal,
            changed_at=env.occurred_at,
        )
        return _dumps(
            {**view.to_json(), "scope": parsed.scope, "confirmed": answer is not None},
            status=200 if answer is not None else 202,
        )

    @app.get("/v1/stats", responses=documented(200))
    async def stats(
        request: Request,
        tenant: Annotated[str | None, Query(max_length=128, pattern=r"^[^\x00-\x1F\x7F]+$")] = None,
    ) -> Response:
        context = authenticate(request)
        if isinstance(context, Response):
            return context
        every_tenant = GLOBAL_OPERATOR in context.scopes
        if tenant is not None and tenant != context.tenant_id and not every_tenant:
            return _forbidden("Only 'operator:global' reads other tenants' metrics.")
        scope = tenant if tenant is not None else (None if every_tenant else context.tenant_id)
        return _dumps((await door.queries.stats(scope)).to_json())


async def applied_within(queries: CallQueries, event_id: str, timeout_s: float) -> bool:
    """Whether the projection applies ``event_id`` within ``timeout_s`` (polls)."""
    deadline = time.monotonic() + timeout_s
    while not await queries.applied(event_id):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def _command(
    door: FrontDoor,
    record: ApprovalGranted | ApprovalDenied | ToolDisabled | ToolEnabled,
    *,
    broadcast: bool = False,
) -> ApprovalGranted | ApprovalDenied | ToolDisabled | ToolEnabled | Response | None:
    try:
        answer = await door.client.command(record, broadcast=broadcast)
    except TransportError:
        return error_response(
            ErrorCode.INTERNAL, "The ledger could not be reached.", headers={"Retry-After": "1"}
        )
    if isinstance(answer, ToolCallRejected):
        status = 409 if answer.error.code == ErrorCode.APPROVAL_INVALID else None
        return problem_response(problem(answer.error, status=status))
    if answer is None or isinstance(answer, type(record)):
        return answer
    return error_response(ErrorCode.INTERNAL, "The ledger answered the command unexpectedly.")
