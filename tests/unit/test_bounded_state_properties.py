"""Bounded state under random interleavings: calls on a few keys, evictions (a cache of one
or two entries), expiries (log time moving past the key retention, exactly onto it too) and
restarts of the executor from its store. Every answer must be what a plain model says: within
the retention the first call's outcome (or a refusal of other arguments), after it a new
execution; and the effects are what the model counts.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from tests.unit.memory_store import PARTITION, MemoryStore
from toolledger.processors.executor import Executor
from toolledger.processors.pipeline import Stages
from toolledger.processors.tools.manifest import Tool, ToolContext, ToolDescription
from toolledger.processors.tools.redaction import Redactor
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.producers.governance import ApprovalTarget, deny
from toolledger.schemas.canonical import args_digest
from toolledger.schemas.codec import encode
from toolledger.schemas.errors import ErrorCode
from toolledger.schemas.events import (
    ApprovalDenied,
    ApprovalRequested,
    Envelope,
    Event,
    ToolCallRejected,
    ToolCallReplayed,
    ToolCallRequested,
    ToolCallSucceeded,
)
from toolledger.schemas.governance import approval_id_for
from toolledger.schemas.keys import CallKey

RETENTION_S = 100
REQUEST_TTL_S = 150  # of an approval request (the approval property's tool)
NEEDS_APPROVAL = 1  # the value whose calls need an approval there
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


def _stages(effects: Effects, clock: LogClock, *, approvals: bool = False) -> Stages:
    """The one tool; with ``approvals``, a call with value :data:`NEEDS_APPROVAL` needs an
    operator's approval (requests lapse after :data:`REQUEST_TTL_S`)."""
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
            approval=(lambda args: "operator" if args.value == NEEDS_APPROVAL else None)
            if approvals
            else None,
            description=ToolDescription("op", "tests", "never", "none", "replayed"),
        )
    )
    ttl = timedelta(seconds=REQUEST_TTL_S)
    return Stages(registry, Redactor(b"k" * 32), clock=clock, approval_request_ttl=ttl)


Op = TypeVar("Op")
Group = tuple[int, list[tuple[str, Op]], bool, bool]  # advance, (key, op)s, restart, sweep


def _play(
    stages: Stages,
    clock: LogClock,
    groups: list[Group[Op]],
    cache: int,
    feed: Callable[[str, Op, datetime], tuple[str, str, bytes]],
    *,
    one_at_a_time: bool,
) -> tuple[MemoryStore, dict[str, str]]:
    """Run ``groups`` through an executor over a :class:`MemoryStore`: log time moves on,
    each op is made a record by ``feed`` (its intent id, the model's answer, the record) and
    fed (``one_at_a_time``: each drained before the next, else the group's run together), the
    sweeper is given time, the executor restarts. Returns the store and the expected answers."""
    store = MemoryStore()
    expected: dict[str, str] = {}

    def executor() -> Executor:
        return Executor(
            [PARTITION], store, stages, store.commit, partition_of=lambda _key: PARTITION,
            epoch=1, clock=clock, concurrency=8, sweep_interval_s=0.005, cache_entries=cache,
        )  # fmt: skip

    async def scenario() -> None:
        current = executor()
        await current.start()
        for advance, ops, restart, sweep in groups:
            clock.now_ += timedelta(seconds=advance)
            for key, op in ops:
                intent_id, answer, record = feed(key, op, clock.now_)
                expected[intent_id] = answer
                await current.feed(PARTITION, len(expected) - 1, record)
                if one_at_a_time:
                    await current.drain()
            await current.drain()
            if sweep:
                await asyncio.sleep(0.03)
                await current.drain()
            if restart:
                await current.stop()
                current = executor()
                await current.start()
        await current.drain()
        await current.stop()

    asyncio.run(scenario())
    return store, expected


def _answers(
    store: MemoryStore, expected: Mapping[str, str], answer: Callable[[list[Event]], str]
) -> dict[str, str]:
    return {
        intent_id: answer([e for e in store.outcomes if e.intent_id == intent_id])
        for intent_id in expected
    }


def _intent(intent_id: str, key: str, value: int, at: datetime) -> bytes:
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


def _answer(events: list[Event]) -> str:
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
    st.booleans(),  # restart the executor after this group
    st.booleans(),  # give the sweeper time to expire keys on its own
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups=st.lists(GROUP, min_size=1, max_size=8), cache=st.sampled_from([1, 2, 4096]))
def test_evictions_expiries_and_restarts_decide_as_the_unbounded_model(
    groups: list[tuple[int, list[tuple[str, int]], bool, bool]], cache: int
) -> None:
    effects, clock, model = Effects(), LogClock(), Model()

    def feed(key: str, value: int, at: datetime) -> tuple[str, str, bytes]:
        intent_id = uuid.uuid4().hex
        return intent_id, model.answer(key, value, at), _intent(intent_id, key, value, at)

    store, expected = _play(
        _stages(effects, clock), clock, groups, cache, feed, one_at_a_time=False
    )
    assert _answers(store, expected, _answer) == expected, (groups, cache)
    assert effects.count == model.effects
    assert store.position == len(expected)


