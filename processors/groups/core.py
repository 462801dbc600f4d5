"""The pure core of call groups: ``evolve`` folds the events an orchestrator records into a
:class:`GroupState`; ``decide`` says, from a state alone, what to do next.

Every step is an ordinary ledgered call under a key derived from the group key and the step
id (:func:`~processors.groups.definition.step_key`), every compensation too
(:func:`~processors.groups.definition.compensation_key`). ``decide`` is deterministic and
idempotent: the same state gives the same actions, and a step (or compensation) whose start
was recorded is never started again; only a resume gives a retryable or blocked call a new
round, under the same key. An orchestrator records the event of each action
(:func:`event_of`) *before* it executes it, so one that crashes, folds its events again and
decides again repeats nothing; the calls it had in flight are listed by :func:`in_flight`.

Rules where the issue text is silent (see also the module docs of ``definition``):

* A blocked step (its call waits for approval) pauses the group: nothing new starts, the
  calls in flight finish and are recorded. ``GroupResumed`` gives the blocked calls a new
  round (the runner presents the approval's token). A compensation may be blocked too: the
  group is BLOCKED while compensating, and a resume continues the compensation.
* A step failure is a step whose call ends FAILED_RETRYABLE or FAILED_FINAL (the ledger's
  own retries and rounds are spent), or a reference that does not resolve / resolved
  arguments that fail validation (FAILED_FINAL, no call made). From then on nothing new
  starts. The calls in flight (PENDING, UNKNOWN) are waited for: an UNKNOWN call is "not
  finished yet", and a step that turns out to have succeeded is compensated like any other.
* ``compensate``: every succeeded step whose tool declares a compensation is compensated
  once every succeeded step depending on it (directly or not) is settled: not in flight, and
  compensated if it has a compensation. A failed compensation therefore also leaves the steps
  it depends on uncompensated (they are reported). The group ends COMPENSATED when every
  compensation succeeded, even when succeeded steps without a compensation that are not
  irreversible are left done (they are listed as ``left_done``); it ends NEEDS_ATTENTION when a
  compensation failed (or could not be built), a step stayed uncompensated, or an irreversible
  step without a compensation had completed. A ``compensate`` group never ends FAILED.
* ``stop``: once the calls in flight are done the group ends FAILED; nothing is undone and
  irreversible steps do not make it NEEDS_ATTENTION (it stays resumable). A resume gives
  FAILED_RETRYABLE and blocked steps a new round and runs the steps not yet run; a group
  with a FAILED_FINAL step ends FAILED again at once, running nothing.
* A compensation that ends FAILED_RETRYABLE counts as failed (the ledger spent its retries).
* Read-only (unkeyed) steps get no idempotency key, no compensation and are never
  irreversible; being reads, a runner may repeat one it lost track of.
* ``max_parallel`` bounds the calls in flight, steps and compensations together.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from toolledger.processors.groups.definition import (
    GroupDefinition,
    OnFailure,
    ReferenceFailure,
    Step,
    call_intent_id,
    compensation_key,
    resolve_arguments,
    step_key,
)
from toolledger.processors.ledger.decide import InvariantViolation
from toolledger.schemas.canonical import CanonicalJsonError, canonical_json
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.status import CallStatus

__all__ = [
    "Action",
    "BlockedCall",
    "CallRecord",
    "CompensationFinished",
    "CompensationStarted",
    "CompletionPoint",
    "FailCompensation",
    "FailStep",
    "FinishGroup",
    "GroupEvent",
    "GroupFinished",
    "GroupResumed",
    "GroupState",
    "GroupStatus",
    "GroupSubmitted",
    "InvariantViolation",
    "StartCompensation",
    "StartStep",
    "StepFailure",
    "StepFinished",
    "StepStarted",
    "StepState",
    "StepStatus",
    "blocked_on",
    "completion_point",
    "decide",
    "event_of",
    "evolve",
    "fold",
    "in_flight",
    "resumable",
    "step_status",
]


class GroupStatus(StrEnum):
    RUNNING = "RUNNING"
    BLOCKED = "BLOCKED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    COMPENSATING = "COMPENSATING"
    COMPENSATED = "COMPENSATED"
    NEEDS_ATTENTION = "NEEDS_ATTENTION"

    @property
    def is_terminal(self) -> bool:
        """Finished: only a resume (of a FAILED group) changes it."""
        return self in _TERMINAL


_TERMINAL = frozenset(
    {
        GroupStatus.SUCCEEDED,
        GroupStatus.FAILED,
        GroupStatus.COMPENSATED,
        GroupStatus.NEEDS_ATTENTION,
    }
)


class StepStatus(StrEnum):
    """A step's (or compensation's) call status, or WAITING (not started in this round),
    BLOCKED (its call waits for an approval) or SKIPPED (never ran: the group failed)."""

    WAITING = "WAITING"
    BLOCKED = "BLOCKED"
    PENDING = "PENDING"
    SUCCEEDED = "SUCCEEDED"
    FAILED_RETRYABLE = "FAILED_RETRYABLE"
    FAILED_FINAL = "FAILED_FINAL"
    UNKNOWN = "UNKNOWN"
    SKIPPED = "SKIPPED"

    @classmethod
    def of_call(cls, status: CallStatus) -> StepStatus:
        return cls(status.value)

    @property
    def in_flight(self) -> bool:
        return self in (StepStatus.PENDING, StepStatus.UNKNOWN)

    @property
    def failed(self) -> bool:
        return self in (StepStatus.FAILED_RETRYABLE, StepStatus.FAILED_FINAL)


# what a runner may report about a call it started
_REPORTABLE = frozenset(
    {
        StepStatus.PENDING,
        StepStatus.UNKNOWN,
        StepStatus.SUCCEEDED,
        StepStatus.FAILED_RETRYABLE,
        StepStatus.FAILED_FINAL,
        StepStatus.BLOCKED,
    }
)

# -- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupSubmitted:
    group_key: str  # the group's idempotency key: step and compensation keys derive from it
    definition: GroupDefinition


@dataclass(frozen=True, slots=True)
class StepStarted:
    """Recorded before the step's call is submitted to the ledger."""

    step_id: str
    round: int
    arguments_json: str  # the resolved arguments, canonical JSON


