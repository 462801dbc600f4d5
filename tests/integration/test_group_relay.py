"""The call groups' events reach the groups topic (Kafka + PostgreSQL backend), on a real
broker and a real PostgreSQL: keyed and partitioned by group id, in each group's order, every
row of the group log once the relay has caught up, rows written before the relay started
included. A relay that dies between the brokers' acks and its mark sends those rows again
(at least once), and a consumer that keeps only a group's increasing ``tl-seq`` sees every
group's events exactly once, in order. One relay leads at a time.

The steps are answered by a scripted ledger, as in test_group_replay_postgres.py: the relay
only sees the group log. ``test_a_group_over_the_kafka_front_door_is_on_the_topic`` runs a
real group through ``Ledger.kafka``."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import OutOfOrderSequenceNumber

from tests.integration.test_group_replay_postgres import scripted
from tests.services import Services
from tests.unit.test_group_replay import submit_both
from toolledger.kafka_admin import ensure_topics
from toolledger.processors.runtime.group_runner import GroupRunner
from toolledger.processors.tools.group_tools import step_tools
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
from toolledger.projections.group_relay import SEQ_HEADER, TENANT_HEADER, GroupEventRelay
from toolledger.projections.postgres import PostgresProjection
from toolledger.projections.postgres_groups import PostgresGroupLog
from toolledger.schemas.keys import partition_for
from toolledger.schemas.topics import Topics

pytestmark = pytest.mark.services

Record = tuple[int, int, str, bytes, dict[str, str]]  # partition, seq, group id, value, headers


def step_tool_set() -> Any:
    with tempfile.TemporaryDirectory() as scratch:
        store = HelpdeskStore(Path(scratch) / "helpdesk.db")
        tools = step_tools(helpdesk_registry(store))
        store.close()
    return tools


async def group_log_rows(dsn: str) -> dict[str, list[tuple[int, str]]]:
    """Each group's (seq, event) in order, as PostgreSQL has them."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT group_id, seq, event_json FROM group_log ORDER BY seq")
        rows: dict[str, list[tuple[int, str]]] = {}
        for group_id, seq, event in await cur.fetchall():
            rows.setdefault(group_id, []).append((seq, event))
        return rows


