"""Ledger tools as OpenAI Agents SDK ``FunctionTool`` objects.

::

    tools = function_tools(client, tool_infos)
    agent = Agent(name="support", tools=tools)
    run = LedgerRun(run_id="run-42", context=trusted_context)
    await Runner.run(agent, "...", context=run)

The run context (``context=`` of ``Runner.run``) is a :class:`LedgerRun`, or any object with
a ``ledger_run`` attribute holding one: it carries the trusted context (tenant, principal,
from the runtime's own authentication, never from the model) and the run id.

Step ids and keys. The model does not supply the idempotency key: the tool derives it with
``derive_idempotency_key(run_id, step_id)``. The step id is ``<tool>#<n>``: the n-th call of
that tool in the run, counted by :attr:`LedgerRun.steps`. The provider's tool-call id is not
used: a regenerated turn gets new ones. The runtime persists ``steps`` with the
conversation and, when it retries a turn (after a crash, or a failed model call whose tool
calls already ran), restores the ``steps`` saved with the history it resumes from: the
retried turn's calls get the same step ids, hence the same keys, and the ledger answers
them with the stored outcomes instead of running them again.

Counting per tool (not one counter for the run) keeps a retried turn safe when the model
orders its calls differently: another tool's calls cannot shift this tool's numbers. Two
calls of the *same* tool in one turn that come back in the other order get each other's
keys with other arguments: the ledger refuses them (``IDEMPOTENCY_KEY_REUSED``), it never
runs them twice.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents import FunctionTool
from agents.tool_context import ToolContext

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

__all__ = ["LedgerRun", "function_tool", "function_tools", "ledger_run_of"]


@dataclass
class LedgerRun:
    """The ledger's part of an agent run's context."""

    run_id: str
    context: TrustedContext
    steps: dict[str, int] = field(default_factory=dict)
    """Calls started so far, per tool name. Persist it with the conversation."""
    in_order: asyncio.Lock = field(default_factory=asyncio.Lock, compare=False, repr=False)
    """Mutations of the run take turns, in the order the SDK invokes them: calls a model
    emitted together are not independent unless it says so (read-only calls do not wait)."""

    def __post_init__(self) -> None:
        if not self.run_id:
            raise ValueError("a LedgerRun needs a non-empty run_id")

    def step_id_for(self, tool: str, tool_context: ToolContext[Any]) -> str:
        """The step id of the call being made now (override to take ids from elsewhere,
        e.g. a workflow engine's activity id). ``tool_context.tool_call_id`` must not enter:
        it changes when a turn is retried."""
        n = self.steps.get(tool, 0) + 1
        self.steps[tool] = n
        return f"{tool}#{n}"


def ledger_run_of(tool_context: ToolContext[Any]) -> LedgerRun:
    run = tool_context.context
    if not isinstance(run, LedgerRun):
        run = getattr(run, "ledger_run", None)
    if not isinstance(run, LedgerRun):
        raise TypeError(
            "ledger tools need a LedgerRun as the run context (Runner.run(..., context=...)), "
            "or a context object with a ledger_run attribute"
        )
    return run


def function_tool(client: Caller, spec: ToolSpec, *, wait: float | None = None) -> FunctionTool:
    """One ledger tool as a ``FunctionTool``: the manifest's argument schema (no key
    argument), and an ``on_invoke_tool`` that runs the call through ``client``. It returns
    the normalised JSON (``{"ok": true, "result": ...}`` or ``{"ok": false, "error": ...}``)
    for the model to read; failures are outputs, not exceptions."""
    name = spec.name
    keyed = spec.keyed

    async def on_invoke_tool(tool_context: ToolContext[Any], raw_arguments: str) -> str:
        run = ledger_run_of(tool_context)
        step_id = run.step_id_for(name, tool_context)
        if not keyed:
            return result_text(await _call(client, name, keyed, raw_arguments, run, step_id, wait))
        async with run.in_order:
            result = await _call(client, name, keyed, raw_arguments, run, step_id, wait)
        return result_text(result)

    return FunctionTool(
        name=name,
        description=runtime_keyed_description(spec),
        params_json_schema=arguments_schema(spec),
        on_invoke_tool=on_invoke_tool,
        # the ledger validates against the pydantic model itself; OpenAI's strict mode would
        # make every optional argument required
        strict_json_schema=False,
    )


def function_tools(
    client: Caller,
    tools: Mapping[str, ToolSpec] | Iterable[ToolSpec],
    *,
    wait: float | None = None,
) -> list[FunctionTool]:
    return [function_tool(client, spec, wait=wait) for spec in index_tools(tools).values()]


async def _call(
    client: Caller,
    tool: str,
    keyed: bool,
    raw_arguments: str,
    run: LedgerRun,
    step_id: str,
    wait: float | None,
) -> CallResult:
    try:
        arguments = json.loads(raw_arguments or "{}")
    except ValueError as exc:
        return refusal(ErrorCode.VALIDATION_FAILED, f"The arguments are not valid JSON: {exc}")
    if not isinstance(arguments, dict):
        return refusal(ErrorCode.VALIDATION_FAILED, "The arguments must be a JSON object.")
    return await client.call(
        tool,
        arguments,
        idempotency_key=derive_idempotency_key(run.run_id, step_id) if keyed else None,
        context=run.context,
        wait=wait,
        run_id=run.run_id,
        step_id=step_id,
    )
