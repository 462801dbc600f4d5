"""Throughput and latency of the Kafka + PostgreSQL path, against raw aiokafka / psycopg baselines.

Run (a real broker and a real PostgreSQL are needed)::

    .venv/bin/python -m bench.kafka [--calls N] [--kafka HOST:PORT] [--postgres DSN]
                                    [--out bench/results/kafka.json]
    .venv/bin/python -m bench.kafka --profile     # also: cProfile of an e2e run, top 20

``--kafka`` / ``--postgres`` default to ``$TOOLLEDGER_KAFKA`` / ``$TOOLLEDGER_POSTGRES``. Every run
uses fresh topics (a unique prefix, 4 partitions) and a fresh database for the projector, and
removes both at the end.

Scenarios, in this order, in one run (the raw pipes run after the ledger, on the same broker):

``e2e_calls_per_s``
    ``LedgerClient`` over ``KafkaTransport`` -> ``KafkaExecutor`` -> outcome back through the
    transport's ``read_committed`` listener. A no-op mutation tool, N distinct idempotency
    keys, at most ``--inflight`` calls in flight (a sliding window: a call starts as soon as
    another one finishes), after ``--warmup`` untimed calls. Intent records are about 220
    bytes (the encoded ``ToolCallRequested`` with its key). Checked: every call returned
    ``ok`` and was not a replay, and the handler ran exactly once per call.
``raw_pipe_msgs_per_s``
    The same shape with plain aiokafka, no ledger: a sender produces a ``--record-bytes`` record
    to topic A (keyed, 4 partitions, idempotent producer, ``acks=all``, ``linger_ms=2``: the
    transport's settings) and waits for its answer; a relay (see :class:`RelayService`: group
    consumer, ``read_committed``, a plain idempotent producer, no transactions, offsets
    committed once the outputs are acknowledged) produces one ``--record-bytes`` record per
    input to topic B on the input's partition; a ``read_committed`` listener of B resolves the
    sender's future by the record key. Round trips per second, same in-flight bound.
``ratio_e2e_vs_raw_pipe``
    ``e2e_calls_per_s / raw_pipe_msgs_per_s``.
``raw_txn_pipe_msgs_per_s``
    The raw *transactional* pipe (:class:`TransactionalRelayService`): the same sender and
    listener, its own topics A and B (``rawtx-*``, 4 partitions), and a relay that does what
    any exactly-once design on Kafka must: consume the input, produce the answer and commit
    the input's offsets in one transaction, with one transactional producer per input
    partition (as the executor has) and everything fetched for a partition since its last
    transaction in the next one. Same record sizes, ``read_committed`` everywhere. Round
    trips per second; ``meta.diagnostics`` has its transactions and records per transaction.
``ratio_e2e_vs_raw_txn_pipe``
    ``e2e_calls_per_s / raw_txn_pipe_msgs_per_s``: the floor an exactly-once ledger pays
    (the issue's target is 0.5).
``p50_ms``, ``p99_ms`` / ``raw_pipe_p50_ms``, ``raw_pipe_p99_ms``
    Open loop: calls issued on a fixed schedule at half of the rate measured above (the
    ledger's for the ledger, the raw pipe's for the raw pipe) for ``--latency-seconds``; one
    call's latency is from its *scheduled* start to its answer, so a stalled sender cannot
    hide queueing (no coordinated omission). No in-flight bound below 8192 (beyond it the run
    is overloaded: calls are dropped and counted as failures).
``projector_rows_per_s``
    ``KafkaProjector`` into a fresh, migrated database, over every outcome event the steps
    above wrote: outcome events applied per second, from the start of the first ``apply`` to
    the end of the ``apply`` after which ``caught_up()`` holds (the consumer-group join is
    not counted; it is reported in ``meta``). Checked: one ``tool_calls`` row per call.
``raw_copy_rows_per_s``
    The audit rows the projector wrote (``tool_call_events``, the ``event_row`` columns), read
    back and written again with psycopg binary ``COPY`` into a plain table with the same
    columns (no indexes, no constraints), in the same batches as the projector's applies,
    one transaction per batch. Rows per second.
``ratio_projector_vs_copy``
    ``projector_rows_per_s / raw_copy_rows_per_s``.
``executor_cpu_ms_per_call``, ``e2e_cpu_ms_per_call``
    The executor process's CPU (user + system, read from ``/proc/<pid>/stat``) over the
    closed-loop e2e calls / calls: only with ``--executor subprocess`` (``null`` in-process,
    where the executor's CPU is not apart from the client's, or where ``/proc`` cannot be
    read); ``e2e_cpu_ms_per_call`` adds this process's (the client's, and the executor's when
    in-process).
``raw_txn_relay_cpu_ms_per_round_trip``, ``raw_txn_pipe_cpu_ms_per_round_trip``
    The same for the raw transactional pipe: its relay's process (``--executor subprocess``)
    and relay + sender.
``projector_cpu_ms_per_event``, ``raw_copy_cpu_ms_per_row``
    This process's CPU while the projector caught up (its group join included) / events, and
    while the COPY baseline ran / rows: the Python side only (PostgreSQL's CPU is not in
    either).

CPU read in this process (``time.process_time``) includes the progress display's refresh;
the executor's and the relay's child processes have none.

Where the executor runs (``--executor``): ``inprocess`` (the default) runs it, and the raw
pipe's relay, in this process and event loop, next to the client and the sender;
``subprocess`` runs each in a child Python process. On a 2-core machine that also hosts the
broker, in-process is the fairer default: ledger and raw pipe get the same single core, so
their per-message CPU costs count alike, and a third busy process would compete with the
broker for the second core. It also lets the run see inside the executor: ``meta.diagnostics``
then has the wall time of every executor transaction and of its steps, a per-call latency
split (intent acknowledged -> handler started -> answer received, one clock) and the CPU time
per call; ``--profile`` always profiles in-process (CPU time by default, ``--profile-clock``).

Results on a shared machine move with its load: ``meta.load_average_1m`` records it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import logging
import math
import os
import platform
import pstats
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import aiokafka
import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from rich.console import Console
from rich.progress import (
    Progress,
    TaskID,
)
from rich.table import Table

from bench.common import (
    PROCESS_CPU_READABLE,
    TOOL,
    Counter,
    cpu_seconds,
    make_registry,
    new_progress,
    write_result,
)
from toolledger.kafka_admin import ensure_topics
from toolledger.processors.pipeline import Stages
from toolledger.processors.runtime.kafka import KafkaExecutor
from toolledger.processors.tools.redaction import Redactor
from toolledger.producers.client import LedgerClient, TrustedContext
from toolledger.producers.kafka import KafkaTransport
from toolledger.projections.postgres import ApplyResult, PostgresProjection, migrate
from toolledger.projections.projector import KafkaProjector
from toolledger.projections.rows import EVENT_COLUMNS, Position
from toolledger.schemas.codec import encode
from toolledger.schemas.dead_letters import DeadLetterRecord
from toolledger.schemas.events import Event
from toolledger.schemas.topics import Topics

CONTEXT = TrustedContext(tenant_id="bench-tenant", principal="bench-agent")
PARTITIONS = 4
SECRET = b"bench-kafka-redaction-secret-0123456789"
SESSION_TIMEOUT_MS = 15_000  # must exceed the tool timeout (10 s, the default)
CALL_TIMEOUT_S = 10.0  # the client's default wait; the raw pipe gives up after as long
OPEN_LOOP_MAX_INFLIGHT = 8192  # beyond this an open-loop run is overloaded: calls are dropped
LINGER_MS = 2  # KafkaTransport's and the executor's producers linger this long

OneCall = Callable[[int], Awaitable[bool]]


# -- the tool (as in bench/embedded.py, plus a timestamp of each handler run) --------------------


# -- client-library warnings (aiokafka logs its retries as warnings) -------------------------------


class WarningCounter(logging.Handler):
    """Counts WARNING+ log records by logger, message template and error, instead of printing
    them over the progress bars. ``aiokafka.producer.sender`` logs every retried produce."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        detail = ""
        if isinstance(record.args, tuple) and record.args:
            last = record.args[-1]
            detail = f" [{last.__name__ if isinstance(last, type) else type(last).__name__}]"
        key = f"{record.name}: {record.msg}{detail}"
        self.counts[key] = self.counts.get(key, 0) + 1

    def produce_retries(self) -> int:
        return sum(n for k, n in self.counts.items() if "Got error produce response" in k)