@dataclass(frozen=True, slots=True)
class StepFinished:
    """What the ledger answered for the step's current call. PENDING and UNKNOWN are progress
    notes (the call stays in flight); BLOCKED carries the approval request's id. A FAILED_FINAL
    for a step that never started records a :class:`FailStep`."""

    step_id: str
    status: StepStatus
    result_json: str | None = None
    error: ErrorInfo | None = None
    approval_request_id: str | None = None


@dataclass(frozen=True, slots=True)
class CompensationStarted:
    step_id: str
    round: int
    tool: str
    arguments_json: str


@dataclass(frozen=True, slots=True)
class CompensationFinished:
    step_id: str
    status: StepStatus
    result_json: str | None = None
    error: ErrorInfo | None = None
    approval_request_id: str | None = None


@dataclass(frozen=True, slots=True)
class GroupResumed:
    """A caller asked to continue a BLOCKED or FAILED group (see :func:`resumable`)."""


@dataclass(frozen=True, slots=True)
class StepFailure:
    """The first step failure of the group: what made it fail."""

    step_id: str
    status: StepStatus
    error: ErrorInfo | None


@dataclass(frozen=True, slots=True)
class CompletionPoint:
    """Where a finished group stands; step ids in topological order.

    ``compensated``, ``left_done``, ``irreversible``, ``compensation_failed`` and
    ``uncompensated`` are filled for a ``compensate`` group that failed, and partition its
    ``succeeded`` steps."""

    succeeded: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    compensated: tuple[str, ...] = ()
    left_done: tuple[str, ...] = ()  # no compensation declared, not irreversible
    irreversible: tuple[str, ...] = ()  # irreversible, no compensation declared
    compensation_failed: tuple[str, ...] = ()
    uncompensated: tuple[str, ...] = ()  # not tried: a dependent's compensation failed
    failure: StepFailure | None = None

    @property
    def needs_attention(self) -> bool:
        return bool(self.irreversible or self.compensation_failed or self.uncompensated)


@dataclass(frozen=True, slots=True)
class GroupFinished:
    status: GroupStatus
    completion_point: CompletionPoint


GroupEvent = (
    GroupSubmitted
    | StepStarted
    | StepFinished
    | CompensationStarted
    | CompensationFinished
    | GroupResumed
    | GroupFinished
)

