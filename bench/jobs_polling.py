"""The cost of polling: 1,000 running jobs of a long-running no-op tool on the embedded
ledger, against the same process idle with an embedded ledger that holds no running job.

Run::

    .venv/bin/python -m bench.groups --jobs 1000            # ~45 s on 2 cores
    .venv/bin/python -m bench.jobs_polling --jobs 1000 --window 10
    .venv/bin/python -m bench.jobs_polling --profile        # + a profiled window (CPU clock)

Phases, each on its own ledger in a temporary directory, with the defaults ``toolledger
serve`` uses (``EmbeddedLedger``'s: 4 partitions, one executor core and its sweeper, a sweep
every second, ``synchronous=FULL``):

``idle``
    An embedded ledger with the tool registered and no call: after a 1 s settle, the
    process's CPU time (``time.process_time``: every thread, the SQLite writer's too) and the
    wall time over ``--window`` seconds.
``jobs``
    ``--jobs`` calls of ``bench_job`` (its handler returns a ``JobRef`` at once, its poll
    always answers ``JobRunning()`` and counts itself), from 64 concurrent callers, until
    every call is ``PENDING`` with a job and held by the executor's sweeper. Then the same
    measure over the same window, from the moment the last job is running, so the window sees
    the sweeper's backoff grow (0.1 s doubling to 5 s per job, looked at once per sweep):
    polls/s over the first and the last quarter of the window, and per second.

Reported: polls/s, CPU ms per wall second with the jobs and idle (and their ratio), CPU µs per
poll (all of the process's CPU over the polls, and only what exceeds idle).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import inspect
import io
import itertools
import os
import platform
import pstats
import sqlite3
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.table import Table

from bench.common import write_result
from toolledger.embedded import EmbeddedLedger
from toolledger.processors import executor as executor_core
from toolledger.processors.tools.manifest import JobRef, JobRunning, PollAnswer, ToolContext
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.producers.client import TrustedContext
from toolledger.schemas.status import CallStatus
from toolledger.settings import LedgerSettings

CONTEXT = TrustedContext("bench-tenant", "bench@example.com")
JOB_TOOL = "bench_job"
CALLERS = 64
SETTLE_S = 1.0
DEFAULT_JOBS = 1000
DEFAULT_WINDOW_S = 20.0  # the backoff reaches its 5 s cap ~16 s after a job starts
OUT = "bench/results/jobs_polling.json"


class JobArgs(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    n: int


class JobDone(BaseModel):
    ok: bool


class Polls:
    """What the tool saw: jobs started, each poll's time (``perf_counter``), cancels."""

    def __init__(self) -> None:
        self.started = 0
        self.at: list[float] = []
        self.by_job: dict[str, int] = {}
        self.cancelled = 0

    @property
    def count(self) -> int:
        return len(self.at)


def make_job_registry(polls: Polls) -> ToolRegistry:
    """A long-running no-op: the job "starts" at once and never finishes."""
    registry = ToolRegistry()

    @registry.long_running(name=JOB_TOOL, result=JobDone)
    async def bench_job(args: JobArgs, ctx: ToolContext) -> JobRef:
        """Starts a job that never finishes (benchmark).

        Use when: benchmarking the sweeper's polls.
        """
        polls.started += 1
        return JobRef(job_id=f"job-{ctx.idempotency_key}")

    @bench_job.poll
    async def poll(job: JobRef, ctx: ToolContext) -> PollAnswer:
        polls.at.append(time.perf_counter())
        polls.by_job[job.job_id] = polls.by_job.get(job.job_id, 0) + 1
        return JobRunning()  # no progress: the poll records nothing

    @bench_job.cancel
    async def cancel(job: JobRef, ctx: ToolContext) -> None:
        polls.cancelled += 1

    return registry


def _running_jobs(ledger: EmbeddedLedger) -> int:
    """Keys the executor's sweeper polls (its PENDING calls with a running job)."""
    assert ledger.runtime is not None and ledger.runtime.executor is not None
    return ledger.runtime.executor.polled_jobs


