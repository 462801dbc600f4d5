"""``decide``: given what the ledger knows about a call key and a command, which events follow.

This is the whole state table (docs/architecture.md#states-and-the-replay-contract).
It is pure: time, ids and the outcomes of handlers and reconcile queries arrive in the
command; refusals are events, not exceptions.
Event ids are ``<intent_id>/<kind>/<n>``, so reprocessing an intent yields the same ids.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from toolledger.processors.ledger.commands import (
    Action,
    ApprovalGate,
    AttemptFinished,
    Cancel,
    ChangeSwitch,
    Command,
    DecideApproval,
    Execute,
    Expire,
    Found,
    FoundFailed,
    Gate,
    Inconclusive,
    JobAccepted,
    JobCancelled,
    JobFailed,
    JobRunning,
    JobSucceeded,
    JobUpdate,
    NotHappened,
    Policy,
    Poll,
    Reconcile,
    ReconcileFinished,
    Recover,
    RequestCancel,
    Submit,
    Success,
    Sweep,
    TimedOut,
)
from toolledger.processors.ledger.evolve import NOT_HAPPENED_ERROR
from toolledger.processors.ledger.governance import ApprovalBook, ApprovalStatus
from toolledger.processors.ledger.state import CallContext, CallState
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.events import (
    ApprovalConsumed,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    FailureDisposition,
    JobInfo,
    JobStatus,
    Resolution,
    ToolCallFailed,
    ToolCallJobProgressed,
    ToolCallJobReplayed,
    ToolCallJobStarted,
    ToolCallKeyExpired,
    ToolCallOutcomeUnknown,
    ToolCallReconciled,
    ToolCallRejected,
    ToolCallReplayed,
    ToolCallStarted,
    ToolCallSucceeded,
)
from toolledger.schemas.status import CallStatus


class InvariantViolation(RuntimeError):
    """A command that cannot happen in this state: a bug in a runtime, not a caller's error."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :func:`decide` answers: the events to append and what the runtime does next."""

    events: tuple[Event, ...] = ()
    action: Action | None = None


def decide(state: CallState | None, command: Command) -> Verdict:
    if isinstance(command, Submit):
        return _submit(state, command)
    if isinstance(command, AttemptFinished):
        return _attempt_finished(_require(state, CallStatus.PENDING, command), command)
    if isinstance(command, ReconcileFinished):
        return _reconcile_finished(_require(state, CallStatus.UNKNOWN, command), command)
    if isinstance(command, Recover):
        return _recover(state, command)
    if isinstance(command, DecideApproval):
        return _decide_approval(command)
    if isinstance(command, ChangeSwitch):
        return _change_switch(command)
    if isinstance(command, Expire):
        return _expire(state, command)
    if isinstance(command, JobUpdate):
        return _job_update(state, command)
    if isinstance(command, RequestCancel):
        return _request_cancel(state, command)
    return _sweep(state, command)


def failure_fingerprint(tool: str, error: ErrorInfo) -> str:
    """Tool, code and the message with numbers and ids blanked: equal for repeats of one fault."""
    message = re.sub(r"[0-9a-f]{8,}|\d+", "#", error.message.lower()).strip()
    raw = f"{tool}\x1f{error.code}\x1f{message}".encode()
    return "fp:" + hashlib.sha256(raw).hexdigest()[:16]


def _require(state: CallState | None, status: CallStatus, command: Command) -> CallState:
    if state is None or state.status is not status:
        found = "no state" if state is None else state.status.value
        raise InvariantViolation(
            f"{type(command).__name__} needs a {status.value} call, found {found}"
        )
    return state


def _eid(ctx: CallContext, kind: str, n: int = 1) -> str:
    return f"{ctx.intent_id}/{kind}/{n}"


def _started(
    ctx: CallContext, now: datetime, attempt: int, round_: int, epoch: int, redacted: str
) -> ToolCallStarted:
    return ToolCallStarted(
        envelope=ctx.envelope(_eid(ctx, "started", attempt), now),
        attempt=attempt,
        round=round_,
        executor_epoch=epoch,
        arguments_redacted_json=redacted,
    )


