"""The Anthropic adapter submits a model turn's tool uses as one call group when its client
runs groups: ``toolledger.Ledger`` on the embedded ledger, and ``HttpLedgerClient`` through the
HTTP API. Mutations are chained in block order, read-only calls are not, a retried turn
replays, a failure stops the calls after it, and an approval pauses the group until the
decision resumes it. Side effects are counted in the helpdesk's store (no deduplication)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from anthropic.types import TextBlock, ToolResultBlockParam, ToolUseBlock

from tests.over_http import over_http
from toolledger import Ledger, TrustedContext
from toolledger.embedded import EmbeddedLedger
from toolledger.processors.groups import step_key
from toolledger.processors.groups.definition import STEP_ID_PATTERN
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
from toolledger.producers.adapters import ToolSpec
from toolledger.producers.adapters.anthropic import (
    Approve,
    Deny,
    ToolResults,
    execute_tool_use,
    execute_tool_uses,
    step_id,
)
from toolledger.producers.adapters.groups import (
    NOT_RUN,
    GroupCaller,
    group_caller,
    group_step_id,
    group_step_key,
    turn_group_key,
)
from toolledger.producers.approvals import Approvals
from toolledger.producers.http_client import HttpLedgerClient
from toolledger.producers.keys import derive_idempotency_key
from toolledger.projections.dialect import SQLITE
from toolledger.projections.groups import search_groups, views
from toolledger.schemas.groups import GroupView
from toolledger.schemas.keys import CallKey
from toolledger.settings import LedgerSettings

ACME = TrustedContext("acme", "agent-a")
# the user the agent acts for, with her own credential: confirms what her agent asked for
USER = TrustedContext("acme", "agent-a", frozenset({"approvals:confirm"}))
OPERATOR = TrustedContext("acme", "op@acme", frozenset({"tools:call", "operator"}))
EMAIL: dict[str, object] = {"to": "customer@example.com", "subject": "Refund", "body": "Done."}
SLOW: dict[str, object] = {"payload": "first", "fault": "slow", "delay_ms": 300}


@dataclass
class Desk:
    client: Ledger | HttpLedgerClient
    store: HelpdeskStore
    tools: dict[str, ToolSpec]
    approvals_as: Callable[[TrustedContext], Approvals]  # who decides, as the transport sees it
    groups_of: Callable[[str], Any]  # run id -> awaitable of the run's groups (read model)

    def effects(self, run_id: str, tool: str, ordinal: int, turn: int = 0) -> int:
        """How often the downstream ran the ``ordinal``-th ``tool`` call of the turn's group,
        keyed as the ledger keys a group's step (``processors.groups.step_key``)."""
        key = step_key(turn_group_key(run_id, turn), group_step_id(tool, ordinal))
        return self.store.effect_count("acme", tool, key)

    async def turn(self, content: list[object], run_id: str, **options: Any) -> ToolResults:
        return await execute_tool_uses(content, self.client, self.tools, ACME, run_id, 0, **options)


@pytest.fixture(params=["embedded", "http"])
async def desk(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Desk]:
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    registry = helpdesk_registry(store)
    path = tmp_path / "ledger.db"
    try:
        if request.param == "embedded":
            async with Ledger.embedded(path, registry, context=ACME) as ledger:
                tools: dict[str, ToolSpec] = {t.name: t for t in await ledger.tools()}

                async def read_model(run_id: str) -> list[GroupView]:
                    with sqlite3.connect(path) as conn:
                        return views(conn.execute(*search_groups(SQLITE, "acme", run_id, 50)))

                yield Desk(ledger, store, tools, lambda _: ledger, read_model)
            return
        async with EmbeddedLedger(LedgerSettings(path=path, create=True), registry) as embedded:
            door = over_http(embedded, lambda: registry)
            client = door.http_ledger(ACME)

            async def listed(run_id: str) -> list[GroupView]:
                # GET /v1/groups?run_id=, with the client's own connection and token
                response = await client._http.get("/v1/groups", params={"run_id": run_id})
                assert response.status_code == 200, response.text
                return [GroupView.model_validate(g) for g in response.json()["items"]]

            try:
                tools = {t.name: t for t in await client.tools()}
                yield Desk(client, store, tools, door.http_ledger, listed)
            finally:
                await door.close()
    finally:
        store.close()


def tool_use(call_id: str, name: str, arguments: object) -> ToolUseBlock:
    if not isinstance(arguments, dict):  # what a model may send, past the SDK's types
        unchecked = cast("dict[str, object]", arguments)
        return ToolUseBlock.model_construct(id=call_id, name=name, input=unchecked, type="tool_use")
    return ToolUseBlock(id=call_id, name=name, input=arguments, type="tool_use")