# -- actions -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartStep:
    """Submit the step's call: ``tool`` with ``arguments`` under ``idempotency_key`` (None: a
    read-only tool), using ``intent_id`` as the ledger intent id. ``approval_request_id``: the
    approval an earlier round waited for, whose token the call must present."""

    step_id: str
    tool: str
    arguments_json: str
    idempotency_key: str | None
    key_suffix: str  # "step:<id>", as derived from the group key
    round: int
    intent_id: str
    approval_request_id: str | None = None

    @property
    def arguments(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.arguments_json)
        return value


@dataclass(frozen=True, slots=True)
class StartCompensation:
    step_id: str
    tool: str
    arguments_json: str
    idempotency_key: str
    key_suffix: str  # "compensate:<id>"
    round: int
    intent_id: str
    approval_request_id: str | None = None

    @property
    def arguments(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.arguments_json)
        return value


@dataclass(frozen=True, slots=True)
class FailStep:
    """The step cannot start (a reference does not resolve, or the resolved arguments are
    invalid): record it as FAILED_FINAL; no call is made."""

    step_id: str
    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class FailCompensation:
    """The compensating call cannot be built: record it as failed; no call is made."""

    step_id: str
    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class FinishGroup:
    status: GroupStatus
    completion_point: CompletionPoint


Action = StartStep | StartCompensation | FailStep | FailCompensation | FinishGroup

# -- state ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallRecord:
    """The group's view of one step's (or compensation's) call, latest round."""

    status: StepStatus = StepStatus.WAITING
    round: int = 0  # rounds started
    arguments_json: str | None = None
    result_json: str | None = None
    error: ErrorInfo | None = None
    approval_request_id: str | None = None

    @property
    def started(self) -> bool:
        return self.status is not StepStatus.WAITING


@dataclass(frozen=True, slots=True)
class StepState:
    step_id: str
    call: CallRecord = field(default_factory=CallRecord)
    compensation: CallRecord = field(default_factory=CallRecord)


@dataclass(frozen=True, slots=True)
class GroupState:
    definition: GroupDefinition
    group_key: str
    steps: tuple[StepState, ...]  # in the definition's listing order
    failure: StepFailure | None = None
    finished: GroupStatus | None = None
    completion: CompletionPoint | None = None
    resumes: int = 0

    def step(self, step_id: str) -> StepState:
        return self.steps[self.definition.step(step_id).index]

    @property
    def status(self) -> GroupStatus:
        if self.finished is not None:
            return self.finished
        if self.failure is not None:
            if self.definition.on_failure is OnFailure.STOP:
                return GroupStatus.RUNNING  # the calls in flight finish, then FAILED
            if any(s.compensation.status is StepStatus.BLOCKED for s in self.steps):
                return GroupStatus.BLOCKED
            return GroupStatus.COMPENSATING
        if any(s.call.status is StepStatus.BLOCKED for s in self.steps):
            return GroupStatus.BLOCKED
        return GroupStatus.RUNNING

    def _with(self, step: StepState) -> GroupState:
        i = self.definition.step(step.step_id).index
        return replace(self, steps=(*self.steps[:i], step, *self.steps[i + 1 :]))


# -- evolve --------------------------------------------------------------------------------------


def evolve(state: GroupState | None, event: GroupEvent) -> GroupState:
    """Apply one recorded event; an event that cannot happen in ``state`` raises
    :class:`InvariantViolation` (a bug in the orchestrator, not a caller's error)."""
    if isinstance(event, GroupSubmitted):
        if state is not None:
            raise InvariantViolation("the group was already submitted")
        if not event.group_key:
            raise InvariantViolation("a group needs a non-empty group key")
        steps = tuple(StepState(s.id) for s in event.definition.steps)
        return GroupState(event.definition, event.group_key, steps)
    if state is None:
        raise InvariantViolation(f"{type(event).__name__} before GroupSubmitted")
    if isinstance(event, GroupResumed):
        return _resumed(state)
    if state.finished is not None:
        raise InvariantViolation(f"{type(event).__name__} after the group finished")
    if isinstance(event, StepStarted):
        return _step_started(state, event)
    if isinstance(event, StepFinished):
        return _step_finished(state, event)
    if isinstance(event, CompensationStarted):
        return _compensation_started(state, event)
    if isinstance(event, CompensationFinished):
        return _compensation_finished(state, event)
    if not event.status.is_terminal:
        raise InvariantViolation(f"a group cannot finish {event.status.value}")
    return replace(state, finished=event.status, completion=event.completion_point)


def fold(events: Iterable[GroupEvent], state: GroupState | None = None) -> GroupState | None:
    for event in events:
        state = evolve(state, event)
    return state


