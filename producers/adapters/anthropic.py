"""Ledger tools as Anthropic tool definitions, and ``tool_use`` blocks run through the ledger.

::

    response = await anthropic_client.messages.create(
        ..., tools=tool_definitions(tool_infos), messages=history
    )
    # this response's place in the persisted history: the assistant turns before it
    turn = sum(1 for message in history if message["role"] == "assistant")
    history.append({"role": "assistant", "content": response.content})  # persisted first
    results = await execute_tool_uses(
        response.content, ledger, tool_infos, trusted_context, run_id, turn
    )
    history.append({"role": "user", "content": results})

Step ids and keys. The model does not supply the idempotency key. With
:func:`execute_tool_use` the caller passes the step id and the key is
``derive_idempotency_key(run_id, step_id)``. :func:`execute_tool_uses` uses :func:`step_id` =
``turn-<n>/<tool>-<k>``: ``n`` the index of the assistant turn in the persisted conversation,
``k`` the ordinal of this tool's ``tool_use`` block among that turn's blocks for the same
tool. With a client that runs call groups the turn is one group, keyed by ``run_id`` and
``turn-<n>`` (:func:`producers.adapters.groups.turn_group_key`), whose step ``<tool>-<k>`` is
keyed by the group (see :mod:`producers.adapters.groups`); otherwise each call is keyed by
``run_id`` and its step id. The ``tool_use`` id (``toolu_...``) only pairs the result with its
block: a regenerated turn gets new ids, so a key built from it would run a retried turn's
effects again. A retried turn has the same ``n`` (it takes the same place in the history), so
its calls get the same keys and the ledger answers them with the stored outcomes. Numbering
per tool keeps a reordered retry safe: another tool's blocks cannot shift this tool's keys;
two blocks of the same tool swapped get each other's keys with other arguments and are
refused (``IDEMPOTENCY_KEY_REUSED``), never run twice. A group is refused as a whole when its
turn comes back with other calls (persist the assistant message before its tools run, as
above, so that a retry runs the same turn).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from anthropic.types import ToolParam, ToolResultBlockParam, ToolUseBlock

from toolledger.producers.adapters import (
    ToolSpec,
    arguments_schema,
    awaiting_approval,
    index_tools,
    refusal,
    result_text,
    runtime_keyed_description,
)
from toolledger.producers.adapters.groups import (
    TurnCall,
    TurnGroup,
    TurnOutcome,
    group_caller,
    group_step_id,
)
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
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.groups import GroupView

__all__ = [
    "Approve",
    "Deny",
    "PendingToolUse",
    "ToolResults",
    "execute_tool_use",
    "execute_tool_uses",
    "step_id",
    "tool_definition",
    "tool_definitions",
    "tool_result",
]

Decisions = Mapping[str, Approve | Deny]
"""A human's decisions, by ``tool_use`` id or by approval request id."""


def tool_definition(spec: ToolSpec) -> ToolParam:
    """``{"name", "description", "input_schema"}`` from the manifest (no key argument)."""
    return {
        "name": spec.name,
        "description": runtime_keyed_description(spec),
        "input_schema": arguments_schema(spec),
    }


def tool_definitions(tools: Mapping[str, ToolSpec] | Iterable[ToolSpec]) -> list[ToolParam]:
    return [tool_definition(spec) for spec in index_tools(tools).values()]


def step_id(turn: int, tool: str, ordinal: int) -> str:
    """The step id of the ``ordinal``-th (from 1) use of ``tool`` in assistant turn ``turn``."""
    return f"turn-{turn}/{tool}-{ordinal}"


def tool_result(block: ToolUseBlock, result: CallResult) -> ToolResultBlockParam:
    """The ``tool_result`` answering ``block``: the normalised JSON, ``is_error`` unless the
    call succeeded (a still-running call is an error the model may retry: same step, same
    key)."""
    return {
        "type": "tool_result",
        "tool_use_id": block.id,
        "content": result_text(result),
        "is_error": not result.ok,
    }


@dataclass(frozen=True, slots=True)
class PendingToolUse:
    """A ``tool_use`` block whose call waits for a human: show ``request`` (the tool, its
    ``impact``, ``approver_kind``, the redacted arguments) to whoever decides, then run the
    turn again with ``decisions={tool_use_id: Approve() | Deny(reason)}``."""

    tool_use_id: str
    step_id: str
    request: PendingApproval
    refused: ErrorInfo | None = None  # a decision sent for it that the ledger refused

    @property
    def approval_id(self) -> str:
        return self.request.id


class ToolResults(list[ToolResultBlockParam]):
    """A turn's ``tool_result`` blocks, in block order, and in ``pending`` the tool uses that
    wait for a human's approval (their blocks say so to the model); ``group``: the turn's
    call group, when it ran as one."""

    def __init__(
        self,
        blocks: Iterable[ToolResultBlockParam],
        pending: Iterable[PendingToolUse] = (),
        group: GroupView | None = None,
    ) -> None:
        super().__init__(blocks)
        self.pending = tuple(pending)
        self.group = group


