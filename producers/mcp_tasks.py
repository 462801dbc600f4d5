"""Long-running tools over MCP's Tasks extension (``io.modelcontextprotocol/tasks``, on the
2026-07-28 protocol): a call whose job is running is answered with a task handle, and the
client follows it with ``tasks/get`` and may stop it with ``tasks/cancel``.

The task *is* the ledger's call: its ``taskId`` is the call id, and every answer is read from
the call's projection row, so a task survives a restart of the server, is the same task on
every replica, and a retry of the ``tools/call`` (same key, same arguments) answers the same
task (the ledger never starts a second job). Nothing about a task is kept in memory.

Mapping of the call to the task:

=====================================  ===========================================
the call                               the task
=====================================  ===========================================
``PENDING``, job running               ``working`` (``statusMessage``: progress)
``UNKNOWN`` (past ``job_timeout_s``)   ``working``: the job's poll decides, never a re-run
``SUCCEEDED``                          ``completed``, ``result`` the tool result
``FAILED_FINAL`` ``CANCELLED``         ``cancelled``
any other failure                      ``completed``, ``result`` with ``isError`` (the
                                       extension keeps ``failed`` for JSON-RPC errors)
=====================================  ===========================================

``ttlMs`` is ``null`` while the call is unresolved (its key does not expire then); once it has
finished, the time from creation to the end plus the tool's key retention (``null`` for a
tool that keeps its keys forever). A client that did not declare the extension on its request
gets the ordinary tool result, which carries the ``job`` and says to call again with the same
key for its outcome.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from toolledger.producers.adapters import ToolSpec
from toolledger.producers.approval_rules import reads
from toolledger.producers.client import (
    CallResult,
    LedgerClient,
    TransportError,
    TrustedContext,
    job_record,
)
from toolledger.schemas.calls import CallQueries, CallView
from toolledger.schemas.errors import ErrorCode
from toolledger.schemas.events import JobInfo, ToolCallRejected
from toolledger.schemas.status import CallStatus

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
POLL_INTERVAL_MS = 1000
CANCEL_SCOPES = frozenset({"tools:call", "operator"})
# how long a task handle waits for the projection to show its job (tasks/get must resolve
# before the handle is returned, as the extension requires); past it: the plain result
VISIBLE_WAIT_S = 5.0

# the trusted context of a request (None: not authenticated), and a result as MCP shows it
ContextOf = Callable[[ServerRequestContext[Any, Any]], TrustedContext | None]
Render = Callable[[CallResult], types.CallToolResult]


def declares_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request's client declared the extension (per request, 2026-07-28 wire).
    Never on the handshake protocol: a task handle cannot be delivered there."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    extensions = capabilities.extensions if capabilities is not None else None
    return bool(extensions is not None and TASKS_EXTENSION in extensions)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _job_message(job: JobInfo) -> str:
    done = "" if job.progress is None else f", {round(job.progress * 100)}% done"
    return f"Job {job.id} is {job.status.value}{done}."


def ttl_ms(view: CallView, spec: ToolSpec | None) -> int | None:
    """How long after creation the task may be gone: never while the call is unresolved; its
    key's retention after it has finished."""
    if view.status in (CallStatus.PENDING, CallStatus.UNKNOWN):
        return None
    retention = None if spec is None else spec.manifest.get("key_retention_seconds")
    if not isinstance(retention, int):
        return None
    lived = max(0.0, (view.updated_at - view.created_at).total_seconds())
    return int((lived + retention) * 1000)


def view_result(view: CallView) -> CallResult:
    """A finished call as the ledger answers its replay."""
    job = None if view.job is None else view.job.model_dump(mode="json")
    return CallResult(
        view.status,
        view.result,
        error=view.error,
        attempts=view.attempts,
        replayed=True,
        call_id=view.call_id,
        job=job,
    )


def task_of(view: CallView, spec: ToolSpec | None, render: Render) -> dict[str, Any]:
    """The task's wire form (``DetailedTask``): its status and, once finished, its result."""
    job = view.job
    started = job.started_at if job is not None else view.created_at
    updated = max(view.updated_at, job.updated_at) if job is not None else view.updated_at
    task: dict[str, Any] = {
        "taskId": view.call_id,
        "createdAt": _iso(started),
        "lastUpdatedAt": _iso(updated),
        "ttlMs": ttl_ms(view, spec),
        "pollIntervalMs": POLL_INTERVAL_MS,
    }
    error = view.error
    if view.status is CallStatus.PENDING:
        message = _job_message(job) if job is not None else "The call is running."
        return task | {"status": "working", "statusMessage": message}
    if view.status is CallStatus.UNKNOWN:
        message = "The job ran past its timeout: its poll decides the outcome (nothing re-runs)."
        return task | {"status": "working", "statusMessage": message}
    if view.status is CallStatus.FAILED_FINAL and error and error.code == ErrorCode.CANCELLED:
        return task | {"status": "cancelled", "statusMessage": error.message}
    shown = render(view_result(view)).model_dump(by_alias=True, mode="json", exclude_none=True)
    message = "The job succeeded." if view.ok else f"The job failed: {error and error.message}"
    return task | {"status": "completed", "statusMessage": message, "result": shown}


