"""One model turn's tool calls submitted as one call group (framework-neutral).

A model that emits several tool calls in one turn has not said they are independent. The
adapters therefore submit the turn as one group (``POST /v1/groups``, ``Ledger.run_group``):

* the group key is :func:`turn_group_key` (run id and turn index): a retried turn is the same
  group, so the ledger replays it and nothing runs twice;
* one step per call, its id :func:`group_step_id` (``<tool>-<k>``, the k-th call of that tool
  in the turn: another tool's calls cannot shift it);
* each mutation depends on the mutation before it, in the order the model emitted them,
  unless its tool is declared independent; read-only calls depend on nothing and overlap;
* ``on_failure="stop"``: a model turn is not a saga. Once a call fails, the calls not yet
  started do not run and nothing is compensated; the model reads the outcomes and decides
  what to do next.

A call refused before the group (unknown tool, input not an object, arguments that fail the
tool's validation) is answered on its own and left out; a mutation refused so is a failed
mutation, so the mutations chained after it are left out too ("did not run").

A step that needs a human's approval pauses the group (``BLOCKED``), and the mutations after
it wait. The view names only the request's id; its details (tool, impact, who decides, the
redacted arguments), which a human and an in-process decision need, are read by making the
step's own call again: same key, same arguments, so while the request is pending the ledger
answers it again and runs nothing. A decision is sent for it, and the group is resumed: the
grant sits in the step key's approval book, so the resumed step runs once.

The outcomes are read from the group's view (``GroupStepView``) as :class:`CallResult`: the
same JSON a call made on its own gives, except that ``attempts`` is 0 (the view does not carry
it) and a refusal of a step's call shows the status the group recorded (``FAILED_FINAL`` or
``FAILED_RETRYABLE``) where a lone call shows ``null``.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from toolledger.producers.approvals import (
    Approvals,
    Approve,
    Deny,
    PendingApproval,
    decide_as_named,
    pending_approval,
)
from toolledger.producers.client import Caller, CallResult, TrustedContext
from toolledger.producers.keys import derive_idempotency_key
from toolledger.schemas.errors import ErrorCode, ErrorInfo, FieldError
from toolledger.schemas.groups import STEP_ID_PATTERN, GroupAnswer, GroupStepView, GroupView
from toolledger.schemas.groups import step_key as group_step_key  # the key the group gives a step
from toolledger.schemas.keys import CallKey, KeyScope
from toolledger.schemas.status import CallStatus

__all__ = [
    "NOT_RUN",
    "GroupCaller",
    "TurnCall",
    "TurnGroup",
    "TurnOutcome",
    "group_caller",
    "group_step_id",
    "group_step_key",
    "turn_group_key",
]

NOT_RUN = "NOT_RUN"
"""The adapters' own error code (the ledger never answers it): a call of the turn that did
not run, because an earlier one failed or waits for a human."""

Decisions = Mapping[str, Approve | Deny]

_STEP_ID = re.compile(STEP_ID_PATTERN)
_CALL_STATUSES = frozenset(s.value for s in CallStatus)
_SETTLED = frozenset({"SUCCEEDED", "FAILED_RETRYABLE", "FAILED_FINAL"})


@runtime_checkable
class GroupCaller(Caller, Protocol):
    """A client that runs call groups as ``context``: ``toolledger.Ledger`` on any of its
    transports, and ``HttpLedgerClient`` (over HTTP the token says who calls and decides:
    ``context`` is not sent)."""

    async def run_group(
        self,
        steps: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str,
        run_id: str,
        on_failure: str = "compensate",
        context: TrustedContext | None = None,
        wait: float | None = None,
    ) -> GroupAnswer: ...

    async def resume_group(
        self,
        group_id: str,
        *,
        approval_tokens: Mapping[str, str] | None = None,
        context: TrustedContext | None = None,
        wait: float | None = None,
    ) -> GroupAnswer: ...


def group_caller(client: object) -> GroupCaller | None:
    """``client`` as a :class:`GroupCaller`, or None if it runs no groups (a bare
    ``LedgerClient``, any other ``Caller``, or a client whose ``runs_groups`` is False: the
    adapters then call one by one)."""
    if not isinstance(client, GroupCaller):
        return None
    # ``toolledger.Ledger.kafka`` without ``postgres=`` has run_group but runs no groups
    return client if getattr(client, "runs_groups", True) else None


def turn_group_key(run_id: str, turn: int) -> str:
    """The key of the group of assistant turn ``turn`` of run ``run_id``: a retried turn takes
    the same place in the history, hence the same group."""
    return derive_idempotency_key(run_id, f"turn-{turn}")


def group_step_id(tool: str, ordinal: int) -> str:
    """The step id of the ``ordinal``-th (from 1) call of ``tool`` in a turn's group. A name
    that does not fit a step id (too long) is replaced by a digest of it."""
    step_id = f"{tool}-{ordinal}"
    if _STEP_ID.fullmatch(step_id):
        return step_id
    return f"t{hashlib.sha256(tool.encode('utf-8')).hexdigest()[:24]}-{ordinal}"


@dataclass(frozen=True, slots=True)
class TurnCall:
    """One tool call of the turn, as it goes into the group."""

    use_id: str  # the provider's id: pairs the outcome with the call, never enters a key
    tool: str
    arguments: Mapping[str, Any]
    step_id: str  # the group's step id (group_step_id)
    keyed: bool  # a mutation
    chained: bool  # a mutation that waits for the previous chained one
    refusal: CallResult | None = None  # answered before the group (unknown tool, bad input)


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    """What became of one call: ``request`` when it waits for a human, ``refused`` when a
    decision sent for it was refused by the ledger."""

    result: CallResult
    request: PendingApproval | None = None
    refused: ErrorInfo | None = None


@dataclass(frozen=True, slots=True)
class _Asked:
    """A blocked step's own call made again: its outcome, and whether the group can go on
    (the request was decided, now or before)."""

    outcome: TurnOutcome
    settled: bool


@dataclass
class _Submitted:
    """The group as submitted: its answer, and the outcomes found before or besides it."""

    calls: list[TurnCall]
    answer: GroupAnswer | None
    outcomes: dict[int, TurnOutcome] = field(default_factory=dict)  # by index in the turn


@dataclass(frozen=True, slots=True)
class TurnGroup:
    """Runs one turn's calls as one group through ``client``, as ``context``."""

    client: GroupCaller
    context: TrustedContext
    run_id: str
    turn: int
    wait: float | None = None
    # who decides, named by the application (producers.approvals.decide_as_named)
    approvals: Approvals | None = None
    approver: TrustedContext | None = None

    @property
    def key(self) -> str:
        return turn_group_key(self.run_id, self.turn)

    async def run(
        self, calls: Sequence[TurnCall], decisions: Decisions
    ) -> tuple[list[TurnOutcome], GroupView | None]:
        """Each call's outcome, in the order of ``calls``, and the group's view (None if no
        group was made: every call was refused before it, or the group was refused)."""
        submitted = await self._submit(list(calls))
        outcomes = submitted.outcomes
        answer = submitted.answer
        if answer is None or answer.view is None:
            refused = _whole_turn_refused(answer.error if answer is not None else None)
            return [outcomes.get(i, TurnOutcome(refused)) for i in range(len(calls))], None
        view, asked = await self._settle_approvals(submitted.calls, answer.view, decisions)
        reader = _Reader(
            view,
            {c.step_id: c for c in submitted.calls},
            _settled_steps(answer.view) if answer.replayed else frozenset(),
        )
        steps = {s.id: s for s in view.steps}
        for i, call in enumerate(calls):
            if i not in outcomes:
                step = steps[call.step_id]
                blocked = step.status == "BLOCKED" and call.step_id in asked
                outcomes[i] = asked[call.step_id] if blocked else reader.outcome(step)
        return [outcomes[i] for i in range(len(calls))], view

    async def _submit(self, calls: list[TurnCall]) -> _Submitted:
        """Submit the calls not refused before the group. A definition the ledger refuses for
        its steps' arguments is submitted again without those steps (and the mutations
        chained after a refused one), so it is the same group on every retry of the turn."""
        refused = {i: c.refusal for i, c in enumerate(calls) if c.refusal is not None}
        while True:
            outcomes = _left_out(calls, refused)
            entered = [c for i, c in enumerate(calls) if i not in outcomes]
            if not entered:
                return _Submitted(entered, None, outcomes)
            answer = await self.client.run_group(
                _steps(entered),
                idempotency_key=self.key,
                run_id=self.run_id,
                on_failure="stop",
                context=self.context,
                wait=self.wait,
            )
            invalid = _refused_steps(entered, answer.field_errors)
            if answer.view is not None or not invalid:
                return _Submitted(entered, answer, outcomes)
            # each round leaves out at least one more call: this ends
            positions = {c.step_id: i for i, c in enumerate(calls)}
            refused.update({positions[sid]: result for sid, result in invalid.items()})

    async def _settle_approvals(
        self, calls: Sequence[TurnCall], view: GroupView, decisions: Decisions
    ) -> tuple[GroupView, dict[str, TurnOutcome]]:
        """While the group is BLOCKED: ask about each blocked step, send the decisions there
        are, and resume the group once one of them is decided (a later step may block next)."""
        by_step = {c.step_id: c for c in calls}
        asked: dict[str, TurnOutcome] = {}
        for _ in range(len(calls)):  # each resume settles a step: a bound, not a limit
            blocked = [s for s in view.steps if s.status == "BLOCKED"]
            if view.status != "BLOCKED" or not blocked:
                break
            answers = await asyncio.gather(
                *(self._ask(by_step[s.id], s, decisions) for s in blocked)
            )
            asked.update({s.id: a.outcome for s, a in zip(blocked, answers, strict=True)})
            if not any(a.settled for a in answers):
                break
            resumed = await self.client.resume_group(
                view.group_id, context=self.context, wait=self.wait
            )
            if resumed.view is None:
                break  # not resumable now: the next run of the turn resumes it
            view = resumed.view
        return view, asked

    async def _ask(self, call: TurnCall, step: GroupStepView, decisions: Decisions) -> _Asked:
        """Make the blocked step's own call again, for its request, and send the decision for
        it if there is one. Only with the step's own key: never a call the group did not make."""
        key = group_step_key(self.key, step.id)
        tenant, principal = self.context.tenant_id, self.context.principal
        own = {CallKey.scoped(s, tenant, principal, call.tool, key).call_id for s in KeyScope}
        if not call.keyed or step.call_id not in own:  # in the tool's key scope, whichever
            return _Asked(_blocked(step), settled=False)
        result = await self.client.call(
            call.tool,
            call.arguments,
            idempotency_key=key,
            context=self.context,
            # no wait: sent again while its request is pending, a call with a wait waits for
            # the human's decision (Prefer: wait); a call that goes ahead is the group's to wait for
            wait=0.0,
            run_id=self.run_id,
            step_id=f"step:{step.id}",  # as the group's own calls of the step
        )
        request = pending_approval(result)
        if request is None:  # decided before: it ran now, or was refused
            return _Asked(TurnOutcome(result), settled=True)
        decision = decisions.get(call.use_id) or decisions.get(request.id)
        if decision is None:
            return _Asked(TurnOutcome(result, request), settled=False)
        decided = await decide_as_named(
            self.client, self.approvals, self.approver, self.context, request, decision
        )
        return _Asked(TurnOutcome(result, request, decided.error), settled=decided.ok)


