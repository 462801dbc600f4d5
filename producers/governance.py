"""Operators' commands, as records for the intents stream: approval decisions and switches.

The front door builds them from what it trusts (the operator's authenticated identity, the
approval request as projected); the executor decides whether they apply, in the order of the
call key's partition, and answers each with the event it recorded or a refusal.
"""

from __future__ import annotations

import json
import secrets
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from toolledger.schemas.calls import ANY, IMPACT_FIELDS, ApprovalView
from toolledger.schemas.events import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Envelope,
    ToolDisabled,
    ToolEnabled,
)
from toolledger.schemas.governance import token_digest
from toolledger.schemas.keys import call_id_of

DEFAULT_TOKEN_TTL = timedelta(minutes=10)
MAX_REASON_CHARS = 1000


@dataclass(frozen=True, slots=True)
class ApprovalTarget:
    """The call an approval request is about (from the projection of its request). ``run_id``:
    the run the call belongs to, which its decision's events carry too."""

    approval_id: str
    tenant_id: str
    tool: str
    idempotency_key: str
    args_digest: str
    run_id: str | None = None
    call_key: str = field(kw_only=True)  # the call's, in its key's scope (its principal's)

    @classmethod
    def of(cls, view: ApprovalView) -> ApprovalTarget:
        """The call of an approval request as the read side shows it."""
        return cls(
            view.approval_id,
            view.tenant_id,
            view.tool,
            view.idempotency_key,
            view.args_digest,
            view.run_id,
            call_key=view.call_key,
        )

    @classmethod
    def of_request(cls, event: ApprovalRequested) -> ApprovalTarget:
        """The call of an approval request as the event that opened it names it."""
        env = event.envelope
        return cls(
            event.approval_id,
            env.tenant_id,
            env.tool,
            env.idempotency_key,
            env.args_digest,
            env.run_id,
            call_key=env.call_key,
        )


def _envelope(
    intent_id: str,
    kind: str,
    *,
    call_key: str,
    tenant_id: str,
    tool: str,
    idempotency_key: str,
    args_digest: str,
    actor: str,
    now: datetime,
    run_id: str | None = None,
) -> Envelope:
    return Envelope(
        event_id=f"{intent_id}/{kind}/1",
        call_key=call_key,
        tenant_id=tenant_id,
        tool=tool,
        tool_version="",
        idempotency_key=idempotency_key,
        args_digest=args_digest,
        intent_id=intent_id,
        run_id=run_id,
        principal=actor,
        occurred_at=now,
    )


def approve(
    target: ApprovalTarget, approver: str, now: datetime, ttl: timedelta = DEFAULT_TOKEN_TTL
) -> tuple[ApprovalGranted, str]:
    """The decision to append and the token to hand to the operator (never logged: the
    record carries only its digest)."""
    token = f"apt_{secrets.token_urlsafe(32)}"
    intent_id = uuid.uuid4().hex
    record = ApprovalGranted(
        envelope=_call_envelope(intent_id, "approve", target, approver, now),
        approval_id=target.approval_id,
        approver=approver,
        token_digest=token_digest(token),
        expires_at=now + ttl,
    )
    return record, token


def deny(target: ApprovalTarget, approver: str, reason: str, now: datetime) -> ApprovalDenied:
    intent_id = uuid.uuid4().hex
    return ApprovalDenied(
        envelope=_call_envelope(intent_id, "deny", target, approver, now),
        approval_id=target.approval_id,
        approver=approver,
        reason=reason,
    )


def _call_envelope(
    intent_id: str, kind: str, target: ApprovalTarget, actor: str, now: datetime
) -> Envelope:
    return _envelope(
        intent_id,
        kind,
        call_key=target.call_key,
        tenant_id=target.tenant_id,
        tool=target.tool,
        idempotency_key=target.idempotency_key,
        args_digest=target.args_digest,
        actor=actor,
        now=now,
        run_id=target.run_id,
    )


def switch(
    *, tenant_id: str, tool: str, enabled: bool, actor: str, reason: str, now: datetime
) -> ToolDisabled | ToolEnabled:
    """``tenant_id`` or ``tool`` may be ``*`` (every tenant, every tool)."""
    intent_id = uuid.uuid4().hex
    envelope = _envelope(
        intent_id,
        "switch",
        call_key="switch:" + json.dumps([tenant_id, tool], separators=(",", ":")),
        tenant_id=tenant_id,
        tool=tool,
        idempotency_key="",
        args_digest="",
        actor=actor,
        now=now,
    )
    scope = "global" if tenant_id == ANY else "tenant"
    cls = ToolEnabled if enabled else ToolDisabled
    return cls(envelope=envelope, scope=scope, actor=actor, reason=reason)


def approval_request_json(event: ApprovalRequested) -> dict[str, Any]:
    """The approval request of an ``APPROVAL_REQUIRED`` answer (the shape of
    docs/architecture.md#the-http-contract, as ``schemas.calls.ApprovalView.to_json`` renders
    it), from the answering event."""
    env = event.envelope
    impact = json.loads(event.impact_json)
    return {
        "id": event.approval_id,
        "tool": env.tool,
        "arguments": json.loads(event.arguments_redacted_json),
        "args_digest": env.args_digest,
        "impact": {name: impact.get(name) for name in IMPACT_FIELDS}
        | {"irreversible": bool(impact.get("irreversible"))},
        "approver_kind": impact.get("approver_kind", "operator"),
        "status": "pending",
        "expires_at": event.expires_at.isoformat(),
        "call_id": call_id_of(env.call_key),
    }
