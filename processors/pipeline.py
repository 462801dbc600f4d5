"""The executor stages, written once and used by every runtime.

    parse and validate -> authorise -> idempotency decision (pure core) -> execute with a
    timeout -> normalise the result or error -> append the outcome

A runtime supplies a :class:`~processors.ports.CallPort` per intent: the current state of
call keys and a ``commit`` that makes events durable (and fenced) before it returns.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ValidationError

from processors import tracing
from processors.ledger import (
    ApprovalGate,
    AttemptFinished,
    AttemptOutcome,
    CallContext,
    CallState,
    Cancel,
    ChangeSwitch,
    DecideApproval,
    Decision,
    Execute,
    Expire,
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
    JobUpdate,
    Poll,
    ReconcileFinished,
    ReconcileOutcome,
    RequestCancel,
    Submit,
    Success,
    Sweep,
    TimedOut,
)
from processors.ledger.governance import SwitchEvent
from processors.ports import CallPort, Clock, SystemClock
from processors.tools import manifest as tools
from processors.tools.manifest import (
    EffectClass,
    HandlerResult,
    Impact,
    JobRef,
    Tool,
    ToolContext,
    ToolError,
)
from processors.tools.redaction import Redactor
from processors.tools.registry import ToolRegistry
from processors.tracing import set_call_attributes, stage
from schemas.calls import ANY
from schemas.canonical import CanonicalJsonError, canonical_json, digest_of_canonical
from schemas.errors import ErrorCode, ErrorInfo, FieldError
from schemas.events import (
    ApprovalDenied,
    ApprovalGranted,
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
from schemas.governance import approval_id_for, disabled_error
from schemas.keys import CallKey, InvalidIdempotencyKey, call_id_for, check_idempotency_key

log = logging.getLogger("toolledger.executor")

DEFAULT_MAX_ARGUMENT_BYTES = 1 << 20
DEFAULT_MAX_RESULT_BYTES = 512 << 10  # well under Kafka's default 1 MiB record limit
DEFAULT_APPROVAL_REQUEST_TTL = timedelta(hours=24)


@dataclass(frozen=True, slots=True)
class Admitted:
    tool: Tool
    arguments: BaseModel
    context: CallContext
    redacted_json: str


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

        if env.call_key != str(CallKey(env.tenant_id, env.tool, env.idempotency_key)):
            # never trust the record's call key: it decides whose stored outcome answers
            return reject(ErrorCode.VALIDATION_FAILED, "The intent's call key does not match it.")
        tool = self.registry.get(env.tool)
        if tool is None:
            return reject(ErrorCode.TOOL_NOT_FOUND, f"There is no tool named {env.tool!r}.")
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
        context = CallContext.of(env).model_copy(
            update={"tool_version": tool.version, "args_digest": digest_of_canonical(canonical)}
        )
        return Admitted(tool, arguments, context, redacted)

    # -- the driver: one intent, from decision to final outcome -------------------------------

    async def run_intent(self, intent: ToolCallRequested, port: CallPort) -> None:
        env = intent.envelope
        with tracing.traced_run("intent", port, env) as run:
            with stage("admit", tenant=env.tenant_id, tool=env.tool) as span:
                admitted = self.admit(intent)
                if isinstance(admitted, ToolCallRejected):
                    tracing.record(span, tracing.event_outcome(admitted))
            if isinstance(admitted, ToolCallRejected):
                await run.commit([admitted], final=True)
                return
            ctx = admitted.context
            set_call_attributes(run.span, ctx)
            if not admitted.tool.keyed:
                disabled = _switched_off(run, ctx)
                if disabled is not None:  # nothing to replay for a read: refused outright
                    refused = ToolCallRejected(
                        envelope=ctx.envelope(f"{ctx.intent_id}/rejected/1", env.occurred_at),
                        error=disabled,
                    )
                    await run.commit([refused], final=True)
                    return
                await run.commit([await self._run_read_only(admitted)], final=True)
                return
            decision = tracing.traced_decide(
                run.state(ctx.call_key),
                Submit(
                    context=ctx,
                    arguments_redacted_json=admitted.redacted_json,
                    policy=self.registry.policy(admitted.tool),
                    now=env.occurred_at,
                    epoch=run.epoch,
                    gate=self._gate(intent, admitted, run),
                    approvals=run.approvals(ctx.call_key),
                ),
                ctx,
            )
            await self._drive(admitted, decision, run, by_intent=True)

    def _gate(self, intent: ToolCallRequested, admitted: Admitted, port: CallPort) -> Gate:
        """Kill switch and approval, for the core to apply after the idempotency decision."""
        tool, ctx = admitted.tool, admitted.context
        disabled = _switched_off(port, ctx)
        try:
            needs_approval = tool.needs_approval(admitted.arguments)
        except Exception:  # a broken rule must not let an unapproved call through
            log.exception("approval rule failed; approval required", extra={"tool": tool.name})
            needs_approval = True
        if not needs_approval:
            return Gate(disabled=disabled)
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

    async def run_approval_decision(
        self, decision: ApprovalGranted | ApprovalDenied, port: CallPort
    ) -> None:
        """An operator approved or denied a request; answered with the event or a refusal."""
        env = decision.envelope
        with tracing.traced_run("approval_decision", port, env, decision=decision.TYPE) as run:
            if env.call_key != str(CallKey(env.tenant_id, env.tool, env.idempotency_key)):
                await run.commit(
                    [_refusal(env, "The decision's call key does not match it.")], final=True
                )
                return
            outcome = tracing.traced_decide(
                None, DecideApproval(decision, run.approvals(env.call_key))
            )
            await run.commit(outcome.events, final=True)

    async def run_door_refusal(self, refusal: ToolCallRejected, port: CallPort) -> None:
        """A refusal the front door gave itself (rate limit, switch, run budget, scope): into
        the audit trail as it is. A rejection changes no call state: the key stays unused."""
        env = refusal.envelope
        with tracing.traced_run("door_refusal", port, env) as run:
            consistent = (
                env.call_key == str(CallKey(env.tenant_id, env.tool, env.idempotency_key))
                and env.event_id == f"{env.intent_id}/rejected/1"
            )
            if not consistent:  # never recorded under another call's key
                log.warning("a front-door refusal with a foreign call key was dropped")
            await run.commit([refusal] if consistent else [], final=True)

    async def run_switch(self, change: SwitchEvent, port: CallPort, partition: int) -> None:
        with tracing.traced_run("switch", port, change.envelope, partition=partition) as run:
            await run.commit(
                tracing.traced_decide(None, ChangeSwitch(change, partition)).events, final=True
            )

    async def run_job_report(self, report: ToolCallJobReported, port: CallPort) -> None:
        """The job of a long-running call reports (``POST /v1/calls/{id}/job``): decided by
        the core in the key's partition, in order with the sweeper's polls, so the first word
        that finishes the job wins and any later one is refused."""
        env = report.envelope
        with tracing.traced_run("job_report", port, env) as run:
            located = self._job_call(report, run)
            if isinstance(located, ToolCallRejected):
                await run.commit([located], final=True)
                return
            tool, state, ctx = located
            outcome = self._reported(tool, report)
            if isinstance(outcome, ToolCallRejected):
                await run.commit([outcome], final=True)
                return
            update = JobUpdate(
                context=ctx,
                outcome=outcome,
                source="report",
                by_intent=True,
                policy=self.registry.policy(tool),
                now=env.occurred_at,
            )
            await run.commit(tracing.traced_decide(state, update, ctx).events, final=True)

    async def run_job_cancel(self, request: ToolCallJobCancelRequested, port: CallPort) -> None:
        """``POST /v1/calls/{id}/job/cancel``: the core decides whether the tool's ``cancel``
        may be called; once it returned, the call ends FAILED_FINAL with CANCELLED."""
        env = request.envelope
        with tracing.traced_run("job_cancel", port, env) as run:
            located = self._job_call(request, run)
            if isinstance(located, ToolCallRejected):
                await run.commit([located], final=True)
                return
            tool, state, ctx = located
            ask = RequestCancel(
                context=ctx, can_cancel=tool.cancel is not None, now=env.occurred_at
            )
            decision = tracing.traced_decide(state, ask, ctx)
            admitted = Admitted(tool, tool.arguments.model_construct(), ctx, "{}")
            await self._drive(admitted, decision, run, by_intent=True)

    def _job_call(
        self, record: ToolCallJobReported | ToolCallJobCancelRequested, port: CallPort
    ) -> tuple[Tool, CallState | None, CallContext] | ToolCallRejected:
        """The tool, the call's state and the context the answer is stamped with: the call's
        own (its digest, its tool version) under the record's intent id."""
        env = record.envelope
        if env.call_key != str(CallKey(env.tenant_id, env.tool, env.idempotency_key)):
            return _refusal(env, "The job record's call key does not match it.")
        tool = self.registry.get(env.tool)
        if tool is None or tool.effect is not EffectClass.LONG_RUNNING:
            refused = ErrorInfo.of(ErrorCode.JOB_NOT_FOUND, "This call has no job.")
            return _refusal(env, refused.message, refused)
        state = port.state(env.call_key)
        ctx = CallContext.of(env)
        if state is not None:
            ctx = state.context.model_copy(
                update={
                    "intent_id": env.intent_id,
                    "principal": env.principal,
                    "trace_id": env.trace_id,
                }
            )
        return tool, state, ctx

    def _reported(self, tool: Tool, report: ToolCallJobReported) -> JobOutcome | ToolCallRejected:
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
            return _refusal(
                report.envelope, f"The reported result does not match {tool.name}'s result model."
            )

    async def run_sweep(self, call_key: str, port: CallPort) -> None:
        """Background reconcile of an UNKNOWN key (no caller, no arguments needed)."""
        with tracing.traced_run("sweep", port, None) as run:
            state = run.state(call_key)
            tool = self.registry.get(state.context.tool) if state else None
            if state is None or tool is None:
                return
            set_call_attributes(run.span, state.context)
            sweep = Sweep(policy=self.registry.policy(tool), now=self.clock.now())
            decision = tracing.traced_decide(state, sweep)
            admitted = Admitted(tool, tool.arguments.model_construct(), state.context, "{}")
            await self._drive(admitted, decision, run, by_intent=False)

    async def run_expiry(self, call_key: str, port: CallPort) -> None:
        """A finished key whose retention may have passed: the core decides, by this
        executor's clock; the expiry is recorded on the log, so every replay agrees."""
        with tracing.traced_run("expire", port, None) as run:
            state, book = run.state(call_key), run.approvals(call_key)
            # a key with a call, or one that only had approval requests
            context = state.context if state is not None else book.context if book else None
            tool = self.registry.get(context.tool) if context is not None else None
            if tool is None:
                return
            expire = Expire(policy=self.registry.policy(tool), now=self.clock.now(), approvals=book)
            await run.commit(tracing.traced_decide(state, expire).events, final=True)

    async def _drive(
        self,
        admitted: Admitted,
        decision: Decision,
        port: CallPort,
        *,
        by_intent: bool,
    ) -> None:
        tool, ctx = admitted.tool, admitted.context
        while True:
            # Executor invariant: the Started event is durable (and the commit not fenced)
            # before the handler runs; a commit that raises ends the loop without running it.
            await port.commit(decision.events, final=decision.action is None)
            action = decision.action
            if action is None:
                return
            state = port.state(ctx.call_key)
            if isinstance(action, Execute):
                if action.round_attempt > 1:
                    await asyncio.sleep(
                        tool.retry.backoff_s(action.round_attempt, self.rng.random())
                    )
                started = self.clock.monotonic()
                outcome = await self._attempt(admitted, action.attempt)
                duration_ms = int((self.clock.monotonic() - started) * 1000)
                decision = tracing.traced_decide(
                    state,
                    AttemptFinished(
                        context=ctx,
                        attempt=action.attempt,
                        outcome=outcome,
                        duration_ms=duration_ms,
                        arguments_redacted_json=admitted.redacted_json,
                        policy=self.registry.policy(tool),
                        now=self.clock.now(),
                        epoch=port.epoch,
                    ),
                    ctx,
                )
            elif isinstance(action, Poll):
                assert state is not None
                polled = await self._poll(tool, state)
                decision = tracing.traced_decide(
                    state,
                    JobUpdate(
                        context=ctx,
                        outcome=polled,
                        source="poll",
                        by_intent=False,
                        policy=self.registry.policy(tool),
                        now=self.clock.now(),
                    ),
                    ctx,
                )
            elif isinstance(action, Cancel):
                assert state is not None and state.job is not None
                try:
                    await self._cancel(tool, state)
                except Exception as exc:
                    log.warning(
                        "cancel failed",
                        extra={"tool": tool.name, "exception": type(exc).__name__},
                    )
                    failed = ErrorInfo.of(
                        ErrorCode.INTERNAL,
                        f"The job's cancel raised {type(exc).__name__}: it may still run.",
                    )
                    decision = Decision((_rejected(ctx, self.clock.now(), failed),))
                    continue
                decision = tracing.traced_decide(
                    state,
                    JobUpdate(
                        context=ctx,
                        outcome=JobCancelled(),
                        source="cancel",
                        by_intent=True,
                        policy=self.registry.policy(tool),
                        now=self.clock.now(),
                    ),
                    ctx,
                )
            else:
                found = await self._reconcile(tool, ctx, action.reconcile_attempt)
                decision = tracing.traced_decide(
                    state,
                    ReconcileFinished(
                        context=ctx,
                        outcome=found,
                        by_intent=by_intent,
                        arguments_redacted_json=admitted.redacted_json,
                        policy=self.registry.policy(tool),
                        now=self.clock.now(),
                        epoch=port.epoch,
                        gate=Gate(disabled=_switched_off(port, ctx) if by_intent else None),
                    ),
                    ctx,
                )

    async def _poll(self, tool: Tool, state: CallState) -> JobOutcome:
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

    async def _cancel(self, tool: Tool, state: CallState) -> None:
        assert tool.cancel is not None and state.job is not None
        ref = JobRef(job_id=state.job.id, progress=state.job.progress)
        with stage("cancel", state.context, job_id=state.job.id):
            async with asyncio.timeout(tool.timeout_s):
                await tool.cancel(ref, self._tool_context(tool, state.context, 0))

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

    async def _attempt(self, admitted: Admitted, attempt: int) -> AttemptOutcome:
        with stage("execute", admitted.context, attempt=attempt) as span:
            outcome = await self._run_handler(admitted, attempt)
            tracing.record(span, tracing.attempt_outcome(outcome))
        return outcome

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

    async def _reconcile(self, tool: Tool, ctx: CallContext, n: int) -> ReconcileOutcome:
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

    async def _run_read_only(self, admitted: Admitted) -> Event:
        ctx = admitted.context
        started = self.clock.monotonic()
        with stage("read_only", ctx):
            outcome = await self._attempt(admitted, 1)
        duration_ms = int((self.clock.monotonic() - started) * 1000)
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


def _switched_off(port: CallPort, ctx: CallContext) -> ErrorInfo | None:
    switch = port.disabled(ctx.tenant_id, ctx.tool)
    if switch is None:
        return None
    return disabled_error(switch.tenant_id == ANY, switch.tool == ANY, ctx.tool, switch.reason)


def _refusal(env: Envelope, message: str, error: ErrorInfo | None = None) -> ToolCallRejected:
    return ToolCallRejected(
        envelope=env.model_copy(update={"event_id": f"{env.intent_id}/rejected/1"}),
        error=error or ErrorInfo.of(ErrorCode.VALIDATION_FAILED, message),
    )


def _rejected(ctx: CallContext, now: datetime, error: ErrorInfo) -> ToolCallRejected:
    return ToolCallRejected(envelope=ctx.envelope(f"{ctx.intent_id}/rejected/1", now), error=error)


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


def reconcile_found(value: BaseModel, downstream_request_id: str | None = None) -> Found:
    """Helper for reconcile hooks: the downstream has the effect, with this result."""
    return Found(canonical_json(value.model_dump(mode="json")), downstream_request_id)
