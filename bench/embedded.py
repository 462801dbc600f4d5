"""Throughput, latency and CPU per call of the embedded ledger, against a raw ``sqlite3`` claim
table in the same run.

Run::

    .venv/bin/python -m bench.embedded              # the matrix, 10,000 calls per cell (make bench)
    .venv/bin/python -m bench.embedded --calls 20000                 # the issue's size
    .venv/bin/python -m bench.embedded --callers 16 --synchronous FULL --duplicates 0  # one cell
    .venv/bin/python -m bench.embedded --profile     # then: cProfile of the event loop, top 15

**The matrix of issue 30** (``matrix`` in the result): the workload of issue 11
(``bench/common.py``: ``--calls`` calls per cell, 10,000 by default, 200-byte JSON arguments, 8
tenants, 5 no-op tools that count their executions, 128-bit keys) through the public API
(``toolledger.Ledger.embedded``, 4 partitions, the default cache) for every combination of
callers {16, 64} x ``synchronous`` {FULL, NORMAL} x duplicate share D {0, 0.5} (a retry of an
earlier call's key with the same arguments, at least 4 x callers calls after it). Callers are
coroutines in a closed loop on one event loop (each issues its next call when the previous one
was answered), after an untimed warm-up. Each cell gives calls/s, p50 and p99 latency and **CPU
ms per call**: ``time.process_time()`` over the measured loop (every thread of this process:
the event loop, the ledger's writer thread) divided by the calls. No progress display runs
while a cell is measured (its refresh thread would count as CPU).

Beside each cell, in the same run, the raw baseline (:class:`RawClaims`): one ``INSERT OR
IGNORE`` per call into a plain ``sqlite3`` claim table with the same ``journal_mode=WAL`` and
``synchronous``, the same callers and one writer thread, with group commit
(``raw_group_commit``: every claim waiting when the writer is free in one transaction, the
median of ``--raw-repeats`` runs, the ratio's denominator) and with a commit per call
(``raw_commit_per_call``); its CPU per call is measured the same way. Every cell checks that
each unique key executed exactly once and that exactly the retries were answered as replays.

The target's own cell (16 callers, FULL, D=0) then runs an open loop on new keys at half its
closed-loop rate for ``--half-rate-seconds`` (``half_rate``: calls issued on a fixed schedule,
latency from each call's scheduled start), for the target's "p99 at half that rate".

``--profile`` then runs ``--profile-calls`` calls of the target cell under cProfile (the event
loop's thread: the callers, the executor core, the read side; not the writer thread) and
prints the top 15 functions by cumulative and by own time. The exit status is 1 if any check
failed.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import io
import json
import os
import platform
import pstats
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common import (
    TENANTS,
    Executions,
    Timing,
    WorkCall,
    drive_async,
    drive_at_rate,
    make_workload_registry,
    plan_workload,
    workload_meta,
    write_result,
)
from toolledger import Ledger
from toolledger.producers.client import TrustedContext

PARTITIONS = 4  # EmbeddedLedger's default
CALLERS = (16, 64)
SYNCHRONOUS = ("FULL", "NORMAL")
DUPLICATES = (0.0, 0.5)
TARGET = (16, "FULL", 0.0)  # the cell of issue 30's targets: its open loop runs at half rate
CONTEXTS = {t: TrustedContext(tenant_id=t, principal="bench-agent") for t in TENANTS}


@contextmanager
def scratch_dir(base: Path | None) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="toolledger-bench-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


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
    cpu_s: float  # this process's CPU time (every thread) over the measured loop
    checks: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cpu_ms_per_call(self) -> float:
        return self.cpu_s * 1000 / len(self.timing.latencies_s)

    def summary(self) -> dict[str, Any]:
        return {
            **self.timing.summary(),
            "cpu_ms_per_call": round(self.cpu_ms_per_call, 4),
            **self.extra,
            "checks": self.checks,
        }


def warm_plan(calls: int) -> list[WorkCall]:
    return plan_workload(calls, 0.0, gap=1, seed=999)


async def timed(
    plan: Sequence[WorkCall],
    callers: int,
    call: Callable[[WorkCall], Awaitable[None]],
    profiler: cProfile.Profile | None = None,
) -> tuple[Timing, float]:
    """The closed loop over ``plan`` and this process's CPU seconds over it."""
    cpu = time.process_time()
    if profiler is not None:
        profiler.enable()
    try:
        timing = await drive_async(plan, callers, call)
    finally:
        if profiler is not None:
            profiler.disable()
    return timing, time.process_time() - cpu


