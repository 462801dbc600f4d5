"""Throughput of the embedded runtime, against a raw ``sqlite3`` baseline in the same mode.

Run::

    .venv/bin/python -m bench.embedded [--calls N] [--window W] [--out bench/results/embedded.json]
    .venv/bin/python -m bench.embedded --profile     # also: cProfile of one run, top 15

Scenarios (each in a fresh temporary directory, warmed up first, not timed while warming up):

``calls_per_s``
    N calls of a no-op mutation tool, N distinct idempotency keys, issued in windows of W
    concurrent calls (``asyncio.gather`` over each chunk). Calls per wall-clock second.
``calls_per_s_dup50``
    N calls, N/2 distinct keys: every other call repeats the key *and arguments* of a call
    issued at least one window earlier, so the ledger answers it as a replay (the handler must
    not run again). Calls per wall-clock second, replays included.
``raw_rows_per_s``
    Plain ``sqlite3``, same ``journal_mode=WAL`` and ``synchronous`` mode, same tables and
    indexes as the ledger file. One "row" is one *call-equivalent set of rows*: an intent
    record in ``log``, an outcome record in ``log`` (the bytes of a real encoded
    ``ToolCallSucceeded``), a ``call_state`` upsert and a ``tool_calls`` projection upsert,
    all with the byte sizes the ledger writes for one call (sampled from the ledger file of
    the first scenario). Sets are written W at a time, one transaction per window. The
    number is the median of ``--raw-repeats`` runs.
``ratio``
    ``calls_per_s / raw_rows_per_s``.

Every ledger call is checked while it is measured: it returned ``ok``; ``replayed`` is set
exactly on the duplicates; the handler ran exactly once per distinct key.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import platform
import pstats
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    Progress,
    TaskID,
)
from rich.table import Table

from bench.common import (
    TOOL,
    Counter,
    make_registry,
    new_progress,
    write_result,
)
from producers.client import CallResult, TrustedContext
from projections import sqlite as projection
from schemas.codec import decode
from schemas.events import ToolCallSucceeded
from toolledger.embedded import EmbeddedLedger

CONTEXT = TrustedContext(tenant_id="bench-tenant", principal="bench-agent")
PARTITIONS = 4  # EmbeddedLedger's default; the raw baseline spreads rows the same way

# The ledger's own tables (processors/runtime/sqlite_log.py), copied so that the baseline does
# not import a private name; the projection tables come from projections.sqlite.DDL.
_RAW_DDL = """
CREATE TABLE IF NOT EXISTS log (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    key BLOB NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (topic, partition, offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS call_state (
    call_key TEXT PRIMARY KEY, partition INTEGER NOT NULL, state_json TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS call_state_by_partition ON call_state (partition);
"""
_INSERT_LOG = "INSERT INTO log VALUES (?, ?, ?, ?, ?)"
_UPSERT_STATE = ("INSERT INTO call_state VALUES (?, ?, ?) ON CONFLICT (call_key) "
                 "DO UPDATE SET state_json = excluded.state_json")


# -- the tool ---------------------------------------------------------------------------------


# -- workloads --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Planned:
    key: str
    text: str
    duplicate: bool


def plan_distinct(n: int, prefix: str) -> list[Planned]:
    return [Planned(f"{prefix}-{i:08d}", f"note {i}", False) for i in range(n)]


def plan_dup50(n: int, window: int) -> list[Planned]:
    """N calls, N/2 fresh keys; the duplicate of fresh key j comes >= one window after it."""
    fresh = plan_distinct(n // 2, "d")
    calls: list[Planned] = []
    for j, call in enumerate(fresh):
        calls.append(call)
        if j >= window:
            original = fresh[j - window]
            calls.append(Planned(original.key, original.text, True))
    calls.extend(Planned(c.key, c.text, True) for c in fresh[max(0, len(fresh) - window):])
    return calls[:n]


@dataclass
class Checks:
    calls: int = 0
    not_ok: int = 0
    replay_flag_wrong: int = 0
    handler_invocations: int = 0
    distinct_keys: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (self.not_ok == 0 and self.replay_flag_wrong == 0
                and self.handler_invocations == self.distinct_keys)

    def look(self, planned: Planned, result: CallResult) -> None:
        self.calls += 1
        if not result.ok:
            self.not_ok += 1
            if len(self.examples) < 3:
                self.examples.append(f"{planned.key}: {result.to_json()}")
        elif result.replayed != planned.duplicate:
            self.replay_flag_wrong += 1
            if len(self.examples) < 3:
                self.examples.append(f"{planned.key}: replayed={result.replayed}, "
                                     f"expected {planned.duplicate}")


@dataclass(frozen=True)
class RowSample:
    """Byte-exact rows of one call, read back from the ledger file."""

    intent_key: bytes
    intent_value: bytes
    outcome_value: bytes
    state_json: str
    call_row: dict[str, Any]


@dataclass
class LedgerRun:
    calls_per_s: float
    seconds: float
    checks: Checks
    rows: dict[str, int]
    sample: RowSample | None


@contextmanager
def scratch_dir(base: Path | None) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="toolledger-bench-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def chunks(items: Sequence[Planned], size: int) -> Iterator[Sequence[Planned]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


async def issue(ledger: EmbeddedLedger, calls: Sequence[Planned], window: int,
                checks: Checks | None, progress: Progress, task: TaskID) -> None:
    done = 0
    started = time.perf_counter()
    for chunk in chunks(calls, window):
        results = await asyncio.gather(*(
            ledger.client.call(TOOL, {"text": c.text}, idempotency_key=c.key, context=CONTEXT)
            for c in chunk))
        if checks is not None:
            for planned, result in zip(chunk, results, strict=True):
                checks.look(planned, result)
        done += len(chunk)
        rate = done / max(time.perf_counter() - started, 1e-9)
        progress.update(task, advance=len(chunk), rate=f"{rate:,.0f} calls/s")


async def run_ledger(calls: Sequence[Planned], *, window: int, warmup: int, synchronous: str,
                     base: Path | None, progress: Progress, label: str,
                     sample: bool = False) -> LedgerRun:
    counter = Counter()
    checks = Checks(distinct_keys=len({c.key for c in calls}))
    warm = plan_distinct(warmup, "warm")
    task = progress.add_task(label, total=len(calls) + len(warm), rate="warming up")
    with scratch_dir(base) as directory:
        path = directory / "ledger.db"
        async with EmbeddedLedger(path, make_registry(counter), partitions=PARTITIONS,
                                  synchronous=synchronous, create=True) as ledger:
            await issue(ledger, warm, window, None, progress, task)
            before = counter.invocations
            progress.update(task, rate="")
            started = time.perf_counter()
            await issue(ledger, calls, window, checks, progress, task)
            seconds = time.perf_counter() - started
            checks.handler_invocations = counter.invocations - before
        rows, row_sample = read_back(path, sample)
    return LedgerRun(len(calls) / seconds, seconds, checks, rows, row_sample)


def read_back(path: Path, sample: bool) -> tuple[dict[str, int], RowSample | None]:
    """Row counts per table (write amplification) and, optionally, one call's rows."""
    conn = sqlite3.connect(path)
    try:
        rows = {
            "log.intents": conn.execute(
                "SELECT COUNT(*) FROM log WHERE topic = 'intents'").fetchone()[0],
            "log.outcomes": conn.execute(
                "SELECT COUNT(*) FROM log WHERE topic = 'outcomes'").fetchone()[0],
        }
        for table in ("call_state", "tool_calls", "tool_call_events", "positions"):
            rows[table] = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        if not sample:
            return rows, None
        intent_key, intent_value = conn.execute(
            "SELECT key, value FROM log WHERE topic = 'intents' ORDER BY offset DESC LIMIT 1"
        ).fetchone()
        outcome_value = next(
            bytes(value) for (value,) in conn.execute(
                "SELECT value FROM log WHERE topic = 'outcomes' ORDER BY offset DESC")
            if isinstance(decode(value), ToolCallSucceeded))
        state_json = conn.execute("SELECT state_json FROM call_state LIMIT 1").fetchone()[0]
        cursor = conn.execute("SELECT * FROM tool_calls LIMIT 1")
        names = [d[0] for d in cursor.description]
        call_row = dict(zip(names, cursor.fetchone(), strict=True))
        return rows, RowSample(bytes(intent_key), bytes(intent_value), outcome_value,
                               str(state_json), call_row)
    finally:
        conn.close()


# -- the raw baseline -------------------------------------------------------------------------


def raw_sets(sample: RowSample, n: int, prefix: str) -> list[tuple[tuple[Any, ...], ...]]:
    """One call-equivalent set of rows per call: (intent, outcome, state, projection row)."""
    sets: list[tuple[tuple[Any, ...], ...]] = []
    offsets = [0] * PARTITIONS
    for i in range(n):
        partition = i % PARTITIONS
        offset = offsets[partition]
        offsets[partition] += 1
        idem = f"{prefix}-{i:08d}"
        call_key = json.dumps([CONTEXT.tenant_id, TOOL, idem], separators=(",", ":"))
        key = call_key.encode()
        call_row = dict(sample.call_row, call_id=f"call_{prefix}{i:028x}", call_key=call_key,
                        idempotency_key=idem)
        sets.append((
            ("intents", partition, offset, key, sample.intent_value),
            ("outcomes", partition, offset, key, sample.outcome_value),
            (call_key, partition, sample.state_json),
            tuple(call_row.values()),
        ))
    return sets


def run_raw(sample: RowSample, n: int, *, window: int, warmup: int, synchronous: str,
            base: Path | None, progress: Progress, label: str) -> float:
    columns = list(sample.call_row)
    upsert_call = (
        f"INSERT INTO tool_calls ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        " ON CONFLICT (call_key) DO UPDATE SET "
        + ", ".join(f"{c} = excluded.{c}" for c in columns if c not in ("call_id", "call_key")))
    sets = raw_sets(sample, warmup + n, "r")
    task = progress.add_task(label, total=n + warmup, rate="warming up")
    with scratch_dir(base) as directory:
        conn = sqlite3.connect(directory / "raw.db", isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={synchronous}")
            conn.executescript(f"BEGIN IMMEDIATE;{_RAW_DDL}{projection.DDL}COMMIT;")

            def write(batch: Sequence[tuple[tuple[Any, ...], ...]]) -> None:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(_INSERT_LOG, [s[0] for s in batch])
                conn.executemany(_INSERT_LOG, [s[1] for s in batch])
                conn.executemany(_UPSERT_STATE, [s[2] for s in batch])
                conn.executemany(upsert_call, [s[3] for s in batch])
                conn.execute("COMMIT")

            for start in range(0, warmup, window):
                write(sets[start:min(start + window, warmup)])
                progress.update(task, advance=min(window, warmup - start))
            started = time.perf_counter()
            for start in range(warmup, warmup + n, window):
                batch = sets[start:min(start + window, warmup + n)]
                write(batch)
                done = start + len(batch) - warmup
                rate = done / max(time.perf_counter() - started, 1e-9)
                progress.update(task, advance=len(batch), rate=f"{rate:,.0f} sets/s")
            seconds = time.perf_counter() - started
        finally:
            conn.close()
    return n / seconds


# -- driver -----------------------------------------------------------------------------------




async def measure(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    base = Path(args.tmp_dir) if args.tmp_dir else None
    with new_progress(console, 26) as progress:
        distinct = await run_ledger(
            plan_distinct(args.calls, "k"), window=args.window, warmup=args.warmup,
            synchronous=args.synchronous, base=base, progress=progress,
            label="ledger, 0% duplicates", sample=True)
        dup50 = await run_ledger(
            plan_dup50(args.calls, args.window), window=args.window, warmup=args.warmup,
            synchronous=args.synchronous, base=base, progress=progress,
            label="ledger, 50% duplicates")
        assert distinct.sample is not None
        raw_runs = [
            run_raw(distinct.sample, args.calls, window=args.window, warmup=args.warmup,
                    synchronous=args.synchronous, base=base, progress=progress,
                    label=f"raw sqlite3 #{i + 1}")
            for i in range(args.raw_repeats)]
    raw = statistics.median(raw_runs)
    sample = distinct.sample
    return {
        "calls_per_s": round(distinct.calls_per_s, 1),
        "calls_per_s_dup50": round(dup50.calls_per_s, 1),
        "raw_rows_per_s": round(raw, 1),
        "ratio": round(distinct.calls_per_s / raw, 4),
        "meta": {
            "calls": args.calls,
            "window": args.window,
            "warmup_calls": args.warmup,
            "partitions": PARTITIONS,
            "synchronous": args.synchronous,
            "journal_mode": "WAL",
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "platform": platform.platform(),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "seconds": {"calls": round(distinct.seconds, 3),
                        "calls_dup50": round(dup50.seconds, 3)},
            "raw_runs_per_s": [round(r, 1) for r in raw_runs],
            "raw_row_definition": (
                "one row = one call-equivalent set of 4 SQLite row writes: an intent record in "
                f"log ({len(sample.intent_value)} B value), an outcome record in log "
                f"({len(sample.outcome_value)} B value, a real encoded ToolCallSucceeded), a "
                f"call_state upsert ({len(sample.state_json)} B state_json) and a tool_calls "
                "projection upsert (the ledger's own row); window-sized batches, one "
                "transaction per batch, same tables, indexes, journal_mode and synchronous"),
            "ledger_rows_in_file_per_call": {
                "0pct_dup": per_call(distinct.rows, args.calls + args.warmup),
                "50pct_dup": per_call(dup50.rows, args.calls + args.warmup),
            },
            "checks": {"0pct_dup": check_summary(distinct.checks),
                       "50pct_dup": check_summary(dup50.checks)},
        },
    }


def per_call(rows: dict[str, int], calls: int) -> dict[str, float]:
    return {table: round(count / calls, 3) for table, count in rows.items()}


def check_summary(checks: Checks) -> dict[str, Any]:
    return {"passed": checks.passed, "calls": checks.calls, "not_ok": checks.not_ok,
            "replay_flag_wrong": checks.replay_flag_wrong,
            "handler_invocations": checks.handler_invocations,
            "distinct_keys": checks.distinct_keys, "examples": checks.examples}


def show(result: dict[str, Any], console: Console) -> None:
    meta = result["meta"]
    table = Table(title=f"toolledger embedded: {meta['calls']} calls, window {meta['window']}, "
                        f"synchronous={meta['synchronous']}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("notes")
    checks = meta["checks"]
    table.add_row("calls_per_s", f"{result['calls_per_s']:,.1f}",
                  f"0% duplicates, {meta['seconds']['calls']} s, checks "
                  f"{'ok' if checks['0pct_dup']['passed'] else '[red]FAILED'}")
    table.add_row("calls_per_s_dup50", f"{result['calls_per_s_dup50']:,.1f}",
                  f"50% replays, {meta['seconds']['calls_dup50']} s, checks "
                  f"{'ok' if checks['50pct_dup']['passed'] else '[red]FAILED'}")
    table.add_row("raw_rows_per_s", f"{result['raw_rows_per_s']:,.1f}",
                  "median of " + ", ".join(f"{r:,.0f}" for r in meta["raw_runs_per_s"])
                  + " call-equivalent row sets/s")
    table.add_row("ratio", f"{result['ratio']:.4f}", "calls_per_s / raw_rows_per_s")
    console.print(table)
    amp = Table(title="rows in the ledger file per call (warm-up included)")
    amp.add_column("table")
    for name in ("0pct_dup", "50pct_dup"):
        amp.add_column(name, justify="right")
    written = meta["ledger_rows_in_file_per_call"]
    for name in written["0pct_dup"]:
        amp.add_row(name, *(f"{written[s][name]:.3f}" for s in ("0pct_dup", "50pct_dup")))
    console.print(amp)
    for name, summary in checks.items():
        if not summary["passed"]:
            console.print(f"[red]checks failed ({name}): {summary}")


def profile(args: argparse.Namespace, console: Console) -> None:
    """One 0%-duplicate run under cProfile; prints the top 15 by cumulative and by own time."""
    base = Path(args.tmp_dir) if args.tmp_dir else None
    profiler = cProfile.Profile()
    with new_progress(console, 26) as progress:
        profiler.enable()
        run = asyncio.run(run_ledger(
            plan_distinct(args.profile_calls, "p"), window=args.window, warmup=args.warmup,
            synchronous=args.synchronous, base=base, progress=progress,
            label="profile, 0% duplicates"))
        profiler.disable()
    console.print(f"profiled: {args.profile_calls} calls at {run.calls_per_s:,.0f} calls/s "
                  f"(under the profiler), checks {'ok' if run.checks.passed else 'FAILED'}")
    for order in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(15)
        console.print(out.getvalue(), markup=False, highlight=False, soft_wrap=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.embedded", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=8192, help="calls per scenario")
    parser.add_argument("--window", type=int, default=256, help="calls in flight at a time")
    parser.add_argument("--warmup", type=int, default=512, help="untimed calls first")
    parser.add_argument("--raw-repeats", type=int, default=5)
    parser.add_argument("--synchronous", default="FULL",
                        choices=["OFF", "NORMAL", "FULL", "EXTRA"])
    parser.add_argument("--tmp-dir", default=None, help="where the scratch databases go")
    parser.add_argument("--out", default="bench/results/embedded.json")
    parser.add_argument("--profile", action="store_true",
                        help="also run --profile-calls calls under cProfile and print hot spots")
    parser.add_argument("--profile-calls", type=int, default=4096)
    args = parser.parse_args(argv)
    if args.calls < 2 or args.window < 1 or args.warmup < 0 or args.raw_repeats < 1:
        parser.error("need --calls >= 2, --window >= 1, --warmup >= 0, --raw-repeats >= 1")
    console = Console()
    result = asyncio.run(measure(args, console))
    show(result, console)
    write_result(result, args.out, console)
    if args.profile:
        profile(args, console)
    checks = result["meta"]["checks"]
    return 0 if all(c["passed"] for c in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
