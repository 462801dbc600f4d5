"""Inputs of the pure core. Time, ids and outcomes of I/O arrive here as data."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from toolledger.processors.ledger.governance import ApprovalBook, SwitchEvent
from toolledger.processors.ledger.state import CallContext
from toolledger.schemas.errors import ErrorInfo
from toolledger.schemas.events import ApprovalDenied, ApprovalGranted


@dataclass(frozen=True, slots=True)
class Policy:
    """The part of a tool's manifest that the state machine needs."""

    max_attempts: int = 3  # handler attempts per execution round
    max_rounds: int = 3  # execution rounds per call key (calls that find FAILED_RETRYABLE)
    has_reconcile: bool = False
    key_retention_s: int | None = None  # after the last terminal event; None: forever
    long_running: bool = False  # the handler starts a job; poll, report or cancel end it
    job_timeout_s: float | None = None  # a running job past this becomes UNKNOWN


@dataclass(frozen=True, slots=True)
class ApprovalGate:
    """The tool's approval rule applies to these arguments."""

    token_digest: str | None  # of the token the call presented, if any
    new_approval_id: str  # for a request this intent would open (derived from its id)
    impact_json: str
    request_ttl: timedelta
    executor_now: datetime | None = None  # a token expires by the later of both clocks


@dataclass(frozen=True, slots=True)
class Gate:
    """What must hold before a new execution starts (a replay passes without it)."""

    disabled: ErrorInfo | None = None  # the kill switch in force, as the caller's error
    approval: ApprovalGate | None = None


@dataclass(frozen=True, slots=True)
class Submit:
    """A validated, authorised intent reached the idempotency decision."""

    context: CallContext
    arguments_redacted_json: str
    policy: Policy
    now: datetime
    epoch: int
    gate: Gate = field(default_factory=Gate)
    # the key's approval book, whether or not this call needs an approval: what an approval
    # gate decides by, and an approval still open for the key (another call's) keeps the key
    # from expiring
    approvals: ApprovalBook | None = None


@dataclass(frozen=True, slots=True)
class Success:
    result_json: str
    downstream_request_id: str | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class TimedOut:
    """The handler was dispatched and did not answer: the effect may or may not have happened."""

    reason: str


@dataclass(frozen=True, slots=True)
class JobAccepted:
    """A long-running tool's handler started its job and returned its reference."""

    job_id: str
    progress: float | None = None


AttemptOutcome = Success | Failure | TimedOut | JobAccepted


@dataclass(frozen=True, slots=True)
class JobRunning:
    progress: float | None = None


@dataclass(frozen=True, slots=True)
class JobSucceeded:
    result_json: str


@dataclass(frozen=True, slots=True)
class JobFailed:
    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class JobCancelled:
    """The tool's ``cancel`` stopped the job."""

    reason: str = "The job was cancelled."


JobOutcome = JobRunning | JobSucceeded | JobFailed | JobCancelled


@dataclass(frozen=True, slots=True)
class JobUpdate:
    """What a job's poll, its own report or its cancellation says about it.

    ``context``: of the report or cancel intent, or the call's own (a poll by the sweeper);
    ``by_intent``: a report or a cancel, which is answered (a refusal when it does not apply);
    a poll that does not apply records nothing."""

    context: CallContext
    outcome: JobOutcome
    source: str  # "poll", "report" or "cancel"
    by_intent: bool
    policy: Policy
    now: datetime


@dataclass(frozen=True, slots=True)
class RequestCancel:
    """A cancel intent reached the key's partition: may the tool's ``cancel`` be called?"""

    context: CallContext
    can_cancel: bool  # the tool has a ``cancel``
    now: datetime


@dataclass(frozen=True, slots=True)
class AttemptFinished:
    context: CallContext
    attempt: int
    outcome: AttemptOutcome
    duration_ms: float  # milliseconds
    arguments_redacted_json: str
    policy: Policy
    now: datetime
    epoch: int


@dataclass(frozen=True, slots=True)
class Found:
    """Reconcile: the downstream has the effect."""

    result_json: str
    downstream_request_id: str | None = None


@dataclass(frozen=True, slots=True)
class FoundFailed:
    """Reconcile: the downstream refused the request for good."""

    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class NotHappened:
    """Reconcile: the downstream has no trace of the request, so running it is safe."""


@dataclass(frozen=True, slots=True)
class Inconclusive:
    reason: str


ReconcileOutcome = Found | FoundFailed | NotHappened | Inconclusive


@dataclass(frozen=True, slots=True)
class ReconcileFinished:
    """``by_intent``: a caller's retry triggered it (and may execute); else the sweeper did."""

    context: CallContext
    outcome: ReconcileOutcome
    by_intent: bool
    arguments_redacted_json: str
    policy: Policy
    now: datetime
    epoch: int
    gate: Gate = field(default_factory=Gate)


@dataclass(frozen=True, slots=True)
class Recover:
    """A new owner took over the key's partition."""

    now: datetime


@dataclass(frozen=True, slots=True)
class Sweep:
    """The background reconciler looks at an UNKNOWN key, or at a PENDING key whose job runs
    (poll it, or time it out)."""

    policy: Policy
    now: datetime


@dataclass(frozen=True, slots=True)
class Expire:
    """The executor looks at a finished key whose retention may have passed."""

    policy: Policy
    now: datetime
    approvals: ApprovalBook | None = None


@dataclass(frozen=True, slots=True)
class DecideApproval:
    """An operator's decision on an approval request, as the front door appended it."""

    decision: ApprovalGranted | ApprovalDenied
    book: ApprovalBook | None


@dataclass(frozen=True, slots=True)
class ChangeSwitch:
    """An operator turned a tool off or on; recorded by every partition."""

    change: SwitchEvent
    partition: int


Command = (
    Submit
    | AttemptFinished
    | ReconcileFinished
    | Recover
    | Sweep
    | Expire
    | DecideApproval
    | ChangeSwitch
    | JobUpdate
    | RequestCancel
)


@dataclass(frozen=True, slots=True)
class Execute:
    """Run the handler. ``round_attempt`` >= 2 means: back off first."""

    attempt: int
    round_attempt: int


@dataclass(frozen=True, slots=True)
class Reconcile:
    reconcile_attempt: int


@dataclass(frozen=True, slots=True)
class Poll:
    """Ask the tool's ``poll`` about the call's job."""


@dataclass(frozen=True, slots=True)
class Cancel:
    """Call the tool's ``cancel`` for the call's job."""


Action = Execute | Reconcile | Poll | Cancel
