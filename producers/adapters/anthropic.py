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
from typing import Any

from anthropic.types import ToolParam, ToolResultBlockParam, ToolUseBlock

from producers.adapters import (
    ToolSpec,
    arguments_schema,
    index_tools,
    refusal,
    result_text,
    runtime_keyed_description,
)
from producers.client import Caller, CallResult, TrustedContext
from producers.keys import derive_idempotency_key
from schemas.errors import ErrorCode

__all__ = [
    "execute_tool_use",
    "execute_tool_uses",
    "step_id",
    "tool_definition",
    "tool_definitions",
    "tool_result",
]


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
) -> ToolResultBlockParam:
    """Run one ``tool_use`` block through the ledger, keyed by ``run_id`` and ``step_id``
    (never by ``block.id``), and answer it with a ``tool_result`` block.

    ``context`` is the trusted context from the runtime's authentication; nothing in
    ``block.input`` can change it. Failures (unknown tool, invalid arguments, a reused key,
    a failed call) are ``is_error`` results the model can read, never exceptions.
    """
    spec = index_tools(tools).get(block.name)
    if spec is None:
        return tool_result(
            block, refusal(ErrorCode.TOOL_NOT_FOUND, f"There is no tool named {block.name!r}.")
        )
    arguments: Any = block.input
    if not isinstance(arguments, dict):
        return tool_result(
            block, refusal(ErrorCode.VALIDATION_FAILED, "The input must be a JSON object.")
        )
    result = await client.call(
        spec.name,
        arguments,
        idempotency_key=derive_idempotency_key(run_id, step_id) if spec.keyed else None,
        context=context,
        wait=wait,
        run_id=run_id,
        step_id=step_id,
        approval_token=approval_token,
    )
    return tool_result(block, result)


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
) -> list[ToolResultBlockParam]:
    """Run every ``tool_use`` block of one assistant turn, with step ids from :func:`step_id`;
    the results are in block order, ready to be the next user message's content.

    A model that emits several calls at once has not said they are independent: read-only
    calls run concurrently, but mutations run one after another, in the order the model
    emitted them (a "create, then update" pair never races), unless their tools are named in
    ``independent``."""
    indexed = index_tools(tools)
    ordinals: dict[str, int] = {}
    in_order = asyncio.Lock()  # mutations take turns, in block order (the lock is FIFO)
    calls = []
    for block in content:
        if not isinstance(block, ToolUseBlock):
            continue
        ordinals[block.name] = ordinals.get(block.name, 0) + 1
        step = step_id(turn, block.name, ordinals[block.name])
        call = execute_tool_use(block, client, indexed, context, run_id, step, wait=wait)
        spec = indexed.get(block.name)
        ordered = spec is not None and spec.keyed and block.name not in independent
        calls.append(_in_turn(call, in_order) if ordered else call)
    return list(await asyncio.gather(*calls))


async def _in_turn(
    call: Awaitable[ToolResultBlockParam], in_order: asyncio.Lock
) -> ToolResultBlockParam:
    async with in_order:
        return await call
