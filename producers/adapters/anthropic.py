"""Ledger tools as Anthropic tool definitions, and ``tool_use`` blocks run through the ledger.

::

    response = await anthropic_client.messages.create(
        ..., tools=tool_definitions(tool_infos), messages=history
    )
    # this response's place in the persisted history: the assistant turns before it
    turn = sum(1 for message in history if message["role"] == "assistant")
    results = await execute_tool_uses(
        response.content, ledger_client, tool_infos, trusted_context, run_id, turn
    )
    history += [{"role": "assistant", "content": response.content},
                {"role": "user", "content": results}]

Step ids and keys. The model does not supply the idempotency key: it is
``derive_idempotency_key(run_id, step_id)``. With :func:`execute_tool_use` the caller passes
the step id; :func:`execute_tool_uses` uses :func:`step_id` = ``turn-<n>/<tool>-<k>``: ``n``
the index of the assistant turn in the persisted conversation, ``k`` the ordinal of this
tool's ``tool_use`` block among that turn's blocks for the same tool. The ``tool_use`` id
(``toolu_...``) only pairs the result with its block: a regenerated turn gets new ids, so a
key built from it would run a retried turn's effects again. A retried turn has the same
``n`` (it takes the same place in the history), so its calls get the same keys and the
ledger answers them with the stored outcomes. Numbering per tool keeps a reordered retry
safe: another tool's blocks cannot shift this tool's keys; two blocks of the same tool
swapped get each other's keys with other arguments and are refused
(``IDEMPOTENCY_KEY_REUSED``), never run twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from anthropic.types import ToolParam, ToolResultBlockParam, ToolUseBlock

from producers.adapters import (
    ToolSpec,
    arguments_schema,
    awaiting_approval,
    index_tools,
    refusal,
    result_text,
    runtime_keyed_description,
)
from producers.approvals import (
    Approvals,
    Approve,
    Deny,
    PendingApproval,
    approvals_for,
    decide,
    pending_approval,
)
from producers.client import Caller, CallResult, TrustedContext
from producers.keys import derive_idempotency_key
from schemas.errors import ErrorCode, ErrorInfo

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
    wait for a human's approval (their blocks say so to the model)."""

    def __init__(
        self, blocks: Iterable[ToolResultBlockParam], pending: Iterable[PendingToolUse] = ()
    ) -> None:
        super().__init__(blocks)
        self.pending = tuple(pending)


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
        if spec is None:
            missing = refusal(ErrorCode.TOOL_NOT_FOUND, f"There is no tool named {block.name!r}.")
            return _Answer(tool_result(block, missing))
        arguments: Any = block.input
        if not isinstance(arguments, dict):
            invalid = refusal(ErrorCode.VALIDATION_FAILED, "The input must be a JSON object.")
            return _Answer(tool_result(block, invalid))

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
            decided = await decide(
                self.approvals or approvals_for(self.client),
                request,
                self.approver or self.context,
                decision,
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
    request), the decision is sent through ``approvals`` (default: the client's own, see
    :func:`producers.approvals.approvals_for`) as ``approver`` (default: ``context``, the user
    the call runs for) and the same call is made again: it runs once, or is refused with the
    human's reason.
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
) -> ToolResults:
    """Run every ``tool_use`` block of one assistant turn, with step ids from :func:`step_id`;
    the results are in block order, ready to be the next user message's content, and their
    ``pending`` lists the tool uses that wait for a human's approval.

    To bring the human's answers back, run the same turn again (same ``content``, same
    ``turn``) with ``decisions`` keyed by ``tool_use`` id (or approval request id): each
    decision is sent as ``approver`` (default: ``context``) before that tool use runs again
    with the same key; the turn's other calls replay their stored outcomes.

    A model that emits several calls at once has not said they are independent: read-only
    calls run concurrently, but mutations run one after another, in the order the model
    emitted them (a "create, then update" pair never races), unless their tools are named in
    ``independent``."""
    indexed = index_tools(tools)
    runner = _Runner(client, indexed, context, run_id, wait, approvals, approver)
    ordinals: dict[str, int] = {}
    in_order = asyncio.Lock()  # mutations take turns, in block order (the lock is FIFO)
    calls = []
    for block in content:
        if not isinstance(block, ToolUseBlock):
            continue
        ordinals[block.name] = ordinals.get(block.name, 0) + 1
        step = step_id(turn, block.name, ordinals[block.name])
        call = runner.run_deciding(block, step, decisions or {})
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
