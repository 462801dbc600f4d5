"""The pure core of call groups as a given/when/then table (processors/groups/core).

Each row: *given* the moves an orchestrator made (each one records events, the starts taken
from ``decide`` itself, as a real orchestrator would), *when* ``decide`` runs with a
``max_parallel``, *then* these actions, and this group status once their events are recorded.
Journeys below drive whole groups through a small synchronous runner.
"""

from __future__ import annotations

import ast
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import toolledger.processors.groups
from tests.unit.test_core_purity import impurities
from tests.unit.test_group_definition import body, parsed, ref, step
from toolledger.processors.groups import (
    Action,
    BlockedCall,
    CompensationFinished,
    CompensationStarted,
    FailCompensation,
    FailStep,
    FinishGroup,
    GroupDefinition,
    GroupEvent,
    GroupFinished,
    GroupResumed,
    GroupState,
    GroupStatus,
    GroupSubmitted,
    InvariantViolation,
    StartCompensation,
    StartStep,
    StepFinished,
    StepStarted,
    StepStatus,
    blocked_on,
    call_intent_id,
    compensation_key,
    decide,
    event_of,
    evolve,
    fold,
    in_flight,
    resumable,
    step_key,
    step_status,
)
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.status import CallStatus

GK = "grp-1"
WIDE_OPEN = 100

# ------------------------------------------------------------------------------ definitions

# a creates a ticket; b and c comment on it; d notifies once both comments are there
DIAMOND = parsed(
    body(
        step("a", "create_ticket", {"title": "Printer on fire"}),
        step("b", "add_comment", {"ticket_id": ref("a", "ticket_id"), "text": "on it"}),
        step("c", "add_comment", {"ticket_id": ref("a", "ticket_id"), "text": "parts"}),
        step("d", "notify", {"to": "ops", "ticket_ids": [ref("a", "ticket_id")]}, ["b", "c"]),
    )
)
DIAMOND_STOP = parsed({**DIAMOND.as_body(), "on_failure": "stop"})
WIDE = parsed(body(step("a"), step("b"), step("c"), step("d")))
CHAIN = parsed(
    body(
        step("a", "create_ticket", {"title": "x"}),
        step("b", "add_comment", {"ticket_id": ref("a", "ticket_id"), "text": "t"}),
        step("c", "notify", {"to": ref("b", "comment_id")}),
    )
)
CHARGE = parsed(
    body(
        step("a", "create_ticket", {"title": "x"}),
        step("b", "charge_card", {"ticket_id": ref("a", "ticket_id"), "amount_cents": 500}),
        step("c", "notify", {"to": "ops"}, ["b"]),
    )
)
BAD_PATH = parsed(
    body(
        step("a", "create_ticket", {"title": "x"}),
        step("b", "close_ticket", {"ticket_id": ref("a", "ticket.id")}),
    )
)
PAIR = parsed(
    body(
        step("a", "create_ticket", {"title": "x"}),
        step("b", "create_ticket", {"title": "y"}),
        step("c", "notify", {"to": "ops"}, ["a", "b"]),
    )
)
BAD_PATH_STOP = parsed({**BAD_PATH.as_body(), "on_failure": "stop"})
READ = parsed(body(step("a", "list_tickets"), step("b", "notify", {"to": ref("a", "0.id")})))


def result_of(step_id: str) -> dict[str, Any]:
    return {"ticket_id": f"T-{step_id}", "comment_id": f"C-{step_id}", "charge_id": f"X-{step_id}"}


ERROR = ErrorInfo.downstream(
    "REFUSED", "The downstream refused it.", retryable=False, suggested_action="Do not retry."
)
FLAKY = ErrorInfo.downstream(
    "UNAVAILABLE", "Briefly unavailable.", retryable=True, suggested_action="Retry."
)

# ---------------------------------------------------------------------- given: the moves

Move = Callable[[GroupState], list[GroupEvent]]


def _decided(state: GroupState, kind: type[Action], step_id: str | None = None) -> Action:
    for action in decide(state, WIDE_OPEN):
        if isinstance(action, kind) and getattr(action, "step_id", None) == step_id:
            return action
    raise AssertionError(f"decide offers no {kind.__name__} {step_id or ''}: {decide(state, 9)}")


def start(*ids: str) -> Move:
    return lambda st: [event_of(_decided(st, StartStep, i)) for i in ids]


def ok(step_id: str, result: Any = None) -> Move:
    raw = json.dumps(result_of(step_id) if result is None else result)
    return lambda _st: [StepFinished(step_id, StepStatus.SUCCEEDED, result_json=raw)]


def run(*ids: str) -> list[Move]:
    return [m for i in ids for m in (start(i), ok(i))]


def fail(step_id: str, *, retryable: bool = False) -> Move:
    status = StepStatus.FAILED_RETRYABLE if retryable else StepStatus.FAILED_FINAL
    return lambda _st: [StepFinished(step_id, status, error=FLAKY if retryable else ERROR)]


def unknown(step_id: str) -> Move:
    return lambda _st: [StepFinished(step_id, StepStatus.UNKNOWN, error=ERROR)]


