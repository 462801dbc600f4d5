"""The events of the ledger (docs/architecture.md#events-and-the-wire-format), as frozen pydantic
models.

Every event carries the same :class:`Envelope`. The Avro schemas under ``schemas/avro/`` mirror
these models field for field (a test holds them together); :mod:`schemas.codec` turns one into
the other with the Avro single-object encoding.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from toolledger.schemas.errors import ErrorInfo, FieldError
from toolledger.schemas.status import CallStatus

SCHEMA_VERSION = 1


class Envelope(BaseModel):
    """Identity and context shared by all events.

    ``event_id`` is derived from ``intent_id`` and the event's place in that intent's
    processing, so reprocessing an intent yields the same ids. ``occurred_at`` comes from the
    runtime's input, never from a clock inside the pure core.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: str
    call_key: str
    tenant_id: str
    tool: str
    tool_version: str
    idempotency_key: str
    args_digest: str
    intent_id: str
    run_id: str | None = None
    step_id: str | None = None
    principal: str | None = None
    occurred_at: datetime
    schema_version: int = SCHEMA_VERSION
    trace_id: str | None = None


class Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    TYPE: ClassVar[str] = "Event"
    envelope: Envelope

    @property
    def event_id(self) -> str:
        return self.envelope.event_id

    @property
    def call_key(self) -> str:
        return self.envelope.call_key

    @property
    def intent_id(self) -> str:
        return self.envelope.intent_id


class FailureDisposition(StrEnum):
    RETRY = "RETRY"  # another attempt follows in this round
    RETRYABLE = "RETRYABLE"  # the round is over; a new call with the same key may execute again
    FINAL = "FINAL"  # permanent: replayed from now on


class Resolution(StrEnum):
    SUCCEEDED = "SUCCEEDED"
    FAILED_FINAL = "FAILED_FINAL"
    NOT_HAPPENED = "NOT_HAPPENED"
    INCONCLUSIVE = "INCONCLUSIVE"


class JobStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobInfo(BaseModel):
    """The background job of a long-running call, as the Call resource shows it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    status: JobStatus = JobStatus.RUNNING
    progress: float | None = None
    started_at: datetime
    updated_at: datetime


class ToolCallRequested(Event):
    """The intent, as a producer appends it. The only event that carries raw arguments."""

    TYPE: ClassVar[str] = "ToolCallRequested"
    arguments_json: str
    scopes: list[str] = Field(default_factory=list)
    approval_token: str | None = None  # the SHA-256 of the token (token_digest), never the token


class ToolCallStarted(Event):
    TYPE: ClassVar[str] = "ToolCallStarted"
    attempt: int
    round: int
    executor_epoch: int
    arguments_redacted_json: str


class ToolCallSucceeded(Event):
    TYPE: ClassVar[str] = "ToolCallSucceeded"
    attempt: int
    result_json: str
    downstream_request_id: str | None = None
    duration_ms: float  # milliseconds (v1 wrote whole ones)


class ToolCallFailed(Event):
    TYPE: ClassVar[str] = "ToolCallFailed"
    attempt: int
    error: ErrorInfo
    disposition: FailureDisposition
    fingerprint: str
    duration_ms: float  # milliseconds (v1 wrote whole ones)


class ToolCallOutcomeUnknown(Event):
    TYPE: ClassVar[str] = "ToolCallOutcomeUnknown"
    attempt: int
    reason: str


class ToolCallReconciled(Event):
    TYPE: ClassVar[str] = "ToolCallReconciled"
    resolution: Resolution
    reconcile_attempt: int
    result_json: str | None = None
    error: ErrorInfo | None = None
    downstream_request_id: str | None = None


class ToolCallReplayed(Event):
    TYPE: ClassVar[str] = "ToolCallReplayed"
    status: CallStatus
    attempts: int
    original_intent_id: str
    result_json: str | None = None
    error: ErrorInfo | None = None


class ToolCallKeyExpired(Event):
    """A settled key passed its retention: its state and approval book are forgotten (see
    the .avsc). ``status`` is None for a key that only had approval requests."""

    TYPE: ClassVar[str] = "ToolCallKeyExpired"
    status: CallStatus | None = None
    last_event_at: datetime
    retention_s: int


class ToolCallJobStarted(Event):
    """A long-running tool's handler started its job and returned the job's reference: the
    call stays PENDING until the job finishes (poll, report or cancel)."""

    TYPE: ClassVar[str] = "ToolCallJobStarted"
    attempt: int
    job: JobInfo
    duration_ms: float  # milliseconds (v1 wrote whole ones)


class ToolCallJobProgressed(Event):
    """A running job's progress, from a poll or a report (``source``)."""

    TYPE: ClassVar[str] = "ToolCallJobProgressed"
    job: JobInfo
    source: str


