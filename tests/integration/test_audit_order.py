"""The audit order is the log's (issue 31): on Kafka + PostgreSQL, after a mixed workload,
``toolledger replay`` run twice gives back every table and view of the read model, every
column and the order of the rows included (tests/dumps.py), as the live projector wrote it.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.contract.conftest import open_harness
from tests.contract.kafka import KafkaHarness
from tests.dumps import differences, dump_postgres
from tests.unit.test_group_replay import submit_both
from tests.workload import mixed_workload
from toolledger.distributed import replay_distributed
from toolledger.processors.runtime.group_runner import GroupRunner, StepAnswer, StepCall
from toolledger.processors.tools.group_tools import step_tools
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
from toolledger.projections.postgres_groups import PostgresGroupLog
from toolledger.schemas.status import CallStatus

pytestmark = pytest.mark.services


@pytest.fixture
async def kafka(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[KafkaHarness]:
    async for harness in open_harness(request, tmp_path, "kafka"):
        assert isinstance(harness, KafkaHarness)
        yield harness


async def _answer(step: StepCall) -> StepAnswer:
    if step.tool == "flaky_write":
        return StepAnswer(CallStatus.FAILED_FINAL)
    return StepAnswer(CallStatus.SUCCEEDED, json.dumps({"ticket_id": f"t-{step.step_id}"}))


async def test_two_rebuilds_give_back_every_row_in_the_same_order(kafka: KafkaHarness) -> None:
    await mixed_workload(kafka)
    with tempfile.TemporaryDirectory() as scratch:
        store = HelpdeskStore(Path(scratch) / "helpdesk.db")
        tools = step_tools(helpdesk_registry(store))
        store.close()
    projection = kafka.projection
    assert projection is not None and kafka.projector is not None
    dsn = kafka.dsn
    group_log = PostgresGroupLog(projection, dsn)
    await group_log.open()
    try:
        runner = GroupRunner(group_log, group_log, _answer, lambda: tools)
        await submit_both(runner)
        await runner.stop()
    finally:
        await group_log.close()
    await kafka.call_rows()  # the projector caught up with the log
    await kafka.projector.stop()

    live = await dump_postgres(dsn)
    (events, _), (calls, _) = live["tool_call_events"], live["tool_calls"]
    assert "seq" in events and "duration_ms" in calls
    assert len(live["tool_call_events"][1]) > 40 and len(live["tool_call_groups"][1]) == 2
    assert len(live["tool_metrics_daily"][1]) >= 4  # acme and globex, four tools at least
    seq = events.index("seq")
    assert [r[seq] for r in live["tool_call_events"][1]] == sorted(
        r[seq] for r in live["tool_call_events"][1]
    )
    for _ in range(2):
        count, rebuilt = await replay_distributed(kafka.services.kafka, dsn, kafka.topics, tools)
        assert count >= len(live["tool_call_events"][1]) and rebuilt.groups == 2
        assert differences(live, await dump_postgres(dsn)) == []