def _rejected(ctx: CallContext, now: datetime, error: ErrorInfo) -> ToolCallRejected:
    return ToolCallRejected(envelope=ctx.envelope(_eid(ctx, "rejected"), now), error=error)


def settled_at(state: CallState) -> datetime | None:
    """When a call's key retention starts: its last terminal event (``updated_at``, which only
    state changes move). ``None`` while the call is unresolved (PENDING, UNKNOWN: a key never
    expires under a call that may still have an effect)."""
    return None if state.status in _UNRESOLVED else state.updated_at


def key_settled_at(state: CallState | None, book: ApprovalBook | None) -> datetime | None:
    """When a key's retention starts: the later of its call's :func:`settled_at` and its
    approval book's (a request decided or lapsed after the call keeps the key that long).
    ``None`` while the call is unresolved, or for a key with neither (nor a book stored
    before books had their times)."""
    call = None if state is None else settled_at(state)
    if state is not None and call is None:
        return None
    approvals = None if book is None or not book.items else book.settled_at()
    return max((t for t in (call, approvals) if t is not None), default=None)


def expires_at(
    state: CallState | None, policy: Policy, book: ApprovalBook | None = None
) -> datetime | None:
    """When a key expires: :func:`key_settled_at` plus the tool's key retention. ``None``
    while it is unresolved or when the tool keeps keys forever."""
    settled = key_settled_at(state, book)
    if policy.key_retention_s is None or settled is None:
        return None
    return settled + timedelta(seconds=policy.key_retention_s)


_UNRESOLVED = (CallStatus.PENDING, CallStatus.UNKNOWN)


def _expired(
    state: CallState | None,
    policy: Policy,
    now: datetime,
    book: ApprovalBook | None,
    intent_id: str | None = None,
) -> ToolCallKeyExpired | None:
    """The expiry of the key at ``now`` (log time), or None: at ``expires_at`` exactly it has
    expired. An approval still to be decided or used keeps it (a book without its times says
    so only through ``open_at``). Recorded under ``intent_id`` (a call's), or under one
    derived from the key's last event when the executor finds it due."""
    due = expires_at(state, policy, book)
    if due is None or now < due or (book is not None and book.open_at(now)):
        return None
    assert policy.key_retention_s is not None
    if state is not None:
        context, last_event_id = state.context, state.last_event_id
    else:  # a book with a due has its times, and so its context
        assert book is not None and book.context is not None and book.last_event_id is not None
        context, last_event_id = book.context, book.last_event_id
    intent_id = intent_id or expiry_intent_id(context.call_key, last_event_id)
    ctx = context.model_copy(update={"intent_id": intent_id})
    return ToolCallKeyExpired(
        envelope=ctx.envelope(f"{intent_id}/expired/1", now),
        status=None if state is None else state.status,
        last_event_at=due - timedelta(seconds=policy.key_retention_s),
        retention_s=policy.key_retention_s,
    )


def expiry_intent_id(call_key: str, last_event_id: str) -> str:
    """The id an expiry found by the executor (not by a call) is recorded under: derived from
    the key and its call's (else its book's) last event, so deciding it again gives the same
    event."""
    raw = f"{call_key}\x1f{last_event_id}".encode()
    return "exp_" + hashlib.sha256(raw).hexdigest()[:32]


def _expire(state: CallState | None, cmd: Expire) -> Verdict:
    expired = _expired(state, cmd.policy, cmd.now, cmd.approvals)
    return Verdict(() if expired is None else (expired,))


