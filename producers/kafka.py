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


# how long a replaced producer may take to stop (its pending batches fail or are flushed)
RETIRE_WAIT_S = 10.0


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
        self._linger_ms = linger_ms
        self._producer = self._new_producer()
        self._renewing = asyncio.Lock()
        self._retired: set[asyncio.Task[None]] = set()  # failed producers being stopped
        self.renewals = 0  # producers replaced after a failed append
        self._listener = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        self._task: asyncio.Task[None] | None = None

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            enable_idempotence=True,
            acks="all",
            linger_ms=self._linger_ms,
        )

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
        producer = self._producer
        try:
            sent = [
                await producer.send(
                    self.topics.intents, value, key=key, partition=p, headers=headers
                )
                for p in partitions
            ]
        except KafkaError as exc:  # refused before it was sent (too large, buffer full)
            raise TransportError(f"appending to the log failed: {type(exc).__name__}") from exc
        try:
            await asyncio.gather(*sent)
        except KafkaError as exc:
            await self._renew(producer, exc)
            raise TransportError(f"appending to the log failed: {type(exc).__name__}") from exc

    async def _renew(self, failed: AIOKafkaProducer, error: KafkaError) -> None:
        """Replace the producer after one of its batches failed.

        An idempotent producer numbers its batches per partition; once a batch it sent has
        failed (aiokafka gives up on a batch whose partition had no leader for longer than
        the request timeout, e.g. through a broker restart), the broker refuses every later
        batch of that producer with OUT_OF_ORDER_SEQUENCE_NUMBER, for ever. A new producer has
        a new producer id and starts its numbering again. The callers of the failed appends
        hear PENDING and call again with the same key: the ledger runs a key at most once."""
        async with self._renewing:
            if self._producer is not failed:
                return  # another failed append renewed it already
            fresh = self._new_producer()
            try:
                await fresh.start()
            except BaseException as exc:
                self._retire(fresh)
                if not isinstance(exc, Exception):
                    raise  # cancelled
                log.warning(
                    "the intent producer could not be replaced; tried again at the next failure",
                    extra={"error": type(exc).__name__},
                )
                return
            self._producer = fresh
            self.renewals += 1
        log.warning(
            "the intent producer was replaced after a failed append",
            extra={"error": type(error).__name__},
        )
        self._retire(failed)

    def _retire(self, producer: AIOKafkaProducer) -> None:
        """Stop ``producer`` in the background (bounded)."""
        task = asyncio.create_task(_stop_quietly(producer))
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._retired):
            with contextlib.suppress(Exception):
                await task
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


async def _stop_quietly(producer: AIOKafkaProducer) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(producer.stop(), RETIRE_WAIT_S)