def content_of(block: ToolResultBlockParam) -> dict[str, Any]:
    content = block["content"]
    assert isinstance(content, str)
    parsed: dict[str, Any] = json.loads(content)
    assert block.get("is_error", False) is (not parsed["ok"])
    return parsed


def _effect_order(store: HelpdeskStore, keys: list[str]) -> list[str]:
    rows = store._conn.execute("SELECT idempotency_key FROM effects ORDER BY seq").fetchall()
    return [k for (k,) in rows if k in keys]


async def test_a_turn_is_one_group_its_mutations_chained_in_block_order(desk: Desk) -> None:
    turn: list[object] = [
        TextBlock(type="text", text="Writing a note, then opening a ticket."),
        tool_use("toolu_1", "flaky_write", SLOW),
        tool_use("toolu_2", "list_tickets", {}),
        tool_use("toolu_3", "create_ticket", {"title": "After the note"}),
        tool_use("toolu_4", "list_tickets", {}),
    ]
    results = await desk.turn(turn, "run-chain")
    assert [r["tool_use_id"] for r in results] == ["toolu_1", "toolu_2", "toolu_3", "toolu_4"]
    assert all(not r["is_error"] for r in results), results
    ticket = content_of(results[2])
    # the JSON a lone call gives, its call id named by the group's step key
    assert set(ticket) == {"ok", "status", "result", "replayed", "attempts", "call_id"}
    assert ticket["replayed"] is False and ticket["status"] == "SUCCEEDED"
    key = step_key(turn_group_key("run-chain", 0), "create_ticket-1")
    # the key is the turn caller's own (the default key scope, tenant+principal)
    assert ticket["call_id"] == CallKey("acme", "create_ticket", key, ACME.principal).call_id

    # the slow write's effect comes first: the ticket waited for it
    write = step_key(turn_group_key("run-chain", 0), "flaky_write-1")
    assert _effect_order(desk.store, [write, key]) == [write, key]

    [group] = await desk.groups_of("run-chain")
    assert results.group is not None and group.group_id == results.group.group_id
    assert group.status == "SUCCEEDED" and group.on_failure == "stop"
    assert group.idempotency_key == turn_group_key("run-chain", 0)
    assert {s.id: s.depends_on for s in group.steps} == {
        "flaky_write-1": [],
        "list_tickets-1": [],  # reads wait for nothing
        "create_ticket-1": ["flaky_write-1"],
        "list_tickets-2": [],
    }


async def test_independent_tools_are_not_chained_and_overlap(desk: Desk) -> None:
    turn: list[object] = [
        tool_use("toolu_1", "flaky_write", SLOW),
        tool_use("toolu_2", "create_ticket", {"title": "Quick"}),
    ]
    independent = ("flaky_write", "create_ticket")
    results = await desk.turn(turn, "run-free", independent=independent)
    assert all(not r["is_error"] for r in results)
    [group] = await desk.groups_of("run-free")
    assert [s.depends_on for s in group.steps] == [[], []]
    slow = step_key(turn_group_key("run-free", 0), "flaky_write-1")
    fast = step_key(turn_group_key("run-free", 0), "create_ticket-1")
    assert _effect_order(desk.store, [slow, fast]) == [fast, slow]  # the ticket did not wait


async def test_a_retried_turn_replays_the_group(desk: Desk) -> None:
    first = await desk.turn(
        [
            tool_use("toolu_1", "create_ticket", {"title": "One"}),
            tool_use("toolu_2", "flaky_write", {"payload": "note"}),
        ],
        "run-retry",
    )
    # the same turn regenerated: new tool_use ids, the same calls
    again = await desk.turn(
        [
            tool_use("toolu_8", "create_ticket", {"title": "One"}),
            tool_use("toolu_9", "flaky_write", {"payload": "note"}),
        ],
        "run-retry",
    )
    assert [r["tool_use_id"] for r in again] == ["toolu_8", "toolu_9"]
    assert [content_of(r)["replayed"] for r in again] == [True, True]
    assert [content_of(r)["result"] for r in again] == [content_of(r)["result"] for r in first]
    assert desk.effects("run-retry", "create_ticket", 1) == 1
    assert desk.effects("run-retry", "flaky_write", 1) == 1
    assert len(desk.store.tickets("acme")) == 1
    assert len(await desk.groups_of("run-retry")) == 1

    # another turn in the same place: refused as a whole, nothing runs
    other = await desk.turn([tool_use("toolu_x", "create_ticket", {"title": "Two"})], "run-retry")
    error = content_of(other[0])["error"]
    assert error["code"] == "IDEMPOTENCY_KEY_REUSED" and "did not run" in error["message"]
    assert len(desk.store.tickets("acme")) == 1