def _load() -> float:
    return round(os.getloadavg()[0], 2)


async def _measure(seconds: float) -> tuple[float, dict[str, Any]]:
    """This process's CPU and wall time over ``seconds`` of doing nothing itself but read
    the CPU clock once a second (the ledger's background tasks run); also the window's start
    (``perf_counter``)."""
    cpu0, start = time.process_time(), time.perf_counter()
    marks = [cpu0]
    while (left := start + seconds - time.perf_counter()) > 0:
        await asyncio.sleep(min(1.0, left))
        marks.append(time.process_time())
    cpu, wall = marks[-1] - cpu0, time.perf_counter() - start
    return start, {
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 4),
        "cpu_ms_per_s": round(cpu / wall * 1000, 2),
        "cpu_ms_per_second_of_window": [
            round((b - a) * 1000, 2) for a, b in itertools.pairwise(marks)
        ],
    }


async def _start_jobs(ledger: EmbeddedLedger, jobs: int, polls: Polls) -> dict[str, Any]:
    """``jobs`` calls, until each is PENDING with a job and the sweeper polls them all."""
    keys = iter(range(jobs))
    bad: list[str] = []

    async def caller() -> None:
        for i in keys:
            key = f"k{i:06d}"
            result = await ledger.client.call(
                JOB_TOOL, {"n": i}, idempotency_key=key, context=CONTEXT, wait=10
            )
            while result.status is CallStatus.PENDING and result.job is None:
                await asyncio.sleep(0.05)  # not started yet: the same key asks again
                result = await ledger.client.call(
                    JOB_TOOL, {"n": i}, idempotency_key=key, context=CONTEXT, wait=10
                )
            if result.status is not CallStatus.PENDING or result.job is None:
                bad.append(f"{key}: {result.status} {result.error}")

    cpu, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(CALLERS)))
    if bad:
        raise RuntimeError(f"{len(bad)} calls are not running jobs, e.g. {bad[:3]}")
    while _running_jobs(ledger) < jobs:
        if time.perf_counter() - started > 60:
            raise RuntimeError(f"only {_running_jobs(ledger)} of {jobs} jobs are polled")
        await asyncio.sleep(0.01)
    return {
        "seconds": round(time.perf_counter() - started, 3),
        "cpu_s": round(time.process_time() - cpu, 3),
        "jobs_started": polls.started,
        "polls_during_start": polls.count,
    }


def _per_second(at: Sequence[float], start: float, seconds: float) -> list[int]:
    buckets = [0] * max(1, round(seconds))
    for t in at:
        i = int(t - start)
        if 0 <= i < len(buckets):
            buckets[i] += 1
    return buckets


