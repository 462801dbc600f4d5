"""Two front doors over one PostgreSQL group log (Kafka + PostgreSQL mode): a key submitted to
both at once keeps one definition, and a front door takes over the groups of a peer that is
gone, without a restart. The steps are answered by a scripted ledger: these are the
orchestrators' rules, the calls themselves are tested elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.services import Services
from toolledger.processors.groups.facts import StepTool
from toolledger.processors.runtime.group_runner import GroupRunner, StepAnswer, StepCall, StepCaller
from toolledger.processors.tools.group_tools import step_tools
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
from toolledger.projections.postgres import PostgresProjection
from toolledger.projections.postgres_groups import PostgresGroupLog
from toolledger.schemas.groups import GroupAnswer
from toolledger.schemas.status import CallStatus

pytestmark = pytest.mark.services


def tools() -> dict[str, StepTool]:
    with tempfile.TemporaryDirectory() as scratch:
        store = HelpdeskStore(Path(scratch) / "helpdesk.db")
        try:
            return dict(step_tools(helpdesk_registry(store)))
        finally:
            store.close()


async def succeed(step: StepCall) -> StepAnswer:
    return StepAnswer(CallStatus.SUCCEEDED, json.dumps({"ticket_id": f"t-{step.step_id}"}))


async def hang(step: StepCall) -> StepAnswer:
    await asyncio.Event().wait()  # the call never comes back: its front door dies first
    raise AssertionError("unreachable")


@contextlib.asynccontextmanager
async def front_door(
    dsn: str, call: StepCaller, facts: dict[str, StepTool], **options: Any
) -> AsyncIterator[GroupRunner]:
    """One front door's orchestrator: its own PostgreSQL session holds its claims."""
    async with PostgresProjection(dsn) as projection:
        group_log = PostgresGroupLog(projection, dsn)
        await group_log.open()
        runner = GroupRunner(group_log, group_log, call, lambda: facts, **options)
        await runner.start()
        try:
            yield runner
        finally:
            await runner.stop()
            await group_log.close()  # the session ends: its claims are released


def body(title: str) -> dict[str, Any]:
    return {
        "run_id": "run-doors",
        "steps": [{"id": "a", "tool": "create_ticket", "arguments": {"title": title}}],
    }


async def submit(runner: GroupRunner, key: str, title: str, wait_s: float = 10) -> GroupAnswer:
    return await runner.submit(
        tenant_id="acme",
        principal="agent-a",
        scopes=["tools:call"],
        group_key=key,
        body=body(title),
        wait_s=wait_s,
    )


async def submissions(dsn: str, key_part: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT COUNT(*) FROM group_log l JOIN group_meta m USING (group_id)"
            " WHERE m.group_key = %s AND l.event_json LIKE %s",
            (key_part, '%"GroupSubmitted"%'),
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def test_a_key_sent_to_two_front_doors_at_once_keeps_one_definition(
    services: Services,
) -> None:
    dsn = await services.fresh_database()
    facts = tools()
    async with front_door(dsn, succeed, facts) as one, front_door(dsn, succeed, facts) as two:
        for _ in range(10):
            key = f"doors-{uuid.uuid4().hex}"
            first, second = await asyncio.gather(submit(one, key, "A"), submit(two, key, "B"))
            answers = [first, second]
            ran = [a for a in answers if a.error is None]
            refused = [a.error.code for a in answers if a.error is not None]
            assert len(ran) == 1, answers  # one definition runs
            assert refused[0] in ("IDEMPOTENCY_KEY_REUSED", "INTERNAL"), refused
            assert await submissions(dsn, key) == 1  # and one is on the log


async def test_a_front_door_takes_over_the_groups_of_a_peer_that_is_gone(
    services: Services,
) -> None:
    dsn = await services.fresh_database()
    facts = tools()
    key = f"doors-{uuid.uuid4().hex}"
    async with front_door(dsn, succeed, facts, takeover_interval_s=0.2) as survivor:
        async with front_door(dsn, hang, facts) as doomed:
            started = await submit(doomed, key, "taken over", wait_s=0.2)
            assert started.view is not None and started.view.status == "RUNNING", started
            group_id = started.view.group_id
            await asyncio.sleep(0.5)  # the survivor may not take a group its peer drives
            view = await survivor.view("acme", group_id)
            assert view is not None and view.status == "RUNNING"
        # the doomed front door is gone (its session and claims with it): no restart needed
        deadline = time.monotonic() + 15
        while True:
            view = await survivor.view("acme", group_id)
            assert view is not None
            if view.status == "SUCCEEDED":
                break
            assert time.monotonic() < deadline, view
            await asyncio.sleep(0.1)
        assert await submissions(dsn, key) == 1


async def test_a_group_sent_again_to_a_survivor_is_taken_over_and_answered(
    services: Services,
) -> None:
    """No periodic takeover here: the replay of the submission itself takes the group over,
    and its answer follows the group the survivor now drives to its end."""
    dsn = await services.fresh_database()
    facts = tools()
    key = f"doors-{uuid.uuid4().hex}"
    async with front_door(dsn, succeed, facts, takeover_interval_s=None) as survivor:
        async with front_door(dsn, hang, facts) as doomed:
            started = await submit(doomed, key, "sent again", wait_s=0.2)
            assert started.view is not None and started.view.status == "RUNNING", started
        again = await submit(survivor, key, "sent again", wait_s=15)
        assert again.replayed and again.view is not None, again
        assert again.view.status == "SUCCEEDED", again.view
        assert await submissions(dsn, key) == 1
