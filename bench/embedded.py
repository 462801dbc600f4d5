"""Throughput of the embedded runtime, against a raw ``sqlite3`` baseline in the same run.

Run::

    .venv/bin/python -m bench.embedded [--calls N] [--window W] [--out bench/results/embedded.json]
    .venv/bin/python -m bench.embedded --only matrix --calls 4000   # a quick matrix only
    .venv/bin/python -m bench.embedded --profile     # also: cProfile of one run, top 15

Two parts, both in one run and one result file (each scenario in a fresh temporary directory,
warmed up first, not timed while warming up):

**The matrix of issue 11** (``matrix`` in the result): the issue's workload (``--calls``
calls per cell, 10,000 by default to keep the run to a few minutes; the issue's size is
``--calls 20000``; 200-byte JSON arguments, 8 tenants, 5 no-op tools that count their
executions, 128-bit keys) through the public API (``toolledger.Ledger.embedded``) for every
combination of callers {16, 256} x ``synchronous`` {FULL, NORMAL} x duplicate share D
{0, 0.5}. Callers are coroutines in a closed loop (each issues its next call when the
previous was answered); calls/s, p50 and p99 latency. Beside each cell, in the same run, the
raw baseline: one ``INSERT OR IGNORE`` per call into a plain ``sqlite3`` claim table with the
same ``synchronous``, the same callers and one writer thread, with group commit
(``raw_group_commit``, the median of ``--matrix-raw-repeats`` runs: the ratio's denominator)
and with a commit per call (``raw_commit_per_call``). Every cell checks that each unique key
executed exactly once and that exactly the retries were answered as replays. The target's
own cell (16 callers, FULL, D=0) then runs an open loop on new keys at half its closed-loop
rate for 10 s (``half_rate``: calls issued on a fixed schedule, latency from each call's
scheduled start), for the target's "p99 at half that rate".

**The window scenarios** (the top-level keys, as before; ``--window`` calls at a time):

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
    ``ToolCallSucceeded``) and a ``tool_calls`` upsert (the ledger's row, which is also
    the key's state), all with the byte sizes the ledger writes for one call (sampled from
    the ledger file of the first scenario). Sets are written W at a time, one transaction
    per window. The number is the median of ``--raw-repeats`` runs.
``ratio``
    ``calls_per_s / raw_rows_per_s``.

Every ledger call is checked while it is measured: it returned ``ok``; ``replayed`` is set
exactly on the duplicates; the handler ran exactly once per distinct key. The exit status is 1
if any check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import io
import json
import platform
import pstats
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from processors.runtime.sqlite_log import OWN_KEY, key_fingerprint
from rich.console import Console
from rich.progress import (
    Progress,
    TaskID,
)
from rich.table import Table
from schemas.packing import unpack

from bench.common import (
    TENANTS,
    TOOL,
    Counter,
    Executions,
    Timing,
    WorkCall,
    drive_async,
    drive_at_rate,
    make_registry,
    make_workload_registry,
    new_progress,
    plan_workload,
    workload_meta,
    write_result,
)
from producers.client import CallResult, TrustedContext
from projections import sqlite as projection
from schemas.codec import decode
from schemas.events import ToolCallSucceeded
from toolledger import Ledger
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
"""
_INSERT_LOG = "INSERT INTO log VALUES (?, ?, ?, ?, ?)"


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
    calls.extend(Planned(c.key, c.text, True) for c in fresh[max(0, len(fresh) - window) :])
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
        return (
            self.not_ok == 0
            and self.replay_flag_wrong == 0
            and self.handler_invocations == self.distinct_keys
        )

    def look(self, planned: Planned, result: CallResult) -> None:
        self.calls += 1
        if not result.ok:
            self.not_ok += 1
            if len(self.examples) < 3:
                self.examples.append(f"{planned.key}: {result.to_json()}")
        elif result.replayed != planned.duplicate:
            self.replay_flag_wrong += 1
            if len(self.examples) < 3:
                self.examples.append(
                    f"{planned.key}: replayed={result.replayed}, expected {planned.duplicate}"
                )


@dataclass(frozen=True)
class RowSample:
    """Byte-exact rows of one call, read back from the ledger file (values as stored: packed,
    so the raw baseline writes as many bytes as the ledger)."""

    intent_value: bytes
    outcome_value: bytes
    call_row: dict[str, Any]  # the key's state too: the executor reads it from this row


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
        yield items[start : start + size]