def _submit(state: CallState | None, cmd: Submit) -> Verdict:
    ctx, now = cmd.context, cmd.now
    expired = _expired(state, cmd.policy, now, cmd.approvals, ctx.intent_id)
    if expired is not None:  # the key is new again: decided as a first call without its
        # past (an old denial or request of the key is forgotten with it), after the expiry
        first = _submit(None, replace(cmd, approvals=None))
        return Verdict((expired, *first.events), first.action)
    if state is None:
        book = cmd.approvals
        if book is not None and book.items and book.latest_for(ctx.args_digest) is None:
            # no call ran, but the key was taken by the arguments its approval requests are
            # for: other arguments are a reused key, as against a call state
            return Verdict((_key_reused(ctx, now, book.items[-1].args_digest),))
        # Past the idempotency decision: the kill switch, then the approval, then Started.
        if cmd.gate.disabled is not None:
            return Verdict((_rejected(ctx, now, cmd.gate.disabled),))
        consumed: tuple[Event, ...] = ()
        if cmd.gate.approval is not None:
            checked = _check_approval(
                cmd.gate.approval, cmd.approvals, ctx, now, cmd.arguments_redacted_json
            )
            if isinstance(checked, Verdict):
                return checked
            consumed = (checked,)
        started = _started(ctx, now, 1, 1, cmd.epoch, cmd.arguments_redacted_json)
        # the token is consumed in the same atomic write as the Started event it allows
        return Verdict((*consumed, started), Execute(attempt=1, round_attempt=1))
    if state.args_digest != ctx.args_digest:
        return Verdict((_key_reused(ctx, now, state.args_digest),))
    if _job_running(state) and state.status in _UNRESOLVED:
        # a long-running call's job runs (or timed out, and polls resolve it): the same job
        # answers, and nothing starts again
        assert state.job is not None
        return Verdict(
            (
                ToolCallJobReplayed(
                    envelope=ctx.envelope(_eid(ctx, "job-replayed"), now),
                    status=state.status,
                    attempts=state.attempts,
                    original_intent_id=state.context.intent_id,
                    job=state.job,
                ),
            )
        )
    if state.status.is_final or (
        state.status is CallStatus.UNKNOWN and not cmd.policy.has_reconcile
    ):
        error = state.error
        if state.status is CallStatus.UNKNOWN:
            error = ErrorInfo.of(
                ErrorCode.OUTCOME_UNKNOWN,
                "The outcome of this call is unknown and the tool has no reconcile query.",
                retryable=False,
                suggested_action="Do not retry: an operator must check the downstream system.",
            )
        replayed = ToolCallReplayed(
            envelope=ctx.envelope(_eid(ctx, "replayed"), now),
            status=state.status,
            attempts=state.attempts,
            original_intent_id=state.context.intent_id,
            result_json=state.result_json,
            error=error,
        )
        return Verdict((replayed,))
    if state.status is CallStatus.PENDING:
        return Verdict(
            (
                _rejected(
                    ctx,
                    now,
                    ErrorInfo.of(
                        ErrorCode.IDEMPOTENCY_KEY_IN_USE,
                        "A call with this key and arguments is running.",
                    ),
                ),
            )
        )
    if state.status is CallStatus.UNKNOWN:
        return Verdict(action=Reconcile(reconcile_attempt=state.reconcile_attempts + 1))
    return _new_round(state, ctx, now, cmd.policy, cmd.epoch, cmd.arguments_redacted_json, cmd.gate)


def _key_reused(ctx: CallContext, now: datetime, first_digest: str) -> ToolCallRejected:
    return _rejected(
        ctx,
        now,
        ErrorInfo.of(
            ErrorCode.IDEMPOTENCY_KEY_REUSED,
            f"Idempotency key {ctx.idempotency_key!r} was first used with other arguments "
            f"({first_digest}); this call has {ctx.args_digest}.",
        ),
    )


