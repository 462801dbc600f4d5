"""The call groups' read model in PostgreSQL is rebuilt from the group log (what ``toolledger
replay`` does after the outcome projections): the same rows as the orchestrator wrote, on a
real PostgreSQL. The steps are answered by a scripted ledger (the group orchestrator only
sees answers), so no Kafka is needed here; the embedded twin runs real calls
(tests/unit/test_group_replay.py)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.services import Services
from tests.unit.test_group_replay import READ_MODEL, submit_both
from toolledger.processors.runtime.group_runner import GroupRunner, StepAnswer, StepCall
from toolledger.processors.tools.group_tools import step_tools
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
from toolledger.projections.dialect import POSTGRES
from toolledger.projections.groups import rebuild_read_model
from toolledger.projections.postgres import PostgresProjection
from toolledger.projections.postgres_groups import PostgresGroupLog
from toolledger.schemas.status import CallStatus

pytestmark = pytest.mark.services


async def scripted(step: StepCall) -> StepAnswer:
    """The downstream as the ledger would answer it: flaky_write fails for good, the rest
    succeed (a ticket id for create_ticket, which close_ticket then takes)."""
    if step.tool == "flaky_write":
        return StepAnswer(CallStatus.FAILED_FINAL)
    return StepAnswer(CallStatus.SUCCEEDED, json.dumps({"ticket_id": f"t-{step.step_id}"}))


async def read_model(dsn: str) -> list[list[tuple[Any, ...]]]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        return [await (await conn.execute(sql.encode())).fetchall() for sql in READ_MODEL]


async def test_the_group_read_model_is_rebuilt_from_the_group_log(services: Services) -> None:
    dsn = await services.fresh_database()
    with tempfile.TemporaryDirectory() as scratch:
        store = HelpdeskStore(Path(scratch) / "helpdesk.db")
        tools = step_tools(helpdesk_registry(store))
        store.close()
    async with PostgresProjection(dsn) as projection:
        group_log = PostgresGroupLog(projection, dsn)
        await group_log.open()
        try:
            runner = GroupRunner(group_log, group_log, scripted, lambda: tools)
            await submit_both(runner)
            await runner.stop()
            written = await read_model(dsn)
            assert len(written[0]) == 2 and len(written[1]) == 4

            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute("DELETE FROM tool_call_group_steps")
                await conn.execute("UPDATE tool_call_groups SET status = 'RUNNING'")

            rebuilt = await rebuild_read_model(group_log, POSTGRES, tools)
            assert rebuilt.groups == 2 and rebuilt.unreadable == []
            assert await read_model(dsn) == written  # updated_at included
        finally:
            await group_log.close()
