"""The tool stages, written once and used by every runtime.

    parse and validate -> authorise -> [idempotency decision: the pure core] -> kill switch
    and approval gate -> execute with a timeout -> normalise the result or error

:class:`Stages` is everything the executor core (:mod:`processors.executor`) asks of the
tools, through the :class:`~processors.ports.ToolStages` port: it admits an intent (once),
builds the gate the core applies after the idempotency decision, and runs a tool's handler,
reconcile query, poll or cancel, returning every outcome as data. It decides nothing and
writes nothing: the core decides, the runtime writes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ValidationError

from toolledger.processors import tracing
from toolledger.processors.ledger import (
    ApprovalGate,
    AttemptOutcome,
    CallContext,
    CallState,
    Failure,
    Found,
    FoundFailed,
    Gate,
    Inconclusive,
    JobAccepted,
    JobCancelled,
    JobFailed,
    JobOutcome,
    JobRunning,
    JobSucceeded,
    Policy,
    ReconcileOutcome,
    Success,
    TimedOut,
)
from toolledger.processors.ports import Admitted, Clock, SystemClock
from toolledger.processors.tools import manifest as tools
from toolledger.processors.tools.manifest import (
    EffectClass,
    HandlerResult,
    Impact,
    JobRef,
    Tool,
    ToolContext,
    ToolError,
)
from toolledger.processors.tools.redaction import Redactor
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.processors.tracing import stage
from toolledger.schemas.canonical import CanonicalJsonError, canonical_json, digest_of_canonical
from toolledger.schemas.errors import ErrorCode, ErrorInfo, FieldError
from toolledger.schemas.events import (
    Envelope,
    Event,
    FailureDisposition,
    JobStatus,
    ToolCallFailed,
    ToolCallJobCancelRequested,
    ToolCallJobReported,
    ToolCallRejected,
    ToolCallRequested,
    ToolCallSucceeded,
)
from toolledger.schemas.governance import approval_id_for
from toolledger.schemas.keys import (
    InvalidIdempotencyKey,
    call_id_for,
    call_key_of,
    check_idempotency_key,
)
from toolledger.schemas.nesting import NestingTooDeep, check_text_depth

log = logging.getLogger("toolledger.executor")

DEFAULT_MAX_ARGUMENT_BYTES = 1 << 20
DEFAULT_MAX_RESULT_BYTES = 512 << 10  # well under Kafka's default 1 MiB record limit
DEFAULT_APPROVAL_REQUEST_TTL = timedelta(hours=24)


Authorizer = Callable[[ToolCallRequested, Tool], ErrorInfo | None]


def _reject_nan(token: str) -> Any:
    raise CanonicalJsonError(f"{token} is not a valid JSON number")


class Stages:
    def __init__(
        self,
        registry: ToolRegistry,
        redactor: Redactor,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        authorize: Authorizer | None = None,
        approval_request_ttl: timedelta = DEFAULT_APPROVAL_REQUEST_TTL,
    ) -> None:
        self.registry = registry
        self.redactor = redactor
        self.clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.max_argument_bytes = max_argument_bytes
        self.max_result_bytes = max_result_bytes
        self.authorize = authorize or scope_check
        self.approval_request_ttl = approval_request_ttl

    # -- stage 1 and 2: parse, validate, authorise --------------------------------------------

    def admit(self, intent: ToolCallRequested) -> Admitted | ToolCallRejected:
        env = intent.envelope

        def reject(
            code: ErrorCode, message: str, fields: Sequence[FieldError] = ()
        ) -> ToolCallRejected:
            return ToolCallRejected(
                envelope=env.model_copy(update={"event_id": f"{env.intent_id}/rejected/1"}),
                error=ErrorInfo.of(code, message),
                field_errors=list(fields),
            )

        key = call_key_of(env.call_key)
        if key is None or not key.sent_by(
            env.tenant_id, env.tool, env.idempotency_key, env.principal
        ):
            # never trust the record's call key: it decides whose stored outcome answers
            return reject(ErrorCode.VALIDATION_FAILED, "The intent's call key does not match it.")
        tool = self.registry.get(env.tool)
        if tool is None:
            return reject(ErrorCode.TOOL_NOT_FOUND, f"There is no tool named {env.tool!r}.")
        scope = self.registry.key_scope(tool)
        if key.scope is not scope:  # a front door of another setting: keys must not split
            return reject(
                ErrorCode.INTERNAL,
                f"The front door scoped this call's key by {key.scope.value}, the executor "
                f"scopes {tool.name}'s keys by {scope.value}: the front doors and the "
                "executors of a ledger need the same key scope (--key-scope) and tools.",
            )
        size = len(intent.arguments_json.encode("utf-8"))
        if size > self.max_argument_bytes:
            return reject(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"The arguments have {size} bytes; the limit is {self.max_argument_bytes}.",
            )
        if tool.keyed:
            if not env.idempotency_key:
                return reject(
                    ErrorCode.IDEMPOTENCY_KEY_MISSING,
                    f"{tool.name} changes something, so it needs an idempotency key.",
                )
            try:
                check_idempotency_key(env.idempotency_key)
            except InvalidIdempotencyKey as exc:
                return reject(ErrorCode.IDEMPOTENCY_KEY_INVALID, str(exc).capitalize() + ".")
        try:  # every front door's text passes here: one check, before the parser recurses
            check_text_depth(intent.arguments_json)
        except NestingTooDeep as exc:
            return reject(ErrorCode.VALIDATION_FAILED, str(exc))
        try:
            raw = json.loads(intent.arguments_json, parse_constant=_reject_nan)
        except (ValueError, CanonicalJsonError) as exc:
            return reject(ErrorCode.VALIDATION_FAILED, f"The arguments are not valid JSON: {exc}")
        if not isinstance(raw, dict):
            return reject(ErrorCode.VALIDATION_FAILED, "The arguments must be a JSON object.")
        try:
            arguments = tool.arguments.model_validate(raw)
        except ValidationError as exc:
            fields = [
                FieldError(
                    loc=".".join(str(p) for p in e["loc"]) or "$", msg=e["msg"], type=e["type"]
                )
                for e in exc.errors()
            ]
            return reject(
                ErrorCode.VALIDATION_FAILED,
                f"{len(fields)} argument(s) of {tool.name} are invalid.",
                fields,
            )
        try:
            denied = self.authorize(intent, tool)
        except Exception as exc:
            log.exception("authorizer failed", extra={"tool": tool.name})
            denied = ErrorInfo.of(
                ErrorCode.INTERNAL, f"Authorization failed ({type(exc).__name__})."
            )
        if denied is not None:
            return ToolCallRejected(
                envelope=env.model_copy(update={"event_id": f"{env.intent_id}/rejected/1"}),
                error=denied,
            )
        validated = arguments.model_dump(mode="json")
        try:
            # one canonicalisation for the digest and, with no field to redact, the audit copy
            # (the redactor's text of the same arguments with nothing masked is this text)
            canonical = canonical_json(validated)
            redacted = (
                self.redactor.redacted_json(validated, tool.redact_fields)
                if tool.redact_fields
                else canonical
            )
        except CanonicalJsonError as exc:
            return reject(
                ErrorCode.VALIDATION_FAILED, f"The arguments have no canonical form: {exc}"
            )
        context = CallContext.of(
            env, tool_version=tool.version, args_digest=digest_of_canonical(canonical)
        )
        return Admitted(tool, arguments, context, redacted)

    # -- the driver: one intent, from decision to final outcome -------------------------------

    # -- what the core reads of the tools ---------------------------------------------------

    def tool(self, name: str) -> Tool | None:
        return self.registry.get(name)

    def tools(self) -> Sequence[Tool]:
        return list(self.registry)

    def policy(self, tool: Tool) -> Policy:
        return self.registry.policy(tool)

    def backoff_s(self, tool: Tool, round_attempt: int) -> float:
        """The wait before attempt ``round_attempt`` (>= 2) of a round, with full jitter."""
        return tool.retry.backoff_s(round_attempt, self.rng.random())

    def gate(
        self, intent: ToolCallRequested, admitted: Admitted, disabled: ErrorInfo | None
    ) -> Gate:
        """Kill switch and approval, for the core to apply after the idempotency decision."""
        tool, ctx = admitted.tool, admitted.context
        try:
            needs_approval = tool.needs_approval(admitted.arguments)
        except Exception:  # a broken rule must not let an unapproved call through
            log.exception("approval rule failed; approval required", extra={"tool": tool.name})
            needs_approval = True
        if not needs_approval:
            return Gate(disabled=disabled) if disabled is not None else _OPEN
        return Gate(
            disabled=disabled,
            approval=ApprovalGate(
                # the client sends the token's digest: the raw token is never in the log
                token_digest=intent.approval_token,
                executor_now=self.clock.now(),
                new_approval_id=approval_id_for(ctx.intent_id),
                impact_json=self._impact_json(tool, admitted.arguments),
                request_ttl=self.approval_request_ttl,
            ),
        )

    @staticmethod
    def _impact_json(tool: Tool, arguments: BaseModel) -> str:
        try:
            return canonical_json(tool.impact(arguments).to_json())
        except Exception:  # a tool's bug must not stop the partition: a safe description
            log.exception("describe_impact failed", extra={"tool": tool.name})
            fallback = Impact(
                summary=f"Run {tool.name}; its impact description failed, check the arguments.",
                irreversible=True,
            )
            return canonical_json(fallback.to_json())

    def job_call(
        self, record: ToolCallJobReported | ToolCallJobCancelRequested, state: CallState | None
    ) -> tuple[Tool, CallContext] | ToolCallRejected:
        """The tool and the context a job record's answer is stamped with: the call's own
        (its digest, its tool version) under the record's intent id."""
        env = record.envelope
        key = call_key_of(env.call_key)
        if key is None or not key.names(env.tenant_id, env.tool, env.idempotency_key):
            return refusal(env, "The job record's call key does not match it.")
        tool = self.registry.get(env.tool)
        if tool is None or tool.effect is not EffectClass.LONG_RUNNING:
            refused = ErrorInfo.of(ErrorCode.JOB_NOT_FOUND, "This call has no job.")
            return refusal(env, refused.message, refused)
        ctx = CallContext.of(env)
        if state is not None:
            ctx = state.context.model_copy(
                update={
                    "intent_id": env.intent_id,
                    "principal": env.principal,
                    "trace_id": env.trace_id,
                }
            )
        return tool, ctx

    def job_outcome(self, tool: Tool, report: ToolCallJobReported) -> JobOutcome | ToolCallRejected:
        """What a job's own report says, or its refusal (a result its model rejects)."""
        if report.status is JobStatus.RUNNING:
            return JobRunning(report.progress)
        if report.status is JobStatus.CANCELLED:
            return JobCancelled("The job reported that it was cancelled.")
        if report.status is JobStatus.FAILED:
            return JobFailed(
                report.error or ErrorInfo.of(ErrorCode.INTERNAL, "The job failed.", retryable=False)
            )
        try:
            result = tool.result.model_validate(json.loads(report.result_json or "null"))
            return JobSucceeded(canonical_json(result.model_dump(mode="json")))
        except (ValueError, ValidationError, CanonicalJsonError):
            return refusal(
                report.envelope, f"The reported result does not match {tool.name}'s result model."
            )

    # -- the effects: each runs a tool's code and returns what happened, as data --------------

    async def poll(self, tool: Tool, state: CallState) -> JobOutcome:
        """The tool's answer about the call's job; a poll that fails or answers something
        that is not an answer learns nothing (the job is asked again later)."""
        assert tool.poll is not None and state.job is not None
        job = state.job
        unchanged = JobRunning(job.progress)
        ref = JobRef(job_id=job.id, progress=job.progress)
        with stage("poll", state.context, job_id=job.id):
            try:
                async with asyncio.timeout(tool.timeout_s):
                    answer = await tool.poll(ref, self._tool_context(tool, state.context, 0))
                if isinstance(answer, tools.JobRunning):
                    return JobRunning(answer.progress)
                if isinstance(answer, tools.JobFailed):
                    return JobFailed(answer.error)
                if not isinstance(answer, tools.JobSucceeded):
                    return unchanged
                normalised = _normalise(tool, HandlerResult(answer.result), self.max_result_bytes)
            except asyncio.CancelledError:
                if _really_cancelled():
                    raise
                return unchanged
            except Exception as exc:  # TimeoutError, the tool's bug, an invalid result
                log.warning(
                    "poll failed", extra={"tool": tool.name, "exception": type(exc).__name__}
                )
                return unchanged
        if isinstance(normalised, Failure):
            return JobFailed(normalised.error)
        return JobSucceeded(normalised.result_json)

    async def cancel(self, tool: Tool, state: CallState) -> ErrorInfo | None:
        assert tool.cancel is not None and state.job is not None
        ref = JobRef(job_id=state.job.id, progress=state.job.progress)
        try:
            with stage("cancel", state.context, job_id=state.job.id):
                async with asyncio.timeout(tool.timeout_s):
                    await tool.cancel(ref, self._tool_context(tool, state.context, 0))
        except asyncio.CancelledError:
            if _really_cancelled():
                raise
            return _cancel_failed("CancelledError")
        except Exception as exc:
            log.warning("cancel failed", extra={"tool": tool.name, "exception": type(exc).__name__})
            return _cancel_failed(type(exc).__name__)
        return None

    def _tool_context(self, tool: Tool, ctx: CallContext, attempt: int) -> ToolContext:
        return ToolContext(
            tenant_id=ctx.tenant_id,
            principal=ctx.principal,
            tool=tool.name,
            call_key=ctx.call_key,
            call_id=call_id_for(ctx.call_key, ctx.idempotency_key, ctx.intent_id),
            idempotency_key=ctx.idempotency_key,
            attempt=attempt,
            deadline=self.clock.now() + timedelta(seconds=tool.timeout_s),
        )

    async def execute(self, admitted: Admitted, attempt: int) -> tuple[AttemptOutcome, float]:
        started = self.clock.monotonic()
        with tracing.execute_tool(admitted.context, attempt) as span:
            outcome = await self._run_handler(admitted, attempt)
            done = tracing.attempt_outcome(outcome)
            tracing.record(span, done)
        seconds = self.clock.monotonic() - started
        error = done.error_code or ("OUTCOME_UNKNOWN" if done.status == "UNKNOWN" else None)
        tracing.record_execution(admitted.context, seconds, error)
        return outcome, seconds * 1000.0

    async def _run_handler(self, admitted: Admitted, attempt: int) -> AttemptOutcome:
        tool = admitted.tool
        tctx = self._tool_context(tool, admitted.context, attempt)
        try:
            async with asyncio.timeout(tool.timeout_s):
                returned = await tool.handler(admitted.arguments, tctx)
        except ToolError as exc:
            return Failure(exc.info)
        except TimeoutError:
            return TimedOut(f"No answer from {tool.name} within {tool.timeout_s:g} s.")
        except asyncio.CancelledError:
            if _really_cancelled():
                raise
            return TimedOut(f"{tool.name} was cancelled from inside after dispatch.")
        except Exception as exc:  # the effect may have happened before it raised
            log.warning(
                "handler raised",
                extra={"tool": tool.name, "call_id": tctx.call_id, "exception": type(exc).__name__},
            )
            return TimedOut(f"{tool.name} raised {type(exc).__name__} after dispatch.")
        try:
            if tool.effect is EffectClass.LONG_RUNNING:
                return _job_accepted(returned)
            return _normalise(tool, returned, self.max_result_bytes)
        except (ValidationError, CanonicalJsonError) as exc:
            log.warning(
                "handler returned an invalid result",
                extra={"tool": tool.name, "call_id": tctx.call_id, "exception": type(exc).__name__},
            )
            return TimedOut(f"{tool.name} returned a result that does not match its model.")

    async def reconcile(self, tool: Tool, ctx: CallContext, n: int) -> ReconcileOutcome:
        with stage("reconcile", ctx, reconcile_attempt=n) as span:
            found = await self._query_downstream(tool, ctx, n)
            tracing.record(span, tracing.reconcile_outcome(found))
        return found

    async def _query_downstream(self, tool: Tool, ctx: CallContext, n: int) -> ReconcileOutcome:
        assert tool.reconcile is not None
        try:
            async with asyncio.timeout(tool.timeout_s):
                found = await tool.reconcile(self._tool_context(tool, ctx, 0))
            if isinstance(found, Found):
                size = len(found.result_json.encode("utf-8"))
                if size > self.max_result_bytes:
                    error = _too_large(size, self.max_result_bytes, found.downstream_request_id)
                    return FoundFailed(error)
            return found
        except TimeoutError:
            return Inconclusive(f"reconcile query {n} got no answer within {tool.timeout_s:g} s")
        except asyncio.CancelledError:
            if _really_cancelled():
                raise
            return Inconclusive(f"reconcile query {n} was cancelled from inside")
        except Exception as exc:
            return Inconclusive(f"reconcile query {n} raised {type(exc).__name__}")

    async def read_only(self, admitted: Admitted) -> Event:
        """A read: run once, its outcome recorded as it is (no key, no state, no retry)."""
        ctx = admitted.context
        with stage("read_only", ctx):
            outcome, duration_ms = await self.execute(admitted, 1)
        env = ctx.envelope
        if isinstance(outcome, Success):
            return ToolCallSucceeded(
                envelope=env(f"{ctx.intent_id}/succeeded/1", self.clock.now()),
                attempt=1,
                result_json=outcome.result_json,
                downstream_request_id=outcome.downstream_request_id,
                duration_ms=duration_ms,
            )
        error = (
            outcome.error
            if isinstance(outcome, Failure)
            else ErrorInfo.of(
                ErrorCode.INTERNAL,
                outcome.reason if isinstance(outcome, TimedOut) else "A read started a job.",
            )
        )
        return ToolCallFailed(
            envelope=env(f"{ctx.intent_id}/failed/1", self.clock.now()),
            attempt=1,
            error=error,
            disposition=FailureDisposition.FINAL,
            fingerprint="",
            duration_ms=duration_ms,
        )


