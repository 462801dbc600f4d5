"""The call group resource (``GET /v1/groups/{group_id}``) and what answers a submission."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from toolledger.schemas.errors import ErrorInfo, FieldError
from toolledger.schemas.keys import derive_idempotency_key

# a step's id in a group definition (the adapters make ids that fit it)
STEP_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"


def step_key(group_key: str, step_id: str) -> str:
    """The idempotency key of a step's call: the same for every round, so it runs at most once."""
    return derive_idempotency_key(group_key, f"step:{step_id}")


def compensation_key(group_key: str, step_id: str) -> str:
    """The idempotency key of the call that compensates a step."""
    return derive_idempotency_key(group_key, f"compensate:{step_id}")


def group_id_for(tenant_id: str, group_key: str) -> str:
    """The public id of a group: its tenant and its key name it, as a call's do."""
    digest = hashlib.sha256(f"{tenant_id}\x1fgroups\x1f{group_key}".encode()).hexdigest()
    return "grp_" + digest[:32]


class CompensationView(BaseModel):
    model_config = ConfigDict(frozen=True)

    status: str
    call_id: str | None = None


class GroupStepView(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    tool: str
    status: str  # the call's status, or WAITING, BLOCKED, SKIPPED
    call_id: str | None = None
    result: Any = None
    error: ErrorInfo | None = None
    depends_on: list[str]
    compensation: CompensationView | None = None
    approval_request: dict[str, Any] | None = None  # while it waits for an approval


class GroupView(BaseModel):
    """The group resource. ``completion_point`` once it has finished: which steps completed,
    failed, were skipped, compensated, or left done (and why it needs attention)."""

    model_config = ConfigDict(frozen=True)

    group_id: str
    status: str  # RUNNING BLOCKED SUCCEEDED FAILED COMPENSATING COMPENSATED NEEDS_ATTENTION
    run_id: str
    on_failure: str
    idempotency_key: str
    created_at: datetime
    updated_at: datetime
    steps: list[GroupStepView]
    completion_point: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.status in {
            "SUCCEEDED",
            "FAILED",
            "COMPENSATED",
            "NEEDS_ATTENTION",
        }


@dataclass(frozen=True, slots=True)
class GroupAnswer:
    """What a submission or a resume gets: the group (``replayed`` if the key had it), or a
    refusal (``error``, with ``field_errors`` for an invalid definition); nothing stored then."""

    view: GroupView | None = None
    replayed: bool = False
    error: ErrorInfo | None = None
    field_errors: tuple[FieldError, ...] = field(default=())


class GroupService(Protocol):
    """Call groups, as the composition root runs them for a backend."""

    async def submit(
        self,
        *,
        tenant_id: str,
        principal: str,
        scopes: Sequence[str],
        group_key: str,
        body: Any,
        wait_s: float,
    ) -> GroupAnswer: ...

    async def resume(
        self, tenant_id: str, group_id: str, tokens: Mapping[str, str], wait_s: float
    ) -> GroupAnswer: ...

    async def view(self, tenant_id: str, group_id: str) -> GroupView | None: ...

    async def search(self, tenant_id: str, run_id: str | None, limit: int) -> list[GroupView]: ...
