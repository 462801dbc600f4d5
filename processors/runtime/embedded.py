"""The embedded runtime: the executor core over a :class:`SqliteLedger`, in one process.

Single-node by design: no rebalancing, no replication. Callers hand their intents straight to
the executor (:meth:`EmbeddedRuntime.send`); nothing is appended and read back. The executor
decides a batch at a time and the writer thread writes each batch in one SQLite transaction:
BEGIN, one ``executemany`` per statement, COMMIT (the fsync), then one callback to the loop.
Right after each batch (its callers answered) the same thread derives the read model of its
events in a second, unsynced transaction (:meth:`SqliteLedger.tail`) while the loop decides the
next batch: the read model never lengthens the hot transaction nor delays an answer; a reader
that needs it waits for :meth:`EmbeddedRuntime.derived`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence

from toolledger.processors.executor import DEFAULT_CONCURRENCY, Executor
from toolledger.processors.key_cache import DEFAULT_CACHE_ENTRIES
from toolledger.processors.ledger.rows import event_json
from toolledger.processors.ports import Clock, CommitBatch, ToolStages
from toolledger.processors.runtime.sqlite_ledger import SqliteLedger
from toolledger.schemas.events import Event
from toolledger.schemas.keys import partition_for
from toolledger.schemas.topics import partition_key

log = logging.getLogger("toolledger.embedded")

DEFAULT_INTENTS_RETENTION_S = 7 * 86_400.0  # as the Kafka intents topic (toolledger topics)
_RESTART_DELAY_CAP_S = 5.0

_Job = tuple[CommitBatch, list[tuple[int, str]], "asyncio.Future[None]"]


class _Writer:
    """Writes batches on a thread of its own, one transaction each, and derives the read
    model of each batch in a second, unsynced transaction right after it.

    sqlite3 releases the GIL while SQLite works and syncs, so the loop goes on meanwhile. A
    batch's future is completed on the loop only after its COMMIT returned: an action its
    batch decided starts after its Started event is durable."""

    def __init__(self, ledger: SqliteLedger, on_derived: Callable[[], None]) -> None:
        self._ledger = ledger
        self._on_derived = on_derived
        self._ready = threading.Condition()
        self._jobs: list[_Job] = []
        self._barriers: list[asyncio.Future[None]] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.failing = False  # the last write failed (a full disk, a read-only file system)
        self.busy = 0  # jobs queued or being written, not yet answered on the loop

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._run, args=(loop,), name="toolledger-writer", daemon=True
        )
        self._thread.start()

    async def write(self, batch: CommitBatch) -> None:
        encoded = [(p, event_json(e)) for e, p in zip(batch.events, batch.partitions, strict=True)]
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._ready:
            if self._stopping:  # the thread may be gone: nothing would answer the future
                raise RuntimeError("the embedded ledger's writer is stopped")
            self._jobs.append((batch, encoded, future))
            self._ready.notify()
        self.busy += 1
        await future

    async def barrier(self) -> None:
        """Returns once everything queued before it is written (and its read model derived)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._ready:
            if self._stopping:
                return
            self._barriers.append(future)
            self._ready.notify()
        await future

    async def stop(self) -> None:
        """Write what is queued, then end the thread (and wait for it)."""
        with self._ready:
            self._stopping = True
            self._ready.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            with self._ready:
                while not (self._jobs or self._barriers or self._stopping):
                    self._ready.wait()
                jobs, self._jobs = self._jobs, []
                barriers, self._barriers = self._barriers, []
                stopping = self._stopping
            for batch, encoded, future in jobs:
                error: Exception | None = None
                try:
                    self._ledger.write(batch, encoded)
                except Exception as exc:
                    error = exc
                if not _answer(loop, self._written, future, error):
                    return
                if error is None and self._derive():
                    with contextlib.suppress(RuntimeError):  # the loop is closed
                        loop.call_soon_threadsafe(self._on_derived)
            for barrier in barriers:
                if not _answer(loop, _resolve, barrier, None):
                    return
            if stopping:
                with self._ready:
                    if not self._jobs:
                        return

    def _derive(self) -> bool:
        """The read model of the batch just written, in a transaction of its own (not
        fsynced), while the loop decides the next batch; whether it moved."""
        ledger = self._ledger
        moved = False
        try:
            while ledger.derived < ledger.last_seq and ledger.tail():
                moved = True
        except sqlite3.Error as exc:  # e.g. a full disk: derived after the next write
            log.warning("deriving the read model failed", extra={"error": str(exc)})
        return moved

    def _written(self, future: asyncio.Future[None], error: Exception | None) -> None:
        self.busy -= 1
        self.failing = error is not None
        _resolve(future, error)