@dataclass(frozen=True, slots=True)
class _Reader:
    """A group's view read as its calls' outcomes, each as a lone call of it is answered."""

    view: GroupView
    calls: Mapping[str, TurnCall]  # by step id
    replayed: frozenset[str]  # steps that had settled before this run of the turn

    def outcome(self, step: GroupStepView) -> TurnOutcome:
        if step.status == "BLOCKED":
            return _blocked(step)
        return TurnOutcome(self.result(step))

    def result(self, step: GroupStepView) -> CallResult:
        if step.status in _CALL_STATUSES:
            status = CallStatus(step.status)
            replayed = step.id in self.replayed
            call_id = step.call_id or ""
            if status is CallStatus.SUCCEEDED:
                return CallResult(status, step.result, call_id=call_id, replayed=replayed)
            error = step.error or _in_flight(status)
            return CallResult(status, error=error, call_id=call_id, replayed=replayed)
        failed = self._failed()
        if failed is not None:  # SKIPPED: the group stopped at a failure
            return _not_run_after_failure(failed)
        if self.view.status == "BLOCKED":
            return CallResult(None, error=self._not_run_yet())
        started = ErrorInfo.of(
            ErrorCode.IDEMPOTENCY_KEY_IN_USE,
            "The call has not started yet: the calls of this turn before it are still running.",
        )
        return CallResult(CallStatus.PENDING, error=started)

    def _failed(self) -> TurnCall | None:
        """The call whose failure stopped the group, if one failed."""
        failure = (self.view.completion_point or {}).get("failure")
        if isinstance(failure, Mapping) and failure.get("step_id") in self.calls:
            return self.calls[failure["step_id"]]
        failed = [s.id for s in self.view.steps if s.status in _FAILED]
        return self.calls.get(failed[0]) if failed else None

    def _not_run_yet(self) -> ErrorInfo:
        waits = [self.calls[s.id] for s in self.view.steps if s.status == "BLOCKED"]
        names = ", ".join(f"the {c.tool} call (tool_use {c.use_id})" for c in waits)
        return ErrorInfo(
            code=NOT_RUN,
            message=f"This call has not run yet: it comes after {names or 'a call'} of this "
            "turn, which waits for a human's approval. Once that is decided, the runtime runs "
            "this call once, without another call from you.",
            retryable=False,
            suggested_action="Do not call it again: tell the user what is waiting for a decision.",
        )