async def cell_ledger(
    plan: Sequence[WorkCall],
    *,
    callers: int,
    synchronous: str,
    warmup: int,
    base: Path | None,
    half_rate_s: float = 0.0,
    profiler: cProfile.Profile | None = None,
) -> CellRun:
    """The workload through the public API (``toolledger.Ledger.embedded``). With
    ``half_rate_s``, then an open loop at half the closed loop's calls/s for that long, on new
    keys of the same workload (``extra["half_rate"]``: the latency at half the load). With
    ``profiler``, the measured loop runs under it."""
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
            timing, cpu_s = await timed(plan, callers, call, profiler)
            checks = wrong.into(executions.check(plan))
            extra: dict[str, Any] = {}
            if half_rate_s > 0:
                rate = timing.calls_per_s / 2
                more = plan_workload(max(1, round(rate * half_rate_s)), 0.0, gap=1, seed=77)
                executions.reset()
                wrong = WrongAnswers()
                cpu = time.process_time()
                at_rate = await drive_at_rate(more, rate, call)
                cpu = time.process_time() - cpu
                extra["half_rate"] = {
                    "rate_per_s": round(rate, 1),
                    "calls": len(more),
                    "p50_ms": round(at_rate.percentile_ms(50), 2),
                    "p99_ms": round(at_rate.percentile_ms(99), 2),
                    "cpu_ms_per_call": round(cpu * 1000 / len(more), 4),
                    "checks": wrong.into(executions.check(more)),
                }
    return CellRun(timing, cpu_s, checks, extra)


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
            timing, cpu_s = await timed(plan, callers, call)
            commits = claims.commits - commits
        finally:
            claims.close()
    checks = wrong.into(executions.check(plan))
    return CellRun(
        timing, cpu_s, checks, {"calls_per_commit": round(len(plan) / max(commits, 1), 1)}
    )


def cell_plan(calls: int, callers: int, share: float) -> list[WorkCall]:
    # the retry of a key comes >= 4 x callers calls after it: almost always a replay
    return plan_workload(calls, share, gap=4 * callers)


