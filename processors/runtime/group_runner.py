"""The group orchestrator: drives call groups by the pure core's decisions.

Each decision is recorded on the group log *before* it is acted on, and each step is an
ordinary ledgered call under a key derived from the group key and the step id. So a runner
that crashes and starts again folds the log, decides again, and asks the ledger again about
the calls in flight: a call with the same key and arguments is answered by the ledger (a
replay, or the running call's outcome) and never runs twice. That is also how a group
resumes from its completion point.

Timeline of one step::

    decide -> StartStep ─ append StepStarted ─ call(key, args) ─ ... ─ answer
                                                                  └─ append StepFinished
    crash anywhere: fold the log, in_flight() names the call, call(key, args) again

Only one runner drives a group at a time: the embedded ledger has one (in the process that
holds the file's lock); on Kafka + PostgreSQL each front door runs one, and a group is driven
by the one that holds its claim (a PostgreSQL advisory lock, gone with the process). Timeline
of a submission that races another front door with the same key::

    A: load (none) ─ claim ✓ ─ load again (none) ─ append GroupSubmitted ─ drive
    B: load (none) ─ claim ✗ ─ load again ─ A's group: replay it (or 422 for another body)
                                          └ nothing yet: "retry in a moment" (503)

The second load, *after* the claim, is what keeps a key to one definition: only the claim's
holder appends a GroupSubmitted, and it appends only what is not there. A front door whose
peer crashed takes its unfinished groups over within ``takeover_interval_s`` (their claims
are gone with the peer's session), or at once when a group is asked for again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from toolledger.processors.groups import (
    Action,
    CompensationFinished,
    GroupEvent,
    GroupResumed,
    GroupState,
    GroupStatus,
    GroupSubmitted,
    InvalidGroup,
    StartCompensation,
    StartStep,
    StepFinished,
    StepStatus,
    StepTool,
    decide,
    event_of,
    evolve,
    fold,
    in_flight,
    missing_scopes,
    parse_group,
    resumable,
)
from toolledger.processors.groups.codec import (
    GroupDecodeError,
    appended_at,
    decode_event,
    encode_event,
)
from toolledger.processors.groups.views import GroupMeta, group_view
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.groups import GroupAnswer, GroupView, group_id_for
from toolledger.schemas.status import CallStatus

log = logging.getLogger("toolledger.groups")

DEFAULT_MAX_PARALLEL = 8
TAKEOVER_INTERVAL_S = 5.0  # how often a front door looks for groups nobody drives
STEP_WAIT_S = 30.0  # one ask of the ledger; a call still running is asked again
REASK_BACKOFF_S = (0.05, 0.2, 1.0, 5.0)


@dataclass(frozen=True, slots=True)
class StepCall:
    tool: str
    arguments: Mapping[str, Any]
    idempotency_key: str | None
    meta: GroupMeta
    run_id: str
    step_id: str
    approval_token: str | None


@dataclass(frozen=True, slots=True)
class StepAnswer:
    """The ledger's answer: ``status`` None for a refusal before execution (``error`` says
    why; ``approval_request_id`` when it is APPROVAL_REQUIRED)."""

    status: CallStatus | None
    result_json: str | None = None
    error: ErrorInfo | None = None
    approval_request_id: str | None = None


StepCaller = Callable[[StepCall], Awaitable[StepAnswer]]


class GroupLog(Protocol):
    """Where group events are kept; ``append`` also updates the group's projection rows (the
    view), in the same transaction. ``claim``: whether this process may drive the group (no
    other live process does); a claim lasts until the process ends."""

    async def append(self, meta: GroupMeta, events: Sequence[str], view: GroupView) -> None: ...

    async def load(self, group_id: str) -> tuple[GroupMeta, list[str]] | None: ...

    async def unfinished(self) -> list[str]: ...

    async def claim(self, group_id: str) -> bool: ...


class GroupReads(Protocol):
    """The groups' read model: searches by tenant and run."""

    async def search(self, tenant_id: str, run_id: str | None, limit: int) -> list[GroupView]: ...


Clock = Callable[[], datetime]
Start = StartStep | StartCompensation