@dataclass(frozen=True, slots=True)
class _Answer:
    block: ToolResultBlockParam
    pending: PendingToolUse | None = None


@dataclass(frozen=True, slots=True)
class _Runner:
    """What the tool uses of one run share: the client, the tools, who calls, who decides."""

    client: Caller
    tools: Mapping[str, ToolSpec]
    context: TrustedContext
    run_id: str
    wait: float | None
    approvals: Approvals | None
    approver: TrustedContext | None

    async def run(
        self,
        block: ToolUseBlock,
        step_id: str,
        decision: Approve | Deny | None,
        approval_token: str | None = None,
    ) -> _Answer:
        spec = self.tools.get(block.name)
        answered = _refusal(block, spec)
        if answered is not None:
            return _Answer(tool_result(block, answered))
        assert spec is not None  # an unknown tool is refused
        arguments: Any = block.input

        async def call() -> CallResult:
            return await self.client.call(
                spec.name,
                arguments,
                idempotency_key=derive_idempotency_key(self.run_id, step_id)
                if spec.keyed
                else None,
                context=self.context,
                wait=self.wait,
                run_id=self.run_id,
                step_id=step_id,
                approval_token=approval_token,
            )

        result = await call()
        request = pending_approval(result)
        refused = None
        if request is not None and decision is not None:
            decided = await decide_as_named(
                self.client, self.approvals, self.approver, self.context, request, decision
            )
            refused = decided.error
            if decided.ok:
                result = await call()
                request = pending_approval(result)
        if request is None:
            return _Answer(tool_result(block, result))
        waiting = PendingToolUse(block.id, step_id, request, refused)
        return _Answer(tool_result(block, awaiting_approval(result, request)), waiting)

    async def run_deciding(
        self, block: ToolUseBlock, step_id: str, decisions: Decisions
    ) -> _Answer:
        """``block`` with the decision for it, if there is one: by ``tool_use`` id, or by the
        approval request id its first answer names."""
        decision = decisions.get(block.id)
        answer = await self.run(block, step_id, decision)
        if decision is None and answer.pending is not None:
            by_request = decisions.get(answer.pending.approval_id)
            if by_request is not None:
                answer = await self.run(block, step_id, by_request)
        return answer


async def execute_tool_use(
    block: ToolUseBlock,
    client: Caller,
    tools: Mapping[str, ToolSpec] | Iterable[ToolSpec],
    context: TrustedContext,
    run_id: str,
    step_id: str,
    *,
    wait: float | None = None,
    approval_token: str | None = None,
    decision: Approve | Deny | None = None,
    approvals: Approvals | None = None,
    approver: TrustedContext | None = None,
) -> ToolResultBlockParam:
    """Run one ``tool_use`` block through the ledger, keyed by ``run_id`` and ``step_id``
    (never by ``block.id``), and answer it with a ``tool_result`` block.

    ``context`` is the trusted context from the runtime's authentication; nothing in
    ``block.input`` can change it. Failures (unknown tool, invalid arguments, a reused key,
    a failed call) are ``is_error`` results the model can read, never exceptions. A call that
    waits for a human's approval says so; with ``decision`` (the human's answer to that
    request), the decision is sent as the application names the human who decides
    (:func:`producers.approvals.decide_as_named`): ``approver``, their context (the user with
    the scope ``approvals:confirm``, or an operator), through ``approvals`` (default: the
    client's own), or ``approvals`` alone, a client holding their token. ``context`` is the
    agent's and never decides. Then the same call is made again: it runs once, or is refused
    with the human's reason.
    """
    runner = _Runner(client, index_tools(tools), context, run_id, wait, approvals, approver)
    return (await runner.run(block, step_id, decision, approval_token)).block


