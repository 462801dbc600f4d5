"""The projector on faust (``projections/faust_projector.py``) against the real services.

Needs ``TOOLLEDGER_KAFKA`` and ``TOOLLEDGER_POSTGRES`` (see ``conftest.py``). Each test gets its
own topics and fresh schemas (``search_path`` in the DSN).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from psycopg.conninfo import make_conninfo

from bench.faust_projector import FaustProjector
from tests import postgres_reads
from tests.integration.test_postgres_projection import (
    calls_of,
    eventually,
    expected_calls,
    produce,
    step,
)
from toolledger.kafka_admin import ensure_topics
from toolledger.projections.postgres import PostgresProjection, migrate
from toolledger.projections.projector import KafkaProjector
from toolledger.schemas.canonical import args_digest, canonical_json
from toolledger.schemas.errors import ErrorInfo
from toolledger.schemas.events import (
    Envelope,
    Event,
    FailureDisposition,
    ToolCallFailed,
    ToolCallStarted,
    ToolCallSucceeded,
)
from toolledger.schemas.keys import CallKey
from toolledger.schemas.topics import Topics

pytestmark = pytest.mark.services

T0 = datetime(2025, 3, 1, 9, 0, 0, tzinfo=UTC)


# --------------------------------------------------------------------------------- events


def _envelope(tag: str, i: int, n: int) -> Envelope:
    """Event ``n`` of call ``i`` (deterministic ids, increasing times)."""
    key = CallKey(f"tenant-{i % 3}", "send_email", f"{tag}-k{i}")
    return Envelope(
        event_id=f"{tag}-i{i}/{n}",
        call_key=str(key),
        tenant_id=key.tenant_id,
        tool=key.tool,
        tool_version="1",
        idempotency_key=key.idempotency_key,
        args_digest=args_digest({"to": f"{tag}{i}@example.com"}),
        intent_id=f"{tag}-i{i}",
        run_id=f"run-{i % 4}",
        occurred_at=T0 + timedelta(milliseconds=10 * i + n),
    )


def _started(tag: str, i: int, n: int, attempt: int) -> Event:
    return ToolCallStarted(
        envelope=_envelope(tag, i, n),
        attempt=attempt,
        round=1,
        executor_epoch=1,
        arguments_redacted_json=canonical_json({"to": "[redacted]"}),
    )


def _succeeded(tag: str, i: int, n: int, attempt: int) -> Event:
    return ToolCallSucceeded(
        envelope=_envelope(tag, i, n), attempt=attempt, result_json='{"ok":true}', duration_ms=5
    )


def _failed(tag: str, i: int, n: int, attempt: int) -> Event:
    return ToolCallFailed(
        envelope=_envelope(tag, i, n),
        attempt=attempt,
        error=ErrorInfo.downstream(
            "TIMEOUT", "timed out", retryable=True, suggested_action="retry"
        ),
        disposition=FailureDisposition.RETRY,
        fingerprint="fp",
        duration_ms=30,
    )


def calls(n: int, tag: str) -> list[Event]:
    """``n`` calls' outcome events, all starts first; every third call fails once and is
    retried (4 events), the others succeed (2 events)."""
    starts = [_started(tag, i, 0, 1) for i in range(n)]
    ends: list[Event] = []
    for i in range(n):
        if i % 3 == 0:
            ends += [_failed(tag, i, 1, 1), _started(tag, i, 2, 2), _succeeded(tag, i, 3, 2)]
        else:
            ends.append(_succeeded(tag, i, 1, 1))
    return starts + ends


def chunked(events: Sequence[Event], size: int) -> list[Sequence[Event]]:
    return [events[i : i + size] for i in range(0, len(events), size)]


@pytest.fixture
async def new_projection(postgres_dsn: str) -> AsyncIterator[Callable[[], Awaitable[str]]]:
    """Makes fresh, migrated schemas (DSNs with ``search_path``); drops them afterwards."""
    schemas: list[str] = []

    async def make() -> str:
        schema = f"tl_faust_{uuid.uuid4().hex[:12]}"
        async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
            await conn.execute(f'CREATE SCHEMA "{schema}"'.encode())
        schemas.append(schema)
        dsn = make_conninfo(postgres_dsn, options=f"-c search_path={schema}")
        await migrate(dsn)
        return dsn

    yield make
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        for schema in schemas:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE'.encode())


@pytest.fixture
async def topics(kafka_bootstrap: str) -> AsyncIterator[Topics]:
    topics = Topics(prefix=f"tf{uuid.uuid4().hex[:10]}.", partitions=3)
    await step("create topics", ensure_topics(kafka_bootstrap, topics))
    yield topics
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await step("admin start", admin.start())
    try:
        names = [topics.intents, topics.outcomes, topics.state, topics.dead_letters]
        await step("delete topics", admin.delete_topics(names))
    finally:
        await admin.close()


# ---------------------------------------------------------------------------------- tests


async def test_faust_projector_catches_up_with_the_rows_of_the_aiokafka_projector(
    kafka_bootstrap: str, topics: Topics, new_projection: Callable[[], Awaitable[str]]
) -> None:
    events = calls(120, "a")  # 320 events
    await produce(
        kafka_bootstrap,
        topics,
        chunked(events, 45),
        abort=calls(5, "aborted"),  # read_committed: never projected
        garbage=[(1, b"plain garbage")],
        dead_letters=[(2, 17, "undecodable record: bad marker", b"junk")],
    )
    expected = expected_calls(events)

    async with PostgresProjection(await new_projection()) as plain:
        async with KafkaProjector(kafka_bootstrap, topics, plain, batch_max=64) as projector:
            await eventually("the aiokafka projector catches up", projector.caught_up)
        plain_rows = (
            await calls_of(plain),
            await postgres_reads.event_rows(plain),
            await postgres_reads.dead_letter_rows(plain),
        )

    async with PostgresProjection(await new_projection()) as on_faust:
        projector_f = FaustProjector(kafka_bootstrap, topics, on_faust, batch_max=64)
        async with projector_f:
            await eventually("the faust projector catches up", projector_f.caught_up)
            assert projector_f.events_applied == len(events)
        faust_rows = (
            await calls_of(on_faust),
            await postgres_reads.event_rows(on_faust),
            await postgres_reads.dead_letter_rows(on_faust),
        )

    assert faust_rows[0] == expected
    assert not any(r["event_id"].startswith("aborted") for r in faust_rows[1])
    assert len(faust_rows[2]) == 2  # the garbage record and the executor's dead letter
    assert faust_rows == plain_rows  # calls, audit rows (with log positions), dead letters


async def test_faust_projector_starts_from_postgres_positions_not_kafka_offsets(
    kafka_bootstrap: str, topics: Topics, new_projection: Callable[[], Awaitable[str]]
) -> None:
    first, second = calls(60, "f"), calls(40, "s")
    await produce(kafka_bootstrap, topics, chunked(first, 50))

    # Kafka says the group has read everything; PostgreSQL (empty) says nothing is applied.
    group = AIOKafkaConsumer(
        bootstrap_servers=kafka_bootstrap,
        group_id=topics.projector_group,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await step("consumer start", group.start())
    try:
        partitions = [TopicPartition(topics.outcomes, p) for p in range(topics.partitions)]
        group.assign(partitions)
        end = await group.end_offsets(partitions)
        await group.commit(end)
    finally:
        await group.stop()

    async with PostgresProjection(await new_projection()) as projection:
        async with FaustProjector(kafka_bootstrap, topics, projection) as projector:
            await eventually("the faust projector catches up", projector.caught_up)
            assert await calls_of(projection) == expected_calls(first)
        stored = await projection.positions(topics.projector_group, topics.outcomes)

        await produce(kafka_bootstrap, topics, chunked(second, 50))
        async with FaustProjector(kafka_bootstrap, topics, projection) as projector:
            sought = {p: o for (t, p), o in projector.sought.items() if t == topics.outcomes}
            assert sought == {p: stored.get(p, 0) for p in range(topics.partitions)}
            await eventually("the faust projector catches up again", projector.caught_up)
            assert projector.records_read == len(second)  # nothing read twice
        assert await calls_of(projection) == expected_calls(first + second)