async def issue(
    ledger: EmbeddedLedger,
    calls: Sequence[Planned],
    window: int,
    checks: Checks | None,
    progress: Progress,
    task: TaskID,
) -> None:
    done = 0
    started = time.perf_counter()
    for chunk in chunks(calls, window):
        results = await asyncio.gather(
            *(
                ledger.client.call(TOOL, {"text": c.text}, idempotency_key=c.key, context=CONTEXT)
                for c in chunk
            )
        )
        if checks is not None:
            for planned, result in zip(chunk, results, strict=True):
                checks.look(planned, result)
        done += len(chunk)
        rate = done / max(time.perf_counter() - started, 1e-9)
        progress.update(task, advance=len(chunk), rate=f"{rate:,.0f} calls/s")


async def run_ledger(
    calls: Sequence[Planned],
    *,
    window: int,
    warmup: int,
    synchronous: str,
    base: Path | None,
    progress: Progress,
    label: str,
    sample: bool = False,
) -> LedgerRun:
    counter = Counter()
    checks = Checks(distinct_keys=len({c.key for c in calls}))
    warm = plan_distinct(warmup, "warm")
    task = progress.add_task(label, total=len(calls) + len(warm), rate="warming up")
    with scratch_dir(base) as directory:
        path = directory / "ledger.db"
        async with EmbeddedLedger(
            path,
            make_registry(counter),
            partitions=PARTITIONS,
            synchronous=synchronous,
            create=True,
        ) as ledger:
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
                "SELECT COUNT(*) FROM log WHERE topic = 'intents'"
            ).fetchone()[0],
            "log.outcomes": conn.execute(
                "SELECT COUNT(*) FROM log WHERE topic = 'outcomes'"
            ).fetchone()[0],
        }
        for table in ("call_state", "tool_calls", "tool_call_events", "positions"):
            rows[table] = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        if not sample:
            return rows, None
        (intent_value,) = conn.execute(
            "SELECT value FROM log WHERE topic = 'intents' ORDER BY offset DESC LIMIT 1"
        ).fetchone()
        outcome_value = next(
            bytes(value)
            for (value,) in conn.execute(
                "SELECT value FROM log WHERE topic = 'outcomes' ORDER BY offset DESC"
            )
            if isinstance(decode(unpack(value)), ToolCallSucceeded)
        )
        cursor = conn.execute("SELECT * FROM tool_calls LIMIT 1")
        names = [d[0] for d in cursor.description]
        call_row = dict(zip(names, cursor.fetchone(), strict=True))
        return rows, RowSample(bytes(intent_value), outcome_value, call_row)
    finally:
        conn.close()


# -- the raw baseline -------------------------------------------------------------------------


def raw_sets(sample: RowSample, n: int, prefix: str) -> list[tuple[tuple[Any, ...], ...]]:
    """One call-equivalent set of rows per call: (intent, outcome, call row)."""
    sets: list[tuple[tuple[Any, ...], ...]] = []
    offsets = [0] * PARTITIONS
    for i in range(n):
        partition = i % PARTITIONS
        offset = offsets[partition]
        offsets[partition] += 1
        idem = f"{prefix}-{i:08d}"
        call_key = json.dumps([CONTEXT.tenant_id, TOOL, idem], separators=(",", ":"))
        call_row = dict(
            sample.call_row,
            call_id=f"call_{prefix}{i:028x}",
            call_key=call_key,
            idempotency_key=idem,
        )
        sets.append(
            (
                # the keys as the ledger stores them (an intent's fingerprint, no outcome key)
                (
                    "intents",
                    partition,
                    offset,
                    key_fingerprint(call_key.encode()),
                    sample.intent_value,
                ),
                ("outcomes", partition, offset, OWN_KEY, sample.outcome_value),
                tuple(call_row.values()),
            )
        )
    return sets