async def unpublished(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        row = await (
            await conn.execute("SELECT count(*) FROM group_log WHERE NOT published")
        ).fetchone()
        assert row is not None
        return int(row[0])


async def read_topic(kafka: str, topics: Topics, at_least: int) -> list[Record]:
    """Every record of the groups topic from the start, once ``at_least`` have arrived."""
    consumer = AIOKafkaConsumer(
        topics.groups, bootstrap_servers=kafka, group_id=None, auto_offset_reset="earliest"
    )
    await consumer.start()
    records: list[Record] = []
    try:
        async with asyncio.timeout(30):
            while len(records) < at_least:
                batches = await consumer.getmany(timeout_ms=500)
                for batch in batches.values():
                    for r in batch:
                        headers = {k: v.decode() for k, v in r.headers}
                        assert r.key is not None and r.value is not None
                        records.append(
                            (
                                r.partition,
                                int(headers[SEQ_HEADER]),
                                r.key.decode(),
                                r.value,
                                headers,
                            )
                        )
        await asyncio.sleep(0.5)  # nothing more than that arrives
        for batch in (await consumer.getmany(timeout_ms=500)).values():
            assert not batch, "more records than the group log has"
    finally:
        await consumer.stop()
    return records


def applied(records: list[Record]) -> dict[str, list[tuple[int, str]]]:
    """What a consumer applies: per group, a record only if its seq is above the last applied
    (in the topic's order within a partition)."""
    last: dict[str, int] = {}
    kept: dict[str, list[tuple[int, str]]] = {}
    for _partition, seq, group_id, value, _headers in sorted(records, key=lambda r: r[0]):
        if seq > last.get(group_id, 0):
            last[group_id] = seq
            kept.setdefault(group_id, []).append((seq, value.decode()))
    return kept


@contextlib.asynccontextmanager
async def group_log_of(
    dsn: str, relay: GroupEventRelay | None = None
) -> AsyncIterator[PostgresGroupLog]:
    async with PostgresProjection(dsn) as projection:
        group_log = PostgresGroupLog(
            projection, dsn, on_append=relay.wake if relay is not None else lambda: None
        )
        await group_log.open()
        try:
            yield group_log
        finally:
            await group_log.close()


async def run_groups(group_log: PostgresGroupLog) -> list[str]:
    tools = step_tool_set()
    runner = GroupRunner(group_log, group_log, scripted, lambda: tools, takeover_interval_s=None)
    try:
        return await submit_both(runner)
    finally:
        await runner.stop()


async def fresh_layout(services: Services) -> Topics:
    topics = Topics(prefix=f"tg{uuid.uuid4().hex[:10]}.", partitions=3)
    await ensure_topics(services.kafka, topics)
    return topics


async def test_every_group_event_is_on_the_topic_keyed_by_group_in_order(
    services: Services,
) -> None:
    dsn = await services.fresh_database()
    topics = await fresh_layout(services)
    async with group_log_of(dsn) as group_log:
        before = await run_groups(group_log)  # written while no relay ran
    async with GroupEventRelay(dsn, services.kafka, topics) as relay:
        async with group_log_of(dsn, relay) as group_log:
            after = await run_groups(group_log)
        rows = await group_log_rows(dsn)
        assert set(rows) == {*before, *after}
        records = await read_topic(services.kafka, topics, sum(map(len, rows.values())))
    assert await unpublished(dsn) == 0
    for partition, _seq, group_id, _value, headers in records:
        assert partition == partition_for(group_id.encode(), topics.partitions)
        assert headers[TENANT_HEADER] == "acme"
    by_group: dict[str, list[tuple[int, str]]] = {}
    for _partition, seq, group_id, value, _headers in records:
        by_group.setdefault(group_id, []).append((seq, value.decode()))
    assert by_group == rows  # each once, in the log's order, with the log's bytes


class DiesBeforeItsMark(GroupEventRelay):
    """A relay whose process dies after the brokers acknowledged a round, before its mark."""

    async def _mark(self, conn: psycopg.AsyncConnection[Any], seqs: list[int]) -> None:
        await conn.close()  # its session, and with it the leadership, is gone
        raise ConnectionError("killed before the mark")


async def test_a_relay_that_dies_before_its_mark_is_followed_and_nothing_is_lost(
    services: Services,
) -> None:
    dsn = await services.fresh_database()
    topics = await fresh_layout(services)
    async with group_log_of(dsn) as group_log:
        await run_groups(group_log)
    rows = await group_log_rows(dsn)
    total = sum(map(len, rows.values()))

    dying = DiesBeforeItsMark(dsn, services.kafka, topics, interval_s=60)
    try:  # publish_pending starts the producer
        with pytest.raises(ConnectionError):
            await dying.publish_pending()
    finally:
        await dying._producer.stop()
    assert await unpublished(dsn) == total  # sent, but not marked

    async with (
        GroupEventRelay(dsn, services.kafka, topics) as first,
        GroupEventRelay(dsn, services.kafka, topics) as second,
    ):
        for _ in range(200):  # the leader catches up within 20 s
            if not await unpublished(dsn):
                break
            await asyncio.sleep(0.1)
        assert await unpublished(dsn) == 0
        assert [first.leading, second.leading].count(True) == 1
        records = await read_topic(services.kafka, topics, 2 * total)

    seqs = [r[1] for r in records]
    assert sorted(seqs) == sorted(2 * [seq for log in rows.values() for seq, _ in log])
    first_copy = {r[1]: r[3] for r in records}
    assert all(first_copy[r[1]] == r[3] for r in records)  # a copy is the same record
    assert applied(records) == rows


async def test_a_group_over_ledger_kafka_is_on_the_topic(services: Services) -> None:
    """A real group through Ledger.kafka (its steps run by a Kafka executor in this process),
    compensated: once the ledger has closed, the groups topic holds its events as the group
    log does."""
    from tests.unit.test_sdk_groups import STEPS, _registry, on_kafka

    dsn = await services.fresh_database()
    topics = Topics(prefix=f"tg{uuid.uuid4().hex[:10]}.", partitions=4)
    effects: list[str] = []
    async with on_kafka(_registry(effects), services, topics, dsn) as ledger:
        run = await ledger.run_group(STEPS, idempotency_key="trip-relay", run_id="r", wait=30)
        assert run.view is not None and run.view.status == "COMPENSATED", run
    rows = await group_log_rows(dsn)
    assert list(rows) == [run.view.group_id] and len(rows[run.view.group_id]) >= 8
    records = await read_topic(services.kafka, topics, len(rows[run.view.group_id]))
    assert applied(records) == rows
    assert await unpublished(dsn) == 0


async def test_a_relay_whose_producer_has_a_hole_in_its_sequence_publishes_on(
    services: Services,
) -> None:
    """A failed batch leaves a hole in the idempotent producer's sequence numbers, after which
    the broker refuses its every later batch (what a partition without a leader for longer
    than the request timeout does, e.g. through a slow broker restart). The hole is made
    directly here: the failed round leaves its rows unmarked and the next rounds publish
    them through a new producer."""
    dsn = await services.fresh_database()
    topics = Topics(prefix=f"tg{uuid.uuid4().hex[:10]}.", partitions=1)
    await ensure_topics(services.kafka, topics)
    async with group_log_of(dsn) as group_log:
        await run_groups(group_log)
    rows = await group_log_rows(dsn)
    total = sum(map(len, rows.values()))
    assert total > 4

    relay = GroupEventRelay(dsn, services.kafka, topics, batch=2, interval_s=60)
    try:
        assert await relay.publish_pending() == 2
        relay._producer._txn_manager.increment_sequence_number(TopicPartition(topics.groups, 0), 5)
        with pytest.raises(OutOfOrderSequenceNumber):
            await relay.publish_pending()
        assert await unpublished(dsn) == total - 2  # the failed round marked nothing
        while await relay.publish_pending():
            pass
        assert await unpublished(dsn) == 0
    finally:
        await relay.stop()
    records = await read_topic(services.kafka, topics, total)
    assert applied(records) == rows
