"""The Kafka -> PostgreSQL projector on faust-streaming (the alternative to
:class:`projections.projector.KafkaProjector`; ``bench/projector_faust.py`` compares the two).

:class:`FaustProjector` runs a :class:`faust.App` in the caller's event loop (``await start()`` /
``await stop()``; no ``faust worker`` process, no web server, in-memory store, no tables). One
agent reads ``outcomes`` and ``dead-letters`` as raw bytes, batches them with
``stream.take_events(batch_max, within=batch_within)`` and hands each batch to
:meth:`PostgresProjection.apply` with the Kafka positions, exactly as the aiokafka projector
does: the rows and the next offsets are written in one PostgreSQL transaction, and
PostgreSQL, not Kafka, holds the positions.

How faust is bent to that (faust 0.15, its aiokafka driver):

* **Where reading starts.** faust has no public "start from this offset" hook. After every
  rebalance its recovery service -- signalled from inside faust's assignment handling and
  running concurrently with the ``on_partitions_assigned`` signal -- calls
  ``Consumer.perform_seek()`` (seek to the offsets *committed in Kafka*) right before it
  resumes the streams, and ``Consumer.getmany`` calls it again whenever it polls while the
  flow is stopped. A seek done in an ``on_partitions_assigned`` handler races with it (both go
  through the consumer thread's method queue): measured with Kafka offsets committed past
  everything and an empty database, the handler's seek lost in 4 of 7 runs and the projector
  skipped every event. This module therefore replaces ``perform_seek`` on the app's consumer
  *instance* with one that seeks every assigned partition of the two topics to the position
  stored in PostgreSQL (``Consumer.seek_wait``, which also resets faust's read-offset filter).
  That is the only place faust repositions a stream partition, so each assignment starts at
  the stored position. It overrides a method faust calls internally: re-check it when faust
  is upgraded (``tests/integration/test_faust_projector.py`` fails without it).
* **Kafka commits are irrelevant.** faust still commits the offsets of acknowledged messages
  to Kafka (in exactly-once mode, through its per-partition transactions); nothing reads them
  back, and nothing may: ``take_events`` acknowledges a batch in a ``finally`` -- after the
  ``async for`` body applied it, but also when the body was cancelled (``stop()`` during an
  apply) -- so faust's committed offsets can pass records that were never applied.
* **processing_guarantee="exactly_once"**, deliberately, but *not* for what faust calls
  exactly-once: faust's transactions cover Kafka output and Kafka offsets, and this agent
  produces nothing and ignores Kafka offsets. It is chosen because it is the only mode in
  which faust's aiokafka consumer reads ``isolation_level="read_committed"``; with the default
  ``at_least_once`` it reads uncommitted records, and would project events from executor
  transactions that are later aborted (zombie writes). The price is one transactional
  producer per assigned partition, started on every assignment, whose begin/commit/abort
  errors faust only logs (see the Kafka notes) -- harmless here, since no correctness rests
  on them. ``exactly_once`` also needs ``app.in_worker`` (normally set by ``faust.Worker``);
  :meth:`FaustProjector.start` sets it.
* **No internal topics.** No tables (so no changelogs) and ``topic_disable_leader=True`` (no
  ``__assignor-__leader`` topic): the broker's ``auto.create.topics.enable=false`` never
  matters. ``topic_allow_declare=False``: faust does not try to create the two topics.
* **Errors.** PostgreSQL unavailable: the batch is retried in place (bounded exponential
  backoff, full jitter) -- the events are still in memory and unacknowledged, faust keeps
  heartbeating from its consumer thread. Any other :class:`ProjectionError`: the projector
  records it, applies nothing more (so no later batch can move a position past the failed
  one), and :meth:`caught_up` / :meth:`stop` raise it.

Differences from the aiokafka projector that remain: the positions written are "last record
read + 1" (faust does not expose the consumer position behind the records it has delivered),
so after a committed transaction the stored position rests on the commit marker, one short of
the last stable offset; :meth:`caught_up` looks past such markers with a group-less
``read_committed`` consumer. During a rebalance faust waits for the batch in flight
(``stream_wait_empty``), like the aiokafka projector's lock.

Stopping: ``stop()`` turns ``stream_wait_empty`` off just before ``App.stop()``. With it on,
faust 0.15.3 in exactly-once mode commits-and-ends its transactions twice while stopping; the
second ``send_offsets_to_transaction`` raises ``IllegalOperation`` ("Not in the middle of a
transaction"), which aborts the consumer's stop: its thread keeps running and the member stays
in the group (seen ``Stable`` 10 s after ``stop()`` returned), holding partitions nobody
processes. Without the wait the batch in flight is rolled back, as the aiokafka projector's
``stop()`` does.

Do not run a :class:`FaustProjector` and a :class:`KafkaProjector` in the same consumer group
at the same time: faust joins with its own assignor (protocol ``faust``), aiokafka with
``range``, and the broker rejects a member with no protocol in common
(``InconsistentGroupProtocol``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition

from toolledger.projections.postgres import ApplyResult, PostgresProjection, ProjectionError
from toolledger.projections.projector import Backoff, Batch, decode_batch
from toolledger.schemas.topics import Topics

__all__ = ["PROCESSING_GUARANTEE", "FaustProjector", "batch_of"]

log = logging.getLogger(__name__)

PROCESSING_GUARANTEE: Final = "exactly_once"
"""The only faust mode whose consumer reads ``read_committed`` (see the module docstring)."""

T = TypeVar("T")


def batch_of(topics: Topics, messages: Iterable[Any]) -> Batch:
    """The :class:`Batch` of faust messages (``event.message``) of ``outcomes`` and
    ``dead-letters``, in the order delivered (faust keeps the log order per partition), with
    ``next_offsets`` = last offset read + 1 for every partition read (dead-lettered outcomes and
    the dead-letters topic included)."""
    by_tp: dict[TopicPartition, list[Any]] = {}
    next_offsets: dict[tuple[str, int], int] = {}
    for message in messages:
        tp = TopicPartition(message.topic, message.partition)
        by_tp.setdefault(tp, []).append(message)
        key = (message.topic, message.partition)
        next_offsets[key] = max(next_offsets.get(key, 0), message.offset + 1)
    batch = decode_batch(topics, by_tp)
    batch.next_offsets = next_offsets
    return batch


class FaustProjector:
    """Keeps a :class:`PostgresProjection` up to date with the ``outcomes`` topic, on faust.

    ``name``: the faust app id, which is the Kafka consumer group and the consumer name of the
    positions in PostgreSQL; default ``topics.projector_group`` (the aiokafka projector's, so
    either can take over from the other's positions -- one at a time, see the module
    docstring). ``batch_max`` / ``batch_within``: ``stream.take_events`` arguments (at most
    that many records per ``apply``; a smaller batch after ``batch_within`` seconds).
    ``app_options`` are passed to :class:`faust.App` last (they override the defaults here).
    """

    def __init__(
        self,
        bootstrap: str,
        topics: Topics,
        projection: PostgresProjection,
        *,
        name: str | None = None,
        batch_max: int = 2000,
        batch_within: float = 0.1,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        app_options: Mapping[str, Any] | None = None,
    ) -> None:
        if batch_max < 1:
            raise ValueError("batch_max must be at least 1")
        if batch_within <= 0:
            raise ValueError("batch_within must be positive (faust stalls a partial batch)")
        self.topics = topics
        self.name = name or topics.projector_group
        """The faust app id = consumer group = consumer name of the positions in PostgreSQL."""
        self._bootstrap = bootstrap
        self._projection = projection
        self._batch_max = batch_max
        self._batch_within = batch_within
        self._backoff = Backoff(backoff_initial, backoff_max)
        self._app_options = dict(app_options or {})
        self._app: faust.App | None = None
        self._checker: Any = None  # group-less read_committed consumer for caught_up()
        self._datadir: tempfile.TemporaryDirectory[str] | None = None
        self._failure: Exception | None = None
        self.batches = 0
        """Batches applied (for tests and metrics)."""
        self.events_applied = 0
        """New events applied (redeliveries not counted)."""
        self.unavailable = 0
        """Times an apply failed because PostgreSQL was unavailable."""
        self.records_read = 0
        """Records faust delivered to the agent (redeliveries included)."""
        self.seeks = 0
        """Times the assigned partitions were sought to the stored positions."""
        self.sought: dict[tuple[str, int], int] = {}
        """(topic, partition) -> the position of the last seek (for tests)."""

    # ------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start the app in the running loop. Returns once the group is joined, the assigned
        partitions are sought to the stored positions and the agent is reading (faust's
        ``App.start`` waits for its recovery, which is where the seek happens)."""
        if self._app is not None:
            raise RuntimeError("the projector is already started")
        self._failure = None
        self._datadir = tempfile.TemporaryDirectory(prefix="toolledger-faust-")
        app = self._new_app(self._datadir.name)
        self._app = app
        self._checker = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            fetch_max_wait_ms=100,
        )
        try:
            await self._checker.start()
            await app.start()
        except BaseException:
            await self._teardown()
            raise
        if self._failure is not None:
            await self.stop()  # raises it

    def _new_app(self, datadir: str) -> faust.App:
        options: dict[str, Any] = {
            "broker": [f"kafka://{server.strip()}" for server in self._bootstrap.split(",")],
            "store": "memory://",
            "web_enabled": False,
            "processing_guarantee": PROCESSING_GUARANTEE,
            "topic_disable_leader": True,
            "topic_allow_declare": False,
            "consumer_auto_offset_reset": "earliest",
            "broker_max_poll_records": self._batch_max,
            "stream_buffer_maxsize": max(4096, 2 * self._batch_max),
            "autodiscover": False,
            "datadir": datadir,
            **self._app_options,
        }
        app = faust.App(self.name, loop=asyncio.get_running_loop(), **options)
        # exactly_once only takes effect "in a worker" (faust.Worker sets this flag); without
        # it the consumer reads uncommitted records.
        app.in_worker = True
        channel = app.topic(
            self.topics.outcomes,
            self.topics.dead_letters,
            key_serializer="raw",
            value_serializer="raw",
        )

        async def project(stream: Any) -> None:
            async for events in stream.take_events(self._batch_max, within=self._batch_within):
                if self._failure is not None:
                    continue  # stopped applying: nothing may move a position past the failure
                try:
                    await self._apply([event.message for event in events])
                except Exception as exc:
                    self._failure = exc
                    log.error("faust projector %s stopped applying", self.name, exc_info=exc)

        app.agent(channel, name=f"{self.name}.project", concurrency=1)(project)
        consumer = app.consumer
        # the override (see the module docstring); faust calls it, nothing else does
        consumer.perform_seek = self._perform_seek  # type: ignore[method-assign]
        if not consumer.in_transaction:  # fail loudly rather than read uncommitted records
            raise RuntimeError("faust's consumer would not read read_committed")
        return app

    async def stop(self) -> None:
        """Stop now (a batch being applied is rolled back and read again by the next owner).
        Raises the error the projector stopped applying with, if it did."""
        failure, self._failure = self._failure, None
        await self._teardown()
        if failure is not None:
            raise RuntimeError(f"the faust projector {self.name} stopped applying") from failure

    async def _teardown(self) -> None:
        app, self._app = self._app, None
        checker, self._checker = self._checker, None
        datadir, self._datadir = self._datadir, None
        try:
            if app is not None:
                # faust 0.15.3, exactly_once: with stream_wait_empty the app's stop commits and
                # ends the transactions twice; the second send_offsets_to_transaction raises
                # IllegalOperation, which aborts the consumer's stop: its thread keeps running
                # and stays in the group, holding partitions. Waiting for the batch in flight
                # buys nothing here (it is rolled back and read again by the next owner).
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # AlreadyConfiguredWarning
                    app.conf.stream_wait_empty = False
                await app.stop()
        finally:
            try:
                if checker is not None:
                    await checker.stop()
            finally:
                if datadir is not None:
                    datadir.cleanup()

    async def __aenter__(self) -> FaustProjector:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _check_running(self) -> faust.App:
        if self._app is None:
            raise RuntimeError("the projector is not running")
        if self._failure is not None:
            raise RuntimeError("the projector stopped with an error") from self._failure
        return self._app

    # --------------------------------------------------------------------------- seek

    async def _perform_seek(self) -> None:
        """Replaces faust's ``Consumer.perform_seek`` (seek to the offsets committed in
        Kafka): seek each assigned partition of the two topics to its stored position."""
        if self._app is None:
            return
        consumer = self._app.consumer
        mine = {self.topics.outcomes, self.topics.dead_letters}
        assigned = [tp for tp in consumer.assignment() if tp.topic in mine]
        if not assigned:
            return
        try:
            stored = {
                topic: await self._retrying(
                    f"read the positions of {topic}",
                    functools.partial(self._projection.positions, self.name, topic),
                )
                for topic in sorted({tp.topic for tp in assigned})
            }
        except Exception as exc:
            self._failure = exc
            raise
        targets = {tp: stored[tp.topic].get(tp.partition, 0) for tp in assigned}
        await consumer.seek_wait(targets)
        self.seeks += 1
        self.sought.update({(tp.topic, tp.partition): pos for tp, pos in targets.items()})
        log.info(
            "faust projector %s sought %s",
            self.name,
            ", ".join(f"{tp.topic}[{tp.partition}]@{pos}" for tp, pos in sorted(targets.items())),
        )

    # ------------------------------------------------------------------------- apply

    async def _apply(self, messages: Sequence[Any]) -> None:
        self.records_read += len(messages)
        batch = batch_of(self.topics, messages)
        if not batch:
            return

        async def apply() -> ApplyResult:
            return await self._projection.apply(
                batch.events,
                self.name,
                self.topics.outcomes,
                dead_letters=batch.dead_letters,
                next_offsets=batch.next_offsets,
            )

        result = await self._retrying("apply", apply, count_unavailable=True)
        self.batches += 1
        self.events_applied += result.new_events

    async def _retrying(
        self, what: str, op: Callable[[], Awaitable[T]], *, count_unavailable: bool = False
    ) -> T:
        """``op()`` until it does not raise a retriable :class:`ProjectionError`."""
        while True:
            try:
                result = await op()
            except ProjectionError as exc:
                if not exc.retriable:
                    raise
                if count_unavailable:
                    self.unavailable += 1
                log.warning("faust projector %s: %s: %s; retrying", self.name, what, exc)
                await self._backoff.sleep()
            else:
                self._backoff.reset()
                return result

    # ----------------------------------------------------------------------- caught up

    async def caught_up(self, *, settle_s: float = 2.0) -> bool:
        """Whether, for every partition of ``outcomes``, the position stored in PostgreSQL has
        reached the last stable offset, or only transaction markers and aborted records lie
        between the two (read with a group-less ``read_committed`` consumer, for at most
        ``settle_s`` seconds; ``False`` if that does not settle it)."""
        app = self._check_running()
        outcomes = self.topics.outcomes
        count = app.consumer.topic_partitions(outcomes) or self.topics.partitions
        partitions = [TopicPartition(outcomes, p) for p in range(count)]
        checker = self._checker
        end: dict[TopicPartition, int] = await checker.end_offsets(partitions)
        stored = await self._projection.positions(self.name, outcomes)
        behind = {
            tp: stored.get(tp.partition, 0)
            for tp in partitions
            if stored.get(tp.partition, 0) < end[tp]
        }
        if not behind:
            return True
        checker.assign(list(behind))
        for tp, position in behind.items():
            checker.seek(tp, position)
        deadline = time.monotonic() + settle_s
        try:
            while True:
                records = await checker.getmany(timeout_ms=100)
                if any(records.values()):
                    return False  # a committed record not applied yet
                if all([await checker.position(tp) >= end[tp] for tp in behind]):
                    return True
                if time.monotonic() > deadline:
                    return False
        finally:
            with contextlib.suppress(Exception):
                checker.unsubscribe()