WARNINGS = WarningCounter()


# -- measuring loops ---------------------------------------------------------------------------


@dataclass
class Closed:
    calls: int
    per_s: float
    seconds: float
    failures: int


async def closed_loop(
    one: OneCall, n: int, inflight: int, progress: Progress, task: TaskID, unit: str
) -> Closed:
    """``n`` calls, at most ``inflight`` at a time; a new one starts when one finishes."""
    next_i = done = failures = 0
    started = time.perf_counter()

    async def worker() -> None:
        nonlocal next_i, done, failures
        while next_i < n:
            i = next_i
            next_i += 1
            if not await one(i):
                failures += 1
            done += 1
            if done % 32 == 0 or done == n:
                rate = done / max(time.perf_counter() - started, 1e-9)
                progress.update(task, completed=done, rate=f"{rate:,.0f} {unit}/s")

    await asyncio.gather(*(worker() for _ in range(min(inflight, n))))
    seconds = time.perf_counter() - started
    return Closed(n, n / seconds, seconds, failures)


@dataclass
class Open:
    rate: float
    calls: int
    failures: int
    latencies_ms: list[float]
    max_issue_lag_ms: float
    max_inflight: int
    dropped: int  # not issued: OPEN_LOOP_MAX_INFLIGHT calls were already in flight

    def percentile(self, q: float) -> float:
        return percentile(self.latencies_ms, q)


async def open_loop(
    one: OneCall, rate: float, seconds: float, progress: Progress, task: TaskID
) -> Open:
    """Calls issued at ``rate`` per second on a fixed schedule for ``seconds``; each latency is
    measured from the call's *scheduled* start (so a late start counts against it)."""
    total = max(1, int(rate * seconds))
    latencies: list[float] = []
    failures = inflight = max_inflight = dropped = 0
    max_lag = 0.0
    tasks: set[asyncio.Task[None]] = set()

    async def run(i: int, due: float) -> None:
        nonlocal failures, inflight
        ok = await one(i)
        latency = (time.perf_counter() - due) * 1000
        inflight -= 1
        if ok:
            latencies.append(latency)
        else:
            failures += 1

    t0 = time.perf_counter() + 0.05
    issued = 0
    shown = 0.0
    while issued < total:
        now = time.perf_counter()
        due = t0 + issued / rate
        if due > now:
            await asyncio.sleep(due - now)
            continue
        while issued < total and t0 + issued / rate <= now:
            due = t0 + issued / rate
            max_lag = max(max_lag, now - due)
            if inflight >= OPEN_LOOP_MAX_INFLIGHT:
                dropped += 1
                issued += 1
                continue
            inflight += 1
            max_inflight = max(max_inflight, inflight)
            t = asyncio.create_task(run(issued, due))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            issued += 1
        if now - shown > 0.1:  # the progress display costs CPU in this process too
            shown = now
            progress.update(
                task, completed=issued, rate=f"{rate:,.0f}/s target, {inflight} in flight"
            )
    progress.update(task, completed=issued)
    while tasks:
        await asyncio.gather(*list(tasks))
    return Open(rate, total, failures + dropped, latencies, max_lag * 1000, max_inflight, dropped)


# -- the ledger side: executor + client ---------------------------------------------------------


class Service(Protocol):
    """What runs where the executor runs (this process or a child): the executor or the relay."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def stats(self) -> dict[str, int]: ...


class ExecutorService:
    """``KafkaExecutor`` with the no-op tool; counts handler runs and committed batches."""

    def __init__(self, bootstrap: str, topics: Topics, *, instrument: bool = False) -> None:
        self.counter = Counter()
        self.commits = 0
        self.committed_events = 0
        self.instrument = instrument
        self.txn_ms: list[float] = []
        # per transaction: (begin + the sends, send_offsets, commit)
        self.txn_steps_ms: list[tuple[float, float, float]] = []
        self.executor = KafkaExecutor(
            bootstrap,
            topics,
            Stages(make_registry(self.counter, mark=instrument), Redactor(SECRET)),
            session_timeout_ms=SESSION_TIMEOUT_MS,
            on_committed=self._committed,
        )

    def _committed(self, events: Sequence[Event]) -> None:
        self.commits += 1
        self.committed_events += len(events)

    async def start(self) -> None:
        await self.executor.start()
        await self.executor.assigned.wait()
        for _ in range(300):  # one member: all partitions come in one assignment
            if len(self.executor.owned) == self.executor.topics.partitions:
                break
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError(f"the executor owns only partitions {sorted(self.executor.owned)}")
        if self.instrument:
            for owned in self.executor.owned.values():
                self._time_transactions(owned.producer)

    def _time_transactions(self, producer: Any) -> None:
        """Wraps one partition producer's transaction calls (on the instance, not the library)
        to time each transaction ``KafkaStore.commit`` runs, and its steps: ``send_offsets``
        (AddOffsetsToTxn + TxnOffsetCommit) and ``commit`` (produce acks + EndTxn)."""
        begin, offsets, commit = (
            producer.begin_transaction,
            producer.send_offsets_to_transaction,
            producer.commit_transaction,
        )
        marks = {"begin": 0.0, "sent": 0.0, "offsets": 0.0}

        async def timed_begin() -> None:
            marks["begin"], marks["sent"], marks["offsets"] = time.perf_counter(), 0.0, 0.0
            await begin()

        async def timed_offsets(*args: Any, **kwargs: Any) -> None:
            started = marks["sent"] = time.perf_counter()
            await offsets(*args, **kwargs)
            marks["offsets"] = time.perf_counter() - started

        async def timed_commit() -> None:
            started = time.perf_counter()
            sent = marks["sent"] or started
            await commit()
            ended = time.perf_counter()
            self.txn_ms.append((ended - marks["begin"]) * 1000)
            self.txn_steps_ms.append(
                ((sent - marks["begin"]) * 1000, marks["offsets"] * 1000, (ended - started) * 1000)
            )

        producer.begin_transaction = timed_begin
        producer.send_offsets_to_transaction = timed_offsets
        producer.commit_transaction = timed_commit

    async def stop(self) -> None:
        await self.executor.drain()
        await self.executor.stop()

    def stats(self) -> dict[str, int]:
        return {
            "handler_invocations": self.counter.invocations,
            "commits": self.commits,
            "committed_events": self.committed_events,
            "produce_retries": WARNINGS.produce_retries(),
        }


# -- the raw pipe ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RawTopics:
    a: str
    b: str
    group: str


class _Relay:
    """What both raw relays share: the group consumer of A (``read_committed``, manual
    offsets), the counters, and a start that waits for the assignment."""

    def __init__(self, bootstrap: str, raw: RawTopics, record_bytes: int) -> None:
        self.raw = raw
        self.record_bytes = record_bytes
        self.relayed = 0
        self.batches = 0  # polled batches (plain) or transactions (transactional)
        self.consumer = AIOKafkaConsumer(
            raw.a,
            bootstrap_servers=bootstrap,
            group_id=raw.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=SESSION_TIMEOUT_MS,
        )

    def answer(self, key: bytes | None) -> bytes:
        """The ``record_bytes`` record relayed to B for an input with ``key``."""
        return (key or b"").ljust(self.record_bytes, b".")

    async def _join(self) -> None:
        await self.consumer.start()
        for _ in range(300):  # joined and assigned before the first record is sent
            if len(self.consumer.assignment()) == PARTITIONS:
                return
            await asyncio.sleep(0.05)

    def stats(self) -> dict[str, int]:
        return {
            "relayed": self.relayed,
            "batches": self.batches,
            "produce_retries": WARNINGS.produce_retries(),
        }


class RelayService(_Relay):
    """The raw pipe's middle: consume A, produce B. No ledger, no transactions.

    Consumer: group ``raw.group``, ``read_committed``, manual offsets. Per polled batch it
    sends one ``record_bytes`` record per input record to B (same key, same partition) with a
    plain idempotent producer (``acks=all``, ``linger_ms=2``), and polls on at once; a task
    per batch waits until the broker has acknowledged that batch's records, then commits its
    offsets to the group, in poll order (at-least-once: what the executor gives, without the
    transactions, the state records and the call's two outcome events)."""

    def __init__(self, bootstrap: str, raw: RawTopics, record_bytes: int) -> None:
        super().__init__(bootstrap, raw, record_bytes)
        self.producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", linger_ms=LINGER_MS
        )
        self._task: asyncio.Task[None] | None = None
        self._last_commit: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.producer.start()
        await self._join()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=100, max_records=2000)
            if not batches:
                continue
            delivered = []
            offsets = {}
            for tp, records in batches.items():
                for record in records:
                    delivered.append(
                        await self.producer.send(
                            self.raw.b,
                            self.answer(record.key),
                            key=record.key,
                            partition=tp.partition,
                        )
                    )
                offsets[tp] = records[-1].offset + 1
            self._last_commit = asyncio.create_task(
                self._commit_when_acked(self._last_commit, delivered, offsets)
            )
            self.relayed += len(delivered)
            self.batches += 1

    async def _commit_when_acked(
        self, previous: asyncio.Task[None] | None, delivered: list[Any], offsets: dict[Any, int]
    ) -> None:
        await asyncio.gather(*delivered)
        if previous is not None:
            await previous
        await self.consumer.commit(offsets)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._last_commit is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._last_commit, 10)
        await self.consumer.stop()
        await self.producer.stop()


