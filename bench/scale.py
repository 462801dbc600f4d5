"""Cost at size: memory, throughput, disk and restart time as the ledger sees more keys.

Run::

    .venv/bin/python -m bench.scale                        # everything, ~25 min on 2 cores
    .venv/bin/python -m bench.scale --calls 200000         # shorter
    .venv/bin/python -m bench.scale --only kafka           # needs services/up.sh

Scenarios:

``embedded`` (once with every retention forever, once with a short one for keys, the raw
arguments of approval requests and the audit trail with the log's events (one store since
issue 30): ``--key-retention``, ``--intents-retention`` and ``--audit-retention`` of
``serve``)
    ``--calls`` calls of the no-op mutation tool, 200-byte arguments, every key new, from
    64 concurrent callers, on a fresh ledger (default settings, ``synchronous=FULL``). Every
    ``--step`` calls: resident memory, calls/s over the step, and the ledger's bytes on disk
    (file + WAL). Then the ledger is closed and reopened: the time until it answers its first
    call (a replay of the last key) and the memory after. Each run is its own process, so
    memory is the executor's own.
``kafka``
    One partition of a state topic holding ``--keys`` call states (the JSON the executor
    writes). Timed: a raw aiokafka read of the whole partition (the baseline), a *cold*
    takeover (no local store: the executor's restore into a new store, then its start
    snapshot), a *warm* takeover (the same store again: only the tail is read). ``--kafka-runs``
    times on fresh topics (the broker's load moves the ratio): ``kafka`` is the run with the
    median cold/raw ratio, ``kafka.runs`` every run.

Targets (issue 10): memory after 1,000,000 keys <= 1.3 x after 100,000; calls/s over the last
step >= 0.8 x the first; reopen <= 2 s; <= 2.5 KB on disk per call (retention forever) and a
flat disk with a short retention; warm takeover <= 2 s; cold <= 2 x the raw read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import string
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common import TOOL, Counter, make_registry, write_result
from toolledger.producers.client import TrustedContext

if TYPE_CHECKING:  # imported where used: an embedded run's process does not load Kafka's code
    from toolledger.schemas.topics import Topics

CONTEXT = TrustedContext("bench-tenant", "bench@example.com")
CALLERS = 64
TEXT_BYTES = 188  # {"text": "..."}: 200 bytes of arguments


def text(i: int) -> str:
    """Call ``i``'s text: random letters and digits (as incompressible as an argument that
    carries information), the same on every run."""
    return "".join(random.Random(i).choices(string.ascii_letters + string.digits, k=TEXT_BYTES))


AUDIT_ROUND_S = 10.0

# issue 10's targets, written into the result (docs/benchmarks.md shows them under the runs)
TARGETS = {
    "memory_ratio": "<= 1.3",
    "throughput_ratio": ">= 0.8",
    "reopen_s": "<= 2",
    "disk_bytes_per_call": "<= 2500 (retention forever); flat with a short retention",
    "warm_takeover_s": "<= 2",
    "cold_over_raw": "<= 2",
}


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("ledger.db*") if p.is_file())


async def _callers(ledger: Any, first: int, count: int, prefix: str) -> None:
    queue = iter(range(first, first + count))

    async def caller() -> None:
        for i in queue:
            result = await ledger.client.call(
                TOOL, {"text": text(i)}, idempotency_key=f"{prefix}-{i}", context=CONTEXT
            )
            if not result.ok or result.replayed:
                raise RuntimeError(f"call {i}: {result}")

    await asyncio.gather(*(caller() for _ in range(CALLERS)))


@contextlib.asynccontextmanager
async def _audit_rounds(log: Any, retention: timedelta | None) -> AsyncIterator[None]:
    """The audit trail's retention as ``serve --audit-retention`` runs it (rounds every
    :data:`AUDIT_ROUND_S` here, so that a short retention shows within the run)."""
    from toolledger.audit import audit_retention
    from toolledger.projections.audit_retention import prune_sqlite

    async def prune(cutoff: datetime) -> int:
        return await asyncio.to_thread(prune_sqlite, log.locked_write, cutoff)

    async with audit_retention(prune, retention, every_s=AUDIT_ROUND_S):
        yield


async def embedded_run(calls: int, step: int, retention: str, directory: Path) -> dict[str, Any]:
    """``retention`` "forever": every key, event and raw intent is kept (the defaults, but for
    the intents' 7 days, which a run never reaches). Otherwise it is every retention at once:
    keys, raw intents and the audit trail with the log's events (what a platform that keeps
    nothing longer than that sets)."""
    from toolledger.embedded import EmbeddedLedger
    from toolledger.processors.tools.retention import FOREVER, parse_retention
    from toolledger.settings import LedgerSettings

    counter = Counter()
    registry = make_registry(counter)
    key_retention = parse_retention(retention)
    registry.set_default_key_retention(key_retention)
    short = None if key_retention == FOREVER else key_retention
    assert not isinstance(short, str)
    path = directory / "ledger.db"
    steps = []
    prefix = uuid.uuid4().hex[:8]
    retentions: dict[str, Any] = {} if short is None else {"intents_retention": short}
    async with (
        EmbeddedLedger(LedgerSettings(path=path, create=True, **retentions), registry) as ledger,
        _audit_rounds(ledger.file, short),
    ):
        for first in range(0, calls, step):
            started = time.perf_counter()
            await _callers(ledger, first, min(step, calls - first), prefix)
            seconds = time.perf_counter() - started
            steps.append(
                {
                    "calls": first + step,
                    "rss_mb": round(rss_mb(), 1),
                    "calls_per_s": round(step / seconds, 1),
                    "disk_bytes": disk_bytes(directory),
                    "disk_bytes_per_call": round(disk_bytes(directory) / (first + step), 1),
                }
            )
            print(json.dumps(steps[-1]), file=sys.stderr, flush=True)
    if counter.invocations != calls:
        raise RuntimeError(f"{counter.invocations} executions for {calls} calls")
    before_reopen = rss_mb()
    started = time.perf_counter()
    async with EmbeddedLedger(LedgerSettings(path=path), registry) as ledger:
        last = f"{prefix}-{calls - 1}"
        replay = await ledger.client.call(
            TOOL, {"text": text(calls - 1)}, idempotency_key=last, context=CONTEXT
        )
        reopen_s = time.perf_counter() - started
        expired = replay.ok and not replay.replayed
        if not replay.ok or not (replay.replayed or retention != "forever"):
            raise RuntimeError(f"the reopened ledger did not replay: {replay}")
        after_reopen = rss_mb()
    return {
        "retention": retention,
        "calls": calls,
        "callers": CALLERS,
        "steps": steps,
        "reopen_s": round(reopen_s, 3),
        "reopen_first_answer": "executed again (expired)" if expired else "replayed",
        "rss_mb_after_reopen": round(after_reopen, 1),
        "rss_mb_before_reopen": round(before_reopen, 1),
        "memory_ratio": round(steps[-1]["rss_mb"] / steps[0]["rss_mb"], 3),
        "throughput_ratio": round(steps[-1]["calls_per_s"] / steps[0]["calls_per_s"], 3),
        "disk_growth_last_step_bytes": steps[-1]["disk_bytes"] - steps[-2]["disk_bytes"]
        if len(steps) > 1
        else None,
    }


# -- kafka ------------------------------------------------------------------------------------


async def kafka_run(bootstrap: str, keys: int) -> dict[str, Any]:
    """One run on topics of its own, deleted at the end (a run writes ``keys`` records)."""
    from bench.kafka import delete_topics
    from toolledger.kafka_admin import ensure_topics
    from toolledger.schemas.topics import Topics

    topics = Topics(prefix=f"scale{uuid.uuid4().hex[:8]}.", partitions=1)
    await ensure_topics(bootstrap, topics)
    try:
        return await _takeovers(bootstrap, keys, topics)
    finally:
        await delete_topics(bootstrap, topics.prefix)


async def _takeovers(bootstrap: str, keys: int, topics: Topics) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    from toolledger.processors.runtime.kafka import cluster_id, meta_headers, restore_local
    from toolledger.processors.runtime.local_store import LocalStore

    state = _state_template()
    settled = datetime.fromisoformat("2026-12-01T00:00:00.1Z").timestamp()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20, acks=1
    )
    await producer.start()
    started = time.perf_counter()
    try:
        pending = []
        for i in range(keys):
            # keys as clients make them (random: a key's place in the store's index is too),
            # settled in log order; the row fields in headers, as the executor writes them
            key = f'["bench-tenant","{TOOL}","{uuid.uuid4().hex}"]'
            value = state.replace("KEY", key.replace('"', '\\"')).encode()
            headers = meta_headers((TOOL, settled + i / 1000))
            pending.append(
                await producer.send(
                    topics.state, value, key=key.encode(), partition=0, headers=headers
                )
            )
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    produce_s = time.perf_counter() - started

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed"
    )
    await consumer.start()
    try:
        tp = TopicPartition(topics.state, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        started = time.perf_counter()
        read = 0
        while await consumer.position(tp) < end:
            read += len((await consumer.getmany(tp, timeout_ms=500)).get(tp, []))
        raw_s = time.perf_counter() - started
    finally:
        await consumer.stop()

    identity = {
        "cluster": await cluster_id(bootstrap),
        "group": topics.executor_group,
        "topic": topics.state,
        "partition": "0",
        "partitions": "1",
    }
    with tempfile.TemporaryDirectory(prefix="toolledger-scale-") as tmp:
        path = Path(tmp) / "p0.db"
        takeovers = {}
        for kind in ("cold", "warm"):
            started = time.perf_counter()
            local = LocalStore(path, identity)
            restored = await restore_local(bootstrap, topics, local)
            live = local.live()
            takeovers[kind] = {
                "seconds": round(time.perf_counter() - started, 3),
                "records_read": restored,
                "unresolved_keys_loaded": len(live.states),
            }
            local.close()
    return {
        "keys": keys,
        "produce_s": round(produce_s, 2),
        "raw_read_s": round(raw_s, 3),
        "raw_records": read,
        "cold_takeover": takeovers["cold"],
        "warm_takeover": takeovers["warm"],
        "cold_over_raw": round(takeovers["cold"]["seconds"] / raw_s, 3),
    }


def _state_template() -> str:
    """A SUCCEEDED call state as the executor writes it (``KEY`` replaced per key)."""
    return json.dumps(
        {
            "status": "SUCCEEDED",
            "context": {
                "call_key": "KEY",
                "tenant_id": "bench-tenant",
                "tool": TOOL,
                "tool_version": "1",
                "idempotency_key": "k",
                "args_digest": "sha256:" + "0" * 64,
                "intent_id": uuid.uuid4().hex,
                "run_id": None,
                "step_id": None,
                "principal": "bench@example.com",
                "trace_id": None,
            },
            "first_intent_id": uuid.uuid4().hex,
            "attempts": 1,
            "rounds": 1,
            "round_attempts": 1,
            "reconcile_attempts": 0,
            "result_json": '{"ok":true}',
            "error": None,
            "created_at": "2026-12-01T00:00:00Z",
            "updated_at": "2026-12-01T00:00:00.100000Z",
            "last_event_id": uuid.uuid4().hex + "/succeeded/1",
        },
        separators=(",", ":"),
    )


# -- driver -----------------------------------------------------------------------------------


def _child(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="toolledger-scale-") as tmp:
        result = asyncio.run(embedded_run(args.calls, args.step, args.retention, Path(tmp)))
    print(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--step", type=int, default=100_000)
    parser.add_argument("--short-retention", default="2m")
    parser.add_argument("--keys", type=int, default=1_000_000, help="Kafka: keys in the partition")
    parser.add_argument("--kafka-runs", type=int, default=3, help="Kafka: runs (median kept)")
    parser.add_argument("--only", choices=["embedded", "kafka"])
    parser.add_argument("--out", default="bench/results/scale.json")
    parser.add_argument("--child-retention", dest="retention", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.retention is not None:
        return _child(args)
    if args.kafka_runs < 1:
        parser.error("need --kafka-runs >= 1")
    result: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}, "meta": {"targets": TARGETS}}
    if args.only in (None, "embedded"):
        result["embedded"] = []
        for retention in ("forever", args.short_retention):
            argv_child = [
                sys.executable,
                "-m",
                "bench.scale",
                "--calls",
                str(args.calls),
                "--step",
                str(args.step),
                "--child-retention",
                retention,
            ]
            done = subprocess.run(argv_child, check=True, stdout=subprocess.PIPE, text=True)
            result["embedded"].append(json.loads(done.stdout.strip().splitlines()[-1]))
    if args.only in (None, "kafka"):
        bootstrap = os.environ.get("TOOLLEDGER_KAFKA")
        if not bootstrap:
            raise SystemExit("kafka: run 'bash services/up.sh' and '. services/env.sh' first")
        runs = [asyncio.run(kafka_run(bootstrap, args.keys)) for _ in range(args.kafka_runs)]
        median = sorted(runs, key=lambda run: float(run["cold_over_raw"]))[len(runs) // 2]
        result["kafka"] = {**median, "runs": runs}
    write_result(result, args.out)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