def block(step_id: str, approval: str = "apr_1") -> Move:
    return lambda _st: [StepFinished(step_id, StepStatus.BLOCKED, approval_request_id=approval)]


def comp(*ids: str) -> Move:
    return lambda st: [event_of(_decided(st, StartCompensation, i)) for i in ids]


def comp_ok(step_id: str) -> Move:
    return lambda _st: [CompensationFinished(step_id, StepStatus.SUCCEEDED, result_json="{}")]


def comp_fail(step_id: str) -> Move:
    return lambda _st: [CompensationFinished(step_id, StepStatus.FAILED_FINAL, error=ERROR)]


def comp_block(step_id: str, approval: str = "apr_9") -> Move:
    return lambda _st: [
        CompensationFinished(step_id, StepStatus.BLOCKED, approval_request_id=approval)
    ]


def record_decided() -> Move:
    """Record every action ``decide`` gives (a FailStep, a FinishGroup, ...)."""
    return lambda st: [event_of(a) for a in decide(st, WIDE_OPEN)]


def finish() -> Move:
    return lambda st: [event_of(_decided(st, FinishGroup))]


def resume() -> Move:
    return lambda _st: [GroupResumed()]


def play(definition: GroupDefinition, moves: Sequence[Move]) -> tuple[GroupState, list[GroupEvent]]:
    log: list[GroupEvent] = [GroupSubmitted(GK, definition)]
    state = evolve(None, log[0])
    for move in moves:
        for event in move(state):
            log.append(event)
            state = evolve(state, event)
    return state, log


def summary(action: Action) -> str:
    if isinstance(action, StartStep):
        return f"start {action.step_id}" + (f" r{action.round}" if action.round > 1 else "")
    if isinstance(action, StartCompensation):
        again = f" r{action.round}" if action.round > 1 else ""
        return f"compensate {action.step_id} via {action.tool}{again}"
    if isinstance(action, FailStep):
        return f"fail {action.step_id}"
    if isinstance(action, FailCompensation):
        return f"fail-compensation {action.step_id}"
    return f"finish {action.status.value}"


# ------------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Row:
    name: str
    definition: GroupDefinition
    given: Sequence[Move]
    then: Sequence[str]
    status: GroupStatus  # after the then-actions' events are recorded
    max_parallel: int = WIDE_OPEN


# the middle of a compensated diamond: a done, b failed, c done
DIAMOND_B_FAILED = [*run("a"), start("b", "c"), fail("b"), ok("c")]
CHAIN_C_FAILED = [*run("a", "b"), start("c"), fail("c")]
# a's result has no ticket_id: its compensation (close_ticket) cannot be built
UNBUILDABLE = [start("a"), ok("a", {"no_ticket_id": True}), *run("b"), start("c"), fail("c")]
STOPPED = [*run("a"), start("b", "c"), fail("b", retryable=True), ok("c"), finish()]

