"""The state of one call key, and the context its events are stamped with."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from toolledger.schemas.errors import ErrorInfo
from toolledger.schemas.events import Envelope, JobInfo
from toolledger.schemas.status import CallStatus


class CallContext(BaseModel):
    """Everything an outcome event's envelope repeats from the intent that caused it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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
    trace_id: str | None = None

    def envelope(self, event_id: str, occurred_at: datetime) -> Envelope:
        # from the fields as they are (``model_dump`` would serialise them first: 5x the work)
        return Envelope.model_validate(
            {**self.__dict__, "event_id": event_id, "occurred_at": occurred_at}
        )

    @classmethod
    def of(cls, envelope: Envelope, **update: object) -> CallContext:
        """The context of ``envelope`` (``update``: fields that differ from it)."""
        fields = envelope.__dict__
        return cls.model_validate({name: fields[name] for name in _CONTEXT_FIELDS} | update)


_CONTEXT_FIELDS = tuple(CallContext.model_fields)


class CallState(BaseModel):
    """What the ledger knows about one call key: the fold of its outcome events."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: CallStatus
    context: CallContext  # of the intent whose execution round is the latest one
    first_intent_id: str
    attempts: int = 0  # handler invocations, all rounds together
    rounds: int = 0  # execution rounds started
    round_attempts: int = 0  # handler invocations in the current round
    reconcile_attempts: int = 0
    result_json: str | None = None
    error: ErrorInfo | None = None
    job: JobInfo | None = None  # a long-running call's job, once its handler started it
    job_updates: int = 0  # progress events of the job so far (numbers their event ids)
    created_at: datetime
    updated_at: datetime
    last_event_id: str

    @property
    def args_digest(self) -> str:
        return self.context.args_digest
