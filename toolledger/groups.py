"""Wiring of call groups on the embedded backend: the orchestrator in this process, its log
and read model in the ledger file, its steps through the ledger client."""

from __future__ import annotations

import json
from collections.abc import Callable

from processors.runtime.group_runner import (
    STEP_WAIT_S,
    GroupLog,
    GroupReads,
    GroupRunner,
    StepAnswer,
    StepCall,
    StepCaller,
)
from processors.runtime.sqlite_log import SqliteLog
from processors.tools.group_tools import step_tools
from processors.tools.registry import ToolRegistry
from producers.client import Caller, TrustedContext
from projections.groups import SqliteGroupLog
from schemas.events import ApprovalRequested


def step_caller(client: Caller) -> StepCaller:
    """Each step's call as the group's submitter made it (its tenant, principal, scopes)."""

    async def call(step: StepCall) -> StepAnswer:
        meta = step.meta
        result = await client.call(
            step.tool,
            step.arguments,
            idempotency_key=step.idempotency_key,
            context=TrustedContext(meta.tenant_id, meta.principal, frozenset(meta.scopes)),
            wait=STEP_WAIT_S,
            run_id=step.run_id,
            step_id=step.step_id,
            approval_token=step.approval_token,
        )
        approval = result.event.approval_id if isinstance(result.event, ApprovalRequested) else None
        found = result.result is not None or result.ok
        return StepAnswer(
            result.status,
            json.dumps(result.result) if found else None,
            result.error,
            approval,
        )

    return call


def ledger_groups(
    group_log: GroupLog,
    reads: GroupReads,
    client: Caller,
    registry: Callable[[], ToolRegistry],
) -> GroupRunner:
    """The front door's :class:`producers.http.door.GroupService`: the orchestrator over a
    group log, its steps through ``client``, the tools as the registry has them."""
    return GroupRunner(group_log, reads, step_caller(client), lambda: step_tools(registry()))


def embedded_groups(
    log: SqliteLog, client: Caller, registry: Callable[[], ToolRegistry]
) -> GroupRunner:
    """Groups in the ledger file: the executor's process drives them (it holds the lock)."""
    group_log = SqliteGroupLog(log.conn)
    return ledger_groups(group_log, group_log, client, registry)