ROWS: list[Row] = [
    # ---- a diamond runs in dependency order, independent steps together
    Row("diamond/only-the-root-first", DIAMOND, [], ["start a"], GroupStatus.RUNNING),
    Row(
        "diamond/both-branches-start-together",
        DIAMOND,
        run("a"),
        ["start b", "start c"],
        GroupStatus.RUNNING,
    ),
    Row(
        "diamond/the-join-waits-for-both-branches",
        DIAMOND,
        [*run("a", "b"), start("c")],
        [],
        GroupStatus.RUNNING,
    ),
    Row(
        "diamond/the-join-starts-after-both",
        DIAMOND,
        run("a", "b", "c"),
        ["start d"],
        GroupStatus.RUNNING,
    ),
    Row(
        "diamond/all-done-succeeds",
        DIAMOND,
        run("a", "b", "c", "d"),
        ["finish SUCCEEDED"],
        GroupStatus.SUCCEEDED,
    ),
    Row(
        "diamond/finished-decides-nothing",
        DIAMOND,
        [*run("a", "b", "c", "d"), finish()],
        [],
        GroupStatus.SUCCEEDED,
    ),
    # ---- the concurrency bound
    Row(
        "bound/one-branch-at-a-time",
        DIAMOND,
        run("a"),
        ["start b"],
        GroupStatus.RUNNING,
        max_parallel=1,
    ),
    Row("bound/none-while-full", WIDE, [start("a", "b")], [], GroupStatus.RUNNING, max_parallel=2),
    Row(
        "bound/fills-the-free-slots-in-listing-order",
        WIDE,
        [start("b")],
        ["start a", "start c"],
        GroupStatus.RUNNING,
        max_parallel=3,
    ),
    Row(
        "bound/a-finished-call-frees-its-slot",
        WIDE,
        [start("a", "b"), ok("a")],
        ["start c"],
        GroupStatus.RUNNING,
        max_parallel=2,
    ),
    Row(
        "bound/an-unknown-call-keeps-its-slot",
        WIDE,
        [start("a", "b"), unknown("a")],
        [],
        GroupStatus.RUNNING,
        max_parallel=2,
    ),
    # ---- UNKNOWN: not finished yet
    Row("unknown/the-dependent-waits", CHAIN, [start("a"), unknown("a")], [], GroupStatus.RUNNING),
    Row(
        "unknown/resolved-it-continues",
        CHAIN,
        [start("a"), unknown("a"), ok("a")],
        ["start b"],
        GroupStatus.RUNNING,
    ),
    # ---- failure with compensate: reverse dependency order, each once
    Row(
        "compensate/waits-for-the-call-in-flight",
        DIAMOND,
        [*run("a"), start("b", "c"), fail("b")],
        [],
        GroupStatus.COMPENSATING,
    ),
    Row(
        "compensate/the-dependent-first",
        DIAMOND,
        DIAMOND_B_FAILED,
        ["compensate c via delete_comment"],
        GroupStatus.COMPENSATING,
    ),
    Row(
        "compensate/not-the-root-before-its-dependent-is-undone",
        DIAMOND,
        [*DIAMOND_B_FAILED, comp("c")],
        [],
        GroupStatus.COMPENSATING,
    ),
    Row(
        "compensate/then-the-root",
        DIAMOND,
        [*DIAMOND_B_FAILED, comp("c"), comp_ok("c")],
        ["compensate a via close_ticket"],
        GroupStatus.COMPENSATING,
    ),
    Row(
        "compensate/done",
        DIAMOND,
        [*DIAMOND_B_FAILED, comp("c"), comp_ok("c"), comp("a"), comp_ok("a")],
        ["finish COMPENSATED"],
        GroupStatus.COMPENSATED,
    ),
    Row(
        "compensate/in-the-middle-of-a-chain",
        CHAIN,
        CHAIN_C_FAILED,
        ["compensate b via delete_comment"],
        GroupStatus.COMPENSATING,
    ),
    Row(
        "compensate/nothing-to-undo",
        CHAIN,
        [start("a"), fail("a")],
        ["finish COMPENSATED"],
        GroupStatus.COMPENSATED,
    ),
    Row(
        "compensate/a-retryable-failure-fails-the-group-too",
        CHAIN,
        [start("a"), fail("a", retryable=True)],
        ["finish COMPENSATED"],
        GroupStatus.COMPENSATED,
    ),
    Row(
        "compensate/independent-compensations-within-the-bound",
        PAIR,
        [*run("a", "b"), start("c"), fail("c")],
        ["compensate b via close_ticket"],
        GroupStatus.COMPENSATING,
        max_parallel=1,
    ),
    Row(
        "compensate/independent-compensations-together",
        PAIR,
        [*run("a", "b"), start("c"), fail("c")],
        ["compensate b via close_ticket", "compensate a via close_ticket"],
        GroupStatus.COMPENSATING,
        max_parallel=2,
    ),
    Row(
        "compensate/steps-without-compensation-are-left-done",
        WIDE,
        [*run("a", "b"), start("c"), fail("c")],
        ["finish COMPENSATED"],
        GroupStatus.COMPENSATED,
    ),
    # ---- NEEDS_ATTENTION
    Row(
        "attention/an-irreversible-step-is-left-done",
        CHARGE,
        [*run("a", "b"), start("c"), fail("c"), comp("a"), comp_ok("a")],
        ["finish NEEDS_ATTENTION"],
        GroupStatus.NEEDS_ATTENTION,
    ),
    Row(
        "attention/the-irreversible-dependent-does-not-hold-back-the-root",
        CHARGE,
        [*run("a", "b"), start("c"), fail("c")],
        ["compensate a via close_ticket"],
        GroupStatus.COMPENSATING,
    ),
    Row(
        "attention/a-failed-compensation-holds-back-the-steps-before",
        CHAIN,
        [*CHAIN_C_FAILED, comp("b"), comp_fail("b")],
        ["finish NEEDS_ATTENTION"],
        GroupStatus.NEEDS_ATTENTION,
    ),
    Row(
        "attention/a-compensation-that-cannot-be-built",
        PAIR,
        UNBUILDABLE,
        ["compensate b via close_ticket", "fail-compensation a"],
        GroupStatus.COMPENSATING,
        max_parallel=1,
    ),
    Row(
        "attention/after-the-unbuildable-compensation",
        PAIR,
        [*UNBUILDABLE, record_decided(), comp_ok("b")],
        ["finish NEEDS_ATTENTION"],
        GroupStatus.NEEDS_ATTENTION,
    ),
    # ---- a path missing at run time: the step fails without a call, and what follows from
    # that is decided with it (nothing else would wake the runner: no call is in flight)
    Row(
        "path/the-step-fails-without-a-call-and-compensation-follows",
        BAD_PATH,
        run("a"),
        ["fail b", "compensate a via close_ticket"],
        GroupStatus.COMPENSATING,
    ),
    Row(
        "path/then-the-group-ends-compensated",
        BAD_PATH,
        [*run("a"), record_decided(), comp_ok("a")],
        ["finish COMPENSATED"],
        GroupStatus.COMPENSATED,
    ),
    Row(
        "path/with-an-unbuildable-compensation-the-group-ends-at-once",
        BAD_PATH,
        [start("a"), ok("a", {"no_ticket_id": True})],
        ["fail b", "fail-compensation a", "finish NEEDS_ATTENTION"],
        GroupStatus.NEEDS_ATTENTION,
    ),
    Row(
        "path/a-stopped-group-ends-failed-at-once",
        BAD_PATH_STOP,
        run("a"),
        ["fail b", "finish FAILED"],
        GroupStatus.FAILED,
    ),
    Row(
        "path/a-resume-of-the-stopped-group-ends-failed-again",
        BAD_PATH_STOP,
        [*run("a"), record_decided(), resume()],
        ["finish FAILED"],
        GroupStatus.FAILED,
    ),
    Row(
        "path/resolved-arguments-are-validated",
        CHAIN,
        [*run("a"), start("b"), ok("b", {})],
        ["fail c", "fail-compensation b", "finish NEEDS_ATTENTION"],
        GroupStatus.NEEDS_ATTENTION,
    ),
    # ---- stop, then resume
    Row(
        "stop/waits-for-the-call-in-flight",
        DIAMOND_STOP,
        [*run("a"), start("b", "c"), fail("b", retryable=True)],
        [],
        GroupStatus.RUNNING,
    ),
    Row(
        "stop/ends-failed-leaving-completed-steps",
        DIAMOND_STOP,
        [*run("a"), start("b", "c"), fail("b", retryable=True), ok("c")],
        ["finish FAILED"],
        GroupStatus.FAILED,
    ),
    Row("stop/failed-decides-nothing", DIAMOND_STOP, STOPPED, [], GroupStatus.FAILED),
    Row(
        "stop/resume-runs-only-what-had-not-completed",
        DIAMOND_STOP,
        [*STOPPED, resume()],
        ["start b r2"],
        GroupStatus.RUNNING,
    ),
    Row(
        "stop/resume-then-the-rest",
        DIAMOND_STOP,
        [*STOPPED, resume(), start("b"), ok("b")],
        ["start d"],
        GroupStatus.RUNNING,
    ),
    Row(
        "stop/resume-of-a-final-failure-ends-failed-again",
        DIAMOND_STOP,
        [*run("a"), start("b", "c"), fail("b"), ok("c"), finish(), resume()],
        ["finish FAILED"],
        GroupStatus.FAILED,
    ),
    # ---- approval pauses, resume continues
    Row("approval/pauses-the-group", CHAIN, [start("a"), block("a")], [], GroupStatus.BLOCKED),
    Row(
        "approval/nothing-new-starts-while-paused",
        WIDE,
        [start("a", "b"), block("a"), ok("b")],
        [],
        GroupStatus.BLOCKED,
        max_parallel=2,
    ),
    Row(
        "approval/resume-gives-the-call-a-new-round",
        CHAIN,
        [start("a"), block("a"), resume()],
        ["start a r2"],
        GroupStatus.RUNNING,
    ),
    Row(
        "approval/resume-also-starts-the-rest",
        WIDE,
        [start("a", "b"), block("a"), ok("b"), resume()],
        ["start a r2", "start c", "start d"],
        GroupStatus.RUNNING,
    ),
    Row(
        "approval/resume-before-the-approval-blocks-again",
        CHAIN,
        [start("a"), block("a"), resume(), start("a"), block("a")],
        [],
        GroupStatus.BLOCKED,
    ),
    Row(
        "approval/a-blocked-step-of-a-failed-group-is-skipped",
        WIDE,
        [start("a", "b"), block("a"), fail("b")],
        ["finish COMPENSATED"],
        GroupStatus.COMPENSATED,
    ),
    Row(
        "approval/a-compensation-may-wait-for-approval",
        CHAIN,
        [*CHAIN_C_FAILED, comp("b"), comp_block("b")],
        [],
        GroupStatus.BLOCKED,
    ),
    Row(
        "approval/resume-continues-the-compensation",
        CHAIN,
        [*CHAIN_C_FAILED, comp("b"), comp_block("b"), resume()],
        ["compensate b via delete_comment r2"],
        GroupStatus.COMPENSATING,
    ),
    # ---- read-only steps
    Row(
        "read/unkeyed-steps-run-like-any-other",
        READ,
        [start("a"), ok("a", [{"id": "T-9"}])],
        ["start b"],
        GroupStatus.RUNNING,
    ),
]


