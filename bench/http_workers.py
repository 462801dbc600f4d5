"""Throughput of the HTTP API on Kafka + PostgreSQL as ``toolledger serve --workers N`` grows.

Run (with the services up)::

    bash services/up.sh && . services/env.sh
    .venv/bin/python -m bench.http_workers [--workers 1,2] [--requests N] [--concurrency C]

For each N: fresh topics and a fresh database; one ``toolledger executor`` and one
``toolledger projector`` process (the no-op tool of ``bench/http.py``), then ``toolledger
serve --workers N`` on the same topics, all started as an operator starts them. The load is
``bench/http.py``'s: C keep-alive connections in a closed loop, first executions of distinct
keys, then the same requests again (replays), each after an untimed warm-up, every answer
checked the same way (200, ``SUCCEEDED``, a replay byte-identical to the first answer). After
the front doors stop, the projection is read back: one ``tool_calls`` row and exactly one
``ToolCallSucceeded`` per key (the handler ran once per key, whichever front door took it).

The front doors hold no call state, so more of them can only help while they are what is
busy: ``meta.runs[*].phases`` gives the CPU per wall second (1.0 = one core busy the whole
time) of the front doors (all workers and their supervisor), the executor, the projector, the
broker, PostgreSQL, this load generator and everything else on the machine, so that a flat
curve can be read as what it is.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console
from rich.progress import Progress

from bench.common import TOOL, cpu_seconds, machine_busy_seconds, new_progress, write_result
from bench.http import (
    Checks,
    Phase,
    Server,
    Verify,
    check_first,
    check_replay,
    connections,
    drive,
    free_port,
    git_state,
    log_tail,
    open_log,
    plan,
    running,
    scratch_dir,
    write_tokens,
)
from bench.kafka import delete_topics, fresh_database
from toolledger.schemas.events import ToolCallSucceeded

PARTITIONS = 4
TOOLS = "bench.http:noop_registry"


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and every process below it (Linux ``/proc``)."""
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        total += cpu_seconds(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                stack += [int(child) for child in task.read_text().split()]
    return total


@contextlib.asynccontextmanager
async def helper(name: str, argv: Sequence[str], work: Path) -> AsyncIterator[int]:
    """A ``toolledger`` process that touches its ``--ready-file`` once it serves; its pid.
    SIGINT and wait at the end (the executor and projector leave their groups)."""
    ready = work / f"{name}.ready"
    log = work / f"{name}.log"
    handle = open_log(log)
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "toolledger.cli",
            *argv,
            "--ready-file",
            str(ready),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=handle,
            stderr=asyncio.subprocess.STDOUT,
        )
    finally:
        handle.close()
    try:
        deadline = time.monotonic() + 120.0
        while not ready.exists():
            if process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{name} did not get ready (exit {process.returncode}):\n{log_tail(log)}"
                )
            await asyncio.sleep(0.1)
        yield process.pid
    finally:
        if process.returncode is None:
            process.send_signal(2)
            try:
                await asyncio.wait_for(process.wait(), 60.0)
            except TimeoutError:
                process.kill()
                await process.wait()


def service_cpu_seconds() -> dict[str, float]:
    """CPU seconds of the broker (the JVM running ``kafka.Kafka``) and of PostgreSQL (every
    ``postgres`` process), found by their command lines in ``/proc``."""
    totals = {"broker": 0.0, "postgres": 0.0}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"kafka.Kafka" in argv:
            totals["broker"] += cpu_seconds(int(entry.name))
        elif argv[0].endswith(b"postgres") or argv[0].startswith(b"postgres:"):
            totals["postgres"] += cpu_seconds(int(entry.name))
    return totals


def cpu_by_group(server: Server, executor: int, projector: int) -> dict[str, float]:
    """CPU seconds so far of each group of processes of a run, and of the whole machine."""
    return {
        "front_doors": tree_cpu_seconds(server.pid),  # the supervisor and its workers
        "executor": cpu_seconds(executor),
        "projector": cpu_seconds(projector),
        **service_cpu_seconds(),
        "load_generator": time.process_time(),
        "machine": machine_busy_seconds(),
    }


