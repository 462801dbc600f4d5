"""The OpenAI Agents SDK and Anthropic adapters, driven through the SDKs' own objects against
an embedded ledger (no model), once in-process and once through the HTTP transport and the
HTTP API: keys come from the run and step, never from the provider's tool-call id, so a
retried turn executes once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agents import FunctionTool
from agents.tool import invoke_function_tool
from agents.tool_context import ToolContext
from anthropic.types import TextBlock, ToolResultBlockParam, ToolUseBlock

from tests.over_http import over_http
from toolledger.embedded import EmbeddedLedger
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
from toolledger.producers.adapters import ToolSpec
from toolledger.producers.adapters.anthropic import (
    execute_tool_use,
    execute_tool_uses,
    step_id,
    tool_definitions,
)
from toolledger.producers.adapters.openai_agents import LedgerRun, function_tools
from toolledger.producers.client import Caller, TrustedContext
from toolledger.producers.keys import derive_idempotency_key
from toolledger.serve import tool_infos
from toolledger.settings import LedgerSettings

ACME = TrustedContext("acme", "agent-a")
GLOBEX = TrustedContext("globex", "agent-g")


@dataclass
class Setup:
    client: Caller
    store: HelpdeskStore
    tools: dict[str, ToolSpec]


@pytest.fixture(params=["in-process", "http"])
async def setup(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Setup]:
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    registry = helpdesk_registry(store)
    try:
        async with EmbeddedLedger(
            LedgerSettings(path=tmp_path / "ledger.db", create=True), registry
        ) as ledger:
            if request.param == "in-process":
                yield Setup(ledger.client, store, dict(tool_infos(registry)))
                return
            client = over_http(ledger, lambda: registry)
            try:
                # over HTTP the adapters take the tools as GET /v1/tools lists them
                listed = await client.tools(ACME)
                yield Setup(client, store, {t.name: t for t in listed})
            finally:
                await client.close()
    finally:
        store.close()


# -- OpenAI Agents SDK --------------------------------------------------------------------


def by_name(tools: list[FunctionTool]) -> dict[str, FunctionTool]:
    return {tool.name: tool for tool in tools}


def tool_context(
    run: object, tool: str, call_id: str, arguments: dict[str, Any]
) -> ToolContext[Any]:
    return ToolContext(
        context=run, tool_name=tool, tool_call_id=call_id, tool_arguments=json.dumps(arguments)
    )


async def invoke(
    tool: FunctionTool, run: object, call_id: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    """The way the Agents SDK's runner invokes a function tool."""
    output = await invoke_function_tool(
        function_tool=tool,
        context=tool_context(run, tool.name, call_id, arguments),
        arguments=json.dumps(arguments),
    )
    assert isinstance(output, str)
    parsed: dict[str, Any] = json.loads(output)
    return parsed


async def test_function_tools_describe_the_manifests(setup: Setup) -> None:
    tools = by_name(function_tools(setup.client, setup.tools))
    assert set(tools) == set(setup.tools)
    for name, tool in tools.items():
        manifest = setup.tools[name].manifest
        assert tool.params_json_schema == manifest["arguments_schema"]
        assert "idempotency_key" not in tool.params_json_schema["properties"]  # not the model's
        assert tool.strict_json_schema is False
        assert tool.description.startswith(manifest["description"])
    assert "idempotency key" in tools["create_ticket"].description


async def test_function_tool_runs_through_the_ledger(setup: Setup) -> None:
    create = by_name(function_tools(setup.client, setup.tools))["create_ticket"]
    run = LedgerRun("run-1", ACME)
    result = await invoke(create, run, "call_A", {"title": "Printer on fire"})
    assert result["ok"] is True and result["replayed"] is False
    assert run.steps == {"create_ticket": 1}
    key = derive_idempotency_key("run-1", "create_ticket#1")
    assert setup.store.effect_count("acme", "create_ticket", key) == 1
    listed = await invoke(
        by_name(function_tools(setup.client, setup.tools))["list_tickets"], run, "call_L", {}
    )
    assert [t["ticket_id"] for t in listed["result"]["tickets"]] == [result["result"]["ticket_id"]]