class TransactionalRelayService(_Relay):
    """The raw *transactional* pipe's middle: what any exactly-once design on Kafka pays.

    The same group consumer (``read_committed``, manual offsets) as :class:`RelayService`,
    and, as the executor has, one transactional producer per input partition
    (``transactional_id = <group>-<partition>``, ``acks=all``, ``linger_ms=2``). Each
    partition's records go to a task of their own that relays everything fetched for that
    partition since its last transaction in one transaction: begin, one ``record_bytes``
    record per input to B (same key, same partition), ``send_offsets_to_transaction`` for the
    inputs, commit. So many inputs share a transaction under load, as the executor's calls
    may (the floor, not a ledger: no state records, one output per input)."""

    def __init__(self, bootstrap: str, raw: RawTopics, record_bytes: int) -> None:
        super().__init__(bootstrap, raw, record_bytes)
        self.producers = [
            AIOKafkaProducer(
                bootstrap_servers=bootstrap,
                transactional_id=f"{raw.group}-{p}",
                enable_idempotence=True,
                acks="all",
                linger_ms=LINGER_MS,
            )
            for p in range(PARTITIONS)
        ]
        self._fetched: list[list[Any]] = [[] for _ in range(PARTITIONS)]
        self._ready = [asyncio.Event() for _ in range(PARTITIONS)]
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for producer in self.producers:
            await producer.start()  # init_transactions
        await self._join()
        self._tasks = [asyncio.create_task(self._relay(p)) for p in range(PARTITIONS)]
        self._tasks.append(asyncio.create_task(self._poll()))

    async def _poll(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=100, max_records=2000)
            for tp, records in batches.items():
                self._fetched[tp.partition].extend(records)
                self._ready[tp.partition].set()

    async def _relay(self, partition: int) -> None:
        producer = self.producers[partition]
        tp = TopicPartition(self.raw.a, partition)
        while True:
            await self._ready[partition].wait()
            self._ready[partition].clear()
            records, self._fetched[partition] = self._fetched[partition], []
            if not records:
                continue
            await producer.begin_transaction()
            for record in records:
                await producer.send(
                    self.raw.b, self.answer(record.key), key=record.key, partition=partition
                )
            await producer.send_offsets_to_transaction({tp: records[-1].offset + 1}, self.raw.group)
            await producer.commit_transaction()
            self.relayed += len(records)
            self.batches += 1

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, KafkaError):
                await task
        await self.consumer.stop()
        for producer in self.producers:
            await producer.stop()


class RawSender:
    """The raw pipe's ends: produce to A and await the answer from B, resolved by key."""

    def __init__(self, bootstrap: str, raw: RawTopics, record_bytes: int) -> None:
        self.raw = raw
        self.record_bytes = record_bytes
        self.producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", linger_ms=LINGER_MS
        )
        self.listener = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        self.waiting: dict[bytes, asyncio.Future[None]] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.producer.start()
        await self.listener.start()
        partitions = [TopicPartition(self.raw.b, p) for p in range(PARTITIONS)]
        self.listener.assign(partitions)
        await self.listener.seek_to_end(*partitions)
        for tp in partitions:
            await self.listener.position(tp)
        self._task = asyncio.create_task(self._listen())

    async def _listen(self) -> None:
        while True:
            batches = await self.listener.getmany(timeout_ms=200, max_records=1000)
            for records in batches.values():
                for record in records:
                    future = self.waiting.pop(record.key or b"", None)
                    if future is not None and not future.done():
                        future.set_result(None)

    async def call(self, ident: str) -> bool:
        key = ident.encode()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting[key] = future
        try:
            delivered = await self.producer.send(
                self.raw.a, key.ljust(self.record_bytes, b"-"), key=key
            )
            await delivered
            await asyncio.wait_for(future, CALL_TIMEOUT_S)
            return True
        except (TimeoutError, KafkaError):
            return False
        finally:
            self.waiting.pop(key, None)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.producer.stop()
        await self.listener.stop()


# -- where the executor / relay runs --------------------------------------------------------------


class Handle(Protocol):
    async def stats(self) -> dict[str, int]: ...

    async def stop(self) -> dict[str, int]: ...

    def cpu_s(self) -> float | None:
        """The service's own CPU seconds so far, where it has a process of its own whose CPU
        can be read (``/proc``); None where it cannot be told apart."""
        ...


class InProcess:
    """The service in this process: its CPU is in this process's, not apart (``cpu_s``)."""

    def __init__(self, service: Service) -> None:
        self.service = service

    @classmethod
    async def start(cls, service: Service) -> InProcess:
        await service.start()
        return cls(service)

    async def stats(self) -> dict[str, int]:
        return self.service.stats()

    async def stop(self) -> dict[str, int]:
        await self.service.stop()
        return self.service.stats()

    def cpu_s(self) -> float | None:
        return None


class Child:
    """The service in a child Python process (``--serve``); a line protocol on stdin/stdout:
    ``stats`` -> one JSON line; ``stop`` -> stops, one JSON line, exits."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, kind: str, bootstrap: str, prefix: str, record_bytes: int) -> Child:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.kafka",
            "--serve",
            kind,
            "--kafka",
            bootstrap,
            "--prefix",
            prefix,
            "--record-bytes",
            str(record_bytes),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        child = cls(proc)
        line = await child._line()
        if line != "READY":
            raise RuntimeError(f"the {kind} child did not start: {line!r}")
        return child

    async def _line(self) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), 120)
        return raw.decode().strip()

    async def _ask(self, command: str) -> dict[str, int]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{command}\n".encode())
        await self.proc.stdin.drain()
        answer: dict[str, int] = json.loads(await self._line())
        return answer

    async def stats(self) -> dict[str, int]:
        return await self._ask("stats")

    async def stop(self) -> dict[str, int]:
        answer = await self._ask("stop")
        await self.proc.wait()
        return answer

    def cpu_s(self) -> float | None:
        """The child's user + system CPU (``/proc/<pid>/stat``), while it runs."""
        return cpu_seconds(self.proc.pid) if PROCESS_CPU_READABLE else None


async def serve(kind: str, bootstrap: str, prefix: str, record_bytes: int) -> None:
    """The child side of :class:`Child`."""
    logging.getLogger().addHandler(WARNINGS)
    service: Service
    if kind == "executor":
        service = ExecutorService(bootstrap, Topics(prefix, PARTITIONS))
    else:
        service = relay_service(kind, bootstrap, prefix, record_bytes)
    await service.start()
    print("READY", flush=True)
    while True:
        command = (await asyncio.to_thread(sys.stdin.readline)).strip()
        if command in ("stop", ""):
            await service.stop()
            print(json.dumps(service.stats()), flush=True)
            return
        print(json.dumps(service.stats()), flush=True)