def cpu_per_wall_s(
    before: dict[str, float], after: dict[str, float], phase: Phase
) -> dict[str, float]:
    spent = {name: after[name] - before[name] for name in before}
    machine = spent.pop("machine")
    shares = {f"{name}_cpu_per_wall_s": round(s / phase.seconds, 3) for name, s in spent.items()}
    return {
        **shares,
        "other_processes_cpu_per_wall_s": round(
            max(0.0, machine - sum(spent.values())) / phase.seconds, 3
        ),
        "front_doors_cpu_ms_per_request": round(spent["front_doors"] * 1000 / phase.requests, 3),
    }


async def measured(
    server: Server, pids: tuple[int, int], phase: Any
) -> tuple[Phase, dict[str, Any]]:
    before = cpu_by_group(server, *pids)
    result: Phase = await phase
    cpu = cpu_per_wall_s(before, cpu_by_group(server, *pids), result)
    summary = {
        key: value
        for key, value in result.summary().items()
        if not key.startswith(("server_", "client_", "other_"))
    }
    return result, {**summary, **cpu}


async def projection_counts(dsn: str, keys: int, timeout_s: float = 120.0) -> dict[str, int]:
    """``tool_calls`` rows and ``ToolCallSucceeded`` events per key, once the projector has
    caught up with ``keys`` calls (or the timeout passed)."""
    deadline = time.monotonic() + timeout_s
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while True:
            rows = await (
                await conn.execute("SELECT count(*) FROM tool_calls WHERE tool_name = %s", (TOOL,))
            ).fetchone()
            calls = int(rows[0]) if rows else 0
            if calls >= keys or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        succeeded = await (
            await conn.execute(
                "SELECT count(*), count(DISTINCT call_key) FROM tool_call_events "
                "WHERE event_type = %s",
                (ToolCallSucceeded.TYPE,),
            )
        ).fetchone()
    total, distinct = (int(succeeded[0]), int(succeeded[1])) if succeeded else (0, 0)
    return {
        "tool_calls_rows": calls,
        "succeeded_events": total,
        "succeeded_distinct_keys": distinct,
    }


async def run_workers(
    args: argparse.Namespace, workers: int, work: Path, progress: Progress
) -> dict[str, Any]:
    tokens = work / "tokens.json"
    write_tokens(tokens)
    prefix = f"benchw{uuid.uuid4().hex[:8]}."
    common = ["--kafka", args.kafka, "--prefix", prefix, "--partitions", str(PARTITIONS)]
    warm, plans = plan(args.warmup, f"warm{workers}"), plan(args.requests, f"key{workers}")
    bodies, warm_bodies = [b""] * len(plans), [b""] * len(warm)
    first_checks, replay_checks, warm_checks = Checks(), Checks(), Checks()
    label = f"{workers} worker{'s' if workers > 1 else ''}"
    task = {
        name: progress.add_task(f"{label}: {name}", total=total, rate="")
        for name, total in (
            ("first warm-up", len(warm)),
            ("first", len(plans)),
            ("replays warm-up", len(warm)),
            ("replays", len(plans)),
        )
    }
    port = free_port()
    serve = [
        sys.executable,
        "-m",
        "toolledger.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--data",
        str(work / "server"),
        "--tokens",
        str(tokens),
        "--tools",
        TOOLS,
        *common,
    ]
    try:
        async with (
            fresh_database(args.postgres) as dsn,
            helper("executor", ["executor", *common, "--tools", TOOLS], work) as executor,
            helper("projector", ["projector", *common, "--postgres", dsn], work) as projector,
            running(
                "toolledger serve", [*serve, "--postgres", dsn], port, work / "server.log"
            ) as server,
            connections(args.client, server, args.concurrency) as clients,
        ):

            async def phase(
                name: str, check: Callable[[Checks, list[bytes]], Verify], checks: Checks
            ) -> tuple[Phase, dict[str, Any]]:
                """The warm-up keys, untimed, then the measured keys, both checked."""
                warm_check = check(warm_checks, warm_bodies)
                await drive(clients, server, warm, warm_check, progress, task[f"{name} warm-up"])
                timed = drive(clients, server, plans, check(checks, bodies), progress, task[name])
                return await measured(server, (executor, projector), timed)

            first, first_summary = await phase("first", check_first, first_checks)
            replays, replay_summary = await phase("replays", check_replay, replay_checks)
            counts = await projection_counts(dsn, len(plans) + len(warm))
    finally:
        with contextlib.suppress(Exception):
            await delete_topics(args.kafka, prefix)
    keys = len(plans) + len(warm)
    exact = {"tool_calls_rows": keys, "succeeded_events": keys, "succeeded_distinct_keys": keys}
    if counts != exact:
        first_checks.fail("projection", f"expected {exact}, found {counts}")
    for what, count in warm_checks.failures.items():
        first_checks.failures[f"warm-up {what}"] += count
    return {
        "workers": workers,
        "calls_per_s": round(first.per_s, 1),
        "replays_per_s": round(replays.per_s, 1),
        "p50_ms": round(first.quantile_ms(0.50), 2),
        "p99_ms": round(first.quantile_ms(0.99), 2),
        "phases": {"first": first_summary, "replays": replay_summary},
        "checks": {
            "first": first_checks.summary(),
            "replays": replay_checks.summary(),
            "projection": counts,
        },
    }