def _new_round(
    state: CallState,
    ctx: CallContext,
    now: datetime,
    policy: Policy,
    epoch: int,
    redacted: str,
    gate: Gate,
    prefix: tuple[Event, ...] = (),
) -> Verdict:
    """FAILED_RETRYABLE (or reconciled as not happened): execute again, within the round cap.

    The approval that let the first round start covers the later rounds of the same call
    (same key, same arguments); a switched-off tool starts no new round."""
    attempt = state.attempts + 1
    if state.rounds >= policy.max_rounds:
        last = state.error.code if state.error else "none"
        failed = ToolCallFailed(
            envelope=ctx.envelope(_eid(ctx, "failed", state.attempts), now),
            attempt=state.attempts,
            error=ErrorInfo.of(
                ErrorCode.RETRY_LIMIT_EXCEEDED,
                f"Gave up after {state.rounds} rounds and {state.attempts} attempts "
                f"(last error {last}).",
            ),
            disposition=FailureDisposition.FINAL,
            fingerprint=failure_fingerprint(ctx.tool, state.error or NOT_HAPPENED_ERROR),
            duration_ms=0,
        )
        return Verdict((*prefix, failed))
    if gate.disabled is not None:
        return Verdict((*prefix, _rejected(ctx, now, gate.disabled)))
    started = _started(ctx, now, attempt, state.rounds + 1, epoch, redacted)
    return Verdict((*prefix, started), Execute(attempt=attempt, round_attempt=1))


def _attempt_finished(state: CallState, cmd: AttemptFinished) -> Verdict:
    ctx, now, attempt, outcome = cmd.context, cmd.now, cmd.attempt, cmd.outcome
    if attempt != state.attempts:
        raise InvariantViolation(f"attempt {attempt} finished but attempt {state.attempts} ran")
    env = ctx.envelope
    if isinstance(outcome, JobAccepted):
        if not cmd.policy.long_running:
            raise InvariantViolation("a job reference from a tool that is not long_running")
        job = JobInfo(id=outcome.job_id, progress=outcome.progress, started_at=now, updated_at=now)
        return Verdict(
            (
                ToolCallJobStarted(
                    envelope=env(_eid(ctx, "job-started", attempt), now),
                    attempt=attempt,
                    job=job,
                    duration_ms=cmd.duration_ms,
                ),
            )
        )
    if isinstance(outcome, Success):
        return Verdict(
            (
                ToolCallSucceeded(
                    envelope=env(_eid(ctx, "succeeded", attempt), now),
                    attempt=attempt,
                    result_json=outcome.result_json,
                    downstream_request_id=outcome.downstream_request_id,
                    duration_ms=cmd.duration_ms,
                ),
            )
        )
    if isinstance(outcome, TimedOut):
        return Verdict(
            (
                ToolCallOutcomeUnknown(
                    envelope=env(_eid(ctx, "unknown", attempt), now),
                    attempt=attempt,
                    reason=outcome.reason,
                ),
            )
        )
    error = outcome.error
    fingerprint = failure_fingerprint(ctx.tool, error)

    def failed(disposition: FailureDisposition, err: ErrorInfo = error) -> ToolCallFailed:
        return ToolCallFailed(
            envelope=env(_eid(ctx, "failed", attempt), now),
            attempt=attempt,
            error=err,
            disposition=disposition,
            fingerprint=fingerprint,
            duration_ms=cmd.duration_ms,
        )

    if not error.retryable:
        return Verdict((failed(FailureDisposition.FINAL),))
    if state.round_attempts < cmd.policy.max_attempts:
        started = _started(
            ctx, now, attempt + 1, state.rounds, cmd.epoch, cmd.arguments_redacted_json
        )
        return Verdict(
            (failed(FailureDisposition.RETRY), started),
            Execute(attempt=attempt + 1, round_attempt=state.round_attempts + 1),
        )
    if state.rounds < cmd.policy.max_rounds:
        return Verdict((failed(FailureDisposition.RETRYABLE),))
    return Verdict(
        (
            failed(
                FailureDisposition.FINAL,
                ErrorInfo.of(
                    ErrorCode.RETRY_LIMIT_EXCEEDED,
                    f"Gave up after {state.rounds} rounds and {attempt} attempts "
                    f"(last error {error.code}: {error.message})",
                ),
            ),
        )
    )


