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

Approvals. A tool whose manifest says its calls may need a human's approval (``approval``:
``user``, ``operator`` or ``by arguments``) sets the SDK's ``needs_approval``: when the SDK
asks, the adapter makes the call (its step id is taken then and kept in
:attr:`LedgerRun.planned` for that tool call), and a call the ledger answers
``APPROVAL_REQUIRED`` interrupts the run (``result.interruptions``). Any other answer is kept
and returned when the SDK invokes the tool: nothing runs twice. Then::

    state = result.to_state()
    for item in result.interruptions:
        request = run.approval_request(item)  # tool, impact, approver_kind, redacted arguments
        if human_says_yes(request):
            state.approve(item)  # on resume the adapter grants the ledger's request, then runs
        else:
            await run.reject(state, item, reason="Not this customer")  # denies it
    result = await Runner.run(agent, state)

On resume the SDK invokes an approved call's tool: the adapter grants the ledger's request
for that exact call (same key, same arguments) as the human the application names,
:attr:`LedgerRun.approver` (the user the agent acts for, with the scope
``approvals:confirm``; a four-eyes request needs an operator) and/or
:attr:`LedgerRun.approvals` (over HTTP: a client with that human's token), never as the run's
own context, the agent's; then it makes the call again, which runs once. The SDK does not
invoke a rejected call's tool, so a rejection goes through :meth:`LedgerRun.reject`: it denies
the ledger's request and gives the model the ledger's refusal (a plain ``RunState.reject``
leaves the request pending until it expires; nothing runs either way).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents import FunctionTool, RunContextWrapper, RunState, ToolApprovalItem
from agents.tool_context import ToolContext

from toolledger.producers.adapters import (
    ToolSpec,
    approval_rule,
    arguments_schema,
    awaiting_approval,
    index_tools,
    refusal,
    result_text,
    runtime_keyed_description,
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
from toolledger.schemas.errors import ErrorCode
from toolledger.schemas.nesting import NestingTooDeep, check_text_depth

__all__ = ["LedgerRun", "function_tool", "function_tools", "ledger_run_of"]


@dataclass(frozen=True, slots=True)
class _Waiting:
    """A call the ledger asked a human about: its request, and how to settle it (decide,
    then make the same call again)."""

    request: PendingApproval
    settle: Callable[[Approve | Deny], Awaitable[CallResult]]


@dataclass
class LedgerRun:
    """The ledger's part of an agent run's context."""

    run_id: str
    context: TrustedContext
    steps: dict[str, int] = field(default_factory=dict)
    """Calls started so far, per tool name. Persist it with the conversation."""
    planned: dict[str, str] = field(default_factory=dict)
    """Step ids taken when the SDK asked whether a call needs approval, by tool-call id,
    until the call is invoked or rejected. Persist it with ``steps``."""
    approver: TrustedContext | None = None
    """Who grants or denies the run's approval requests when the application decides an
    interruption: the human's context (the user the run acts for, with the scope
    ``approvals:confirm``, or an operator). Not ``context``: the agent does not decide."""
    approvals: Approvals | None = field(default=None, compare=False, repr=False)
    """What sends those decisions (default: the tools' ``approvals``). Over HTTP the token
    decides who approves: an ``HttpLedgerClient`` with the approver's token. With neither this
    nor ``approver`` (nor the tools' ``approvals``) a decision is refused."""
    in_order: asyncio.Lock = field(default_factory=asyncio.Lock, compare=False, repr=False)
    """Mutations of the run take turns, in the order the SDK invokes them: calls a model
    emitted together are not independent unless it says so (read-only calls do not wait)."""
    _answers: dict[str, CallResult] = field(default_factory=dict, compare=False, repr=False)
    _waiting: dict[str, _Waiting] = field(default_factory=dict, compare=False, repr=False)

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

    def approval_request(self, item: ToolApprovalItem) -> PendingApproval | None:
        """The ledger's approval request behind an interruption (what to show the human)."""
        waiting = self._waiting.get(item.call_id or "")
        return waiting.request if waiting is not None else None

    async def reject(self, state: RunState[Any], item: ToolApprovalItem, reason: str) -> None:
        """Deny the ledger's request behind ``item`` with ``reason`` and reject ``item`` in
        ``state``, with the ledger's refusal as the text the model reads on resume."""
        call_id = item.call_id or ""
        self.planned.pop(call_id, None)
        waiting = self._waiting.pop(call_id, None)
        if waiting is None:
            refused = refusal(ErrorCode.APPROVAL_INVALID, f"A human denied this call: {reason}")
        else:
            refused = await waiting.settle(Deny(reason))
        state.reject(item, rejection_message=result_text(refused))


def ledger_run_of(tool_context: RunContextWrapper[Any]) -> LedgerRun:
    run = tool_context.context
    if not isinstance(run, LedgerRun):
        run = getattr(run, "ledger_run", None)
    if not isinstance(run, LedgerRun):
        raise TypeError(
            "ledger tools need a LedgerRun as the run context (Runner.run(..., context=...)), "
            "or a context object with a ledger_run attribute"
        )
    return run


def function_tool(
    client: Caller,
    spec: ToolSpec,
    *,
    wait: float | None = None,
    approvals: Approvals | None = None,
) -> FunctionTool:
    """One ledger tool as a ``FunctionTool``: the manifest's argument schema (no key
    argument), and an ``on_invoke_tool`` that runs the call through ``client``. It returns
    the normalised JSON (``{"ok": true, "result": ...}`` or ``{"ok": false, "error": ...}``)
    for the model to read; failures are outputs, not exceptions. A tool whose calls may need
    approval sets ``needs_approval`` (see the module); ``approvals`` decides the requests
    (default: the client's own, :func:`producers.approvals.approvals_for`)."""
    call = _ToolCalls(client, spec.name, spec.keyed, wait, approvals)

    async def on_invoke_tool(tool_context: ToolContext[Any], raw_arguments: str) -> str:
        return result_text(await call.invoked(tool_context, raw_arguments))

    async def needs_approval(
        run_context: RunContextWrapper[Any], arguments: dict[str, Any], call_id: str
    ) -> bool:
        return await call.needs_approval(run_context, arguments, call_id)

    return FunctionTool(
        name=spec.name,
        description=runtime_keyed_description(spec),
        params_json_schema=arguments_schema(spec),
        on_invoke_tool=on_invoke_tool,
        # the ledger validates against the pydantic model itself; OpenAI's strict mode would
        # make every optional argument required
        strict_json_schema=False,
        needs_approval=False if approval_rule(spec) == "none" else needs_approval,
    )


def function_tools(
    client: Caller,
    tools: Mapping[str, ToolSpec] | Iterable[ToolSpec],
    *,
    wait: float | None = None,
    approvals: Approvals | None = None,
) -> list[FunctionTool]:
    return [
        function_tool(client, spec, wait=wait, approvals=approvals)
        for spec in index_tools(tools).values()
    ]


@dataclass(frozen=True, slots=True)
class _ToolCalls:
    """The calls of one ledger tool, as the SDK asks about them and invokes them."""

    client: Caller
    name: str
    keyed: bool
    wait: float | None
    approvals: Approvals | None

    async def needs_approval(
        self, run_context: RunContextWrapper[Any], arguments: dict[str, Any], call_id: str
    ) -> bool:
        """Make the call now: an ``APPROVAL_REQUIRED`` answer interrupts the run, any other
        is kept for the invocation (under the same step)."""
        run = ledger_run_of(run_context)
        tool_context = ToolContext(
            context=run_context.context,
            tool_name=self.name,
            tool_call_id=call_id,
            tool_arguments=json.dumps(arguments),
        )
        step_id = run.step_id_for(self.name, tool_context)
        run.planned[call_id] = step_id
        result = await self._call(arguments, run, step_id)
        request = pending_approval(result)
        if request is None:
            run._answers[call_id] = result
            return False

        async def settle(decision: Approve | Deny) -> CallResult:
            decided = await decide_as_named(
                self.client,
                run.approvals or self.approvals,
                run.approver,
                run.context,
                request,
                decision,
            )
            if decided.error is not None:
                return CallResult(status=None, error=decided.error)
            return _for_model(await self._call(arguments, run, step_id))

        run._waiting[call_id] = _Waiting(request, settle)
        return True

    async def invoked(self, tool_context: ToolContext[Any], raw_arguments: str) -> CallResult:
        """The SDK runs the call: an answer kept from :meth:`needs_approval`, or a call the
        application approved (grant, then call), or a call made now."""
        run = ledger_run_of(tool_context)
        call_id = tool_context.tool_call_id
        answered = run._answers.pop(call_id, None)
        waiting = run._waiting.pop(call_id, None)
        step_id = run.planned.pop(call_id, None) or run.step_id_for(self.name, tool_context)
        if answered is not None:
            return _for_model(answered)
        if waiting is not None:  # the SDK invokes it only once the application approved it
            return await waiting.settle(Approve())
        try:
            check_text_depth(raw_arguments or "{}")
            arguments = json.loads(raw_arguments or "{}")
        except NestingTooDeep as exc:
            return refusal(ErrorCode.VALIDATION_FAILED, str(exc))
        except ValueError as exc:
            return refusal(ErrorCode.VALIDATION_FAILED, f"The arguments are not valid JSON: {exc}")
        return _for_model(await self._call(arguments, run, step_id))

    async def _call(self, arguments: Any, run: LedgerRun, step_id: str) -> CallResult:
        if not isinstance(arguments, dict):
            return refusal(ErrorCode.VALIDATION_FAILED, "The arguments must be a JSON object.")
        call = self.client.call(
            self.name,
            arguments,
            idempotency_key=derive_idempotency_key(run.run_id, step_id) if self.keyed else None,
            context=run.context,
            wait=self.wait,
            run_id=run.run_id,
            step_id=step_id,
        )
        if not self.keyed:
            return await call
        async with run.in_order:
            return await call


def _for_model(result: CallResult) -> CallResult:
    """An answer as the model reads it: a call waiting for a human says the runtime brings
    the decision back (the model does not call again)."""
    request = pending_approval(result)
    return result if request is None else awaiting_approval(result, request)