async def measure_cell(
    args: argparse.Namespace, callers: int, synchronous: str, share: float, console: Console
) -> dict[str, Any]:
    base = Path(args.tmp_dir) if args.tmp_dir else None
    plan = cell_plan(args.calls, callers, share)
    label = f"{callers} callers, {synchronous}, D={share:g}"
    half = (callers, synchronous, share) == TARGET
    console.print(f"{label}: toolledger{' (then half its rate)' if half else ''}")
    ledger = await cell_ledger(
        plan,
        callers=callers,
        synchronous=synchronous,
        warmup=args.warmup,
        base=base,
        half_rate_s=args.half_rate_seconds if half else 0.0,
    )
    # the raw runs are short and load-sensitive: the median of a few group-commit runs (by
    # calls/s) is kept, and all are listed
    console.print(f"{label}: raw sqlite3, group commit x {args.raw_repeats}, commit per call")
    raws = [
        await cell_raw(
            plan,
            callers=callers,
            synchronous=synchronous,
            warmup=args.warmup,
            base=base,
            max_batch=None,
        )
        for _ in range(args.raw_repeats)
    ]
    raws.sort(key=lambda r: r.timing.calls_per_s)
    raw = raws[len(raws) // 2]
    raw.extra["runs_calls_per_s"] = [round(r.timing.calls_per_s, 1) for r in raws]
    raw.checks["passed"] = all(r.checks["passed"] for r in raws)
    single = await cell_raw(
        plan,
        callers=callers,
        synchronous=synchronous,
        warmup=args.warmup,
        base=base,
        max_batch=1,
    )
    cell: dict[str, Any] = {
        "callers": callers,
        "synchronous": synchronous,
        "duplicates": share,
        "toolledger": ledger.summary(),
        "raw_group_commit": raw.summary(),
        "raw_commit_per_call": single.summary(),
        "ratio": round(ledger.timing.calls_per_s / raw.timing.calls_per_s, 4),
        "ratio_vs_commit_per_call": round(ledger.timing.calls_per_s / single.timing.calls_per_s, 4),
        "cpu_ratio": round(ledger.cpu_ms_per_call / max(raw.cpu_ms_per_call, 1e-9), 2),
    }
    t, r = cell["toolledger"], cell["raw_group_commit"]
    console.print(
        f"{label}: toolledger {t['calls_per_s']:,.0f} calls/s (p50 {t['p50_ms']} ms, p99 "
        f"{t['p99_ms']} ms, {t['cpu_ms_per_call']:.3f} ms CPU/call), raw "
        f"{r['calls_per_s']:,.0f} calls/s ({r['cpu_ms_per_call']:.3f} ms CPU/call), "
        f"ratio {cell['ratio']}"
    )
    if "half_rate" in t:
        h = t["half_rate"]
        console.print(
            f"{label}: at half the rate ({h['rate_per_s']:,.0f} calls/s, open loop) "
            f"p50 {h['p50_ms']} ms, p99 {h['p99_ms']} ms, {h['cpu_ms_per_call']:.3f} ms CPU/call"
        )
    return cell


async def measure(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    load_start = round(os.getloadavg()[0], 2)  # other work on the machine skews everything
    cells = [
        await measure_cell(args, callers, synchronous, share, console)
        for callers in args.callers
        for synchronous in args.synchronous
        for share in args.duplicates
    ]
    return {
        "matrix": {
            "workload": {
                **workload_meta(args.calls, 0, args.duplicates),
                "callers": list(args.callers),
                "warmup_calls": args.warmup,
                "retry_gap": "a retry comes at least 4 x callers calls after its original",
            },
            "toolledger": f"toolledger.Ledger.embedded (partitions {PARTITIONS}, default "
            "cache), one event loop; callers are coroutines in a closed loop (next call when "
            "answered)",
            "raw_definition": (
                "one INSERT OR IGNORE of (tenant, tool, key, sha256 of the arguments) per call "
                "in plain sqlite3, same journal_mode=WAL and synchronous, one writer thread, the "
                "same closed-loop callers on one event loop; a caller whose insert won runs the "
                "no-op tool; a retry reads and compares the stored digest. raw_group_commit: "
                "all claims waiting when the writer is free in one transaction; "
                "raw_commit_per_call: one transaction per call. No outcome, log or audit rows."
            ),
            "cpu_definition": "cpu_ms_per_call: time.process_time() (this process, every "
            "thread: event loop and writer) over the measured loop / its calls",
            "ratio": "toolledger calls_per_s / raw_group_commit calls_per_s",
            "cpu_ratio": "toolledger cpu_ms_per_call / raw_group_commit cpu_ms_per_call",
            "cells": cells,
        },
        "meta": {
            "calls": args.calls,
            "warmup_calls": args.warmup,
            "raw_repeats": args.raw_repeats,
            "half_rate_seconds": args.half_rate_seconds,
            "partitions": PARTITIONS,
            "journal_mode": "WAL",
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_1m": {"start": load_start, "end": round(os.getloadavg()[0], 2)},
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    }


def show(result: dict[str, Any], console: Console) -> None:
    matrix = result["matrix"]
    table = Table(title=f"embedded matrix: {matrix['workload']['calls']} calls per cell")
    for name in (
        "callers",
        "sync",
        "D",
        "toolledger calls/s",
        "p50 / p99 ms",
        "CPU ms/call",
        "raw group calls/s",
        "raw p50 / p99 ms",
        "raw CPU ms/call",
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
            f"{t['cpu_ms_per_call']:.3f}",
            f"{r['calls_per_s']:,.0f}",
            f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f}",
            f"{r['cpu_ms_per_call']:.3f}",
            f"{s['calls_per_s']:,.0f}",
            f"{cell['ratio']:.3f}",
            "ok" if ok else "[red]FAILED",
        )
    console.print(table)


def all_checks(result: dict[str, Any]) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    for cell in result["matrix"]["cells"]:
        checks.extend(
            cell[system]["checks"]
            for system in ("toolledger", "raw_group_commit", "raw_commit_per_call")
        )
        if "half_rate" in cell["toolledger"]:
            checks.append(cell["toolledger"]["half_rate"]["checks"])
    return checks


def profile(args: argparse.Namespace, console: Console) -> None:
    """The target cell's closed loop under cProfile (the event loop's thread); prints the top
    15 functions by cumulative and by own time."""
    callers, synchronous, share = TARGET
    profiler = cProfile.Profile()
    run = asyncio.run(
        cell_ledger(
            cell_plan(args.profile_calls, callers, share),
            callers=callers,
            synchronous=synchronous,
            warmup=args.warmup,
            base=Path(args.tmp_dir) if args.tmp_dir else None,
            profiler=profiler,
        )
    )
    console.print(
        f"profiled: {args.profile_calls} calls, {callers} callers, {synchronous}, D={share:g}, "
        f"at {run.timing.calls_per_s:,.0f} calls/s and {run.cpu_ms_per_call:.3f} ms CPU per "
        f"call (under the profiler), checks {'ok' if run.checks['passed'] else 'FAILED'}"
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
    parser.add_argument("--calls", type=int, default=10_000, help="measured calls per cell")
    parser.add_argument("--warmup", type=int, default=512, help="untimed calls first, per run")
    parser.add_argument(
        "--callers", type=int, nargs="+", default=list(CALLERS), help="concurrent callers"
    )
    parser.add_argument(
        "--synchronous", nargs="+", choices=["OFF", "NORMAL", "FULL", "EXTRA"],
        default=list(SYNCHRONOUS), help="SQLite synchronous settings",
    )  # fmt: skip
    parser.add_argument(
        "--duplicates", type=float, nargs="+", default=list(DUPLICATES),
        help="duplicate shares D (0 <= D <= 0.5)",
    )  # fmt: skip
    parser.add_argument(
        "--raw-repeats",
        type=int,
        default=3,
        help="raw group-commit runs per cell (the median is kept)",
    )
    parser.add_argument(
        "--half-rate-seconds",
        type=float,
        default=10.0,
        help="length of the target cell's open loop at half its rate",
    )
    parser.add_argument("--tmp-dir", default=None, help="where the scratch databases go")
    parser.add_argument("--out", default="bench/results/embedded.json")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="then run --profile-calls calls of the 16-caller FULL D=0 cell under cProfile",
    )
    parser.add_argument("--profile-calls", type=int, default=4096)
    args = parser.parse_args(argv)
    if (
        args.calls < 2
        or args.warmup < 0
        or min(args.callers) < 1
        or args.raw_repeats < 1
        or args.half_rate_seconds <= 0
        or args.profile_calls < 2
        or not all(0.0 <= d <= 0.5 for d in args.duplicates)
    ):
        parser.error(
            "need --calls >= 2, --warmup >= 0, --callers >= 1, --raw-repeats >= 1, "
            "--half-rate-seconds > 0, --profile-calls >= 2, 0 <= --duplicates <= 0.5"
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