def _reconcile_finished(state: CallState, cmd: ReconcileFinished) -> Verdict:
    ctx, now, outcome = cmd.context, cmd.now, cmd.outcome
    n = state.reconcile_attempts + 1

    def reconciled(resolution: Resolution, **fields: object) -> ToolCallReconciled:
        return ToolCallReconciled.model_validate(
            {
                "envelope": ctx.envelope(_eid(ctx, "reconciled", n), now),
                "resolution": resolution,
                "reconcile_attempt": n,
                **fields,
            }
        )

    if isinstance(outcome, Found):
        return Verdict(
            (
                reconciled(
                    Resolution.SUCCEEDED,
                    result_json=outcome.result_json,
                    downstream_request_id=outcome.downstream_request_id,
                ),
            )
        )
    if isinstance(outcome, FoundFailed):
        return Verdict((reconciled(Resolution.FAILED_FINAL, error=outcome.error),))
    if isinstance(outcome, Inconclusive):
        return Verdict(
            (
                reconciled(
                    Resolution.INCONCLUSIVE,
                    error=ErrorInfo.of(
                        ErrorCode.OUTCOME_UNKNOWN, f"Reconcile was inconclusive: {outcome.reason}"
                    ),
                ),
            )
        )
    assert isinstance(outcome, NotHappened)
    not_happened = reconciled(Resolution.NOT_HAPPENED, error=NOT_HAPPENED_ERROR)
    if not cmd.by_intent:
        return Verdict((not_happened,))
    after = state.model_copy(
        update={"status": CallStatus.FAILED_RETRYABLE, "reconcile_attempts": n}
    )
    return _new_round(
        after,
        ctx,
        now,
        cmd.policy,
        cmd.epoch,
        cmd.arguments_redacted_json,
        cmd.gate,
        prefix=(not_happened,),
    )


def _recover(state: CallState | None, cmd: Recover) -> Verdict:
    # Executor invariant, takeover half: a key found PENDING with no terminal event becomes
    # UNKNOWN and goes to reconcile; it is never re-run blind.
    if state is None or state.status is not CallStatus.PENDING or _job_running(state):
        return Verdict()  # a started job outlives its executor: polls go on
    ctx = state.context
    return Verdict(
        (
            ToolCallOutcomeUnknown(
                envelope=ctx.envelope(_eid(ctx, "unknown", state.attempts), cmd.now),
                attempt=state.attempts,
                reason="The executor stopped or lost its partition before the outcome was "
                "recorded.",
            ),
        )
    )


def _sweep(state: CallState | None, cmd: Sweep) -> Verdict:
    if state is not None and _job_running(state) and cmd.policy.long_running:
        assert state.job is not None
        timeout = cmd.policy.job_timeout_s
        if (
            state.status is CallStatus.PENDING
            and timeout is not None
            and cmd.now >= state.job.started_at + timedelta(seconds=timeout)
        ):
            ctx = state.context
            unknown = ToolCallOutcomeUnknown(
                envelope=ctx.envelope(_eid(ctx, "unknown", state.attempts), cmd.now),
                attempt=state.attempts,
                reason=f"The job {state.job.id} ran longer than its timeout of {timeout:g} s; "
                "its poll decides the outcome.",
            )
            return Verdict((unknown,))
        if state.status in _UNRESOLVED:
            return Verdict(action=Poll())
        return Verdict()
    if state is None or state.status is not CallStatus.UNKNOWN or not cmd.policy.has_reconcile:
        return Verdict()
    return Verdict(action=Reconcile(reconcile_attempt=state.reconcile_attempts + 1))


def _approval_invalid(ctx: CallContext, now: datetime, message: str) -> Verdict:
    return Verdict((_rejected(ctx, now, ErrorInfo.of(ErrorCode.APPROVAL_INVALID, message)),))