def _given(row: Row) -> tuple[GroupState, list[GroupEvent]]:
    return play(row.definition, row.given)


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_group_table(row: Row) -> None:
    state, _ = _given(row)
    actions = decide(state, row.max_parallel)
    assert [summary(a) for a in actions] == list(row.then)
    for action in actions:
        state = evolve(state, event_of(action))
    assert state.status is row.status


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_deciding_twice_gives_the_same_actions(row: Row) -> None:
    state, log = _given(row)
    assert decide(state, row.max_parallel) == decide(state, row.max_parallel)
    rebuilt = fold(log)
    assert rebuilt == state  # a crash loses nothing the log has
    assert rebuilt is not None and decide(rebuilt, row.max_parallel) == decide(
        state, row.max_parallel
    )


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_a_recorded_action_is_never_decided_again(row: Row) -> None:
    state, _ = _given(row)
    first = decide(state, row.max_parallel)
    for action in first:
        state = evolve(state, event_of(action))
    again = decide(state, row.max_parallel)
    assert not set(map(summary, first)) & set(map(summary, again))


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_a_decision_leaves_nothing_to_decide_until_a_call_answers(row: Row) -> None:
    state, _ = _given(row)
    for action in decide(state, row.max_parallel):
        state = evolve(state, event_of(action))
    assert decide(state, row.max_parallel) == []
    if not in_flight(state):  # a runner waits on nothing: the group must not need it to
        assert state.status.is_terminal or resumable(state)


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_the_bound_holds(row: Row) -> None:
    state, _ = _given(row)
    before = len(in_flight(state))
    starts = [
        a for a in decide(state, row.max_parallel) if isinstance(a, StartStep | StartCompensation)
    ]
    assert len(starts) <= max(row.max_parallel - before, 0)


