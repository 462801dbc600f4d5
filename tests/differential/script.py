"""A random script of calls through the public API of the embedded ledger, and what it answered.

``python -m tests.differential.script SEED`` prints, as JSON, every answer (status, replayed,
attempts, error code, result) and every effect count of one script: calls on a few keys with
the same and other arguments, transient and final failures, a handler that hangs after its
effect (UNKNOWN, then reconciled), a call still running when the ledger crashes (closed with
no grace: recovered as UNKNOWN), restarts, and keys that expire (a retention of a few seconds).
It uses nothing but ``toolledger.Ledger.embedded`` and ``processors.tools``, so it runs on any
version of the ledger: the answers of two versions can be compared
(tests/differential/test_runtimes.py holds those of the runtime before issue 30's rewrite).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import tempfile
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from toolledger import Ledger, TrustedContext
from toolledger.processors.ledger import Found, NotHappened, ReconcileOutcome
from toolledger.processors.tools.manifest import (
    RetryPolicy,
    Tool,
    ToolContext,
    ToolDescription,
    ToolError,
)
from toolledger.processors.tools.registry import ToolRegistry

KEYS = ("a", "b", "c", "d", "e")
BEHAVIOURS = ("ok", "ok", "ok", "transient", "final", "hang")
CALLER = TrustedContext("acme", "alice")


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: int
    behaviour: str


class Done(BaseModel):
    value: int


class Downstream:
    """Counts effects per key; fails or hangs as the arguments say; reconcile tells the truth."""

    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()
        self.transient_seen: set[str] = set()
        self.release = asyncio.Event()

    async def handler(self, args: Args, ctx: ToolContext) -> Done:
        key = ctx.idempotency_key
        if args.behaviour == "transient" and key not in self.transient_seen:
            self.transient_seen.add(key)
            raise ToolError("BUSY", "try again", retryable=True)
        if args.behaviour == "final":
            raise ToolError("REFUSED", "no", retryable=False)
        if args.behaviour == "block":  # runs until the ledger crashes around it
            await self.release.wait()
        self.effects[key] += 1
        if args.behaviour == "hang":
            await asyncio.sleep(30)  # past the timeout: UNKNOWN after the effect
        return Done(value=args.value)

    async def reconcile(self, ctx: ToolContext) -> ReconcileOutcome:
        if self.effects[ctx.idempotency_key]:
            return Found(json.dumps({"value": -1}))
        return NotHappened()


def registry(downstream: Downstream) -> ToolRegistry:
    tools = ToolRegistry()
    tools.register(
        Tool(
            name="op",
            version="1",
            arguments=Args,
            result=Done,
            handler=downstream.handler,
            reconcile=downstream.reconcile,
            timeout_s=0.3,
            retry=RetryPolicy(
                max_attempts=2, max_rounds=2, backoff_base_s=0.01, backoff_cap_s=0.02
            ),
            key_retention=timedelta(seconds=RETENTION_S),
            description=ToolDescription("op", "tests", "never", "none", "replayed"),
        )
    )
    return tools


RETENTION_S = 8.0
WAIT_S = 8.5  # past the retention: every key settled before it has expired after it


def plan(seed: int, steps: int = 40) -> list[tuple[str, Any]]:
    """At most one wait past the retention, and three slow steps (a hang or a crash: about a
    second each), so that a key's expiry never depends on how fast a machine is: without the wait
    no key's retention can pass, across it every one has."""
    rng = random.Random(seed)
    behaviours = {key: rng.choice(BEHAVIOURS) for key in KEYS}  # a key's calls agree on it
    out: list[tuple[str, Any]] = []
    slow = waits = 0
    while len(out) < steps:
        roll = rng.random()
        if roll < 0.06:
            out.append(("restart", None))
        elif roll < 0.1 and slow < 1:
            slow += 1
            out.append(("crash_running", None))
        elif roll < 0.13 and waits < 1:
            waits += 1
            out.append(("wait", WAIT_S))
        else:
            key = rng.choice(KEYS)
            if behaviours[key] == "hang":
                if slow >= 3:
                    continue
                slow += 1
            value = rng.choice((1, 1, 1, 1, 2))  # 2: the key with other arguments
            out.append(("call", (key, value, behaviours[key])))
    return out


def answer(result: Any) -> dict[str, Any]:
    return {
        "status": None if result.status is None else result.status.value,
        "replayed": result.replayed,
        "attempts": result.attempts,
        "error": None if result.error is None else result.error.code,
        "result": result.result,
    }


async def run(seed: int) -> dict[str, Any]:
    downstream = Downstream()
    tools = registry(downstream)
    answers: list[Any] = []
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "ledger.db"
        ledger = Ledger.embedded(path, tools, context=CALLER, sweep_interval_s=3600)
        await ledger.__aenter__()
        try:
            for n, (kind, what) in enumerate(plan(seed)):
                if kind == "restart":
                    await ledger.__aexit__(None, None, None)
                    ledger = Ledger.embedded(path, tools, context=CALLER, sweep_interval_s=3600)
                    await ledger.__aenter__()
                    answers.append(["restart"])
                elif kind == "wait":
                    await asyncio.sleep(what)
                    answers.append(["wait"])
                elif kind == "crash_running":
                    key = f"crash-{n}"
                    running = await ledger.call(
                        "op", {"value": 1, "behaviour": "block"}, idempotency_key=key, wait=0.1
                    )
                    await ledger.__aexit__(RuntimeError, RuntimeError("crash"), None)
                    downstream.release.set()  # the handler went with the crash: no effect
                    await asyncio.sleep(0)
                    downstream.release = asyncio.Event()
                    ledger = Ledger.embedded(path, tools, context=CALLER, sweep_interval_s=3600)
                    await ledger.__aenter__()
                    again = await ledger.call(
                        "op", {"value": 1, "behaviour": "block"}, idempotency_key=key, wait=3.0
                    )
                    answers.append(["crash", answer(running), answer(again)])
                else:
                    key, value, behaviour = what
                    result = await ledger.call(
                        "op", {"value": value, "behaviour": behaviour}, idempotency_key=key
                    )
                    answers.append(["call", key, value, behaviour, answer(result)])
        finally:
            await ledger.__aexit__(None, None, None)
    return {"seed": seed, "answers": answers, "effects": dict(sorted(downstream.effects.items()))}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(int(sys.argv[1])))))