def _known(state: GroupState, step_id: str) -> StepState:
    try:
        return state.step(step_id)
    except KeyError:
        raise InvariantViolation(f"there is no step {step_id!r} in the group") from None


def _step_started(state: GroupState, event: StepStarted) -> GroupState:
    s = _known(state, event.step_id)
    if state.failure is not None or s.call.status is not StepStatus.WAITING:
        raise InvariantViolation(f"step {event.step_id!r} cannot start now")
    if any(other.call.status is StepStatus.BLOCKED for other in state.steps):
        raise InvariantViolation(f"step {event.step_id!r} cannot start: the group is paused")
    if event.round != s.call.round + 1:
        raise InvariantViolation(f"step {event.step_id!r} round {event.round} after {s.call.round}")
    for dep in state.definition.step(event.step_id).depends_on:
        if state.step(dep).call.status is not StepStatus.SUCCEEDED:
            raise InvariantViolation(f"step {event.step_id!r} started before {dep!r} succeeded")
    call = replace(
        s.call, status=StepStatus.PENDING, round=event.round, arguments_json=event.arguments_json
    )
    return state._with(replace(s, call=call))


def _reported(
    record: CallRecord,
    status: StepStatus,
    result: str | None,
    error: ErrorInfo | None,
    approval: str | None,
    what: str,
) -> CallRecord:
    if status not in _REPORTABLE:
        raise InvariantViolation(f"{what} cannot be reported {status.value}")
    if record.status.in_flight:
        pass
    elif record.status is StepStatus.WAITING and status is StepStatus.FAILED_FINAL:
        pass  # failed before its call could be made
    else:
        raise InvariantViolation(f"{what} is {record.status.value}: nothing to report")
    if status is StepStatus.BLOCKED and not approval:
        raise InvariantViolation(f"{what} is blocked without an approval request id")
    return replace(
        record,
        status=status,
        result_json=result if status is StepStatus.SUCCEEDED else None,
        error=None if status is StepStatus.SUCCEEDED else error,
        approval_request_id=approval or record.approval_request_id,
    )


def _step_finished(state: GroupState, event: StepFinished) -> GroupState:
    s = _known(state, event.step_id)
    call = _reported(
        s.call,
        event.status,
        event.result_json,
        event.error,
        event.approval_request_id,
        f"step {event.step_id!r}",
    )
    after = state._with(replace(s, call=call))
    if call.status.failed and state.failure is None:
        after = replace(after, failure=StepFailure(event.step_id, call.status, call.error))
    return after


def _compensation_started(state: GroupState, event: CompensationStarted) -> GroupState:
    s = _known(state, event.step_id)
    spec = state.definition.step(event.step_id).facts.compensation
    if (
        state.failure is None
        or state.definition.on_failure is not OnFailure.COMPENSATE
        or s.call.status is not StepStatus.SUCCEEDED
        or spec is None
        or s.compensation.status is not StepStatus.WAITING
        or event.round != s.compensation.round + 1
    ):
        raise InvariantViolation(f"step {event.step_id!r} cannot be compensated now")
    comp = replace(
        s.compensation,
        status=StepStatus.PENDING,
        round=event.round,
        arguments_json=event.arguments_json,
    )
    return state._with(replace(s, compensation=comp))


def _compensation_finished(state: GroupState, event: CompensationFinished) -> GroupState:
    s = _known(state, event.step_id)
    if state.failure is None or s.call.status is not StepStatus.SUCCEEDED:
        raise InvariantViolation(f"step {event.step_id!r} has no compensation to finish")
    comp = _reported(
        s.compensation,
        event.status,
        event.result_json,
        event.error,
        event.approval_request_id,
        f"the compensation of step {event.step_id!r}",
    )
    return state._with(replace(s, compensation=comp))


def resumable(state: GroupState) -> bool:
    """A resume is accepted: the group is BLOCKED, or it stopped FAILED."""
    return state.status is GroupStatus.BLOCKED or state.finished is GroupStatus.FAILED