def _unknown_task() -> MCPError:
    return MCPError(types.INVALID_PARAMS, "Unknown task (tasks of other tenants are not visible).")


class McpTasks:
    """``tasks/get`` and ``tasks/cancel`` over the ledger's calls, and the task handle a
    ``tools/call`` answers with while its job runs."""

    def __init__(
        self,
        queries: CallQueries,
        client: LedgerClient,
        tools: Mapping[str, ToolSpec],
        context_of: ContextOf,
        render: Render,
    ) -> None:
        self.queries = queries
        self.client = client
        self.tools = tools
        self.context_of = context_of
        self.render = render

    def install(self, server: Server[Any]) -> None:
        """Serve the extension's methods on ``server`` and advertise it."""
        server.extensions[TASKS_EXTENSION] = {}
        server.add_request_handler("tasks/get", types.GetTaskRequestParams, self.get)
        server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, self.cancel)

    async def handle(
        self, ctx: ServerRequestContext[Any, Any], context: TrustedContext, result: CallResult
    ) -> dict[str, Any] | None:
        """The task handle (``CreateTaskResult``) for ``result``, when the client declared the
        extension and the call's job is running; None: answer with the tool result. Returned
        only once ``tasks/get`` resolves the task (the projection shows the job)."""
        if result.job is None or result.status is not CallStatus.PENDING:
            return None
        if not declares_tasks(ctx):
            return None
        view = await self._visible(context.tenant_id, result.call_id)
        if view is None:
            return None
        task = task_of(view, self.tools.get(view.tool), self.render)
        if task["status"] != "working":  # it finished meanwhile: the outcome itself
            return None
        return {"resultType": "task", **task}

    async def _visible(self, tenant_id: str, call_id: str) -> CallView | None:
        deadline = time.monotonic() + VISIBLE_WAIT_S
        while True:
            view = await self.queries.get(tenant_id, call_id)
            if view is not None and view.job is not None:
                return view
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.01)

    async def _view(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> CallView:
        context = self.context_of(ctx)
        if context is None:
            raise MCPError(types.INVALID_REQUEST, "This session is not authenticated.")
        view = await self.queries.get(context.tenant_id, task_id)
        if view is None or view.job is None or not reads(context, view.call_key):
            raise _unknown_task()
        return view

    async def get(
        self, ctx: ServerRequestContext[Any, Any], params: types.GetTaskRequestParams
    ) -> dict[str, Any]:
        view = await self._view(ctx, params.task_id)
        return {"resultType": "complete", **task_of(view, self.tools.get(view.tool), self.render)}

    async def cancel(
        self, ctx: ServerRequestContext[Any, Any], params: types.CancelTaskRequestParams
    ) -> dict[str, Any]:
        """Ask the tool's ``cancel`` in the call's partition, where it is decided in order with
        the job's polls and reports: a job that finished first stays finished (the extension's
        cancellation is cooperative, so that is an acknowledgement too). A tool without a
        ``cancel`` is an error: nothing would ever stop the job."""
        view = await self._view(ctx, params.task_id)
        context = self.context_of(ctx)
        assert context is not None  # _view refused an unauthenticated request
        if not context.scopes & CANCEL_SCOPES:  # as POST /v1/calls/{id}/job/cancel asks
            raise MCPError(types.INVALID_REQUEST, "Cancelling a job needs the scope 'tools:call'.")
        if view.status not in (CallStatus.PENDING, CallStatus.UNKNOWN):
            return {"resultType": "complete"}
        record = job_record(
            "cancel",
            context=context,
            call_key=view.call_key,
            tool=view.tool,
            idempotency_key=view.idempotency_key,
        )
        try:
            answer = await self.client.command(record)
        except TransportError:
            raise MCPError(types.INTERNAL_ERROR, "The ledger could not be reached.") from None
        if isinstance(answer, ToolCallRejected) and answer.error.code != ErrorCode.JOB_FINISHED:
            raise MCPError(types.INVALID_PARAMS, answer.error.message, {"code": answer.error.code})
        return {"resultType": "complete"}