async def test_a_failed_mutation_stops_the_mutations_after_it(desk: Desk) -> None:
    turn: list[object] = [
        tool_use("toolu_1", "flaky_write", {"payload": "p", "fault": "final"}),
        tool_use("toolu_2", "list_tickets", {}),
        tool_use("toolu_3", "create_ticket", {"title": "Never"}),
    ]
    results = await desk.turn(turn, "run-fail")
    failed = content_of(results[0])
    assert failed["status"] == "FAILED_FINAL"
    # the failure reads as the same call made on its own reads
    alone = await execute_tool_use(
        tool_use("toolu_9", "flaky_write", {"payload": "p", "fault": "final"}),
        desk.client,
        desk.tools,
        ACME,
        "run-fail-alone",
        "s",
    )
    assert failed["error"] == content_of(alone)["error"]
    assert content_of(results[1])["ok"] is True  # a read started with it
    skipped = content_of(results[2])
    assert results[2]["is_error"] is True and skipped["error"]["code"] == NOT_RUN
    assert "did not run" in skipped["error"]["message"]
    assert "toolu_1" in skipped["error"]["message"]
    assert desk.effects("run-fail", "create_ticket", 1) == 0
    assert desk.store.tickets("acme") == []
    [group] = await desk.groups_of("run-fail")
    assert group.status == "FAILED"


async def test_calls_refused_before_the_group_are_answered_as_alone(desk: Desk) -> None:
    invalid: dict[str, object] = {"title": 5, "tenant_id": "globex"}
    turn: list[object] = [
        tool_use("toolu_1", "drop_database", {}),
        tool_use("toolu_2", "list_tickets", {}),
        tool_use("toolu_3", "create_ticket", invalid),
        tool_use("toolu_4", "flaky_write", {"payload": "after the invalid ticket"}),
    ]
    results = await desk.turn(turn, "run-invalid")
    assert content_of(results[0])["error"]["code"] == "TOOL_NOT_FOUND"
    assert content_of(results[1])["ok"] is True
    alone = await execute_tool_use(
        tool_use("toolu_9", "create_ticket", invalid), desk.client, desk.tools, ACME, "r", "s"
    )
    refused = content_of(results[2])
    assert refused["error"] == content_of(alone)["error"]  # the field errors, as alone
    assert {fe["loc"] for fe in refused["error"]["field_errors"]} == {"title", "tenant_id"}
    assert content_of(results[3])["error"]["code"] == NOT_RUN  # after a refused mutation
    assert desk.effects("run-invalid", "flaky_write", 1) == 0
    [group] = await desk.groups_of("run-invalid")
    assert [s.id for s in group.steps] == ["list_tickets-1"]

    # an input that is not an object is refused the same way, and breaks the chain too
    broken = await desk.turn(
        [tool_use("toolu_5", "create_ticket", "oops"), tool_use("toolu_6", "flaky_write", {})],
        "run-not-object",
    )
    assert content_of(broken[0])["error"]["code"] == "VALIDATION_FAILED"
    assert content_of(broken[1])["error"]["code"] == NOT_RUN
    assert broken.group is None and await desk.groups_of("run-not-object") == []


async def test_an_approval_pauses_the_group_and_decisions_resume_it(desk: Desk) -> None:
    turn: list[object] = [
        tool_use("toolu_1", "create_ticket", {"title": "Refund"}),
        tool_use("toolu_2", "send_email", EMAIL),
        tool_use("toolu_3", "flaky_write", {"payload": "after the email"}),
    ]
    first = await desk.turn(turn, "run-approve")
    [email] = first.pending
    assert (email.tool_use_id, email.step_id) == ("toolu_2", step_id(0, "send_email", 1))
    assert (email.request.tool, email.request.approver_kind) == ("send_email", "user")
    assert email.request.impact["irreversible"] is True  # the request in full, for the human
    told = content_of(first[1])["error"]
    assert told["code"] == "APPROVAL_REQUIRED" and email.approval_id in told["message"]
    assert "without another call" in told["suggested_action"]
    waits = content_of(first[2])["error"]
    assert waits["code"] == NOT_RUN and "toolu_2" in waits["message"]
    assert first.group is not None and first.group.status == "BLOCKED"
    assert desk.effects("run-approve", "send_email", 1) == 0
    assert desk.effects("run-approve", "flaky_write", 1) == 0

    # the application names nobody: the agent's own context does not confirm; still waiting
    unnamed = await desk.turn(turn, "run-approve", decisions={"toolu_2": Approve()})
    [still] = unnamed.pending
    assert still.refused is not None and still.refused.code == "FORBIDDEN"
    assert desk.effects("run-approve", "send_email", 1) == 0
    as_user = {"approvals": desk.approvals_as(USER), "approver": USER}
    decided = await desk.turn(turn, "run-approve", decisions={"toolu_2": Approve()}, **as_user)
    assert decided.pending == ()
    assert [content_of(r)["ok"] for r in decided] == [True, True, True]
    assert [content_of(r)["replayed"] for r in decided] == [True, False, False]
    assert decided.group is not None and decided.group.status == "SUCCEEDED"
    assert desk.effects("run-approve", "send_email", 1) == 1
    assert desk.effects("run-approve", "flaky_write", 1) == 1

    again = await desk.turn(turn, "run-approve", decisions={"toolu_2": Approve()}, **as_user)
    assert [content_of(r)["replayed"] for r in again] == [True, True, True]
    assert desk.effects("run-approve", "send_email", 1) == 1
    assert len(await desk.groups_of("run-approve")) == 1