def run_raw(
    sample: RowSample,
    n: int,
    *,
    window: int,
    warmup: int,
    synchronous: str,
    base: Path | None,
    progress: Progress,
    label: str,
) -> float:
    columns = list(sample.call_row)
    upsert_call = (
        f"INSERT INTO tool_calls ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        # the projection's own conflict target (projections/sqlite.py)
        " ON CONFLICT (tenant_id, tool_name, idempotency_key) DO UPDATE SET "
        + ", ".join(
            f"{c} = excluded.{c}"
            for c in columns
            if c not in ("call_id", "call_key", "tenant_id", "tool_name", "idempotency_key")
        )
    )
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
                conn.executemany(upsert_call, [s[2] for s in batch])
                conn.execute("COMMIT")

            for start in range(0, warmup, window):
                write(sets[start : min(start + window, warmup)])
                progress.update(task, advance=min(window, warmup - start))
            started = time.perf_counter()
            for start in range(warmup, warmup + n, window):
                batch = sets[start : min(start + window, warmup + n)]
                write(batch)
                done = start + len(batch) - warmup
                rate = done / max(time.perf_counter() - started, 1e-9)
                progress.update(task, advance=len(batch), rate=f"{rate:,.0f} sets/s")
            seconds = time.perf_counter() - started
        finally:
            conn.close()
    return n / seconds


# -- the matrix of issue 11: callers x synchronous x duplicates, each beside raw SQLite -------


MATRIX_CALLERS = (16, 256)
MATRIX_SYNCHRONOUS = ("FULL", "NORMAL")
MATRIX_DUPLICATES = (0.0, 0.5)
HALF_RATE_SECONDS = 10.0  # the open loop at half the rate (16 callers, FULL, D=0)
CONTEXTS = {t: TrustedContext(tenant_id=t, principal="bench-agent") for t in TENANTS}