async def test_retried_turn_with_new_tool_call_ids_executes_once(setup: Setup) -> None:
    tools = by_name(function_tools(setup.client, setup.tools))
    run = LedgerRun("run-2", ACME)
    persisted = dict(run.steps)  # the runtime saves the counters with the conversation

    # the turn: two calls, run in parallel by the SDK; then the process dies before the
    # turn's outputs are saved
    ticket = await invoke(tools["create_ticket"], run, "call_1", {"title": "T"})
    written = await invoke(tools["flaky_write"], run, "call_2", {"payload": "p"})

    # the retry: restored counters, a regenerated turn with new call ids, other order
    run.steps = dict(persisted)
    written_again = await invoke(tools["flaky_write"], run, "call_9", {"payload": "p"})
    ticket_again = await invoke(tools["create_ticket"], run, "call_8", {"title": "T"})
    assert ticket_again["replayed"] is True and ticket_again["result"] == ticket["result"]
    assert written_again["replayed"] is True and written_again["result"] == written["result"]
    for tool in ("create_ticket", "flaky_write"):
        key = derive_idempotency_key("run-2", f"{tool}#1")
        assert setup.store.effect_count("acme", tool, key) == 1

    # the next step is a new action
    second = await invoke(tools["create_ticket"], run, "call_10", {"title": "T"})
    assert second["replayed"] is False and second["result"] != ticket["result"]
    key = derive_idempotency_key("run-2", "create_ticket#2")
    assert setup.store.effect_count("acme", "create_ticket", key) == 1