async def execute_tool_uses(
    content: Iterable[object],
    client: Caller,
    tools: Mapping[str, ToolSpec] | Iterable[ToolSpec],
    context: TrustedContext,
    run_id: str,
    turn: int,
    *,
    wait: float | None = None,
    independent: Collection[str] = (),
    decisions: Decisions | None = None,
    approvals: Approvals | None = None,
    approver: TrustedContext | None = None,
    as_group: bool = True,
) -> ToolResults:
    """Run every ``tool_use`` block of one assistant turn; the results are in block order,
    ready to be the next user message's content, and their ``pending`` lists the tool uses
    that wait for a human's approval.

    A model that emits several calls at once has not said they are independent: read-only
    calls run concurrently, but mutations run one after another, in the order the model
    emitted them (a "create, then update" pair never races), unless their tools are named in
    ``independent``.

    With a client that runs call groups (``toolledger.Ledger`` on any transport, or
    ``HttpLedgerClient``; see :func:`producers.adapters.groups.group_caller`) the turn is
    submitted as **one group** keyed by ``run_id`` and ``turn``: the mutations chained in
    block order, ``on_failure="stop"``. A model turn is not a saga: once a call fails, the
    calls not yet started do not run (their results say so) and nothing is compensated; the
    model reads the outcomes and decides what to do next. A retried turn is the same group
    and replays; it must be the same turn (persist the assistant message before running its
    tools): a regenerated turn with other calls is refused as a whole, nothing in it runs.
    A mutation that waits for an approval pauses the group, so the mutations after it wait
    too (their results say so; ``pending`` lists only the approval requests). The results
    read as a lone call's (``attempts`` is 0); ``group`` is the group's view.
    ``as_group=False``, or a client without groups (a bare ``LedgerClient``), runs the calls
    one by one with the step ids of :func:`step_id` and keys from ``run_id`` and the step id
    (so does ``Ledger.kafka`` without ``postgres=``, which runs no groups). The two
    key their calls differently: keep one way for a whole run.

    To bring the human's answers back, run the same turn again (same ``content``, same
    ``turn``) with ``decisions`` keyed by ``tool_use`` id (or approval request id): each
    decision is sent as the human the application names (``approver`` and/or ``approvals``,
    as for :func:`execute_tool_use`) before that tool use runs again with the same key (in a
    group: the
    group is resumed, and the approved call runs once); the turn's other calls replay their
    stored outcomes."""
    indexed = index_tools(tools)
    blocks = _numbered(content)
    groups = group_caller(client) if as_group else None
    if groups is None:
        runner = _Runner(client, indexed, context, run_id, wait, approvals, approver)
        return await _one_by_one(blocks, runner, turn, indexed, independent, decisions or {})
    group = TurnGroup(groups, context, run_id, turn, wait, approvals, approver)
    calls = [_turn_call(block, k, indexed.get(block.name), independent) for block, k in blocks]
    outcomes, view = await group.run(calls, decisions or {})
    answers = [
        _answered(block, step_id(turn, block.name, k), outcome)
        for (block, k), outcome in zip(blocks, outcomes, strict=True)
    ]
    return ToolResults(
        (a.block for a in answers), (a.pending for a in answers if a.pending is not None), view
    )


def _numbered(content: Iterable[object]) -> list[tuple[ToolUseBlock, int]]:
    """The turn's ``tool_use`` blocks, each with its ordinal among the blocks of its tool."""
    ordinals: dict[str, int] = {}
    numbered = []
    for block in content:
        if isinstance(block, ToolUseBlock):
            ordinals[block.name] = ordinals.get(block.name, 0) + 1
            numbered.append((block, ordinals[block.name]))
    return numbered


async def _one_by_one(
    blocks: Iterable[tuple[ToolUseBlock, int]],
    runner: _Runner,
    turn: int,
    indexed: Mapping[str, ToolSpec],
    independent: Collection[str],
    decisions: Decisions,
) -> ToolResults:
    """The turn call by call: the mutations take turns in block order (a FIFO lock)."""
    in_order = asyncio.Lock()
    calls = []
    for block, ordinal in blocks:
        call = runner.run_deciding(block, step_id(turn, block.name, ordinal), decisions)
        spec = indexed.get(block.name)
        ordered = spec is not None and spec.keyed and block.name not in independent
        calls.append(_in_turn(call, in_order) if ordered else call)
    answers = await asyncio.gather(*calls)
    return ToolResults(
        (a.block for a in answers), (a.pending for a in answers if a.pending is not None)
    )


async def _in_turn(call: Awaitable[_Answer], in_order: asyncio.Lock) -> _Answer:
    async with in_order:
        return await call


def _refusal(block: ToolUseBlock, spec: ToolSpec | None) -> CallResult | None:
    """The answer to a block the ledger is not asked about: an unknown tool, or an input that
    is not a JSON object."""
    if spec is None:
        return refusal(ErrorCode.TOOL_NOT_FOUND, f"There is no tool named {block.name!r}.")
    if not isinstance(block.input, dict):
        return refusal(ErrorCode.VALIDATION_FAILED, "The input must be a JSON object.")
    return None


def _turn_call(
    block: ToolUseBlock, ordinal: int, spec: ToolSpec | None, independent: Collection[str]
) -> TurnCall:
    keyed = spec is not None and spec.keyed
    arguments = block.input if isinstance(block.input, dict) else {}
    return TurnCall(
        use_id=block.id,
        tool=block.name,
        arguments=arguments,
        step_id=group_step_id(block.name, ordinal),
        keyed=keyed,
        chained=keyed and block.name not in independent,
        refusal=_refusal(block, spec),
    )


def _answered(block: ToolUseBlock, step: str, outcome: TurnOutcome) -> _Answer:
    if outcome.request is None:
        return _Answer(tool_result(block, outcome.result))
    waiting = PendingToolUse(block.id, step, outcome.request, outcome.refused)
    return _Answer(tool_result(block, awaiting_approval(outcome.result, outcome.request)), waiting)
