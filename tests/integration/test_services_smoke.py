"""Smoke tests for the real services the ledger runs on (Kafka + PostgreSQL).

Start them with ``bash services/up.sh`` (or ``docker compose up -d``), then::

    . services/env.sh && pytest -m services tests/integration/test_services_smoke.py

These tests FAIL (they never skip) when ``TOOLLEDGER_KAFKA`` / ``TOOLLEDGER_POSTGRES`` are unset or
the servers cannot be reached: a run that was meant to exercise the services must not pass silently.

What they prove about the broker is what the executor relies on: topics can be created by the app,
transactions commit, a second producer with the same ``transactional_id`` fences the first (zombie
fencing), and a ``read_committed`` consumer sees committed records only -- never aborted ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Awaitable
from typing import Any, TypeVar

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import ProducerFenced
from psycopg.types.json import Jsonb

T = TypeVar("T")

# Bound on every single network step, so an unreachable server fails the test instead of hanging it.
STEP_TIMEOUT_S = 60.0


def _required_env(name: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        pytest.fail(
            f"{name} is not set. Start the services (`bash services/up.sh`) and "
            "`. services/env.sh` before running tests marked `services`.",
            pytrace=False,
        )
    return value


async def _step(what: str, awaitable: Awaitable[T]) -> T:
    """Await one network step with a bound; turn a timeout into a readable test failure."""
    try:
        return await asyncio.wait_for(awaitable, STEP_TIMEOUT_S)
    except TimeoutError:
        pytest.fail(f"timed out after {STEP_TIMEOUT_S:.0f} s: {what}", pytrace=False)


def _producer(bootstrap: str, transactional_id: str) -> Any:
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=transactional_id,
        enable_idempotence=True,
        request_timeout_ms=30_000,
    )


async def _read_partition(bootstrap: str, tp: TopicPartition, isolation_level: str) -> list[bytes]:
    """All record values of ``tp`` from the beginning up to its end offset (for read_committed: the
    last stable offset), in offset order."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=isolation_level,
        request_timeout_ms=30_000,
    )
    await _step(f"start {isolation_level} consumer on {bootstrap}", consumer.start())
    try:
        consumer.assign([tp])
        await _step("seek to beginning", consumer.seek_to_beginning(tp))
        end = (await _step("end offsets", consumer.end_offsets([tp])))[tp]
        values: list[bytes] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STEP_TIMEOUT_S
        # control records (commit/abort markers) occupy offsets too; the position moves past them
        while await consumer.position(tp) < end:
            if loop.time() > deadline:
                pytest.fail(f"{isolation_level} consumer did not reach offset {end} of {tp}")
            batches = await consumer.getmany(tp, timeout_ms=1_000)
            for records in batches.values():
                values.extend(record.value for record in records)
        return values
    finally:
        await consumer.stop()


@pytest.mark.services
async def test_kafka_transactions_fence_zombies_and_hide_aborted_records() -> None:
    bootstrap = _required_env("TOOLLEDGER_KAFKA")
    run = uuid.uuid4().hex[:12]
    topic = f"toolledger-smoke-{run}"
    transactional_id = f"toolledger-smoke-txn-{run}"
    tp = TopicPartition(topic, 0)

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    await _step(f"connect the admin client to {bootstrap}", admin.start())
    try:
        response = await _step(
            f"create topic {topic}",
            admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)]),
        )
        errors = {entry[0]: entry[1] for entry in response.topic_errors}
        assert errors == {topic: 0}, f"CreateTopics returned error codes {errors}"
        assert topic in await _step("list topics", admin.list_topics())

        first = _producer(bootstrap, transactional_id)
        await _step("start the first transactional producer", first.start())
        second = _producer(bootstrap, transactional_id)
        try:
            # a committed transaction
            await first.begin_transaction()
            await _step(
                "produce committed-1", first.send_and_wait(topic, b"committed-1", partition=0)
            )
            await _step("commit", first.commit_transaction())

            # an aborted transaction: written to the log, but must stay invisible to read_committed
            await first.begin_transaction()
            await _step("produce aborted-1", first.send_and_wait(topic, b"aborted-1", partition=0))
            await _step("abort", first.abort_transaction())

            # a zombie: `first` is mid-transaction when a new instance with the same id starts.
            # InitProducerId bumps the epoch; the coordinator aborts the zombie's open transaction.
            await first.begin_transaction()
            await _step("produce zombie-1", first.send_and_wait(topic, b"zombie-1", partition=0))
            await _step("start the second producer (same transactional_id)", second.start())
            with pytest.raises(ProducerFenced):
                await _step("commit from the fenced producer", first.commit_transaction())

            # the new instance owns the transactional id now
            await second.begin_transaction()
            await _step(
                "produce committed-2", second.send_and_wait(topic, b"committed-2", partition=0)
            )
            await _step("commit from the second producer", second.commit_transaction())
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(first.stop(), STEP_TIMEOUT_S)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(second.stop(), STEP_TIMEOUT_S)

        # the aborted and the fenced records really are in the log ...
        everything = await _read_partition(bootstrap, tp, "read_uncommitted")
        assert everything == [b"committed-1", b"aborted-1", b"zombie-1", b"committed-2"]
        # ... and read_committed hides both
        committed = await _read_partition(bootstrap, tp, "read_committed")
        assert committed == [b"committed-1", b"committed-2"]
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(admin.delete_topics([topic]), STEP_TIMEOUT_S)
        await admin.close()


@pytest.mark.services
async def test_postgres_copy_roundtrip() -> None:
    dsn = _required_env("TOOLLEDGER_POSTGRES")
    rows: list[tuple[int, str, dict[str, Any] | None]] = [
        (1, "plain", {"attempt": 1}),
        (2, 'tab\tnewline\nbackslash\\ comma, quote\' "dq"', {"nested": {"list": [1, 2, 3]}}),
        (3, "unicode \u2713 \u00e9\u00e8", None),
        *((i, f"call-{i}", {"i": i}) for i in range(4, 1_004)),
    ]

    conn = await _step(
        "connect to PostgreSQL",
        psycopg.AsyncConnection.connect(dsn, connect_timeout=10),
    )
    async with conn:
        async with conn.cursor() as cur:
            # the services are configured for durability; the ledger's guarantees depend on it
            await cur.execute("SHOW fsync")
            assert await cur.fetchone() == ("on",)

            await cur.execute(
                "CREATE TEMP TABLE smoke_copy ("
                " id bigint PRIMARY KEY, name text NOT NULL, payload jsonb,"
                " created_at timestamptz NOT NULL DEFAULT now())"
            )
            async with cur.copy("COPY smoke_copy (id, name, payload) FROM STDIN") as copy:
                for row_id, name, payload in rows:
                    await copy.write_row(
                        (row_id, name, None if payload is None else Jsonb(payload))
                    )
            assert cur.rowcount == len(rows)

            await cur.execute("SELECT id, name, payload FROM smoke_copy ORDER BY id")
            assert await cur.fetchall() == rows

            # and back out through COPY TO as well
            copied_out: list[tuple[Any, ...]] = []
            async with cur.copy(
                "COPY (SELECT id, name FROM smoke_copy ORDER BY id) TO STDOUT"
            ) as copy:
                copy.set_types(["int8", "text"])
                async for record in copy.rows():
                    copied_out.append(record)
            assert copied_out == [(row_id, name) for row_id, name, _ in rows]
        await conn.rollback()
