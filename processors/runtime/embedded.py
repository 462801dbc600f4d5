"""The embedded runtime: the executor over a :class:`SqliteLog`, in one process.

Single-node by design: no rebalancing, no replication. One partition worker per log
partition, all in this event loop. One writer task group-commits everything that is ready —
appended intents and the batches of every partition — in one SQLite transaction, so the cost
of an fsync is shared by all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence

from processors.pipeline import Stages
from processors.ports import CommitBatch, KeyEntry, Snapshot
from processors.runtime.key_cache import DEFAULT_CACHE_ENTRIES
from processors.runtime.partition import PartitionFailed, PartitionWorker
from processors.runtime.sqlite_log import EXECUTOR, INTENTS, SqliteLog
from schemas.codec import encode
from schemas.events import Event
from schemas.keys import partition_for
from schemas.topics import partition_key

log = logging.getLogger("toolledger.embedded")

DEFAULT_INTENTS_RETENTION_S = 7 * 86_400.0  # as the Kafka intents topic (toolledger topics)
_PRUNE_CHUNKS_PER_TURN = 100


class _Writer:
    """Coalesces appends and partition batches into one transaction per turn of the loop."""

    def __init__(self, log: SqliteLog, on_appended: Callable[[int], None]) -> None:
        self._log = log
        self._on_appended = on_appended
        self._intents: list[tuple[int, bytes, bytes, asyncio.Future[None]]] = []
        self._batches: list[
            tuple[CommitBatch, list[tuple[bytes, bytes]], asyncio.Future[None]]
        ] = []
        self._wakeup = asyncio.Event()
        self.failing = False  # the last write failed (a full disk, a read-only file system)

    async def append(self, partition: int, key: bytes, value: bytes) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._intents.append((partition, key, value, future))
        self._wakeup.set()
        await future

    async def commit(self, batch: CommitBatch) -> None:
        encoded = [(e.call_key.encode("utf-8"), encode(e)) for e in batch.events]
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._batches.append((batch, encoded, future))
        self._wakeup.set()
        await future

    @property
    def idle(self) -> bool:
        return not (self._intents or self._batches)

    async def run(self) -> None:
        while True:
            await self._wakeup.wait()
            await asyncio.sleep(0)  # let the other partitions' flushers queue theirs too
            self._wakeup.clear()
            intents, self._intents = self._intents, []
            batches, self._batches = self._batches, []
            futures = [f for *_, f in intents] + [f for *_, f in batches]
            if not futures:
                continue
            try:
                self._log.write(
                    [(p, k, v) for p, k, v, _ in intents], [(b, e) for b, e, _ in batches]
                )
                self.failing = False
            except Exception as exc:
                self.failing = True
                for future in futures:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for future in futures:
                if not future.done():
                    future.set_result(None)
            for partition in {p for p, *_ in intents}:
                self._on_appended(partition)


class _Store:
    """One partition's store: reads in a thread (their own connection), writes through the
    writer's group commit."""

    def __init__(self, log: SqliteLog, writer: _Writer, partition: int) -> None:
        self._log = log
        self._writer = writer
        self._partition = partition

    async def load(self, partition: int) -> Snapshot:
        return self._log.load(partition)

    async def read(self, keys: Sequence[str]) -> Mapping[str, KeyEntry]:
        return await asyncio.to_thread(self._log.reader.read, keys)

    async def due(
        self, tool: str, settled_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[tuple[float, str]]:
        return await asyncio.to_thread(
            self._log.reader.due, self._partition, tool, settled_before, after, limit
        )

    async def commit(self, batch: CommitBatch) -> None:
        await self._writer.commit(batch)


class EmbeddedRuntime:
    def __init__(
        self,
        log: SqliteLog,
        stages: Stages,
        *,
        concurrency: int = 64,
        on_committed: Callable[[Sequence[Event]], None] | None = None,
        sweep_interval_s: float = 1.0,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
        intents_retention_s: float | None = DEFAULT_INTENTS_RETENTION_S,
        prune_interval_s: float = 10.0,
    ) -> None:
        """``cache_entries``: call keys held in memory by all partitions together (each
        partition's worker holds its share; every other key is read from the file).
        ``intents_retention_s``: processed intents older than this are deleted (None: kept)."""
        self.log = log
        self._intents_retention_s = intents_retention_s
        self._prune_interval_s = prune_interval_s
        self._pruner: asyncio.Task[None] | None = None
        self._cache_entries = max(1, cache_entries // log.partitions)
        self._stages = stages
        self._concurrency = concurrency
        self._on_committed = on_committed
        self._sweep_interval_s = sweep_interval_s
        self.workers: list[PartitionWorker] = []
        self._arrived = [asyncio.Event() for _ in range(log.partitions)]
        self._readers: list[asyncio.Task[None]] = []
        self._writer = _Writer(log, lambda partition: self._arrived[partition].set())
        self._writer_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._writer_task = asyncio.create_task(self._writer.run())
        self.workers = [await self._new_worker(p) for p in range(self.log.partitions)]
        self._readers = [asyncio.create_task(self._read(p)) for p in range(self.log.partitions)]
        if self._intents_retention_s is not None:
            self._pruner = asyncio.create_task(self._prune(self._intents_retention_s))

    async def _prune(self, retention_s: float) -> None:
        """Delete processed intents past their retention, a chunk per transaction, between
        other writes (each chunk is one short transaction on this loop)."""
        while True:
            await asyncio.sleep(self._prune_interval_s)
            try:
                for _ in range(_PRUNE_CHUNKS_PER_TURN):
                    if not self.log.prune_intents(time.time() - retention_s):
                        break
                    await asyncio.sleep(0)  # let the writer in between chunks
            except sqlite3.Error as exc:  # e.g. a full disk: tried again next time
                log.warning("pruning intents failed", extra={"error": str(exc)})

    async def _new_worker(self, partition: int) -> PartitionWorker:
        """A worker from what is durable: the stored states and position (PENDING -> UNKNOWN)."""
        worker = PartitionWorker(
            partition,
            self.log.position(EXECUTOR, INTENTS, partition),
            _Store(self.log, self._writer, partition),
            self._stages,
            epoch=self.log.epoch,
            concurrency=self._concurrency,
            on_committed=self._on_committed,
            sweep_interval_s=self._sweep_interval_s,
            cache_entries=self._cache_entries,
        )
        await worker.start()
        return worker

    def writable(self) -> bool:
        """Whether the ledger can commit: the last write succeeded and a probe write does now
        (readiness must fail on a full disk or a read-only file system)."""
        try:
            self.log.probe()
        except sqlite3.Error:
            self._writer.failing = True
            return False
        self._writer.failing = False
        return True

    @property
    def failing(self) -> bool:
        return self._writer.failing

    async def send(self, intent: Event) -> None:
        """Append an intent (or an operator's decision); returns once it is durable."""
        key = partition_key(intent)
        await self._writer.append(partition_for(key, self.log.partitions), key, encode(intent))

    async def broadcast(self, record: Event) -> None:
        """Append ``record`` to every partition (a switch), durably."""
        key, value = partition_key(record), encode(record)
        await asyncio.gather(
            *(self._writer.append(p, key, value) for p in range(self.log.partitions))
        )

    async def send_raw(self, partition: int, key: bytes, value: bytes) -> int:
        """Append bytes as they are (tests of bad input use it)."""
        offset = self.log.write([(partition, key, value)], [])[0]
        self._arrived[partition].set()
        return offset

    async def drain(self) -> None:
        """Wait until every appended intent is processed and committed."""
        while True:
            ends = [self.log.read(INTENTS, w.partition, w.position, 1) for w in self.workers]
            if not any(ends) and self._writer.idle:
                await asyncio.gather(*(w.drain() for w in self.workers))
                if all(
                    not self.log.read(INTENTS, w.partition, w.position, 1) for w in self.workers
                ):
                    return
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        if self._pruner is not None:
            self._pruner.cancel()
            with contextlib.suppress(BaseException):
                await self._pruner
        for task in self._readers:
            task.cancel()
        for task in self._readers:
            with contextlib.suppress(BaseException):
                await task
        for worker in self.workers:
            await worker.stop()
        if self._writer_task is not None:
            self._writer_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer_task

    async def _read(self, partition: int) -> None:
        """Feed the partition's worker; a worker whose write failed is replaced by a new one
        started from the stored state and position, so a transient SQLite error does not stop
        the partition for good."""
        delay = 0.1
        while True:
            worker = self.workers[partition]
            await self._feed_until_failed(worker)
            log.warning("partition failed; restarting it", extra={"partition": partition})
            await worker.stop()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            try:
                self.workers[partition] = await self._new_worker(partition)
            except Exception:
                log.exception("restarting the partition failed", extra={"partition": partition})

    async def _feed_until_failed(self, worker: PartitionWorker) -> None:
        arrived = self._arrived[worker.partition]
        next_offset = worker.position
        while worker.failed is None:
            arrived.clear()  # before the read: an append after it sets the event again
            batch = self.log.read(INTENTS, worker.partition, next_offset)
            if not batch:
                await arrived.wait()
                continue
            for offset, value in batch:
                try:
                    await worker.feed(offset, value)
                except PartitionFailed:
                    return
                next_offset = offset + 1
