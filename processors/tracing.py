"""Tracing of the executor stages: a span per stage and, on the span of a whole run, the
outcome of the last event it committed. Spans never carry arguments, results or principals."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, NamedTuple

from opentelemetry.trace import Span

from processors.ledger import (
    AttemptOutcome,
    CallContext,
    CallState,
    Command,
    Decision,
    Failure,
    Found,
    FoundFailed,
    NotHappened,
    ReconcileOutcome,
    Success,
    decide,
)
from processors.ledger.governance import ApprovalBook, Switch
from processors.telemetry import record_outcome, stage, tracing_enabled
from schemas.errors import ErrorCode
from schemas.events import (
    ApprovalRequested,
    Envelope,
    Event,
    FailureDisposition,
    Resolution,
    ToolCallFailed,
    ToolCallOutcomeUnknown,
    ToolCallReconciled,
    ToolCallRejected,
    ToolCallReplayed,
    ToolCallStarted,
    ToolCallSucceeded,
)

if TYPE_CHECKING:
    from processors.pipeline import CallPort


class Outcome(NamedTuple):
    """What a stage's span records once the stage is over."""

    status: str
    attempts: int | None = None
    downstream_request_id: str | None = None
    error_code: str | None = None


def record(span: Span, outcome: Outcome | None) -> None:
    if outcome is not None:
        record_outcome(
            span,
            status=outcome.status,
            attempts=outcome.attempts,
            downstream_request_id=outcome.downstream_request_id,
            error_code=outcome.error_code,
        )


class TracedPort:
    """The port of one traced run: spans each commit and keeps the last outcome committed."""

    __slots__ = ("_port", "epoch", "outcome", "span")

    def __init__(self, port: CallPort, span: Span) -> None:
        self._port = port
        self.epoch = port.epoch
        self.span = span
        self.outcome: Outcome | None = None

    def state(self, call_key: str) -> CallState | None:
        return self._port.state(call_key)

    def approvals(self, call_key: str) -> ApprovalBook | None:
        return self._port.approvals(call_key)

    def disabled(self, tenant_id: str, tool: str) -> Switch | None:
        return self._port.disabled(tenant_id, tool)

    async def commit(self, events: Sequence[Event], *, final: bool) -> None:
        with stage("commit", events=len(events)) as span:
            if span.is_recording():
                span.set_attribute("toolledger.event_types", ",".join(e.TYPE for e in events))
            await self._port.commit(events, final=final)
        if not self.span.is_recording():
            return
        for event in events:
            self.outcome = event_outcome(event) or self.outcome


@contextmanager
def traced_run(
    name: str, port: CallPort, env: Envelope | None, **extra: str | int | None
) -> Iterator[TracedPort]:
    """A span ``toolledger.<name>`` around a run of the record with envelope ``env`` (None: a
    sweep), with the outcome of the events it committed."""
    attributes: dict[str, str | int | None] = {}
    if tracing_enabled():
        attributes = (envelope_attributes(env) if env is not None else {}) | extra
    with stage(name, None, **attributes) as span:
        run = TracedPort(port, span)
        try:
            yield run
        finally:
            record(span, run.outcome)


def envelope_attributes(env: Envelope) -> dict[str, str | int | None]:
    """Who asked for what, before the call is admitted (no arguments, no principal)."""
    return {
        "tenant": env.tenant_id,
        "tool": env.tool,
        "idempotency_key": env.idempotency_key or None,
        "intent_id": env.intent_id,
    }


def traced_decide(
    state: CallState | None, command: Command, ctx: CallContext | None = None
) -> Decision:
    with stage("decide", ctx, command=type(command).__name__):
        return decide(state, command)


def attempt_outcome(outcome: AttemptOutcome) -> Outcome:
    if isinstance(outcome, Success):
        return Outcome("SUCCEEDED", downstream_request_id=outcome.downstream_request_id)
    if isinstance(outcome, Failure):
        return Outcome("FAILED", error_code=outcome.error.code)
    return Outcome("UNKNOWN")


def reconcile_outcome(found: ReconcileOutcome) -> Outcome:
    if isinstance(found, Found):
        return Outcome("SUCCEEDED", downstream_request_id=found.downstream_request_id)
    if isinstance(found, FoundFailed):
        return Outcome("FAILED_FINAL", error_code=found.error.code)
    if isinstance(found, NotHappened):
        return Outcome("NOT_HAPPENED")
    return Outcome("INCONCLUSIVE")


# The call's status after a reconcile, as its caller sees it.
_RECONCILED = {
    Resolution.SUCCEEDED: "SUCCEEDED",
    Resolution.FAILED_FINAL: "FAILED_FINAL",
    Resolution.NOT_HAPPENED: "FAILED_RETRYABLE",
    Resolution.INCONCLUSIVE: "UNKNOWN",
}


def event_outcome(event: Event) -> Outcome | None:
    """The status (and attempts, request id, error code) a committed event leaves its run in."""
    if isinstance(event, ToolCallStarted):
        return Outcome("PENDING", event.attempt)
    if isinstance(event, ToolCallSucceeded):
        return Outcome("SUCCEEDED", event.attempt, event.downstream_request_id)
    if isinstance(event, ToolCallFailed):
        final = event.disposition is FailureDisposition.FINAL
        status = "FAILED_FINAL" if final else "FAILED_RETRYABLE"
        return Outcome(status, event.attempt, error_code=event.error.code)
    if isinstance(event, ToolCallOutcomeUnknown):
        return Outcome("UNKNOWN", event.attempt, error_code=ErrorCode.OUTCOME_UNKNOWN.value)
    if isinstance(event, ToolCallReconciled):
        code = event.error.code if event.error else None
        return Outcome(_RECONCILED[event.resolution], None, event.downstream_request_id, code)
    if isinstance(event, ToolCallReplayed):
        code = event.error.code if event.error else None
        return Outcome(event.status.value, event.attempts, error_code=code)
    if isinstance(event, ToolCallRejected):
        return Outcome("REJECTED", error_code=event.error.code)
    if isinstance(event, ApprovalRequested):
        return Outcome("APPROVAL_REQUIRED", error_code=ErrorCode.APPROVAL_REQUIRED.value)
    return None  # approval bookkeeping, decisions and switches: see the commit span
