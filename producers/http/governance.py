"""The front door's governance: the pre-checks that refuse a call before anything is appended
(kill switch, run budget), the same refusals for another transport (MCP), and operators'
commands sent to the ledger. The operators' routes are in ``producers.http.routes``.

Scopes: ``operator`` decides approvals and switches tools for its own tenant and reads the
metrics of every tenant; ``operator:global`` also acts on other tenants' approvals and switches
tools off for every tenant. An operator cannot approve a request it made itself.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from toolledger.producers import governance
from toolledger.producers.client import TransportError, TrustedContext
from toolledger.producers.http.errors import ProblemError, refused
from toolledger.producers.http.problems import problem
from toolledger.schemas.calls import ANY, effective_switch
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.events import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    ToolCallRejected,
    ToolDisabled,
    ToolEnabled,
)
from toolledger.schemas.governance import disabled_error
from toolledger.schemas.keys import call_id_of
from toolledger.schemas.status import CallStatus

if TYPE_CHECKING:
    from toolledger.producers.http.door import FrontDoor

log = logging.getLogger("toolledger.http")

PROJECTION_WAIT_S = 10.0

Command = TypeVar("Command", bound=ApprovalGranted | ApprovalDenied | ToolDisabled | ToolEnabled)


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
            context.tenant_id, call_id_of(door.client.call_key(context, tool, key))
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
    if await door.applied.within(event.event_id, PROJECTION_WAIT_S):
        now = datetime.now(UTC)
        view = await door.queries.approval(env.tenant_id, event.approval_id, now=now)
        if view is not None:
            return view.to_json()
    return governance.approval_request_json(event)


async def command(door: FrontDoor, record: Command, *, broadcast: bool = False) -> Command | None:
    """Send an operator's command to the ledger: the ledger's confirmation, or ``None`` if it
    is appended but not confirmed yet. A refusal or an unreachable ledger raises its problem."""
    try:
        answer = await door.client.command(record, broadcast=broadcast)
    except TransportError:
        raise refused(
            ErrorCode.INTERNAL, "The ledger could not be reached.", headers={"Retry-After": "1"}
        ) from None
    if isinstance(answer, ToolCallRejected):
        status = 409 if answer.error.code == ErrorCode.APPROVAL_INVALID else None
        raise ProblemError(problem(answer.error, status=status))
    if answer is None or isinstance(answer, type(record)):
        return answer
    raise refused(ErrorCode.INTERNAL, "The ledger answered the command unexpectedly.")