# ------------------------------------------------------------------------- actions' contents


def test_a_start_carries_the_resolved_arguments_and_the_derived_key() -> None:
    state, _ = play(DIAMOND, run("a", "b", "c"))
    (d,) = decide(state, WIDE_OPEN)
    assert isinstance(d, StartStep)
    assert d.arguments == {"to": "ops", "ticket_ids": ["T-a"]}
    assert d.idempotency_key == step_key(GK, "d") == "step:grp-1:step:d"
    assert d.key_suffix == "step:d"
    assert (d.round, d.intent_id) == (1, call_intent_id(GK, "step", "d", 1))
    assert d.approval_request_id is None


def test_a_compensation_carries_its_arguments_and_its_own_key() -> None:
    state, _ = play(DIAMOND, [*DIAMOND_B_FAILED, comp("c"), comp_ok("c")])
    (a,) = decide(state, WIDE_OPEN)
    assert isinstance(a, StartCompensation)
    assert (a.tool, a.arguments) == ("close_ticket", {"ticket_id": "T-a"})
    assert a.idempotency_key == compensation_key(GK, "a") == "step:grp-1:compensate:a"
    assert a.key_suffix == "compensate:a"
    assert a.intent_id == call_intent_id(GK, "compensate", "a", 1)


def test_a_read_only_step_has_no_idempotency_key() -> None:
    state, _ = play(READ, [])
    (a,) = decide(state, WIDE_OPEN)
    assert isinstance(a, StartStep) and a.idempotency_key is None


def test_a_new_round_after_approval_names_the_approval() -> None:
    state, _ = play(CHAIN, [start("a"), block("a", "apr_42"), resume()])
    (a,) = decide(state, WIDE_OPEN)
    assert isinstance(a, StartStep)
    assert (a.round, a.approval_request_id) == (2, "apr_42")
    assert a.idempotency_key == step_key(GK, "a")  # the same key: still at most once
    assert a.intent_id == call_intent_id(GK, "step", "a", 2)


def test_a_bad_path_fails_the_step_with_a_clear_error() -> None:
    state, _ = play(BAD_PATH, run("a"))
    failure, compensation = decide(state, WIDE_OPEN)
    assert isinstance(failure, FailStep)
    assert isinstance(compensation, StartCompensation) and compensation.step_id == "a"
    assert failure.error.code == ErrorCode.VALIDATION_FAILED.value
    assert "Step 'b'" in failure.error.message and "'ticket.id'" in failure.error.message
    assert "no key 'ticket'" in failure.error.message
    state = evolve(state, event_of(failure))
    assert state.failure is not None and state.failure.step_id == "b"
    assert step_status(state, "b") is StepStatus.FAILED_FINAL


def test_invalid_resolved_arguments_fail_the_step() -> None:
    state, _ = play(CHAIN, [*run("a"), start("b"), ok("b", {"comment_id": ""})])
    failure, _compensation = decide(state, WIDE_OPEN)
    assert isinstance(failure, FailStep)
    assert "to: String should have at least 1 character" in failure.error.message


# ----------------------------------------------------------------------- views of the state


def test_the_completion_point_of_an_irreversible_step() -> None:
    state, _ = play(CHARGE, [*run("a", "b"), start("c"), fail("c"), comp("a"), comp_ok("a")])
    (done,) = decide(state, WIDE_OPEN)
    assert isinstance(done, FinishGroup)
    point = done.completion_point
    assert point.succeeded == ("a", "b")
    assert point.compensated == ("a",)
    assert point.irreversible == ("b",)
    assert point.failed == ("c",)
    assert point.failure is not None and point.failure.step_id == "c"
    assert point.needs_attention


def test_the_completion_point_of_a_failed_compensation() -> None:
    state, _ = play(CHAIN, [*CHAIN_C_FAILED, comp("b"), comp_fail("b"), finish()])
    point = state.completion
    assert state.status is GroupStatus.NEEDS_ATTENTION and point is not None
    assert (point.compensation_failed, point.uncompensated) == (("b",), ("a",))


def test_the_completion_point_of_a_stopped_group() -> None:
    state, _ = play(DIAMOND_STOP, STOPPED)
    assert state.completion is not None
    assert state.completion.succeeded == ("a", "c")
    assert state.completion.failed == ("b",)
    assert state.completion.skipped == ("d",)
    assert state.completion.compensated == ()  # nothing is undone
    assert [step_status(state, s) for s in "abcd"] == [
        StepStatus.SUCCEEDED,
        StepStatus.FAILED_RETRYABLE,
        StepStatus.SUCCEEDED,
        StepStatus.SKIPPED,
    ]
    assert resumable(state)