_OPEN = Gate()


def refusal(env: Envelope, message: str, error: ErrorInfo | None = None) -> ToolCallRejected:
    """A record refused as it is (its own envelope, the refusal's event id)."""
    return ToolCallRejected(
        envelope=env.model_copy(update={"event_id": f"{env.intent_id}/rejected/1"}),
        error=error or ErrorInfo.of(ErrorCode.VALIDATION_FAILED, message),
    )


def rejected(ctx: CallContext, now: datetime, error: ErrorInfo) -> ToolCallRejected:
    return ToolCallRejected(envelope=ctx.envelope(f"{ctx.intent_id}/rejected/1", now), error=error)


def _cancel_failed(exception: str) -> ErrorInfo:
    return ErrorInfo.of(
        ErrorCode.INTERNAL, f"The job's cancel raised {exception}: it may still run."
    )


def _job_accepted(returned: BaseModel | HandlerResult) -> JobAccepted:
    """A long-running handler's job reference (a :class:`JobRef`, or its fields)."""
    value: Any = returned.value if isinstance(returned, HandlerResult) else returned
    raw = value.model_dump() if isinstance(value, BaseModel) else value
    ref = JobRef.model_validate(raw)
    return JobAccepted(ref.job_id, ref.progress)


def _normalise(
    tool: Tool, returned: BaseModel | HandlerResult, max_bytes: int
) -> Success | Failure:
    request_id = None
    if isinstance(returned, HandlerResult):
        request_id = returned.downstream_request_id
        value: Any = returned.value
    else:
        value = returned
    model = tool.result.model_validate(
        value.model_dump() if isinstance(value, BaseModel) else value
    )
    result_json = canonical_json(model.model_dump(mode="json"))
    if len(result_json.encode("utf-8")) > max_bytes:
        return Failure(_too_large(len(result_json.encode("utf-8")), max_bytes, request_id))
    return Success(result_json, request_id)


def _too_large(size: int, max_bytes: int, request_id: str | None) -> ErrorInfo:
    # The effect happened, so this is final: running it again would do it twice.
    return ErrorInfo.of(
        ErrorCode.INTERNAL,
        f"The tool's result has {size} bytes; the ledger stores at most {max_bytes}. The "
        f"effect happened (downstream request id {request_id or 'unknown'}).",
        retryable=False,
        suggested_action="Do not retry: ask the tool's owner to return a reference instead.",
    )


def _really_cancelled() -> bool:
    """Whether this task is being cancelled (not a CancelledError raised by a handler)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def scope_check(intent: ToolCallRequested, tool: Tool) -> ErrorInfo | None:
    """Default authorisation: the caller's trusted scopes must include the tool's scopes."""
    missing = sorted(tool.scopes - set(intent.scopes))
    if missing:
        return ErrorInfo.of(
            ErrorCode.FORBIDDEN,
            f"{tool.name} needs the scope(s) {missing}, which this caller lacks.",
        )
    return None
