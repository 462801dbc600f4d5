"""toolledger against a peer: AWS Powertools idempotency over Redis, same workload, same run.

Run::

    .venv/bin/python -m bench.peers [--calls N] [--out bench/results/peers.json]
    .venv/bin/python -m bench.peers --callers 16 64      # also the 64-caller runs

The workload of issue 11 (``bench/common.py``): ``--calls`` calls (20,000) with 200-byte JSON
arguments, 8 tenants, 5 no-op tools that count their executions per call key, 128-bit keys,
16 concurrent callers (``--callers``: one run of each system per number given, e.g. ``16 64``)
in a closed loop (each issues its next call when the previous one was answered), at a
duplicate share D of 0 and of 0.5 (a retry of an earlier call's key with the same arguments,
at least 4 x callers calls after it). Each system gets the same calls.

Each run gives calls/s, p50 and p99 latency and **CPU ms per call**: for toolledger,
``time.process_time()`` of this process (every thread: the event loop and the ledger's writer)
over the measured loop / calls; for Powertools, the same of this process (its caller threads
and redis-py) plus, reported separately and summed, ``redis-server``'s CPU over the same loop,
read from ``/proc/<pid>/stat`` (``null`` where ``/proc`` cannot be read).

- **toolledger**: ``toolledger.Ledger.embedded(path, registry)`` with its defaults
  (``synchronous=FULL``: every answer is fsynced), the callers are coroutines on one event
  loop in this process.
- **Powertools**: ``aws_lambda_powertools.utilities.idempotency.idempotent_function`` with
  ``RedisCachePersistenceLayer`` (one decorated function per tool, keyed by tenant and key),
  over a real ``redis-server`` on 127.0.0.1 that this script starts and stops. Without
  payload validation: Powertools 3.37's Redis layer drops the validation hash when a call
  completes, so with it every replay fails; Powertools thus does not check that a retry has
  the same arguments, which toolledger does (its args digest) on every call. Powertools is
  synchronous, so its callers are 16 threads in this process: the same number of concurrent
  callers, in one Python process as toolledger's (one GIL for both); a thread per caller is
  how a synchronous client gets that concurrency, and redis-py's pool gives each thread its
  own connection. Redis itself runs in its own process (it gets
  the second core; toolledger has no such helper).

``redis-server`` comes from Debian's packages: if there is none, ``apt-get install -y
redis-server`` is run (root). It is started twice, with no configuration file:
``powertools_redis`` with no persistence at all (``--save '' --appendonly no``: what a cache
does, and the shape of the earlier measurement), and ``powertools_redis_aof_always``
(``--appendonly yes --appendfsync always``: every write fsynced before the answer, the
durability toolledger's ``synchronous=FULL`` gives). Both servers are stopped at the end, also
after an error.

Checked in every run (a failed check makes the exit status 1): each unique call key executed
exactly once, nothing else executed, and every call was answered (toolledger: ``ok``, and
``replayed`` exactly on the retries).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any, cast

import redis
from rich.console import Console
from rich.table import Table

from bench.common import (
    PROCESS_CPU_READABLE,
    TENANTS,
    TOOLS,
    Executions,
    Timing,
    WorkCall,
    cpu_seconds,
    drive_async,
    drive_threads,
    make_workload_registry,
    plan_workload,
    workload_meta,
    write_result,
)
from toolledger import Ledger, TrustedContext

try:  # Powertools' idempotency package imports its DynamoDB layer (boto3) whatever the store
    from aws_lambda_powertools.utilities.idempotency import (
        IdempotencyConfig,
        idempotent_function,
    )
    from aws_lambda_powertools.utilities.idempotency.exceptions import (
        IdempotencyAlreadyInProgressError,
    )
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
        RedisClientProtocol,
    )
except ModuleNotFoundError as exc:  # depends on the install
    raise SystemExit(
        f"bench.peers needs aws-lambda-powertools, redis and boto3 (Powertools' idempotency "
        f"package imports boto3 even for Redis): pip install 'aws-lambda-powertools>=3.37' "
        f"redis boto3 ({exc})"
    ) from exc

# outside Lambda there is no remaining time to take an in-progress expiry from; said per call
warnings.filterwarnings("ignore", message="Couldn't determine the remaining time left")

REDIS_SERVER = "/usr/bin/redis-server"
DUPLICATES = (0.0, 0.5)
CONTEXTS = {t: TrustedContext(tenant_id=t, principal="bench-agent") for t in TENANTS}
IN_PROGRESS_WAIT_S = 10.0  # a retry that finds its original still running waits this long
EARLIER = {
    "source": "issue 11: an earlier measurement, not this run",
    "powertools_3_37_redis_7": {
        "calls_per_s_d0": 3180,
        "calls_per_s_d50": 2688,
        "p50_ms": 4.6,
        "p99_ms": 12.7,
    },
    "toolledger_embedded_full": {"calls_per_s_d0": 1384, "calls_per_s_d50": 1350},
}


# -- redis-server -----------------------------------------------------------------------------


REDIS_DURABILITY: dict[str, list[str]] = {
    "none": ["--save", "", "--appendonly", "no"],
    "aof_always": ["--save", "", "--appendonly", "yes", "--appendfsync", "always"],
}


def ensure_redis_server(console: Console) -> str:
    """The path of ``redis-server``; installs Debian's package first if there is none."""
    if Path(REDIS_SERVER).exists():
        return REDIS_SERVER
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "redis-server"]
    console.print(f"{REDIS_SERVER} is missing; running: {' '.join(install)}")
    if subprocess.run(install, env=env, check=False).returncode != 0:
        console.print("apt-get install failed; running: apt-get update, then the install again")
        subprocess.run(["apt-get", "update"], env=env, check=True)
        subprocess.run(install, env=env, check=True)
    if not Path(REDIS_SERVER).exists():
        raise SystemExit(f"{REDIS_SERVER} is still missing after apt-get install redis-server")
    console.print(
        "installed redis-server (if the package's service was started by apt, it is the "
        "system's, on port 6379; this benchmark starts and stops its own servers)"
    )
    return REDIS_SERVER


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class RedisServer:
    port: int
    version: str
    argv: list[str]
    pid: int


