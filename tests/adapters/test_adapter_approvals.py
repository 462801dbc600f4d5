"""Approvals through the agent frameworks' own hooks, in-process and over HTTP: the OpenAI
Agents SDK's interruption (``needs_approval``, ``RunState.approve``/``reject``) and the
Anthropic adapter's pending tool uses and ``decisions`` grant or deny the ledger's request for
that exact call; an approved call runs once, a rejected one never, and the model reads the
ledger's answer. Side effects are counted in the helpdesk's store (no deduplication there)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from anthropic.types import ToolResultBlockParam, ToolUseBlock
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from tests.over_http import over_http
from toolledger.embedded import EmbeddedLedger
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
from toolledger.producers.adapters import ToolSpec
from toolledger.producers.adapters.anthropic import Approve, Deny, execute_tool_uses, step_id
from toolledger.producers.adapters.openai_agents import LedgerRun, function_tools
from toolledger.producers.approvals import Approvals, LedgerApprovals
from toolledger.producers.client import Caller, TrustedContext
from toolledger.producers.keys import derive_idempotency_key
from toolledger.serve import tool_infos
from toolledger.settings import LedgerSettings

ACME = TrustedContext("acme", "agent-a")
# the user the agent acts for, with her own credential: confirms what her agent asked for
USER = TrustedContext("acme", "agent-a", frozenset({"approvals:confirm"}))
OPERATOR = TrustedContext("acme", "op@acme", frozenset({"tools:call", "operator"}))
EMAIL: dict[str, object] = {
    "to": "customer@example.com",
    "subject": "Your refund",
    "body": "On its way.",
}
CHARGE = {"customer_id": "c1", "amount_cents": 4200, "currency": "EUR"}  # four eyes

set_tracing_disabled(True)


@dataclass
class Desk:
    client: Caller
    store: HelpdeskStore
    tools: dict[str, ToolSpec]
    approvals_as: Callable[[TrustedContext], Approvals]  # who decides, as the transport sees it

    def effects(self, tool: str, key: str) -> int:
        return self.store.effect_count("acme", tool, key)


@pytest.fixture(params=["in-process", "http"])
async def desk(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Desk]:
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    registry = helpdesk_registry(store)
    try:
        async with EmbeddedLedger(
            LedgerSettings(path=tmp_path / "ledger.db", create=True), registry
        ) as ledger:
            if request.param == "in-process":
                in_process = LedgerApprovals(ledger.client)
                yield Desk(ledger.client, store, dict(tool_infos(registry)), lambda _: in_process)
                return
            client = over_http(ledger, lambda: registry)
            try:
                listed: dict[str, ToolSpec] = {t.name: t for t in await client.tools(ACME)}
                yield Desk(client, store, listed, client.http_ledger)
            finally:
                await client.close()
    finally:
        store.close()


# -- OpenAI Agents SDK: a scripted model, the SDK's own runner -----------------------------


@dataclass
class ScriptedModel(Model):
    """Answers each turn with the next scripted output; keeps what it was given to read."""

    turns: list[list[Any]]
    inputs: list[Any] = field(default_factory=list)

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.inputs.append(args[1] if len(args) > 1 else kwargs.get("input"))
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        arguments=json.dumps(arguments),
        call_id=call_id,
        name=name,
        type="function_call",
        id=f"fc_{call_id}",
        status="completed",
    )


def final(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_1",
        content=[ResponseOutputText(annotations=[], text=text, type="output_text")],
        role="assistant",
        status="completed",
        type="message",
    )


def tool_output(model: ScriptedModel, call_id: str) -> dict[str, Any]:
    """The tool output the model read in its last turn for ``call_id``."""
    for item in model.inputs[-1]:
        if (
            isinstance(item, dict)
            and item.get("type") == "function_call_output"
            and (item["call_id"] == call_id)
        ):
            parsed: dict[str, Any] = json.loads(item["output"])
            return parsed
    raise AssertionError(f"no output for {call_id}")


def agent_for(desk: Desk, model: ScriptedModel) -> Agent[LedgerRun]:
    tools = function_tools(desk.client, desk.tools, approvals=desk.approvals_as(ACME))
    return Agent(name="support", model=model, tools=list(tools))


async def test_an_approved_interruption_runs_the_call_once(desk: Desk) -> None:
    model = ScriptedModel([[tool_call("call_1", "send_email", EMAIL)], [final("Sent.")]])
    agent = agent_for(desk, model)
    # the application says who confirms: the user, with her own credential
    run = LedgerRun("run-openai-approve", ACME, approver=USER, approvals=desk.approvals_as(USER))
    key = derive_idempotency_key(run.run_id, "send_email#1")

    interrupted = await Runner.run(agent, "Tell the customer", context=run)
    [item] = interrupted.interruptions
    request = run.approval_request(item)
    assert request is not None and request.tool == "send_email"
    assert request.approver_kind == "user" and request.impact["irreversible"] is True
    assert run.planned == {"call_1": "send_email#1"}  # the step is kept across the pause
    assert desk.effects("send_email", key) == 0

    state = interrupted.to_state()
    state.approve(item)
    resumed = await Runner.run(agent, state)
    assert resumed.final_output == "Sent."
    read = tool_output(model, "call_1")
    assert read["ok"] is True and read["replayed"] is False
    assert desk.effects("send_email", key) == 1 and run.planned == {}


async def test_the_agents_own_credential_does_not_confirm_its_call(desk: Desk) -> None:
    model = ScriptedModel([[tool_call("call_1", "send_email", EMAIL)], [final("Not sent.")]])
    run = LedgerRun("run-openai-self", ACME)  # decisions as the tools' approvals: the agent's
    interrupted = await Runner.run(agent_for(desk, model), "Tell the customer", context=run)
    state = interrupted.to_state()
    state.approve(interrupted.interruptions[0])
    await Runner.run(agent_for(desk, model), state)
    read = tool_output(model, "call_1")
    assert read["error"]["code"] == "FORBIDDEN" and "approvals:confirm" in read["error"]["message"]
    assert desk.effects("send_email", derive_idempotency_key(run.run_id, "send_email#1")) == 0


async def test_a_rejected_interruption_denies_the_request(desk: Desk) -> None:
    model = ScriptedModel([[tool_call("call_1", "send_email", EMAIL)], [final("Not sent.")]])
    agent = agent_for(desk, model)
    run = LedgerRun("run-openai-reject", ACME)
    interrupted = await Runner.run(agent, "Tell the customer", context=run)
    [item] = interrupted.interruptions
    state = interrupted.to_state()
    await run.reject(state, item, reason="Wrong customer")
    await Runner.run(agent, state)
    read = tool_output(model, "call_1")
    assert read["ok"] is False and read["error"]["code"] == "APPROVAL_INVALID"
    assert "Wrong customer" in read["error"]["message"]
    key = derive_idempotency_key(run.run_id, "send_email#1")
    assert desk.effects("send_email", key) == 0
    # denied for good: the same call (same key, same arguments) is refused
    again = await desk.client.call(
        "send_email", EMAIL, idempotency_key=key, context=ACME, run_id=run.run_id
    )
    assert again.error is not None and again.error.code == "APPROVAL_INVALID"


async def test_a_four_eyes_request_needs_an_operator(desk: Desk) -> None:
    model = ScriptedModel(
        [
            [tool_call("c1", "charge_card", CHARGE)],
            [tool_call("c2", "charge_card", CHARGE)],
            [final("Charged.")],
        ]
    )
    run = LedgerRun("run-openai-four-eyes", ACME)
    # the agent's own principal approving its four-eyes charge is refused; nothing runs
    agent = agent_for(desk, model)
    interrupted = await Runner.run(agent, "Charge", context=run)
    state = interrupted.to_state()
    state.approve(interrupted.interruptions[0])
    interrupted = await Runner.run(agent, state)
    read = tool_output(model, "c1")
    assert read["error"]["code"] == "FORBIDDEN"
    assert "four eyes" in read["error"]["message"].lower()
    first = derive_idempotency_key(run.run_id, "charge_card#1")
    assert desk.effects("charge_card", first) == 0

    # an operator decides the next interruption: it runs once
    run.approver, run.approvals = OPERATOR, desk.approvals_as(OPERATOR)
    state = interrupted.to_state()
    state.approve(interrupted.interruptions[0])
    done = await Runner.run(agent, state)
    assert done.final_output == "Charged."
    assert tool_output(model, "c2")["ok"] is True
    second = derive_idempotency_key(run.run_id, "charge_card#2")
    assert desk.effects("charge_card", second) == 1


async def test_a_call_refused_while_asking_is_not_interrupted(desk: Desk) -> None:
    """The SDK asks needs_approval before it invokes: the adapter's call then is the call,
    and its answer (here a validation failure) is what the invocation returns, once."""
    invalid = {**CHARGE, "amount_cents": 0}
    model = ScriptedModel([[tool_call("c1", "charge_card", invalid)], [final("Sorry.")]])
    run = LedgerRun("run-openai-invalid", ACME)
    result = await Runner.run(agent_for(desk, model), "Charge", context=run)
    assert result.interruptions == [] and result.final_output == "Sorry."
    assert tool_output(model, "c1")["error"]["code"] == "VALIDATION_FAILED"
    assert run.steps == {"charge_card": 1} and run.planned == {}


# -- Anthropic ------------------------------------------------------------------------------


def tool_use(call_id: str, name: str, arguments: dict[str, object]) -> ToolUseBlock:
    return ToolUseBlock(id=call_id, name=name, input=arguments, type="tool_use")


def content_of(block: ToolResultBlockParam) -> dict[str, Any]:
    content = block["content"]
    assert isinstance(content, str)
    parsed: dict[str, Any] = json.loads(content)
    return parsed


async def test_anthropic_pending_approvals_then_decisions(desk: Desk) -> None:
    turn = [
        tool_use("toolu_1", "create_ticket", {"title": "Refund"}),
        tool_use("toolu_2", "send_email", EMAIL),
        tool_use("toolu_3", "charge_card", {**CHARGE, "amount_cents": 500}),  # the user's
    ]
    approvals = desk.approvals_as(USER)  # the human the application names: the user

    async def run_turn(**options: Any) -> Any:
        return await execute_tool_uses(
            turn,
            desk.client,
            desk.tools,
            ACME,
            "run-claude",
            0,
            approvals=approvals,
            approver=USER,
            **options,
        )

    first = await run_turn()
    assert [p.tool_use_id for p in first.pending] == ["toolu_2", "toolu_3"]
    email, charge = first.pending
    assert (email.request.tool, email.request.approver_kind) == ("send_email", "user")
    assert email.step_id == step_id(0, "send_email", 1)
    told = content_of(first[1])["error"]
    assert told["code"] == "APPROVAL_REQUIRED"
    # the model is told the runtime brings the decision back, not to call with a token
    assert email.approval_id in told["suggested_action"]
    assert (
        "token" not in told["suggested_action"]
        and "without another call" in (told["suggested_action"])
    )
    email_key = derive_idempotency_key("run-claude", email.step_id)
    charge_key = derive_idempotency_key("run-claude", charge.step_id)
    assert desk.effects("send_email", email_key) == desk.effects("charge_card", charge_key) == 0

    # the human's answers: by tool_use id, or by approval request id
    decided = await run_turn(
        decisions={"toolu_2": Approve(), charge.approval_id: Deny("Too much for today")}
    )
    assert decided.pending == ()
    assert content_of(decided[0])["replayed"] is True  # the ticket is not made twice
    sent = content_of(decided[1])
    assert sent["ok"] is True and sent["replayed"] is False
    refused = content_of(decided[2])["error"]
    assert refused["code"] == "APPROVAL_INVALID" and "Too much for today" in refused["message"]
    assert desk.effects("send_email", email_key) == 1
    assert desk.effects("charge_card", charge_key) == 0
    assert len(desk.store.tickets("acme")) == 1

    # the same turn again: stored outcomes, nothing asked, nothing run again
    again = await run_turn(decisions={"toolu_2": Approve()})
    assert content_of(again[1])["replayed"] is True and again.pending == ()
    assert desk.effects("send_email", email_key) == 1


async def test_anthropic_an_approval_nobody_was_named_for_stays_pending(desk: Desk) -> None:
    """Without ``approver`` or ``approvals`` the adapter does not decide as the agent's own
    context: the tool use stays pending with the refusal, nothing runs; the agent's context
    named as the approver is refused too."""
    turn = [tool_use("toolu_1", "send_email", EMAIL)]
    run = "run-claude-unnamed"
    nobody = await execute_tool_uses(
        turn, desk.client, desk.tools, ACME, run, 0, decisions={"toolu_1": Approve()}
    )
    [pending] = nobody.pending
    assert pending.refused is not None and pending.refused.code == "FORBIDDEN"
    assert "named nobody" in pending.refused.message
    itself = await execute_tool_uses(
        turn,
        desk.client,
        desk.tools,
        ACME,
        run,
        0,
        decisions={"toolu_1": Approve()},
        approvals=desk.approvals_as(ACME),
        approver=ACME,
    )
    [pending] = itself.pending
    assert pending.refused is not None and pending.refused.code == "FORBIDDEN"
    assert desk.effects("send_email", derive_idempotency_key(run, pending.step_id)) == 0


async def test_anthropic_a_refused_decision_stays_pending(desk: Desk) -> None:
    """The agent's principal cannot approve a four-eyes charge: the tool use stays pending
    with the refusal; an operator's decision then runs it once."""
    turn = [tool_use("toolu_1", "charge_card", CHARGE)]

    async def run_turn(approvals: Approvals, approver: TrustedContext) -> Any:
        return await execute_tool_uses(
            turn,
            desk.client,
            desk.tools,
            ACME,
            "run-claude-4e",
            0,
            decisions={"toolu_1": Approve()},
            approvals=approvals,
            approver=approver,
        )

    mine = await run_turn(desk.approvals_as(ACME), ACME)
    [pending] = mine.pending
    assert pending.request.approver_kind == "operator"
    assert pending.refused is not None and pending.refused.code == "FORBIDDEN"
    key = derive_idempotency_key("run-claude-4e", pending.step_id)
    assert desk.effects("charge_card", key) == 0

    operated = await run_turn(desk.approvals_as(OPERATOR), OPERATOR)
    assert operated.pending == () and content_of(operated[0])["ok"] is True
    assert desk.effects("charge_card", key) == 1
