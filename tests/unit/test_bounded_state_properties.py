"""Bounded state under random interleavings: calls on a few keys, evictions (a cache of one
or two entries), expiries (log time moving past the key retention, exactly onto it too) and
restarts of the worker from its store. Every answer must be what a plain model says: within
the retention the first call's outcome (or a refusal of other arguments), after it a new
execution; and the effects are what the model counts.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from processors.pipeline import Stages
from processors.runtime.partition import PartitionWorker
from processors.tools.manifest import Tool, ToolContext, ToolDescription
from processors.tools.redaction import Redactor
from processors.tools.registry import ToolRegistry
from schemas.codec import encode
from schemas.events import (
    Envelope,
    ToolCallRejected,
    ToolCallReplayed,
    ToolCallRequested,
    ToolCallSucceeded,
)
from schemas.keys import CallKey
from tests.unit.memory_store import MemoryStore

RETENTION_S = 100
T0 = datetime(2026, 12, 1, tzinfo=UTC)


class Args(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    value: int


class Done(BaseModel):
    effect: int


@dataclass
class LogClock:
    """The executor's clock, moved by the test with the log's time."""

    now_: datetime = T0

    def now(self) -> datetime:
        return self.now_

    def monotonic(self) -> float:
        return time.monotonic()


@dataclass
class Effects:
    count: Counter[str] = field(default_factory=Counter)

    async def handler(self, args: Args, ctx: ToolContext) -> Done:
        await asyncio.sleep(0)  # let other keys' tasks interleave
        self.count[ctx.idempotency_key] += 1
        return Done(effect=self.count[ctx.idempotency_key])


def _stages(effects: Effects, clock: LogClock) -> Stages:
    registry = ToolRegistry()
    registry.register(
        Tool(
            name="op",
            version="1",
            arguments=Args,
            result=Done,
            handler=effects.handler,
            timeout_s=5,
            key_retention=timedelta(seconds=RETENTION_S),
            description=ToolDescription("op", "tests", "never", "none", "replayed"),
        )
    )
    return Stages(registry, Redactor(b"k" * 32), clock=clock)


def _intent(intent_id: str, key: str, value: int, at: datetime) -> bytes:
    return encode(
        ToolCallRequested(
            envelope=Envelope(
                event_id=f"{intent_id}/requested/1",
                call_key=str(CallKey("t", "op", key)),
                tenant_id="t",
                tool="op",
                tool_version="",
                idempotency_key=key,
                args_digest="",
                intent_id=intent_id,
                occurred_at=at,
            ),
            arguments_json=json.dumps({"value": value}),
            scopes=["tools:call"],
        )
    )


@dataclass
class Model:
    """An unbounded, never-evicting ledger: per key the first call's value and its time."""

    keys: dict[str, tuple[int, datetime]] = field(default_factory=dict)
    effects: Counter[str] = field(default_factory=Counter)

    def answer(self, key: str, value: int, at: datetime) -> str:
        held = self.keys.get(key)
        if held is not None and at >= held[1] + timedelta(seconds=RETENTION_S):
            held = None  # expired: at its expiry exactly too
        if held is None:
            self.keys[key] = (value, at)
            self.effects[key] += 1
            return "executed"
        return "replayed" if held[0] == value else "refused"


def _answer(events: list[object]) -> str:
    for event in events:
        if isinstance(event, ToolCallSucceeded):
            return "executed"
        if isinstance(event, ToolCallReplayed):
            return "replayed"
        if isinstance(event, ToolCallRejected):
            return "refused"
    return "unanswered"


GROUP = st.tuples(
    st.sampled_from([0, 0, 40, 60, RETENTION_S]),  # log time moves on by this many seconds
    st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 1)), min_size=1, max_size=5),
    st.booleans(),  # restart the worker after this group
    st.booleans(),  # give the sweeper time to expire keys on its own
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups=st.lists(GROUP, min_size=1, max_size=8), cache=st.sampled_from([1, 2, 4096]))
def test_evictions_expiries_and_restarts_decide_as_the_unbounded_model(
    groups: list[tuple[int, list[tuple[str, int]], bool, bool]], cache: int
) -> None:
    effects, clock, model = Effects(), LogClock(), Model()
    stages = _stages(effects, clock)
    store = MemoryStore()
    expected: dict[str, str] = {}
    log: list[bytes] = []

    def worker() -> PartitionWorker:
        return PartitionWorker(
            0,
            store.position,
            store,
            stages,
            epoch=1,
            concurrency=8,
            sweep_interval_s=0.005,
            cache_entries=cache,
        )

    async def scenario() -> None:
        current = worker()
        await current.start()
        for advance, calls, restart, sweep in groups:
            clock.now_ += timedelta(seconds=advance)
            for key, value in calls:
                intent_id = uuid.uuid4().hex
                expected[intent_id] = model.answer(key, value, clock.now_)
                log.append(_intent(intent_id, key, value, clock.now_))
                await current.feed(len(log) - 1, log[-1])
            await current.drain()
            if sweep:
                await asyncio.sleep(0.03)
                await current.drain()
            if restart:
                await current.stop()
                current = worker()
                await current.start()
        await current.drain()
        await current.stop()

    asyncio.run(scenario())
    answers = {
        intent_id: _answer([e for e in store.outcomes if e.intent_id == intent_id])
        for intent_id in expected
    }
    assert answers == expected, (groups, cache)
    assert effects.count == model.effects
    assert store.position == len(log)
