"""What every benchmark shares: the no-op tool, the progress display, the result writer, the
CPU time of processes, and the workload of issue 11 (tenants, tools, keys, arguments,
duplicates, closed-loop callers)."""

from __future__ import annotations

import asyncio
import collections
import json
import math
import os
import random
import string
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from toolledger.processors.ledger import NotHappened, ReconcileOutcome
from toolledger.processors.tools.manifest import (
    EffectClass,
    RiskTier,
    Tool,
    ToolContext,
    ToolDescription,
)
from toolledger.processors.tools.registry import ToolRegistry


def new_progress(console: Console, width: int = 26) -> Progress:
    """Bar, count, elapsed time and a live ``rate`` field per task."""
    return Progress(
        TextColumn(f"[bold]{{task.description:<{width}}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[rate]}"),
        console=console,
    )


def write_result(result: dict[str, Any], out: Path | str, console: Console | None = None) -> Path:
    """The result as indented JSON (NaN and infinities refused) under ``bench/results/``."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    if console is not None:
        console.print(f"wrote {path}")
    return path


# Whether another process's CPU time can be read (Linux ``/proc``); where it cannot, a
# benchmark reports that process's CPU as not measured (``None``) rather than as 0.
PROCESS_CPU_READABLE = Path("/proc/self/stat").exists()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux ``/proc``), 0.0 where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds all cores of the machine spent busy since boot (``/proc/stat``), or 0.0."""
    try:
        jiffies = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = jiffies[3] + (jiffies[4] if len(jiffies) > 4 else 0)  # idle + iowait
    return (sum(jiffies[:8]) - idle) / os.sysconf("SC_CLK_TCK")


TOOL = "bench_noop"