def _check_approval(
    gate: ApprovalGate, book: ApprovalBook | None, ctx: CallContext, now: datetime, redacted: str
) -> Verdict | ApprovalConsumed:
    """The call may start (the token's consumption) or the refusal that answers it, by the
    key's approval ``book``."""
    book = book or ApprovalBook()
    if gate.token_digest is None:
        latest = book.latest_for(ctx.args_digest)
        if latest is not None and latest.status is ApprovalStatus.DENIED:
            return Verdict(
                (
                    _rejected(
                        ctx,
                        now,
                        ErrorInfo.of(
                            ErrorCode.APPROVAL_INVALID,
                            f"An operator denied this call: {latest.reason or 'no reason given'}",
                            retryable=False,
                            suggested_action="Do not retry: tell the user the action was "
                            "refused by a human.",
                        ),
                    ),
                )
            )
        if (
            latest is not None
            and latest.status is ApprovalStatus.APPROVED
            and max(now, gate.executor_now or now) < latest.expires_at
        ):
            # the grant travels with the call: it sits in this key's book, bound to these
            # arguments' digest, so the same key and arguments go ahead without the token;
            # consumed in the write of the Started event it allows, so it is used once
            return ApprovalConsumed(
                envelope=ctx.envelope(_eid(ctx, "approval-consumed"), now),
                approval_id=latest.approval_id,
            )
        if (
            latest is not None
            and latest.status is ApprovalStatus.PENDING
            and now < latest.expires_at
        ):
            # asked again while it waits: the same request answers
            approval_id, expires_at = latest.approval_id, latest.expires_at
        else:
            approval_id, expires_at = gate.new_approval_id, now + gate.request_ttl
        return Verdict(
            (
                ApprovalRequested(
                    envelope=ctx.envelope(_eid(ctx, "approval-requested"), now),
                    approval_id=approval_id,
                    arguments_redacted_json=redacted,  # same digest: same arguments
                    impact_json=gate.impact_json,
                    expires_at=expires_at,
                ),
            )
        )
    approval = book.by_token(gate.token_digest)
    if approval is None:
        return _approval_invalid(
            ctx, now, "The approval token was not issued for this call (tenant, tool and key)."
        )
    if approval.status is not ApprovalStatus.APPROVED:
        return _approval_invalid(ctx, now, f"The approval token was {approval.status.value}.")
    if approval.args_digest != ctx.args_digest:
        return _approval_invalid(ctx, now, "The approval token was issued for other arguments.")
    if max(now, gate.executor_now or now) >= approval.expires_at:
        return _approval_invalid(
            ctx, now, f"The approval token expired at {approval.expires_at.isoformat()}."
        )
    return ApprovalConsumed(
        envelope=ctx.envelope(_eid(ctx, "approval-consumed"), now),
        approval_id=approval.approval_id,
    )


def _decide_approval(cmd: DecideApproval) -> Verdict:
    decision, env = cmd.decision, cmd.decision.envelope
    ctx, now = CallContext.of(env), env.occurred_at
    approval = cmd.book.get(decision.approval_id) if cmd.book else None
    if approval is None or approval.args_digest != env.args_digest:
        return _approval_invalid(ctx, now, "There is no such approval request for this call.")
    if approval.status is not ApprovalStatus.PENDING:
        # worded as the front doors' own check of the projection says it: when the projection
        # lags a first decision, a second one reaches this check, and the caller reads the same
        return _approval_invalid(
            ctx,
            now,
            f"The approval request is {approval.status.value}: it cannot be decided again.",
        )
    if now >= approval.expires_at:
        return _approval_invalid(
            ctx, now, "The approval request is expired: it cannot be decided again."
        )
    kind = "approval-granted" if isinstance(decision, ApprovalGranted) else "approval-denied"
    return Verdict((decision.model_copy(update={"envelope": ctx.envelope(_eid(ctx, kind), now)}),))


def _change_switch(cmd: ChangeSwitch) -> Verdict:
    env = cmd.change.envelope
    stamped = env.model_copy(update={"event_id": f"{env.intent_id}/switch/{cmd.partition}"})
    return Verdict((cmd.change.model_copy(update={"envelope": stamped}),))


# -- long-running calls: the job's poll, its report, its cancellation ----------------------


def _job_running(state: CallState) -> bool:
    return state.job is not None and state.job.status is JobStatus.RUNNING