# -- keys with approval requests ----------------------------------------------------------
# The same tool, but a call with value 1 needs an operator's approval: it opens a request (or
# is answered by the open one); an operator may deny it. A key that only had requests settles
# when its last one was decided or lapsed, a key with a call at the later of the call and its
# requests, and either expires a retention later (the denial with it): the model says so, the
# executor must agree through evictions, restarts and the sweeper's own expiries.


@dataclass
class KeyModel:
    call: tuple[int, datetime] | None = None  # the value and when it ran (and settled)
    request: tuple[str, datetime, bool] | None = None  # id, expiry, denied
    book_at: datetime | None = None  # the key's last approval event

    def settled(self) -> datetime | None:
        times = [self.call[1]] if self.call else []
        if self.request is not None:
            assert self.book_at is not None
            _id, expires, denied = self.request
            times += [self.book_at] if denied else [self.book_at, expires]
        return max(times, default=None)


@dataclass
class ApprovalModel:
    keys: dict[str, KeyModel] = field(default_factory=dict)
    effects: Counter[str] = field(default_factory=Counter)

    def _key(self, key: str, at: datetime) -> KeyModel:
        held = self.keys.get(key)
        settled = None if held is None else held.settled()
        if held is None or (settled and at >= settled + timedelta(seconds=RETENTION_S)):
            held = self.keys[key] = KeyModel()  # new, or expired: at its expiry exactly too
        return held

    def call(self, intent_id: str, key: str, value: int, at: datetime) -> str:
        held = self._key(key, at)
        if held.call is not None:  # replayed or refused: no approval asked for either
            return "replayed" if held.call[0] == value else "refused"
        if value == NEEDS_APPROVAL:
            if held.request is not None and held.request[2]:
                return "denied"
            if held.request is None or at >= held.request[1]:  # none yet, or lapsed
                expires = at + timedelta(seconds=REQUEST_TTL_S)
                held.request = (approval_id_for(intent_id), expires, False)
            held.book_at = at  # asked again while open: the same request answers
            return f"asked:{held.request[0]}"
        if held.request is not None:  # the key is its request's arguments': reused
            return "refused"
        held.call = (value, at)
        self.effects[key] += 1
        return "executed"

    def deny(self, key: str, at: datetime) -> tuple[str, str]:
        """The approval id the operator denies (the key's request, if any) and the answer."""
        held = self._key(key, at)
        if held.request is None:
            return "apr_none", "undecidable"
        approval_id, expires, denied = held.request
        if denied or at >= expires:
            return approval_id, "undecidable"
        held.request, held.book_at = (approval_id, expires, True), at
        return approval_id, "decided"


def _denial(key: str, approval_id: str, at: datetime) -> tuple[str, bytes]:
    digest = args_digest({"value": NEEDS_APPROVAL})
    call_key = str(CallKey("t", "op", key, "p"))
    target = ApprovalTarget(approval_id, "t", "op", key, digest, call_key=call_key)
    denial = deny(target, "op@t", "no", at)
    return denial.intent_id, encode(denial)


def _approval_answer(events: list[Event]) -> str:
    for event in events:
        if isinstance(event, ApprovalRequested):
            return f"asked:{event.approval_id}"
        if isinstance(event, ApprovalDenied):
            return "decided"
        if isinstance(event, ToolCallRejected):
            if event.error.code != ErrorCode.APPROVAL_INVALID:
                return "refused"
            refused_call = event.error.message.startswith("An operator denied this call")
            return "denied" if refused_call else "undecidable"
    return _answer(events)


APPROVAL_GROUP = st.tuples(
    st.sampled_from([0, 0, 40, 60, RETENTION_S]),
    st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from([0, 1, 1, "deny"])), max_size=5),
    st.booleans(),  # restart the executor after this group
    st.booleans(),  # give the sweeper time to expire keys on its own
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups=st.lists(APPROVAL_GROUP, min_size=1, max_size=8), cache=st.sampled_from([1, 4096]))
def test_keys_with_approval_requests_expire_as_the_model_says(
    groups: list[tuple[int, list[tuple[str, int | str]], bool, bool]], cache: int
) -> None:
    effects, clock, model = Effects(), LogClock(), ApprovalModel()

    def feed(key: str, op: int | str, at: datetime) -> tuple[str, str, bytes]:
        if op == "deny":
            approval_id, answer = model.deny(key, at)
            intent_id, record = _denial(key, approval_id, at)
            return intent_id, answer, record
        assert isinstance(op, int)
        intent_id = uuid.uuid4().hex
        return intent_id, model.call(intent_id, key, op, at), _intent(intent_id, key, op, at)

    stages = _stages(effects, clock, approvals=True)
    # one at a time: a denial follows the request it denies
    store, expected = _play(stages, clock, groups, cache, feed, one_at_a_time=True)
    assert _answers(store, expected, _approval_answer) == expected, (groups, cache)
    assert effects.count == model.effects