async def start_side(
    mode: str, kind: str, bootstrap: str, prefix: str, record_bytes: int
) -> tuple[Handle, ExecutorService | None]:
    if mode == "subprocess":
        return await Child.start(kind, bootstrap, prefix, record_bytes), None
    if kind == "executor":
        executor = ExecutorService(bootstrap, Topics(prefix, PARTITIONS), instrument=True)
        return await InProcess.start(executor), executor
    return await InProcess.start(relay_service(kind, bootstrap, prefix, record_bytes)), None


@dataclass(frozen=True)
class RelayKind:
    """A raw pipe: the prefix of its topics and group, its label, its relay."""

    topics: str
    label: str
    service: type[RelayService] | type[TransactionalRelayService]


# the plain raw pipe and the transactional one; each has topics and a group of its own, so
# that neither reads what the other wrote
RELAY_KINDS: Final = {
    "relay": RelayKind("raw", "raw pipe", RelayService),
    "txrelay": RelayKind("rawtx", "raw txn pipe", TransactionalRelayService),
}
RELAYS = tuple(RELAY_KINDS)


def relay_service(kind: str, bootstrap: str, prefix: str, record_bytes: int) -> Service:
    return RELAY_KINDS[kind].service(bootstrap, raw_topics(prefix, kind), record_bytes)


def raw_topics(prefix: str, kind: str = "relay") -> RawTopics:
    name = RELAY_KINDS[kind].topics
    return RawTopics(f"{prefix}{name}-a", f"{prefix}{name}-b", f"{prefix}{name}-relay")


async def create_raw_topics(bootstrap: str, raw: RawTopics) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(raw.a, PARTITIONS, 1), NewTopic(raw.b, PARTITIONS, 1)])
        for _ in range(100):
            described = await admin.describe_topics([raw.a, raw.b])
            if all(
                len(t["partitions"]) == PARTITIONS
                and all(p["leader"] >= 0 for p in t["partitions"])
                for t in described
            ):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError("the raw topics have no leaders")
    finally:
        await admin.close()


async def delete_topics(bootstrap: str, prefix: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [t for t in await admin.list_topics() if t.startswith(prefix)]
        if names:
            await admin.delete_topics(names)
    finally:
        await admin.close()


# -- the ledger calls -----------------------------------------------------------------------------


class TimedTransport(KafkaTransport):
    """``KafkaTransport`` that notes when each intent was acknowledged by the broker."""

    def __init__(self, bootstrap: str, topics: Topics) -> None:
        super().__init__(bootstrap, topics)
        self.acked: dict[str, float] = {}

    async def send(self, intent: Event) -> None:
        await super().send(intent)
        self.acked[intent.envelope.idempotency_key] = time.perf_counter()


@dataclass
class Breakdown:
    """Where one call's time goes (executor in this process: one clock for all three)."""

    to_intent_acked_ms: list[float] = field(default_factory=list)
    acked_to_handler_ms: list[float] = field(default_factory=list)
    handler_to_answer_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, dict[str, float]]:
        return {
            name: {
                "p50": round(percentile(values, 0.5), 2),
                "p99": round(percentile(values, 0.99), 2),
            }
            for name, values in (
                ("client_to_intent_acked", self.to_intent_acked_ms),
                ("intent_acked_to_handler", self.acked_to_handler_ms),
                ("handler_to_answer", self.handler_to_answer_ms),
            )
        }


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class Checks:
    calls: int = 0
    not_ok: int = 0
    replayed: int = 0
    examples: list[str] = field(default_factory=list)
    outcome_bytes: int = 0
    breakdown: Breakdown = field(default_factory=Breakdown)


def ledger_call(
    client: LedgerClient,
    prefix: str,
    checks: Checks,
    transport: TimedTransport,
    counter: Counter | None,
) -> OneCall:
    async def one(i: int) -> bool:
        key = f"{prefix}-{i:08d}"
        started = time.perf_counter()
        result = await client.call(TOOL, {"text": f"n{i}"}, idempotency_key=key, context=CONTEXT)
        ended = time.perf_counter()
        checks.calls += 1
        acked = transport.acked.pop(key, None)
        handled = counter.marks.pop(key, None) if counter is not None else None
        if not result.ok or result.replayed:
            if result.replayed:
                checks.replayed += 1
            else:
                checks.not_ok += 1
            if len(checks.examples) < 3:
                checks.examples.append(f"{key}: {result.to_json()}")
            return False
        if not checks.outcome_bytes and result.event is not None:
            checks.outcome_bytes = len(encode(result.event))
        if acked is not None and handled is not None:
            checks.breakdown.to_intent_acked_ms.append((acked - started) * 1000)
            checks.breakdown.acked_to_handler_ms.append((handled - acked) * 1000)
            checks.breakdown.handler_to_answer_ms.append((ended - handled) * 1000)
        return True

    return one


