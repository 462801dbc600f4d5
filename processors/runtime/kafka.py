"""The executor on Kafka (aiokafka): one transactional producer per owned intents partition.

Executor invariant, as kept here:

    A tool handler runs for a call key only after a ``ToolCallStarted`` for that key has been
    committed by the current owner of its partition. On taking over a partition, a key found
    PENDING with no terminal event becomes UNKNOWN and goes to reconcile; it is never re-run
    blind.

* ``transactional_id = <group>-<partition>``: a new owner's ``init_transactions`` bumps the
  producer epoch, aborts the old owner's open transaction and fences it: the zombie's next
  commit fails, and a worker whose commit failed stops before calling any handler.
* one transaction per decision pass of the executor core (:mod:`processors.executor`): the
  outcomes of the actions that finished since the last pass, the Started events and answers
  of the intents decided in this one, the call states (compacted ``state`` topic) and the
  offsets of the intents decided (``send_offsets_to_transaction``). An intent's offset is
  committed with its Started event: after a crash it is not read again, and the new owner
  recovers its PENDING state as UNKNOWN (then reconcile).
* state is restored on assignment from the ``state`` topic into a local store on disk
  (:mod:`processors.runtime.local_store`), from the store's checkpoint, read
  ``read_committed`` *after* ``init_transactions``, so nothing the previous owner left open
  can be read; the worker holds only a bounded working set of it in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import sqlite3
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from toolledger.processors.executor import DEFAULT_CONCURRENCY, Executor, ExecutorStopped
from toolledger.processors.key_cache import DEFAULT_CACHE_ENTRIES
from toolledger.processors.pipeline import Stages
from toolledger.processors.ports import CommitBatch, KeyEntry, Snapshot
from toolledger.processors.runtime.local_store import TOMBSTONE_HORIZON_S, LocalStore, StoreBusy
from toolledger.processors.runtime.snapshot import topic_pairs
from toolledger.processors.runtime.state_table import StateMeta, state_meta
from toolledger.schemas.codec import CodecError
from toolledger.schemas.dead_letters import DeadLetterRecord
from toolledger.schemas.events import Event, answers_intent
from toolledger.schemas.topics import ANSWER_HEADER, INTENT_ID_HEADER, Topics
from toolledger.schemas.wire import SINGLE_OBJECT, WireFormat

log = logging.getLogger("toolledger.kafka")


class KafkaStore:
    """A partition's store on Kafka: the transaction is the truth; the local store follows it
    once it committed (and is what the executor reads)."""

    def __init__(
        self,
        producer: AIOKafkaProducer,
        topics: Topics,
        partition: int,
        local: LocalStore,
        position: int,
        wire: WireFormat = SINGLE_OBJECT,
    ) -> None:
        self._producer = producer
        self._topics = topics
        self._partition = partition
        self._local = local
        self._position = position
        self._wire = wire
        self._committed_offset: int | None = None

    def load(self) -> Snapshot:
        snapshot = self._local.live()
        snapshot.positions[self._partition] = self._position
        return snapshot

    def read(self, keys: Sequence[str]) -> Mapping[str, KeyEntry]:
        return self._local.read(keys)

    def due(
        self, tool: str, settled_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[tuple[float, str]]:
        return self._local.due(tool, settled_before, after, limit)

    async def commit(self, batch: CommitBatch) -> None:
        """One transaction: the outcomes, the state records, the dead letters and the input
        position. Bounded by :data:`COMMIT_DEADLINE_S`: a transaction that does not end (a
        coordinator that never answers) raises ``TimeoutError``, so the executor stops and
        the partition is taken over again, as after a crash; the new producer's
        ``init_transactions`` settles whatever this one left open."""
        producer, topics, p = self._producer, self._topics, self._partition
        await producer.begin_transaction()
        pairs: list[tuple[str, bytes | None, StateMeta | None]] = []
        try:
            async with asyncio.timeout(COMMIT_DEADLINE_S):
                # Records go in as whole batches, one per topic (more only past MAX_BATCH_BYTES):
                # one future and one accumulator entry per batch, not per record. They are in
                # the transaction all the same: the sender adds their partitions to it, and the
                # commit below waits for every batch to be acknowledged.
                outcomes = _Batches(producer, topics.outcomes, p)
                for event in batch.events:
                    event_key, event_value, headers = self._wire.record(event)
                    headers.append((INTENT_ID_HEADER, event.intent_id.encode("utf-8")))
                    headers.append((ANSWER_HEADER, b"1" if answers_intent(event) else b"0"))
                    await outcomes.append(event_key, event_value, headers)
                states = _Batches(producer, topics.state, p)
                for key, text in topic_pairs(batch, p):  # tombstones for expired keys: compaction
                    state = batch.states.get(key) if text is not None else None
                    meta = None if state is None else state_meta(state)
                    value = None if text is None else text.encode("utf-8")
                    pairs.append((key, value, meta))
                    await states.append(
                        key.encode("utf-8"), value, [] if meta is None else meta_headers(meta)
                    )
                letters = _Batches(producer, topics.dead_letters, p)
                for letter in batch.dead_letters:  # the original record, with Connect's headers
                    dead = DeadLetterRecord(
                        topics.intents,
                        p,
                        -1 if letter.offset is None else letter.offset,
                        letter.reason,
                        letter.key,
                        letter.value,
                        letter.headers,
                    )
                    await letters.append(dead.key, dead.value, dead.kafka_headers())
                for batches in (outcomes, states, letters):
                    await batches.flush()
                next_offset = batch.positions.get(p)
                if next_offset is not None and next_offset != self._committed_offset:
                    await producer.send_offsets_to_transaction(
                        {TopicPartition(topics.intents, p): next_offset}, topics.executor_group
                    )
                await producer.commit_transaction()
        except BaseException:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await producer.abort_transaction()
            raise
        if next_offset is not None:
            self._committed_offset = next_offset
        # committed: every batch was acknowledged, so the offsets of the state records are known
        last = states.last_offset()
        # the local store takes the same pairs, as a restore would read them
        self._local.apply(pairs, None if last is None else last + 1)


# How long one commit may take before the partition is given up and taken over again: the
# producer's transaction timeout (aiokafka's default, 60 s), past which the broker aborts it
COMMIT_DEADLINE_S = 60.0
# How long an abort or a producer's stop may take while a partition is given up (a producer
# whose coordinator never answers would otherwise hold the release, and the rebalance, for ever)
CLOSE_WAIT_S = 10.0
# Upper bound of one record batch of a transaction (a single larger record still goes alone;
# the broker's message.max.bytes, 1 MiB by default, bounds what it accepts).
MAX_BATCH_BYTES = 512 * 1024
RESTORE_CHUNK_BYTES = 16 << 20  # of state records per restore transaction (two in memory)


class _Batches:
    """The records of one commit to one topic partition, as few record batches as fit."""

    def __init__(self, producer: AIOKafkaProducer, topic: str, partition: int) -> None:
        self._producer, self._topic, self._partition = producer, topic, partition
        self._open: Any = None  # the BatchBuilder being filled
        self._sent: list[tuple[asyncio.Future[Any], int]] = []  # (its future, its records)

    async def append(
        self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
    ) -> None:
        if self._open is None:
            self._open = self._producer.create_batch()
        if self._open.append(timestamp=None, key=key, value=value, headers=headers) is None:
            await self.flush()  # full: send it, start the next one with this record
            self._open = self._producer.create_batch()
            self._open.append(timestamp=None, key=key, value=value, headers=headers)

    async def flush(self) -> None:
        if self._open is None or self._open.record_count() == 0:
            return
        builder, self._open = self._open, None
        count = builder.record_count()
        future = await self._producer.send_batch(builder, self._topic, partition=self._partition)
        self._sent.append((future, count))

    def last_offset(self) -> int | None:
        """The offset of the last record, once every batch was acknowledged."""
        if not self._sent:
            return None
        future, count = self._sent[-1]
        return int(future.result().offset) + count - 1


async def restore_local(bootstrap: str, topics: Topics, local: LocalStore) -> int:
    """Bring the local store up to the end (last stable offset) of its partition of the
    state topic, from its checkpoint; returns how many records were read.

    A store that has read nothing (a takeover on a new host, or a store rebuilt) is loaded
    cold: the whole partition into a new file, indexed once at the end, which then replaces
    the store (:meth:`LocalStore.cold_load`). Otherwise the tail is applied in chunks of
    about :data:`RESTORE_CHUNK_BYTES`, each one transaction with the offset after it (a
    crash loses at most the chunk in flight: the checkpoint says where to go on). Either
    way a chunk is written in a thread while the next one is fetched."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        tp = TopicPartition(topics.state, local.identity_partition)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        begin = (await consumer.beginning_offsets([tp]))[tp]
        if local.checkpoint > end:
            local.rebuild(f"its checkpoint {local.checkpoint} is past the topic's end {end}")
        elif 0 < local.checkpoint < begin:
            local.rebuild(f"its checkpoint {local.checkpoint} is before the topic's start {begin}")
        elif local.checkpoint > 0 and local.checkpoint_age_s > TOMBSTONE_HORIZON_S:
            local.rebuild(
                f"it last read the topic {local.checkpoint_age_s / 3600:.0f} h ago: tombstones "
                "of keys expired since may have been compacted away"
            )
        consumer.seek(tp, max(local.checkpoint, begin))
        if local.checkpoint == 0 and end > begin:
            load = local.cold_load()
            try:
                read, position = await _apply_chunks(
                    consumer, tp, end, lambda pairs, _position: load.add(pairs)
                )
                await asyncio.to_thread(local.adopt, load, position)
            except BaseException:
                load.abort()
                raise
            return read
        with local.bulk():
            read, _ = await _apply_chunks(consumer, tp, end, local.apply)
        return read
    finally:
        await consumer.stop()