async def test_function_tool_failures_are_outputs_for_the_model(setup: Setup) -> None:
    tools = by_name(function_tools(setup.client, setup.tools))
    run = LedgerRun("run-3", ACME)
    invalid = await invoke(tools["create_ticket"], run, "c1", {"title": "", "priority": "urgent"})
    assert invalid["ok"] is False
    assert invalid["error"]["code"] == "VALIDATION_FAILED"
    assert set(invalid["error"]) >= {"code", "message", "retryable", "suggested_action"}

    not_json = await tools["create_ticket"].on_invoke_tool(
        tool_context(run, "create_ticket", "c2", {}), "{not json"
    )
    assert json.loads(not_json)["error"]["code"] == "VALIDATION_FAILED"

    failed = await invoke(tools["flaky_write"], run, "c3", {"payload": "p", "fault": "final"})
    assert failed["status"] == "FAILED_FINAL"
    assert failed["error"]["code"] == "DOWNSTREAM_REFUSED"

    # a retried step whose model changed the arguments: refused, not executed
    run.steps["flaky_write"] = 0
    reused = await invoke(tools["flaky_write"], run, "c4", {"payload": "other"})
    assert reused["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"


async def test_function_tool_tenant_comes_from_the_run_context(setup: Setup) -> None:
    create = by_name(function_tools(setup.client, setup.tools))["create_ticket"]
    run = LedgerRun("run-4", ACME)
    sneaky = await invoke(create, run, "c1", {"title": "T", "tenant_id": "globex"})
    assert sneaky["error"]["code"] == "VALIDATION_FAILED"
    assert setup.store.tickets("globex") == [] and setup.store.tickets("acme") == []

    @dataclass
    class AppContext:  # an application's own context that carries the ledger run
        user: str
        ledger_run: LedgerRun

    theirs = await invoke(create, AppContext("g", LedgerRun("run-4", GLOBEX)), "c1", {"title": "G"})
    assert theirs["ok"] is True
    assert [t["ticket_id"] for t in setup.store.tickets("globex")] == [
        theirs["result"]["ticket_id"]
    ]

    with pytest.raises(TypeError, match="LedgerRun"):
        await create.on_invoke_tool(tool_context(None, "create_ticket", "c", {}), "{}")


# -- Anthropic ----------------------------------------------------------------------------


def tool_use(call_id: str, name: str, arguments: dict[str, object]) -> ToolUseBlock:
    return ToolUseBlock(id=call_id, name=name, input=arguments, type="tool_use")


def content_of(block: ToolResultBlockParam) -> dict[str, Any]:
    content = block["content"]
    assert isinstance(content, str)
    parsed: dict[str, Any] = json.loads(content)
    assert block.get("is_error", False) is (not parsed["ok"])
    return parsed


async def test_anthropic_tool_definitions(setup: Setup) -> None:
    definitions = {d["name"]: d for d in tool_definitions(setup.tools)}
    assert set(definitions) == set(setup.tools)
    for name, definition in definitions.items():
        assert set(definition) == {"name", "description", "input_schema"}
        assert definition["input_schema"] == setup.tools[name].manifest["arguments_schema"]
        assert definition["description"].startswith(setup.tools[name].manifest["description"])


async def test_tool_use_runs_through_the_ledger(setup: Setup) -> None:
    block = tool_use("toolu_01", "create_ticket", {"title": "Printer on fire"})
    result = await execute_tool_use(block, setup.client, setup.tools, ACME, "run-5", "step-1")
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_01"
    assert result["is_error"] is False
    created = content_of(result)
    assert created["ok"] is True and created["replayed"] is False
    key = derive_idempotency_key("run-5", "step-1")
    assert setup.store.effect_count("acme", "create_ticket", key) == 1


async def test_retried_tool_use_with_a_new_id_executes_once(setup: Setup) -> None:
    ticket: dict[str, object] = {"title": "Refund order 1234"}
    first = await execute_tool_use(
        tool_use("toolu_A", "create_ticket", ticket),
        setup.client,
        setup.tools,
        ACME,
        "run-6",
        "step-3",
    )
    retried = await execute_tool_use(
        tool_use("toolu_B", "create_ticket", dict(ticket)),
        setup.client,
        setup.tools,
        ACME,
        "run-6",
        "step-3",
    )
    assert retried["tool_use_id"] == "toolu_B"  # answers the block it was given
    assert content_of(retried)["replayed"] is True
    assert content_of(retried)["result"] == content_of(first)["result"]
    key = derive_idempotency_key("run-6", "step-3")
    assert setup.store.effect_count("acme", "create_ticket", key) == 1


async def test_an_unapproved_charge_is_an_error_result_that_says_so(setup: Setup) -> None:
    charge: dict[str, object] = {"customer_id": "c1", "amount_cents": 500, "currency": "EUR"}
    answer = await execute_tool_use(
        tool_use("toolu_C", "charge_card", charge), setup.client, setup.tools, ACME, "run-8", "s"
    )
    assert answer.get("is_error") is True
    error = content_of(answer)["error"]
    assert error["code"] == "APPROVAL_REQUIRED" and error["retryable"] is False
    assert "approval request apr_" in error["message"]
    key = derive_idempotency_key("run-8", "s")
    assert setup.store.effect_count("acme", "charge_card", key) == 0


async def test_tool_use_failures_are_error_results(setup: Setup) -> None:
    async def run(block: ToolUseBlock, step: str) -> ToolResultBlockParam:
        return await execute_tool_use(block, setup.client, setup.tools, ACME, "run-7", step)

    unknown = await run(tool_use("t1", "drop_database", {}), "s1")
    assert unknown["is_error"] is True
    assert content_of(unknown)["error"]["code"] == "TOOL_NOT_FOUND"

    invalid = await run(tool_use("t2", "create_ticket", {"title": 5}), "s2")
    assert content_of(invalid)["error"]["code"] == "VALIDATION_FAILED"

    sneaky = await run(tool_use("t3", "create_ticket", {"title": "x", "tenant_id": "globex"}), "s3")
    assert content_of(sneaky)["error"]["code"] == "VALIDATION_FAILED"
    assert setup.store.tickets("globex") == []

    assert content_of(await run(tool_use("t4", "create_ticket", {"title": "A"}), "s4"))["ok"]
    reused = await run(tool_use("t5", "create_ticket", {"title": "B"}), "s4")
    assert reused["is_error"] is True
    assert content_of(reused)["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"


async def test_a_whole_turn_and_its_reordered_retry(setup: Setup) -> None:
    turn = [
        TextBlock(type="text", text="Opening two tickets and writing a note."),
        tool_use("toolu_1", "create_ticket", {"title": "One"}),
        tool_use("toolu_2", "flaky_write", {"payload": "note"}),
        tool_use("toolu_3", "create_ticket", {"title": "Two"}),
        tool_use("toolu_4", "list_tickets", {}),
    ]
    results = await execute_tool_uses(turn, setup.client, setup.tools, ACME, "run-8", 0)
    assert [r["tool_use_id"] for r in results] == ["toolu_1", "toolu_2", "toolu_3", "toolu_4"]
    assert all(not r["is_error"] for r in results)

    # the retried turn: new ids, the other tools' blocks first; the tickets keep their order
    retry = [
        tool_use("toolu_7", "flaky_write", {"payload": "note"}),
        tool_use("toolu_8", "create_ticket", {"title": "One"}),
        tool_use("toolu_9", "create_ticket", {"title": "Two"}),
    ]
    again = await execute_tool_uses(retry, setup.client, setup.tools, ACME, "run-8", 0)
    assert [content_of(r)["replayed"] for r in again] == [True, True, True]
    assert content_of(again[0])["result"] == content_of(results[1])["result"]
    assert content_of(again[1])["result"] == content_of(results[0])["result"]
    assert content_of(again[2])["result"] == content_of(results[2])["result"]
    for tool, ordinal in (("create_ticket", 1), ("create_ticket", 2), ("flaky_write", 1)):
        key = derive_idempotency_key("run-8", step_id(0, tool, ordinal))
        assert setup.store.effect_count("acme", tool, key) == 1
    assert len(setup.store.tickets("acme")) == 2

    # the same tool's blocks swapped: each gets the other's key with other arguments
    swapped = [
        tool_use("toolu_x", "create_ticket", {"title": "Two"}),
        tool_use("toolu_y", "create_ticket", {"title": "One"}),
    ]
    refused = await execute_tool_uses(swapped, setup.client, setup.tools, ACME, "run-8", 0)
    assert [content_of(r)["error"]["code"] for r in refused] == ["IDEMPOTENCY_KEY_REUSED"] * 2
    assert len(setup.store.tickets("acme")) == 2


def _effect_order(store: HelpdeskStore, keys: list[str]) -> list[str]:
    """The keys in the order the downstream recorded their effects."""
    rows = store._conn.execute("SELECT idempotency_key FROM effects ORDER BY seq").fetchall()
    return [k for (k,) in rows if k in keys]


@pytest.mark.parametrize("independent", [False, True])
async def test_a_turns_mutations_run_in_the_order_the_model_emitted_them(
    setup: Setup, independent: bool
) -> None:
    turn = [
        tool_use("toolu_1", "flaky_write", {"payload": "first", "fault": "slow", "delay_ms": 300}),
        tool_use("toolu_2", "create_ticket", {"title": "second"}),
    ]
    run = f"run-order-{independent}"
    allowed = ("flaky_write", "create_ticket") if independent else ()
    results = await execute_tool_uses(
        turn, setup.client, setup.tools, ACME, run, 0, independent=allowed
    )
    assert all(not r["is_error"] for r in results)
    slow = derive_idempotency_key(run, step_id(0, "flaky_write", 1))
    fast = derive_idempotency_key(run, step_id(0, "create_ticket", 1))
    # in order, the slow write's effect comes first; declared independent, they overlap and
    # the quick ticket is recorded while the write still sleeps
    expected = [fast, slow] if independent else [slow, fast]
    assert _effect_order(setup.store, [slow, fast]) == expected


async def test_function_tool_mutations_invoked_together_take_turns(setup: Setup) -> None:
    tools = by_name(function_tools(setup.client, setup.tools))
    run = LedgerRun("run-openai-order", ACME)
    slow_args = {"payload": "first", "fault": "slow", "delay_ms": 300}
    outputs = await asyncio.gather(  # as the SDK runs parallel tool calls of one turn
        invoke(tools["flaky_write"], run, "call_1", slow_args),
        invoke(tools["create_ticket"], run, "call_2", {"title": "second"}),
        invoke(tools["list_tickets"], run, "call_3", {}),
    )
    assert all(o["ok"] for o in outputs), outputs
    slow = derive_idempotency_key("run-openai-order", "flaky_write#1")
    fast = derive_idempotency_key("run-openai-order", "create_ticket#1")
    assert _effect_order(setup.store, [slow, fast]) == [slow, fast]
