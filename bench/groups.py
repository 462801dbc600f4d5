"""The overhead of call groups: a 10-step chain and a 10-step fan-out against 10 sequential
calls of the same no-op tool, on the embedded ledger, in one run.

Run::

    .venv/bin/python -m bench.groups                 # 30 rounds of each, ~1 min on 2 cores
    .venv/bin/python -m bench.groups --rounds 100
    .venv/bin/python -m bench.groups --jobs 1000     # polling cost instead, ~45 s

Each round uses new keys (every step executes). Reported: median and p90 wall time per round,
and each group shape's ratio to the sequential baseline. The fan-out's steps are independent,
so its ratio below 1 is the concurrency the orchestrator adds.

``--jobs N`` measures instead the cost of polling per second with N running jobs of a
long-running tool against the same process idle (``bench/jobs_polling.py``, written to
``bench/results/jobs_polling.json``; ``--window`` and ``--profile`` are its options).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from bench import jobs_polling
from bench.common import TOOL, Counter, make_registry, write_result
from toolledger.embedded import EmbeddedLedger
from toolledger.producers.client import TrustedContext
from toolledger.settings import LedgerSettings

CONTEXT = TrustedContext("bench-tenant", "bench@example.com")
STEPS = 10


def _steps(chain: bool) -> list[dict[str, Any]]:
    return [
        {
            "id": f"s{i}",
            "tool": TOOL,
            "arguments": {"text": f"step {i}"},
            "depends_on": [f"s{i - 1}"] if chain and i else [],
        }
        for i in range(STEPS)
    ]


async def _measure(rounds: int, one: Callable[[], Awaitable[None]]) -> dict[str, float]:
    await one()  # warm-up
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        await one()
        times.append(time.perf_counter() - started)
    times.sort()
    return {
        "median_ms": round(statistics.median(times) * 1000, 2),
        "p90_ms": round(times[int(len(times) * 0.9) - 1] * 1000, 2),
    }


async def run(rounds: int) -> dict[str, Any]:
    counter = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        async with EmbeddedLedger(
            LedgerSettings(path=Path(tmp) / "ledger.db"), make_registry(counter)
        ) as ledger:
            groups = ledger.groups
            assert groups is not None

            async def sequential() -> None:
                run_id = uuid.uuid4().hex
                for i in range(STEPS):
                    result = await ledger.client.call(
                        TOOL,
                        {"text": f"step {i}"},
                        idempotency_key=f"{run_id}-{i}",
                        context=CONTEXT,
                    )
                    assert result.ok, result

            def group(chain: bool) -> Callable[[], Awaitable[None]]:
                async def one() -> None:
                    answer = await groups.submit(
                        tenant_id=CONTEXT.tenant_id,
                        principal=CONTEXT.principal,
                        scopes=sorted(CONTEXT.scopes),
                        group_key=uuid.uuid4().hex,
                        body={"run_id": "bench", "steps": _steps(chain)},
                        wait_s=60,
                    )
                    assert answer.view is not None and answer.view.status == "SUCCEEDED"

                return one

            baseline = await _measure(rounds, sequential)
            chain = await _measure(rounds, group(True))
            fan_out = await _measure(rounds, group(False))
    base = baseline["median_ms"]
    return {
        "steps": STEPS,
        "rounds": rounds,
        "sequential_calls": baseline,
        "chain": chain | {"ratio_to_sequential": round(chain["median_ms"] / base, 2)},
        "fan_out": fan_out | {"ratio_to_sequential": round(fan_out["median_ms"] / base, 2)},
        "executions": counter.invocations,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument(
        "--jobs",
        type=int,
        help="measure polling with this many running jobs instead (bench/jobs_polling.py)",
    )
    jobs_polling.add_arguments(parser)
    parser.add_argument(
        "--out", help=f"default bench/results/groups.json ({jobs_polling.OUT} with --jobs)"
    )
    args = parser.parse_args()
    if args.jobs is not None:
        jobs_polling.execute(args.jobs, args, args.out)
        return
    console = Console()
    result = asyncio.run(run(args.rounds))
    console.print(result)
    write_result(result, args.out or "bench/results/groups.json", console)


if __name__ == "__main__":
    main()