def _resumed(state: GroupState) -> GroupState:
    if not resumable(state):
        raise InvariantViolation(f"a {state.status.value} group cannot be resumed")
    waiting = StepStatus.WAITING
    if state.finished is GroupStatus.FAILED:
        final = [
            sid
            for sid in state.definition.order
            if state.step(sid).call.status is StepStatus.FAILED_FINAL
        ]
        if final:  # nothing can make it succeed: it ends FAILED again, running nothing
            s = state.step(final[0])
            failure = StepFailure(s.step_id, StepStatus.FAILED_FINAL, s.call.error)
            return replace(
                state, finished=None, completion=None, failure=failure, resumes=state.resumes + 1
            )
        again = (StepStatus.FAILED_RETRYABLE, StepStatus.BLOCKED)
        steps = tuple(
            replace(s, call=replace(s.call, status=waiting)) if s.call.status in again else s
            for s in state.steps
        )
        return replace(
            state,
            steps=steps,
            finished=None,
            completion=None,
            failure=None,
            resumes=state.resumes + 1,
        )
    if state.failure is None:  # blocked steps get a new round
        steps = tuple(
            replace(s, call=replace(s.call, status=waiting))
            if s.call.status is StepStatus.BLOCKED
            else s
            for s in state.steps
        )
    else:  # blocked compensations get a new round
        steps = tuple(
            replace(s, compensation=replace(s.compensation, status=waiting))
            if s.compensation.status is StepStatus.BLOCKED
            else s
            for s in state.steps
        )
    return replace(state, steps=steps, resumes=state.resumes + 1)


# -- decide --------------------------------------------------------------------------------------


def decide(state: GroupState, max_parallel: int) -> list[Action]:
    """What to do next, given only ``state``: deterministic, and never an action whose event
    is already recorded. At most ``max_parallel`` calls are in flight once the starts are.

    The decision is complete: an action that makes no call (:class:`FailStep`,
    :class:`FailCompensation`) is followed by what its event leads to (the compensations, the
    end of the group), so once the actions' events are recorded nothing is left to decide
    until a call answers or the group is resumed. A runner that waits for its calls' answers
    therefore never waits on a group with none in flight."""
    if max_parallel < 1:
        raise ValueError("max_parallel must be >= 1")
    actions: list[Action] = []
    while True:
        decided = _decide_once(state, max_parallel)
        actions += decided
        if not any(isinstance(a, FailStep | FailCompensation) for a in decided):
            return actions
        for action in decided:  # each fails a step or compensation for good: this ends
            state = evolve(state, event_of(action))


def _decide_once(state: GroupState, max_parallel: int) -> list[Action]:
    if state.finished is not None:
        return []
    if state.failure is None:
        return _decide_running(state, max_parallel)
    if state.definition.on_failure is OnFailure.STOP:
        if any(s.call.status.in_flight for s in state.steps):
            return []
        return [FinishGroup(GroupStatus.FAILED, completion_point(state))]
    return _decide_compensating(state, max_parallel)


def _in_flight_count(state: GroupState) -> int:
    return sum(s.call.status.in_flight + s.compensation.status.in_flight for s in state.steps)


def _decide_running(state: GroupState, max_parallel: int) -> list[Action]:
    if all(s.call.status is StepStatus.SUCCEEDED for s in state.steps):
        return [FinishGroup(GroupStatus.SUCCEEDED, completion_point(state))]
    if any(s.call.status is StepStatus.BLOCKED for s in state.steps):
        return []  # paused until a resume
    d = state.definition
    ready = [
        d.step(sid)
        for sid in d.order
        if state.step(sid).call.status is StepStatus.WAITING
        and all(
            state.step(dep).call.status is StepStatus.SUCCEEDED for dep in d.step(sid).depends_on
        )
    ]
    prepared = [_prepare_step(state, step) for step in ready]
    for action in prepared:
        if isinstance(action, FailStep):
            return [action]  # the group fails: start nothing else
    free = max(max_parallel - _in_flight_count(state), 0)
    return list(prepared[:free])


def _results(state: GroupState, step: Step) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ref in step.references:
        raw = state.step(ref.step_id).call.result_json
        out[ref.step_id] = None if raw is None else json.loads(raw)
    return out