def _steps(calls: Sequence[TurnCall]) -> list[dict[str, Any]]:
    """The group's steps: each chained mutation depends on the chained one before it."""
    steps: list[dict[str, Any]] = []
    previous: str | None = None
    for call in calls:
        depends_on = [previous] if call.chained and previous is not None else []
        step = {"id": call.step_id, "tool": call.tool, "arguments": dict(call.arguments)}
        steps.append({**step, "depends_on": depends_on})
        if call.chained:
            previous = call.step_id
    return steps


def _left_out(
    calls: Sequence[TurnCall], refused: Mapping[int, CallResult]
) -> dict[int, TurnOutcome]:
    """The refused calls' outcomes, and "did not run" for the chained mutations after the
    first refused chained one: a refused mutation is a mutation that failed."""
    outcomes: dict[int, TurnOutcome] = {}
    failed: TurnCall | None = None
    for i, call in enumerate(calls):
        if i in refused:
            outcomes[i] = TurnOutcome(refused[i])
            if call.chained and failed is None:
                failed = call
        elif call.chained and failed is not None:
            outcomes[i] = TurnOutcome(_not_run_after_failure(failed))
    return outcomes


_STEP_FIELD = re.compile(r"steps\.(\d+)\.(tool|arguments)(?:\.(.+))?")