@dataclass
class LedgerPhase:
    name: str
    checks: Checks
    handler_invocations: int = 0
    produce_retries: int = 0  # in this process (the client's; the executor's if in-process)
    process_cpu_s: float = 0.0  # this process (the client; the executor too if in-process)
    executor_cpu_s: float | None = None  # the executor's own process (None: in this one)
    txn_ms: list[float] = field(default_factory=list)
    txn_steps_ms: list[tuple[float, float, float]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (
            self.checks.not_ok == 0
            and self.checks.replayed == 0
            and self.handler_invocations == self.checks.calls
        )

    def summary(self) -> dict[str, Any]:
        c = self.checks
        return {
            "passed": self.passed,
            "calls": c.calls,
            "not_ok": c.not_ok,
            "replayed": c.replayed,
            "handler_invocations": self.handler_invocations,
            "examples": c.examples,
        }

    def cpu_ms_per_call(self) -> dict[str, float | None]:
        """CPU ms per call: this process's, the executor process's (None when it runs in this
        one) and their sum."""
        calls = max(1, self.checks.calls)
        executor = self.executor_cpu_s
        return {
            "cpu_ms_per_call": round((self.process_cpu_s + (executor or 0.0)) * 1000 / calls, 4),
            "process_cpu_ms_per_call": round(self.process_cpu_s * 1000 / calls, 4),
            "executor_cpu_ms_per_call": None
            if executor is None
            else round(executor * 1000 / calls, 4),
        }

    def diagnostics(self) -> dict[str, Any]:
        txn = self.txn_ms
        sends = [s for s, _, _ in self.txn_steps_ms]
        with_offsets = [o for _, o, _ in self.txn_steps_ms if o > 0]
        commits = [c for _, _, c in self.txn_steps_ms]
        return {
            **self.cpu_ms_per_call(),
            "produce_retries_logged": self.produce_retries,
            "executor_transactions": len(txn),
            "executor_transaction_ms": {
                "p50": round(percentile(txn, 0.5), 2),
                "p99": round(percentile(txn, 0.99), 2),
                "max": round(max(txn, default=math.nan), 2),
                "share_over_100ms": round(sum(t > 100 for t in txn) / max(1, len(txn)), 4),
                "begin_and_sends_p50": round(percentile(sends, 0.5), 2),
                "send_offsets_p50": round(percentile(with_offsets, 0.5), 2),
                "commit_transaction_p50": round(percentile(commits, 0.5), 2),
                "with_send_offsets": len(with_offsets),
            },
            "latency_breakdown_ms": self.checks.breakdown.summary(),
        }


@dataclass
class Ledger:
    client: LedgerClient
    transport: TimedTransport
    side: Handle
    local: ExecutorService | None  # None: the executor runs in a child process


async def run_ledger_phase(
    name: str, ledger: Ledger, prefix: str, work: Callable[[OneCall], Awaitable[Any]]
) -> tuple[LedgerPhase, Any]:
    """Runs ``work(one_call)``; the phase's handler count is the executor's count delta."""
    side = ledger.side
    stats_before = await side.stats()
    before = stats_before["handler_invocations"]
    cpu_before, executor_before = time.process_time(), side.cpu_s()
    retries_before = WARNINGS.produce_retries()
    phase = LedgerPhase(name, Checks())
    counter = ledger.local.counter if ledger.local is not None else None
    txn_before = len(ledger.local.txn_ms) if ledger.local is not None else 0
    result = await work(ledger_call(ledger.client, prefix, phase.checks, ledger.transport, counter))
    phase.process_cpu_s = time.process_time() - cpu_before
    executor_after = side.cpu_s()
    if executor_before is not None and executor_after is not None:
        phase.executor_cpu_s = executor_after - executor_before
    phase.produce_retries = WARNINGS.produce_retries() - retries_before
    if ledger.local is not None:
        phase.txn_ms = ledger.local.txn_ms[txn_before:]
        phase.txn_steps_ms = ledger.local.txn_steps_ms[txn_before:]
    for _ in range(50):  # a call answered by a timeout may still be running: let it land
        phase.handler_invocations = (await side.stats())["handler_invocations"] - before
        if phase.handler_invocations >= phase.checks.calls:
            break
        await asyncio.sleep(0.1)
    return phase, result


# -- the projector and the COPY baseline ----------------------------------------------------------


class TimedProjection(PostgresProjection):
    """Records when each ``apply`` starts and ends, and how many events it carried."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.first_start: float | None = None
        self.last_end = 0.0
        self.batch_sizes: list[int] = []
        self.apply_seconds = 0.0
        self.applies_without_events = 0
        self.seconds_without_events = 0.0

    async def apply(
        self,
        events: Sequence[tuple[Event, Position]],
        consumer: str,
        topic: str,
        *,
        dead_letters: Sequence[DeadLetterRecord] = (),
        next_offsets: Mapping[tuple[str, int], int] | None = None,
    ) -> ApplyResult:
        started = time.perf_counter()
        if self.first_start is None:
            self.first_start = started
        result = await super().apply(
            events, consumer, topic, dead_letters=dead_letters, next_offsets=next_offsets
        )
        self.last_end = time.perf_counter()
        self.apply_seconds += self.last_end - started
        if events:
            self.batch_sizes.append(len(events))
        else:  # only positions moved (past transaction markers): a transaction all the same
            self.applies_without_events += 1
            self.seconds_without_events += self.last_end - started
        return result


@contextlib.asynccontextmanager
async def fresh_database(dsn: str) -> AsyncIterator[str]:
    base = conninfo_to_dict(dsn)
    name = f"{base.get('dbname') or 'toolledger'}_bench_{uuid.uuid4().hex[:8]}"
    admin = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:
        await admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield make_conninfo(dsn, dbname=name)
        finally:
            await admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    finally:
        await admin.close()


@dataclass
class ProjectorRun:
    rows_per_s: float
    events: int
    seconds: float
    seconds_incl_join: float
    batches: list[int]
    apply_seconds: float
    tool_calls_rows: int
    event_rows: int
    applies_without_events: int
    seconds_without_events: float
    cpu_s: float  # this process's CPU time while the projector ran (its group join included)
    cpu_share: float  # cpu_s / the wall time it ran


async def run_projector(
    bootstrap: str, topics: Topics, dsn: str, expected_events: int, progress: Progress
) -> ProjectorRun:
    await migrate(dsn)
    projection = TimedProjection(dsn)
    await projection.open()
    task = progress.add_task("projector -> PostgreSQL", total=expected_events, rate="")
    try:
        projector = KafkaProjector(bootstrap, topics, projection)
        started = time.perf_counter()
        cpu_started = time.process_time()
        await projector.start()
        try:
            deadline = started + 300
            while not await projector.caught_up():
                if time.perf_counter() > deadline:
                    raise RuntimeError("the projector did not catch up within 300 s")
                progress.update(task, completed=projector.events_applied)
                await asyncio.sleep(0.05)
            progress.update(task, completed=projector.events_applied)
            events = projector.events_applied
            cpu_s = time.process_time() - cpu_started
            cpu_share = cpu_s / (time.perf_counter() - started)
        finally:
            await projector.stop()
        assert projection.first_start is not None
        seconds = projection.last_end - projection.first_start
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            calls_row = await (await conn.execute("SELECT count(*) FROM tool_calls")).fetchone()
            events_row = await (
                await conn.execute("SELECT count(*) FROM tool_call_events")
            ).fetchone()
        progress.update(task, rate=f"{events / seconds:,.0f} events/s")
        return ProjectorRun(
            events / seconds,
            events,
            seconds,
            projection.last_end - started,
            projection.batch_sizes,
            projection.apply_seconds,
            int(calls_row[0]) if calls_row else -1,
            int(events_row[0]) if events_row else -1,
            projection.applies_without_events,
            projection.seconds_without_events,
            cpu_s,
            cpu_share,
        )
    finally:
        await projection.close()


_COPY_TYPES = {
    "log_partition": "integer",
    "log_offset": "bigint",
    "occurred_at": "timestamptz",
    "payload_json": "jsonb",  # read back as a document (no text loader here), written as one
}


async def run_raw_copy(dsn: str, batches: Sequence[int], progress: Progress) -> tuple[float, float]:
    """The projector's audit rows, written again by binary COPY into a plain table (same
    columns and types, no index, no constraint), batch by batch, one transaction each.
    Rows per second, and this process's CPU ms per row (the client's side of the COPY)."""
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in EVENT_COLUMNS)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            sql.SQL("SELECT {} FROM tool_call_events ORDER BY seq").format(columns)
        )
        rows = await cur.fetchall()
        await conn.execute(
            sql.SQL(
                "CREATE TABLE bench_raw_copy AS SELECT {} FROM tool_call_events WITH NO DATA"
            ).format(columns)
        )
        await conn.commit()
        copy_sql = sql.SQL("COPY bench_raw_copy ({}) FROM STDIN (FORMAT BINARY)").format(columns)
        types = [_COPY_TYPES.get(c, "text") for c in EVENT_COLUMNS]
        task = progress.add_task("raw COPY -> PostgreSQL", total=len(rows), rate="")
        started, cpu_started = time.perf_counter(), time.process_time()
        at = 0
        sizes = list(batches) or [len(rows)]
        while at < len(rows):
            for size in sizes:
                chunk = rows[at : at + size]
                if not chunk:
                    break
                async with conn.transaction(), conn.cursor() as c, c.copy(copy_sql) as copy:
                    copy.set_types(types)
                    for row in chunk:
                        await copy.write_row(row)
                at += len(chunk)
                progress.update(task, completed=at)
        seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
        progress.update(task, rate=f"{len(rows) / seconds:,.0f} rows/s")
        count = await (await conn.execute("SELECT count(*) FROM bench_raw_copy")).fetchone()
        if not count or int(count[0]) != len(rows):
            raise RuntimeError(f"raw COPY wrote {count} rows, expected {len(rows)}")
        return len(rows) / seconds, cpu_s * 1000 / len(rows)


# -- record sizes ---------------------------------------------------------------------------------


async def sample_sizes(bootstrap: str, names: Mapping[str, str]) -> dict[str, float]:
    """Mean key + value bytes of the first records of partition 0 of each topic."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    sizes: dict[str, float] = {}
    try:
        for label, topic in names.items():
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            records = (await consumer.getmany(tp, timeout_ms=2000, max_records=50)).get(tp, [])
            if records:
                sizes[label] = round(
                    statistics.mean(len(r.value or b"") + len(r.key or b"") for r in records), 1
                )
    finally:
        await consumer.stop()
    return sizes


# -- driver ---------------------------------------------------------------------------------------


async def sequential(one: OneCall, n: int, progress: Progress, task: TaskID) -> list[float]:
    """``n`` calls one after another: the latency of an idle system."""
    latencies = []
    for i in range(n):
        started = time.perf_counter()
        if await one(i):
            latencies.append((time.perf_counter() - started) * 1000)
        progress.update(task, completed=i + 1)
    return latencies