def _prepare_step(state: GroupState, step: Step) -> StartStep | FailStep:
    resolved = resolve_arguments(step, _results(state, step))
    if isinstance(resolved, ReferenceFailure):
        return FailStep(step.id, resolved.error)
    problems = list(step.facts.validate(resolved.arguments)) if step.references else []
    if problems:
        detail = "; ".join(f"{p.loc}: {p.msg}" for p in problems)
        return FailStep(
            step.id,
            ErrorInfo.of(
                ErrorCode.VALIDATION_FAILED,
                f"Step {step.id!r}: {len(problems)} argument(s) of {step.tool} are invalid "
                f"once its references are resolved ({detail}).",
                retryable=False,
            ),
        )
    try:
        arguments_json = canonical_json(resolved.arguments)
    except CanonicalJsonError as exc:
        return FailStep(
            step.id,
            ErrorInfo.of(
                ErrorCode.VALIDATION_FAILED,
                f"Step {step.id!r}: its resolved arguments have no canonical JSON form: {exc}",
                retryable=False,
            ),
        )
    record = state.step(step.id).call
    round_ = record.round + 1
    return StartStep(
        step_id=step.id,
        tool=step.tool,
        arguments_json=arguments_json,
        idempotency_key=step_key(state.group_key, step.id) if step.facts.keyed else None,
        key_suffix=f"step:{step.id}",
        round=round_,
        intent_id=call_intent_id(state.group_key, "step", step.id, round_),
        approval_request_id=record.approval_request_id,
    )


def _settled(state: GroupState, step_id: str) -> bool:
    """Not in flight, and compensated if it succeeded and has a compensation."""
    s = state.step(step_id)
    if s.call.status.in_flight:
        return False
    if s.call.status is not StepStatus.SUCCEEDED:
        return True
    if state.definition.step(step_id).facts.compensation is None:
        return True
    return s.compensation.status is StepStatus.SUCCEEDED


def _compensable(state: GroupState, step_id: str) -> bool:
    s = state.step(step_id)
    return (
        s.call.status is StepStatus.SUCCEEDED
        and state.definition.step(step_id).facts.compensation is not None
        and s.compensation.status is StepStatus.WAITING
        and all(_settled(state, d) for d in state.definition.dependents(step_id))
    )


def _decide_compensating(state: GroupState, max_parallel: int) -> list[Action]:
    candidates = [sid for sid in reversed(state.definition.order) if _compensable(state, sid)]
    free = max(max_parallel - _in_flight_count(state), 0)
    actions: list[Action] = []
    for sid in candidates:
        action = _prepare_compensation(state, sid)
        if isinstance(action, FailCompensation):
            actions.append(action)
        elif free > 0:
            actions.append(action)
            free -= 1
    if actions or candidates:
        return actions
    busy = any(
        s.call.status.in_flight
        or s.compensation.status.in_flight
        or s.compensation.status is StepStatus.BLOCKED
        for s in state.steps
    )
    if busy:
        return []
    point = completion_point(state)
    status = GroupStatus.NEEDS_ATTENTION if point.needs_attention else GroupStatus.COMPENSATED
    return [FinishGroup(status, point)]


def _prepare_compensation(state: GroupState, step_id: str) -> StartCompensation | FailCompensation:
    step = state.definition.step(step_id)
    spec = step.facts.compensation
    assert spec is not None
    s = state.step(step_id)
    arguments = json.loads(s.call.arguments_json) if s.call.arguments_json is not None else {}
    result = json.loads(s.call.result_json) if s.call.result_json is not None else None
    try:
        built = spec.arguments(arguments, result)
        if not isinstance(built, Mapping):
            raise TypeError(f"the compensation's arguments are a {type(built).__name__}")
        arguments_json = canonical_json(dict(built))
    except Exception as exc:  # a user's function: any failure means "cannot be built"
        return FailCompensation(
            step_id,
            ErrorInfo.of(
                ErrorCode.INTERNAL,
                f"The compensation of step {step_id!r} ({spec.tool}) could not be built from "
                f"the step's arguments and result: {type(exc).__name__}: {exc}",
                retryable=False,
                suggested_action=f"An operator must undo step {step_id!r} by hand.",
            ),
        )
    round_ = s.compensation.round + 1
    return StartCompensation(
        step_id=step_id,
        tool=spec.tool,
        arguments_json=arguments_json,
        idempotency_key=compensation_key(state.group_key, step_id),
        key_suffix=f"compensate:{step_id}",
        round=round_,
        intent_id=call_intent_id(state.group_key, "compensate", step_id, round_),
        approval_request_id=s.compensation.approval_request_id,
    )


# -- the orchestrator's helpers and the views ----------------------------------------------------