@dataclass
class _Group:
    meta: GroupMeta
    state: GroupState
    updated_at: datetime  # when its last event was appended: the resource's updated_at
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    tokens: dict[str, str] = field(default_factory=dict)  # step id -> approval token
    task: asyncio.Task[None] | None = None
    # one writer at a time: a decision is made on the state its events are appended to
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)


class GroupRunner:
    def __init__(
        self,
        group_log: GroupLog,
        reads: GroupReads,
        call: StepCaller,
        tools: Callable[[], Mapping[str, StepTool]],
        *,
        max_parallel: int = DEFAULT_MAX_PARALLEL,
        max_steps: int = 100,
        clock: Clock = lambda: datetime.now(UTC),
        takeover_interval_s: float | None = TAKEOVER_INTERVAL_S,
    ) -> None:
        self._log = group_log
        self._takeover_interval_s = takeover_interval_s
        self._takeover: asyncio.Task[None] | None = None
        self._reads = reads
        self._call = call
        self._tools = tools
        self._max_parallel = max_parallel
        self._max_steps = max_steps
        self._clock = clock
        self._groups: dict[str, _Group] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    # -- the front door's side ---------------------------------------------------------------

    async def submit(
        self,
        *,
        tenant_id: str,
        principal: str,
        scopes: Sequence[str],
        group_key: str,
        body: Any,
        wait_s: float,
    ) -> GroupAnswer:
        definition = parse_group(body, self._tools(), max_steps=self._max_steps)
        if isinstance(definition, InvalidGroup):
            return GroupAnswer(error=definition.error, field_errors=definition.field_errors)
        forbidden = missing_scopes(definition, scopes)
        if forbidden:  # before anything is stored or the key is used, as for a call
            needed = sorted(frozenset().union(*(s.facts.scopes for s in definition.steps)))
            lacking = [scope for scope in needed if scope not in scopes]
            return GroupAnswer(
                error=ErrorInfo.of(
                    ErrorCode.FORBIDDEN,
                    f"The group's steps need the scope(s) {lacking}, which this caller lacks.",
                ),
                field_errors=forbidden,
            )
        group_id = group_id_for(tenant_id, group_key)
        async with self._lock(group_id):
            group = await self._loaded(group_id)
            claimed = group_id in self._groups
            if group is None:
                claimed = await self._log.claim(group_id)
                group = await self._loaded(group_id)  # written by another since the first load?
                if group is None and not claimed:
                    return GroupAnswer(error=_submitted_elsewhere())
            if group is not None:
                if group.state.definition.digest != definition.digest:
                    return GroupAnswer(
                        error=ErrorInfo.of(
                            ErrorCode.IDEMPOTENCY_KEY_REUSED,
                            "This idempotency key was used for another group definition.",
                        )
                    )
                group = await self._adopt(group_id, claimed) or group
                return GroupAnswer(await self._wait(group, wait_s), replayed=True)
            now = self._clock()
            meta = GroupMeta(group_id, tenant_id, principal, tuple(scopes), group_key, now)
            group = _Group(meta, evolve(None, GroupSubmitted(group_key, definition)), now)
            submitted = encode_event(GroupSubmitted(group_key, definition), at=now)
            view = group_view(meta, group.state, now, self._tools())
            await self._log.append(meta, [submitted], view)
            self._groups[group_id] = group
            self._drive(group)
        return GroupAnswer(await self._wait(group, wait_s))

    async def resume(
        self, tenant_id: str, group_id: str, tokens: Mapping[str, str], wait_s: float
    ) -> GroupAnswer:
        """Continue a BLOCKED or FAILED group from its completion point; ``tokens``: approval
        tokens by step id, for the steps that waited for an approval."""
        async with self._lock(group_id):
            group = await self._loaded(group_id)
            if group is None or group.meta.tenant_id != tenant_id:
                return GroupAnswer(error=_not_found(group_id))
            if group_id not in self._groups and not await self._log.claim(group_id):
                return GroupAnswer(
                    error=ErrorInfo.of(
                        ErrorCode.INTERNAL,
                        "Another front door drives this group now.",
                        retryable=True,
                        suggested_action="Resume it again in a moment.",
                    )
                )
            self._groups[group_id] = group
            if not resumable(group.state):
                return GroupAnswer(
                    view=self._view(group),
                    error=ErrorInfo(
                        code="GROUP_NOT_RESUMABLE",
                        message=f"The group is {group.state.status.value}: only a BLOCKED or "
                        "FAILED group can be resumed.",
                        retryable=False,
                        suggested_action="Read the group: it is running or has finished.",
                    ),
                )
            group.tokens.update(tokens)
            await self._advance(group, [GroupResumed()], decide_next=False)
            self._drive(group)
        return GroupAnswer(await self._wait(group, wait_s))

    async def view(self, tenant_id: str, group_id: str) -> GroupView | None:
        group = await self._loaded(group_id)
        if group is None or group.meta.tenant_id != tenant_id:
            return None
        return self._view(group)

    async def search(self, tenant_id: str, run_id: str | None, limit: int) -> list[GroupView]:
        return await self._reads.search(tenant_id, run_id, limit)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Drive again every group that had not finished (after a stop or a crash), then keep
        looking for groups whose driver is gone."""
        await self._take_over()
        if self._takeover_interval_s is not None:
            self._takeover = asyncio.get_running_loop().create_task(self._keep_taking_over())

    async def _take_over(self) -> None:
        for group_id in await self._log.unfinished():
            if group_id in self._groups:
                continue  # driven here
            async with self._lock(group_id):
                await self._adopt(group_id, claimed=False)

    async def _keep_taking_over(self) -> None:
        assert self._takeover_interval_s is not None
        while True:
            await asyncio.sleep(self._takeover_interval_s)
            try:
                await self._take_over()
            except Exception:  # the log unreachable for a moment: the next round tries again
                log.warning("looking for groups to take over failed", exc_info=True)

    async def _adopt(self, group_id: str, claimed: bool) -> _Group | None:
        """The group as this runner drives it, if it does or now may (its claim is ours, or
        free): loaded once claimed, so it is the state no other runner appends to. None: it
        is driven elsewhere, or has finished. Wait on the returned group, never on a copy
        loaded before: only the driven one is told of changes."""
        driven = self._groups.get(group_id)
        if driven is not None:
            return driven
        if not claimed and not await self._log.claim(group_id):
            return None  # another live front door drives it
        group = await self._loaded(group_id)
        if group is None or group.state.finished is not None:
            return None
        self._groups[group_id] = group
        self._drive(group)
        return group

    async def stop(self) -> None:
        if self._takeover is not None:
            self._takeover.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._takeover
            self._takeover = None
        tasks = [g.task for g in self._groups.values() if g.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- inside ----------------------------------------------------------------------------------

    def _lock(self, group_id: str) -> asyncio.Lock:
        return self._locks.setdefault(group_id, asyncio.Lock())

    async def _loaded(self, group_id: str) -> _Group | None:
        """The group this runner drives, or the group as the log has it now (not kept: another
        process may be driving it)."""
        group = self._groups.get(group_id)
        if group is not None:
            return group
        stored = await self._log.load(group_id)
        if stored is None:
            return None
        meta, texts = stored
        try:
            events = [decode_event(t, self._tools(), self._max_steps) for t in texts]
        except GroupDecodeError as exc:
            log.error("group %s cannot be read: %s", group_id, exc)
            return None
        state = fold(events)
        assert state is not None
        return _Group(meta, state, appended_at(texts[-1]) or meta.created_at)

    def _view(self, group: _Group) -> GroupView:
        return group_view(group.meta, group.state, group.updated_at, self._tools())

    async def _advance(
        self, group: _Group, answered: Sequence[GroupEvent], *, decide_next: bool = True
    ) -> list[Action]:
        """Apply ``answered`` and, with ``decide_next``, the decision they lead to; append
        them all in one write, before any decided call is made; wake the waiters."""
        async with group.writing:
            state = group.state
            for event in answered:
                state = evolve(state, event)
            actions = decide(state, self._max_parallel) if decide_next else []
            events = [*answered, *(event_of(a) for a in actions)]
            for event in events[len(answered) :]:
                state = evolve(state, event)
            if events:
                now = self._clock()
                view = group_view(group.meta, state, now, self._tools())
                stored = [encode_event(e, at=now) for e in events]
                await self._log.append(group.meta, stored, view)
                group.state = state
                group.updated_at = now
        await _notify(group.changed)
        return actions

    async def _wait(self, group: _Group, wait_s: float) -> GroupView:
        """The group once it has finished or is blocked, or as it is when the wait ends."""

        def settled() -> bool:
            return (
                group.state.finished is not None
                or group.state.status is GroupStatus.BLOCKED
                or (group.task is None or group.task.done())
            )

        async with group.changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(group.changed.wait_for(settled), max(0.0, wait_s))
        return self._view(group)

    def _drive(self, group: _Group) -> None:
        if group.task is None or group.task.done():
            group.task = asyncio.get_running_loop().create_task(self._run(group))

    async def _run(self, group: _Group) -> None:
        running: dict[asyncio.Task[StepAnswer], Start] = {}
        try:
            for start in in_flight(group.state):  # asked again after a restart
                running[self._ask(group, start)] = start
            answered: list[GroupEvent] = []
            while True:
                # the answers that came in and the decision they lead to: one write, made
                # before any of the decided calls is
                actions = await self._advance(group, answered)
                for action in actions:
                    if isinstance(action, StartStep | StartCompensation):
                        running[self._ask(group, action)] = action
                if not running:
                    return  # finished, blocked or failed: a resume drives it again
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                answered = [_finished(running.pop(t), t.result()) for t in done]
        except asyncio.CancelledError:
            for task in running:
                task.cancel()
            raise
        except Exception:
            log.exception("group %s stopped on an error", group.meta.group_id)
        finally:
            await _notify(group.changed)

    def _ask(
        self, group: _Group, action: StartStep | StartCompensation
    ) -> asyncio.Task[StepAnswer]:
        token = group.tokens.pop(action.step_id, None) if action.approval_request_id else None
        call = StepCall(
            action.tool,
            action.arguments,
            action.idempotency_key,
            group.meta,
            group.state.definition.run_id,
            action.key_suffix,
            token,
        )
        return asyncio.get_running_loop().create_task(self._settled(call))

    async def _settled(self, call: StepCall) -> StepAnswer:
        """Ask the ledger until the call has an outcome (same key, same arguments: a running
        call is waited for, an UNKNOWN one is reconciled by the ledger, never re-run blind)."""
        attempt = 0
        while True:
            answer = await self._call(call)
            if answer.status not in (CallStatus.PENDING, CallStatus.UNKNOWN):
                return answer
            await asyncio.sleep(REASK_BACKOFF_S[min(attempt, len(REASK_BACKOFF_S) - 1)])
            attempt += 1


def _finished(action: Start, answer: StepAnswer) -> GroupEvent:
    if answer.status is None:
        assert answer.error is not None
        if answer.approval_request_id is not None:
            status = StepStatus.BLOCKED
        else:
            status = (
                StepStatus.FAILED_RETRYABLE if answer.error.retryable else StepStatus.FAILED_FINAL
            )
    else:
        status = StepStatus.of_call(answer.status)
    finished = StepFinished if isinstance(action, StartStep) else CompensationFinished
    return finished(
        action.step_id, status, answer.result_json, answer.error, answer.approval_request_id
    )


async def _notify(condition: asyncio.Condition) -> None:
    async with condition:
        condition.notify_all()


def _not_found(group_id: str) -> ErrorInfo:
    return ErrorInfo(
        code="NOT_FOUND",
        message=f"There is no group {group_id} in this tenant.",
        retryable=False,
        suggested_action="Check the group id (it is in the submission's answer).",
    )


def _submitted_elsewhere() -> ErrorInfo:
    return ErrorInfo.of(
        ErrorCode.INTERNAL,
        "Another front door is submitting a group with this key right now.",
        retryable=True,
        suggested_action="Send the same group again with the same key in a moment.",
    )