@dataclass
class RawPipeRun:
    """One raw pipe's measurements: closed-loop throughput, open-loop latency at half of it,
    one call at a time; CPU of the round trips; the relay's counters."""

    run: Closed
    lat: Open
    idle: list[float]
    process_cpu_s: float  # this process over the round trips (the relay's too if in-process)
    relay_cpu_s: float | None  # the relay's own process (None: in this one)
    relay_stats: dict[str, int]
    produce_retries_logged: int

    def cpu_ms_per_round_trip(self) -> dict[str, float | None]:
        """As :meth:`LedgerPhase.cpu_ms_per_call`: this process, the relay's, their sum."""
        n, relay = self.run.calls, self.relay_cpu_s
        return {
            "cpu_ms_per_round_trip": round((self.process_cpu_s + (relay or 0.0)) * 1000 / n, 4),
            "process_cpu_ms_per_round_trip": round(self.process_cpu_s * 1000 / n, 4),
            "relay_cpu_ms_per_round_trip": None if relay is None else round(relay * 1000 / n, 4),
        }

    def checks(self) -> dict[str, Any]:
        return {
            "passed": self.run.failures == 0 and self.lat.failures == 0,
            "timeouts": self.run.failures + self.lat.failures,
            "relayed": self.relay_stats.get("relayed"),
        }


async def run_raw_pipe(
    kind: str, args: argparse.Namespace, bootstrap: str, prefix: str, progress: Progress
) -> RawPipeRun:
    """The raw pipe ``kind`` (:data:`RELAYS`) measured as the ledger is, with its own topics."""
    name = RELAY_KINDS[kind].label
    raw = raw_topics(prefix, kind)
    relay, _ = await start_side(args.executor, kind, bootstrap, prefix, args.record_bytes)
    sender = RawSender(bootstrap, raw, args.record_bytes)
    await sender.start()
    warnings_before = WARNINGS.produce_retries()

    def closed(n: int, label: str) -> Callable[[OneCall], Awaitable[Closed]]:
        task = progress.add_task(f"{name} {label}", total=n, rate="")
        return lambda one: closed_loop(one, n, args.inflight, progress, task, "msgs")

    try:
        await closed(args.warmup, "warm-up")(lambda i: sender.call(f"w{i:010d}"))
        cpu_before, relay_before = time.process_time(), relay.cpu_s()
        run = await closed(args.raw_calls, "round trips")(lambda i: sender.call(f"k{i:010d}"))
        cpu, relay_after = time.process_time() - cpu_before, relay.cpu_s()
        relay_cpu = (
            None if relay_before is None or relay_after is None else relay_after - relay_before
        )
        rate = 0.5 * run.per_s
        task = progress.add_task(
            f"{name} latency @ 0.5 x max", total=max(1, int(rate * args.latency_seconds)), rate=""
        )
        lat = await open_loop(
            lambda i: sender.call(f"l{i:010d}"), rate, args.latency_seconds, progress, task
        )
        task = progress.add_task(f"{name} idle, one at a time", total=args.idle_calls, rate="")
        idle = await sequential(
            lambda i: sender.call(f"i{i:010d}"), args.idle_calls, progress, task
        )
    finally:
        await sender.stop()
        relay_stats = await relay.stop()
    retries = WARNINGS.produce_retries() - warnings_before
    if args.executor == "subprocess":
        retries += relay_stats.get("produce_retries", 0)
    return RawPipeRun(run, lat, idle, cpu, relay_cpu, relay_stats, retries)


async def start_ledger(mode: str, bootstrap: str, topics: Topics, record_bytes: int) -> Ledger:
    side, local = await start_side(mode, "executor", bootstrap, topics.prefix, record_bytes)
    transport = TimedTransport(bootstrap, topics)
    await transport.start()
    return Ledger(LedgerClient(transport), transport, side, local)