async def test_a_denied_call_stops_the_group(desk: Desk) -> None:
    turn: list[object] = [
        tool_use("toolu_1", "send_email", EMAIL),
        tool_use("toolu_2", "create_ticket", {"title": "After the email"}),
    ]
    [email] = (await desk.turn(turn, "run-deny")).pending
    denied = await desk.turn(turn, "run-deny", decisions={email.approval_id: Deny("Wrong one")})
    assert denied.pending == ()
    refused = content_of(denied[0])["error"]
    assert refused["code"] == "APPROVAL_INVALID" and "Wrong one" in refused["message"]
    assert content_of(denied[1])["error"]["code"] == NOT_RUN
    assert desk.effects("run-deny", "send_email", 1) == 0
    assert desk.store.tickets("acme") == []


async def test_a_refused_decision_stays_pending_until_an_operator_decides(desk: Desk) -> None:
    charge: dict[str, object] = {"customer_id": "c1", "amount_cents": 4200, "currency": "EUR"}
    turn: list[object] = [tool_use("toolu_1", "charge_card", charge)]

    async def decide_as(who: TrustedContext) -> ToolResults:
        return await desk.turn(
            turn,
            "run-four-eyes",
            decisions={"toolu_1": Approve()},
            approvals=desk.approvals_as(who),
            approver=who,
        )

    mine = await decide_as(ACME)
    [pending] = mine.pending
    assert pending.request.approver_kind == "operator"
    assert pending.refused is not None and pending.refused.code == "FORBIDDEN"
    assert desk.effects("run-four-eyes", "charge_card", 1) == 0

    operated = await decide_as(OPERATOR)
    assert operated.pending == () and content_of(operated[0])["ok"] is True
    assert desk.effects("run-four-eyes", "charge_card", 1) == 1


async def test_without_groups_the_turn_runs_call_by_call(desk: Desk) -> None:
    turn: list[object] = [tool_use("toolu_1", "create_ticket", {"title": "Alone"})]
    results = await desk.turn(turn, "run-calls", as_group=False)
    assert results.group is None and await desk.groups_of("run-calls") == []
    key = derive_idempotency_key("run-calls", step_id(0, "create_ticket", 1))
    assert desk.store.effect_count("acme", "create_ticket", key) == 1


async def test_which_clients_run_groups(tmp_path: Path) -> None:
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    registry = helpdesk_registry(store)
    try:
        async with Ledger.embedded(tmp_path / "l.db", registry, context=ACME) as ledger:
            typed: GroupCaller = ledger  # mypy checks that Ledger fits the protocol
            assert group_caller(ledger) is typed
        # Ledger.kafka runs groups only with postgres= (and the tools): else one by one
        assert group_caller(Ledger.kafka("127.0.0.1:1")) is None
        with_groups = Ledger.kafka("127.0.0.1:1", registry, postgres="postgresql://x")
        assert group_caller(with_groups) is with_groups
        async with EmbeddedLedger(
            LedgerSettings(path=tmp_path / "e.db", create=True), registry
        ) as embedded:
            door = over_http(embedded, lambda: registry)
            try:
                assert group_caller(embedded.client) is None  # a bare LedgerClient
                assert group_caller(door) is None  # a Caller with no groups
                assert group_caller(door.http_ledger(ACME)) is not None
            finally:
                await door.close()
    finally:
        store.close()


def test_the_adapter_derives_step_keys_and_ids_as_the_ledger_does() -> None:
    import re

    group = turn_group_key("run-1", 3)
    assert group == derive_idempotency_key("run-1", "turn-3")
    for tool in ("create_ticket", "t" * 64):
        step = group_step_id(tool, 2)
        assert re.fullmatch(STEP_ID_PATTERN, step)
        assert group_step_key(group, step) == step_key(group, step)
    assert group_step_id("create_ticket", 2) == "create_ticket-2"
    assert group_step_id("t" * 64, 1) != group_step_id("t" * 63 + "u", 1)