_Pairs = list[tuple[str, bytes | None, StateMeta | None]]


async def _apply_chunks(
    consumer: AIOKafkaConsumer,
    tp: TopicPartition,
    end: int,
    apply: Callable[[_Pairs, int], None],
) -> tuple[int, int]:
    """Fetch the partition up to ``end`` in chunks and ``apply(pairs, position after them)``
    each in a thread while the next is fetched (one in flight: memory holds two at most);
    returns the records read and the position reached."""
    read = 0
    position = await consumer.position(tp)
    applying: asyncio.Future[None] | None = None
    while position < end or applying is not None:
        pairs, records, after = await _state_chunk(consumer, tp, end)
        read += records
        if applying is not None:
            await applying
            applying = None
        if pairs or after > position:
            applying = asyncio.ensure_future(asyncio.to_thread(apply, pairs, after))
        position = after
    return read, position


async def _state_chunk(
    consumer: AIOKafkaConsumer, tp: TopicPartition, end: int
) -> tuple[_Pairs, int, int]:
    """State records from the consumer's position, up to ``end`` or about
    :data:`RESTORE_CHUNK_BYTES`, as pairs; returns them, how many records were read (with
    those that carry no key) and the position after them. Each fetch is made pairs as it
    comes (a whole chunk at once would hold the loop, and the fetches it has in flight)."""
    pairs: _Pairs = []
    read = size = 0
    position = await consumer.position(tp)
    while position < end and size < RESTORE_CHUNK_BYTES:
        records = (await consumer.getmany(tp, timeout_ms=500)).get(tp, [])
        pairs += [
            (r.key.decode("utf-8"), r.value, meta_of_headers(r.headers))
            for r in records
            if r.key is not None
        ]
        size += sum(r.serialized_value_size for r in records)
        read += len(records)
        position = await consumer.position(tp)
    return pairs, read, position