@contextmanager
def redis_server(binary: str, directory: Path, durability: str) -> Iterator[RedisServer]:
    """A ``redis-server`` on 127.0.0.1 (no configuration file), stopped when the block ends."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [
        binary,
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--protected-mode", "yes",
        "--daemonize", "no",
        "--dir", str(directory),
        "--logfile", str(directory / "redis.log"),
        *REDIS_DURABILITY[durability],
    ]  # fmt: skip
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        client = redis.Redis(host="127.0.0.1", port=port, decode_responses=True)
        deadline = time.monotonic() + 15
        while True:
            if process.poll() is not None:
                log = (directory / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {process.returncode}: {log}")
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        info = client.info("server")
        client.close()
        yield RedisServer(port, str(info["redis_version"]), argv[1:], process.pid)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- the runs ---------------------------------------------------------------------------------


@dataclass
class Answers:
    """Calls answered otherwise than expected, and retries that found their original running."""

    wrong: int = 0
    in_progress_retries: int = 0
    examples: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, example: str) -> None:
        with self.lock:
            self.wrong += 1
            if len(self.examples) < 3:
                self.examples.append(example)

    def waited(self) -> None:
        with self.lock:
            self.in_progress_retries += 1


@dataclass
class Run:
    timing: Timing
    cpu_s: float | None  # every process of the system, over the measured loop (None: unknown)
    checks: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.checks["passed"])

    @property
    def cpu_ms_per_call(self) -> float | None:
        return None if self.cpu_s is None else self.cpu_s * 1000 / len(self.timing.latencies_s)

    def summary(self) -> dict[str, Any]:
        cpu = self.cpu_ms_per_call
        return {
            **self.timing.summary(),
            "cpu_ms_per_call": None if cpu is None else round(cpu, 4),
            **self.extra,
            "checks": self.checks,
        }


def per_call_ms(cpu_s: float | None, calls: int) -> float | None:
    return None if cpu_s is None else round(cpu_s * 1000 / calls, 4)


def checked(
    timing: Timing,
    cpu_s: float | None,
    executions: Executions,
    plan: Sequence[WorkCall],
    answers: Answers,
    **extra: Any,
) -> Run:
    checks = executions.check(plan)
    checks.update(wrong_answers=answers.wrong, examples=answers.examples)
    checks["passed"] = bool(checks["passed"]) and answers.wrong == 0
    return Run(timing, cpu_s, checks, {**extra, "in_progress_retries": answers.in_progress_retries})


def warm_plan(calls: int) -> list[WorkCall]:
    return plan_workload(calls, 0.0, gap=1, seed=999)


async def run_toolledger(
    plan: Sequence[WorkCall], *, callers: int, warmup: int, directory: Path
) -> Run:
    """The public API with its defaults (synchronous=FULL); coroutine callers."""
    executions = Executions()
    answers = Answers()

    async def call(c: WorkCall) -> None:
        result = await ledger.call(
            c.tool, c.args, idempotency_key=c.key, context=CONTEXTS[c.tenant]
        )
        if not result.ok or result.replayed != c.duplicate:
            answers.add(f"{c.key}: duplicate={c.duplicate}: {result.to_json()}")

    ledger = Ledger.embedded(directory / "ledger.db", make_workload_registry(executions))
    async with ledger:
        await drive_async(warm_plan(warmup), callers, call)
        executions.reset()
        answers = Answers()
        cpu = time.process_time()
        timing = await drive_async(plan, callers, call)
        cpu = time.process_time() - cpu
    return checked(timing, cpu, executions, plan, answers)


def run_powertools(
    plan: Sequence[WorkCall], *, callers: int, warmup: int, server: RedisServer
) -> Run:
    """``idempotent_function`` over ``RedisCachePersistenceLayer``; thread callers."""
    client = redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True)
    client.flushall()
    executions = Executions()
    answers = Answers()
    # the idempotency key: key_prefix (the tool) + md5 of [tenant, key]. No payload
    # validation: in Powertools 3.37 the Redis layer's _update_record rewrites the record
    # without the validation hash, so every replay of a completed call fails validation
    # (IdempotencyValidationError; the TypeScript twin is powertools-lambda-typescript#5705).
    # So Powertools does not detect a reused key with other arguments here; toolledger does.
    config = IdempotencyConfig(event_key_jmespath="[tenant, key]", raise_on_no_idempotency_key=True)
    functions: dict[str, Any] = {}
    for tool in TOOLS:
        # one persistence layer per function: IdempotencyHandler re-configures the layer's
        # key prefix on every call, so functions sharing one layer race across threads
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the v4 rename
            # redis-py 8's annotations are wider than Powertools' protocol; the calls match
            layer = RedisCachePersistenceLayer(client=cast(RedisClientProtocol, client))
        functions[tool] = idempotent_function(
            make_tool(tool, executions),
            data_keyword_argument="call",
            persistence_store=layer,
            config=config,
            key_prefix=f"bench.{tool}",
        )

    def call(c: WorkCall) -> None:
        data = {"tenant": c.tenant, "key": c.key, "args": c.args}
        deadline = time.perf_counter() + IN_PROGRESS_WAIT_S
        while True:
            try:
                result = functions[c.tool](call=data)
                break
            except IdempotencyAlreadyInProgressError:
                # the original still runs: a client retries (toolledger waits for it itself)
                answers.waited()
                if time.perf_counter() > deadline:
                    raise
                time.sleep(0.001)
        if result != {"ok": True}:
            answers.add(f"{c.key}: duplicate={c.duplicate}: {result!r}")

    try:
        drive_threads(warm_plan(warmup), callers, call)
        executions.reset()
        answers = Answers()
        cpu, redis_before = time.process_time(), cpu_seconds(server.pid)
        timing = drive_threads(plan, callers, call)
        cpu = time.process_time() - cpu
        redis_cpu = cpu_seconds(server.pid) - redis_before if PROCESS_CPU_READABLE else None
        keys = int(client.dbsize())
    finally:
        client.close()
    return checked(
        timing,
        None if redis_cpu is None else cpu + redis_cpu,
        executions,
        plan,
        answers,
        process_cpu_ms_per_call=per_call_ms(cpu, len(plan)),
        redis_server_cpu_ms_per_call=per_call_ms(redis_cpu, len(plan)),
        redis_keys_after=keys,
    )


def make_tool(tool: str, executions: Executions) -> Any:
    def run(call: dict[str, Any]) -> dict[str, Any]:
        executions.record(call["tenant"], tool, call["key"])  # the no-op tool
        return {"ok": True}

    run.__name__ = run.__qualname__ = tool
    return run


# -- driver -----------------------------------------------------------------------------------


POWERTOOLS = {"none": "powertools_redis", "aof_always": "powertools_redis_aof_always"}


def run_row(
    args: argparse.Namespace,
    callers: int,
    share: float,
    servers: dict[str, RedisServer],
    scratch: Path,
    console: Console,
) -> dict[str, Any]:
    """toolledger, then each Powertools configuration, on the same calls. Progress is a line
    per run: no display thread runs while CPU is measured."""
    plan = plan_workload(args.calls, share, gap=4 * callers)
    row: dict[str, Any] = {"callers": callers, "duplicates": share}
    label = f"{callers} callers, D={share:g}"
    directory = scratch / f"toolledger-{callers}-{share}"
    directory.mkdir()
    ledger = asyncio.run(
        run_toolledger(plan, callers=callers, warmup=args.warmup, directory=directory)
    )
    shutil.rmtree(directory, ignore_errors=True)
    row["toolledger"] = ledger.summary()
    console.print(f"{label}: toolledger {described(row['toolledger'])}")
    for durability, server in servers.items():
        name = POWERTOOLS[durability]
        peer = run_powertools(plan, callers=callers, warmup=args.warmup, server=server)
        row[name] = peer.summary()
        row[f"ratio_vs_{name}"] = round(ledger.timing.calls_per_s / peer.timing.calls_per_s, 4)
        ours, theirs = ledger.cpu_ms_per_call, peer.cpu_ms_per_call
        row[f"cpu_ratio_vs_{name}"] = (
            None if ours is None or theirs is None else round(ours / theirs, 4)
        )
        console.print(f"{label}: {name} {described(row[name])}")
    return row


def described(run: dict[str, Any]) -> str:
    cpu = run["cpu_ms_per_call"]
    return (
        f"{run['calls_per_s']:,.0f} calls/s, "
        + ("CPU not measured" if cpu is None else f"{cpu:.3f} ms CPU/call")
        + ("" if run["checks"]["passed"] else ", checks FAILED")
    )


def measure(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    binary = ensure_redis_server(console)
    runs: list[dict[str, Any]] = []
    servers: dict[str, RedisServer] = {}
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-peers-")))
        for durability in args.durability:
            servers[durability] = stack.enter_context(
                redis_server(binary, scratch / f"redis-{durability}", durability)
            )
            console.print(
                f"redis-server {servers[durability].version} on "
                f"127.0.0.1:{servers[durability].port}, durability {durability}"
            )
        for callers in args.callers:
            for share in DUPLICATES:
                runs.append(run_row(args, callers, share, servers, scratch, console))
    return {
        "workload": {
            **workload_meta(args.calls, 0, DUPLICATES),
            "callers": list(args.callers),
            "warmup_calls": args.warmup,
            "retry_gap": "a retry comes at least 4 x callers calls after its original",
        },
        "systems": {
            "toolledger": "toolledger.Ledger.embedded(path, registry), defaults "
            "(synchronous=FULL, journal_mode=WAL, 4 partitions); callers: coroutines on one "
            "event loop",
            "powertools_redis": "aws_lambda_powertools idempotent_function + "
            "RedisCachePersistenceLayer (event_key_jmespath [tenant, key], key_prefix = tool, "
            "md5; no payload validation: 3.37's Redis layer drops the validation hash on "
            "completion, so every replay would fail it), redis-py client shared by all threads; "
            "callers: threads; redis-server with no persistence (--save '' --appendonly no)",
            "powertools_redis_aof_always": "the same over a redis-server with --appendonly yes "
            "--appendfsync always (every write fsynced before its answer, as toolledger's "
            "synchronous=FULL)",
            "concurrency": "the same number of concurrent callers in one Python process for "
            "both; Powertools is synchronous, so a thread per caller; redis-server is a "
            "separate process",
        },
        "ratio": "toolledger calls_per_s / the peer's calls_per_s",
        "cpu_ratio": "toolledger cpu_ms_per_call / the peer's (this process + redis-server)",
        "cpu_definition": "time.process_time() of this process (every thread) over the "
        "measured loop / calls; Powertools adds redis-server's user + system CPU over the "
        "same loop (/proc/<pid>/stat: redis_server_cpu_ms_per_call), null where /proc cannot "
        "be read",
        "runs": runs,
        "redis": {
            name: {"version": server.version, "argv": server.argv}
            for name, server in servers.items()
        },
        "earlier_measurement": EARLIER,
        "meta": {
            "python": platform.python_version(),
            "aws_lambda_powertools": version("aws-lambda-powertools"),
            "redis_py": version("redis"),
            "toolledger_synchronous": "FULL",
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    }


def show(result: dict[str, Any], console: Console) -> None:
    table = Table(title=f"{result['workload']['calls']} calls per run")
    for name in (
        "callers", "D", "system", "calls/s", "p50 ms", "p99 ms", "CPU ms/call",
        "of which redis-server", "ratio toolledger/peer", "CPU ratio", "checks",
    ):  # fmt: skip
        table.add_column(name, justify="right")

    def ms(value: float | None) -> str:
        return "" if value is None else f"{value:.3f}"

    for row in result["runs"]:
        for system in ("toolledger", *POWERTOOLS.values()):
            if system not in row:
                continue
            run = row[system]
            ratio = row.get(f"ratio_vs_{system}")
            table.add_row(
                str(row["callers"]), f"{row['duplicates']:.1f}", system,
                f"{run['calls_per_s']:,.0f}", f"{run['p50_ms']:.2f}", f"{run['p99_ms']:.2f}",
                ms(run["cpu_ms_per_call"]), ms(run.get("redis_server_cpu_ms_per_call")),
                "" if ratio is None else f"{ratio:.3f}",
                ms(row.get(f"cpu_ratio_vs_{system}")),
                "ok" if run["checks"]["passed"] else "[red]FAILED",
            )  # fmt: skip
    console.print(table)


def all_passed(result: dict[str, Any]) -> bool:
    return all(
        value["checks"]["passed"]
        for row in result["runs"]
        for value in row.values()
        if isinstance(value, dict)
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--calls", type=int, default=20_000, help="calls per run")
    parser.add_argument(
        "--callers",
        type=int,
        nargs="+",
        default=[16],
        help="concurrent callers: one run of each system per number (e.g. 16 64)",
    )
    parser.add_argument("--warmup", type=int, default=500, help="untimed calls first, per run")
    parser.add_argument(
        "--durability",
        nargs="+",
        choices=list(REDIS_DURABILITY),
        default=list(REDIS_DURABILITY),
        help="the redis-server configurations",
    )
    parser.add_argument("--out", default="bench/results/peers.json")
    args = parser.parse_args(argv)
    if args.calls < 2 or min(args.callers) < 1 or args.warmup < 0:
        parser.error("need --calls >= 2, --callers >= 1, --warmup >= 0")
    console = Console(width=None if sys.stdout.isatty() else 160)  # the table is wide
    result = measure(args, console)
    show(result, console)
    write_result(result, args.out, console)
    if not all_passed(result):
        console.print("[red]a check failed: some key did not execute exactly once")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
