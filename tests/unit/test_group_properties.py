"""Hypothesis properties of the call-group core (processors/groups/core).

An orchestrator is simulated around ``decide``/``evolve``. It runs random DAGs of steps with
random references and tools, under a random concurrency bound, against a simulated ledger.
The ledger runs a key's call at most once, dedupes a round by its intent id, and has random
outcomes: success, retryable or final failure, UNKNOWN later resolved by reconcile, approvals
granted, denied or still pending, and results missing the fields a reference or a
compensation needs. The orchestrator also crashes at random points: it drops its in-memory
state and the calls it was waiting for, folds the recorded events again, asks the ledger
about the calls :func:`in_flight` lists, and decides again.

Properties: no step or compensation round is ever started twice; nothing is started after it
succeeded; a compensation starts only after every dependent's compensation succeeded; the
ledger runs each key's effect at most once; the bound holds; and every group ends in a
terminal status that matches what happened.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.test_group_definition import TOOLS, body, parsed, ref, step
from toolledger.processors.groups import (
    Compensation,
    CompensationFinished,
    CompensationStarted,
    GroupDefinition,
    GroupEvent,
    GroupResumed,
    GroupState,
    GroupStatus,
    GroupSubmitted,
    OnFailure,
    StartCompensation,
    StartStep,
    StepFinished,
    StepStarted,
    StepStatus,
    StepTool,
    ToolFacts,
    compensation_key,
    decide,
    event_of,
    evolve,
    fold,
    in_flight,
    resumable,
    step_key,
)
from toolledger.schemas.errors import ErrorInfo

GK = "grp-prop"
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _refund(_arguments: Mapping[str, Any], result: Any) -> Mapping[str, Any]:
    return {"charge_id": result["charge_id"]}


PROPERTY_TOOLS: dict[str, StepTool] = {
    **TOOLS,
    # irreversible, but with a compensation: it is compensated like any other
    "refundable_charge": ToolFacts(irreversible=True, compensation=Compensation("refund", _refund)),
}
TOOL_NAMES = sorted(PROPERTY_TOOLS)
PATHS = ["ticket_id", "ticket_id", "comment_id", "charge_id"]

# ------------------------------------------------------------------------------ random groups


@dataclass(frozen=True)
class Scenario:
    definition: GroupDefinition
    max_parallel: int
    approvals: frozenset[str]  # call keys whose first round waits for an approval
    seed: random.Random


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    n = draw(st.integers(1, 7))
    steps: list[dict[str, Any]] = []
    for i in range(n):
        earlier = [f"s{j}" for j in range(i)]
        deps = draw(st.lists(st.sampled_from(earlier), max_size=3, unique=True)) if earlier else []
        tool = draw(st.sampled_from(TOOL_NAMES))
        explicit = draw(st.lists(st.sampled_from(deps), unique=True)) if deps else []
        arguments = _arguments(draw, tool, deps)
        # every drawn dependency is kept: explicit, or implied by a reference
        referenced = {v["$from"] for v in _refs(arguments)}
        depends_on = sorted(set(explicit) | (set(deps) - referenced))
        steps.append(step(f"s{i}", tool, arguments, depends_on))
    on_failure = draw(st.sampled_from(["compensate", "stop"]))
    definition = parsed(body(*steps, on_failure=on_failure), PROPERTY_TOOLS)
    keys = [step_key(GK, f"s{i}") for i in range(n)]
    keys += [compensation_key(GK, f"s{i}") for i in range(n)]
    approvals = frozenset(draw(st.lists(st.sampled_from(keys), max_size=3)))
    return Scenario(
        definition, draw(st.integers(1, 3)), approvals, random.Random(draw(st.integers(0, 2**32)))
    )


def _arguments(draw: st.DrawFn, tool: str, deps: list[str]) -> dict[str, Any]:
    """Valid literal arguments for ``tool``, each string field maybe a reference to a dep."""

    def value(literal: str) -> Any:
        if not deps or not draw(st.booleans()):
            return literal
        return ref(draw(st.sampled_from(deps)), draw(st.sampled_from(PATHS)))

    if tool == "create_ticket":
        return {"title": value("t")}
    if tool == "add_comment":
        return {"ticket_id": value("T"), "text": value("x")}
    if tool == "notify":
        return {"to": value("ops"), "ticket_ids": [value("T"), value("U")]}
    if tool == "charge_card":
        return {"ticket_id": value("T"), "amount_cents": 5}
    if tool == "refundable_charge":
        return {"anything": value("x")}
    if tool == "close_ticket":
        return {"ticket_id": value("T")}
    return {}  # list_tickets


def _refs(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        return [value] if "$from" in value else [r for v in value.values() for r in _refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in _refs(v)]
    return []


# ----------------------------------------------------------------------- the simulated ledger

S = StepStatus
ERROR = ErrorInfo.downstream("E", "failed", retryable=False, suggested_action="Do not retry.")


@dataclass
class LedgerCall:
    status: StepStatus | None = None  # None: the key has no call state yet
    intents: set[str] = field(default_factory=set)
    executions: int = 0  # execution rounds the downstream saw
    effects: int = 0  # of which took effect
    resolves_to: StepStatus | None = None  # what reconcile finds for an UNKNOWN call
    told_unknown: bool = False
    result: Any = None
    approval: str | None = None
    asked_approval: bool = False


@dataclass
class Ledger:
    rng: random.Random
    approvals: frozenset[str]
    calls: dict[str, LedgerCall] = field(default_factory=dict)

    @staticmethod
    def key(action: StartStep | StartCompensation) -> str:
        return action.idempotency_key or action.intent_id  # a read: every round its own call

    def submit(self, action: StartStep | StartCompensation) -> None:
        call = self.calls.setdefault(self.key(action), LedgerCall())
        if action.intent_id in call.intents:
            return  # this round already reached the ledger
        call.intents.add(action.intent_id)
        if call.status in (S.SUCCEEDED, S.FAILED_FINAL, S.UNKNOWN):
            return  # replayed, or still being reconciled: nothing runs
        if self.key(action) in self.approvals:
            if not call.asked_approval:
                call.asked_approval = True
                call.status, call.approval = S.BLOCKED, f"apr-{len(call.intents)}"
                return
            verdict = self.rng.choice(["granted", "granted", "denied", "pending"])
            if verdict == "pending":
                call.status = S.BLOCKED
                return
            if verdict == "denied":
                call.status = S.FAILED_FINAL
                return
        call.executions += 1
        outcome = self.rng.choice(
            [S.SUCCEEDED, S.SUCCEEDED, S.SUCCEEDED, S.FAILED_RETRYABLE, S.FAILED_FINAL, S.UNKNOWN]
        )
        if outcome is S.FAILED_RETRYABLE and call.executions >= 3:
            outcome = S.FAILED_FINAL  # the ledger's round cap
        if outcome is S.UNKNOWN:
            call.resolves_to = self.rng.choice([S.SUCCEEDED, S.FAILED_FINAL, S.FAILED_RETRYABLE])
            call.told_unknown = False
        if S.SUCCEEDED in (outcome, call.resolves_to if outcome is S.UNKNOWN else None):
            call.effects += 1
            n = len(self.calls)
            call.result = (
                {"oops": True}
                if self.rng.random() < 0.1
                else {"ticket_id": f"T{n}", "comment_id": f"C{n}", "charge_id": f"X{n}"}
            )
        call.status = outcome

    def answer(self, action: StartStep | StartCompensation) -> GroupEvent:
        call = self.calls[self.key(action)]
        if call.status is S.UNKNOWN:
            if call.told_unknown:  # reconciled since
                assert call.resolves_to is not None
                call.status, call.resolves_to = call.resolves_to, None
            else:
                call.told_unknown = True
        assert call.status is not None
        status = call.status
        report = StepFinished if isinstance(action, StartStep) else CompensationFinished
        if status is S.SUCCEEDED:
            return report(action.step_id, status, result_json=json.dumps(call.result))
        if status is S.BLOCKED:
            return report(action.step_id, status, approval_request_id=call.approval)
        return report(action.step_id, status, error=ERROR)


# ---------------------------------------------------------------------- the orchestrator


class Crash(Exception):
    pass


@dataclass
class Orchestrator:
    scenario: Scenario
    log: list[GroupEvent] = field(default_factory=list)
    crashes: int = 0

    def __post_init__(self) -> None:
        self.rng = self.scenario.seed
        self.ledger = Ledger(self.rng, self.scenario.approvals)
        self.definition = self.scenario.definition
        self.log.append(GroupSubmitted(GK, self.definition))
        self.state: GroupState = evolve(None, self.log[0])
        self.waiting: list[StartStep | StartCompensation] = []
        # what the checks remember across crashes (they are the world, not the orchestrator)
        self.started: Counter[tuple[str, str, int]] = Counter()
        self.succeeded: set[str] = set()
        self.compensated: set[str] = set()

    def maybe_crash(self, p: float = 0.04) -> None:
        if self.rng.random() < p:
            raise Crash

    def record(self, event: GroupEvent) -> None:
        self.log.append(event)
        self.state = evolve(self.state, event)

    def recover(self) -> None:
        self.crashes += 1
        rebuilt = fold(self.log)
        assert rebuilt == self.state  # the log holds everything the lost state knew
        assert rebuilt is not None
        self.state = rebuilt
        self.waiting = list(in_flight(rebuilt))
        for call in self.waiting:  # ask the ledger again: the key (and intent id) dedupe it
            self.ledger.submit(call)

    def execute(self, actions: list[Any]) -> None:
        for action in actions:
            self.maybe_crash()
            self.check_action(action)
            self.record(event_of(action))
            if isinstance(action, StartStep | StartCompensation):
                self.maybe_crash()
                self.ledger.submit(action)
                self.waiting.append(action)
        assert len(in_flight(self.state)) <= self.scenario.max_parallel

    def check_action(self, action: Any) -> None:
        if isinstance(action, StartStep):
            assert action.step_id not in self.succeeded, "a step started after it succeeded"
            assert self.state.status is not GroupStatus.BLOCKED, "a paused group started a step"
            self.started[("step", action.step_id, action.round)] += 1
            assert self.started[("step", action.step_id, action.round)] == 1, action
        elif isinstance(action, StartCompensation):
            assert action.step_id in self.succeeded
            assert action.step_id not in self.compensated, "compensated twice"
            self.started[("compensate", action.step_id, action.round)] += 1
            assert self.started[("compensate", action.step_id, action.round)] == 1, action
            for d in self.definition.dependents(action.step_id):
                facts = self.definition.step(d).facts
                if d in self.succeeded and facts.compensation is not None:
                    assert d in self.compensated, f"{action.step_id} undone before {d}"

    def answer_one(self) -> None:
        call = self.waiting[self.rng.randrange(len(self.waiting))]
        event = self.ledger.answer(call)
        self.maybe_crash()  # the answer is lost; the ledger keeps it
        self.record(event)
        assert isinstance(event, StepFinished | CompensationFinished)
        if event.status is S.SUCCEEDED:
            (self.succeeded if isinstance(event, StepFinished) else self.compensated).add(
                call.step_id
            )
        if not event.status.in_flight:
            self.waiting.remove(call)

    def run(self) -> GroupState:
        resumes_of_failed = 2
        for _ in range(5000):
            try:
                if self.rng.random() < 0.03:
                    raise Crash
                actions = decide(self.state, self.scenario.max_parallel)
                assert actions == decide(self.state, self.scenario.max_parallel)
                if actions and (not self.waiting or self.rng.random() < 0.6):
                    self.execute(actions)
                elif self.waiting:
                    self.answer_one()
                elif resumable(self.state) and self.state.status is GroupStatus.BLOCKED:
                    self.record(GroupResumed())  # an operator decided the approval
                elif self.state.finished is GroupStatus.FAILED and resumes_of_failed > 0:
                    resumes_of_failed -= 1
                    self.record(GroupResumed())
                else:
                    assert not actions
                    return self.state
            except Crash:
                self.recover()
        raise AssertionError(f"no end after 5000 moves: {self.state.status}")


# ------------------------------------------------------------------------------ properties


@SETTINGS
@given(scenarios())
def test_random_groups_with_crashes_never_start_anything_twice_and_always_finish(
    scenario: Scenario,
) -> None:
    orchestrator = Orchestrator(scenario)
    state = orchestrator.run()
    d = scenario.definition

    # a terminal status, nothing left in flight, nothing left to decide, even after a crash
    assert state.finished is not None and state.finished.is_terminal
    assert in_flight(state) == ()
    rebuilt = fold(orchestrator.log)
    assert rebuilt == state and rebuilt is not None and decide(rebuilt, 1) == []

    # the recorded starts: one per round, never after success
    starts = Counter((e.step_id, e.round) for e in orchestrator.log if isinstance(e, StepStarted))
    assert set(starts.values()) <= {1}
    comp_starts = Counter(
        (e.step_id, e.round) for e in orchestrator.log if isinstance(e, CompensationStarted)
    )
    assert set(comp_starts.values()) <= {1}

    # the ledger ran every key's effect at most once, and only in rounds the group started
    ledger = orchestrator.ledger
    for sid in d.order:
        rounds = sum(1 for (s, _r) in starts if s == sid)
        facts = d.step(sid).facts
        if facts.keyed:
            call = ledger.calls.get(step_key(GK, sid))
            if call is not None:
                assert call.effects <= 1
                assert call.executions <= rounds
        comp = ledger.calls.get(compensation_key(GK, sid))
        if comp is not None:
            assert comp.effects <= 1

    # the status matches what happened
    succeeded = {s for s in d.order if state.step(s).call.status is S.SUCCEEDED}
    compensated = {s for s in d.order if state.step(s).compensation.status is S.SUCCEEDED}
    point = state.completion
    assert point is not None
    assert set(point.succeeded) == succeeded
    if state.finished is GroupStatus.SUCCEEDED:
        assert succeeded == set(d.order) and not comp_starts
    elif d.on_failure is OnFailure.STOP:
        assert state.finished is GroupStatus.FAILED and not comp_starts
        assert point.failed
    else:
        assert state.finished in (GroupStatus.COMPENSATED, GroupStatus.NEEDS_ATTENTION)
        undoable = {s for s in succeeded if d.step(s).facts.compensation is not None}
        assert compensated <= undoable
        irreversible_left = {
            s
            for s in succeeded - undoable
            if d.step(s).facts.irreversible and d.step(s).facts.keyed
        }
        if state.finished is GroupStatus.COMPENSATED:
            assert compensated == undoable and not irreversible_left
        else:
            assert compensated != undoable or irreversible_left
        for s in compensated:  # only what really took effect is undone
            call = ledger.calls[step_key(GK, s)] if d.step(s).facts.keyed else None
            assert call is None or call.effects == 1


def test_the_simulation_exercises_crashes_failures_and_approvals() -> None:
    """The property above is only as good as the runs: check a fixed batch covers the ground."""
    seen: Counter[str] = Counter()
    for n in range(60):
        steps = [step("s0", "create_ticket", {"title": "t"})]
        steps += [
            step(f"s{i}", "add_comment", {"ticket_id": ref("s0", "ticket_id"), "text": "x"})
            if i % 2
            else step(f"s{i}", "notify", {"to": "ops"}, [f"s{i - 1}"])
            for i in range(1, 4)
        ]
        on_failure = "stop" if n % 3 == 0 else "compensate"
        definition = parsed(body(*steps, on_failure=on_failure), PROPERTY_TOOLS)
        approvals = frozenset({step_key(GK, "s1")} if n % 4 == 0 else set())
        orchestrator = Orchestrator(Scenario(definition, 2, approvals, random.Random(n)))
        state = orchestrator.run()
        seen[state.status.value] += 1
        seen["crashed"] += orchestrator.crashes > 0
        seen["resumed"] += any(isinstance(e, GroupResumed) for e in orchestrator.log)
        seen["compensated a step"] += any(
            isinstance(e, CompensationStarted) for e in orchestrator.log
        )
    for outcome in (
        "SUCCEEDED",
        "FAILED",
        "COMPENSATED",
        "crashed",
        "resumed",
        "compensated a step",
    ):
        assert seen[outcome] > 0, (outcome, seen)
