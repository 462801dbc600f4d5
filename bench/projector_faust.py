"""Catch-up speed of the projector on plain aiokafka against the same projector on faust.

Run (Kafka and PostgreSQL from ``TOOLLEDGER_KAFKA`` / ``TOOLLEDGER_POSTGRES``, or the flags)::

    .venv/bin/python -m bench.projector_faust [--events 20000] [--repeats 3]
        [--out bench/results/projector_faust.json]

What it does, once per run:

1. Creates a fresh topic layout (``ensure_topics``, ``--partitions`` partitions, unique prefix)
   and produces ``--events`` outcome events -- a ``ToolCallStarted`` and a
   ``ToolCallSucceeded`` for each of ``events / 2`` calls, Avro-encoded by
   ``schemas.codec.encode``, keyed and partitioned by call key as the executor writes them --
   with a transactional producer, ``--txn-size`` events per committed transaction.
2. For each repeat, in alternating order (aiokafka first in odd repeats, faust first in even
   ones), each projector catches up from zero into its own fresh database
   (``CREATE DATABASE`` + ``projections.postgres.migrate``), same events, same ``batch_max``:
   (a) :class:`projections.projector.KafkaProjector`,
   (b) :class:`bench.faust_projector.FaustProjector`.
   Measured, in this process (the counters are polled every 5 ms):

   ``startup_s``
       ``start()`` called -> first batch committed in PostgreSQL (group join, assignment, seek
       to the stored positions, first fetch, first apply).
   ``events_per_s``
       events applied after the first batch / seconds from the first batch to the last event
       (steady catch-up, startup excluded). ``overall_events_per_s`` includes startup.
   ``cpu_s``
       user + system CPU of this process (``resource.getrusage(RUSAGE_SELF)``, every thread:
       faust's consumer thread included) from ``start()`` to the last event. PostgreSQL's own
       CPU is not in it (both projectors send it the same ``apply`` calls).
   ``rows_equal``
       ``call_rows()`` of the two databases are equal, and equal to the fold of the produced
       events (``processors.ledger.fold_all``); every event has its audit row; both
       projectors report ``caught_up()``.

The JSON has the medians over the repeats at the top and every run in ``meta.runs``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import logging
import os
import platform
import resource
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import psycopg
from aiokafka import AIOKafkaProducer
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.common import write_result
from bench.faust_projector import PROCESSING_GUARANTEE, FaustProjector
from bench.kafka import delete_topics
from tests import postgres_reads
from toolledger.kafka_admin import ensure_topics
from toolledger.processors.ledger import fold_all
from toolledger.processors.ledger.rows import call_row
from toolledger.projections.postgres import PostgresProjection, migrate
from toolledger.projections.projector import KafkaProjector
from toolledger.schemas.canonical import args_digest, canonical_json
from toolledger.schemas.codec import encode
from toolledger.schemas.events import Envelope, Event, ToolCallStarted, ToolCallSucceeded
from toolledger.schemas.keys import CallKey, partition_for
from toolledger.schemas.topics import INTENT_ID_HEADER, Topics

DEFAULT_OUT = Path("bench/results/projector_faust.json")
T0 = datetime(2025, 3, 1, 9, 0, 0, tzinfo=UTC)
POLL_S = 0.005
KINDS = ("aiokafka", "faust")


# ------------------------------------------------------------------------------- workload


def envelope(key: CallKey, i: int, n: int, digest: str) -> Envelope:
    """The envelope of event ``n`` of call ``i`` (deterministic ids, increasing times)."""
    intent = f"intent-{i:08d}"
    return Envelope(
        event_id=f"{intent}/{n}",
        call_key=str(key),
        tenant_id=key.tenant_id,
        tool=key.tool,
        tool_version="1.2",
        idempotency_key=key.idempotency_key,
        args_digest=digest,
        intent_id=intent,
        run_id=f"run-{i // 50}",
        step_id=f"s{i}",
        principal="agent:helpdesk",
        occurred_at=T0 + timedelta(milliseconds=2 * i + n),
        trace_id=f"trace-{intent}",
    )


def workload(events: int, tenants: int = 8) -> list[Event]:
    """``events // 2`` calls, each a ``ToolCallStarted`` and a ``ToolCallSucceeded``, in windows
    of 250 calls (the starts of a window, then their outcomes), as a busy executor writes."""
    calls = events // 2
    out: list[Event] = []
    window = 250
    for first in range(0, calls, window):
        started: list[Event] = []
        succeeded: list[Event] = []
        for i in range(first, min(first + window, calls)):
            key = CallKey(f"tenant-{i % tenants}", "send_email", f"step:run-{i // 50}:s{i}")
            arguments = {"to": f"user{i}@example.com", "subject": "Your ticket", "body": "..."}
            digest = args_digest(arguments)
            started.append(
                ToolCallStarted(
                    envelope=envelope(key, i, 0, digest),
                    attempt=1,
                    round=1,
                    executor_epoch=1,
                    arguments_redacted_json=canonical_json({**arguments, "to": "[redacted]"}),
                )
            )
            succeeded.append(
                ToolCallSucceeded(
                    envelope=envelope(key, i, 1, digest),
                    attempt=1,
                    result_json=canonical_json({"id": f"msg-{i}", "queued": True}),
                    downstream_request_id=f"req-{i}",
                    duration_ms=40 + i % 17,
                )
            )
        out += started + succeeded
    return out


def expected_rows(events: Sequence[Event]) -> list[dict[str, Any]]:
    """The ``tool_calls`` rows the fold of ``events`` gives, by ``call_id``."""
    states = fold_all(events)
    return sorted((call_row(k, s) for k, s in states.items()), key=lambda r: r["call_id"])


async def produce(bootstrap: str, topics: Topics, events: Sequence[Event], txn_size: int) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"bench-{uuid.uuid4().hex}",
        enable_idempotence=True,
        linger_ms=5,
    )
    await producer.start()
    try:
        for start in range(0, len(events), txn_size):
            async with producer.transaction():
                for event in events[start : start + txn_size]:
                    key = event.call_key.encode("utf-8")
                    await producer.send(
                        topics.outcomes,
                        encode(event),
                        key=key,
                        partition=partition_for(key, topics.partitions),
                        headers=[(INTENT_ID_HEADER, event.intent_id.encode("utf-8"))],
                    )
    finally:
        await producer.stop()


# ------------------------------------------------------------------------------ databases


async def create_database(dsn: str, name: str) -> str:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    database_dsn = make_conninfo(dsn, dbname=name)
    await migrate(database_dsn)
    return database_dsn


async def drop_database(dsn: str, name: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))


async def server_version(dsn: str) -> str:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SHOW server_version")
        row = await cur.fetchone()
        return str(row[0]) if row else "?"


# -------------------------------------------------------------------------------- one run


class Projector(Protocol):
    batches: int
    events_applied: int

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def caught_up(self) -> bool: ...


@dataclass
class Run:
    kind: str
    order: int
    events: int
    startup_s: float
    start_returned_s: float
    first_batch_events: int
    catchup_s: float
    events_per_s: float
    overall_events_per_s: float
    cpu_s: float
    cpu_us_per_event: float
    batches: int
    mean_batch: float
    stop_s: float
    caught_up: bool
    audit_rows: int
    rows: list[dict[str, Any]]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def eventually_caught_up(projector: Projector, deadline: float) -> bool:
    """``caught_up()`` within the deadline: the last positions (past the commit markers of the
    last transactions) may be written by a poll after the last event was applied."""
    while not await projector.caught_up():
        if time.perf_counter() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def run_one(
    kind: str,
    order: int,
    make: Callable[[PostgresProjection], Projector],
    dsn: str,
    expected: int,
    timeout_s: float,
) -> Run:
    async with PostgresProjection(dsn) as projection:
        projector = make(projection)
        cpu0 = cpu_seconds()
        t0 = time.perf_counter()
        await projector.start()
        t_started = time.perf_counter()
        t_first: float | None = None
        first_events = 0
        deadline = t0 + timeout_s
        while projector.events_applied < expected:
            if t_first is None and projector.batches:
                t_first, first_events = time.perf_counter(), projector.events_applied
            if time.perf_counter() > deadline:
                caught = await projector.caught_up()  # raises the projector's error, if any
                raise TimeoutError(
                    f"{kind}: {projector.events_applied}/{expected} events after "
                    f"{timeout_s:.0f} s (caught_up={caught})"
                )
            await asyncio.sleep(POLL_S)
        t_done = time.perf_counter()
        cpu = cpu_seconds() - cpu0
        if t_first is None:  # everything in one batch
            t_first, first_events = t_done, projector.events_applied
        caught = await eventually_caught_up(projector, deadline=time.perf_counter() + 30)
        t_stop = time.perf_counter()
        await projector.stop()
        stop_s = time.perf_counter() - t_stop
        rows = await postgres_reads.call_rows(projection)
        audit = len(await postgres_reads.event_rows(projection))
    steady = expected - first_events
    steady_s = t_done - t_first
    return Run(
        kind=kind,
        order=order,
        events=expected,
        startup_s=t_first - t0,
        start_returned_s=t_started - t0,
        first_batch_events=first_events,
        catchup_s=t_done - t0,
        # everything in the first batch: no steady window, the overall rate stands in
        events_per_s=steady / steady_s if steady and steady_s > 0 else expected / (t_done - t0),
        overall_events_per_s=expected / (t_done - t0),
        cpu_s=cpu,
        cpu_us_per_event=cpu / expected * 1e6,
        batches=projector.batches,
        mean_batch=projector.events_applied / max(projector.batches, 1),
        stop_s=stop_s,
        caught_up=caught,
        audit_rows=audit,
        rows=rows,
    )


# --------------------------------------------------------------------------------- driver


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def timed(what: str, awaitable: Awaitable[Any]) -> Any:
    started = time.perf_counter()
    result = await awaitable
    say(f"{what}: {time.perf_counter() - started:.2f} s")
    return result


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    bootstrap: str = args.kafka
    dsn: str = args.postgres
    run_tag = uuid.uuid4().hex[:8]
    topics = Topics(prefix=f"bench{run_tag}.", partitions=args.partitions)
    events = workload(args.events)
    expected = expected_rows(events)
    await timed("create topics", ensure_topics(bootstrap, topics))
    databases: list[str] = []
    runs: list[Run] = []
    try:
        await timed(
            f"produce {len(events)} events", produce(bootstrap, topics, events, args.txn_size)
        )

        def aiokafka(projection: PostgresProjection) -> Projector:
            return KafkaProjector(bootstrap, topics, projection, batch_max=args.batch_max)

        def faust_(projection: PostgresProjection) -> Projector:
            return FaustProjector(
                bootstrap,
                topics,
                projection,
                batch_max=args.batch_max,
                batch_within=args.batch_within,
            )

        makers = {"aiokafka": aiokafka, "faust": faust_}
        for repeat in range(args.repeats):
            kinds = KINDS if repeat % 2 == 0 else tuple(reversed(KINDS))
            for position, kind in enumerate(kinds):
                name = f"tl_bench_{run_tag}_{repeat}_{kind}"
                databases.append(name)
                database = await create_database(dsn, name)
                run = await run_one(
                    kind, position, makers[kind], database, len(events), args.timeout
                )
                runs.append(run)
                say(
                    f"repeat {repeat + 1} {kind:8}: startup {run.startup_s:.3f} s, "
                    f"{run.events_per_s:,.0f} events/s steady, "
                    f"{run.overall_events_per_s:,.0f} overall, cpu {run.cpu_s:.2f} s, "
                    f"{run.batches} batches (mean {run.mean_batch:.0f}), "
                    f"caught_up={run.caught_up}"
                )
    finally:
        if not args.keep:
            for name in databases:
                await drop_database(dsn, name)
            await delete_topics(bootstrap, topics.prefix)
    return report(args, runs, expected, len(events), await server_version(dsn))


def report(
    args: argparse.Namespace,
    runs: Sequence[Run],
    expected: list[dict[str, Any]],
    events: int,
    pg_version: str,
) -> dict[str, Any]:
    by_kind = {kind: [r for r in runs if r.kind == kind] for kind in KINDS}

    def median(kind: str, field: str) -> float:
        return float(statistics.median(getattr(r, field) for r in by_kind[kind]))

    rows_equal = all(r.rows == expected for r in runs) and all(
        a.rows == f.rows for a, f in zip(by_kind["aiokafka"], by_kind["faust"], strict=True)
    )
    audit_complete = all(r.audit_rows == events for r in runs)
    all_caught_up = all(r.caught_up for r in runs)
    aiokafka_eps = median("aiokafka", "events_per_s")
    faust_eps = median("faust", "events_per_s")

    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    def run_json(run: Run) -> dict[str, Any]:
        data = asdict(run)
        del data["rows"]
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in data.items()}

    return {
        "aiokafka_events_per_s": round(aiokafka_eps, 1),
        "faust_events_per_s": round(faust_eps, 1),
        "ratio_faust_vs_aiokafka": round(faust_eps / aiokafka_eps, 4),
        "aiokafka_overall_events_per_s": round(median("aiokafka", "overall_events_per_s"), 1),
        "faust_overall_events_per_s": round(median("faust", "overall_events_per_s"), 1),
        "aiokafka_startup_s": round(median("aiokafka", "startup_s"), 3),
        "faust_startup_s": round(median("faust", "startup_s"), 3),
        "aiokafka_cpu_s": round(median("aiokafka", "cpu_s"), 3),
        "faust_cpu_s": round(median("faust", "cpu_s"), 3),
        "aiokafka_cpu_us_per_event": round(median("aiokafka", "cpu_us_per_event"), 1),
        "faust_cpu_us_per_event": round(median("faust", "cpu_us_per_event"), 1),
        "rows_equal": rows_equal and audit_complete and all_caught_up,
        "meta": {
            "events": events,
            "calls": len(expected),
            "workload": (
                "a ToolCallStarted + ToolCallSucceeded per call, Avro single-object encoded "
                "(schemas.codec.encode), key = call key, murmur2 partition; windows of 250 "
                "calls (starts, then outcomes)"
            ),
            "partitions": args.partitions,
            "events_per_transaction": args.txn_size,
            "repeats": args.repeats,
            "order": "aiokafka first in odd repeats, faust first in even ones",
            "batch_max": args.batch_max,
            "faust_batch_within_s": args.batch_within,
            "faust_processing_guarantee": PROCESSING_GUARANTEE,
            "aggregate": "median over repeats",
            "definitions": {
                "startup_s": "start() called -> first batch committed in PostgreSQL",
                "events_per_s": (
                    "events applied after the first batch / seconds from the first batch "
                    "to the last event (startup excluded)"
                ),
                "overall_events_per_s": "events / seconds from start() to the last event",
                "cpu_s": (
                    "getrusage(RUSAGE_SELF) user+system of the bench process, all threads, "
                    "start() -> last event; PostgreSQL server CPU not included"
                ),
                "rows_equal": (
                    "call_rows() of every database equal the fold of the produced events and "
                    "each other; every event has its audit row; every projector caught_up()"
                ),
            },
            "checks": {
                "call_rows_equal_fold_and_each_other": rows_equal,
                "audit_rows_complete": audit_complete,
                "caught_up": all_caught_up,
            },
            "versions": {
                "python": platform.python_version(),
                "faust-streaming": version("faust-streaming"),
                "aiokafka": version("aiokafka"),
                "psycopg": version("psycopg"),
                "postgresql": pg_version,
            },
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "runs": [run_json(r) for r in runs],
        },
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.projector_faust", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--kafka", default=os.environ.get("TOOLLEDGER_KAFKA", ""))
    parser.add_argument("--postgres", default=os.environ.get("TOOLLEDGER_POSTGRES", ""))
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--txn-size", type=int, default=500)
    parser.add_argument("--batch-max", type=int, default=2000)
    parser.add_argument("--batch-within", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0, help="per projector run")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--keep", action="store_true", help="keep the databases and topics (debugging)"
    )
    args = parser.parse_args(argv)
    if not args.kafka or not args.postgres:
        parser.error("set TOOLLEDGER_KAFKA and TOOLLEDGER_POSTGRES (or --kafka / --postgres)")
    if "dbname" not in conninfo_to_dict(args.postgres):
        args.postgres = make_conninfo(args.postgres, dbname="postgres")
    if args.events < 2 or args.repeats < 1:
        parser.error("--events must be at least 2 and --repeats at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    result = asyncio.run(measure(args))
    write_result(result, args.out)
    summary = {k: v for k, v in result.items() if k != "meta"}
    say(json.dumps(summary, indent=2))
    say(f"written to {args.out}")


if __name__ == "__main__":
    main()