async def measure(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    bootstrap: str = args.kafka
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    topics = Topics(prefix, PARTITIONS)
    inflight: int = args.inflight
    await ensure_topics(bootstrap, topics)
    for kind in RELAYS:
        await create_raw_topics(bootstrap, raw_topics(prefix, kind))
    phases: list[LedgerPhase] = []
    warnings_at: dict[str, int] = {}
    load_start = round(os.getloadavg()[0], 2)  # other work on the machine skews everything

    def closed(n: int, task: TaskID, unit: str) -> Callable[[OneCall], Awaitable[Closed]]:
        return lambda one: closed_loop(one, n, inflight, progress, task, unit)

    try:
        with new_progress(console, 30) as progress:
            # -- the ledger: throughput, then latency at half of it, then idle latency
            ledger = await start_ledger(args.executor, bootstrap, topics, args.record_bytes)
            warnings_at["ledger_started"] = WARNINGS.produce_retries()
            try:
                task = progress.add_task("e2e warm-up", total=args.warmup, rate="")
                warm, _ = await run_ledger_phase(
                    "warmup", ledger, "w", closed(args.warmup, task, "calls")
                )
                phases.append(warm)
                task = progress.add_task("e2e ledger calls", total=args.calls, rate="")
                e2e_phase, e2e = await run_ledger_phase(
                    "e2e", ledger, "k", closed(args.calls, task, "calls")
                )
                phases.append(e2e_phase)
                assert isinstance(e2e, Closed)
                rate = 0.5 * e2e.per_s
                task = progress.add_task(
                    "e2e latency @ 0.5 x max",
                    total=max(1, int(rate * args.latency_seconds)),
                    rate="",
                )
                lat_phase, lat = await run_ledger_phase(
                    "latency",
                    ledger,
                    "l",
                    lambda one: open_loop(one, rate, args.latency_seconds, progress, task),
                )
                phases.append(lat_phase)
                assert isinstance(lat, Open)
                task = progress.add_task("e2e idle, one at a time", total=args.idle_calls, rate="")
                idle_phase, idle = await run_ledger_phase(
                    "idle",
                    ledger,
                    "i",
                    lambda one: sequential(one, args.idle_calls, progress, task),
                )
                phases.append(idle_phase)
            finally:
                await ledger.transport.stop()
                executor_stats = await ledger.side.stop()
            warnings_at["ledger_stopped"] = WARNINGS.produce_retries()
            # -- the raw pipes, plain and transactional: the same measurements
            pipes = {
                kind: await run_raw_pipe(kind, args, bootstrap, prefix, progress) for kind in RELAYS
            }
            sizes = await sample_sizes(
                bootstrap,
                {
                    "intent": topics.intents,
                    "outcome": topics.outcomes,
                    "state": topics.state,
                    "raw_a": raw_topics(prefix).a,
                    "raw_b": raw_topics(prefix).b,
                },
            )
            # -- the projector over everything above, then the COPY baseline
            total_calls = sum(p.checks.calls for p in phases)
            async with fresh_database(args.postgres) as dsn:
                projector = await run_projector(bootstrap, topics, dsn, 2 * total_calls, progress)
                copy_rate, copy_cpu_ms = await run_raw_copy(dsn, projector.batches, progress)
                async with await psycopg.AsyncConnection.connect(dsn) as conn:
                    pg_version = conn.info.server_version
    finally:
        with contextlib.suppress(Exception):
            await delete_topics(bootstrap, prefix)

    plain, txn = pipes["relay"], pipes["txrelay"]
    raw_run, raw_lat, raw_idle = plain.run, plain.lat, plain.idle
    ratio_e2e = e2e.per_s / raw_run.per_s
    ratio_e2e_txn = e2e.per_s / txn.run.per_s
    ratio_projector = projector.rows_per_s / copy_rate
    p99, raw_p99 = lat.percentile(0.99), raw_lat.percentile(0.99)
    checks = {p.name: p.summary() for p in phases}
    checks["raw_pipe"] = plain.checks()
    checks["raw_txn_pipe"] = txn.checks()
    checks["projector"] = {
        "passed": projector.tool_calls_rows == total_calls
        and projector.event_rows == projector.events,
        "tool_calls_rows": projector.tool_calls_rows,
        "calls": total_calls,
        "events_applied": projector.events,
        "tool_call_events_rows": projector.event_rows,
    }
    commits = executor_stats.get("commits", 0)
    e2e_cpu, plain_cpu, txn_cpu = (
        e2e_phase.cpu_ms_per_call(),
        plain.cpu_ms_per_round_trip(),
        txn.cpu_ms_per_round_trip(),
    )
    return {
        "e2e_calls_per_s": round(e2e.per_s, 1),
        "raw_pipe_msgs_per_s": round(raw_run.per_s, 1),
        "ratio_e2e_vs_raw_pipe": round(ratio_e2e, 4),
        "raw_txn_pipe_msgs_per_s": round(txn.run.per_s, 1),
        "ratio_e2e_vs_raw_txn_pipe": round(ratio_e2e_txn, 4),
        "projector_rows_per_s": round(projector.rows_per_s, 1),
        "raw_copy_rows_per_s": round(copy_rate, 1),
        "ratio_projector_vs_copy": round(ratio_projector, 4),
        "p50_ms": round(lat.percentile(0.5), 2),
        "p99_ms": round(p99, 2),
        "raw_pipe_p50_ms": round(raw_lat.percentile(0.5), 2),
        "raw_pipe_p99_ms": round(raw_p99, 2),
        "raw_txn_pipe_p50_ms": round(txn.lat.percentile(0.5), 2),
        "raw_txn_pipe_p99_ms": round(txn.lat.percentile(0.99), 2),
        "executor_cpu_ms_per_call": e2e_cpu["executor_cpu_ms_per_call"],
        "e2e_cpu_ms_per_call": e2e_cpu["cpu_ms_per_call"],
        "raw_txn_relay_cpu_ms_per_round_trip": txn_cpu["relay_cpu_ms_per_round_trip"],
        "raw_txn_pipe_cpu_ms_per_round_trip": txn_cpu["cpu_ms_per_round_trip"],
        "projector_cpu_ms_per_event": round(projector.cpu_s * 1000 / max(1, projector.events), 4),
        "raw_copy_cpu_ms_per_row": round(copy_cpu_ms, 4),
        "meta": {
            "calls": args.calls,
            "raw_pipe_calls": args.raw_calls,
            "warmup_calls": args.warmup,
            "inflight": inflight,
            "partitions": PARTITIONS,
            "record_bytes": args.record_bytes,
            "record_bytes_sampled_key_plus_value": sizes,
            "ledger_outcome_event_bytes": e2e_phase.checks.outcome_bytes,
            "executor": args.executor,
            "executor_concurrency_per_partition": 64,
            "linger_ms": LINGER_MS,
            "seconds": {
                "e2e": round(e2e.seconds, 3),
                "raw_pipe": round(raw_run.seconds, 3),
                "raw_txn_pipe": round(txn.run.seconds, 3),
                "projector": round(projector.seconds, 3),
                "projector_incl_group_join": round(projector.seconds_incl_join, 3),
                "projector_inside_apply": round(projector.apply_seconds, 3),
            },
            "latency": {
                "seconds": args.latency_seconds,
                "e2e": latency_meta(lat),
                "raw_pipe": latency_meta(raw_lat),
                "raw_txn_pipe": latency_meta(txn.lat),
                "idle_one_at_a_time": {
                    "calls": args.idle_calls,
                    "e2e_p50_ms": round(percentile(idle, 0.5), 2),
                    "e2e_max_ms": round(max(idle, default=math.nan), 2),
                    "raw_pipe_p50_ms": round(percentile(raw_idle, 0.5), 2),
                    "raw_pipe_max_ms": round(max(raw_idle, default=math.nan), 2),
                    "raw_txn_pipe_p50_ms": round(percentile(txn.idle, 0.5), 2),
                    "raw_txn_pipe_max_ms": round(max(txn.idle, default=math.nan), 2),
                },
            },
            "load_average_1m": {"start": load_start, "end": round(os.getloadavg()[0], 2)},
            "diagnostics": {
                "raw_pipe_cpu_ms_per_round_trip": plain_cpu["cpu_ms_per_round_trip"],
                "raw_txn_pipe_cpu_ms_per_round_trip": txn_cpu["cpu_ms_per_round_trip"],
                "raw_pipe_cpu": plain_cpu,
                "raw_txn_pipe_cpu": txn_cpu,
                "raw_txn_pipe_transactions": txn.relay_stats.get("batches"),
                "raw_txn_pipe_records_per_transaction": round(
                    txn.relay_stats.get("relayed", 0) / max(1, txn.relay_stats.get("batches", 0)), 2
                ),
                **{p.name: p.diagnostics() for p in phases},
                "executor_commits": commits,
                "executor_events_per_commit": round(
                    executor_stats.get("committed_events", 0) / max(1, commits), 2
                ),
                "produce_retries_logged": {
                    "executor_and_client_process": warnings_at["ledger_stopped"],
                    "raw_pipe": plain.produce_retries_logged,
                    "raw_txn_pipe": txn.produce_retries_logged,
                    "executor_child": executor_stats.get("produce_retries", 0)
                    * (args.executor == "subprocess"),
                },
                "warnings": dict(WARNINGS.counts),
                "relay_batches": plain.relay_stats.get("batches"),
                "projector_batches": len(projector.batches),
                "projector_applies_without_events": projector.applies_without_events,
                "projector_seconds_in_applies_without_events": round(
                    projector.seconds_without_events, 3
                ),
                "projector_process_cpu_share": round(projector.cpu_share, 3),
                "projector_events_per_batch": round(statistics.mean(projector.batches), 1)
                if projector.batches
                else 0,
            },
            "targets": {
                "ratio_e2e_vs_raw_pipe>=0.5": ratio_e2e >= 0.5,
                "ratio_e2e_vs_raw_txn_pipe>=0.5": ratio_e2e_txn >= 0.5,
                "ratio_projector_vs_copy>=0.5": ratio_projector >= 0.5,
                "p99<=3x_raw_pipe_p99": p99 <= 3 * raw_p99,
            },
            "checks": checks,
            "versions": {
                "python": platform.python_version(),
                "aiokafka": aiokafka.__version__,
                "psycopg": psycopg.__version__,
                "postgresql_server": pg_version,
                "kafka_broker": args.kafka_version or "unknown",
            },
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    }


def finite(value: Any) -> Any:
    """NaN / infinity (an empty sample) become ``null``: the file stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def latency_meta(run: Open) -> dict[str, Any]:
    return {
        "target_rate_per_s": round(run.rate, 1),
        "calls": run.calls,
        "failures": run.failures,
        "p90_ms": round(run.percentile(0.9), 2),
        "p999_ms": round(run.percentile(0.999), 2),
        "max_ms": round(max(run.latencies_ms, default=math.nan), 2),
        "max_issue_lag_ms": round(run.max_issue_lag_ms, 2),
        "max_inflight": run.max_inflight,
        "dropped_overloaded": run.dropped,
    }


def show(result: dict[str, Any], console: Console) -> None:
    meta = result["meta"]
    targets = meta["targets"]

    def mark(ok: bool) -> str:
        return "[green]met" if ok else "[red]NOT met"

    table = Table(
        title=f"toolledger on Kafka + PostgreSQL: {meta['calls']} calls, "
        f"{meta['inflight']} in flight, {meta['partitions']} partitions, "
        f"executor {meta['executor']}"
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("notes")
    table.add_row(
        "e2e_calls_per_s",
        f"{result['e2e_calls_per_s']:,.1f}",
        f"{meta['calls']} calls, {meta['seconds']['e2e']} s, checks "
        f"{'ok' if meta['checks']['e2e']['passed'] else '[red]FAILED'}",
    )
    table.add_row(
        "raw_pipe_msgs_per_s",
        f"{result['raw_pipe_msgs_per_s']:,.1f}",
        f"{meta['raw_pipe_calls']} round trips, {meta['seconds']['raw_pipe']} s",
    )
    table.add_row(
        "ratio_e2e_vs_raw_pipe",
        f"{result['ratio_e2e_vs_raw_pipe']:.4f}",
        f">= 0.5: {mark(targets['ratio_e2e_vs_raw_pipe>=0.5'])}",
    )
    table.add_row(
        "raw_txn_pipe_msgs_per_s",
        f"{result['raw_txn_pipe_msgs_per_s']:,.1f}",
        "consume, produce + offsets in one transaction per partition batch, consume",
    )
    table.add_row(
        "ratio_e2e_vs_raw_txn_pipe",
        f"{result['ratio_e2e_vs_raw_txn_pipe']:.4f}",
        f">= 0.5: {mark(targets['ratio_e2e_vs_raw_txn_pipe>=0.5'])}",
    )
    table.add_row(
        "p50_ms / p99_ms",
        f"{result['p50_ms']:.1f} / {result['p99_ms']:.1f}",
        f"at {meta['latency']['e2e']['target_rate_per_s']:,.0f} calls/s",
    )
    table.add_row(
        "raw_pipe_p50_ms / p99_ms",
        f"{result['raw_pipe_p50_ms']:.1f} / {result['raw_pipe_p99_ms']:.1f}",
        f"at {meta['latency']['raw_pipe']['target_rate_per_s']:,.0f} msgs/s; "
        f"p99 <= 3x raw: {mark(targets['p99<=3x_raw_pipe_p99'])}",
    )
    table.add_row(
        "projector_rows_per_s",
        f"{result['projector_rows_per_s']:,.1f}",
        f"{meta['checks']['projector']['events_applied']} events, "
        f"{meta['diagnostics']['projector_batches']} batches",
    )
    table.add_row(
        "raw_copy_rows_per_s",
        f"{result['raw_copy_rows_per_s']:,.1f}",
        "same rows, same batches, plain table",
    )
    table.add_row(
        "ratio_projector_vs_copy",
        f"{result['ratio_projector_vs_copy']:.4f}",
        f">= 0.5: {mark(targets['ratio_projector_vs_copy>=0.5'])}",
    )

    def ms(value: float | None) -> str:
        return "not apart" if value is None else f"{value:.3f}"

    table.add_row(
        "CPU ms per call: executor",
        ms(result["executor_cpu_ms_per_call"]),
        "its own process (--executor subprocess, /proc); in-process it is in the next line",
    )
    table.add_row(
        "CPU ms per call: e2e",
        ms(result["e2e_cpu_ms_per_call"]),
        "client + executor processes",
    )
    table.add_row(
        "CPU ms per round trip: txn relay / pipe",
        f"{ms(result['raw_txn_relay_cpu_ms_per_round_trip'])} / "
        f"{ms(result['raw_txn_pipe_cpu_ms_per_round_trip'])}",
        "the transactional relay alone / sender + relay",
    )
    table.add_row(
        "CPU ms per event: projector / COPY",
        f"{ms(result['projector_cpu_ms_per_event'])} / {ms(result['raw_copy_cpu_ms_per_row'])}",
        "this process (PostgreSQL's CPU not included)",
    )
    idle = meta["latency"]["idle_one_at_a_time"]
    table.add_row(
        "idle latency (p50)",
        f"{idle['e2e_p50_ms']:.1f} / {idle['raw_pipe_p50_ms']:.1f}",
        "ms, one call at a time: ledger / raw pipe",
    )
    console.print(table)
    for name, summary in meta["checks"].items():
        if not summary["passed"]:
            console.print(f"[red]checks failed ({name}): {summary}")


# -- profile --------------------------------------------------------------------------------------


async def profile_e2e(args: argparse.Namespace, console: Console) -> None:
    """One e2e closed-loop run, executor in this process (so its work is in the profile too)."""
    bootstrap: str = args.kafka
    prefix = f"benchprof{uuid.uuid4().hex[:8]}."
    topics = Topics(prefix, PARTITIONS)
    await ensure_topics(bootstrap, topics)
    # CPU time by default: on a shared machine, wall time charges preemption to whichever
    # call was running (typically a socket send) and hides where the CPU goes
    profiler = (
        cProfile.Profile(time.process_time) if args.profile_clock == "cpu" else cProfile.Profile()
    )
    try:
        with new_progress(console, 30) as progress:
            ledger = await start_ledger("inprocess", bootstrap, topics, args.record_bytes)
            try:
                task = progress.add_task("profile warm-up", total=args.warmup, rate="")
                await run_ledger_phase(
                    "warmup",
                    ledger,
                    "w",
                    lambda one: closed_loop(
                        one, args.warmup, args.inflight, progress, task, "calls"
                    ),
                )
                task = progress.add_task("profiled e2e calls", total=args.profile_calls, rate="")

                async def profiled(one: OneCall) -> Closed:
                    profiler.enable()
                    try:
                        return await closed_loop(
                            one, args.profile_calls, args.inflight, progress, task, "calls"
                        )
                    finally:
                        profiler.disable()

                phase, run = await run_ledger_phase("profile", ledger, "p", profiled)
            finally:
                await ledger.transport.stop()
                await ledger.side.stop()
    finally:
        with contextlib.suppress(Exception):
            await delete_topics(bootstrap, prefix)
    console.print(
        f"profiled ({args.profile_clock} time): {args.profile_calls} calls at "
        f"{run.per_s:,.0f} calls/s (under the profiler), checks "
        f"{'ok' if phase.passed else 'FAILED'}; "
        f"{json.dumps(finite(phase.diagnostics()))}"
    )
    for order in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(20)
        console.print(out.getvalue(), markup=False, highlight=False, soft_wrap=True)
    if args.profile_out:
        profiler.dump_stats(args.profile_out)
        console.print(f"wrote {args.profile_out}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.kafka",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--calls",
        type=int,
        default=6000,
        help="closed-loop calls (ledger) and round trips (raw pipe)",
    )
    parser.add_argument(
        "--raw-calls",
        type=int,
        default=30000,
        help="closed-loop round trips of the raw pipe (it is much faster)",
    )
    parser.add_argument("--inflight", type=int, default=256, help="calls in flight at most")
    parser.add_argument("--warmup", type=int, default=500, help="untimed calls first")
    parser.add_argument(
        "--latency-seconds", type=float, default=12.0, help="length of each open-loop latency run"
    )
    parser.add_argument(
        "--idle-calls",
        type=int,
        default=40,
        help="calls one at a time at the end (latency of an idle system)",
    )
    parser.add_argument(
        "--record-bytes", type=int, default=200, help="value size of the raw pipe's records"
    )
    parser.add_argument(
        "--executor",
        choices=["inprocess", "subprocess"],
        default="inprocess",
        help="where the executor (and the raw pipe's relay) runs",
    )
    parser.add_argument("--kafka", default=os.environ.get("TOOLLEDGER_KAFKA"))
    parser.add_argument("--postgres", default=os.environ.get("TOOLLEDGER_POSTGRES"))
    parser.add_argument(
        "--kafka-version",
        default=os.environ.get("TOOLLEDGER_KAFKA_VERSION"),
        help="broker version, for the JSON only",
    )
    parser.add_argument("--out", default="bench/results/kafka.json")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also run --profile-calls e2e calls under cProfile, print hot spots",
    )
    parser.add_argument(
        "--profile-only",
        action="store_true",
        help="only the profiled run: no measurements, no JSON",
    )
    parser.add_argument("--profile-calls", type=int, default=3000)
    parser.add_argument(
        "--profile-clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="what the profile measures (cpu: time.process_time)",
    )
    parser.add_argument("--profile-out", default=None, help="also dump the pstats file here")
    parser.add_argument("--serve", choices=["executor", *RELAYS], help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.kafka:
        parser.error("no Kafka: pass --kafka or set TOOLLEDGER_KAFKA")
    if args.serve:
        asyncio.run(serve(args.serve, args.kafka, args.prefix, args.record_bytes))
        return 0
    if not args.postgres:
        parser.error("no PostgreSQL: pass --postgres or set TOOLLEDGER_POSTGRES")
    if (
        args.calls < 2
        or args.raw_calls < 2
        or args.inflight < 1
        or args.warmup < 1
        or args.latency_seconds <= 0
        or args.idle_calls < 1
    ):
        parser.error(
            "need --calls, --raw-calls >= 2, --inflight, --warmup, --idle-calls >= 1, "
            "--latency-seconds > 0"
        )
    logging.getLogger().addHandler(WARNINGS)
    console = Console()
    if args.profile_only:
        asyncio.run(profile_e2e(args, console))
        return 0
    result = asyncio.run(measure(args, console))
    show(result, console)
    write_result(finite(result), args.out, console)
    if args.profile:
        asyncio.run(profile_e2e(args, console))
    return 0 if all(c["passed"] for c in result["meta"]["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
