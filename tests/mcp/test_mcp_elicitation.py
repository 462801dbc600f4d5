"""MCP elicitation for approvals the user decides: the server asks the connected client's
human to confirm the exact action (``elicitation/create``; on the 2026-07-28 protocol inside
an ``InputRequiredResult``), grants or denies the ledger's request as the session's principal,
and answers the call with its outcome. Four-eyes requests and clients without elicitation get
the approval request in the result. In process, on both protocol modes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import Client
from mcp.client.session import ClientRequestContext

from tests.mcp.common import ACME, CHARGE, approval_request, body, embedded, error_code, new_key
from toolledger.processors.toolsets.helpdesk import HelpdeskStore
from toolledger.producers.mcp_server import LedgerMcpServer
from toolledger.serve import tool_infos

EMAIL = {"to": "customer@example.com", "subject": "Your refund", "body": "On its way."}
SMALL_CHARGE = {**CHARGE, "amount_cents": 500}  # up to 1,000 cents the user confirms


@dataclass
class Human:
    """The client's human: answers every confirmation with ``answer`` and keeps the questions."""

    answer: types.ElicitResult
    asked: list[types.ElicitRequestFormParams] = field(default_factory=list)

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        self.asked.append(params)
        return self.answer


def confirm(yes: bool, reason: str | None = None) -> types.ElicitResult:
    content: dict[str, str | bool] = {"confirm": yes}
    if reason is not None:
        content["reason"] = reason
    return types.ElicitResult(action="accept", content=content)


@dataclass
class Setup:
    store: HelpdeskStore
    client: Client

    def effects(self, tool: str, key: str) -> int:
        return self.store.effect_count("acme", tool, key)


@contextlib.asynccontextmanager
async def running(root: Path, mode: str, human: Human | None) -> AsyncIterator[Setup]:
    async with embedded(root) as (ledger, store):
        server = LedgerMcpServer(ledger.client, tool_infos(ledger.registry), fixed_context=ACME)
        options: dict[str, Any] = {"mode": mode}
        if human is not None:
            options["elicitation_callback"] = human
        async with Client(server.server, **options) as client:
            yield Setup(store, client)


async def test_a_confirmed_action_runs_once(tmp_path: Path, mode: str) -> None:
    human = Human(confirm(True))
    async with running(tmp_path, mode, human) as setup:
        key = new_key()
        sent = await setup.client.call_tool("send_email", {**EMAIL, "idempotency_key": key})
        assert sent.is_error is False, body(sent)
        assert body(sent)["ok"] is True and body(sent)["replayed"] is False
        assert setup.effects("send_email", key) == 1
        [question] = human.asked
        # the exact action, with the arguments as the caller sent them
        for shown in ("send_email", "customer@example.com", "Your refund", "Irreversible"):
            assert shown in question.message, question.message
        assert question.requested_schema["required"] == ["confirm"]
        assert question.requested_schema["properties"]["confirm"]["type"] == "boolean"

        # a replay returns the stored outcome and asks nobody
        again = await setup.client.call_tool("send_email", {**EMAIL, "idempotency_key": key})
        assert body(again)["replayed"] is True
        assert len(human.asked) == 1 and setup.effects("send_email", key) == 1


async def test_a_small_charge_is_the_users_to_confirm(tmp_path: Path, mode: str) -> None:
    human = Human(confirm(True))
    async with running(tmp_path, mode, human) as setup:
        key = new_key()
        paid = await setup.client.call_tool("charge_card", {**SMALL_CHARGE, "idempotency_key": key})
        assert body(paid)["ok"] is True and body(paid)["result"]["amount_cents"] == 500
        assert "5.00 EUR" in human.asked[0].message
        assert setup.effects("charge_card", key) == 1


async def test_a_refused_action_is_denied_and_nothing_runs(tmp_path: Path, mode: str) -> None:
    answers = [
        (confirm(False, "wrong customer"), "wrong customer"),
        (types.ElicitResult(action="decline"), "declined"),
        (types.ElicitResult(action="cancel"), "cancelled"),
    ]
    for answer, said in answers:
        human = Human(answer)
        async with running(tmp_path / said.replace(" ", "-"), mode, human) as setup:
            key = new_key()
            arguments = {**EMAIL, "idempotency_key": key}
            refused = await setup.client.call_tool("send_email", arguments)
            assert error_code(refused) == "APPROVAL_INVALID", body(refused)
            assert said in body(refused)["error"]["message"]
            assert setup.effects("send_email", key) == 0
            # the request is denied for good: the same call is refused without asking again
            again = await setup.client.call_tool("send_email", dict(arguments))
            assert error_code(again) == "APPROVAL_INVALID"
            assert len(human.asked) == 1 and setup.effects("send_email", key) == 0


async def test_a_client_without_elicitation_gets_the_request(tmp_path: Path, mode: str) -> None:
    async with running(tmp_path, mode, None) as setup:
        key = new_key()
        asked = await setup.client.call_tool("send_email", {**EMAIL, "idempotency_key": key})
        request = approval_request(asked)
        assert request["approver_kind"] == "user"
        assert "no approval_token needed" in body(asked)["error"]["suggested_action"]
        assert setup.effects("send_email", key) == 0


async def test_a_four_eyes_request_is_never_elicited(tmp_path: Path, mode: str) -> None:
    human = Human(confirm(True))
    async with running(tmp_path, mode, human) as setup:
        key = new_key()
        asked = await setup.client.call_tool("charge_card", {**CHARGE, "idempotency_key": key})
        request = approval_request(asked)
        assert request["approver_kind"] == "operator"
        assert "four eyes" in body(asked)["error"]["suggested_action"]
        assert human.asked == [] and setup.effects("charge_card", key) == 0
