"""Hypothesis properties of the pure core (docs/architecture.md#tests).

A simulated executor drives ``decide``/``evolve`` through random interleavings of intents for a
few call keys, with random handler outcomes, reconcile answers and crashes, against a model of
the downstream system that counts real side effects. The handler "runs" exactly when ``decide``
returns an ``Execute`` action; nothing else in the simulation may run it.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolledger.processors.ledger import (
    AttemptFinished,
    AttemptOutcome,
    CallContext,
    CallState,
    Execute,
    Failure,
    Found,
    FoundFailed,
    Inconclusive,
    NotHappened,
    Policy,
    Reconcile,
    ReconcileFinished,
    ReconcileOutcome,
    Recover,
    Submit,
    Success,
    Sweep,
    TimedOut,
    Verdict,
    decide,
    evolve,
    fold,
    fold_all,
)
from toolledger.schemas.canonical import args_digest, canonical_json
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.events import (
    Event,
    FailureDisposition,
    Resolution,
    ToolCallFailed,
    ToolCallReconciled,
    ToolCallRejected,
    ToolCallReplayed,
    ToolCallStarted,
)
from toolledger.schemas.keys import CallKey
from toolledger.schemas.status import CallStatus

KEYS = 3
T0 = datetime(2025, 3, 1, tzinfo=UTC)
REFUSED = ErrorInfo.downstream(
    "REFUSED",
    "The downstream refused this write.",
    retryable=False,
    suggested_action="Do not retry this call.",
)
UNAVAILABLE = ErrorInfo.downstream(
    "UNAVAILABLE",
    "Briefly unavailable.",
    retryable=True,
    suggested_action="Retry with the same key.",
)

HandlerOutcome = Literal[
    "success",
    "retryable",
    "final",
    "timeout_after_effect",
    "timeout_before_effect",
    "timeout_after_refusal",
]


# ----------------------------------------------------------------------------- operations


@dataclass(frozen=True)
class SubmitOp:
    key: int
    variant: int  # which arguments: different variants have different digests


@dataclass(frozen=True)
class FinishOp:
    key: int
    outcome: HandlerOutcome


@dataclass(frozen=True)
class ReconcileOp:
    key: int
    inconclusive: bool


@dataclass(frozen=True)
class SweepOp:
    key: int


@dataclass(frozen=True)
class CrashOp:
    """The executor dies; handlers in flight did (True) or did not do their effect first."""

    effect_before_crash: tuple[bool, ...]


Op = SubmitOp | FinishOp | ReconcileOp | SweepOp | CrashOp

keys = st.integers(0, KEYS - 1)


def ops(conflict_weight: int = 1) -> st.SearchStrategy[list[Op]]:
    variants = st.sampled_from([0] * 4 + [1] * conflict_weight + [2] * conflict_weight)
    outcomes = st.sampled_from(
        (
            "success",
            "success",
            "retryable",
            "retryable",
            "retryable",
            "final",
            "timeout_after_effect",
            "timeout_before_effect",
            "timeout_after_refusal",
        )
    )
    submit = st.builds(SubmitOp, keys, variants)
    finish = st.builds(FinishOp, keys, outcomes)
    reconcile = st.builds(ReconcileOp, keys, st.sampled_from([False, False, True]))
    sweep = st.builds(SweepOp, keys)
    crash = st.builds(CrashOp, st.tuples(*[st.booleans()] * KEYS))
    by_kind: dict[str, st.SearchStrategy[Op]] = {
        "submit": submit,
        "finish": finish,
        "reconcile": reconcile,
        "sweep": sweep,
        "crash": crash,
    }
    # weights by repetition: crashes are rarer than the rest
    kinds = ["submit"] * 6 + ["finish"] * 6 + ["reconcile"] * 4 + ["sweep"] * 2 + ["crash"]
    op = st.sampled_from(kinds).flatmap(by_kind.__getitem__)
    return st.lists(op, min_size=30, max_size=120)


policies = st.lists(
    st.builds(
        Policy,
        max_attempts=st.integers(1, 3),
        max_rounds=st.integers(1, 3),
        has_reconcile=st.sampled_from([True, True, True, False]),
    ),
    min_size=KEYS,
    max_size=KEYS,
)


# ----------------------------------------------------------------------- the simulation


@dataclass
class KeyModel:
    """One call key: the ledger's view (state, events) and the downstream's truth."""

    index: int
    policy: Policy
    call_key: str
    state: CallState | None = None
    events: list[Event] = field(default_factory=list)
    first_submitted_digest: str | None = None
    # the downstream system
    effects: int = 0
    downstream_result: str | None = None
    refusal: ErrorInfo | None = None
    # the runtime
    executing: tuple[CallContext, Execute] | None = None
    reconciling: tuple[CallContext, bool] | None = None
    handler_runs: int = 0
    licences: int = 0  # known failures / NOT_HAPPENED answers that allow another execution
    succeeded_seen: bool = False
    replays: int = 0
    rejections: Counter[str] = field(default_factory=Counter)


class Simulation:
    def __init__(self, policies: list[Policy]) -> None:
        self.models = [
            KeyModel(i, p, str(CallKey("tenant", "flaky_write", f"key-{i}")))
            for i, p in enumerate(policies)
        ]
        self.log: list[Event] = []
        self.clock = 0
        self.intents = 0

    # -- helpers ---------------------------------------------------------------------------

    def now(self) -> datetime:
        self.clock += 1
        return T0 + timedelta(seconds=self.clock)

    @staticmethod
    def digest(key: int, variant: int) -> str:
        return args_digest({"key": key, "payload": f"variant-{variant}"})

    def context(self, m: KeyModel, variant: int) -> CallContext:
        self.intents += 1
        return CallContext(
            call_key=m.call_key,
            tenant_id="tenant",
            tool="flaky_write",
            tool_version="1",
            idempotency_key=f"key-{m.index}",
            args_digest=self.digest(m.index, variant),
            intent_id=f"intent-{self.intents}",
        )

    @staticmethod
    def redacted(ctx: CallContext) -> str:
        return canonical_json({"digest": ctx.args_digest})

    # -- applying a decision ---------------------------------------------------------------

    def record(
        self, m: KeyModel, decision: Verdict, ctx: CallContext | None, by_intent: bool
    ) -> None:
        before = m.state
        for event in decision.events:
            assert event.call_key == m.call_key
            if isinstance(event, ToolCallReplayed):
                self.check_replay(m, before, event)
            if isinstance(event, ToolCallRejected):
                m.rejections[event.error.code] += 1
                assert evolve(m.state, event) is m.state
            if isinstance(event, ToolCallStarted):
                assert event.envelope.args_digest == m.first_submitted_digest
            if (
                isinstance(event, ToolCallFailed)
                and event.disposition is not FailureDisposition.FINAL
            ):
                m.licences += 1
            if (
                isinstance(event, ToolCallReconciled)
                and event.resolution is Resolution.NOT_HAPPENED
            ):
                m.licences += 1
            m.state = evolve(m.state, event)
            m.events.append(event)
            self.log.append(event)

        if m.state is not None:
            # (c) the first accepted digest of a key never changes
            assert m.state.args_digest == m.first_submitted_digest
            status = m.state.status
            if status is CallStatus.SUCCEEDED:
                m.succeeded_seen = True
                assert m.effects == 1, "the ledger says SUCCEEDED but the downstream has no effect"
                assert m.state.result_json == m.downstream_result
            if status in (CallStatus.FAILED_FINAL, CallStatus.FAILED_RETRYABLE):
                assert m.effects == 0, f"the ledger says {status} but the effect happened"
            if m.succeeded_seen:
                assert status is CallStatus.SUCCEEDED

        action = decision.action
        if isinstance(action, Execute):
            assert ctx is not None and m.state is not None
            assert not m.succeeded_seen, "a SUCCEEDED key executed again"
            assert m.executing is None, "two executions of one key at once"
            assert m.state.status is CallStatus.PENDING
            assert action.attempt == m.state.attempts
            assert action.round_attempt == m.state.round_attempts
            m.handler_runs += 1
            assert m.handler_runs <= 1 + m.licences, "re-executed without a known failure"
            m.executing = (ctx, action)
        elif isinstance(action, Reconcile):
            assert ctx is not None and m.state is not None
            assert m.policy.has_reconcile and m.state.status is CallStatus.UNKNOWN
            assert action.reconcile_attempt == m.state.reconcile_attempts + 1
            if m.reconciling is None or by_intent:
                m.reconciling = (ctx, by_intent)
        # the core property: at most one effect per call key, whatever happened
        assert m.effects <= 1, f"{m.call_key} has {m.effects} effects downstream"

    def check_replay(self, m: KeyModel, before: CallState | None, event: ToolCallReplayed) -> None:
        """Every Replayed carries the stored outcome."""
        assert before is not None
        m.replays += 1
        assert event.status is before.status
        assert event.original_intent_id == before.context.intent_id
        assert event.attempts == before.attempts
        assert event.result_json == before.result_json
        if before.status is CallStatus.SUCCEEDED:
            assert event.result_json == m.downstream_result and event.error is None
        elif before.status is CallStatus.FAILED_FINAL:
            assert event.error == before.error and event.error is not None
        else:
            assert before.status is CallStatus.UNKNOWN and not m.policy.has_reconcile
            assert event.error is not None
            assert event.error.code == ErrorCode.OUTCOME_UNKNOWN.value

    # -- operations ------------------------------------------------------------------------

    def submit(self, op: SubmitOp) -> None:
        m = self.models[op.key]
        ctx = self.context(m, op.variant)
        if m.first_submitted_digest is None:
            m.first_submitted_digest = ctx.args_digest
        before = m.state
        decision = decide(
            before,
            Submit(
                context=ctx,
                arguments_redacted_json=self.redacted(ctx),
                policy=m.policy,
                now=self.now(),
                epoch=1,
            ),
        )
        if before is None:
            assert [type(e) for e in decision.events] == [ToolCallStarted]
        elif ctx.args_digest != m.first_submitted_digest:
            # a conflicting digest is always rejected, whatever the state
            assert len(decision.events) == 1 and decision.action is None
            rejected = decision.events[0]
            assert isinstance(rejected, ToolCallRejected)
            assert rejected.error.code == ErrorCode.IDEMPOTENCY_KEY_REUSED.value
        elif before.status is CallStatus.PENDING:
            assert len(decision.events) == 1 and decision.action is None
            rejected = decision.events[0]
            assert isinstance(rejected, ToolCallRejected)
            assert rejected.error.code == ErrorCode.IDEMPOTENCY_KEY_IN_USE.value
        self.record(m, decision, ctx, by_intent=True)

    def finish(self, op: FinishOp) -> None:
        m = self.models[op.key]
        if m.executing is None:
            return
        ctx, execute = m.executing
        m.executing = None
        outcome: AttemptOutcome
        if op.outcome in ("success", "timeout_after_effect"):
            m.effects += 1
            m.downstream_result = canonical_json({"write_id": f"W-{m.index}-{execute.attempt}"})
            outcome = (
                Success(m.downstream_result) if op.outcome == "success" else TimedOut("no answer")
            )
        elif op.outcome == "retryable":
            outcome = Failure(UNAVAILABLE)
        elif op.outcome == "final":
            m.refusal = REFUSED
            outcome = Failure(REFUSED)
        elif op.outcome == "timeout_after_refusal":
            m.refusal = REFUSED
            outcome = TimedOut("no answer")
        else:
            outcome = TimedOut("no answer")
        decision = decide(
            m.state,
            AttemptFinished(
                context=ctx,
                attempt=execute.attempt,
                outcome=outcome,
                duration_ms=3,
                arguments_redacted_json=self.redacted(ctx),
                policy=m.policy,
                now=self.now(),
                epoch=1,
            ),
        )
        self.record(m, decision, ctx, by_intent=True)

    def reconcile(self, op: ReconcileOp) -> None:
        m = self.models[op.key]
        if m.reconciling is None:
            return
        ctx, by_intent = m.reconciling
        m.reconciling = None
        assert m.state is not None and m.state.status is CallStatus.UNKNOWN
        # the reconcile query tells the truth (or cannot tell)
        outcome: ReconcileOutcome
        if op.inconclusive:
            outcome = Inconclusive("the downstream did not answer")
        elif m.effects:
            assert m.downstream_result is not None
            outcome = Found(m.downstream_result)
        elif m.refusal is not None:
            outcome = FoundFailed(m.refusal)
        else:
            outcome = NotHappened()
        decision = decide(
            m.state,
            ReconcileFinished(
                context=ctx,
                outcome=outcome,
                by_intent=by_intent,
                arguments_redacted_json=self.redacted(ctx),
                policy=m.policy,
                now=self.now(),
                epoch=1,
            ),
        )
        self.record(m, decision, ctx, by_intent)

    def sweep(self, op: SweepOp) -> None:
        m = self.models[op.key]
        decision = decide(m.state, Sweep(policy=m.policy, now=self.now()))
        assert decision.events == ()
        self.record(m, decision, m.state.context if m.state else None, by_intent=False)

    def crash(self, op: CrashOp) -> None:
        now = self.now()
        for m, effect in zip(self.models, op.effect_before_crash, strict=True):
            if m.executing is not None and effect:
                m.effects += 1
                m.downstream_result = canonical_json({"write_id": f"W-{m.index}-crash"})
            m.executing = None
            m.reconciling = None
            was_pending = m.state is not None and m.state.status is CallStatus.PENDING
            decision = decide(m.state, Recover(now=now))
            assert decision.action is None
            assert len(decision.events) == (1 if was_pending else 0)
            self.record(m, decision, None, by_intent=False)
            if was_pending:
                assert m.state is not None and m.state.status is CallStatus.UNKNOWN

    def run(self, operations: list[Op]) -> None:
        for op in operations:
            if isinstance(op, SubmitOp):
                self.submit(op)
            elif isinstance(op, FinishOp):
                self.finish(op)
            elif isinstance(op, ReconcileOp):
                self.reconcile(op)
            elif isinstance(op, SweepOp):
                self.sweep(op)
            else:
                self.crash(op)


# ----------------------------------------------------------------------------- properties

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(policies=policies, operations=ops())
def test_any_interleaving_executes_each_call_key_at_most_once(
    policies: list[Policy], operations: list[Op]
) -> None:
    sim = Simulation(policies)
    sim.run(operations)
    for m in sim.models:
        assert m.effects <= 1
        # the live state is the fold of the key's events
        assert fold(m.events) == m.state


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies=policies, operations=ops(), data=st.data())
def test_fold_is_deterministic_and_fold_all_equals_per_key_folds(
    policies: list[Policy], operations: list[Op], data: st.DataObject
) -> None:
    sim = Simulation(policies)
    sim.run(operations)
    per_key = {m.call_key: m.events for m in sim.models}

    # folding the same list twice gives equal states
    for events in per_key.values():
        assert fold(events) == fold(list(events))
        assert fold(events) == fold(events[len(events) // 2 :], fold(events[: len(events) // 2]))

    expected = {
        key: state for key, events in per_key.items() if (state := fold(events)) is not None
    }
    # the interleaving the simulation produced
    assert fold_all(sim.log) == expected
    # and any other interleaving that keeps each key's order
    tags = [key for key, events in per_key.items() for _ in events]
    order = data.draw(st.permutations(tags), label="interleaving")
    queues = {key: list(reversed(events)) for key, events in per_key.items()}
    interleaved = [queues[key].pop() for key in order]
    assert fold_all(interleaved) == expected
    assert fold_all(interleaved) == fold_all(interleaved)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies=policies, operations=ops(conflict_weight=4))
def test_the_first_accepted_digest_never_changes(
    policies: list[Policy], operations: list[Op]
) -> None:
    sim = Simulation(policies)
    sim.run(operations)  # record() checks it after every step; check the log as well
    for m in sim.models:
        started = [e for e in m.events if isinstance(e, ToolCallStarted)]
        if not started:
            assert m.state is None
            continue
        first = started[0].envelope.args_digest
        assert first == m.first_submitted_digest
        assert all(e.envelope.args_digest == first for e in started)
        assert m.state is not None and m.state.args_digest == first
        submitted_conflicts = sum(
            1
            for op in operations
            if isinstance(op, SubmitOp)
            and op.key == m.index
            and Simulation.digest(m.index, op.variant) != first
        )
        assert m.rejections[ErrorCode.IDEMPOTENCY_KEY_REUSED.value] == submitted_conflicts


def test_the_simulation_can_see_a_double_execution() -> None:
    """The model is not vacuous: an executor that re-runs an UNKNOWN key blind is caught."""
    sim = Simulation([Policy(has_reconcile=True)] * KEYS)
    sim.run([SubmitOp(0, 0), FinishOp(0, "timeout_after_effect")])
    m = sim.models[0]
    assert m.state is not None and m.state.status is CallStatus.UNKNOWN and m.effects == 1
    # a broken runtime ignores the state and runs the handler again with a success
    m.effects += 1
    try:
        sim.record(m, Verdict(), None, by_intent=False)
    except AssertionError as exc:
        assert "2 effects" in str(exc)
    else:  # pragma: no cover - the check above must fire
        raise AssertionError("the simulation did not notice a second effect")


def test_the_simulation_reaches_every_path() -> None:
    """Guard against a vacuous model: seeded random runs reach every outcome of the core."""
    rng = random.Random(20250301)
    kinds = ["submit"] * 6 + ["finish"] * 6 + ["reconcile"] * 4 + ["sweep"] * 2 + ["crash"]
    outcomes: list[HandlerOutcome] = [
        "success",
        "retryable",
        "retryable",
        "final",
        "timeout_after_effect",
        "timeout_before_effect",
        "timeout_after_refusal",
    ]
    seen: set[str] = set()
    for _ in range(150):
        sim = Simulation(
            [Policy(rng.randint(1, 3), rng.randint(1, 3), rng.random() < 0.75) for _ in range(KEYS)]
        )
        operations: list[Op] = []
        for _ in range(60):
            kind, key = rng.choice(kinds), rng.randrange(KEYS)
            operations.append(
                SubmitOp(key, rng.choice([0, 0, 0, 0, 1, 2]))
                if kind == "submit"
                else FinishOp(key, rng.choice(outcomes))
                if kind == "finish"
                else ReconcileOp(key, rng.random() < 0.3)
                if kind == "reconcile"
                else SweepOp(key)
                if kind == "sweep"
                else CrashOp(tuple(rng.random() < 0.5 for _ in range(KEYS)))
            )
        sim.run(operations)
        for e in sim.log:
            detail = (
                e.disposition
                if isinstance(e, ToolCallFailed)
                else e.resolution
                if isinstance(e, ToolCallReconciled)
                else e.status
                if isinstance(e, ToolCallReplayed)
                else e.error.code
                if isinstance(e, ToolCallRejected)
                else ""
            )
            seen.add(f"{type(e).__name__}:{detail}")
        seen |= {"re-executed" for m in sim.models if m.handler_runs > 1}
        seen |= {"round-2" for e in sim.log if isinstance(e, ToolCallStarted) and e.round > 1}
    expected = {
        "ToolCallStarted:",
        "ToolCallSucceeded:",
        "ToolCallOutcomeUnknown:",
        *(f"ToolCallFailed:{d}" for d in FailureDisposition),
        *(f"ToolCallReconciled:{r}" for r in Resolution),
        *(
            f"ToolCallReplayed:{s}"
            for s in (CallStatus.SUCCEEDED, CallStatus.FAILED_FINAL, CallStatus.UNKNOWN)
        ),
        f"ToolCallRejected:{ErrorCode.IDEMPOTENCY_KEY_REUSED}",
        f"ToolCallRejected:{ErrorCode.IDEMPOTENCY_KEY_IN_USE}",
        "re-executed",
        "round-2",
    }
    assert expected <= seen, sorted(expected - seen)