def event_of(action: Action) -> GroupEvent:
    """The event to record for ``action``, before executing it (write-ahead)."""
    if isinstance(action, StartStep):
        return StepStarted(action.step_id, action.round, action.arguments_json)
    if isinstance(action, StartCompensation):
        return CompensationStarted(action.step_id, action.round, action.tool, action.arguments_json)
    if isinstance(action, FailStep):
        return StepFinished(action.step_id, StepStatus.FAILED_FINAL, error=action.error)
    if isinstance(action, FailCompensation):
        return CompensationFinished(action.step_id, StepStatus.FAILED_FINAL, error=action.error)
    return GroupFinished(action.status, action.completion_point)


def in_flight(state: GroupState) -> tuple[StartStep | StartCompensation, ...]:
    """The calls whose start is recorded and whose outcome is not: after a crash, ask the
    ledger about each (by its key; submit it again only if its ``intent_id`` never reached
    the ledger). An UNKNOWN call is among them until the ledger resolves it."""
    out: list[StartStep | StartCompensation] = []
    d, key = state.definition, state.group_key
    for sid in d.order:
        step, s = d.step(sid), state.step(sid)
        if s.call.status.in_flight:
            assert s.call.arguments_json is not None
            out.append(
                StartStep(
                    sid,
                    step.tool,
                    s.call.arguments_json,
                    step_key(key, sid) if step.facts.keyed else None,
                    f"step:{sid}",
                    s.call.round,
                    call_intent_id(key, "step", sid, s.call.round),
                    s.call.approval_request_id,
                )
            )
    for sid in reversed(d.order):
        spec, s = d.step(sid).facts.compensation, state.step(sid)
        if s.compensation.status.in_flight:
            assert spec is not None and s.compensation.arguments_json is not None
            out.append(
                StartCompensation(
                    sid,
                    spec.tool,
                    s.compensation.arguments_json,
                    compensation_key(key, sid),
                    f"compensate:{sid}",
                    s.compensation.round,
                    call_intent_id(key, "compensate", sid, s.compensation.round),
                    s.compensation.approval_request_id,
                )
            )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class BlockedCall:
    step_id: str
    compensation: bool
    approval_request_id: str


def blocked_on(state: GroupState) -> tuple[BlockedCall, ...]:
    """The approvals a BLOCKED group waits for."""
    out: list[BlockedCall] = []
    for sid in state.definition.order:
        s = state.step(sid)
        if s.call.status is StepStatus.BLOCKED and state.failure is None:
            assert s.call.approval_request_id is not None
            out.append(BlockedCall(sid, False, s.call.approval_request_id))
        if s.compensation.status is StepStatus.BLOCKED:
            assert s.compensation.approval_request_id is not None
            out.append(BlockedCall(sid, True, s.compensation.approval_request_id))
    return tuple(out)


def step_status(state: GroupState, step_id: str) -> StepStatus:
    """The step's status as shown: its call's, or WAITING, or SKIPPED once the group failed."""
    status = state.step(step_id).call.status
    if status in (StepStatus.WAITING, StepStatus.BLOCKED) and state.failure is not None:
        return StepStatus.SKIPPED
    return status


def completion_point(state: GroupState) -> CompletionPoint:
    d = state.definition

    def having(*statuses: StepStatus) -> tuple[str, ...]:
        return tuple(sid for sid in d.order if state.step(sid).call.status in statuses)

    succeeded = having(StepStatus.SUCCEEDED)
    failed = having(StepStatus.FAILED_RETRYABLE, StepStatus.FAILED_FINAL)
    skipped = having(StepStatus.WAITING, StepStatus.BLOCKED) if state.failure else ()
    point = CompletionPoint(succeeded, failed, skipped, failure=state.failure)
    if state.failure is None or d.on_failure is not OnFailure.COMPENSATE:
        return point
    compensated: list[str] = []
    left_done: list[str] = []
    irreversible: list[str] = []
    comp_failed: list[str] = []
    uncompensated: list[str] = []
    for sid in succeeded:
        facts, comp = d.step(sid).facts, state.step(sid).compensation.status
        if facts.compensation is None:
            (irreversible if facts.irreversible and facts.keyed else left_done).append(sid)
        elif comp is StepStatus.SUCCEEDED:
            compensated.append(sid)
        elif comp.failed:
            comp_failed.append(sid)
        else:
            uncompensated.append(sid)
    return replace(
        point,
        compensated=tuple(compensated),
        left_done=tuple(left_done),
        irreversible=tuple(irreversible),
        compensation_failed=tuple(comp_failed),
        uncompensated=tuple(uncompensated),
    )
