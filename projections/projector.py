"""The Kafka -> PostgreSQL projector (docs/architecture.md#the-kafka-path and
docs/architecture.md#projections).

:class:`KafkaProjector` consumes the ``outcomes`` and ``dead-letters`` topics (``read_committed``:
only what the executor's transactions committed) in the consumer group
``topics.projector_group`` and applies each batch to a :class:`PostgresProjection` in one
PostgreSQL transaction, together with the consumer positions. PostgreSQL, not Kafka, holds the
positions: on assignment each partition is sought to the position stored there (0 if none), so
a crash anywhere neither skips an event nor applies one twice (the ``event_id`` dedupe of the
projection covers a batch whose commit outcome is unknown). No offsets are committed to Kafka.

While PostgreSQL is unavailable the projector seeks back to the stored positions and backs off
(bounded exponential, full jitter), then reads and applies the same records again; it keeps
polling meanwhile, so the group does not evict it, and catches up when the database returns.

:func:`rebuild` (``toolledger replay``) empties the projection and re-reads both topics from the
beginning to their current end. Stop the projectors first: a projector applying events while
the tables are being rebuilt would fold them onto an empty state.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from toolledger.projections.postgres import (
    ApplyResult,
    PostgresProjection,
    ProjectionError,
    ProjectionUnavailable,
)
from toolledger.projections.rows import Position
from toolledger.schemas.cloudevents import Header
from toolledger.schemas.codec import CodecError
from toolledger.schemas.dead_letters import DeadLetterRecord, UnreadableDeadLetter
from toolledger.schemas.events import Event, ToolCallRequested
from toolledger.schemas.topics import Topics
from toolledger.schemas.wire import SINGLE_OBJECT, WireFormat

__all__ = [
    "Batch",
    "KafkaProjector",
    "RebuildResult",
    "decode_batch",
    "rebuild",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


# ------------------------------------------------------------------------------ batches


@dataclass(slots=True)
class Batch:
    """What one poll of the two topics becomes: the arguments of one ``apply``."""

    events: list[tuple[Event, Position]] = field(default_factory=list)
    dead_letters: list[DeadLetterRecord] = field(default_factory=list)
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.events or self.dead_letters or self.next_offsets)


def decode_batch(
    topics: Topics,
    records: Mapping[TopicPartition, Iterable[Any]],
    wire: WireFormat = SINGLE_OBJECT,
) -> Batch:
    """Decode polled records (aiokafka ``ConsumerRecord`` s) of ``outcomes`` and
    ``dead-letters``. Nothing here raises for bad data: an undecodable outcome, or an event
    that does not belong on the outcomes topic, becomes a dead letter at its own position."""
    batch = Batch()
    for tp, recs in records.items():
        for record in recs:
            if tp.topic == topics.outcomes:
                item = _outcome(topics, record, wire)
                if isinstance(item, DeadLetterRecord):
                    batch.dead_letters.append(item)
                else:
                    batch.events.append((item, Position(record.partition, record.offset)))
            elif tp.topic == topics.dead_letters:
                batch.dead_letters.append(_dead_letter(topics, record))
    return batch


def _outcome(topics: Topics, record: Any, wire: WireFormat) -> Event | DeadLetterRecord:
    value: bytes = record.value or b""

    def dead(reason: str) -> DeadLetterRecord:
        return DeadLetterRecord(
            topics.outcomes,
            record.partition,
            record.offset,
            reason,
            record.key,
            record.value,
            _headers(record),
        )

    try:
        event = wire.decode(value)
    except CodecError as exc:
        return dead(f"undecodable outcome record: {exc}")
    if isinstance(event, ToolCallRequested):  # raw arguments: never into the audit trail
        return dead("unexpected ToolCallRequested on the outcomes stream")
    return event


def _headers(record: Any) -> tuple[Header, ...]:
    """A polled record's headers (aiokafka gives pairs, faust a mapping or pairs)."""
    headers = record.headers or ()
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    return tuple((str(name), bytes(value)) for name, value in pairs)


