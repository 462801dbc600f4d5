"""The Kafka transport of :class:`~producers.client.LedgerClient`.

Intents go out through an idempotent producer (``acks=all``), keyed and partitioned exactly as
the embedded log does. Outcomes come back through one ``read_committed`` listener per process
(not one per call) that looks at the ``intent_id`` header and decodes only what a caller here
is waiting for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from toolledger.producers.client import TransportError
from toolledger.producers.outcomes import OutcomeHub
from toolledger.schemas.codec import CodecError
from toolledger.schemas.events import Event
from toolledger.schemas.topics import INTENT_ID_HEADER, Topics
from toolledger.schemas.wire import SINGLE_OBJECT, WireFormat

log = logging.getLogger("toolledger.producer")


class TopicLayoutError(RuntimeError):
    pass


class KafkaTransport:
    def __init__(
        self,
        bootstrap: str,
        topics: Topics,
        *,
        linger_ms: int = 2,
        wire: WireFormat = SINGLE_OBJECT,
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self._wire = wire
        self.outcomes = OutcomeHub()
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", linger_ms=linger_ms
        )
        self._listener = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def reachable(self, timeout_s: float = 2.0) -> bool:
        """Whether the brokers answer now (a metadata request): an intent could be appended."""
        try:
            await asyncio.wait_for(self._producer.client.fetch_all_metadata(), timeout_s)
        except (KafkaError, TimeoutError, OSError):
            return False
        return True

    async def start(self) -> None:
        await self._producer.start()
        await self._listener.start()
        for topic in (self.topics.intents, self.topics.outcomes):
            found = await self._producer.partitions_for(topic)
            if len(found) != self.topics.partitions:
                raise TopicLayoutError(
                    f"{topic} has {len(found)} partitions, expected {self.topics.partitions}: "
                    "intents and outcomes must be co-partitioned"
                )
        partitions = [
            TopicPartition(self.topics.outcomes, p) for p in range(self.topics.partitions)
        ]
        self._listener.assign(partitions)
        await self._listener.seek_to_end(*partitions)
        for tp in partitions:  # resolve the positions now: no outcome after start is missed
            await self._listener.position(tp)
        self._task = asyncio.create_task(self._listen())

    async def send(self, intent: Event) -> None:
        await self._append(intent, [self.topics.partition_of(intent)])

    async def broadcast(self, record: Event) -> None:
        await self._append(record, range(self.topics.partitions))

    async def _append(self, record: Event, partitions: Iterable[int]) -> None:
        key, value, headers = self._wire.record(record)
        try:
            sent = [
                await self._producer.send(
                    self.topics.intents, value, key=key, partition=p, headers=headers
                )
                for p in partitions
            ]
            await asyncio.gather(*sent)
        except KafkaError as exc:
            raise TransportError(f"appending to the log failed: {type(exc).__name__}") from exc

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._producer.stop()
        await self._listener.stop()

    async def _listen(self) -> None:
        """Runs for the transport's lifetime: a failed poll is logged and retried with backoff
        (the consumer keeps its position), so callers are never left waiting on a dead loop."""
        delay = 0.1
        while True:
            try:
                await self._listen_once()
                delay = 0.1
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("outcome listener error; retrying")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _listen_once(self) -> None:
        batches = await self._listener.getmany(timeout_ms=200, max_records=1000)
        for records in batches.values():
            for record in records:
                headers = dict(record.headers or ())
                intent_id = headers.get(INTENT_ID_HEADER, b"").decode()
                if not self.outcomes.is_waiting(intent_id):
                    continue  # decoded only for a caller here (a Started tells it: running)
                try:
                    event = self._wire.decode(record.value or b"")
                except CodecError as exc:
                    log.error(
                        "undecodable outcome",
                        extra={"offset": record.offset, "error": str(exc)},
                    )
                    continue
                self.outcomes.publish([event])