class NoteArgs(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    text: str


class NoteAck(BaseModel):
    ok: bool


@dataclass
class Counter:
    invocations: int = 0
    marks: dict[str, float] = field(default_factory=dict)  # idempotency key -> handler start


def make_registry(counter: Counter, *, mark: bool = False) -> ToolRegistry:
    """The no-op mutation tool every benchmark measures; it counts its invocations."""

    async def handler(arguments: NoteArgs, ctx: ToolContext) -> NoteAck:
        counter.invocations += 1
        if mark:
            counter.marks[ctx.idempotency_key] = time.perf_counter()
        return NoteAck(ok=True)

    async def reconcile(ctx: ToolContext) -> ReconcileOutcome:
        return NotHappened()

    registry = ToolRegistry()
    registry.register(
        Tool(
            name=TOOL,
            version="1",
            arguments=NoteArgs,
            result=NoteAck,
            handler=handler,
            description=ToolDescription(
                summary="Does nothing (benchmark).",
                when_to_use="Benchmarks only.",
                when_not_to_use="Anything real.",
                preconditions="None.",
                replay_behaviour="A repeated key returns the first result without running again.",
            ),
            effect=EffectClass.MUTATION,
            risk=RiskTier.LOW,
            reconcile=reconcile,
        )
    )
    return registry


# -- the issue-11 workload (bench/embedded.py's matrix, bench/peers.py) ----------------------
#
# 8 tenants, 5 no-op mutation tools that count their executions per call key, 128-bit
# idempotency keys (32 hex digits), 200-byte JSON arguments, and a share D of calls that retry
# an earlier call's key with the same arguments.

TENANTS = tuple(f"tenant-{i}" for i in range(8))
TOOLS = tuple(f"bench_noop_{i}" for i in range(5))
ARGUMENT_BYTES = 200


class WorkArgs(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    ref: str
    body: str
    n: int


@dataclass(frozen=True, slots=True)
class WorkCall:
    """One call of the workload; ``duplicate``: it retries an earlier call (same key, same
    arguments), so it must be answered without a second execution."""

    tenant: str
    tool: str
    key: str
    args: dict[str, Any]
    duplicate: bool

    @property
    def call_key(self) -> tuple[str, str, str]:
        return (self.tenant, self.tool, self.key)


def work_args(rng: random.Random, i: int, size: int = ARGUMENT_BYTES) -> dict[str, Any]:
    """Arguments whose compact JSON (``json.dumps(..., separators=(",", ":"))``) is ``size``
    bytes."""
    bare = {"ref": f"ref-{i:08d}", "body": "", "n": i}
    pad = size - len(json.dumps(bare, separators=(",", ":")))
    if pad < 0:
        raise ValueError(f"{size} bytes are too few for the arguments of call {i}")
    return dict(bare, body="".join(rng.choices(string.ascii_letters + string.digits, k=pad)))


def plan_workload(calls: int, duplicates: float, *, gap: int, seed: int = 11) -> list[WorkCall]:
    """``calls`` calls of which a share ``duplicates`` (0 <= D <= 0.5) retry an earlier call.

    Each original is retried at most once, evenly spread, and not before ``gap`` more calls
    were issued after it (except in the last ``gap`` or so calls, where the remaining retries
    are flushed); with ``gap`` well above the number of concurrent callers the original has
    almost always finished, so a retry measures a replay rather than a wait for a running
    call. Tenants and tools are drawn at random, keys are 128 random bits.
    """
    if not 0.0 <= duplicates <= 0.5:
        raise ValueError("the duplicate share must be between 0 and 0.5")
    rng = random.Random(seed)
    retries = round(calls * duplicates)
    fresh = calls - retries
    originals = [
        WorkCall(
            rng.choice(TENANTS),
            rng.choice(TOOLS),
            f"{rng.getrandbits(128):032x}",
            work_args(rng, i),
            False,
        )
        for i in range(fresh)
    ]
    plan: list[WorkCall] = []
    emitted_at: list[int] = []  # plan position of originals[j]
    next_fresh = next_retry = 0
    for position in range(calls):
        # interleave evenly: after `position` calls, about position * D of them are retries
        want_retry = next_retry < retries and next_retry < (position + 1) * duplicates
        ready = next_retry < len(emitted_at) and position - emitted_at[next_retry] > gap
        if (want_retry and ready) or next_fresh >= fresh:
            original = originals[next_retry]
            plan.append(WorkCall(original.tenant, original.tool, original.key, original.args, True))
            next_retry += 1
        else:
            plan.append(originals[next_fresh])
            emitted_at.append(position)
            next_fresh += 1
    return plan


class Executions:
    """Counts the no-op tools' executions per call key (thread-safe: Powertools' callers are
    threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()

    def record(self, tenant: str, tool: str, key: str) -> None:
        with self._lock:
            self.counts[(tenant, tool, key)] += 1

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()

    def check(self, plan: Sequence[WorkCall]) -> dict[str, Any]:
        """Each unique call key of ``plan`` executed exactly once, and nothing else ran."""
        with self._lock:
            counts = dict(self.counts)
        expected = {c.call_key for c in plan}
        never = len(expected - counts.keys())
        twice = sum(1 for k in expected if counts.get(k, 0) > 1)
        stray = len(counts.keys() - expected)
        return {
            "passed": never == 0 and twice == 0 and stray == 0,
            "unique_keys": len(expected),
            "executions": sum(counts.values()),
            "keys_never_executed": never,
            "keys_executed_more_than_once": twice,
            "stray_keys": stray,
        }


def make_workload_registry(executions: Executions) -> ToolRegistry:
    """The workload's five no-op mutation tools (low risk, so no approval); each counts."""

    async def handler(arguments: WorkArgs, ctx: ToolContext) -> NoteAck:
        executions.record(ctx.tenant_id, ctx.tool, ctx.idempotency_key)
        return NoteAck(ok=True)

    async def reconcile(ctx: ToolContext) -> ReconcileOutcome:
        return NotHappened()

    registry = ToolRegistry()
    for name in TOOLS:
        registry.register(
            Tool(
                name=name,
                version="1",
                arguments=WorkArgs,
                result=NoteAck,
                handler=handler,
                description=ToolDescription(
                    summary="Does nothing (benchmark).",
                    when_to_use="Benchmarks only.",
                    when_not_to_use="Anything real.",
                    preconditions="None.",
                    replay_behaviour="A repeated key returns the first result without running.",
                ),
                effect=EffectClass.MUTATION,
                risk=RiskTier.LOW,
                reconcile=reconcile,
            )
        )
    return registry


def workload_meta(calls: int, callers: int, duplicates: Sequence[float]) -> dict[str, Any]:
    return {
        "calls": calls,
        "callers": callers,
        "duplicate_shares": list(duplicates),
        "tenants": len(TENANTS),
        "tools": len(TOOLS),
        "key_bits": 128,
        "argument_bytes": ARGUMENT_BYTES,
        "tool": "a no-op that counts its executions per call key",
    }


@dataclass
class Timing:
    seconds: float
    latencies_s: list[float]

    @property
    def calls_per_s(self) -> float:
        return len(self.latencies_s) / self.seconds

    def percentile_ms(self, q: float) -> float:
        """Nearest-rank percentile ``q`` (0..100) of the latencies, in milliseconds."""
        ordered = sorted(self.latencies_s)
        rank = max(1, math.ceil(q / 100 * len(ordered)))
        return ordered[rank - 1] * 1000

    def summary(self) -> dict[str, float]:
        return {
            "calls_per_s": round(self.calls_per_s, 1),
            "p50_ms": round(self.percentile_ms(50), 2),
            "p99_ms": round(self.percentile_ms(99), 2),
            "seconds": round(self.seconds, 3),
        }


async def drive_async(
    plan: Sequence[WorkCall], callers: int, call: Callable[[WorkCall], Awaitable[None]]
) -> Timing:
    """``callers`` coroutines on this event loop, each issuing the next call of ``plan`` when
    its previous one was answered (a closed loop); every call's latency is kept."""
    latencies = [0.0] * len(plan)
    indexes = iter(range(len(plan)))  # shared: each index is taken by exactly one caller

    async def caller() -> None:
        for i in indexes:
            started = time.perf_counter()
            await call(plan[i])
            latencies[i] = time.perf_counter() - started

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return Timing(time.perf_counter() - started, latencies)


async def drive_at_rate(
    plan: Sequence[WorkCall], rate: float, call: Callable[[WorkCall], Awaitable[None]]
) -> Timing:
    """An open loop: call ``i`` of ``plan`` starts at ``i / rate`` seconds whether or not the
    earlier ones were answered, and its latency counts from that scheduled start (a late
    start counts against it, as a caller arriving at that rate would see it)."""
    latencies = [0.0] * len(plan)

    async def one(i: int, due: float) -> None:
        await call(plan[i])
        latencies[i] = time.perf_counter() - due

    tasks: list[asyncio.Task[None]] = []
    started = time.perf_counter()
    for i in range(len(plan)):
        due = started + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)
    return Timing(time.perf_counter() - started, latencies)


def drive_threads(
    plan: Sequence[WorkCall], callers: int, call: Callable[[WorkCall], None]
) -> Timing:
    """``callers`` threads in a closed loop over ``plan`` (as :func:`drive_async`), for
    synchronous clients; the first exception of any thread is raised after all stopped."""
    latencies = [0.0] * len(plan)
    lock = threading.Lock()
    indexes = iter(range(len(plan)))
    errors: list[BaseException] = []
    gate = threading.Barrier(callers + 1)

    def caller() -> None:
        gate.wait()
        while not errors:
            with lock:
                i = next(indexes, None)
            if i is None:
                return
            started = time.perf_counter()
            try:
                call(plan[i])
            except BaseException as exc:
                errors.append(exc)
                return
            latencies[i] = time.perf_counter() - started

    threads = [threading.Thread(target=caller, name=f"caller-{n}") for n in range(callers)]
    for thread in threads:
        thread.start()
    gate.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    if errors:
        raise errors[0]
    return Timing(seconds, latencies)