def _dead_letter(topics: Topics, record: Any) -> DeadLetterRecord:
    """The executor's dead letter (:mod:`schemas.dead_letters`), stored at the position of
    the record it holds; one whose headers do not say where that was is stored at its own
    position on the dead-letters topic, whole."""
    headers = _headers(record)
    try:
        return DeadLetterRecord.from_kafka(record.key, record.value, headers)
    except UnreadableDeadLetter as exc:
        return DeadLetterRecord(
            topics.dead_letters,
            record.partition,
            record.offset,
            str(exc),
            record.key,
            record.value,
            headers,
        )


async def _positions(
    consumer: Any, partitions: Iterable[TopicPartition]
) -> dict[TopicPartition, int]:
    """The consumer's position in each partition: past everything getmany has returned, and
    past transaction markers and aborted records, which a ``read_committed`` read skips."""
    return {tp: await consumer.position(tp) for tp in partitions}


# -------------------------------------------------------------------------------- backoff


class Backoff:
    """Bounded exponential backoff with full jitter."""

    def __init__(self, initial: float, maximum: float) -> None:
        self._initial = initial
        self._maximum = maximum
        self._next = initial

    def reset(self) -> None:
        self._next = self._initial

    async def sleep(self) -> None:
        delay = random.uniform(0, self._next)
        self._next = min(self._next * 2, self._maximum)
        await asyncio.sleep(delay)


async def _retrying(what: str, op: Callable[[], Awaitable[T]], backoff: Backoff) -> T:
    """``op()`` until it does not raise a retriable :class:`ProjectionError`."""
    while True:
        try:
            result = await op()
        except ProjectionError as exc:
            if not exc.retriable:
                raise
            log.warning("%s: %s; retrying", what, exc)
            await backoff.sleep()
        else:
            backoff.reset()
            return result


# ------------------------------------------------------------------------------ projector


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    def __init__(self, projector: KafkaProjector) -> None:
        self._projector = projector

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._projector._revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._projector._assigned(assigned)