def _resolve(future: asyncio.Future[None], error: Exception | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _answer(
    loop: asyncio.AbstractEventLoop,
    callback: Callable[[asyncio.Future[None], Exception | None], None],
    future: asyncio.Future[None],
    error: Exception | None,
) -> bool:
    try:
        loop.call_soon_threadsafe(callback, future, error)
    except RuntimeError:  # the loop is closed: nobody waits for it any more
        return False
    return True


class EmbeddedRuntime:
    def __init__(
        self,
        ledger: SqliteLedger,
        stages: ToolStages,
        *,
        clock: Clock | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        on_committed: Callable[[Sequence[Event]], None] | None = None,
        on_abandoned: Callable[[list[str], BaseException], None] | None = None,
        sweep_interval_s: float = 1.0,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
        intents_retention_s: float | None = DEFAULT_INTENTS_RETENTION_S,
        prune_interval_s: float = 10.0,
    ) -> None:
        """``cache_entries``: call keys held in memory (every other key is read from the
        file when used). ``intents_retention_s``: how long the raw arguments of approval
        requests are kept (None: forever)."""
        self.ledger = ledger
        self._stages = stages
        self._clock = clock
        self._concurrency = concurrency
        self._on_committed = on_committed
        self._on_abandoned = on_abandoned
        self._sweep_interval_s = sweep_interval_s
        self._cache_entries = cache_entries
        self._intents_retention_s = intents_retention_s
        self._prune_interval_s = prune_interval_s
        self._writer = _Writer(ledger, self._derived)
        self._derived_signal = asyncio.Event()
        self.executor: Executor | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._pruner: asyncio.Task[None] | None = None

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self._writer.start()
        try:
            self.executor = await self._new_executor()
        except BaseException:
            await self._writer.stop()
            raise
        self._supervisor = asyncio.create_task(self._supervise())
        if self._intents_retention_s is not None:
            self._pruner = asyncio.create_task(self._prune(self._intents_retention_s))

    async def _new_executor(self) -> Executor:
        """An executor from what is durable: the stored states (PENDING -> UNKNOWN)."""
        partitions = self.ledger.partitions
        executor = Executor(
            range(partitions),
            self.ledger,
            self._stages,
            self._writer.write,
            partition_of=lambda key: partition_for(key.encode("utf-8"), partitions),
            epoch=self.ledger.epoch,
            clock=self._clock,
            on_committed=self._on_committed,
            on_abandoned=self._on_abandoned,
            concurrency=self._concurrency,
            cache_entries=self._cache_entries,
            sweep_interval_s=self._sweep_interval_s,
        )
        await executor.start()
        return executor

    async def _supervise(self) -> None:
        """An executor whose write failed is replaced by a new one started from the file, so
        a transient SQLite error does not stop the ledger for good."""
        delay = 0.1
        while True:
            executor = self.executor
            assert executor is not None
            with contextlib.suppress(Exception):
                await executor.drain()  # returns (raises) once it failed
            while executor.failed is None:
                await asyncio.sleep(0.05)
                with contextlib.suppress(Exception):
                    await executor.drain()
            log.warning(
                "the executor stopped; restarting it", extra={"error": repr(executor.failed)}
            )
            await executor.stop()
            await self._writer.barrier()  # what the stopped executor queued lands first
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RESTART_DELAY_CAP_S)
            try:
                self.executor = await self._new_executor()
            except Exception:
                log.exception("restarting the executor failed")
                continue
            delay = 0.1

    async def stop(self) -> None:
        for task in (self._supervisor, self._pruner):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self.executor is not None:
            await self.executor.stop()
        # last: what the executor queued is still written (a batch is atomic, so a write now
        # is as good as one just before the stop), then the thread ends
        await self._writer.stop()

    async def _prune(self, retention_s: float) -> None:
        """Delete raw intents past their retention, between other writes."""
        while True:
            await asyncio.sleep(self._prune_interval_s)
            try:
                while await asyncio.to_thread(self.ledger.prune_intents, time.time() - retention_s):
                    pass
            except sqlite3.Error as exc:  # e.g. a full disk: tried again next time
                log.warning("pruning the intents failed", extra={"error": str(exc)})

    # -- the front doors' side ----------------------------------------------------------

    def _executor(self) -> Executor:
        if self.executor is None:
            raise RuntimeError("the embedded ledger is not running")
        return self.executor

    async def send(self, intent: Event) -> None:
        """Hand an intent (or an operator's decision) to the executor; the answer comes in the
        events published once its batch is written (or, if that write fails, the failure)."""
        key = partition_key(intent)
        self._executor().submit(intent, partition_for(key, self.ledger.partitions))  # type: ignore[arg-type]

    async def broadcast(self, record: Event) -> None:
        """A switch: recorded in every partition."""
        executor = self._executor()
        for p in range(self.ledger.partitions):
            executor.submit(record, p)  # type: ignore[arg-type]

    async def drain(self) -> None:
        """Wait until everything handed over is decided and written (the read model derived)."""
        await self._executor().drain()
        await self._writer.barrier()

    def _derived(self) -> None:
        self._derived_signal.set()
        self._derived_signal = asyncio.Event()

    async def derived(self, timeout_s: float) -> None:
        """Returns when the read model next moves on, or after ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._derived_signal.wait(), timeout_s)

    async def caught_up(self, timeout_s: float) -> None:
        """Returns once the read model holds every event written before this call (a read
        of the audit trail sees the writes that answered its caller), or after ``timeout_s``
        (a read model that cannot be derived, e.g. on a full disk, is read as it is)."""
        target = self.ledger.last_seq
        deadline = time.monotonic() + timeout_s
        while self.ledger.derived < target:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            # in short steps: a move between the check and the wait is not waited for
            await self.derived(min(left, 0.02))

    # -- health ---------------------------------------------------------------------------

    def writable(self) -> bool:
        """Whether the ledger can commit: the last write succeeded and a probe write does now
        (readiness must fail on a full disk or a read-only file system)."""
        try:
            self.ledger.probe()
        except sqlite3.Error:
            self._writer.failing = True
            return False
        self._writer.failing = False
        return True

    @property
    def failing(self) -> bool:
        return self._writer.failing

    @property
    def running(self) -> bool:
        return self.executor is not None and self.executor.failed is None