def args_digest(arguments: dict[str, Any]) -> str:
    """What the raw baseline compares a retry's arguments by (sorted-key compact JSON)."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


class RawClaims:
    """The raw baseline: a claim table in plain ``sqlite3`` (same ``journal_mode=WAL`` and
    ``synchronous``), written by one thread, as the ledger's file is.

    A call is one ``INSERT OR IGNORE`` of ``(tenant, tool, key, args digest)``; if it
    inserted, the caller runs the tool; if not, the stored digest is read and compared (a
    retry with other arguments is an error). The caller gets its answer after the commit.
    ``max_batch=None``: every claim waiting when the writer is free goes into one transaction
    (group commit, as the ledger does); ``max_batch=1``: one transaction per call. It keeps
    no outcome, no audit trail and no log: the least any durable SQLite dedupe must write."""

    def __init__(self, path: Path, synchronous: str, max_batch: int | None) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA synchronous={synchronous}")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS claims (tenant TEXT NOT NULL, tool TEXT NOT NULL, "
            "key TEXT NOT NULL, args_digest TEXT NOT NULL, PRIMARY KEY (tenant, tool, key)) "
            "WITHOUT ROWID"
        )
        self._max_batch = max_batch
        self._loop = asyncio.get_running_loop()
        self._cond = threading.Condition()
        self._pending: list[tuple[tuple[str, str, str, str], asyncio.Future[bool]]] = []
        self._closed = False
        self.commits = 0
        self._thread = threading.Thread(target=self._run, name="raw-sqlite-writer")
        self._thread.start()

    async def claim(self, call: WorkCall) -> bool:
        """True: the key is new (run the tool); False: a retry with the same arguments."""
        future: asyncio.Future[bool] = self._loop.create_future()
        row = (call.tenant, call.tool, call.key, args_digest(call.args))
        with self._cond:
            self._pending.append((row, future))
            self._cond.notify()
        return await future

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        self._conn.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                size = len(self._pending) if self._max_batch is None else self._max_batch
                batch, self._pending = self._pending[:size], self._pending[size:]
            try:
                answers: list[bool] | BaseException = self._write([row for row, _ in batch])
            except Exception as exc:  # answered to every caller of the batch
                answers = exc
            self._loop.call_soon_threadsafe(self._answer, [f for _, f in batch], answers)

    def _write(self, rows: list[tuple[str, str, str, str]]) -> list[bool]:
        conn = self._conn
        answers: list[bool] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for row in rows:
                if (
                    conn.execute("INSERT OR IGNORE INTO claims VALUES (?, ?, ?, ?)", row).rowcount
                    == 1
                ):
                    answers.append(True)
                    continue
                (stored,) = conn.execute(
                    "SELECT args_digest FROM claims WHERE tenant = ? AND tool = ? AND key = ?",
                    row[:3],
                ).fetchone()
                if stored != row[3]:
                    raise ValueError(f"key {row[2]} reused with other arguments")
                answers.append(False)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.commits += 1
        return answers

    @staticmethod
    def _answer(futures: list[asyncio.Future[bool]], answers: list[bool] | BaseException) -> None:
        for i, future in enumerate(futures):
            if future.done():
                continue
            if isinstance(answers, BaseException):
                future.set_exception(answers)
            else:
                future.set_result(answers[i])


@dataclass
class WrongAnswers:
    """Calls answered otherwise than expected (not ok, or the replay flag wrong)."""

    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, example: str) -> None:
        self.count += 1
        if len(self.examples) < 3:
            self.examples.append(example)

    def into(self, checks: dict[str, Any]) -> dict[str, Any]:
        checks.update(wrong_answers=self.count, examples=self.examples)
        checks["passed"] = bool(checks["passed"]) and self.count == 0
        return checks


@dataclass
class CellRun:
    timing: Timing
    checks: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {**self.timing.summary(), **self.extra, "checks": self.checks}


def warm_plan(calls: int) -> list[WorkCall]:
    return plan_workload(calls, 0.0, gap=1, seed=999)


async def cell_ledger(
    plan: Sequence[WorkCall],
    *,
    callers: int,
    synchronous: str,
    warmup: int,
    base: Path | None,
    half_rate_s: float = 0.0,
) -> CellRun:
    """The workload through the public API (``toolledger.Ledger.embedded``). With
    ``half_rate_s``, then an open loop at half the closed loop's calls/s for that long, on new
    keys of the same workload (``extra["half_rate"]``: the latency at half the load)."""
    executions = Executions()
    wrong = WrongAnswers()

    async def call(c: WorkCall) -> None:
        result = await ledger.call(
            c.tool, c.args, idempotency_key=c.key, context=CONTEXTS[c.tenant]
        )
        if not result.ok or result.replayed != c.duplicate:
            wrong.add(f"{c.key}: duplicate={c.duplicate}: {result.to_json()}")

    with scratch_dir(base) as directory:
        ledger = Ledger.embedded(
            directory / "ledger.db",
            make_workload_registry(executions),
            synchronous=synchronous,
            partitions=PARTITIONS,
        )
        async with ledger:
            await drive_async(warm_plan(warmup), callers, call)
            executions.reset()
            wrong = WrongAnswers()
            timing = await drive_async(plan, callers, call)
            checks = wrong.into(executions.check(plan))
            extra: dict[str, Any] = {}
            if half_rate_s > 0:
                rate = timing.calls_per_s / 2
                more = plan_workload(max(1, round(rate * half_rate_s)), 0.0, gap=1, seed=77)
                executions.reset()
                wrong = WrongAnswers()
                at_rate = await drive_at_rate(more, rate, call)
                extra["half_rate"] = {
                    "rate_per_s": round(rate, 1),
                    "calls": len(more),
                    "p50_ms": round(at_rate.percentile_ms(50), 2),
                    "p99_ms": round(at_rate.percentile_ms(99), 2),
                    "checks": wrong.into(executions.check(more)),
                }
    return CellRun(timing, checks, extra)


async def cell_raw(
    plan: Sequence[WorkCall],
    *,
    callers: int,
    synchronous: str,
    warmup: int,
    base: Path | None,
    max_batch: int | None,
) -> CellRun:
    executions = Executions()
    wrong = WrongAnswers()

    async def call(c: WorkCall) -> None:
        inserted = await claims.claim(c)
        if inserted:
            executions.record(c.tenant, c.tool, c.key)  # the no-op tool
        if inserted == c.duplicate:
            wrong.add(f"{c.key}: duplicate={c.duplicate}, inserted={inserted}")

    with scratch_dir(base) as directory:
        claims = RawClaims(directory / "raw.db", synchronous, max_batch)
        try:
            await drive_async(warm_plan(warmup), callers, call)
            executions.reset()
            wrong = WrongAnswers()
            commits = claims.commits
            timing = await drive_async(plan, callers, call)
            commits = claims.commits - commits
        finally:
            claims.close()
    checks = wrong.into(executions.check(plan))
    return CellRun(timing, checks, {"calls_per_commit": round(len(plan) / max(commits, 1), 1)})


async def measure_matrix(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    base = Path(args.tmp_dir) if args.tmp_dir else None
    cells: list[dict[str, Any]] = []
    for callers in args.callers:
        for synchronous in MATRIX_SYNCHRONOUS:
            for share in MATRIX_DUPLICATES:
                # the retry of a key comes >= 4 x callers calls after it: almost always a replay
                plan = plan_workload(args.calls, share, gap=4 * callers)
                label = f"{callers} callers, {synchronous}, D={share}"
                # the target's latency is at half its rate: measured for the target's own cell
                half = callers == 16 and synchronous == "FULL" and share == 0.0
                with console.status(f"{label}: toolledger"):
                    ledger = await cell_ledger(
                        plan,
                        callers=callers,
                        synchronous=synchronous,
                        warmup=args.warmup,
                        base=base,
                        half_rate_s=HALF_RATE_SECONDS if half else 0.0,
                    )
                # the raw runs are short and load-sensitive: the median of a few group-commit
                # runs (by calls/s) is kept, and all are listed
                raws: list[CellRun] = []
                for repeat in range(args.matrix_raw_repeats):
                    with console.status(f"{label}: raw sqlite3, group commit #{repeat + 1}"):
                        raws.append(
                            await cell_raw(
                                plan,
                                callers=callers,
                                synchronous=synchronous,
                                warmup=args.warmup,
                                base=base,
                                max_batch=None,
                            )
                        )
                raws.sort(key=lambda r: r.timing.calls_per_s)
                raw = raws[len(raws) // 2]
                raw.extra["runs_calls_per_s"] = [round(r.timing.calls_per_s, 1) for r in raws]
                raw.checks["passed"] = all(r.checks["passed"] for r in raws)
                with console.status(f"{label}: raw sqlite3, commit per call"):
                    single = await cell_raw(
                        plan,
                        callers=callers,
                        synchronous=synchronous,
                        warmup=args.warmup,
                        base=base,
                        max_batch=1,
                    )
                cell = {
                    "callers": callers,
                    "synchronous": synchronous,
                    "duplicates": share,
                    "toolledger": ledger.summary(),
                    "raw_group_commit": raw.summary(),
                    "raw_commit_per_call": single.summary(),
                    "ratio": round(ledger.timing.calls_per_s / raw.timing.calls_per_s, 4),
                    "ratio_vs_commit_per_call": round(
                        ledger.timing.calls_per_s / single.timing.calls_per_s, 4
                    ),
                }
                cells.append(cell)
                if "half_rate" in ledger.extra:
                    h = ledger.extra["half_rate"]
                    console.print(
                        f"{label}: at half the rate ({h['rate_per_s']:,.0f} calls/s, open loop) "
                        f"p50 {h['p50_ms']} ms, p99 {h['p99_ms']} ms"
                    )
                console.print(
                    f"{label}: toolledger {cell['toolledger']['calls_per_s']:,.0f} calls/s "
                    f"(p50 {cell['toolledger']['p50_ms']} ms, p99 {cell['toolledger']['p99_ms']}"
                    f" ms), raw {cell['raw_group_commit']['calls_per_s']:,.0f} / "
                    f"{cell['raw_commit_per_call']['calls_per_s']:,.0f} calls/s, "
                    f"ratio {cell['ratio']}"
                )
    return {
        "workload": {
            **workload_meta(args.calls, 0, MATRIX_DUPLICATES),
            "callers": list(args.callers),
            "warmup_calls": args.warmup,
            "retry_gap": "a retry comes at least 4 x callers calls after its original",
        },
        "toolledger": "toolledger.Ledger.embedded (partitions 4, default cache), one event "
        "loop; callers are coroutines in a closed loop (next call when answered)",
        "raw_definition": (
            "one INSERT OR IGNORE of (tenant, tool, key, sha256 of the arguments) per call in "
            "plain sqlite3, same journal_mode=WAL and synchronous, one writer thread, the "
            "same closed-loop callers on one event loop; a caller whose insert won runs the "
            "no-op tool; a retry reads and compares the stored digest. raw_group_commit: "
            "all claims waiting when the writer is free in one transaction; "
            "raw_commit_per_call: one transaction per call. No outcome, log or audit rows."
        ),
        "ratio": "toolledger calls_per_s / raw_group_commit calls_per_s",
        "cells": cells,
    }


def show_matrix(matrix: dict[str, Any], console: Console) -> None:
    table = Table(title=f"issue 11 matrix: {matrix['workload']['calls']} calls per cell")
    for name in (
        "callers",
        "sync",
        "D",
        "toolledger calls/s",
        "p50 / p99 ms",
        "raw group calls/s",
        "raw p50 / p99 ms",
        "raw per-call calls/s",
        "ratio",
        "checks",
    ):
        table.add_column(name, justify="right")
    for cell in matrix["cells"]:
        t, r, s = cell["toolledger"], cell["raw_group_commit"], cell["raw_commit_per_call"]
        ok = all(x["checks"]["passed"] for x in (t, r, s))
        table.add_row(
            str(cell["callers"]),
            cell["synchronous"],
            f"{cell['duplicates']:.1f}",
            f"{t['calls_per_s']:,.0f}",
            f"{t['p50_ms']:.1f} / {t['p99_ms']:.1f}",
            f"{r['calls_per_s']:,.0f}",
            f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f}",
            f"{s['calls_per_s']:,.0f}",
            f"{cell['ratio']:.3f}",
            "ok" if ok else "[red]FAILED",
        )
    console.print(table)


# -- driver -----------------------------------------------------------------------------------


async def measure(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """Both parts; ``--only`` leaves one out."""
    result: dict[str, Any] = {}
    if args.only in (None, "window"):
        result = await measure_window(args, console)
    else:
        result["meta"] = run_meta(args)
    if args.only in (None, "matrix"):
        result["matrix"] = await measure_matrix(args, console)
    return result


def run_meta(args: argparse.Namespace) -> dict[str, Any]:
    return {
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
    }


async def measure_window(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    base = Path(args.tmp_dir) if args.tmp_dir else None
    with new_progress(console, 26) as progress:
        distinct = await run_ledger(
            plan_distinct(args.calls, "k"),
            window=args.window,
            warmup=args.warmup,
            synchronous=args.synchronous,
            base=base,
            progress=progress,
            label="ledger, 0% duplicates",
            sample=True,
        )
        dup50 = await run_ledger(
            plan_dup50(args.calls, args.window),
            window=args.window,
            warmup=args.warmup,
            synchronous=args.synchronous,
            base=base,
            progress=progress,
            label="ledger, 50% duplicates",
        )
        assert distinct.sample is not None
        raw_runs = [
            run_raw(
                distinct.sample,
                args.calls,
                window=args.window,
                warmup=args.warmup,
                synchronous=args.synchronous,
                base=base,
                progress=progress,
                label=f"raw sqlite3 #{i + 1}",
            )
            for i in range(args.raw_repeats)
        ]
    raw = statistics.median(raw_runs)
    sample = distinct.sample
    return {
        "calls_per_s": round(distinct.calls_per_s, 1),
        "calls_per_s_dup50": round(dup50.calls_per_s, 1),
        "raw_rows_per_s": round(raw, 1),
        "ratio": round(distinct.calls_per_s / raw, 4),
        "meta": {
            **run_meta(args),
            "seconds": {
                "calls": round(distinct.seconds, 3),
                "calls_dup50": round(dup50.seconds, 3),
            },
            "raw_runs_per_s": [round(r, 1) for r in raw_runs],
            "raw_row_definition": (
                "one row = one call-equivalent set of 3 SQLite row writes: an intent record in "
                f"log ({len(sample.intent_value)} B value), an outcome record in log "
                f"({len(sample.outcome_value)} B value, a real encoded ToolCallSucceeded) and "
                "a tool_calls upsert (the ledger's own row, which is also the key's state); "
                "window-sized batches, one transaction per batch, same tables, indexes, "
                "journal_mode and synchronous"
            ),
            "ledger_rows_in_file_per_call": {
                "0pct_dup": per_call(distinct.rows, args.calls + args.warmup),
                "50pct_dup": per_call(dup50.rows, args.calls + args.warmup),
            },
            "checks": {
                "0pct_dup": check_summary(distinct.checks),
                "50pct_dup": check_summary(dup50.checks),
            },
        },
    }


def per_call(rows: dict[str, int], calls: int) -> dict[str, float]:
    return {table: round(count / calls, 3) for table, count in rows.items()}


def check_summary(checks: Checks) -> dict[str, Any]:
    return {
        "passed": checks.passed,
        "calls": checks.calls,
        "not_ok": checks.not_ok,
        "replay_flag_wrong": checks.replay_flag_wrong,
        "handler_invocations": checks.handler_invocations,
        "distinct_keys": checks.distinct_keys,
        "examples": checks.examples,
    }


def show(result: dict[str, Any], console: Console) -> None:
    if "calls_per_s" in result:
        show_window(result, console)
    if "matrix" in result:
        show_matrix(result["matrix"], console)


def all_checks(result: dict[str, Any]) -> list[dict[str, Any]]:
    checks = list(result["meta"].get("checks", {}).values())
    for cell in result.get("matrix", {}).get("cells", []):
        checks.extend(
            cell[system]["checks"]
            for system in ("toolledger", "raw_group_commit", "raw_commit_per_call")
        )
        if "half_rate" in cell["toolledger"]:
            checks.append(cell["toolledger"]["half_rate"]["checks"])
    return checks


def show_window(result: dict[str, Any], console: Console) -> None:
    meta = result["meta"]
    table = Table(
        title=f"toolledger embedded: {meta['calls']} calls, window {meta['window']}, "
        f"synchronous={meta['synchronous']}"
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("notes")
    checks = meta["checks"]
    table.add_row(
        "calls_per_s",
        f"{result['calls_per_s']:,.1f}",
        f"0% duplicates, {meta['seconds']['calls']} s, checks "
        f"{'ok' if checks['0pct_dup']['passed'] else '[red]FAILED'}",
    )
    table.add_row(
        "calls_per_s_dup50",
        f"{result['calls_per_s_dup50']:,.1f}",
        f"50% replays, {meta['seconds']['calls_dup50']} s, checks "
        f"{'ok' if checks['50pct_dup']['passed'] else '[red]FAILED'}",
    )
    table.add_row(
        "raw_rows_per_s",
        f"{result['raw_rows_per_s']:,.1f}",
        "median of "
        + ", ".join(f"{r:,.0f}" for r in meta["raw_runs_per_s"])
        + " call-equivalent row sets/s",
    )
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
        run = asyncio.run(
            run_ledger(
                plan_distinct(args.profile_calls, "p"),
                window=args.window,
                warmup=args.warmup,
                synchronous=args.synchronous,
                base=base,
                progress=progress,
                label="profile, 0% duplicates",
            )
        )
        profiler.disable()
    console.print(
        f"profiled: {args.profile_calls} calls at {run.calls_per_s:,.0f} calls/s "
        f"(under the profiler), checks {'ok' if run.checks.passed else 'FAILED'}"
    )
    for order in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(15)
        console.print(out.getvalue(), markup=False, highlight=False, soft_wrap=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.embedded",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--calls", type=int, default=10_000, help="calls per scenario and cell")
    parser.add_argument("--window", type=int, default=256, help="calls in flight at a time")
    parser.add_argument("--warmup", type=int, default=512, help="untimed calls first")
    parser.add_argument("--raw-repeats", type=int, default=5)
    parser.add_argument(
        "--matrix-raw-repeats",
        type=int,
        default=3,
        help="raw group-commit runs per matrix cell (the median is kept)",
    )
    parser.add_argument("--synchronous", default="FULL", choices=["OFF", "NORMAL", "FULL", "EXTRA"])
    parser.add_argument(
        "--callers",
        type=int,
        nargs="+",
        default=list(MATRIX_CALLERS),
        help="the matrix's numbers of concurrent callers",
    )
    parser.add_argument(
        "--only",
        choices=["window", "matrix"],
        default=None,
        help="run only the window scenarios or only the matrix",
    )
    parser.add_argument("--tmp-dir", default=None, help="where the scratch databases go")
    parser.add_argument("--out", default="bench/results/embedded.json")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also run --profile-calls calls under cProfile and print hot spots",
    )
    parser.add_argument("--profile-calls", type=int, default=4096)
    args = parser.parse_args(argv)
    if (
        args.calls < 2
        or args.window < 1
        or args.warmup < 0
        or args.raw_repeats < 1
        or min(args.callers) < 1
        or args.matrix_raw_repeats < 1
    ):
        parser.error(
            "need --calls >= 2, --window >= 1, --warmup >= 0, --raw-repeats >= 1, --callers >= 1, "
            "--matrix-raw-repeats >= 1"
        )
    console = Console(width=None if sys.stdout.isatty() else 160)  # the matrix is wide
    result = asyncio.run(measure(args, console))
    show(result, console)
    write_result(result, args.out, console)
    if args.profile:
        profile(args, console)
    return 0 if all(c["passed"] for c in all_checks(result)) else 1


if __name__ == "__main__":
    sys.exit(main())