def _part_rates(per_second: Sequence[int]) -> tuple[float, float]:
    """Polls/s over the first and the last quarter of the window's whole seconds (the
    sweeper polls in bursts, once a second: parts are whole seconds)."""
    part = max(1, len(per_second) // 4)
    return (
        round(sum(per_second[:part]) / part, 1),
        round(sum(per_second[-part:]) / part, 1),
    )


def _profile_top(profiler: cProfile.Profile, sort: str, limit: int = 10) -> list[str]:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats(sort).print_stats(limit)
    lines = out.getvalue().splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
    return [line.rstrip() for line in lines[header : header + limit + 1]]


async def run(jobs: int, window_s: float, *, profile: bool = False) -> dict[str, Any]:
    """The idle window, then the jobs window (and, with ``profile``, a profiled one)."""
    defaults = inspect.signature(EmbeddedLedger.__init__).parameters
    polls = Polls()
    registry = make_job_registry(polls)
    load = {"start": _load()}

    with tempfile.TemporaryDirectory(prefix="toolledger-jobs-") as tmp:
        async with EmbeddedLedger(
            LedgerSettings(path=Path(tmp) / "ledger.db", create=True), registry
        ) as ledger:
            await asyncio.sleep(SETTLE_S)
            assert _running_jobs(ledger) == 0
            _, idle = await _measure(window_s)
    load["after_idle"] = _load()

    profiled: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="toolledger-jobs-") as tmp:
        async with EmbeddedLedger(
            LedgerSettings(path=Path(tmp) / "ledger.db", create=True), registry
        ) as ledger:
            setup = await _start_jobs(ledger, jobs, polls)
            before = polls.count
            start, busy = await _measure(window_s)
            window_polls = [t for t in polls.at[before:] if t < start + busy["wall_s"]]
            after_window = polls.count
            running_after = _running_jobs(ledger)
            if profile:
                profiler = cProfile.Profile(time.process_time)
                profiler.enable()
                _, profiled_window = await _measure(window_s)
                profiler.disable()
                profiled = {
                    "note": "a further window of the same ledger, main thread only (the SQLite "
                    "writer's thread is not in it), CPU clock; its CPU includes the profiler's",
                    "window": profiled_window,
                    "polls": polls.count - after_window,
                    "top_tottime": _profile_top(profiler, "tottime"),
                    "top_cumulative": _profile_top(profiler, "cumulative"),
                }
    load["end"] = _load()

    wall = busy["wall_s"]
    count = len(window_polls)
    per_second = _per_second(window_polls, start, wall)
    first, last = _part_rates(per_second)
    cpu_first, cpu_last = _part_rates(busy["cpu_ms_per_second_of_window"])
    part = max(1, len(per_second) // 4)
    last_polls = sum(per_second[-part:])
    last_over_idle_ms = (cpu_last - idle["cpu_ms_per_s"]) * part
    extra_cpu_s = busy["cpu_s"] - idle["cpu_ms_per_s"] / 1000 * wall  # idle scaled to `wall`
    base, cap = executor_core._POLL_BACKOFF_BASE_S, executor_core._POLL_BACKOFF_CAP_S
    sweep_s = float(defaults["sweep_interval_s"].default)
    per_job = [polls.by_job.get(f"job-k{i:06d}", 0) for i in range(jobs)]
    result: dict[str, Any] = {
        "jobs": jobs,
        "window_s": window_s,
        "polls_per_s": round(count / wall, 1),
        "polls_per_s_first_quarter": first,
        "polls_per_s_last_quarter": last,
        "cpu_ms_per_s_with_jobs": busy["cpu_ms_per_s"],
        "cpu_ms_per_s_with_jobs_first_quarter": cpu_first,
        "cpu_ms_per_s_with_jobs_last_quarter": cpu_last,
        "cpu_ms_per_s_idle": idle["cpu_ms_per_s"],
        "ratio_jobs_vs_idle": round(busy["cpu_ms_per_s"] / idle["cpu_ms_per_s"], 2)
        if idle["cpu_ms_per_s"]
        else None,
        "cpu_ms_per_s_over_idle": round(busy["cpu_ms_per_s"] - idle["cpu_ms_per_s"], 2),
        "cpu_us_per_poll": round(busy["cpu_s"] / count * 1e6, 1) if count else None,
        "cpu_us_per_poll_over_idle": round(extra_cpu_s / count * 1e6, 1) if count else None,
        "cpu_us_per_poll_over_idle_last_quarter": round(last_over_idle_ms / last_polls * 1e3, 1)
        if last_polls
        else None,
        "meta": {
            "phases": {
                "idle": idle | {"settle_s": SETTLE_S, "running_jobs": 0},
                "start_jobs": setup | {"callers": CALLERS},
                "jobs": busy
                | {
                    "polls": count,
                    "polls_per_second_of_window": per_second,
                    "running_jobs_at_start": jobs,
                    "running_jobs_at_end": running_after,
                },
            },
            "polls_per_job_total": {"min": min(per_job), "max": max(per_job)},
            "cancels": polls.cancelled,
            "profile": profiled,
            "ledger": {
                "backend": "embedded (toolledger.embedded.EmbeddedLedger), as `toolledger "
                "serve` starts it: no sweep, partition or concurrency option passed",
                "sweep_interval_s": sweep_s,
                "partitions": defaults["partitions"].default,
                "concurrency": defaults["concurrency"].default,
                "synchronous": defaults["synchronous"].default,
                "poll_backoff": f"min({cap:g}, {base:g} * 2**polls) s per job, looked at by "
                f"the executor's sweeper every {sweep_s:g} s (processors/executor.py, "
                "Executor._sweep_loop)",
                "steady_polls_per_s_at_most": round(jobs / cap, 1),
            },
            "tool": "long_running no-op: the handler returns a JobRef, the poll always "
            "answers JobRunning() (no progress, so a poll commits no event)",
            "definitions": {
                "cpu_ms_per_s": "time.process_time() of this process (every thread) over the "
                "window / its wall time",
                "cpu_us_per_poll": "the jobs window's CPU / polls in it",
                "cpu_us_per_poll_over_idle": "(the jobs window's CPU - the idle CPU rate x its "
                "wall time) / polls in it",
                "first/last quarter": "polls (CPU ms) in the first / last quarter of the jobs "
                "window's whole seconds (it starts when the last job runs) / those seconds; "
                "the last quarter is the backoff at its cap when the window is >= 20 s",
            },
            "load_average_1m": load,
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    }
    return result


def print_table(result: dict[str, Any], console: Console) -> None:
    ledger = result["meta"]["ledger"]
    table = Table(
        title=f"{result['jobs']:,} running jobs vs idle, {result['window_s']:g} s each "
        f"(sweep every {ledger['sweep_interval_s']:g} s, {ledger['partitions']} partitions)"
    )
    for column in ("measure", "1,000 jobs" if result["jobs"] == 1000 else "jobs", "idle"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    table.add_row("polls/s", f"{result['polls_per_s']:,}", "0")
    table.add_row(
        "polls/s first / last quarter",
        f"{result['polls_per_s_first_quarter']:,} / {result['polls_per_s_last_quarter']:,}",
        "",
    )
    table.add_row(
        "CPU ms per s", f"{result['cpu_ms_per_s_with_jobs']}", f"{result['cpu_ms_per_s_idle']}"
    )
    table.add_row(
        "CPU ms per s first / last quarter",
        f"{result['cpu_ms_per_s_with_jobs_first_quarter']} / "
        f"{result['cpu_ms_per_s_with_jobs_last_quarter']}",
        "",
    )
    table.add_row("ratio to idle", f"{result['ratio_jobs_vs_idle']}", "1")
    table.add_row(
        "CPU µs per poll (all / over idle)",
        f"{result['cpu_us_per_poll']} / {result['cpu_us_per_poll_over_idle']}",
        "",
    )
    table.add_row(
        "CPU µs per poll over idle, last quarter",
        f"{result['cpu_us_per_poll_over_idle_last_quarter']}",
        "",
    )
    console.print(table)
    jobs = result["meta"]["phases"]["jobs"]
    console.print(f"polls per second of the window: {jobs['polls_per_second_of_window']}")
    console.print(f"CPU ms per second of the window: {jobs['cpu_ms_per_second_of_window']}")
    profile = result["meta"]["profile"]
    if profile is not None:
        for title, lines in (("own time", "top_tottime"), ("cumulative", "top_cumulative")):
            console.print(f"profile, by {title}:", highlight=False)
            console.out("\n".join(profile[lines]), highlight=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--window",
        type=float,
        default=DEFAULT_WINDOW_S,
        help=f"seconds measured with the jobs, and idle (default {DEFAULT_WINDOW_S:g})",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="then profile one more window of the jobs (cProfile, CPU clock)",
    )


def execute(jobs: int, args: argparse.Namespace, out: str | None) -> dict[str, Any]:
    if jobs < 1 or args.window <= 0:
        raise SystemExit("--jobs and --window must be positive")
    console = Console()
    result = asyncio.run(run(jobs, args.window, profile=args.profile))
    print_table(result, console)
    write_result(result, out or OUT, console)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS)
    add_arguments(parser)
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args(argv)
    execute(args.jobs, args, args.out)


if __name__ == "__main__":
    main()