def test_left_done_steps_are_listed_and_do_not_need_attention() -> None:
    state, _ = play(WIDE, [*run("a", "b"), start("c"), fail("c"), finish()])
    assert state.completion is not None
    assert state.completion.left_done == ("a", "b")
    assert state.completion.skipped == ("d",)
    assert not state.completion.needs_attention


def test_step_statuses_while_running() -> None:
    state, _ = play(DIAMOND, [*run("a"), start("b", "c"), unknown("c")])
    assert [step_status(state, s) for s in "abcd"] == [
        StepStatus.SUCCEEDED,
        StepStatus.PENDING,
        StepStatus.UNKNOWN,
        StepStatus.WAITING,
    ]
    assert StepStatus.of_call(CallStatus.FAILED_RETRYABLE) is StepStatus.FAILED_RETRYABLE


def test_blocked_on_lists_the_approvals_the_group_waits_for() -> None:
    state, _ = play(WIDE, [start("a", "b"), block("a", "apr_a"), block("b", "apr_b")])
    assert state.status is GroupStatus.BLOCKED and resumable(state)
    assert blocked_on(state) == (BlockedCall("a", False, "apr_a"), BlockedCall("b", False, "apr_b"))
    state, _ = play(CHAIN, [*CHAIN_C_FAILED, comp("b"), comp_block("b", "apr_c")])
    assert blocked_on(state) == (BlockedCall("b", True, "apr_c"),)


def test_in_flight_lists_the_calls_to_ask_the_ledger_about_after_a_crash() -> None:
    state, log = play(DIAMOND, [*run("a"), start("b", "c"), unknown("c")])
    rebuilt = fold(log)  # what a restarted orchestrator has
    assert rebuilt is not None and rebuilt == state
    calls = in_flight(rebuilt)
    started = {e.step_id: e for e in log if isinstance(e, StepStarted)}
    assert [(c.step_id, c.idempotency_key, c.round) for c in calls] == [
        ("b", step_key(GK, "b"), 1),
        ("c", step_key(GK, "c"), 1),
    ]
    assert [c.arguments_json for c in calls] == [
        started["b"].arguments_json,
        started["c"].arguments_json,
    ]
    assert all(c.intent_id == call_intent_id(GK, "step", c.step_id, 1) for c in calls)
    assert decide(rebuilt, WIDE_OPEN) == []  # nothing is started again


def test_in_flight_lists_compensations_too() -> None:
    state, _ = play(DIAMOND, [*DIAMOND_B_FAILED, comp("c")])
    (c,) = in_flight(state)
    assert isinstance(c, StartCompensation)
    assert (c.step_id, c.tool, c.arguments) == ("c", "delete_comment", {"comment_id": "C-c"})


# ------------------------------------------------------------------- impossible events raise

IMPOSSIBLE: list[tuple[str, GroupDefinition, list[Move], GroupEvent]] = [
    ("start-twice", CHAIN, [start("a")], StepStarted("a", 1, "{}")),
    ("start-a-skipped-round", CHAIN, [], StepStarted("a", 2, "{}")),
    ("start-before-a-dependency", CHAIN, [], StepStarted("b", 1, "{}")),
    ("start-while-failing", WIDE, [start("a"), fail("a")], StepStarted("b", 1, "{}")),
    ("start-an-unknown-step", CHAIN, [], StepStarted("zz", 1, "{}")),
    ("start-while-paused", WIDE, [start("a"), block("a")], StepStarted("b", 1, "{}")),
    ("report-a-call-not-started", CHAIN, [], StepFinished("a", StepStatus.SUCCEEDED, "{}")),
    ("report-a-finished-call", CHAIN, run("a"), StepFinished("a", StepStatus.SUCCEEDED, "{}")),
    ("report-waiting", CHAIN, [start("a")], StepFinished("a", StepStatus.WAITING)),
    ("report-skipped", CHAIN, [start("a")], StepFinished("a", StepStatus.SKIPPED)),
    ("blocked-without-an-approval", CHAIN, [start("a")], StepFinished("a", StepStatus.BLOCKED)),
    (
        "compensate-while-running",
        CHAIN,
        run("a"),
        CompensationStarted("a", 1, "close_ticket", "{}"),
    ),
    (
        "compensate-a-step-without-compensation",
        WIDE,
        [*run("a"), start("b"), fail("b")],
        CompensationStarted("a", 1, "x", "{}"),
    ),
    (
        "compensate-twice",
        CHAIN,
        [*CHAIN_C_FAILED, comp("b")],
        CompensationStarted("b", 1, "delete_comment", "{}"),
    ),
    (
        "compensate-in-stop-mode",
        DIAMOND_STOP,
        [*run("a"), start("b"), fail("b")],
        CompensationStarted("a", 1, "close_ticket", "{}"),
    ),
    ("resume-a-running-group", CHAIN, [start("a")], GroupResumed()),
    ("resume-a-compensated-group", CHAIN, [start("a"), fail("a"), finish()], GroupResumed()),
    (
        "anything-after-the-finish",
        CHAIN,
        [start("a"), fail("a"), finish()],
        StepStarted("b", 1, "{}"),
    ),
    ("submit-twice", CHAIN, [], GroupSubmitted(GK, CHAIN)),
]


