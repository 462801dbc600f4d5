"""The pure ledger core as given/when/then tables: the state table of
docs/architecture.md#states-and-the-replay-contract.

Each row: *given* the events already in the log for one call key, *when* a command reaches
``decide``, *then* these events (type, id and key fields), this action, and this status after
folding the new events into the state.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from toolledger.processors.ledger import (
    Action,
    ApprovalGate,
    AttemptFinished,
    AttemptOutcome,
    CallContext,
    CallState,
    Cancel,
    Command,
    Execute,
    Expire,
    Failure,
    Found,
    FoundFailed,
    Gate,
    Inconclusive,
    InvariantViolation,
    JobAccepted,
    JobCancelled,
    JobFailed,
    JobOutcome,
    JobRunning,
    JobSucceeded,
    JobUpdate,
    NotHappened,
    Policy,
    Poll,
    Reconcile,
    ReconcileFinished,
    ReconcileOutcome,
    Recover,
    RequestCancel,
    Submit,
    Success,
    Sweep,
    TimedOut,
    decide,
    evolve,
    expires_at,
    fold,
    fold_all,
)
from toolledger.processors.ledger.decide import expiry_intent_id
from toolledger.processors.ledger.evolve import NOT_HAPPENED_ERROR
from toolledger.processors.ledger.governance import (
    Approval,
    ApprovalBook,
    ApprovalStatus,
    evolve_approvals,
)
from toolledger.schemas.canonical import args_digest, canonical_json
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.events import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Envelope,
    Event,
    FailureDisposition,
    JobInfo,
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
from toolledger.schemas.keys import CallKey
from toolledger.schemas.status import CallStatus

# ------------------------------------------------------------------------------ fixed inputs

T0 = datetime(2025, 3, 1, 9, 0, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=10)  # every command happens after every given event
EPOCH = 7

KEY = CallKey("acme", "flaky_write", "run-1:step-1")
ARGS = {"payload": "hello"}
DIGEST = args_digest(ARGS)
OTHER_DIGEST = args_digest({"payload": "something else"})
REDACTED = canonical_json(ARGS)

BASE = CallContext(
    call_key=str(KEY),
    tenant_id="acme",
    tool="flaky_write",
    tool_version="1",
    idempotency_key="run-1:step-1",
    args_digest=DIGEST,
    intent_id="i1",
    run_id="run-1",
    step_id="step-1",
    principal="agent:planner",
    trace_id="trace-1",
)

RESULT = '{"write_id":"W_1"}'
RECONCILED_RESULT = '{"write_id":"W_found"}'
REFUSED = ErrorInfo.downstream(
    "REFUSED",
    "The downstream refused this write.",
    retryable=False,
    suggested_action="Do not retry this call.",
)
UNAVAILABLE = ErrorInfo.downstream(
    "UNAVAILABLE",
    "The downstream is briefly unavailable.",
    retryable=True,
    suggested_action="Retry with the same key.",
)
INCONCLUSIVE_ERROR = ErrorInfo.of(ErrorCode.OUTCOME_UNKNOWN, "Reconcile was inconclusive: x")

P = Policy(max_attempts=3, max_rounds=3, has_reconcile=True)
P_NO_HOOK = Policy(max_attempts=3, max_rounds=3, has_reconcile=False)
P_ONE_ROUND = Policy(max_attempts=3, max_rounds=1, has_reconcile=True)
P_ONE_SHOT = Policy(max_attempts=1, max_rounds=1, has_reconcile=True)

RETRY, RETRYABLE, FINAL = (
    FailureDisposition.RETRY,
    FailureDisposition.RETRYABLE,
    FailureDisposition.FINAL,
)


def ctx(intent: str = "i1", digest: str = DIGEST) -> CallContext:
    return BASE.model_copy(update={"intent_id": intent, "args_digest": digest})


# ------------------------------------------------------------------- given: event builders
# Builders stamp a placeholder time; ``given`` restamps the history one second apart.


def _env(intent: str, kind: str, n: int) -> Envelope:
    return ctx(intent).envelope(f"{intent}/{kind}/{n}", T0)


def started(attempt: int = 1, round_: int = 1, intent: str = "i1") -> Event:
    return ToolCallStarted(
        envelope=_env(intent, "started", attempt),
        attempt=attempt,
        round=round_,
        executor_epoch=1,
        arguments_redacted_json=REDACTED,
    )


def succeeded(attempt: int = 1, intent: str = "i1") -> Event:
    return ToolCallSucceeded(
        envelope=_env(intent, "succeeded", attempt),
        attempt=attempt,
        result_json=RESULT,
        downstream_request_id="W_1",
        duration_ms=5,
    )


def failed(
    disposition: FailureDisposition,
    attempt: int = 1,
    error: ErrorInfo = UNAVAILABLE,
    intent: str = "i1",
) -> Event:
    return ToolCallFailed(
        envelope=_env(intent, "failed", attempt),
        attempt=attempt,
        error=error,
        disposition=disposition,
        fingerprint="fp:0",
        duration_ms=5,
    )


def unknown(attempt: int = 1, intent: str = "i1") -> Event:
    return ToolCallOutcomeUnknown(
        envelope=_env(intent, "unknown", attempt), attempt=attempt, reason="no answer"
    )


def reconciled(resolution: Resolution, n: int = 1, intent: str = "i1") -> Event:
    error = {
        Resolution.SUCCEEDED: None,
        Resolution.FAILED_FINAL: REFUSED,
        Resolution.NOT_HAPPENED: NOT_HAPPENED_ERROR,
        Resolution.INCONCLUSIVE: INCONCLUSIVE_ERROR,
    }[resolution]
    result = RECONCILED_RESULT if resolution is Resolution.SUCCEEDED else None
    return ToolCallReconciled(
        envelope=_env(intent, "reconciled", n),
        resolution=resolution,
        reconcile_attempt=n,
        result_json=result,
        error=error,
    )


def failed_round(
    round_: int, first_attempt: int, attempts: int, last: FailureDisposition, intent: str
) -> list[Event]:
    """A whole round of retryable failures, the last one with disposition ``last``."""
    out: list[Event] = []
    for k in range(attempts):
        attempt = first_attempt + k
        out.append(started(attempt, round_, intent))
        out.append(failed(RETRY if k < attempts - 1 else last, attempt, intent=intent))
    return out


def given(*events: Event) -> tuple[Event, ...]:
    return tuple(
        e.model_copy(
            update={
                "envelope": e.envelope.model_copy(update={"occurred_at": T0 + timedelta(seconds=i)})
            }
        )
        for i, e in enumerate(events)
    )


NONE: tuple[Event, ...] = ()
PENDING = given(started())
PENDING_ATTEMPT_2 = given(started(), failed(RETRY), started(2))
SUCCEEDED = given(started(), succeeded())
FAILED_FINAL = given(started(), failed(FINAL, error=REFUSED))
FAILED_RETRYABLE = given(*failed_round(1, 1, 3, RETRYABLE, "i1"))
UNKNOWN = given(started(), unknown())
UNKNOWN_AFTER_INCONCLUSIVE = given(started(), unknown(), reconciled(Resolution.INCONCLUSIVE))
# round 2 running its second attempt (intent i2 started round 2 after FAILED_RETRYABLE)
ROUND_2_ATTEMPT_5 = given(
    *failed_round(1, 1, 3, RETRYABLE, "i1"),
    started(4, 2, "i2"),
    failed(RETRY, 4, intent="i2"),
    started(5, 2, "i2"),
)
# the third (last) round at its third (last) attempt
LAST_ATTEMPT = given(
    *failed_round(1, 1, 3, RETRYABLE, "i1"),
    *failed_round(2, 4, 3, RETRYABLE, "i2"),
    *failed_round(3, 7, 3, RETRY, "i3")[:-1],
)
# FAILED_RETRYABLE already at the round cap: the last round timed out, the sweeper's reconcile
# found nothing, so the call is FAILED_RETRYABLE with rounds == max_rounds.
RETRYABLE_AT_CAP = given(
    *failed_round(1, 1, 3, RETRYABLE, "i1"),
    *failed_round(2, 4, 3, RETRYABLE, "i2"),
    started(7, 3, "i3"),
    unknown(7, "i3"),
    reconciled(Resolution.NOT_HAPPENED, 1, "i3"),
)
SWEPT_NOT_HAPPENED = given(started(), unknown(), reconciled(Resolution.NOT_HAPPENED))


def test_given_histories_fold_to_the_intended_states() -> None:
    expected = {
        PENDING: (CallStatus.PENDING, 1, 1, 1),
        PENDING_ATTEMPT_2: (CallStatus.PENDING, 2, 1, 2),
        SUCCEEDED: (CallStatus.SUCCEEDED, 1, 1, 1),
        FAILED_FINAL: (CallStatus.FAILED_FINAL, 1, 1, 1),
        FAILED_RETRYABLE: (CallStatus.FAILED_RETRYABLE, 3, 1, 3),
        UNKNOWN: (CallStatus.UNKNOWN, 1, 1, 1),
        ROUND_2_ATTEMPT_5: (CallStatus.PENDING, 5, 2, 2),
        LAST_ATTEMPT: (CallStatus.PENDING, 9, 3, 3),
        RETRYABLE_AT_CAP: (CallStatus.FAILED_RETRYABLE, 7, 3, 1),
    }
    for history, (status, attempts, rounds, round_attempts) in expected.items():
        state = fold(history)
        assert state is not None
        assert (state.status, state.attempts, state.rounds, state.round_attempts) == (
            status,
            attempts,
            rounds,
            round_attempts,
        )
    assert fold(NONE) is None


# ------------------------------------------------------------------------- when: commands


def submit(
    intent: str = "i2",
    digest: str = DIGEST,
    policy: Policy = P,
    approvals: ApprovalBook | None = None,
    gate: Gate | None = None,
) -> Submit:
    return Submit(
        context=ctx(intent, digest),
        arguments_redacted_json=REDACTED,
        policy=policy,
        now=NOW,
        epoch=EPOCH,
        gate=gate or Gate(),
        approvals=approvals,
    )


def finished(
    outcome: AttemptOutcome, attempt: int = 1, intent: str = "i1", policy: Policy = P
) -> AttemptFinished:
    return AttemptFinished(
        context=ctx(intent),
        attempt=attempt,
        outcome=outcome,
        duration_ms=42,
        arguments_redacted_json=REDACTED,
        policy=policy,
        now=NOW,
        epoch=EPOCH,
    )


def reconcile_done(
    outcome: ReconcileOutcome, *, by_intent: bool, policy: Policy = P, intent: str | None = None
) -> ReconcileFinished:
    # a caller's retry reconciles under its own intent; the sweeper under the state's context
    intent = intent or ("i2" if by_intent else "i1")
    return ReconcileFinished(
        context=ctx(intent),
        outcome=outcome,
        by_intent=by_intent,
        arguments_redacted_json=REDACTED,
        policy=policy,
        now=NOW,
        epoch=EPOCH,
    )


RECOVER = Recover(now=NOW)

P_JOB = Policy(long_running=True, job_timeout_s=3600)
P_JOB_SHORT = Policy(long_running=True, job_timeout_s=1)


def job_started(intent: str = "i1") -> Event:
    job = JobInfo(id="job_1", started_at=T0, updated_at=T0)
    return ToolCallJobStarted(
        envelope=_env(intent, "job-started", 1), attempt=1, job=job, duration_ms=1
    )


def job_update(
    outcome: JobOutcome, intent: str = "i2", *, by_intent: bool = True, source: str = "report"
) -> JobUpdate:
    return JobUpdate(
        context=ctx(intent),
        outcome=outcome,
        source=source,
        by_intent=by_intent,
        policy=P_JOB,
        now=NOW,
    )


JOB_RUNNING = given(started(), job_started())
JOB_TIMED_OUT = given(started(), job_started(), unknown())
JOB_DONE = given(started(), job_started(), succeeded())


def sweep(policy: Policy = P) -> Sweep:
    return Sweep(policy=policy, now=NOW)


# ------------------------------------------------------------------------- then: expectations


@dataclass(frozen=True)
class Ev:
    """An expected event: its type, optionally its exact id, and key fields.

    ``code`` and ``retryable`` in ``fields`` mean ``error.code`` and ``error.retryable``.
    """

    type: type[Event]
    event_id: str | None = None
    fields: Mapping[str, object] = field(default_factory=dict)


def ev(type_: type[Event], event_id: str | None = None, **fields: object) -> Ev:
    return Ev(type_, event_id, fields)


@dataclass(frozen=True)
class Row:
    name: str
    given: tuple[Event, ...]
    when: Command
    then: Sequence[Ev]
    action: Action | None
    status: CallStatus | None


def _rejected(code: ErrorCode, intent: str = "i2") -> Ev:
    # an in-progress duplicate may retry later; a reused key never succeeds by retrying
    return ev(
        ToolCallRejected,
        f"{intent}/rejected/1",
        code=code.value,
        retryable=code is ErrorCode.IDEMPOTENCY_KEY_IN_USE,
    )


def _reused_rows() -> list[Row]:
    histories: list[tuple[str, tuple[Event, ...], Policy, CallStatus]] = [
        ("pending", PENDING, P, CallStatus.PENDING),
        ("succeeded", SUCCEEDED, P, CallStatus.SUCCEEDED),
        ("failed-retryable", FAILED_RETRYABLE, P, CallStatus.FAILED_RETRYABLE),
        ("failed-retryable-at-cap", RETRYABLE_AT_CAP, P, CallStatus.FAILED_RETRYABLE),
        ("failed-final", FAILED_FINAL, P, CallStatus.FAILED_FINAL),
        ("unknown-with-hook", UNKNOWN, P, CallStatus.UNKNOWN),
        ("unknown-without-hook", UNKNOWN, P_NO_HOOK, CallStatus.UNKNOWN),
    ]
    return [
        Row(
            f"submit-other-args/{name}",
            history,
            submit(digest=OTHER_DIGEST, policy=policy),
            [_rejected(ErrorCode.IDEMPOTENCY_KEY_REUSED)],
            None,
            status,
        )
        for name, history, policy, status in histories
    ]


def _untouched_rows(
    command_name: str, command: Command, skip: frozenset[CallStatus] = frozenset()
) -> list[Row]:
    histories: list[tuple[str, tuple[Event, ...], CallStatus | None]] = [
        ("none", NONE, None),
        ("succeeded", SUCCEEDED, CallStatus.SUCCEEDED),
        ("failed-retryable", FAILED_RETRYABLE, CallStatus.FAILED_RETRYABLE),
        ("failed-final", FAILED_FINAL, CallStatus.FAILED_FINAL),
        ("unknown", UNKNOWN, CallStatus.UNKNOWN),
        ("pending", PENDING, CallStatus.PENDING),
    ]
    return [
        Row(f"{command_name}/{name}", history, command, [], None, status)
        for name, history, status in histories
        if status not in skip
    ]


ROWS: list[Row] = [
    # ---- Submit ------------------------------------------------------------------------
    Row(
        "submit/first-execution",
        NONE,
        submit("i1"),
        [
            ev(
                ToolCallStarted,
                "i1/started/1",
                attempt=1,
                round=1,
                executor_epoch=EPOCH,
                arguments_redacted_json=REDACTED,
            )
        ],
        Execute(attempt=1, round_attempt=1),
        CallStatus.PENDING,
    ),
    Row(
        "submit/replay-succeeded",
        SUCCEEDED,
        submit(),
        [
            ev(
                ToolCallReplayed,
                "i2/replayed/1",
                status=CallStatus.SUCCEEDED,
                original_intent_id="i1",
                attempts=1,
                result_json=RESULT,
                error=None,
            )
        ],
        None,
        CallStatus.SUCCEEDED,
    ),
    Row(
        "submit/replay-succeeded-by-reconcile",
        given(*UNKNOWN, reconciled(Resolution.SUCCEEDED)),
        submit(),
        [
            ev(
                ToolCallReplayed,
                "i2/replayed/1",
                status=CallStatus.SUCCEEDED,
                original_intent_id="i1",
                result_json=RECONCILED_RESULT,
                error=None,
            )
        ],
        None,
        CallStatus.SUCCEEDED,
    ),
    Row(
        "submit/replay-failed-final",
        FAILED_FINAL,
        submit(),
        [
            ev(
                ToolCallReplayed,
                "i2/replayed/1",
                status=CallStatus.FAILED_FINAL,
                original_intent_id="i1",
                attempts=1,
                result_json=None,
                error=REFUSED,
            )
        ],
        None,
        CallStatus.FAILED_FINAL,
    ),
    Row(
        "submit/replay-failed-final-of-a-later-round",
        given(*FAILED_RETRYABLE, started(4, 2, "i2"), failed(FINAL, 4, REFUSED, "i2")),
        submit("i3"),
        [
            ev(
                ToolCallReplayed,
                "i3/replayed/1",
                status=CallStatus.FAILED_FINAL,
                original_intent_id="i2",
                attempts=4,
                error=REFUSED,
            )
        ],
        None,
        CallStatus.FAILED_FINAL,
    ),
    Row(
        "submit/pending-duplicate",
        PENDING,
        submit(),
        [_rejected(ErrorCode.IDEMPOTENCY_KEY_IN_USE)],
        None,
        CallStatus.PENDING,
    ),
    *_reused_rows(),
    Row(
        "submit/failed-retryable-new-round",
        FAILED_RETRYABLE,
        submit(),
        [ev(ToolCallStarted, "i2/started/4", attempt=4, round=2, executor_epoch=EPOCH)],
        Execute(attempt=4, round_attempt=1),
        CallStatus.PENDING,
    ),
    Row(
        "submit/failed-retryable-after-sweep-not-happened",
        SWEPT_NOT_HAPPENED,
        submit(),
        [ev(ToolCallStarted, "i2/started/2", attempt=2, round=2)],
        Execute(attempt=2, round_attempt=1),
        CallStatus.PENDING,
    ),
    Row(
        "submit/failed-retryable-at-round-cap",
        RETRYABLE_AT_CAP,
        submit("i4"),
        [ev(ToolCallFailed, disposition=FINAL, code=ErrorCode.RETRY_LIMIT_EXCEEDED.value)],
        None,
        CallStatus.FAILED_FINAL,
    ),
    Row(
        "submit/failed-retryable-policy-cap-1-round",
        FAILED_RETRYABLE,
        submit(policy=P_ONE_ROUND),
        [ev(ToolCallFailed, disposition=FINAL, code=ErrorCode.RETRY_LIMIT_EXCEEDED.value)],
        None,
        CallStatus.FAILED_FINAL,
    ),
    Row(
        "submit/unknown-with-hook-reconciles-first",
        UNKNOWN,
        submit(),
        [],
        Reconcile(reconcile_attempt=1),
        CallStatus.UNKNOWN,
    ),
    Row(
        "submit/unknown-after-inconclusive-reconciles-again",
        UNKNOWN_AFTER_INCONCLUSIVE,
        submit(),
        [],
        Reconcile(reconcile_attempt=2),
        CallStatus.UNKNOWN,
    ),
    Row(
        "submit/unknown-without-hook",
        UNKNOWN,
        submit(policy=P_NO_HOOK),
        [
            ev(
                ToolCallReplayed,
                "i2/replayed/1",
                status=CallStatus.UNKNOWN,
                original_intent_id="i1",
                result_json=None,
                code=ErrorCode.OUTCOME_UNKNOWN.value,
                retryable=False,
            )
        ],
        None,
        CallStatus.UNKNOWN,
    ),
    # ---- AttemptFinished ---------------------------------------------------------------
    Row(
        "finished/success",
        PENDING,
        finished(Success(RESULT, "W_1")),
        [
            ev(
                ToolCallSucceeded,
                "i1/succeeded/1",
                attempt=1,
                result_json=RESULT,
                downstream_request_id="W_1",
                duration_ms=42,
            )
        ],
        None,
        CallStatus.SUCCEEDED,
    ),
    Row(
        "finished/retryable-failure-retries-in-round",
        PENDING,
        finished(Failure(UNAVAILABLE)),
        [
            ev(ToolCallFailed, "i1/failed/1", attempt=1, disposition=RETRY, code=UNAVAILABLE.code),
            ev(ToolCallStarted, "i1/started/2", attempt=2, round=1, executor_epoch=EPOCH),
        ],
        Execute(attempt=2, round_attempt=2),
        CallStatus.PENDING,
    ),
    Row(
        "finished/retryable-failure-second-attempt",
        PENDING_ATTEMPT_2,
        finished(Failure(UNAVAILABLE), attempt=2),
        [
            ev(ToolCallFailed, "i1/failed/2", disposition=RETRY),
            ev(ToolCallStarted, "i1/started/3", attempt=3, round=1),
        ],
        Execute(attempt=3, round_attempt=3),
        CallStatus.PENDING,
    ),
    Row(
        "finished/retryable-failure-in-round-2",
        ROUND_2_ATTEMPT_5,
        finished(Failure(UNAVAILABLE), attempt=5, intent="i2"),
        [
            ev(ToolCallFailed, "i2/failed/5", disposition=RETRY),
            ev(ToolCallStarted, "i2/started/6", attempt=6, round=2),
        ],
        Execute(attempt=6, round_attempt=3),
        CallStatus.PENDING,
    ),
    Row(
        "finished/round-exhausted",
        given(*failed_round(1, 1, 3, RETRY, "i1")[:-1]),
        finished(Failure(UNAVAILABLE), attempt=3),
        [
            ev(
                ToolCallFailed,
                "i1/failed/3",
                attempt=3,
                disposition=RETRYABLE,
                code=UNAVAILABLE.code,
            )
        ],
        None,
        CallStatus.FAILED_RETRYABLE,
    ),
    Row(
        "finished/rounds-exhausted-on-last-attempt",
        LAST_ATTEMPT,
        finished(Failure(UNAVAILABLE), attempt=9, intent="i3"),
        [
            ev(
                ToolCallFailed,
                "i3/failed/9",
                attempt=9,
                disposition=FINAL,
                code=ErrorCode.RETRY_LIMIT_EXCEEDED.value,
                retryable=False,
            )
        ],
        None,
        CallStatus.FAILED_FINAL,
    ),
    Row(
        "finished/one-shot-policy-retry-limit",
        PENDING,
        finished(Failure(UNAVAILABLE), policy=P_ONE_SHOT),
        [
            ev(
                ToolCallFailed,
                "i1/failed/1",
                disposition=FINAL,
                code=ErrorCode.RETRY_LIMIT_EXCEEDED.value,
            )
        ],
        None,
        CallStatus.FAILED_FINAL,
    ),
    Row(
        "finished/non-retryable-failure-is-final",
        PENDING,
        finished(Failure(REFUSED)),
        [
            ev(
                ToolCallFailed,
                "i1/failed/1",
                attempt=1,
                disposition=FINAL,
                code=REFUSED.code,
                error=REFUSED,
            )
        ],
        None,
        CallStatus.FAILED_FINAL,
    ),
    Row(
        "finished/timeout-is-unknown",
        PENDING,
        finished(TimedOut("no answer in 5 s")),
        [ev(ToolCallOutcomeUnknown, "i1/unknown/1", attempt=1, reason="no answer in 5 s")],
        None,
        CallStatus.UNKNOWN,
    ),
    # ---- ReconcileFinished -------------------------------------------------------------
    *[
        Row(
            f"reconciled/found/{'intent' if by else 'sweep'}",
            UNKNOWN,
            reconcile_done(Found(RECONCILED_RESULT, "W_9"), by_intent=by),
            [
                ev(
                    ToolCallReconciled,
                    f"{'i2' if by else 'i1'}/reconciled/1",
                    resolution=Resolution.SUCCEEDED,
                    reconcile_attempt=1,
                    result_json=RECONCILED_RESULT,
                    downstream_request_id="W_9",
                )
            ],
            None,
            CallStatus.SUCCEEDED,
        )
        for by in (True, False)
    ],
    *[
        Row(
            f"reconciled/found-failed/{'intent' if by else 'sweep'}",
            UNKNOWN,
            reconcile_done(FoundFailed(REFUSED), by_intent=by),
            [ev(ToolCallReconciled, resolution=Resolution.FAILED_FINAL, error=REFUSED)],
            None,
            CallStatus.FAILED_FINAL,
        )
        for by in (True, False)
    ],
    *[
        Row(
            f"reconciled/inconclusive/{'intent' if by else 'sweep'}",
            UNKNOWN,
            reconcile_done(Inconclusive("timeout"), by_intent=by),
            [
                ev(
                    ToolCallReconciled,
                    resolution=Resolution.INCONCLUSIVE,
                    code=ErrorCode.OUTCOME_UNKNOWN.value,
                )
            ],
            None,
            CallStatus.UNKNOWN,
        )
        for by in (True, False)
    ],
    Row(
        "reconciled/second-attempt-numbering",
        UNKNOWN_AFTER_INCONCLUSIVE,
        reconcile_done(Inconclusive("again"), by_intent=False),
        [ev(ToolCallReconciled, "i1/reconciled/2", reconcile_attempt=2)],
        None,
        CallStatus.UNKNOWN,
    ),
    Row(
        "reconciled/not-happened/intent-executes-new-round",
        UNKNOWN,
        reconcile_done(NotHappened(), by_intent=True),
        [
            ev(ToolCallReconciled, "i2/reconciled/1", resolution=Resolution.NOT_HAPPENED),
            ev(ToolCallStarted, "i2/started/2", attempt=2, round=2, executor_epoch=EPOCH),
        ],
        Execute(attempt=2, round_attempt=1),
        CallStatus.PENDING,
    ),
    Row(
        "reconciled/not-happened/sweep-leaves-failed-retryable",
        UNKNOWN,
        reconcile_done(NotHappened(), by_intent=False),
        [ev(ToolCallReconciled, "i1/reconciled/1", resolution=Resolution.NOT_HAPPENED)],
        None,
        CallStatus.FAILED_RETRYABLE,
    ),
    Row(
        "reconciled/not-happened/intent-at-round-cap",
        UNKNOWN,
        reconcile_done(NotHappened(), by_intent=True, policy=P_ONE_ROUND),
        [
            ev(ToolCallReconciled, "i2/reconciled/1", resolution=Resolution.NOT_HAPPENED),
            ev(ToolCallFailed, disposition=FINAL, code=ErrorCode.RETRY_LIMIT_EXCEEDED.value),
        ],
        None,
        CallStatus.FAILED_FINAL,
    ),
    # ---- Recover -----------------------------------------------------------------------
    Row(
        "recover/pending-becomes-unknown",
        PENDING,
        RECOVER,
        [ev(ToolCallOutcomeUnknown, "i1/unknown/1", attempt=1)],
        None,
        CallStatus.UNKNOWN,
    ),
    Row(
        "recover/pending-at-attempt-2",
        PENDING_ATTEMPT_2,
        RECOVER,
        [ev(ToolCallOutcomeUnknown, "i1/unknown/2", attempt=2)],
        None,
        CallStatus.UNKNOWN,
    ),
    Row(
        "recover/pending-round-2-uses-latest-intent",
        ROUND_2_ATTEMPT_5,
        RECOVER,
        [ev(ToolCallOutcomeUnknown, "i2/unknown/5", attempt=5)],
        None,
        CallStatus.UNKNOWN,
    ),
    *_untouched_rows("recover", RECOVER, skip=frozenset({CallStatus.PENDING})),
    # ---- Sweep -------------------------------------------------------------------------
    Row(
        "sweep/unknown-with-hook",
        UNKNOWN,
        sweep(),
        [],
        Reconcile(reconcile_attempt=1),
        CallStatus.UNKNOWN,
    ),
    Row(
        "sweep/unknown-after-inconclusive",
        UNKNOWN_AFTER_INCONCLUSIVE,
        sweep(),
        [],
        Reconcile(reconcile_attempt=2),
        CallStatus.UNKNOWN,
    ),
    Row("sweep/unknown-without-hook", UNKNOWN, sweep(P_NO_HOOK), [], None, CallStatus.UNKNOWN),
    *_untouched_rows("sweep", sweep(), skip=frozenset({CallStatus.UNKNOWN})),
    # ---- long-running calls: the job ---------------------------------------------------
    Row(
        "job/handler-returned-a-job-reference",
        given(started()),
        finished(JobAccepted("job_1", 0.1), policy=P_JOB),
        [ev(ToolCallJobStarted, "i1/job-started/1", attempt=1)],
        None,
        CallStatus.PENDING,
    ),
    Row(
        "job/retry-answers-the-same-job",
        JOB_RUNNING,
        submit(policy=P_JOB),
        [
            ev(
                ToolCallJobReplayed,
                "i2/job-replayed/1",
                status=CallStatus.PENDING,
                original_intent_id="i1",
            )
        ],
        None,
        CallStatus.PENDING,
    ),
    Row("job/sweep-polls-a-running-job", JOB_RUNNING, sweep(P_JOB), [], Poll(), CallStatus.PENDING),
    Row(
        "job/sweep-times-a-job-out",
        JOB_RUNNING,
        sweep(P_JOB_SHORT),
        [ev(ToolCallOutcomeUnknown, "i1/unknown/1", attempt=1)],
        None,
        CallStatus.UNKNOWN,
    ),
    Row(
        "job/sweep-polls-a-timed-out-job",
        JOB_TIMED_OUT,
        sweep(P_JOB_SHORT),
        [],
        Poll(),
        CallStatus.UNKNOWN,
    ),
    Row(
        "job/retry-of-a-timed-out-job-never-restarts",
        JOB_TIMED_OUT,
        submit(policy=P_JOB),
        [ev(ToolCallJobReplayed, "i2/job-replayed/1", status=CallStatus.UNKNOWN)],
        None,
        CallStatus.UNKNOWN,
    ),
    Row("job/recover-keeps-a-running-job", JOB_RUNNING, RECOVER, [], None, CallStatus.PENDING),
    Row(
        "job/poll-succeeded",
        JOB_RUNNING,
        job_update(JobSucceeded(RESULT), "i1", by_intent=False),
        [
            ev(
                ToolCallSucceeded,
                "i1/succeeded/1",
                result_json=RESULT,
                downstream_request_id="job_1",
            )
        ],
        None,
        CallStatus.SUCCEEDED,
    ),
    Row(
        "job/poll-unchanged-records-nothing",
        JOB_RUNNING,
        job_update(JobRunning(None), "i1", by_intent=False),
        [],
        None,
        CallStatus.PENDING,
    ),
    Row(
        "job/report-progress",
        JOB_RUNNING,
        job_update(JobRunning(0.4)),
        [ev(ToolCallJobProgressed, "i2/job-progress/1", source="report")],
        None,
        CallStatus.PENDING,
    ),
    Row(
        "job/report-failed",
        JOB_RUNNING,
        job_update(JobFailed(REFUSED)),
        [ev(ToolCallFailed, "i2/failed/1", disposition=FINAL, code=REFUSED.code)],
        None,
        CallStatus.FAILED_FINAL,
    ),
    Row(
        "job/report-after-the-poll-won-is-refused",
        JOB_DONE,
        job_update(JobSucceeded(RESULT)),
        [_rejected(ErrorCode.JOB_FINISHED)],
        None,
        CallStatus.SUCCEEDED,
    ),
    Row(
        "job/poll-after-the-report-won-records-nothing",
        JOB_DONE,
        job_update(JobSucceeded(RESULT), "i1", by_intent=False),
        [],
        None,
        CallStatus.SUCCEEDED,
    ),
    Row(
        "job/report-for-a-call-without-job",
        SUCCEEDED,
        job_update(JobRunning(0.5)),
        [_rejected(ErrorCode.JOB_NOT_FOUND)],
        None,
        CallStatus.SUCCEEDED,
    ),
    Row(
        "job/poll-resolves-a-timed-out-job",
        JOB_TIMED_OUT,
        job_update(JobSucceeded(RESULT), "i1", by_intent=False),
        [
            ev(
                ToolCallReconciled,
                "i1/reconciled/1",
                resolution=Resolution.SUCCEEDED,
                result_json=RESULT,
            )
        ],
        None,
        CallStatus.SUCCEEDED,
    ),
    Row(
        "job/cancel-without-a-cancel-hook",
        JOB_RUNNING,
        RequestCancel(context=ctx("i2"), can_cancel=False, now=NOW),
        [_rejected(ErrorCode.JOB_NOT_CANCELLABLE)],
        None,
        CallStatus.PENDING,
    ),
    Row(
        "job/cancel-calls-the-hook",
        JOB_RUNNING,
        RequestCancel(context=ctx("i2"), can_cancel=True, now=NOW),
        [],
        Cancel(),
        CallStatus.PENDING,
    ),
    Row(
        "job/cancel-of-a-finished-job",
        JOB_DONE,
        RequestCancel(context=ctx("i2"), can_cancel=True, now=NOW),
        [_rejected(ErrorCode.JOB_FINISHED)],
        None,
        CallStatus.SUCCEEDED,
    ),
    Row(
        "job/cancelled",
        JOB_RUNNING,
        job_update(JobCancelled(), source="cancel"),
        [ev(ToolCallFailed, "i2/failed/1", disposition=FINAL, code="CANCELLED")],
        None,
        CallStatus.FAILED_FINAL,
    ),
]


def _check_event(actual: Event, expected: Ev) -> None:
    assert type(actual) is expected.type
    if expected.event_id is not None:
        assert actual.event_id == expected.event_id
    for name, value in expected.fields.items():
        if name in ("code", "retryable"):
            error = getattr(actual, "error", None)
            assert error is not None, f"{expected.type.__name__} has no error"
            assert getattr(error, name) == value, name
        else:
            assert getattr(actual, name) == value, name


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_state_table(row: Row) -> None:
    state = fold(row.given)
    decision = decide(state, row.when)

    assert [type(e).__name__ for e in decision.events] == [e.type.__name__ for e in row.then]
    for actual, expected in zip(decision.events, row.then, strict=True):
        _check_event(actual, expected)
        assert actual.envelope.occurred_at == NOW  # the command's time, never a clock
        assert actual.call_key == str(KEY)
    assert decision.action == row.action

    after = fold(decision.events, state)
    assert (after.status if after is not None else None) == row.status


def _intent_of(row: Row, state: CallState | None) -> str:
    if isinstance(row.when, Recover | Sweep):
        assert state is not None
        return state.context.intent_id
    assert isinstance(
        row.when, Submit | AttemptFinished | ReconcileFinished | JobUpdate | RequestCancel
    )
    return row.when.context.intent_id


EVENT_ID = re.compile(
    r"^(?P<intent>[^/]+)/(?P<kind>started|succeeded|failed|unknown|reconciled"
    r"|replayed|rejected|job-started|job-replayed|job-progress)/(?P<n>[1-9][0-9]*)$"
)
KIND_OF = {
    ToolCallStarted: "started",
    ToolCallSucceeded: "succeeded",
    ToolCallFailed: "failed",
    ToolCallOutcomeUnknown: "unknown",
    ToolCallReconciled: "reconciled",
    ToolCallReplayed: "replayed",
    ToolCallRejected: "rejected",
    ToolCallJobStarted: "job-started",
    ToolCallJobReplayed: "job-replayed",
    ToolCallJobProgressed: "job-progress",
}


@pytest.mark.parametrize("row", [r for r in ROWS if r.then], ids=lambda row: row.name)
def test_event_ids_are_intent_kind_n_and_new(row: Row) -> None:
    state = fold(row.given)
    decision = decide(state, row.when)
    intent = _intent_of(row, state)
    seen = {e.event_id for e in row.given}
    for event in decision.events:
        match = EVENT_ID.match(event.event_id)
        assert match is not None, event.event_id
        assert match["intent"] == intent == event.intent_id
        assert match["kind"] == KIND_OF[type(event)]
        n = int(match["n"])
        if isinstance(event, ToolCallStarted | ToolCallSucceeded | ToolCallOutcomeUnknown):
            assert n == event.attempt
        elif isinstance(event, ToolCallReconciled):
            assert n == event.reconcile_attempt
        elif isinstance(event, ToolCallReplayed | ToolCallRejected):
            assert n == 1
        assert event.event_id not in seen, "an event id was reused"
        seen.add(event.event_id)


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_deciding_twice_is_byte_identical(row: Row) -> None:
    first = decide(fold(row.given), row.when)
    second = decide(fold(row.given), row.when)
    assert [e.model_dump_json() for e in first.events] == [
        e.model_dump_json() for e in second.events
    ]
    assert first.action == second.action
    assert first == second


ANSWERS_ONLY = (ToolCallReplayed, ToolCallRejected, ToolCallJobReplayed)  # no state change


@pytest.mark.parametrize(
    "row",
    [r for r in ROWS if r.then and all(e.type in ANSWERS_ONLY for e in r.then)],
    ids=lambda row: row.name,
)
def test_replayed_and_rejected_leave_the_state_unchanged(row: Row) -> None:
    state = fold(row.given)
    assert state is not None
    decision = decide(state, row.when)
    for event in decision.events:
        assert event.envelope.occurred_at > state.updated_at
        after = evolve(state, event)
        assert after is state
        assert after.updated_at == state.updated_at
        assert after.last_event_id == state.last_event_id


@pytest.mark.parametrize(
    "row",
    [r for r in ROWS if r.then and not all(e.type in ANSWERS_ONLY for e in r.then)],
    ids=lambda row: row.name,
)
def test_state_changes_stamp_the_command_time(row: Row) -> None:
    state = fold(row.given)
    decision = decide(state, row.when)
    after = fold(decision.events, state)
    assert after is not None
    assert after.updated_at == NOW
    assert after.last_event_id == decision.events[-1].event_id
    assert after.first_intent_id == (state.first_intent_id if state else "i1")
    assert after.args_digest == DIGEST


@pytest.mark.parametrize("row", [r for r in ROWS if not r.then], ids=lambda row: row.name)
def test_commands_without_events_change_nothing(row: Row) -> None:
    state = fold(row.given)
    decision = decide(state, row.when)
    assert decision.events == ()
    assert fold(decision.events, state) is state


# ----------------------------------------------------------------- impossible commands

IMPOSSIBLE: list[tuple[str, tuple[Event, ...], Command]] = [
    ("finished/no-state", NONE, finished(Success(RESULT))),
    ("finished/succeeded", SUCCEEDED, finished(Success(RESULT))),
    ("finished/failed-final", FAILED_FINAL, finished(Success(RESULT))),
    ("finished/failed-retryable", FAILED_RETRYABLE, finished(Success(RESULT), attempt=3)),
    ("finished/unknown", UNKNOWN, finished(TimedOut("late"))),
    ("finished/wrong-attempt-ahead", PENDING, finished(Success(RESULT), attempt=2)),
    ("finished/wrong-attempt-behind", PENDING_ATTEMPT_2, finished(Failure(UNAVAILABLE), attempt=1)),
    ("reconciled/no-state", NONE, reconcile_done(NotHappened(), by_intent=True)),
    ("reconciled/pending", PENDING, reconcile_done(NotHappened(), by_intent=True)),
    ("reconciled/succeeded", SUCCEEDED, reconcile_done(Found(RESULT), by_intent=False)),
    ("reconciled/failed-final", FAILED_FINAL, reconcile_done(NotHappened(), by_intent=True)),
    (
        "reconciled/failed-retryable",
        FAILED_RETRYABLE,
        reconcile_done(NotHappened(), by_intent=True),
    ),
]


@pytest.mark.parametrize(
    ("given_events", "command"),
    [(g, c) for _, g, c in IMPOSSIBLE],
    ids=[name for name, _, _ in IMPOSSIBLE],
)
def test_impossible_commands_raise_invariant_violation(
    given_events: tuple[Event, ...], command: Command
) -> None:
    with pytest.raises(InvariantViolation):
        decide(fold(given_events), command)


# ----------------------------------------------------------------- whole journeys


def test_journey_timeout_then_retry_reconciles_and_never_reruns_blind() -> None:
    state = fold(given(started(), unknown()))
    # the caller retries: reconcile first, no events, no execution
    decision = decide(state, submit("i2"))
    assert decision == decide(state, submit("i2"))
    assert decision.events == () and decision.action == Reconcile(1)
    # the downstream has the effect: SUCCEEDED with the downstream's result
    decision = decide(state, reconcile_done(Found(RECONCILED_RESULT), by_intent=True))
    state = fold(decision.events, state)
    assert state is not None and state.status is CallStatus.SUCCEEDED
    assert decision.action is None
    # a third call is a replay of the reconciled result
    decision = decide(state, submit("i3"))
    assert isinstance(replay := decision.events[0], ToolCallReplayed)
    assert replay.result_json == RECONCILED_RESULT and decision.action is None


def test_journey_transient_failure_then_success() -> None:
    decision = decide(None, submit("i1"))
    state = fold(decision.events)
    assert decision.action == Execute(1, 1)
    decision = decide(state, finished(Failure(UNAVAILABLE), attempt=1))
    state = fold(decision.events, state)
    assert decision.action == Execute(2, 2)
    decision = decide(state, finished(Success(RESULT), attempt=2))
    state = fold(decision.events, state)
    assert state is not None
    assert (state.status, state.attempts, state.rounds, state.result_json, state.error) == (
        CallStatus.SUCCEEDED,
        2,
        1,
        RESULT,
        None,
    )
    assert state.created_at == NOW == state.updated_at


# ------------------------------------------------------------------------ key retention
# Histories end about a second after T0; every command is at NOW = T0 + 600 s, so a retention
# of 599 s has passed exactly at NOW (the last event is at T0 + 1 s) and one of 600 s has not.


def keep(seconds: int | None, base: Policy = P) -> Policy:
    return Policy(base.max_attempts, base.max_rounds, base.has_reconcile, seconds)


SUCCEEDED_AT = T0 + timedelta(seconds=1)


def expired(intent: str, status: CallStatus, retention: int) -> Ev:
    return ev(
        ToolCallKeyExpired,
        f"{intent}/expired/1",
        status=status,
        last_event_at=SUCCEEDED_AT,
        retention_s=retention,
    )


def expire(policy: Policy, approvals: ApprovalBook | None = None) -> Expire:
    return Expire(policy=policy, now=NOW, approvals=approvals)


OPEN_BOOK = ApprovalBook(
    items=(
        Approval(
            approval_id="apr_1",
            args_digest=DIGEST,
            status=ApprovalStatus.PENDING,
            expires_at=NOW + timedelta(hours=1),
        ),
    )
)
DECIDED_BOOK = ApprovalBook(
    items=(
        Approval(
            approval_id="apr_1",
            args_digest=DIGEST,
            status=ApprovalStatus.DENIED,
            expires_at=NOW + timedelta(hours=1),
        ),
    )
)
SWEEP_ID = expiry_intent_id(str(KEY), "i1/succeeded/1")


# A key's approval book, folded from its events as the executor does: a key that only had
# approval requests settles when its last request was decided or lapsed, and expires by that.
def book_of(*events: Event) -> ApprovalBook:
    book: ApprovalBook | None = None
    for event in events:
        book = evolve_approvals(book, event)
    assert book is not None
    return book


def asked(at: datetime, ttl: timedelta = timedelta(hours=1), digest: str = DIGEST) -> Event:
    return ApprovalRequested(
        envelope=ctx("i1", digest).envelope("i1/approval-requested/1", at),
        approval_id="apr_1",
        arguments_redacted_json=REDACTED,
        impact_json="{}",
        expires_at=at + ttl,
    )


def refused_by_operator(at: datetime, digest: str = DIGEST) -> Event:
    return ApprovalDenied(
        envelope=ctx("op1", digest).envelope("op1/approval-denied/1", at),
        approval_id="apr_1",
        approver="olga",
        reason="too much",
    )


def granted_until(at: datetime, until: datetime) -> Event:
    return ApprovalGranted(
        envelope=ctx("op1").envelope("op1/approval-granted/1", at),
        approval_id="apr_1",
        approver="olga",
        token_digest="sha256:t",
        expires_at=until,
    )


ONLY_DENIED = book_of(asked(T0), refused_by_operator(SUCCEEDED_AT))
ONLY_PENDING = book_of(asked(T0))
ONLY_LAPSED = book_of(asked(T0 - timedelta(hours=2)))  # lapsed at T0 - 1 h
ONLY_GRANTED_UNUSED = book_of(asked(T0), granted_until(SUCCEEDED_AT, NOW + timedelta(seconds=1)))
LATER_DENIAL = book_of(
    asked(NOW - timedelta(seconds=60), digest=OTHER_DIGEST),
    refused_by_operator(NOW - timedelta(seconds=30), OTHER_DIGEST),
)
BOOK_SWEEP_ID = expiry_intent_id(str(KEY), "op1/approval-denied/1")
GATED = Gate(
    approval=ApprovalGate(
        token_digest=None, new_approval_id="apr_2", impact_json="{}", request_ttl=timedelta(hours=1)
    )
)


def book_expired(intent: str, settled: datetime, retention: int) -> Ev:
    return ev(
        ToolCallKeyExpired,
        f"{intent}/expired/1",
        status=None,
        last_event_at=settled,
        retention_s=retention,
    )


RETENTION_ROWS: list[Row] = [
    Row(
        "submit/expired-key-runs-as-a-new-call",
        SUCCEEDED,
        submit(policy=keep(60)),
        [
            expired("i2", CallStatus.SUCCEEDED, 60),
            ev(ToolCallStarted, "i2/started/1", attempt=1, round=1),
        ],
        Execute(attempt=1, round_attempt=1),
        CallStatus.PENDING,
    ),
    Row(
        "submit/expired-key-with-other-arguments-runs-as-new",
        SUCCEEDED,
        submit(digest=OTHER_DIGEST, policy=keep(60)),
        [expired("i2", CallStatus.SUCCEEDED, 60), ev(ToolCallStarted, "i2/started/1")],
        Execute(attempt=1, round_attempt=1),
        CallStatus.PENDING,
    ),
    Row(
        "submit/expired-failed-final-runs-as-new",
        FAILED_FINAL,
        submit(policy=keep(60)),
        [expired("i2", CallStatus.FAILED_FINAL, 60), ev(ToolCallStarted, "i2/started/1")],
        Execute(attempt=1, round_attempt=1),
        CallStatus.PENDING,
    ),
    Row(
        "submit/exactly-at-expiry-has-expired",
        SUCCEEDED,
        submit(policy=keep(599)),
        [expired("i2", CallStatus.SUCCEEDED, 599), ev(ToolCallStarted, "i2/started/1")],
        Execute(attempt=1, round_attempt=1),
        CallStatus.PENDING,
    ),
    Row(
        "submit/a-second-before-expiry-is-a-replay",
        SUCCEEDED,
        submit(policy=keep(600)),
        [ev(ToolCallReplayed, "i2/replayed/1", status=CallStatus.SUCCEEDED)],
        None,
        CallStatus.SUCCEEDED,
    ),
    Row(
        "submit/kept-forever-is-a-replay",
        SUCCEEDED,
        submit(policy=keep(None)),
        [ev(ToolCallReplayed, "i2/replayed/1", status=CallStatus.SUCCEEDED)],
        None,
        CallStatus.SUCCEEDED,
    ),
    Row(
        "submit/pending-never-expires",
        PENDING,
        submit(policy=keep(1)),
        [_rejected(ErrorCode.IDEMPOTENCY_KEY_IN_USE)],
        None,
        CallStatus.PENDING,
    ),
    Row(
        "submit/unknown-never-expires",
        UNKNOWN,
        submit(policy=keep(1)),
        [],
        Reconcile(reconcile_attempt=1),
        CallStatus.UNKNOWN,
    ),
    # another call's approval is still open for the key: a call that needs none must not
    # expire the key (and drop that approval with it); it is decided against the state
    Row(
        "submit/open-approval-of-another-call-keeps-the-key",
        SUCCEEDED,
        submit(policy=keep(60), approvals=OPEN_BOOK),
        [ev(ToolCallReplayed, "i2/replayed/1", status=CallStatus.SUCCEEDED)],
        None,
        CallStatus.SUCCEEDED,
    ),
    Row(
        "submit/a-decided-approval-lets-the-key-expire",
        SUCCEEDED,
        submit(policy=keep(60), approvals=DECIDED_BOOK),
        [expired("i2", CallStatus.SUCCEEDED, 60), ev(ToolCallStarted, "i2/started/1")],
        Execute(attempt=1, round_attempt=1),
        CallStatus.PENDING,
    ),
    Row(
        "expire/succeeded-past-retention",
        SUCCEEDED,
        expire(keep(60)),
        [expired(SWEEP_ID, CallStatus.SUCCEEDED, 60)],
        None,
        None,
    ),
    Row(
        "expire/failed-retryable-past-retention",
        given(*failed_round(1, 1, 1, RETRYABLE, "i1")),
        expire(keep(60)),
        [ev(ToolCallKeyExpired, status=CallStatus.FAILED_RETRYABLE)],
        None,
        None,
    ),
    Row("expire/not-yet", SUCCEEDED, expire(keep(600)), [], None, CallStatus.SUCCEEDED),
    Row("expire/forever", SUCCEEDED, expire(keep(None)), [], None, CallStatus.SUCCEEDED),
    Row("expire/pending", PENDING, expire(keep(1)), [], None, CallStatus.PENDING),
    Row("expire/unknown", UNKNOWN, expire(keep(1)), [], None, CallStatus.UNKNOWN),
    Row(
        "expire/open-approval-keeps-the-key",
        SUCCEEDED,
        expire(keep(60), OPEN_BOOK),
        [],
        None,
        CallStatus.SUCCEEDED,
    ),
    Row("expire/no-state", NONE, expire(keep(1)), [], None, None),
    # ---- keys that only had approval requests (no call ran under them)
    Row(
        "expire/only-a-denied-request-past-retention",
        NONE,
        expire(keep(60), ONLY_DENIED),
        [book_expired(BOOK_SWEEP_ID, SUCCEEDED_AT, 60)],
        None,
        None,
    ),
    Row(
        "expire/only-a-denied-request-within-retention",
        NONE,
        expire(keep(600), ONLY_DENIED),
        [],
        None,
        None,
    ),
    Row(
        "expire/only-a-pending-request-keeps-the-key",
        NONE,
        expire(keep(1), ONLY_PENDING),
        [],
        None,
        None,
    ),
    Row(
        "expire/only-an-unused-grant-keeps-the-key",
        NONE,
        expire(keep(1), ONLY_GRANTED_UNUSED),
        [],
        None,
        None,
    ),
    # retention counts from the request's lapse (T0 - 1 h): 4,200 s after it is NOW exactly
    Row(
        "expire/a-lapsed-request-at-its-expiry",
        NONE,
        expire(keep(4200), ONLY_LAPSED),
        [
            book_expired(
                expiry_intent_id(str(KEY), "i1/approval-requested/1"), T0 - timedelta(hours=1), 4200
            )
        ],
        None,
        None,
    ),
    Row(
        "expire/a-lapsed-request-a-second-before",
        NONE,
        expire(keep(4201), ONLY_LAPSED),
        [],
        None,
        None,
    ),
    Row(
        "submit/a-denial-past-retention-is-forgotten-and-asked-again",
        NONE,
        submit(policy=keep(60), approvals=ONLY_DENIED, gate=GATED),
        [
            book_expired("i2", SUCCEEDED_AT, 60),
            ev(ApprovalRequested, "i2/approval-requested/1", approval_id="apr_2"),
        ],
        None,
        None,
    ),
    Row(
        "submit/a-denial-within-retention-still-refuses",
        NONE,
        submit(policy=keep(600), approvals=ONLY_DENIED, gate=GATED),
        [_rejected(ErrorCode.APPROVAL_INVALID)],
        None,
        None,
    ),
    # other arguments on a key that only has approval requests: the key is taken by the
    # arguments they are for, as by a call state (no second request, and nothing runs)
    Row(
        "submit/other-args-on-a-pending-request-are-a-reused-key",
        NONE,
        submit(digest=OTHER_DIGEST, approvals=ONLY_PENDING, gate=GATED),
        [_rejected(ErrorCode.IDEMPOTENCY_KEY_REUSED)],
        None,
        None,
    ),
    Row(
        "submit/other-args-needing-no-approval-do-not-run",
        NONE,
        submit(digest=OTHER_DIGEST, approvals=ONLY_PENDING),
        [_rejected(ErrorCode.IDEMPOTENCY_KEY_REUSED)],
        None,
        None,
    ),
    Row(
        "submit/other-args-on-an-unused-grant-are-a-reused-key",
        NONE,
        submit(digest=OTHER_DIGEST, approvals=ONLY_GRANTED_UNUSED, gate=GATED),
        [_rejected(ErrorCode.IDEMPOTENCY_KEY_REUSED)],
        None,
        None,
    ),
    Row(
        "submit/other-args-on-a-denied-request-are-a-reused-key",
        NONE,
        submit(digest=OTHER_DIGEST, policy=keep(600), approvals=ONLY_DENIED, gate=GATED),
        [_rejected(ErrorCode.IDEMPOTENCY_KEY_REUSED)],
        None,
        None,
    ),
    Row(
        "submit/other-args-on-a-lapsed-request-within-retention-are-a-reused-key",
        NONE,
        submit(digest=OTHER_DIGEST, policy=keep(4201), approvals=ONLY_LAPSED, gate=GATED),
        [_rejected(ErrorCode.IDEMPOTENCY_KEY_REUSED)],
        None,
        None,
    ),
    Row(
        "submit/other-args-before-the-kill-switch",
        NONE,
        submit(
            digest=OTHER_DIGEST,
            approvals=ONLY_PENDING,
            gate=Gate(disabled=ErrorInfo.of(ErrorCode.TOOL_DISABLED, "off")),
        ),
        [_rejected(ErrorCode.IDEMPOTENCY_KEY_REUSED)],
        None,
        None,
    ),
    Row(
        "submit/other-args-after-the-key-expired-ask-anew",
        NONE,
        submit(digest=OTHER_DIGEST, policy=keep(60), approvals=ONLY_DENIED, gate=GATED),
        [
            book_expired("i2", SUCCEEDED_AT, 60),
            ev(ApprovalRequested, "i2/approval-requested/1", approval_id="apr_2"),
        ],
        None,
        None,
    ),
    Row(
        "submit/the-same-args-are-answered-by-their-pending-request",
        NONE,
        submit(approvals=ONLY_PENDING, gate=GATED),
        [ev(ApprovalRequested, "i2/approval-requested/1", approval_id="apr_1")],
        None,
        None,
    ),
    # the key's call settled long ago, but a request for other arguments was denied 30 s
    # ago: the key is kept for the denial's own retention
    Row(
        "submit/a-later-denial-keeps-the-key",
        SUCCEEDED,
        submit(policy=keep(60), approvals=LATER_DENIAL),
        [ev(ToolCallReplayed, "i2/replayed/1", status=CallStatus.SUCCEEDED)],
        None,
        CallStatus.SUCCEEDED,
    ),
    Row(
        "expire/a-later-denial-keeps-the-key",
        SUCCEEDED,
        expire(keep(60), LATER_DENIAL),
        [],
        None,
        CallStatus.SUCCEEDED,
    ),
    Row(
        "expire/past-both-retentions",
        SUCCEEDED,
        expire(keep(30), LATER_DENIAL),
        [
            ev(
                ToolCallKeyExpired,
                f"{SWEEP_ID}/expired/1",
                status=CallStatus.SUCCEEDED,
                last_event_at=NOW - timedelta(seconds=30),
                retention_s=30,
            )
        ],
        None,
        None,
    ),
]


@pytest.mark.parametrize("row", RETENTION_ROWS, ids=lambda row: row.name)
def test_retention_table(row: Row) -> None:
    state = fold(row.given)
    decision = decide(state, row.when)
    assert [type(e).__name__ for e in decision.events] == [e.type.__name__ for e in row.then]
    for actual, expected_event in zip(decision.events, row.then, strict=True):
        _check_event(actual, expected_event)
        assert actual.envelope.occurred_at == NOW  # log time: the command's, never a clock
        assert actual.call_key == str(KEY)
    assert decision.action == row.action
    after = fold(decision.events, state)
    assert (after.status if after is not None else None) == row.status
    if any(isinstance(e, ToolCallKeyExpired) for e in decision.events):
        assert after is None or after.attempts == 1  # forgotten: a new call starts over
    assert decide(fold(row.given), row.when) == decision  # deterministic, on every replay


def test_an_expired_key_is_forgotten_by_fold_all() -> None:
    state = fold(SUCCEEDED)
    assert state is not None
    decision = decide(state, expire(keep(60)))
    assert fold_all([*SUCCEEDED, *decision.events]) == {}
    assert expires_at(state, keep(60)) == SUCCEEDED_AT + timedelta(seconds=60)
    assert expires_at(state, keep(None)) is None
