"""Wiring of call groups: the orchestrator, its log and read model (the ledger file on the
embedded backend; PostgreSQL, with the groups topic fed from it, on Kafka + PostgreSQL), its
steps through the ledger client."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from toolledger.processors.runtime.group_runner import (
    STEP_WAIT_S,
    GroupLog,
    GroupReads,
    GroupRunner,
    StepAnswer,
    StepCall,
    StepCaller,
)
from toolledger.processors.runtime.sqlite_ledger import SqliteLedger
from toolledger.processors.tools.group_tools import step_tools
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.producers.client import Caller, TrustedContext
from toolledger.producers.http.applied import AppliedWatch
from toolledger.producers.http.governance import PROJECTION_WAIT_S
from toolledger.projections.groups import SqliteGroupLog
from toolledger.schemas.calls import CallQueries
from toolledger.schemas.events import ApprovalRequested

if TYPE_CHECKING:
    from toolledger.projections.postgres import PostgresProjection
    from toolledger.schemas.topics import Topics


def step_caller(client: Caller, queries: CallQueries | None = None) -> StepCaller:
    """Each step's call as the group's submitter made it (its tenant, principal, scopes).
    ``queries``: a projection that lags the ledger (Kafka + PostgreSQL). A step that needs an
    approval is then answered once the projection has its request, as a call's ``428`` is:
    the group shows the request id only when an approver can find it."""
    applied = None if queries is None else AppliedWatch(queries)  # polled as a front door's

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
        approval = None
        if isinstance(result.event, ApprovalRequested):
            approval = result.event.approval_id
            if applied is not None:
                await applied.within(result.event.event_id, PROJECTION_WAIT_S)
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
    queries: CallQueries | None = None,
) -> GroupRunner:
    """The front door's :class:`schemas.groups.GroupService`: the orchestrator over a
    group log, its steps through ``client``, the tools as the registry has them
    (``queries``: see :func:`step_caller`)."""
    return GroupRunner(
        group_log, reads, step_caller(client, queries), lambda: step_tools(registry())
    )


def embedded_groups(
    log: SqliteLedger, client: Caller, registry: Callable[[], ToolRegistry]
) -> GroupRunner:
    """Groups in the ledger file: the executor's process drives them (it holds the lock)."""
    group_log = SqliteGroupLog(log.conn)
    return ledger_groups(group_log, group_log, client, registry)


async def postgres_groups(
    stack: contextlib.AsyncExitStack,
    projection: PostgresProjection,
    dsn: str,
    kafka: str,
    topics: Topics,
    client: Caller,
    registry: Callable[[], ToolRegistry],
) -> GroupRunner:
    """Groups on Kafka + PostgreSQL, started, their stops pushed on ``stack``: the log in
    PostgreSQL (claimed per group, so several front doors may run this), published to the
    groups topic by a relay (one front door's at a time)."""
    from toolledger.projections.group_relay import GroupEventRelay
    from toolledger.projections.postgres import PostgresCalls
    from toolledger.projections.postgres_groups import PostgresGroupLog

    relay = await stack.enter_async_context(GroupEventRelay(dsn, kafka, topics))
    group_log = PostgresGroupLog(projection, dsn, on_append=relay.wake)
    await group_log.open()
    stack.push_async_callback(group_log.close)
    groups = ledger_groups(group_log, group_log, client, registry, PostgresCalls(projection))
    await groups.start()  # drives the unfinished groups no other front door claims
    stack.push_async_callback(groups.stop)
    return groups
