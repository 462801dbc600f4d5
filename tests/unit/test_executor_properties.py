"""Hypothesis properties of the executor core (:class:`processors.executor.Executor`): the
real machinery (per-key order, concurrency across keys, group commit, input positions,
takeover recovery) under random schedules and crashes at random commits, against an
in-memory store and a downstream that counts effects. Unit tests may use fakes; the real
stores run in the contract suite.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from tests.unit.memory_store import PARTITION, Crash, MemoryStore
from toolledger.processors.executor import Executor
from toolledger.processors.ledger import Found, NotHappened, ReconcileOutcome
from toolledger.processors.pipeline import Stages
from toolledger.processors.tools.manifest import (
    RetryPolicy,
    Tool,
    ToolContext,
    ToolDescription,
    ToolError,
    always,
)
from toolledger.processors.tools.redaction import Redactor
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.schemas.codec import decode, encode
from toolledger.schemas.events import Envelope, ToolCallRejected, ToolCallRequested, answers_intent
from toolledger.schemas.keys import CallKey
from toolledger.schemas.status import CallStatus


class Args(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    value: int
    behaviour: str = "ok"  # ok | flaky | hang


class Done(BaseModel):
    value: int


@dataclass
class Downstream:
    """Counts real effects; reconcile tells the truth about them."""

    effects: Counter[str] = field(default_factory=Counter)
    flaky_seen: set[str] = field(default_factory=set)

    async def handler(self, args: Args, ctx: ToolContext) -> Done:
        await asyncio.sleep(random.random() * 0.002)
        if args.behaviour == "flaky" and ctx.idempotency_key not in self.flaky_seen:
            self.flaky_seen.add(ctx.idempotency_key)
            raise ToolError("BUSY", "try again", retryable=True)
        self.effects[ctx.idempotency_key] += 1
        if args.behaviour == "hang":
            await asyncio.sleep(10)  # past the timeout: UNKNOWN after the effect
        return Done(value=args.value)

    async def reconcile(self, ctx: ToolContext) -> ReconcileOutcome:
        if self.effects[ctx.idempotency_key]:
            return Found(json.dumps({"value": -1}))
        return NotHappened()


def _registry(downstream: Downstream, *, approval: bool = False) -> ToolRegistry:
    registry = ToolRegistry()
    registry.register(
        Tool(
            approval=always if approval else None,
            name="op",
            version="1",
            arguments=Args,
            result=Done,
            handler=downstream.handler,
            reconcile=downstream.reconcile,
            timeout_s=0.02,
            retry=RetryPolicy(
                max_attempts=3, max_rounds=3, backoff_base_s=0.001, backoff_cap_s=0.002
            ),
            description=ToolDescription("op", "tests", "never", "none", "replayed"),
        )
    )
    return registry


def _intent(
    key: str, args: dict[str, object], token: str | None = None, intent_id: str | None = None
) -> bytes:
    intent_id = intent_id or uuid.uuid4().hex
    return encode(
        ToolCallRequested(
            envelope=Envelope(
                event_id=f"{intent_id}/requested/1",
                call_key=str(CallKey("t", "op", key, "p")),
                tenant_id="t",
                tool="op",
                tool_version="",
                idempotency_key=key,
                args_digest="",
                intent_id=intent_id,
                principal="p",
                occurred_at=datetime.now(UTC),
            ),
            arguments_json=json.dumps(args),
            scopes=["tools:call"],
            approval_token=token,
        )
    )


def _executor(
    store: MemoryStore,
    stages: Stages,
    *,
    epoch: int = 1,
    cache_entries: int = 1024,
    sweep_interval_s: float = 0.01,
) -> Executor:
    """An executor of the store's one partition, writing to the store."""
    return Executor(
        [PARTITION],
        store,
        stages,
        store.commit,
        partition_of=lambda _key: PARTITION,
        epoch=epoch,
        concurrency=8,
        cache_entries=cache_entries,
        sweep_interval_s=sweep_interval_s,
    )


async def _run_until_done(
    log: list[bytes], store: MemoryStore, stages: Stages, cache_entries: int = 1024
) -> bool:
    """Run an executor over the log from the stored position; False if it crashed."""
    executor = _executor(store, stages, cache_entries=cache_entries)
    try:
        await executor.start()
    except Crash:
        return False
    try:
        for offset in range(executor.position(PARTITION), len(log)):
            if executor.failed is not None:
                break
            await executor.feed(PARTITION, offset, log[offset])
        await executor.drain()
    except Exception:
        pass
    finally:
        crashed = executor.failed is not None and isinstance(executor.failed, Crash)
        await executor.stop()
    return not crashed