# A state record's row fields, so that a restore into a local store need not parse its JSON.
TOOL_HEADER = "tl-tool"
SETTLED_HEADER = "tl-settled"


def meta_headers(meta: StateMeta) -> list[tuple[str, bytes]]:
    tool, settled = meta
    return [
        (TOOL_HEADER, tool.encode("utf-8")),
        (SETTLED_HEADER, b"" if settled is None else repr(settled).encode("ascii")),
    ]


def meta_of_headers(headers: Sequence[tuple[str, bytes]] | None) -> StateMeta | None:
    tool = settled = None
    for name, value in headers or ():  # once per record of a restore: no dict
        if name == TOOL_HEADER:
            tool = value
        elif name == SETTLED_HEADER:
            settled = value
    if tool is None or settled is None:
        return None
    return tool.decode("utf-8"), float(settled) if settled else None


def _local_store_failed(exc: BaseException | None) -> bool:
    """Whether a worker's failure came from its local store (SQLite), by the cause chain."""
    for _ in range(8):
        if exc is None:
            return False
        if isinstance(exc, sqlite3.DatabaseError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


async def cluster_id(bootstrap: str) -> str:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return str((await admin.describe_cluster())["cluster_id"])
    finally:
        await admin.close()


class _Owned:
    def __init__(self, producer: AIOKafkaProducer, executor: Executor, local: LocalStore) -> None:
        self.producer = producer
        self.executor = executor
        self.local = local


def default_state_dir(group: str) -> Path:
    """Where an executor keeps its local stores unless told: a directory per user and
    consumer group under the system's temporary directory (as Kafka Streams' default
    ``state.dir``), so a restart on the same host reads only the state topic's tail without
    any setting. Stores are locked while open (:class:`StoreBusy`): executors of a group may
    share it. The stores hold call states and results: see :func:`private_state_dir`."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", group)
    return Path(tempfile.gettempdir()) / f"toolledger-state-{os.getuid()}" / safe


def private_state_dir(path: Path) -> Path:
    """``path`` made (``0700``) or checked as this user's own and closed to others: a shared
    temporary directory must not let another user read the stores or plant one."""
    for directory in (path.parent, path):  # mkdir(parents=True) would not apply the mode
        directory.mkdir(mode=0o700, exist_ok=True)
    for directory in (path.parent, path):
        info = directory.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise PermissionError(
                f"{directory} is not this user's own private directory (owner uid "
                f"{info.st_uid}, mode {oct(info.st_mode & 0o777)}): pass --state-dir"
            )
    return path


class KafkaExecutor:
    def __init__(
        self,
        bootstrap: str,
        topics: Topics,
        stages: Stages,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        session_timeout_ms: int = 30_000,
        sweep_interval_s: float = 1.0,
        on_committed: Callable[[Sequence[Event]], None] | None = None,
        client_id: str = "toolledger-executor",
        state_dir: Path | None = None,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
        wire: WireFormat = SINGLE_OBJECT,
    ) -> None:
        """``state_dir``: where the local stores of owned partitions live, kept across
        restarts (None: :func:`default_state_dir`, one directory per consumer group on this
        host). ``cache_entries``: call keys held in memory by all partitions together.
        ``wire``: the framing of the records it reads and writes (:mod:`schemas.wire`)."""
        self.bootstrap = bootstrap
        self._wire = wire
        self.topics = topics
        self._stages = stages
        self._concurrency = concurrency
        self._session_timeout_ms = session_timeout_ms
        self._sweep_interval_s = sweep_interval_s
        self._on_committed = on_committed
        self._client_id = client_id
        longest = max((tool.timeout_s for tool in stages.registry), default=0.0)
        self._longest_timeout_s = longest
        if longest * 1000 >= session_timeout_ms:
            # A paused owner's in-flight handler must be past its deadline before another
            # owner can take the partition over (one session timeout) and run the call again.
            raise ValueError(
                f"session_timeout_ms={session_timeout_ms} must exceed the longest tool timeout "
                f"({longest:g} s)"
            )
        self.state_dir = (
            Path(state_dir)
            if state_dir is not None
            else private_state_dir(default_state_dir(topics.executor_group))
        )
        # stores of partitions whose store in state_dir was open elsewhere (see _open_store)
        self._private_dir: tempfile.TemporaryDirectory[str] | None = None
        self._cache_entries = max(1, cache_entries // topics.partitions)
        self._cluster_id: str | None = None
        self.restored: dict[int, int] = {}  # state records read by the last takeover, by partition
        self._damaged: set[int] = set()
        self.owned: dict[int, _Owned] = {}
        self._unowned: set[int] = set()
        self._consumer: AIOKafkaConsumer | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.assigned = asyncio.Event()

    async def start(self) -> None:
        self._cluster_id = await cluster_id(self.bootstrap)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.topics.executor_group,
            client_id=self._client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=self._session_timeout_ms,
            heartbeat_interval_ms=max(100, self._session_timeout_ms // 5),
            max_poll_interval_ms=max(
                60_000, self._session_timeout_ms * 3, int((self._longest_timeout_s + 5) * 2000)
            ),
        )
        await self._consumer.start()
        self._consumer.subscribe([self.topics.intents], listener=_Listener(self))
        self._loop_task = asyncio.create_task(self._run())

    async def stop(self, *, drain_s: float | None = None) -> None:
        """Graceful: stop reading, let running calls finish (bounded), release partitions."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        await self._release(list(self.owned), drain_s=drain_s)
        if self._consumer is not None:
            await self._consumer.stop()
        self._cleanup()

    def _cleanup(self) -> None:
        if self._private_dir is not None:
            self._private_dir.cleanup()
            self._private_dir = None

    async def drain(self) -> None:
        for owned in list(self.owned.values()):
            await owned.executor.drain()

    async def caught_up(self) -> bool:
        """Every intent appended so far to the partitions this executor owns is processed."""
        if self._consumer is None or not self.owned:
            return False
        tps = [TopicPartition(self.topics.intents, p) for p in self.owned]
        ends = await self._consumer.end_offsets(tps)
        return all(
            self.owned[tp.partition].executor.position(tp.partition) >= end
            for tp, end in ends.items()
            if tp.partition in self.owned
        )

    # -- assignment ---------------------------------------------------------------------------

    async def _acquire(self, partitions: Sequence[int]) -> None:
        """Take partitions over; one that cannot be taken now is retried by the loop."""
        async with self._lock:
            assert self._consumer is not None
            assigned = {
                tp.partition
                for tp in self._consumer.assignment()
                if tp.topic == self.topics.intents
            }
            for p in partitions:
                if p in self.owned or p not in assigned:
                    continue  # taking over a partition not assigned to us would fence its owner
                try:
                    self.owned[p] = await self._take_over(p)
                    self._unowned.discard(p)
                except Exception as exc:
                    self._unowned.add(p)
                    log.warning(
                        "could not take a partition over; will retry",
                        extra={"partition": p, "error": type(exc).__name__},
                    )
        if self.owned:
            self.assigned.set()

    async def _take_over(self, p: int) -> _Owned:
        assert self._consumer is not None
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=f"{self._client_id}-p{p}",
            transactional_id=f"{self.topics.executor_group}-{p}",
            enable_idempotence=True,
            acks="all",
            linger_ms=2,
            max_batch_size=MAX_BATCH_BYTES,
            # the broker answers a produce racing AddPartitionsToTxn with a retriable error;
            # the default 100 ms backoff stalls the whole partition for that long
            retry_backoff_ms=10,
        )
        await producer.start()  # init_transactions: fences the previous owner
        executor: Executor | None = None
        local: LocalStore | None = None
        try:
            local = self._open_store(p)
            if p in self._damaged:
                local.rebuild("a read or write of it failed")
                self._damaged.discard(p)
            # read after init_transactions: nothing the previous owner left open is read
            try:
                self.restored[p] = await restore_local(self.bootstrap, self.topics, local)
            except sqlite3.DatabaseError as exc:  # a damaged cache: made again from the topic
                local.rebuild(f"it cannot be read ({exc})")
                self.restored[p] = await restore_local(self.bootstrap, self.topics, local)
            tp = TopicPartition(self.topics.intents, p)
            position = await self._consumer.committed(tp) or 0
            store = KafkaStore(producer, self.topics, p, local, position, self._wire)
            executor = Executor(
                [p],
                store,
                self._stages,
                store.commit,
                partition_of=lambda _key: p,
                epoch=int(time.time() * 1000),
                clock=self._stages.clock,
                on_committed=self._on_committed,
                concurrency=self._concurrency,
                cache_entries=self._cache_entries,
                sweep_interval_s=self._sweep_interval_s,
            )
            await executor.start()  # PENDING -> UNKNOWN, committed before any intent is read
            self._consumer.seek(tp, position)
        except BaseException:
            if executor is not None:
                await executor.stop()
            await _stop_producer(producer)
            if local is not None:
                local.close()
            raise
        log.info(
            "partition acquired",
            extra={"partition": p, "position": position, "restored": self.restored[p]},
        )
        return _Owned(producer, executor, local)

    def _open_store(self, p: int) -> LocalStore:
        """The partition's local store in the state directory; if another executor on this
        host still has it open (a paused former owner, which the fence stops before it
        writes again), a store of this executor's own, restored cold: never the same file."""
        name = f"{self.topics.state}-{p}.db"
        try:
            return LocalStore(self.state_dir / name, self._identity(p))
        except StoreBusy as busy:
            log.warning(
                "local store busy: restoring the partition into a store of this executor",
                extra={"partition": p, "reason": str(busy)},
            )
            if self._private_dir is None:
                self._private_dir = tempfile.TemporaryDirectory(prefix="toolledger-state-")
            return LocalStore(Path(self._private_dir.name) / name, self._identity(p))

    def _identity(self, partition: int) -> dict[str, str]:
        """What a local store must have been made for to be used again."""
        return {
            "cluster": self._cluster_id or "",
            "group": self.topics.executor_group,
            "topic": self.topics.state,
            "partition": str(partition),
            "partitions": str(self.topics.partitions),
        }

    async def _release(self, partitions: Sequence[int], *, drain_s: float | None = None) -> None:
        """Give partitions up. Running calls are let finish first, all partitions together,
        for as long as the longest tool timeout: a handler cannot outlive it, so no call of a
        released partition is still running when its new owner reconciles it."""
        async with self._lock:
            released = []
            for p in partitions:
                self._unowned.discard(p)
                owned = self.owned.pop(p, None)
                if owned is not None:
                    released.append((p, owned))
            wait = self._longest_timeout_s + 1.0 if drain_s is None else drain_s
            if released and wait > 0:
                with contextlib.suppress(Exception, TimeoutError):
                    await asyncio.wait_for(
                        asyncio.gather(
                            *(o.executor.drain() for _, o in released), return_exceptions=True
                        ),
                        wait,
                    )
            for p, owned in released:
                await owned.executor.stop()
                await _stop_producer(owned.producer)
                owned.local.close()
                log.info("partition released", extra={"partition": p})

    async def _reacquire(self) -> None:
        """Partitions whose commit failed (broker trouble, fencing) or that could not be taken
        over are taken over again while the group still assigns them to us."""
        failed = [p for p, owned in self.owned.items() if owned.executor.failed is not None]
        for p in failed:
            if _local_store_failed(self.owned[p].executor.failed):
                self._damaged.add(p)  # its local store is rebuilt at the takeover
        if failed:
            log.warning(
                "re-acquiring partitions after a failed commit", extra={"partitions": failed}
            )
            await self._release(failed, drain_s=0)
            self._unowned.update(failed)
        if not self._unowned:
            return
        assert self._consumer is not None
        assigned = {
            tp.partition for tp in self._consumer.assignment() if tp.topic == self.topics.intents
        }
        self._unowned &= assigned
        await asyncio.sleep(0.5)
        await self._acquire(sorted(self._unowned))

    # -- the loop -------------------------------------------------------------------------------

    async def _feed(self, partition: int, owner: _Owned | None, records: Sequence[Any]) -> None:
        """Feed one partition's fetched records to the executor that owned it at fetch time.

        Records fetched for an executor that has since been replaced are dropped: the new one
        seeked to the committed position and reads them again. An executor that fails stops
        taking records; re-acquiring it seeks back, so nothing fetched is lost."""
        for record in records:
            if owner is None or self.owned.get(partition) is not owner:
                return
            if owner.executor.failed is not None:
                return
            value = record.value or b""
            with contextlib.suppress(CodecError):  # else decoded as it is, and dead-lettered
                value = self._wire.to_single_object(value)
            try:
                await owner.executor.feed(
                    partition,
                    record.offset,
                    value,
                    key=record.key,
                    headers=tuple(record.headers or ()),
                )
            except ExecutorStopped:
                return
            except Exception as exc:  # a bug: stop this partition, re-acquiring seeks back
                log.exception("feeding failed", extra={"partition": partition})
                owner.executor.fail(exc)
                return

    async def _run(self) -> None:
        assert self._consumer is not None
        while True:
            try:
                await self._reacquire()
                batches = await self._consumer.getmany(timeout_ms=100, max_records=500)
                # owners as of the fetch (a rebalance inside getmany seeks before it fetches)
                fetched_by = dict(self.owned)
                for tp, records in batches.items():
                    await self._feed(tp.partition, fetched_by.get(tp.partition), records)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("executor loop error; continuing")
                await asyncio.sleep(0.5)


async def _stop_producer(producer: AIOKafkaProducer) -> None:
    """Stop a partition's producer, for at most :data:`CLOSE_WAIT_S`: its pending batches
    are flushed first, which never ends if its coordinator never answers. One left behind is
    fenced by the next owner's ``init_transactions``."""
    try:
        async with asyncio.timeout(CLOSE_WAIT_S):
            await producer.stop()
    except Exception as exc:
        log.warning("a partition's producer did not stop cleanly", extra={"error": repr(exc)})


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, executor: KafkaExecutor) -> None:
        self._executor = executor

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._executor._release([tp.partition for tp in revoked])

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._executor._acquire([tp.partition for tp in assigned])