def _job_refused(cmd: JobUpdate | RequestCancel, code: ErrorCode, message: str) -> Verdict:
    return Verdict((_rejected(cmd.context, cmd.now, ErrorInfo.of(code, message)),))


def _no_job(state: CallState | None, cmd: JobUpdate | RequestCancel) -> Verdict | None:
    """The refusal when the call has no running job (``None``: it has one)."""
    if state is None or state.job is None:
        return _job_refused(cmd, ErrorCode.JOB_NOT_FOUND, "This call has no job.")
    if not _job_running(state) or state.status not in _UNRESOLVED:
        return _job_refused(
            cmd, ErrorCode.JOB_FINISHED, f"The job has finished ({state.status.value})."
        )
    return None


def _job_update(state: CallState | None, cmd: JobUpdate) -> Verdict:
    """The first word that finishes a job wins: any later poll, report or cancel finds it
    finished (a report or cancel is refused, a poll records nothing)."""
    refused = _no_job(state, cmd)
    if refused is not None:
        return refused if cmd.by_intent else Verdict()
    assert state is not None and state.job is not None
    ctx, now, outcome, job = cmd.context, cmd.now, cmd.outcome, state.job
    if isinstance(outcome, JobRunning):
        if not cmd.by_intent and outcome.progress == job.progress:
            return Verdict()  # a poll that learnt nothing new records nothing
        progressed = job.model_copy(update={"progress": outcome.progress, "updated_at": now})
        n = state.job_updates + 1
        return Verdict(
            (
                ToolCallJobProgressed(
                    envelope=ctx.envelope(_eid(ctx, "job-progress", n), now),
                    job=progressed,
                    source=cmd.source,
                ),
            )
        )
    if state.status is CallStatus.UNKNOWN:  # a job that timed out: resolved by its answer
        n = state.reconcile_attempts + 1
        fields: dict[str, object] = {
            "envelope": ctx.envelope(_eid(ctx, "reconciled", n), now),
            "reconcile_attempt": n,
            "downstream_request_id": job.id,
        }
        if isinstance(outcome, JobSucceeded):
            fields |= {"resolution": Resolution.SUCCEEDED, "result_json": outcome.result_json}
        else:
            fields |= {"resolution": Resolution.FAILED_FINAL, "error": _job_error(outcome)}
        return Verdict((ToolCallReconciled.model_validate(fields),))
    duration_ms = max(0, int((now - job.started_at).total_seconds() * 1000))
    if isinstance(outcome, JobSucceeded):
        return Verdict(
            (
                ToolCallSucceeded(
                    envelope=ctx.envelope(_eid(ctx, "succeeded", state.attempts), now),
                    attempt=state.attempts,
                    result_json=outcome.result_json,
                    downstream_request_id=job.id,
                    duration_ms=duration_ms,
                ),
            )
        )
    error = _job_error(outcome)
    retryable = (
        isinstance(outcome, JobFailed) and error.retryable and state.rounds < cmd.policy.max_rounds
    )
    return Verdict(
        (
            ToolCallFailed(
                envelope=ctx.envelope(_eid(ctx, "failed", state.attempts), now),
                attempt=state.attempts,
                error=error,
                disposition=FailureDisposition.RETRYABLE if retryable else FailureDisposition.FINAL,
                fingerprint=failure_fingerprint(ctx.tool, error),
                duration_ms=duration_ms,
            ),
        )
    )


def _job_error(outcome: JobFailed | JobCancelled) -> ErrorInfo:
    if isinstance(outcome, JobFailed):
        return outcome.error
    return ErrorInfo.of(ErrorCode.CANCELLED, outcome.reason)


def _request_cancel(state: CallState | None, cmd: RequestCancel) -> Verdict:
    refused = _no_job(state, cmd)
    if refused is not None:
        return refused
    if not cmd.can_cancel:
        return _job_refused(
            cmd, ErrorCode.JOB_NOT_CANCELLABLE, "The tool of this job has no cancel."
        )
    return Verdict(action=Cancel())