def _refused_steps(
    calls: Sequence[TurnCall], field_errors: Sequence[FieldError]
) -> dict[str, CallResult]:
    """A refused definition's field errors, by step, as a lone call of that step would be
    refused (locations inside its arguments); empty if an error is not one step's."""
    tools: set[int] = set()
    arguments: dict[int, list[FieldError]] = {}
    for fe in field_errors:
        match = _STEP_FIELD.fullmatch(fe.loc)
        if match is None or int(match[1]) >= len(calls):
            return {}
        i = int(match[1])
        if match[2] == "tool":
            tools.add(i)
        else:
            arguments.setdefault(i, []).append(fe.model_copy(update={"loc": match[3] or ""}))
    refused: dict[str, CallResult] = {}
    for i, errors in arguments.items():
        tool = calls[i].tool
        message = f"{len(errors)} argument(s) of {tool} are invalid."  # as the ledger says it
        error = ErrorInfo.of(ErrorCode.VALIDATION_FAILED, message)
        refused[calls[i].step_id] = CallResult(None, error=error, field_errors=tuple(errors))
    for i in tools:  # the ledger does not have the tool the adapter was given
        missing = ErrorInfo.of(
            ErrorCode.TOOL_NOT_FOUND, f"There is no tool named {calls[i].tool!r}."
        )
        refused[calls[i].step_id] = CallResult(None, error=missing)
    return refused


_FAILED = frozenset({"FAILED_RETRYABLE", "FAILED_FINAL"})


def _settled_steps(view: GroupView) -> frozenset[str]:
    return frozenset(s.id for s in view.steps if s.status in _SETTLED)


def _blocked(step: GroupStepView) -> TurnOutcome:
    """A blocked step as far as the view knows it: its error, its request's id."""
    request = PendingApproval({**(step.approval_request or {}), "tool": step.tool})
    error = step.error or ErrorInfo.of(
        ErrorCode.APPROVAL_REQUIRED, f"{step.tool} needs a human's approval of these arguments."
    )
    return TurnOutcome(CallResult(None, error=error, call_id=step.call_id or ""), request)


def _in_flight(status: CallStatus) -> ErrorInfo:
    if status is CallStatus.UNKNOWN:
        return ErrorInfo.of(ErrorCode.OUTCOME_UNKNOWN, "The ledger is finding out the outcome.")
    return ErrorInfo.of(ErrorCode.IDEMPOTENCY_KEY_IN_USE, "The call is running.")


def _not_run_after_failure(failed: TurnCall) -> CallResult:
    error = ErrorInfo(
        code=NOT_RUN,
        message=f"This call did not run and changed nothing: the {failed.tool} call of this "
        f"turn (tool_use {failed.use_id}) failed first, and once a call of a turn fails, the "
        "calls after it do not start.",
        retryable=False,
        suggested_action="Read that call's error; if this call is still wanted, make it again "
        "in your next turn.",
    )
    return CallResult(None, error=error)


def _whole_turn_refused(error: ErrorInfo | None) -> CallResult:
    """The ledger refused the turn's group as a whole: none of its calls ran now."""
    if error is None:
        error = ErrorInfo.of(ErrorCode.INTERNAL, "The ledger gave no answer for this turn.")
    elif error.code == ErrorCode.IDEMPOTENCY_KEY_REUSED:
        error = ErrorInfo.of(
            ErrorCode.IDEMPOTENCY_KEY_REUSED,
            "This call did not run: this turn already ran with other tool calls (other calls, "
            "arguments or order of changes), and a turn runs once.",
            suggested_action="The turn's earlier calls may have taken effect: read the current "
            "state before you make a change again, in your next turn.",
        )
    else:
        message = f"This call did not run: the ledger refused this turn's calls ({error.message})"
        error = error.model_copy(update={"message": message})
    return CallResult(None, error=error)
