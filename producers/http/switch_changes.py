"""Changing a kill switch: who may, the change sent to the ledger, and the switch it makes. One
module for every front end that switches tools (``PUT /v1/tools/{tool}/switch``, the operator
console), so the rules are written once.

An operator switches a tool (or ``*``, every tool) for its own tenant; ``operator:global``
also for every tenant (``scope="global"``). The tool is checked before (``operator_input``:
404 for a tool that is not registered)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from toolledger.producers import governance
from toolledger.producers.client import TrustedContext
from toolledger.producers.http.access import GLOBAL_OPERATOR
from toolledger.producers.http.door import FrontDoor
from toolledger.producers.http.errors import refused
from toolledger.producers.http.governance import PROJECTION_WAIT_S, command
from toolledger.schemas.calls import SwitchView
from toolledger.schemas.errors import ErrorCode

Scope = Literal["tenant", "global"]


@dataclass(frozen=True, slots=True)
class Switched:
    view: SwitchView  # the switch as changed
    confirmed: bool  # applied by the ledger; False: appended, it applies shortly


async def switch(
    door: FrontDoor,
    context: TrustedContext,
    tool: str,
    *,
    enabled: bool,
    reason: str,
    scope: Scope = "tenant",
) -> Switched:
    """Turn ``tool`` on or off as ``context`` (an operator); 403 for a global change without
    ``operator:global``."""
    if scope == "global" and GLOBAL_OPERATOR not in context.scopes:
        raise refused(
            ErrorCode.FORBIDDEN, "Switching a tool off for every tenant needs 'operator:global'."
        )
    target = "*" if scope == "global" else context.tenant_id
    # the latest change wins by time: never stamp one before the change it follows, even
    # when this front door's clock is behind the one that made that change
    now = datetime.now(UTC)
    for seen in await door.queries.switches(context.tenant_id):
        if (seen.tenant_id, seen.tool) == (target, tool):
            now = max(now, seen.changed_at + timedelta(microseconds=1))
    record = governance.switch(
        tenant_id=target,
        tool=tool,
        enabled=enabled,
        actor=context.principal,
        reason=reason,
        now=now,
    )
    answer = await command(door, record, broadcast=True)
    if answer is not None:  # the front door's pre-check reads the projection: let it catch up
        await door.applied.within(answer.event_id, PROJECTION_WAIT_S)
    door.switch_cache.clear()
    door.metrics.operator_actions.labels("enable" if enabled else "disable").inc()
    env = record.envelope
    view = SwitchView(
        tenant_id=env.tenant_id,
        tool=env.tool,
        enabled=enabled,
        reason=reason,
        actor=context.principal,
        changed_at=env.occurred_at,
    )
    return Switched(view, answer is not None)
