"""The Call resource as the API renders it: from the projection, or built from an outcome the
projection has no row for (a read-only call, a call still pending)."""

from __future__ import annotations

from datetime import UTC, datetime

from toolledger.producers.client import CallResult, TrustedContext, result_of
from toolledger.producers.http import governance
from toolledger.producers.http.door import FrontDoor
from toolledger.producers.http.models import HIDDEN
from toolledger.schemas.calls import CallView
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.events import EVENTS_BY_TYPE
from toolledger.schemas.status import CallStatus


def view_bytes(view: CallView) -> bytes:
    # expired_at only once the key has expired: a live call renders as it always did
    hidden = HIDDEN if view.expired_at is not None else HIDDEN | {"expired_at"}
    if view.job is None:  # a job only on long-running calls: other calls render as they did
        hidden = hidden | {"job"}
    if view.approval is None:  # only a call that waits for a human carries its request
        hidden = hidden | {"approval"}
    return view.model_dump_json(exclude=set(hidden)).encode()


async def projected(
    door: FrontDoor, tenant_id: str, call_id: str, event_id: str
) -> CallView | None:
    """The Call resource once the projection has applied the answering event (bounded)."""
    if door.queries.calls_lag and not await door.applied.within(
        event_id, governance.PROJECTION_WAIT_S
    ):
        return None
    return await door.queries.get(tenant_id, call_id)


async def read_only_view(door: FrontDoor, tenant_id: str, call_id: str) -> CallView | None:
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
    return transient_view(event.envelope.tenant_id, event.envelope.tool, result)


_DECIDED = {
    # what a call that never started is, by its latest approval request
    "pending": CallStatus.PENDING,
    "approved": CallStatus.PENDING,  # the same key and arguments go ahead now
    "denied": CallStatus.FAILED_FINAL,  # the same arguments are refused again
    "expired": CallStatus.FAILED_RETRYABLE,  # calling again opens a new request
}


async def awaiting_approval_view(door: FrontDoor, tenant_id: str, call_id: str) -> CallView | None:
    """A call that has not started because it waits for (or was refused) a human's approval:
    nothing of it is stored as a result, its approval request says where it stands."""
    approval = await door.queries.call_approval(tenant_id, call_id, now=datetime.now(UTC))
    if approval is None or approval.status == "consumed":
        return None
    status = _DECIDED[approval.status]
    error = None
    if approval.status == "denied":
        error = ErrorInfo.of(
            ErrorCode.APPROVAL_INVALID,
            f"A human denied this call: {approval.reason or 'no reason given'}",
            retryable=False,
        )
    elif approval.status == "expired":
        error = ErrorInfo.of(
            ErrorCode.APPROVAL_REQUIRED,
            "The approval request expired before it was decided.",
            retryable=True,
            suggested_action="Call again with the same key and arguments: that opens a new "
            "request.",
        )
    return CallView(
        call_id=call_id,
        tenant_id=tenant_id,
        tool=approval.tool,
        tool_version="",
        idempotency_key=approval.idempotency_key,
        args_digest=approval.args_digest,
        status=status,
        ok=False,
        error=error,
        attempts=0,
        run_id=approval.run_id,
        created_at=approval.requested_at,
        updated_at=approval.decided_at or approval.requested_at,
        approval=approval.to_json(),
        last_event_id="",
        last_intent_id="",
        call_key=approval.call_key,
    )


def pending_view(
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


def transient_view(tenant_id: str, tool: str, result: CallResult) -> CallView:
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
        call_key=env.call_key,
    )