class ToolCallJobReplayed(Event):
    """A call with the key of a job still running was answered with that job (no new one)."""

    TYPE: ClassVar[str] = "ToolCallJobReplayed"
    status: CallStatus
    attempts: int
    original_intent_id: str
    job: JobInfo


class ToolCallJobReported(Event):
    """Intent: the job of a long-running call reports its status (``POST .../job``)."""

    TYPE: ClassVar[str] = "ToolCallJobReported"
    status: JobStatus
    progress: float | None = None
    result_json: str | None = None
    error: ErrorInfo | None = None


class ToolCallJobCancelRequested(Event):
    """Intent: cancel the job of a long-running call (``POST .../job/cancel``)."""

    TYPE: ClassVar[str] = "ToolCallJobCancelRequested"


class ToolCallRejected(Event):
    TYPE: ClassVar[str] = "ToolCallRejected"
    error: ErrorInfo
    field_errors: list[FieldError] = Field(default_factory=list)


class ApprovalRequested(Event):
    TYPE: ClassVar[str] = "ApprovalRequested"
    approval_id: str
    arguments_redacted_json: str
    impact_json: str
    expires_at: datetime


class ApprovalGranted(Event):
    TYPE: ClassVar[str] = "ApprovalGranted"
    approval_id: str
    approver: str
    token_digest: str
    expires_at: datetime


class ApprovalDenied(Event):
    TYPE: ClassVar[str] = "ApprovalDenied"
    approval_id: str
    approver: str
    reason: str


class ApprovalConsumed(Event):
    TYPE: ClassVar[str] = "ApprovalConsumed"
    approval_id: str


class ToolDisabled(Event):
    TYPE: ClassVar[str] = "ToolDisabled"
    scope: str
    actor: str
    reason: str


class ToolEnabled(Event):
    TYPE: ClassVar[str] = "ToolEnabled"
    scope: str
    actor: str
    reason: str


EVENT_TYPES: tuple[type[Event], ...] = (
    ToolCallRequested,
    ToolCallStarted,
    ToolCallSucceeded,
    ToolCallFailed,
    ToolCallOutcomeUnknown,
    ToolCallReconciled,
    ToolCallReplayed,
    ToolCallRejected,
    ToolCallKeyExpired,
    ApprovalRequested,
    ApprovalGranted,
    ApprovalDenied,
    ApprovalConsumed,
    ToolDisabled,
    ToolEnabled,
    ToolCallJobStarted,
    ToolCallJobProgressed,
    ToolCallJobReplayed,
    ToolCallJobReported,
    ToolCallJobCancelRequested,
)
EVENTS_BY_TYPE: dict[str, type[Event]] = {cls.TYPE: cls for cls in EVENT_TYPES}


def answers_intent(event: Event) -> bool:
    """Whether ``event`` is the answer a caller waiting on its intent id gets."""
    if isinstance(event, ToolCallFailed):
        return event.disposition is not FailureDisposition.RETRY
    if isinstance(event, ToolCallReconciled):
        return event.resolution is not Resolution.NOT_HAPPENED
    return isinstance(
        event,
        ToolCallSucceeded
        | ToolCallOutcomeUnknown
        | ToolCallReplayed
        | ToolCallRejected
        | ToolCallJobStarted
        | ToolCallJobProgressed
        | ToolCallJobReplayed
        | ApprovalRequested
        | ApprovalGranted
        | ApprovalDenied
        | ToolDisabled
        | ToolEnabled,
    )
