"""Wiring of call groups on the embedded backend: the orchestrator in this process, its log
and read model in the ledger file, its steps through the ledger client."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from processors.runtime.group_log import SqliteGroupLog
from processors.runtime.group_runner import (
    STEP_WAIT_S,
    GroupLog,
    GroupRunner,
    StepAnswer,
    StepCall,
    StepCaller,
)
from processors.runtime.sqlite_log import SqliteLog
from processors.tools.group_tools import step_tools
from processors.tools.registry import ToolRegistry
from producers.client import Caller, TrustedContext
from projections.groups import SqliteGroupProjection, SqliteGroupReads
from schemas.events import ApprovalRequested
from schemas.groups import GroupAnswer, GroupView


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


class GroupReads(Protocol):
    async def search(self, tenant_id: str, run_id: str | None, limit: int) -> list[GroupView]: ...


class LedgerGroups:
    """The front door's :class:`producers.http.door.GroupService`: the orchestrator over a
    group log, its steps through ``client``."""

    def __init__(
        self,
        group_log: GroupLog,
        reads: GroupReads,
        client: Caller,
        registry: Callable[[], ToolRegistry],
    ) -> None:
        self.runner = GroupRunner(group_log, step_caller(client), lambda: step_tools(registry()))
        self._reads = reads

    async def start(self) -> None:
        await self.runner.start()

    async def stop(self) -> None:
        await self.runner.stop()

    async def submit(
        self,
        *,
        tenant_id: str,
        principal: str,
        scopes: Sequence[str],
        group_key: str,
        body: Any,
        wait_s: float,
    ) -> GroupAnswer:
        return await self.runner.submit(
            tenant_id=tenant_id,
            principal=principal,
            scopes=scopes,
            group_key=group_key,
            body=body,
            wait_s=wait_s,
        )

    async def resume(
        self, tenant_id: str, group_id: str, tokens: Mapping[str, str], wait_s: float
    ) -> GroupAnswer:
        return await self.runner.resume(tenant_id, group_id, tokens, wait_s)

    async def view(self, tenant_id: str, group_id: str) -> GroupView | None:
        return await self.runner.view(tenant_id, group_id)

    async def search(self, tenant_id: str, run_id: str | None, limit: int) -> list[GroupView]:
        return await self._reads.search(tenant_id, run_id, limit)


def embedded_groups(
    log: SqliteLog, client: Caller, registry: Callable[[], ToolRegistry]
) -> LedgerGroups:
    """Groups in the ledger file: the executor's process drives them (it holds the lock)."""
    group_log = SqliteGroupLog(log.conn, SqliteGroupProjection())
    return LedgerGroups(group_log, SqliteGroupReads(log.conn), client, registry)