class KafkaProjector:
    """Keeps a :class:`PostgresProjection` up to date with the ``outcomes`` topic.

    Several projectors may run in the group; each applies the partitions it is assigned.
    ``consumer_options`` are passed to ``AIOKafkaConsumer`` (e.g. timeouts).
    """

    def __init__(
        self,
        bootstrap: str,
        topics: Topics,
        projection: PostgresProjection,
        *,
        batch_max: int = 2000,
        poll_timeout_ms: int = 500,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        consumer_options: Mapping[str, Any] | None = None,
        wire: WireFormat = SINGLE_OBJECT,
    ) -> None:
        """``wire``: the framing of the outcome events (:mod:`schemas.wire`); the
        single-object encoding is read whatever it is."""
        if batch_max < 1:
            raise ValueError("batch_max must be at least 1")
        self.topics = topics
        self.name = topics.projector_group
        """The consumer name of the positions in PostgreSQL (the group id)."""
        self._projection = projection
        self._wire = wire
        self._batch_max = batch_max
        self._poll_timeout_ms = poll_timeout_ms
        self._backoff = Backoff(backoff_initial, backoff_max)
        self._consumer_config: dict[str, Any] = {
            "bootstrap_servers": bootstrap,
            "group_id": topics.projector_group,
            "enable_auto_commit": False,  # PostgreSQL holds the positions
            "isolation_level": "read_committed",
            "auto_offset_reset": "earliest",
            **(consumer_options or {}),
        }
        self._consumer: Any = None
        self._lock = asyncio.Lock()  # one batch at a time; a rebalance waits for it
        self._stored: dict[TopicPartition, int] = {}  # assigned partition -> stored position
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._failure: Exception | None = None
        self.batches = 0
        """Batches applied (for tests and metrics)."""
        self.events_applied = 0
        """New events applied (redeliveries not counted)."""
        self.unavailable = 0
        """Times an apply failed because PostgreSQL was unavailable."""
        self.assigned = asyncio.Event()
        """Set once a rebalance assigned partitions (possibly none) and they were sought to
        the positions PostgreSQL holds."""

    # ------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("the projector is already started")
        self._stopping = False
        self._failure = None
        self._stored.clear()
        self.assigned.clear()
        self._consumer = AIOKafkaConsumer(**self._consumer_config)
        self._consumer.subscribe(
            [self.topics.outcomes, self.topics.dead_letters], listener=_Listener(self)
        )
        await self._consumer.start()
        self._task = asyncio.create_task(self._run(), name=f"projector {self.name}")
        self._task.add_done_callback(self._log_exit)

    def _log_exit(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("projector %s stopped", self.name, exc_info=task.exception())

    async def stop(self) -> None:
        """Stop now. A batch being applied is rolled back, and read again by the next owner.
        Raises the error the projector stopped with, if it did."""
        self._stopping = True
        task, self._task = self._task, None
        try:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        finally:
            if self._consumer is not None:
                await self._consumer.stop()

    async def __aenter__(self) -> KafkaProjector:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _check_running(self) -> None:
        if self._task is None:
            raise RuntimeError("the projector is not running")
        if self._task.done() and not self._task.cancelled():
            exc = self._task.exception()
            raise RuntimeError("the projector stopped with an error") from exc

    async def caught_up(self) -> bool:
        """Whether, for every partition of ``outcomes``, the position stored in PostgreSQL has
        reached the end offset (``read_committed``: the last stable offset)."""
        self._check_running()
        outcomes = self.topics.outcomes
        partitions = self._consumer.partitions_for_topic(outcomes)
        if not partitions:
            return False
        end = await self._consumer.end_offsets([TopicPartition(outcomes, p) for p in partitions])
        try:
            stored = await self._projection.positions(self.name, outcomes)
        except ProjectionUnavailable:
            return False  # the database is away: not caught up (the loop retries the batch)
        return all(stored.get(tp.partition, 0) >= offset for tp, offset in end.items())

    @property
    def positions(self) -> dict[TopicPartition, int]:
        """The assigned partitions and their positions: what is applied of each."""
        return dict(self._stored)

    # -------------------------------------------------------------------- rebalance

    async def _revoked(self, revoked: set[TopicPartition]) -> None:
        async with self._lock:  # let the batch in flight finish before another owner starts
            for tp in revoked:
                self._stored.pop(tp, None)

    async def _assigned(self, assigned: set[TopicPartition]) -> None:
        async with self._lock:
            by_topic: dict[str, dict[int, int]] = {}
            try:
                for topic in {tp.topic for tp in assigned}:
                    by_topic[topic] = await _retrying(
                        f"read the positions of {topic}",
                        functools.partial(self._projection.positions, self.name, topic),
                        self._backoff,
                    )
            except Exception as exc:  # aiokafka would only log it: stop the loop instead
                self._failure = exc
                raise
            for tp in assigned:
                position = by_topic[tp.topic].get(tp.partition, 0)
                self._consumer.seek(tp, position)
                self._stored[tp] = position
            log.info("projector %s assigned %s", self.name, sorted(map(str, assigned)))
            self.assigned.set()

    # ------------------------------------------------------------------------- loop

    async def _run(self) -> None:
        consumer = self._consumer
        while not self._stopping:
            records = await consumer.getmany(
                timeout_ms=self._poll_timeout_ms, max_records=self._batch_max
            )
            if self._failure is not None:
                raise self._failure
            async with self._lock:
                if await self._apply(records):
                    continue
            await self._backoff.sleep()

    async def _apply(self, records: Mapping[TopicPartition, list[Any]]) -> bool:
        """Apply what was polled; False when PostgreSQL was unavailable (sought back)."""
        # assigned and sought: records of partitions being reassigned are left to their owner
        owned = set(self._stored) & set(self._consumer.assignment())
        batch = decode_batch(
            self.topics, {tp: r for tp, r in records.items() if tp in owned}, self._wire
        )
        moved = {
            tp: pos
            for tp, pos in (await _positions(self._consumer, owned)).items()
            if pos != self._stored[tp]
        }
        batch.next_offsets = {(tp.topic, tp.partition): pos for tp, pos in moved.items()}
        if not batch:
            return True
        try:
            result: ApplyResult = await self._projection.apply(
                batch.events,
                self.name,
                self.topics.outcomes,
                dead_letters=batch.dead_letters,
                next_offsets=batch.next_offsets,
            )
        except ProjectionError as exc:
            if not exc.retriable:
                raise
            self.unavailable += 1
            log.warning("projector %s: %s; backing off, will re-read the batch", self.name, exc)
            for tp, position in self._stored.items():  # re-read from what PostgreSQL holds
                self._consumer.seek(tp, position)
            return False
        self._stored.update(moved)
        self.batches += 1
        self.events_applied += result.new_events
        self._backoff.reset()
        return True


# -------------------------------------------------------------------------------- rebuild


async def _partitions(bootstrap: str, names: list[str]) -> list[TopicPartition]:
    """Every partition of the topics ``names``, which must exist."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(names)
    finally:
        await admin.close()
    partitions = []
    for topic in described:
        if topic["error_code"] or not topic["partitions"]:
            raise RuntimeError(
                f"topic {topic['topic']} cannot be read (error {topic['error_code']})"
            )
        partitions += [TopicPartition(topic["topic"], p["partition"]) for p in topic["partitions"]]
    return sorted(partitions)


@dataclass(frozen=True, slots=True)
class RebuildResult:
    events: int  # outcome events applied
    dead_letters: int
    end_offsets: Mapping[tuple[str, int], int]


async def rebuild(
    bootstrap: str,
    topics: Topics,
    projection: PostgresProjection,
    *,
    batch_max: int = 2000,
    backoff_initial: float = 0.1,
    backoff_max: float = 5.0,
    consumer_options: Mapping[str, Any] | None = None,
    wire: WireFormat = SINGLE_OBJECT,
) -> RebuildResult:
    """Empty the projection and re-apply ``outcomes`` and ``dead-letters`` from the beginning
    to their end offsets (as of the start), writing the positions of the projector group, so a
    projector started afterwards continues from there. Stop the projectors before calling."""
    backoff = Backoff(backoff_initial, backoff_max)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        **dict(consumer_options or {}),
    )
    partitions = await _partitions(bootstrap, [topics.outcomes, topics.dead_letters])
    await consumer.start()
    try:
        consumer.assign(partitions)
        end: dict[TopicPartition, int] = await consumer.end_offsets(partitions)
        await _retrying("reset the projection", projection.reset, backoff)
        await consumer.seek_to_beginning(*partitions)
        events = dead = 0
        stored = dict.fromkeys(partitions, 0)
        pending = {tp for tp in partitions if end[tp] > 0}
        while pending:
            records = await consumer.getmany(*pending, timeout_ms=500, max_records=batch_max)
            batch = decode_batch(topics, records, wire)
            moved = {
                tp: pos
                for tp, pos in (await _positions(consumer, pending)).items()
                if pos != stored[tp]
            }
            batch.next_offsets = {(tp.topic, tp.partition): pos for tp, pos in moved.items()}
            if batch:
                result = await _retrying(
                    "rebuild",
                    functools.partial(
                        projection.apply,
                        batch.events,
                        topics.projector_group,
                        topics.outcomes,
                        dead_letters=batch.dead_letters,
                        next_offsets=batch.next_offsets,
                    ),
                    backoff,
                )
                events += result.new_events
                dead += len(batch.dead_letters)
                stored.update(moved)
            pending = {tp for tp in pending if stored[tp] < end[tp]}
        return RebuildResult(
            events, dead, {(tp.topic, tp.partition): offset for tp, offset in end.items()}
        )
    finally:
        await consumer.stop()