async def measure(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    base = Path(args.tmp_dir) if args.tmp_dir else None
    runs = []
    with new_progress(console, 24) as progress:
        for workers in args.workers:
            with scratch_dir(base) as work:
                runs.append(await run_workers(args, workers, work, progress))
    one = runs[0]["calls_per_s"]
    return {
        "calls_per_s_by_workers": {str(r["workers"]): r["calls_per_s"] for r in runs},
        "replays_per_s_by_workers": {str(r["workers"]): r["replays_per_s"] for r in runs},
        "ratio_vs_first_by_workers": {
            str(r["workers"]): round(r["calls_per_s"] / one, 3) for r in runs
        },
        "meta": {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "warmup_requests": args.warmup,
            "partitions": PARTITIONS,
            "client": args.client,
            "cores": os.cpu_count() or 0,
            "processes": "one executor, one projector, serve --workers N (a supervisor and N "
            "front doors on one port), the broker, PostgreSQL and the load "
            "generator, all on this machine",
            "runs": runs,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "git": git_state(),
        },
    }


def passed(result: dict[str, Any]) -> bool:
    return all(
        run["checks"][name]["passed"]
        for run in result["meta"]["runs"]
        for name in ("first", "replays")
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.http_workers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--workers",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 2],
        help="front-door processes per run, comma-separated",
    )
    parser.add_argument("--requests", type=int, default=4096, help="requests per phase")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    parser.add_argument("--warmup", type=int, default=256, help="untimed requests per phase")
    parser.add_argument("--client", choices=["raw", "httpx"], default="raw")
    parser.add_argument("--kafka", default=os.environ.get("TOOLLEDGER_KAFKA"))
    parser.add_argument("--postgres", default=os.environ.get("TOOLLEDGER_POSTGRES"))
    parser.add_argument("--tmp-dir", default=None, help="where the scratch directories go")
    parser.add_argument("--out", default="bench/results/http_workers.json")
    args = parser.parse_args(argv)
    if not args.kafka or not args.postgres:
        parser.error(
            "needs --kafka and --postgres (or TOOLLEDGER_KAFKA and TOOLLEDGER_POSTGRES:"
            " bash services/up.sh && . services/env.sh)"
        )
    # one key for every process of the run (executors of a deployment must share it)
    os.environ.setdefault("TOOLLEDGER_REDACTION_SECRET", secrets.token_hex(32))
    console = Console()
    result = asyncio.run(measure(args, console))
    write_result(result, args.out)
    for run in result["meta"]["runs"]:
        first = run["phases"]["first"]
        console.print(
            f"--workers {run['workers']}: {run['calls_per_s']:,.0f} calls/s "
            f"(p50 {run['p50_ms']} ms, p99 {run['p99_ms']} ms), "
            f"{run['replays_per_s']:,.0f} replays/s; front doors "
            f"{first['front_doors_cpu_per_wall_s']} CPU/s, executor "
            f"{first['executor_cpu_per_wall_s']}, projector "
            f"{first['projector_cpu_per_wall_s']}, broker {first['broker_cpu_per_wall_s']}, "
            f"PostgreSQL {first['postgres_cpu_per_wall_s']}, load "
            f"{first['load_generator_cpu_per_wall_s']}, others "
            f"{first['other_processes_cpu_per_wall_s']}"
        )
    console.print(
        f"ratio to one worker: {result['ratio_vs_first_by_workers']}; written to {args.out}"
    )
    if not passed(result):
        console.print("[red]checks failed: see meta.runs[*].checks[/red]")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