@pytest.mark.parametrize(
    ("definition", "moves", "event"),
    [(d, m, e) for _, d, m, e in IMPOSSIBLE],
    ids=[name for name, *_ in IMPOSSIBLE],
)
def test_impossible_events_raise_invariant_violation(
    definition: GroupDefinition, moves: list[Move], event: GroupEvent
) -> None:
    state, _ = play(definition, moves)
    with pytest.raises(InvariantViolation):
        evolve(state, event)


def test_events_before_the_submission_and_an_empty_group_key_raise() -> None:
    with pytest.raises(InvariantViolation):
        evolve(None, GroupResumed())
    with pytest.raises(InvariantViolation):
        evolve(None, GroupSubmitted("", CHAIN))
    state, _ = play(CHAIN, [])
    with pytest.raises(InvariantViolation):
        evolve(state, GroupFinished(GroupStatus.RUNNING, state.completion))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_parallel"):
        decide(state, 0)


# ------------------------------------------------------------- journeys: a synchronous runner

Outcome = tuple[StepStatus, Any]  # status and result (or approval id for BLOCKED)


@dataclass
class Runner:
    """Executes actions at once and answers the oldest call first, from ``outcomes`` keyed by
    ("step" | "compensate", step id, round); unlisted calls succeed with ``result_of``."""

    definition: GroupDefinition
    max_parallel: int = WIDE_OPEN
    outcomes: Mapping[tuple[str, str, int], Outcome] = field(default_factory=dict)
    log: list[GroupEvent] = field(default_factory=list)
    batches: list[list[str]] = field(default_factory=list)
    peak: int = 0

    def __post_init__(self) -> None:
        self.log.append(GroupSubmitted(GK, self.definition))
        self.state = evolve(None, self.log[0])
        self.flying: list[StartStep | StartCompensation] = []

    def record(self, event: GroupEvent) -> None:
        self.log.append(event)
        self.state = evolve(self.state, event)

    def go(self) -> GroupState:
        while True:
            actions = decide(self.state, self.max_parallel)
            if actions:
                self.batches.append([summary(a) for a in actions])
            for action in actions:
                self.record(event_of(action))
                if isinstance(action, StartStep | StartCompensation):
                    self.flying.append(action)
            self.peak = max(self.peak, len(self.flying))
            if not self.flying:
                if not actions:
                    return self.state
                continue
            call = self.flying.pop(0)
            kind = "step" if isinstance(call, StartStep) else "compensate"
            status, value = self.outcomes.get(
                (kind, call.step_id, call.round), (StepStatus.SUCCEEDED, result_of(call.step_id))
            )
            report = StepFinished if isinstance(call, StartStep) else CompensationFinished
            if status is StepStatus.SUCCEEDED:
                self.record(report(call.step_id, status, result_json=json.dumps(value)))
            elif status is StepStatus.BLOCKED:
                self.record(report(call.step_id, status, approval_request_id=value))
            else:
                self.record(report(call.step_id, status, error=ERROR))

    def started(self, event_type: type[StepStarted | CompensationStarted]) -> list[str]:
        return [e.step_id for e in self.log if isinstance(e, event_type)]


def test_journey_a_diamond_runs_in_order_with_its_branches_together() -> None:
    runner = Runner(DIAMOND)
    assert runner.go().status is GroupStatus.SUCCEEDED
    assert runner.batches == [
        ["start a"],
        ["start b", "start c"],
        ["start d"],
        ["finish SUCCEEDED"],
    ]
    assert runner.peak == 2


def test_journey_the_bound_holds_on_a_wide_group() -> None:
    wide = parsed(body(*[step(f"s{i}") for i in range(7)]))
    runner = Runner(wide, max_parallel=3)
    assert runner.go().status is GroupStatus.SUCCEEDED
    assert runner.peak == 3
    assert sorted(runner.started(StepStarted)) == [f"s{i}" for i in range(7)]


def test_journey_a_failure_in_the_middle_compensates_in_reverse_order_exactly_once() -> None:
    five = parsed(
        body(
            step("a", "create_ticket", {"title": "x"}),
            step("b", "add_comment", {"ticket_id": ref("a", "ticket_id"), "text": "1"}),
            step("c", "add_comment", {"ticket_id": ref("a", "ticket_id"), "text": "2"}, ["b"]),
            step("d", "notify", {"to": "ops"}, ["c"]),
            step("e", "notify", {"to": "ops"}, ["d"]),
        )
    )
    runner = Runner(five, outcomes={("step", "d", 1): (StepStatus.FAILED_FINAL, None)})
    state = runner.go()
    assert state.status is GroupStatus.COMPENSATED
    assert runner.started(StepStarted) == ["a", "b", "c", "d"]  # e never runs
    assert runner.started(CompensationStarted) == ["c", "b", "a"]
    assert step_status(state, "e") is StepStatus.SKIPPED
    assert state.completion is not None and state.completion.compensated == ("a", "b", "c")