KEYS = ["a", "b", "c", "d"]
CACHE_SIZES = st.sampled_from([1, 2, 1024])  # 1 and 2: nearly every use of a key is a miss
schedule = st.lists(
    st.tuples(
        st.sampled_from(KEYS), st.integers(0, 1), st.sampled_from(["ok", "ok", "flaky", "hang"])
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    schedule=schedule,
    crash_at=st.one_of(st.none(), st.integers(1, 12)),
    seed=st.integers(0, 2**16),
    cache=CACHE_SIZES,
)
# "a" times out (UNKNOWN); its second intent, queued behind the call, is decided to reconcile
# (no event) and counts as done; the crash is at the commit of that reconcile's answer
@example(schedule=[("a", 0, "hang"), ("a", 0, "hang")], crash_at=3, seed=0, cache=1024)
def test_any_schedule_with_a_crash_executes_each_key_at_most_once(
    schedule: list[tuple[str, int, str]], crash_at: int | None, seed: int, cache: int
) -> None:
    random.seed(seed)
    downstream = Downstream()
    stages = Stages(_registry(downstream), Redactor(b"k" * 32), rng=random.Random(seed))
    # every key has one behaviour; value 0/1 makes conflicting arguments for the same key
    behaviours = {key: b for key, _, b in schedule}
    log = [_intent(k, {"value": v, "behaviour": behaviours[k]}) for k, v, _ in schedule]

    async def scenario() -> MemoryStore:
        store = MemoryStore(crash_at=crash_at)
        for _ in range(3):  # a crash kills the executor; a new one takes over from the store
            if await _run_until_done(log, store, stages, cache):
                break
            store.crash_at = None
        return store

    store = asyncio.run(scenario())
    for key in KEYS:
        assert downstream.effects[key] <= 1, (key, downstream.effects)
    assert store.position == len(log), "every intent was processed after the takeover"
    answered = {e.intent_id for e in store.outcomes if answers_intent(e)}
    assert {decode(record).intent_id for record in log} <= answered, "an intent went unanswered"
    for key, state in store.states.items():
        idem = CallKey.parse(key).idempotency_key
        if state.status is CallStatus.SUCCEEDED:
            assert downstream.effects[idem] == 1, (key, state)
        if state.status is CallStatus.PENDING:
            raise AssertionError(f"{key} left PENDING after the executor finished")


def _switch(enabled: bool) -> bytes:
    from toolledger.producers.governance import switch

    return encode(
        switch(
            tenant_id="t",
            tool="op",
            enabled=enabled,
            actor="op",
            reason="incident",
            now=datetime.now(UTC),
        )
    )


def test_a_switch_refuses_intents_queued_before_it_and_survives_a_takeover() -> None:
    downstream = Downstream()
    stages = Stages(_registry(downstream), Redactor(b"k" * 32))
    # a and b are fed before the switch but not yet decided when the executor reads it
    log = [_intent("a", {"value": 1}), _intent("b", {"value": 1}), _switch(False)]
    log.append(_intent("c", {"value": 1}))

    async def scenario() -> MemoryStore:
        store = MemoryStore()
        assert await _run_until_done(log, store, stages)
        log.append(_intent("d", {"value": 1}))  # read by a new owner, from the store
        assert await _run_until_done(log, store, stages)
        log.extend([_switch(True), _intent("e", {"value": 1})])
        assert await _run_until_done(log, store, stages)
        return store

    store = asyncio.run(scenario())
    codes = {
        e.envelope.idempotency_key: e.error.code
        for e in store.outcomes
        if isinstance(e, ToolCallRejected)
    }
    assert codes == {k: "TOOL_DISABLED" for k in "abcd"}, codes
    assert sum(downstream.effects.values()) == downstream.effects["e"] == 1
    switched = [e.TYPE for e in store.outcomes if e.TYPE in ("ToolDisabled", "ToolEnabled")]
    assert switched == ["ToolDisabled", "ToolEnabled"]


STEPS = st.lists(
    st.sampled_from(["ask", "grant", "use", "use_other_key", "use_other_args", "off", "on"]),
    min_size=1,
    max_size=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=STEPS,
    crash_at=st.one_of(st.none(), st.integers(1, 10)),
    seed=st.integers(0, 999),
    cache=CACHE_SIZES,
)
def test_an_approval_starts_at_most_one_execution_whatever_the_interleaving(
    steps: list[str], crash_at: int | None, seed: int, cache: int
) -> None:
    """Asks, the operator's grant, uses of the token (right call, another key, other
    arguments) and switches in any order, with a crash at any commit: the approved call runs
    at most once, only after its ApprovalConsumed, and nothing else ever runs."""
    from toolledger.producers import governance
    from toolledger.schemas.canonical import args_digest
    from toolledger.schemas.governance import token_digest

    random.seed(seed)
    downstream = Downstream()
    stages = Stages(_registry(downstream, approval=True), Redactor(b"k" * 32))
    args = {"value": 1, "behaviour": "ok"}
    first = uuid.uuid4().hex  # the first ask opens the request: its id derives from this
    approval_id = "apr_" + hashlib.sha256(first.encode()).hexdigest()[:24]
    target = governance.ApprovalTarget(
        approval_id, "t", "op", "a", args_digest(args), call_key=str(CallKey("t", "op", "a", "p"))
    )
    grant, token = governance.approve(target, "olga", datetime.now(UTC))
    records = {
        "ask": lambda: _intent("a", args),
        "grant": lambda: encode(grant),
        "use": lambda: _intent("a", args, token),
        "use_other_key": lambda: _intent("b", args, token),
        "use_other_args": lambda: _intent("a", {**args, "value": 2}, token),
        "off": lambda: _switch(False),
        "on": lambda: _switch(True),
    }
    log = [_intent("a", args, intent_id=first)] + [records[step]() for step in steps]

    async def scenario() -> MemoryStore:
        store = MemoryStore(crash_at=crash_at)
        for _ in range(3):
            if await _run_until_done(log, store, stages, cache):
                break
            store.crash_at = None
        return store

    store = asyncio.run(scenario())
    assert downstream.effects["b"] == 0
    assert downstream.effects["a"] <= 1
    mine = [e for e in store.outcomes if e.call_key == str(CallKey("t", "op", "a", "p"))]
    types = [e.TYPE for e in mine]
    started = [e for e in mine if e.TYPE == "ToolCallStarted"]
    if started:
        consumed = types.index("ApprovalConsumed")
        assert consumed == types.index("ToolCallStarted") - 1, types  # one atomic commit
        assert types.count("ApprovalConsumed") == 1, types
        assert {e.envelope.args_digest for e in started} == {target.args_digest}
    else:
        assert downstream.effects["a"] == 0
    assert grant.token_digest == token_digest(token)
    answered = {e.intent_id for e in store.outcomes if answers_intent(e)}
    assert {decode(record).intent_id for record in log} <= answered


def test_a_refusal_read_again_after_a_crash_gives_its_first_answer() -> None:
    """An intent refused while an earlier one is still undecided is past the committed
    position; a crash then makes a new owner read it again. It must not be decided again: the
    switch that refused it is back on by then, so it would run although its caller was told
    no.

    An input counts as done once it is decided (its Started written), not when its call
    finishes: what keeps the position before the refusal is a second intent of "slow" (same
    arguments) waiting in the key's queue behind the running call, undecided until the call
    finishes, which it never does here."""
    downstream = Downstream()
    release = asyncio.Event()

    async def held(args: Args, ctx: ToolContext) -> Done:
        if ctx.idempotency_key == "slow":
            await release.wait()
        return await downstream.handler(args, ctx)

    registry = ToolRegistry()
    registry.register(
        Tool(
            name="op",
            version="1",
            arguments=Args,
            result=Done,
            handler=held,
            reconcile=downstream.reconcile,
            timeout_s=30,
            description=ToolDescription("op", "tests", "never", "none", "replayed"),
        )
    )
    stages = Stages(registry, Redactor(b"k" * 32))
    log = [
        _intent("slow", {"value": 1}),
        _intent("slow", {"value": 1}),  # queued behind the running call: holds the position
        _switch(False),
        _intent("b", {"value": 1}),
        _switch(True),
    ]

    async def scenario() -> MemoryStore:
        store = MemoryStore()
        first = _executor(store, stages, sweep_interval_s=1.0)
        await first.start()

        async def fed(offset: int, committed: str) -> None:
            await first.feed(PARTITION, offset, log[offset])
            for _ in range(500):
                if any(committed == e.TYPE for e in store.outcomes):
                    return
                await asyncio.sleep(0.01)

        await fed(0, "ToolCallStarted")  # "slow" runs (its handler is held)
        await first.feed(PARTITION, 1, log[1])  # waits in the key's queue: nothing committed
        await fed(2, "ToolDisabled")
        await fed(3, "ToolCallRejected")  # b is refused while "slow" still runs
        await fed(4, "ToolEnabled")
        assert store.position == 1  # offset 1 is undecided: b's offset 3 is past the position
        assert store.refused == {3}
        await first.stop()  # the crash: "slow" never finishes here
        release.set()
        second = _executor(store, stages, epoch=2, sweep_interval_s=1.0)
        await second.start()
        for offset in range(store.position, len(log)):
            await second.feed(PARTITION, offset, log[offset])
        await second.drain()
        await second.stop()
        return store

    store = asyncio.run(scenario())
    answers = [e for e in store.outcomes if e.envelope.idempotency_key == "b"]
    assert [e.TYPE for e in answers] == ["ToolCallRejected"], [e.TYPE for e in answers]
    assert downstream.effects["b"] == 0
    assert store.position == len(log)
