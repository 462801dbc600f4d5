"""``evolve`` and ``fold``: the state of a call key is a pure function of its events."""

from __future__ import annotations

from collections.abc import Iterable

from toolledger.processors.ledger.state import CallContext, CallState
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.events import (
    Event,
    FailureDisposition,
    JobInfo,
    JobStatus,
    Resolution,
    ToolCallFailed,
    ToolCallJobProgressed,
    ToolCallJobStarted,
    ToolCallKeyExpired,
    ToolCallOutcomeUnknown,
    ToolCallReconciled,
    ToolCallStarted,
    ToolCallSucceeded,
)
from toolledger.schemas.status import CallStatus

NOT_HAPPENED_ERROR = ErrorInfo.of(
    ErrorCode.OUTCOME_UNKNOWN,
    "The downstream has no trace of this call: it did not happen.",
    retryable=True,
    suggested_action="Call again with the same key and arguments to execute it.",
)

_FAILED_STATUS = {
    FailureDisposition.RETRY: CallStatus.PENDING,
    FailureDisposition.RETRYABLE: CallStatus.FAILED_RETRYABLE,
    FailureDisposition.FINAL: CallStatus.FAILED_FINAL,
}

_RECONCILED_STATUS = {
    Resolution.SUCCEEDED: CallStatus.SUCCEEDED,
    Resolution.FAILED_FINAL: CallStatus.FAILED_FINAL,
    Resolution.NOT_HAPPENED: CallStatus.FAILED_RETRYABLE,
    Resolution.INCONCLUSIVE: CallStatus.UNKNOWN,
}


def evolve(state: CallState | None, event: Event) -> CallState | None:
    """Apply one event. Replays, rejections, approvals and switches leave the state alone; a
    key's expiry forgets it (``None``: as if it had never run)."""
    env = event.envelope
    if isinstance(event, ToolCallKeyExpired):
        return None
    if isinstance(event, ToolCallStarted):
        if state is None:
            return CallState(
                status=CallStatus.PENDING,
                context=CallContext.of(env),
                first_intent_id=env.intent_id,
                attempts=event.attempt,
                rounds=event.round,
                round_attempts=1,
                created_at=env.occurred_at,
                updated_at=env.occurred_at,
                last_event_id=env.event_id,
            )
        new_round = event.round != state.rounds
        return state.model_copy(
            update={
                "status": CallStatus.PENDING,
                "context": CallContext.of(env),
                "attempts": event.attempt,
                "rounds": event.round,
                "round_attempts": 1 if new_round else state.round_attempts + 1,
                "job": None,
                "job_updates": 0,
                "updated_at": env.occurred_at,
                "last_event_id": env.event_id,
            }
        )
    if state is None:
        return None  # only a Started event creates a ledger entry
    if isinstance(event, ToolCallJobStarted):
        update: dict[str, object] = {"status": CallStatus.PENDING, "job": event.job}
    elif isinstance(event, ToolCallJobProgressed):
        update = {"job": event.job, "job_updates": state.job_updates + 1}
    elif isinstance(event, ToolCallSucceeded):
        update = {
            "status": CallStatus.SUCCEEDED,
            "result_json": event.result_json,
            "error": None,
            "job": _job_ended(state.job, JobStatus.SUCCEEDED, env.occurred_at),
        }
    elif isinstance(event, ToolCallFailed):
        update = {"status": _FAILED_STATUS[event.disposition], "error": event.error}
        if event.disposition is not FailureDisposition.RETRY:
            update["job"] = _job_ended(state.job, _failed_job(event.error), env.occurred_at)
    elif isinstance(event, ToolCallOutcomeUnknown):
        update = {
            "status": CallStatus.UNKNOWN,
            "error": ErrorInfo.of(ErrorCode.OUTCOME_UNKNOWN, event.reason),
        }
    elif isinstance(event, ToolCallReconciled):
        update = {
            "status": _RECONCILED_STATUS[event.resolution],
            "reconcile_attempts": event.reconcile_attempt,
        }
        if event.resolution is Resolution.SUCCEEDED:
            update |= {"result_json": event.result_json, "error": None}
            update["job"] = _job_ended(state.job, JobStatus.SUCCEEDED, env.occurred_at)
        elif event.resolution is Resolution.FAILED_FINAL:
            update |= {"error": event.error}
            if event.error is not None:
                job = _job_ended(state.job, _failed_job(event.error), env.occurred_at)
                update["job"] = job
        elif event.resolution is Resolution.NOT_HAPPENED:
            update |= {"error": NOT_HAPPENED_ERROR}
        else:  # INCONCLUSIVE: still UNKNOWN, with why
            update |= {"error": event.error}
    else:
        return state
    return state.model_copy(
        update=update | {"updated_at": env.occurred_at, "last_event_id": env.event_id}
    )


def _failed_job(error: ErrorInfo) -> JobStatus:
    return JobStatus.CANCELLED if error.code == ErrorCode.CANCELLED else JobStatus.FAILED


def _job_ended(job: JobInfo | None, status: JobStatus, at: object) -> JobInfo | None:
    """A call's job once the call has finished (``None``: the call had no job)."""
    if job is None:
        return None
    return job.model_copy(update={"status": status, "updated_at": at})


def fold(events: Iterable[Event], state: CallState | None = None) -> CallState | None:
    """The state of one call key after ``events`` (in log order)."""
    for event in events:
        state = evolve(state, event)
    return state


def fold_all(events: Iterable[Event]) -> dict[str, CallState]:
    """States of every call key in a stream of events (in log order)."""
    states: dict[str, CallState] = {}
    for event in events:
        new = evolve(states.get(event.call_key), event)
        if new is not None:
            states[event.call_key] = new
        elif isinstance(event, ToolCallKeyExpired):
            states.pop(event.call_key, None)
    return states