def test_journey_stop_then_resume_runs_only_what_had_not_completed() -> None:
    runner = Runner(DIAMOND_STOP, outcomes={("step", "b", 1): (StepStatus.FAILED_RETRYABLE, None)})
    assert runner.go().status is GroupStatus.FAILED
    runner.record(GroupResumed())
    assert runner.go().status is GroupStatus.SUCCEEDED
    assert runner.started(StepStarted) == ["a", "b", "c", "b", "d"]
    assert runner.started(CompensationStarted) == []


def test_journey_approval_pauses_then_resume_continues() -> None:
    runner = Runner(CHAIN, outcomes={("step", "b", 1): (StepStatus.BLOCKED, "apr_7")})
    state = runner.go()
    assert state.status is GroupStatus.BLOCKED
    assert blocked_on(state) == (BlockedCall("b", False, "apr_7"),)
    assert runner.started(StepStarted) == ["a", "b"]
    runner.record(GroupResumed())
    assert runner.go().status is GroupStatus.SUCCEEDED
    assert runner.started(StepStarted) == ["a", "b", "b", "c"]


def test_journey_a_denied_approval_fails_and_compensates() -> None:
    runner = Runner(
        CHAIN,
        outcomes={
            ("step", "b", 1): (StepStatus.BLOCKED, "apr_7"),
            ("step", "b", 2): (StepStatus.FAILED_FINAL, None),
        },
    )
    runner.go()
    runner.record(GroupResumed())
    assert runner.go().status is GroupStatus.COMPENSATED
    assert runner.started(CompensationStarted) == ["a"]


def test_journey_an_irreversible_step_needs_attention() -> None:
    runner = Runner(CHARGE, outcomes={("step", "c", 1): (StepStatus.FAILED_FINAL, None)})
    state = runner.go()
    assert state.status is GroupStatus.NEEDS_ATTENTION
    assert state.completion is not None and state.completion.irreversible == ("b",)
    assert runner.started(CompensationStarted) == ["a"]


def test_journey_a_compensation_failure_needs_attention() -> None:
    runner = Runner(
        CHAIN,
        outcomes={
            ("step", "c", 1): (StepStatus.FAILED_FINAL, None),
            ("compensate", "b", 1): (StepStatus.FAILED_FINAL, None),
        },
    )
    state = runner.go()
    assert state.status is GroupStatus.NEEDS_ATTENTION
    assert runner.started(CompensationStarted) == ["b"]  # a stays: b's undo failed


def test_journey_a_bad_path_at_run_time_fails_the_step_and_compensates() -> None:
    runner = Runner(BAD_PATH)
    state = runner.go()
    assert state.status is GroupStatus.COMPENSATED
    assert runner.started(StepStarted) == ["a"]  # b never reached the ledger
    assert runner.started(CompensationStarted) == ["a"]
    assert state.failure is not None and "ticket.id" in (state.failure.error or ERROR).message


# ---------------------------------------------------------------------------------- purity

GROUPS_DIR = Path(toolledger.processors.groups.__file__).resolve().parent
ALLOWED_ROOTS = frozenset({"pydantic"})
ALLOWED_PACKAGES = (
    "toolledger.schemas",
    "toolledger.processors.groups",
    "toolledger.processors.ledger",
)


def foreign_imports(source: str, filename: str = "<string>") -> list[str]:
    """Imports of anything but the stdlib, pydantic, schemas, processors.groups/.ledger."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append(f"{filename}:{node.lineno}: relative import")
                continue
            names = [node.module or ""]
        else:
            continue
        for name in names:
            root = name.split(".")[0]
            if root == "__future__" or root in sys.stdlib_module_names or root in ALLOWED_ROOTS:
                continue
            if any(name == p or name.startswith(p + ".") for p in ALLOWED_PACKAGES):
                continue
            found.append(f"{filename}:{node.lineno}: import {name}")
    return found


def _group_files() -> list[Path]:
    return sorted(GROUPS_DIR.glob("*.py"))


def test_the_groups_package_has_its_modules() -> None:
    assert {"__init__.py", "core.py", "definition.py", "facts.py"} <= {
        p.name for p in _group_files()
    }


@pytest.mark.parametrize("path", _group_files(), ids=lambda p: p.name)
def test_groups_module_imports_only_pure_packages(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert foreign_imports(source, str(path)) == []
    assert impurities(source, str(path)) == []  # no clock, randomness, I/O (the ledger's rule)


@pytest.mark.parametrize(
    "snippet",
    [
        "import httpx",
        "from toolledger.processors.tools.registry import ToolRegistry",
        "import toolledger.processors.runtime",
        "from schemas.errors import ErrorInfo",
        "from . import core",
        "from aiokafka import x",
        "import toolledger",
    ],
)
def test_the_import_check_catches_foreign_imports(snippet: str) -> None:
    assert foreign_imports(snippet) != []


def test_the_import_check_accepts_allowed_imports() -> None:
    ok_source = (
        "from __future__ import annotations\nimport json\nfrom hashlib import sha256\n"
        "from pydantic import BaseModel\nfrom toolledger.schemas.errors import ErrorInfo\n"
        "from toolledger.processors.ledger.decide import InvariantViolation\n"
        "import toolledger.processors.groups.core\n"
    )
    assert foreign_imports(ok_source) == []
