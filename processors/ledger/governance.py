"""Approvals and kill switches as state folded from events, like the calls themselves.

An approval request belongs to one call key (tenant, tool, idempotency key) and one args
digest; its book lives next to the key's call state in the key's partition, so the token is
consumed in the same atomic write as the ``ToolCallStarted`` it allows. A switch is recorded
in every partition, so each partition knows, in its own input order, which tools are off.
"""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from toolledger.processors.ledger.state import CallContext
from toolledger.schemas.calls import ANY, switch_scopes
from toolledger.schemas.errors import ErrorInfo
from toolledger.schemas.events import (
    ApprovalConsumed,
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    ToolDisabled,
    ToolEnabled,
)
from toolledger.schemas.governance import disabled_error


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    CONSUMED = "consumed"


class Approval(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    approval_id: str
    args_digest: str
    status: ApprovalStatus
    expires_at: datetime  # the request's expiry; once approved, the token's
    token_digest: str | None = None
    reason: str | None = None


# per call key: a key's requests are for the arguments that took it (other arguments are a
# reused key); a book folded before that rule may hold requests for several
MAX_OPEN_REQUESTS = 16


class ApprovalBook(BaseModel):
    """The approval requests made for one call key, oldest first: what decisions need (ids,
    digests, states, expiries), never arguments, so a book stays small. At most
    ``MAX_OPEN_REQUESTS`` pending ones are kept; a request past its expiry is dropped when
    the next one is opened (it can no longer be decided).

    ``context``, ``updated_at`` and ``last_event_id`` are those of the book's latest event:
    a key that only ever had approval requests expires by them (its expiry event needs the
    key's context, and its retention counts from when the book settled). A book stored
    before they existed has them None and never expires on its own."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    items: tuple[Approval, ...] = ()
    context: CallContext | None = None
    updated_at: datetime | None = None
    last_event_id: str | None = None

    def settled_at(self) -> datetime | None:
        """When no request of the book can be decided or used any more, by log time: its
        latest event, or the later expiry of a request still pending or approved and unused
        (until then the book is open at some times). None for a book without its times."""
        if self.updated_at is None:
            return None
        lapses = [
            a.expires_at
            for a in self.items
            if a.status in (ApprovalStatus.PENDING, ApprovalStatus.APPROVED)
        ]
        return max([self.updated_at, *lapses])

    def get(self, approval_id: str) -> Approval | None:
        return next((a for a in self.items if a.approval_id == approval_id), None)

    def by_token(self, token_digest: str) -> Approval | None:
        return next((a for a in self.items if a.token_digest == token_digest), None)

    def open_at(self, now: datetime) -> bool:
        """Whether a request is still to be decided or used (pending, or approved and unused,
        before its expiry): the key must not expire under it."""
        return any(
            a.status in (ApprovalStatus.PENDING, ApprovalStatus.APPROVED) and a.expires_at > now
            for a in self.items
        )

    def latest_for(self, args_digest: str) -> Approval | None:
        return next((a for a in reversed(self.items) if a.args_digest == args_digest), None)

    def _with(self, approval_id: str, **update: object) -> ApprovalBook:
        return self.model_copy(
            update={
                "items": tuple(
                    a.model_copy(update=update) if a.approval_id == approval_id else a
                    for a in self.items
                )
            }
        )

    def _after(self, event: Event) -> ApprovalBook:
        env = event.envelope
        return self.model_copy(
            update={
                "context": CallContext.of(env),
                "updated_at": env.occurred_at,
                "last_event_id": env.event_id,
            }
        )


APPROVAL_EVENTS = (ApprovalRequested, ApprovalGranted, ApprovalDenied, ApprovalConsumed)


def evolve_approvals(book: ApprovalBook | None, event: Event) -> ApprovalBook | None:
    """The book after ``event``; None when the event is not about approvals."""
    if not isinstance(event, APPROVAL_EVENTS):
        return None
    return _evolve_items(book or ApprovalBook(), event)._after(event)


def _evolve_items(book: ApprovalBook, event: Event) -> ApprovalBook:
    if isinstance(event, ApprovalRequested):
        if book.get(event.approval_id) is not None:
            return book  # asked again while pending: the first request stands
        approval = Approval(
            approval_id=event.approval_id,
            args_digest=event.envelope.args_digest,
            status=ApprovalStatus.PENDING,
            expires_at=event.expires_at,
        )
        now = event.envelope.occurred_at
        kept = [
            a
            for a in book.items
            if not (
                a.status in (ApprovalStatus.PENDING, ApprovalStatus.APPROVED)
                and a.expires_at <= now
            )
        ]
        pending = [a for a in kept if a.status is ApprovalStatus.PENDING]
        for oldest in pending[: max(0, len(pending) - MAX_OPEN_REQUESTS + 1)]:
            kept.remove(oldest)
        return book.model_copy(update={"items": (*kept, approval)})
    if isinstance(event, ApprovalGranted):
        return book._with(
            event.approval_id,
            status=ApprovalStatus.APPROVED,
            token_digest=event.token_digest,
            expires_at=event.expires_at,
        )
    if isinstance(event, ApprovalDenied):
        return book._with(event.approval_id, status=ApprovalStatus.DENIED, reason=event.reason)
    assert isinstance(event, ApprovalConsumed)
    return book._with(event.approval_id, status=ApprovalStatus.CONSUMED)


class Switch(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant_id: str  # ANY: every tenant
    tool: str  # ANY: every tool
    enabled: bool
    reason: str
    actor: str
    changed_at: datetime
    intent_id: str


SwitchEvent = ToolDisabled | ToolEnabled


def switch_key(tenant_id: str, tool: str) -> str:
    return json.dumps([tenant_id, tool], ensure_ascii=False, separators=(",", ":"))


def switch_of(event: SwitchEvent) -> Switch:
    env = event.envelope
    return Switch(
        tenant_id=env.tenant_id,
        tool=env.tool,
        enabled=isinstance(event, ToolEnabled),
        reason=event.reason,
        actor=event.actor,
        changed_at=env.occurred_at,
        intent_id=env.intent_id,
    )


def newer(current: Switch | None, candidate: Switch) -> bool:
    """Whether ``candidate`` replaces ``current`` (the later change wins, ties by id)."""
    if current is None:
        return True
    return (candidate.changed_at, candidate.intent_id) >= (current.changed_at, current.intent_id)


def disabled_by(switches: dict[str, Switch], tenant_id: str, tool: str) -> Switch | None:
    """The switch that keeps ``tool`` off for ``tenant_id``, if any: tenant-specific and
    global switches, for the tool and for every tool, each on its own."""
    if not switches:
        return None
    for tenant, name in switch_scopes(tenant_id, tool):
        switch = switches.get(switch_key(tenant, name))
        if switch is not None and not switch.enabled:
            return switch
    return None


def switched_off(switches: dict[str, Switch], tenant_id: str, tool: str) -> ErrorInfo | None:
    """The error a call of ``tool`` gets while a kill switch keeps it off (None: it is on)."""
    switch = disabled_by(switches, tenant_id, tool)
    if switch is None:
        return None
    return disabled_error(switch.tenant_id == ANY, switch.tool == ANY, tool, switch.reason)
