"""The hot path's CPU budget: a short run that prints CPU milliseconds per call.

Run before every submission that touches the hot path (the executor core, the embedded
runtime, the stages, the HTTP front door)::

    .venv/bin/python -m bench.guard            # about 30 s

Two phases, each a closed loop of 16 callers on new keys (first executions of a no-op
mutation tool, 200-byte arguments), after an untimed warm-up:

``embedded``
    ``toolledger.Ledger.embedded`` with its defaults (``synchronous=FULL``), callers on this
    process's event loop. CPU: this process (every thread: the loop and the writer).
``http``
    ``toolledger serve`` (embedded backend, a process of its own) and ``POST
    /v1/tools/bench_noop/calls`` from raw keep-alive connections. CPU: the server process.

Each line gives the measured CPU ms per call, the budget committed here and whether it held.
CPU per call is the number that changes least when the machine is busy (calls per second are
printed too, for information). The exit status is 1 when a phase is over its budget or a
call was not answered as it should: nothing here is a test (no timing assertion runs in the
test suite); it is a check to run by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from rich.progress import Progress

from bench.common import (
    TENANTS,
    Executions,
    WorkCall,
    cpu_seconds,
    drive_async,
    make_workload_registry,
    plan_workload,
)
from bench.http import (
    connections,
    drive,
    free_port,
    ledger_argv,
    plan,
    running,
    write_tokens,
)
from toolledger import Ledger, TrustedContext

# CPU milliseconds per call the hot path must stay under (issue 30's target for the embedded
# path; the HTTP path's from its measured cost with a margin for a busy machine).
EMBEDDED_BUDGET_MS = 0.25
HTTP_BUDGET_MS = 1.0
CALLERS = 16


async def embedded_phase(calls: int) -> tuple[float, float, bool]:
    """(CPU ms per call, calls per second, every call answered as it should)."""
    executions = Executions()
    registry = make_workload_registry(executions)
    contexts = {t: TrustedContext(tenant_id=t, principal="guard") for t in TENANTS}
    warm, measured = plan_workload(500, 0.0, gap=64, seed=3), plan_workload(calls, 0.0, gap=64)
    wrong = 0
    with tempfile.TemporaryDirectory() as scratch:
        async with Ledger.embedded(Path(scratch) / "ledger.db", registry) as ledger:

            async def call(c: WorkCall) -> None:
                nonlocal wrong
                result = await ledger.call(
                    c.tool, c.args, idempotency_key=c.key, context=contexts[c.tenant]
                )
                wrong += not result.ok or result.replayed

            await drive_async(warm, CALLERS, call)
            executions.reset()
            cpu = time.process_time()
            timing = await drive_async(measured, CALLERS, call)
            cpu = time.process_time() - cpu
    ok = wrong == 0 and bool(executions.check(measured)["passed"])
    return cpu * 1000 / calls, timing.calls_per_s, ok


async def http_phase(requests: int) -> tuple[float, float, bool]:
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        tokens = work / "tokens.json"
        write_tokens(tokens)
        port = free_port()
        argv = ledger_argv(port, work / "data", tokens, None)
        serving = running("toolledger serve", argv, port, work / "serve.log")
        async with serving as server, connections("raw", server, CALLERS) as clients:
            with Progress(transient=True) as progress:
                task = progress.add_task("warm-up", total=None)
                await drive(clients, server, plan(300, "warm"), None, progress, task)
                before = cpu_seconds(server.pid)
                phase = await drive(clients, server, plan(requests, "key"), None, progress, task)
                cpu = cpu_seconds(server.pid) - before
    ok = not phase.transport_errors
    return cpu * 1000 / requests, phase.per_s, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=6000, help="embedded calls measured")
    parser.add_argument("--requests", type=int, default=4000, help="HTTP requests measured")
    args = parser.parse_args()
    failed = False
    for name, phase, n, budget in (
        ("embedded", embedded_phase, args.calls, EMBEDDED_BUDGET_MS),
        ("http", http_phase, args.requests, HTTP_BUDGET_MS),
    ):
        cpu_ms, per_s, ok = asyncio.run(phase(n))
        within = cpu_ms <= budget and ok
        failed |= not within
        verdict = "ok" if within else ("OVER BUDGET" if ok else "WRONG ANSWERS")
        print(
            f"{name:9s} {cpu_ms:6.3f} ms CPU per call (budget {budget:.3f})  "
            f"{per_s:8,.0f} calls/s  {verdict}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
