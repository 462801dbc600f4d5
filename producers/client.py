"""``LedgerClient``: what an agent runtime calls. Appends intents, awaits their outcomes.

The client knows no tools: validation, authorisation and the idempotency decision happen in
the executor, which answers every intent with an outcome event. The client only refuses what
it can tell is wrong without the registry (an unusable key, arguments that are not JSON or
too large), and it never appends those.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from toolledger.producers.outcomes import OutcomeHub, Waiter
from toolledger.schemas.errors import ErrorCode, ErrorInfo, FieldError
from toolledger.schemas.events import (
    ApprovalRequested,
    Envelope,
    Event,
    FailureDisposition,
    JobStatus,
    Resolution,
    ToolCallFailed,
    ToolCallJobCancelRequested,
    ToolCallJobProgressed,
    ToolCallJobReplayed,
    ToolCallJobReported,
    ToolCallJobStarted,
    ToolCallOutcomeUnknown,
    ToolCallReconciled,
    ToolCallRejected,
    ToolCallReplayed,
    ToolCallRequested,
    ToolCallSucceeded,
)
from toolledger.schemas.governance import token_digest
from toolledger.schemas.keys import (
    DEFAULT_KEY_SCOPE,
    CallKey,
    InvalidIdempotencyKey,
    KeyScope,
    call_id_for,
    check_idempotency_key,
    random_id,
)
from toolledger.schemas.nesting import NestingTooDeep
from toolledger.schemas.status import CallStatus

DEFAULT_WAIT_S = 10.0
MAX_WAIT_S = 60.0
DEFAULT_MAX_ARGUMENT_BYTES = 1 << 20
# how long a caller whose wait ran out waits on for the executor to decide its intent
DECISION_WAIT_S = 10.0
# the least time an append may take before the caller hears PENDING (the log unreachable):
# a broker that is down or without a leader never holds a caller longer than its wait or this
APPEND_WAIT_S = 10.0
MAX_REFUSALS_IN_FLIGHT = 256

# (call_id, intent_id) -> whether another intent with the same arguments holds the key, running
QueuedProbe = Callable[[str, str], Awaitable[bool]]
# a tool's name -> the scope of its keys (the executor's must agree: it refuses other keys)
KeyScopes = Callable[[str], KeyScope]


def default_key_scopes(_tool: str) -> KeyScope:
    """Every tool's keys scoped as a new ledger's are (:data:`DEFAULT_KEY_SCOPE`)."""
    return DEFAULT_KEY_SCOPE


@dataclass(frozen=True, slots=True)
class TrustedContext:
    """Who is calling, from authentication, never from model-supplied arguments."""

    tenant_id: str
    principal: str
    scopes: frozenset[str] = frozenset({"tools:call"})
    trace_id: str | None = None


class TransportError(Exception):
    """A transport could not append an intent (it may still have reached the log)."""


class Transport(Protocol):
    """How intents reach the log and outcomes come back (embedded or Kafka)."""

    outcomes: OutcomeHub

    async def send(self, intent: Event) -> None:
        """Durably append the intent (returns once the log has it)."""

    async def broadcast(self, record: Event) -> None:
        """Durably append ``record`` to every partition of the log."""


class Caller(Protocol):
    """What calls tools: :class:`LedgerClient` (embedded or Kafka), the HTTP transport, and
    ``toolledger.Ledger`` over any of the three. The agent adapters take any of them."""

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        idempotency_key: str | None,
        context: TrustedContext,
        wait: float | None = None,
        run_id: str | None = None,
        step_id: str | None = None,
        approval_token: str | None = None,
    ) -> CallResult: ...


@dataclass(frozen=True, slots=True)
class CallResult:
    status: CallStatus | None  # None: rejected before execution, nothing stored
    result: Any = None
    error: ErrorInfo | None = None
    attempts: int = 0
    replayed: bool = False
    running: bool = False  # PENDING: this call's own execution has started
    call_id: str = ""
    intent_id: str = ""
    field_errors: tuple[FieldError, ...] = ()
    event: Event | None = field(default=None, compare=False)
    # the approval request an APPROVAL_REQUIRED refusal opened, as the HTTP API shows it
    approval_request: Mapping[str, Any] | None = field(default=None, compare=False)
    # a long-running call's job (id, status, progress, started_at, updated_at), as JSON
    job: Mapping[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status is CallStatus.SUCCEEDED

    @property
    def rejected(self) -> bool:
        return self.status is None

    def to_json(self) -> dict[str, Any]:
        """The shape callers and models see."""
        job = {"job": dict(self.job)} if self.job is not None else {}
        if self.ok:
            return {
                "ok": True,
                "status": "SUCCEEDED",
                "result": self.result,
                "replayed": self.replayed,
                "attempts": self.attempts,
                "call_id": self.call_id,
                **job,
            }
        body: dict[str, Any] = {
            "ok": False,
            "status": self.status.value if self.status else None,
            "error": self.error.model_dump() if self.error else None,
            "replayed": self.replayed,
            "attempts": self.attempts,
            "call_id": self.call_id,
        }
        if self.field_errors:
            body["error"]["field_errors"] = [f.model_dump() for f in self.field_errors]
        return body | job  # a running job: ask again with the same key for its outcome


class LedgerClient:
    def __init__(
        self,
        transport: Transport,
        *,
        default_wait_s: float = DEFAULT_WAIT_S,
        max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES,
        key_scopes: KeyScopes = default_key_scopes,
        append_wait_s: float = APPEND_WAIT_S,
    ) -> None:
        """``key_scopes``: the scope of each tool's keys, as the executor has them (the
        composition root hands the registry's ``key_scope_of``). An append to the log may take
        the caller's wait or ``append_wait_s``, whichever is longer; past it the caller gets
        PENDING (call again with the same key) while the append goes on."""
        self._transport = transport
        self.key_scopes = key_scopes
        self._default_wait_s = default_wait_s
        self._append_wait_s = append_wait_s
        self._max_argument_bytes = max_argument_bytes
        self._refusals: set[asyncio.Task[None]] = set()
        self.refusals_shed = 0  # front-door refusals not put in the audit trail (overload)

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        idempotency_key: str | None,
        context: TrustedContext,
        wait: float | None = None,
        run_id: str | None = None,
        step_id: str | None = None,
        approval_token: str | None = None,
        queued: QueuedProbe | None = None,
    ) -> CallResult:
        """Run ``tool`` at most once per ``idempotency_key``; wait up to ``wait`` seconds.

        Still running after the wait: a result with status PENDING (ask again with the same
        key and arguments to get the outcome; it will not run twice). ``running`` tells
        whether it is this call that runs; otherwise another call with the same key and
        arguments does, which ``queued`` answers from a read of the ledger (see
        :meth:`_decided`). Refusals and replays are answered whatever the wait.
        """
        key = idempotency_key or ""
        call_key = self.call_key(context, tool, key)
        intent_id = random_id()
        call_id = call_id_for(call_key, key, intent_id)
        if idempotency_key is not None:
            try:
                check_idempotency_key(idempotency_key)
            except InvalidIdempotencyKey as exc:
                return _refused(ErrorCode.IDEMPOTENCY_KEY_INVALID, str(exc), call_id)
        for name, value in (("run_id", run_id), ("step_id", step_id)):
            if value is not None and not (0 < len(value) <= 255 and value.isprintable()):
                return _refused(
                    ErrorCode.VALIDATION_FAILED,
                    f"{name} must be 1 to 255 printable characters.",
                    call_id,
                )
        try:
            arguments_json = json.dumps(
                arguments, ensure_ascii=False, allow_nan=False, separators=(",", ":")
            )
        except (TypeError, ValueError) as exc:
            return _refused(
                ErrorCode.VALIDATION_FAILED,
                f"The arguments are not a JSON document: {exc}",
                call_id,
            )
        except RecursionError:  # deeper than any parser follows: far past the limit
            return _refused(
                ErrorCode.VALIDATION_FAILED, str(NestingTooDeep("the arguments")), call_id
            )
        try:
            size = len(arguments_json.encode("utf-8"))
        except UnicodeEncodeError:
            return _refused(
                ErrorCode.VALIDATION_FAILED,
                "The arguments contain a lone surrogate: it is not valid Unicode text.",
                call_id,
            )
        if size > self._max_argument_bytes:
            return _refused(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"The arguments exceed {self._max_argument_bytes} bytes.",
                call_id,
            )
        intent = ToolCallRequested(
            envelope=_envelope(
                context, call_key, tool, key, f"{intent_id}/requested/1", run_id, step_id
            ),
            arguments_json=arguments_json,
            scopes=sorted(context.scopes),
            # only the token's digest travels: the raw token is in no log, not even this one
            approval_token=token_digest(approval_token) if approval_token else None,
        )
        hub = self._transport.outcomes
        waiter = hub.expect(intent_id)
        timeout = min(MAX_WAIT_S, self._default_wait_s if wait is None else max(0.0, wait))
        appended = False
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            # one deadline: the append's (bounded, so no caller hangs on a log that is down),
            # then, once the log has the intent, the caller's wait for the answer
            async with asyncio.timeout_at(start + max(timeout, self._append_wait_s)) as deadline:
                await self._transport.send(intent)
                appended = True
                deadline.reschedule(start + timeout)
                return result_of(await waiter.answer)
        except TransportError as exc:
            # The intent may or may not have reached the log: the same key makes a retry safe.
            error = ErrorInfo.of(ErrorCode.INTERNAL, f"The ledger could not be reached: {exc}")
            return _pending(call_id, intent_id, error)
        except TimeoutError:
            if not appended:  # the append goes on: the intent may still reach the log
                return _pending(call_id, intent_id, _not_appended(timeout, self._append_wait_s))
            # the wait cancelled the answer's future (ours alone): the next answer goes to a
            # new one, which the decision's wait awaits
            if waiter.answer.cancelled():
                waiter.answer = loop.create_future()
            return await self._decided(waiter, call_id, intent_id, queued)
        finally:
            hub.forget(intent_id, waiter)

    def call_key(self, context: TrustedContext, tool: str, idempotency_key: str) -> str:
        """The call key of ``context``'s call of ``tool`` under ``idempotency_key``, in the
        tool's key scope."""
        scope = self.key_scopes(tool)
        key = CallKey.scoped(scope, context.tenant_id, context.principal, tool, idempotency_key)
        return str(key)

    async def _decided(
        self, waiter: Waiter, call_id: str, intent_id: str, queued: QueuedProbe | None
    ) -> CallResult:
        """The wait ran out before the answer: wait on for the executor's *decision* (bounded).

        The wait only decides whether a running call is answered now or later. A refusal, a
        replay or a key reused with other arguments is answered whatever the wait, so this
        returns PENDING only for a call that runs: our own (its Started event is committed) or
        another intent's with the same arguments, which ours queues behind (``queued`` tells).
        """
        deadline = time.monotonic() + DECISION_WAIT_S
        step = 0.01
        while True:
            if waiter.answer.done():
                return result_of(waiter.answer.result())
            if waiter.started:
                running = ErrorInfo.of(ErrorCode.IDEMPOTENCY_KEY_IN_USE, "The call is running.")
                return _pending(call_id, intent_id, running, running=True)
            if queued is not None and await queued(call_id, intent_id):
                in_use = ErrorInfo.of(
                    ErrorCode.IDEMPOTENCY_KEY_IN_USE,
                    "A call with this key and arguments is still running.",
                )
                return _pending(call_id, intent_id, in_use)
            left = deadline - time.monotonic()
            if left <= 0:
                undecided = ErrorInfo.of(
                    ErrorCode.INTERNAL,
                    f"The ledger has not decided this call within {DECISION_WAIT_S:g} s.",
                    retryable=True,
                    suggested_action="Call again with the same key and arguments: it runs at "
                    "most once.",
                )
                return _pending(call_id, intent_id, undecided)
            started: asyncio.Future[Any] = asyncio.ensure_future(waiter.start_signal().wait())
            either: list[asyncio.Future[Any]] = [waiter.answer, started]
            try:
                await asyncio.wait(
                    either,
                    timeout=min(step, left),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                started.cancel()
            step = min(step * 2, 0.2)

    def record_refusal(
        self,
        tool: str,
        idempotency_key: str | None,
        context: TrustedContext,
        error: ErrorInfo,
        *,
        run_id: str | None = None,
        step_id: str | None = None,
    ) -> None:
        """Put a refusal the front door gave itself (rate limit, kill switch, run budget,
        scope) in the audit trail: a ``ToolCallRejected`` appended to the log, which the
        executor records as it is. It changes no state, so the key stays unused. Sent in the
        background, at most ``MAX_REFUSALS_IN_FLIGHT`` at once: a flood of refusals is shed
        (and counted), not turned into a flood of writes."""
        if len(self._refusals) >= MAX_REFUSALS_IN_FLIGHT:
            self.refusals_shed += 1
            return
        key = idempotency_key or ""
        event_id = f"{random_id()}/rejected/1"
        call_key = self.call_key(context, tool, key)
        record = ToolCallRejected(
            envelope=_envelope(context, call_key, tool, key, event_id, run_id, step_id),
            error=error,
        )
        task = asyncio.create_task(self._send_refusal(record))
        self._refusals.add(task)
        task.add_done_callback(self._refusals.discard)

    async def _send_refusal(self, record: ToolCallRejected) -> None:
        try:
            await self._transport.send(record)
        except TransportError:
            self.refusals_shed += 1

    async def command(
        self, record: Event, *, broadcast: bool = False, wait: float | None = None
    ) -> Event | None:
        """Append an operator's command (an approval decision, a switch) and return the event
        that answers it, or ``None`` if none came within the wait (it may still apply).

        Raises :class:`TransportError` if the log could not be reached."""
        hub = self._transport.outcomes
        waiter = hub.expect(record.intent_id)
        timeout = min(MAX_WAIT_S, self._default_wait_s if wait is None else max(0.0, wait))
        start = asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout_at(start + max(timeout, self._append_wait_s)) as deadline:
                if broadcast:
                    await self._transport.broadcast(record)
                else:
                    await self._transport.send(record)
                deadline.reschedule(start + timeout)
                return await asyncio.shield(waiter.answer)
        except TimeoutError:
            return None
        finally:
            hub.forget(record.intent_id, waiter)


def job_record(
    kind: str,
    *,
    context: TrustedContext,
    call_key: str,
    tool: str,
    idempotency_key: str,
    status: str = "running",
    progress: float | None = None,
    result: Any = None,
    error: ErrorInfo | None = None,
) -> ToolCallJobReported | ToolCallJobCancelRequested:
    """A job's report (``kind="report"``) or cancellation (``"cancel"``) for the intents
    stream, in the partition of the call's key (``call_key``: the call's, as the read side
    has it); the executor decides it against the call."""
    intent_id = random_id()
    env = _envelope(
        context, call_key, tool, idempotency_key, f"{intent_id}/job-{kind}/1", None, None
    )
    if kind == "cancel":
        return ToolCallJobCancelRequested(envelope=env)
    result_json = (
        None if result is None else json.dumps(result, ensure_ascii=False, allow_nan=False)
    )
    return ToolCallJobReported(
        envelope=env,
        status=JobStatus(status),
        progress=progress,
        result_json=result_json,
        error=error,
    )


def _envelope(
    context: TrustedContext,
    call_key: str,
    tool: str,
    key: str,
    event_id: str,
    run_id: str | None,
    step_id: str | None,
) -> Envelope:
    """What the front door knows of a call: who (from authentication), which tool and key;
    the executor fills in the tool version and the args digest."""
    return Envelope(
        event_id=event_id,
        call_key=call_key,
        tenant_id=context.tenant_id,
        tool=tool,
        tool_version="",
        idempotency_key=key,
        args_digest="",
        intent_id=event_id.split("/", 1)[0],
        run_id=run_id,
        step_id=step_id,
        principal=context.principal,
        occurred_at=datetime.now(UTC),
        trace_id=context.trace_id,
    )


def _pending(
    call_id: str, intent_id: str, error: ErrorInfo, *, running: bool = False
) -> CallResult:
    """No outcome to give now: ``error`` says why (running, in use, not reached, undecided)."""
    return CallResult(
        status=CallStatus.PENDING,
        call_id=call_id,
        intent_id=intent_id,
        running=running,
        error=error,
    )


def _not_appended(wait_s: float, append_wait_s: float) -> ErrorInfo:
    return ErrorInfo.of(
        ErrorCode.INTERNAL,
        f"The log did not take the intent within {max(wait_s, append_wait_s):g} s "
        "(it may still take it).",
        retryable=True,
        suggested_action="Call again with the same key and arguments: it runs at most once.",
    )


def _refused(code: ErrorCode, message: str, call_id: str) -> CallResult:
    return CallResult(status=None, error=ErrorInfo.of(code, message), call_id=call_id)


def result_of(event: Event) -> CallResult:
    """The caller's view of the event that answered its intent."""
    base: dict[str, Any] = {
        "call_id": call_id_for(event.call_key, event.envelope.idempotency_key, event.intent_id),
        "intent_id": event.intent_id,
        "event": event,
    }
    if isinstance(event, ToolCallSucceeded):
        return CallResult(
            CallStatus.SUCCEEDED, json.loads(event.result_json), attempts=event.attempt, **base
        )
    if isinstance(event, ToolCallFailed):
        status = (
            CallStatus.FAILED_RETRYABLE
            if event.disposition is FailureDisposition.RETRYABLE
            else CallStatus.FAILED_FINAL
        )
        return CallResult(status, error=event.error, attempts=event.attempt, **base)
    if isinstance(event, ToolCallOutcomeUnknown):
        return CallResult(
            CallStatus.UNKNOWN,
            error=ErrorInfo.of(ErrorCode.OUTCOME_UNKNOWN, event.reason),
            attempts=event.attempt,
            **base,
        )
    if isinstance(event, ToolCallReconciled):
        status = {
            Resolution.SUCCEEDED: CallStatus.SUCCEEDED,
            Resolution.FAILED_FINAL: CallStatus.FAILED_FINAL,
        }.get(event.resolution, CallStatus.UNKNOWN)
        result = json.loads(event.result_json) if event.result_json else None
        return CallResult(status, result, error=event.error, replayed=True, **base)
    if isinstance(event, ToolCallReplayed):
        result = json.loads(event.result_json) if event.result_json else None
        return CallResult(
            event.status, result, error=event.error, attempts=event.attempts, replayed=True, **base
        )
    if isinstance(event, ToolCallJobStarted | ToolCallJobProgressed | ToolCallJobReplayed):
        job = event.job.model_dump(mode="json")
        if isinstance(event, ToolCallJobReplayed) and event.status is not CallStatus.PENDING:
            unknown = ErrorInfo.of(
                ErrorCode.OUTCOME_UNKNOWN,
                "The job ran past its timeout; its poll decides the outcome.",
            )
            return CallResult(
                event.status, error=unknown, attempts=event.attempts, replayed=True, job=job, **base
            )
        running = ErrorInfo.of(ErrorCode.IDEMPOTENCY_KEY_IN_USE, "The call's job is running.")
        return CallResult(
            CallStatus.PENDING,
            error=running,
            attempts=event.attempts if isinstance(event, ToolCallJobReplayed) else 0,
            replayed=isinstance(event, ToolCallJobReplayed),
            running=True,
            job=job,
            **base,
        )
    if isinstance(event, ToolCallRejected):
        return CallResult(None, error=event.error, field_errors=tuple(event.field_errors), **base)
    if isinstance(event, ApprovalRequested):
        error = ErrorInfo.of(
            ErrorCode.APPROVAL_REQUIRED,
            f"{event.envelope.tool} needs a human's approval of these exact arguments "
            f"(approval request {event.approval_id}, open until "
            f"{event.expires_at.isoformat()}).",
        )
        return CallResult(None, error=error, **base)
    raise ValueError(f"{event.TYPE} does not answer a call")
