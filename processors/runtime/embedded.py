"""The embedded runtime: the executor over a :class:`SqliteLog`, in one process.

Single-node by design: no rebalancing, no replication. One partition worker per log
partition, all in this event loop. One writer thread group-commits everything that is ready —
appended intents and the batches of every partition — in one SQLite transaction, so the cost
of an fsync is shared by all of them, and the loop keeps running while the disk syncs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from processors.pipeline import Stages
from processors.ports import CommitBatch, KeyEntry, Snapshot
from processors.runtime.heap import release_free_memory_every
from processors.runtime.key_cache import DEFAULT_CACHE_ENTRIES
from processors.runtime.partition import PartitionFailed, PartitionWorker
from processors.runtime.sqlite_log import EXECUTOR, INTENTS, OUTCOMES, SqliteLog
from schemas.codec import encode
from schemas.events import Event
from schemas.keys import partition_for
from schemas.topics import partition_key

log = logging.getLogger("toolledger.embedded")

DEFAULT_INTENTS_RETENTION_S = 7 * 86_400.0  # as the Kafka intents topic (toolledger topics)
_PRUNE_CHUNKS_PER_TURN = 100


_Intent = tuple[int, bytes, bytes, "asyncio.Future[int]"]
_Batch = tuple[CommitBatch, list[bytes], "asyncio.Future[None]"]


class _Writer:
    """Group-commits appended intents and partition batches on a thread of its own.

    The event loop queues; the thread takes everything queued, writes it in one SQLite
    transaction (sqlite3 releases the GIL while it works and fsyncs, so the loop keeps
    running), and hands the outcome back to the loop. What is queued meanwhile goes into the
    next transaction: the group commit grows with the load.

    A future is completed on the loop only after :meth:`SqliteLog.write` returned, that is
    after the COMMIT (and its fsync): a partition's Started is durable before the handler it
    allows runs, as when the write ran on the loop. A write that raises fails exactly the
    futures of its transaction. The queue is guarded by ``_ready``'s lock; everything else
    (``failing``, ``_unresolved``, the futures) is touched on the loop only.
    """

    def __init__(self, log: SqliteLog, on_appended: Callable[[int], None]) -> None:
        self._log = log
        self._on_appended = on_appended
        self._ready = threading.Condition()
        self._intents: list[_Intent] = []
        self._batches: list[_Batch] = []
        self._barriers: list[asyncio.Future[None]] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._unresolved = 0  # queued or being written, not yet answered on the loop
        self.failing = False  # the last write failed (a full disk, a read-only file system)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._run, args=(loop,), name="toolledger-writer", daemon=True
        )
        self._thread.start()

    async def append(self, partition: int, key: bytes, value: bytes) -> int:
        """Append an intent; returns its offset once it is durable."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue(intent=(partition, key, value, future))
        return await future

    async def commit(self, batch: CommitBatch) -> None:
        encoded = [encode(e) for e in batch.events]
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue(batch=(batch, encoded, future))
        await future

    async def barrier(self) -> None:
        """Returns once everything queued before it is written (or failed)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._ready:
            if self._stopping:
                return  # stop() writes what is queued before it returns
            self._barriers.append(future)
            self._ready.notify()
        await future

    def _queue(self, *, intent: _Intent | None = None, batch: _Batch | None = None) -> None:
        with self._ready:
            if self._stopping:  # the thread may be gone: nothing would answer the future
                raise RuntimeError("the embedded ledger's writer is stopped")
            if intent is not None:
                self._intents.append(intent)
            if batch is not None:
                self._batches.append(batch)
            self._ready.notify()
        self._unresolved += 1

    @property
    def idle(self) -> bool:
        return self._unresolved == 0

    async def stop(self) -> None:
        """Write what is queued, then end the thread (and wait for it)."""
        with self._ready:
            self._stopping = True
            self._ready.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        """The writer thread: one transaction per turn, for everything queued at its start."""
        while True:
            with self._ready:
                while not (self._intents or self._batches or self._barriers or self._stopping):
                    self._ready.wait()
                intents, self._intents = self._intents, []
                batches, self._batches = self._batches, []
                barriers, self._barriers = self._barriers, []
            if not (intents or batches or barriers):  # stopping, and everything is written
                return
            error: Exception | None = None
            offsets: list[int] = []
            if intents or batches:
                try:
                    offsets = self._log.write(
                        [(p, k, v) for p, k, v, _ in intents], [(b, e) for b, e, _ in batches]
                    )
                except Exception as exc:
                    error = exc
            try:
                loop.call_soon_threadsafe(self._written, intents, batches, barriers, offsets, error)
            except RuntimeError:  # the loop is closed: nobody waits for these any more
                return

    def _written(
        self,
        intents: list[_Intent],
        batches: list[_Batch],
        barriers: list[asyncio.Future[None]],
        offsets: list[int],
        error: Exception | None,
    ) -> None:
        """On the loop: answer the futures of one transaction (and the barriers queued after
        what it wrote: everything before them is answered now)."""
        for barrier in barriers:
            if not barrier.done():
                barrier.set_result(None)
        if not (intents or batches):
            return
        self._unresolved -= len(intents) + len(batches)
        self.failing = error is not None
        futures: list[asyncio.Future[Any]] = [f for *_, f in intents] + [f for *_, f in batches]
        if error is not None:
            for future in futures:
                if not future.done():
                    future.set_exception(error)
            return
        for (*_, intent_future), offset in zip(intents, offsets, strict=True):
            if not intent_future.done():
                intent_future.set_result(offset)
        for *_, batch_future in batches:
            if not batch_future.done():
                batch_future.set_result(None)
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
        outcomes_retention_s: float | None = None,
        prune_interval_s: float = 10.0,
    ) -> None:
        """``cache_entries``: call keys held in memory by all partitions together (each
        partition's worker holds its share; every other key is read from the file).
        ``intents_retention_s``: processed intents older than this are deleted (None: kept).
        ``outcomes_retention_s``: outcome records older than this are deleted (None: kept, so
        the read model can be rebuilt from the log; the audit trail keeps its own copy)."""
        self.log = log
        self._retention = {
            topic: seconds
            for topic, seconds in ((INTENTS, intents_retention_s), (OUTCOMES, outcomes_retention_s))
            if seconds is not None
        }
        self._prune_interval_s = prune_interval_s
        self._pruner: asyncio.Task[None] | None = None
        self._heap: asyncio.Task[None] | None = None
        self._cache_entries = max(1, cache_entries // log.partitions)
        self._stages = stages
        self._concurrency = concurrency
        self._on_committed = on_committed
        self._sweep_interval_s = sweep_interval_s
        self.workers: list[PartitionWorker] = []
        self._arrived = [asyncio.Event() for _ in range(log.partitions)]
        self._readers: list[asyncio.Task[None]] = []
        self._writer = _Writer(log, lambda partition: self._arrived[partition].set())

    async def start(self) -> None:
        self._writer.start()
        try:
            for p in range(self.log.partitions):
                self.workers.append(await self._new_worker(p))
        except BaseException:
            await self.stop()  # the workers started so far, and the writer's thread
            raise
        self._readers = [asyncio.create_task(self._read(p)) for p in range(self.log.partitions)]
        if self._retention:
            self._pruner = asyncio.create_task(self._prune())
        self._heap = asyncio.create_task(release_free_memory_every())

    async def _prune(self) -> None:
        """Delete the log's records past their topic's retention, a range per partition and
        transaction, between other writes (each is one short transaction, in a thread: the
        log's lock orders it with the writer's transactions)."""
        while True:
            await asyncio.sleep(self._prune_interval_s)
            for topic, retention_s in self._retention.items():
                try:
                    for _ in range(_PRUNE_CHUNKS_PER_TURN):
                        if not await asyncio.to_thread(
                            self.log.prune, topic, time.time() - retention_s
                        ):
                            break
                except sqlite3.Error as exc:  # e.g. a full disk: tried again next time
                    log.warning("pruning the log failed", extra={"topic": topic, "error": str(exc)})

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
        return await self._writer.append(partition, key, value)

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
        for background in (self._pruner, self._heap):
            if background is not None:
                background.cancel()
                with contextlib.suppress(BaseException):
                    await background
        for task in self._readers:
            task.cancel()
        for task in self._readers:
            with contextlib.suppress(BaseException):
                await task
        for worker in self.workers:
            await worker.stop()
        # last: what the stopped workers queued is still written (a batch is atomic, so a
        # write now is as good as one just before the stop), then the thread ends
        await self._writer.stop()

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
            # a batch the stopped worker queued lands before the new worker reads the file
            await self._writer.barrier()
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
