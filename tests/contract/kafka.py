"""The contract suite's distributed binding: a real Kafka broker and a real PostgreSQL.

Each test gets its own topics (unique prefix) and its own database (a copy of a migrated
template), so tests do not see each other. The executor runs in this process; the crash and
fault tests in ``tests/faults`` run it as a separate process and kill it for real.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from tests import postgres_reads
from tests.contract.harness import Harness, eventually
from tests.services import Services
from toolledger.kafka_admin import ensure_topics
from toolledger.processors.key_cache import DEFAULT_CACHE_ENTRIES
from toolledger.processors.pipeline import Stages
from toolledger.processors.runtime.kafka import KafkaExecutor
from toolledger.processors.tools.redaction import Redactor
from toolledger.producers.client import LedgerClient
from toolledger.producers.kafka import KafkaTransport
from toolledger.projections.postgres import PostgresProjection
from toolledger.projections.projector import KafkaProjector, rebuild
from toolledger.schemas.topics import Topics

SECRET = b"contract-suite-redaction-key-0123456789"


async def abandon(executor: KafkaExecutor) -> None:
    """Abandon everything at once, as a killed process would: running calls are cancelled
    and nothing after the last committed transaction survives (the executor's own ``stop``
    drains and releases instead)."""
    if executor._loop_task is not None:
        executor._loop_task.cancel()
    for owned in executor.owned.values():
        await owned.executor.stop()
    for owned in executor.owned.values():
        with contextlib.suppress(Exception):
            await owned.producer.stop()
        owned.local.close()
    executor.owned.clear()
    if executor._consumer is not None:
        with contextlib.suppress(Exception):
            await executor._consumer.stop()
    executor._cleanup()


class KafkaHarness(Harness):
    name = "kafka"

    def __init__(
        self, workdir: Path, services: Services, *, cache_entries: int | None = None
    ) -> None:
        super().__init__(workdir, cache_entries=cache_entries)
        self.services = services
        self.topics = Topics(prefix=f"c{uuid.uuid4().hex[:10]}.", partitions=4)
        self.executor: KafkaExecutor | None = None
        self.transport: KafkaTransport | None = None
        self.projection: PostgresProjection | None = None
        self.dsn = ""  # the read model's database, once started
        self.projector: KafkaProjector | None = None
        self._client: LedgerClient | None = None

    @property
    def client(self) -> LedgerClient:
        assert self._client is not None
        return self._client

    async def start(self) -> None:
        bootstrap = self.services.kafka
        if self.transport is None:
            await ensure_topics(bootstrap, self.topics)
            self.transport = KafkaTransport(bootstrap, self.topics)
            await self.transport.start()
            self._client = LedgerClient(self.transport, key_scopes=self.registry.key_scope_of)
            self.dsn = await self.services.fresh_database()
            self.projection = PostgresProjection(self.dsn)
            await self.projection.open()
            self.projector = KafkaProjector(bootstrap, self.topics, self.projection)
            await self.projector.start()
        self.executor = KafkaExecutor(
            bootstrap,
            self.topics,
            Stages(self.registry, Redactor(SECRET)),
            session_timeout_ms=6000,
            sweep_interval_s=0.1,
            state_dir=self.workdir / "executor-state",  # kept across restarts: warm stores
            cache_entries=self.cache_entries or DEFAULT_CACHE_ENTRIES,
        )
        await self.executor.start()
        await self.executor.assigned.wait()

    async def stop(self) -> None:
        if self.executor is not None:
            await self.executor.drain()
            await self.executor.stop()
            self.executor = None

    async def crash(self) -> None:
        if self.executor is not None:
            await abandon(self.executor)
            self.executor = None

    async def close(self) -> None:
        await self.crash()
        if self.projector is not None:
            await self.projector.stop()
        if self.transport is not None:
            await self.transport.stop()
        if self.projection is not None:
            await self.projection.close()

    async def _settle(self) -> None:
        if self.executor is not None:
            executor = self.executor
            await eventually(executor.caught_up, timeout_s=30)
            await executor.drain()
        assert self.projector is not None
        projector = self.projector
        await eventually(projector.caught_up, timeout_s=30)

    async def call_rows(self) -> list[dict[str, Any]]:
        await self._settle()
        assert self.projection is not None
        return await postgres_reads.call_rows(self.projection)

    async def event_rows(self) -> list[dict[str, Any]]:
        await self._settle()
        assert self.projection is not None
        return await postgres_reads.event_rows(self.projection)

    async def rebuild(self) -> None:
        await self._settle()
        assert self.projector is not None and self.projection is not None
        await self.projector.stop()
        await rebuild(self.services.kafka, self.topics, self.projection)
        self.projector = KafkaProjector(self.services.kafka, self.topics, self.projection)
        await self.projector.start()

    async def send_raw(self, value: bytes) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.services.kafka, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(self.topics.intents, value, key=b"garbage", partition=0)
        finally:
            await producer.stop()

    async def dead_letter_reasons(self) -> list[str]:
        await self._settle()
        assert self.projection is not None
        return await postgres_reads.dead_letter_reasons(self.projection)
