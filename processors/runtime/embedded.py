"""The embedded runtime: the executor over a :class:`SqliteLog`, in one process.

Single-node by design: no rebalancing, no replication. One partition worker per log
partition, all in this event loop; appends of intents are group-committed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from processors.ledger import CallState
from processors.pipeline import Stages
from processors.runtime.partition import CommitBatch, PartitionWorker
from processors.runtime.sqlite_log import EXECUTOR, INTENTS, SqliteLog
from schemas.codec import encode
from schemas.events import Event, ToolCallRequested
from schemas.keys import partition_for
from schemas.topics import partition_key


class _Store:
    def __init__(self, log: SqliteLog) -> None:
        self._log = log

    async def load_states(self, partition: int) -> dict[str, CallState]:
        return self._log.load_states(partition)

    async def commit(self, batch: CommitBatch) -> None:
        encoded = [(e.call_key.encode("utf-8"), encode(e)) for e in batch.events]
        self._log.commit(batch, encoded)


class EmbeddedRuntime:
    def __init__(
        self,
        log: SqliteLog,
        stages: Stages,
        *,
        concurrency: int = 64,
        on_committed: Callable[[Sequence[Event]], None] | None = None,
        sweep_interval_s: float = 1.0,
    ) -> None:
        self.log = log
        self._stages = stages
        self._concurrency = concurrency
        self._on_committed = on_committed
        self._sweep_interval_s = sweep_interval_s
        self.workers: list[PartitionWorker] = []
        self._arrived = [asyncio.Event() for _ in range(log.partitions)]
        self._readers: list[asyncio.Task[None]] = []
        self._appends: list[tuple[int, bytes, bytes, asyncio.Future[int]]] = []
        self._append_wakeup = asyncio.Event()
        self._appender: asyncio.Task[None] | None = None

    async def start(self) -> None:
        store = _Store(self.log)
        for partition in range(self.log.partitions):
            worker = PartitionWorker(
                partition,
                self.log.position(EXECUTOR, INTENTS, partition),
                store,
                self._stages,
                epoch=self.log.epoch,
                concurrency=self._concurrency,
                on_committed=self._on_committed,
                sweep_interval_s=self._sweep_interval_s,
            )
            await worker.start()
            self.workers.append(worker)
        self._readers = [asyncio.create_task(self._read(w)) for w in self.workers]
        self._appender = asyncio.create_task(self._append_loop())

    async def send(self, intent: ToolCallRequested) -> None:
        """Append an intent; returns once it is durable in the log."""
        key = partition_key(intent)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._appends.append((partition_for(key, self.log.partitions), key, encode(intent), future))
        self._append_wakeup.set()
        await future

    async def send_raw(self, partition: int, key: bytes, value: bytes) -> int:
        """Append bytes as they are (tests of bad input use it)."""
        offset = self.log.append(INTENTS, [(partition, key, value)])[0]
        self._arrived[partition].set()
        return offset

    async def drain(self) -> None:
        """Wait until every appended intent is processed and committed."""
        while True:
            ends = [self.log.read(INTENTS, w.partition, w.position, 1) for w in self.workers]
            if not any(ends) and not self._appends:
                await asyncio.gather(*(w.drain() for w in self.workers))
                if all(
                    not self.log.read(INTENTS, w.partition, w.position, 1) for w in self.workers
                ):
                    return
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        tasks = [*self._readers, *([self._appender] if self._appender else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for worker in self.workers:
            await worker.stop()

    async def _append_loop(self) -> None:
        while True:
            await self._append_wakeup.wait()
            self._append_wakeup.clear()
            pending, self._appends = self._appends, []
            if not pending:
                continue
            try:
                self.log.append(INTENTS, [(p, k, v) for p, k, v, _ in pending])
            except Exception as exc:
                for *_, future in pending:
                    future.set_exception(exc)
                continue
            for partition, *_rest, future in pending:
                future.set_result(partition)
                self._arrived[partition].set()

    async def _read(self, worker: PartitionWorker) -> None:
        arrived = self._arrived[worker.partition]
        next_offset = worker.position
        while worker.failed is None:
            arrived.clear()  # before the read: an append after it sets the event again
            batch = self.log.read(INTENTS, worker.partition, next_offset)
            if not batch:
                await arrived.wait()
                continue
            for offset, value in batch:
                await worker.feed(offset, value)
                next_offset = offset + 1
