"""Approvals over MCP, in process (the SDK's client on its in-memory transport): a call that
needs a human's approval answers ``APPROVAL_REQUIRED`` with the approval request, an operator
approves it (as the HTTP API does: ``producers.governance`` + the ledger client), and the same
call plus ``approval_token`` runs once. Refusals of the approval path are ordinary errors."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import mcp_types as types
from mcp import Client

from tests.mcp.common import (
    ACME,
    CHARGE,
    approval_request,
    body,
    embedded,
    error_code,
    new_key,
)
from toolledger.embedded import EmbeddedLedger
from toolledger.processors.toolsets.helpdesk import HelpdeskStore
from toolledger.producers import governance
from toolledger.producers.mcp_server import LedgerMcpServer
from toolledger.schemas.events import ApprovalDenied, ApprovalGranted, ToolDisabled, ToolEnabled
from toolledger.serve import tool_infos


@dataclass
class Setup:
    ledger: EmbeddedLedger
    store: HelpdeskStore
    client: Client

    def effects(self, tool: str, key: str) -> int:
        return self.store.effect_count("acme", tool, key)

    def target(self, request: dict[str, Any], key: str) -> governance.ApprovalTarget:
        """What an operator approves: the request as the MCP result shows it."""
        call_key = self.ledger.client.call_key(ACME, request["tool"], key)
        return governance.ApprovalTarget(
            request["id"], "acme", request["tool"], key, request["args_digest"], call_key=call_key
        )

    async def approve(self, request: dict[str, Any], key: str) -> str:
        record, token = governance.approve(self.target(request, key), "op@acme", datetime.now(UTC))
        granted = await self.ledger.client.command(record)
        assert isinstance(granted, ApprovalGranted), granted
        return token


@contextlib.asynccontextmanager
async def running(root: Path) -> AsyncIterator[Setup]:
    """An embedded ledger, its MCP server (identity: acme) and a client connected to it."""
    async with embedded(root) as (ledger, store):
        server = LedgerMcpServer(ledger.client, tool_infos(ledger.registry), fixed_context=ACME)
        async with Client(server.server) as client:
            yield Setup(ledger, store, client)


async def test_approval_round_trip(tmp_path: Path) -> None:
    async with running(tmp_path) as setup:
        key = new_key()
        arguments = {**CHARGE, "idempotency_key": key}
        first = await setup.client.call_tool("charge_card", arguments)
        request = approval_request(first)
        assert request["tool"] == "charge_card"
        shown = request["arguments"]
        assert set(shown) == {"customer_id", "amount_cents", "currency"}
        assert (shown["amount_cents"], shown["currency"]) == (1250, "EUR")
        assert "cus_secret_42" not in json.dumps(body(first))  # redacted, also in the message
        assert request["impact"] == {
            "summary": "Charge 12.50 EUR to a customer's card on file.",
            "target": "one customer (id redacted)",
            "scope": "one card payment",
            "cost": "12.50 EUR",
            "irreversible": True,
        }
        assert datetime.fromisoformat(request["expires_at"]) > datetime.now(UTC)
        assert setup.effects("charge_card", key) == 0

        token = await setup.approve(request, key)
        # the same call (same key, same arguments) plus the token: runs once
        approved = await setup.client.call_tool(
            "charge_card", {**arguments, "approval_token": token}
        )
        assert approved.is_error is False, body(approved)
        done = body(approved)
        assert done["ok"] is True and done["replayed"] is False
        assert done["result"]["amount_cents"] == 1250
        assert setup.effects("charge_card", key) == 1

        # a replay, with or without the token, returns the stored outcome and runs nothing
        for again in (arguments, {**arguments, "approval_token": token}):
            replayed = body(await setup.client.call_tool("charge_card", dict(again)))
            assert replayed["ok"] is True and replayed["replayed"] is True
            assert replayed["result"] == done["result"]
        assert setup.effects("charge_card", key) == 1

        # the token is bound to that call: on another key it is refused, nothing runs
        other = new_key()
        stolen = await setup.client.call_tool(
            "charge_card", {**CHARGE, "idempotency_key": other, "approval_token": token}
        )
        assert error_code(stolen) == "APPROVAL_INVALID"
        assert "approval_request" not in body(stolen)
        assert body(stolen)["status"] is None
        assert setup.effects("charge_card", other) == 0


async def test_the_token_may_come_in_the_request_meta(tmp_path: Path) -> None:
    """A client application (not the model) may attach the token as request ``_meta``."""
    async with running(tmp_path) as setup:
        key = new_key()
        arguments = {
            "to": "customer@example.com",
            "subject": "Your refund",
            "body": "It is on its way.",
            "idempotency_key": key,
        }
        request = approval_request(await setup.client.call_tool("send_email", arguments))
        assert request["arguments"]["subject"] == "Your refund"
        assert "customer@example.com" not in json.dumps(request)
        token = await setup.approve(request, key)
        sent = await setup.client.call_tool(
            "send_email",
            dict(arguments),
            meta=cast(types.RequestParamsMeta, {"toolledger.dev/approval_token": token}),
        )
        assert sent.is_error is False, body(sent)
        assert setup.effects("send_email", key) == 1


async def test_the_approval_token_is_not_part_of_the_arguments(tmp_path: Path) -> None:
    """Like the key, the token is not part of the args digest: a call with and without it is
    the same call (no IDEMPOTENCY_KEY_REUSED)."""
    async with running(tmp_path) as setup:
        key = new_key()
        arguments = {"title": "Printer", "idempotency_key": key}
        first = body(await setup.client.call_tool("create_ticket", arguments))
        assert first["ok"] is True
        with_token = await setup.client.call_tool(
            "create_ticket", {**arguments, "approval_token": "apt_unneeded"}
        )
        assert body(with_token)["ok"] is True and body(with_token)["replayed"] is True
        assert setup.effects("create_ticket", key) == 1

        key = new_key()
        charge = {**CHARGE, "idempotency_key": key}
        with_forged = await setup.client.call_tool("charge_card", {**charge, "approval_token": "x"})
        assert error_code(with_forged) == "APPROVAL_INVALID"
        # the refusal consumed nothing, and the request is for the arguments without the token
        request = approval_request(await setup.client.call_tool("charge_card", charge))
        assert "approval_token" not in request["arguments"]


async def test_an_unusable_approval_token_argument_is_a_validation_error(tmp_path: Path) -> None:
    async with running(tmp_path) as setup:
        key = new_key()
        arguments = {**CHARGE, "idempotency_key": key}
        for token in (7, "", "t" * 4097, ["apt_x"]):
            result = await setup.client.call_tool(
                "charge_card", {**arguments, "approval_token": token}
            )
            assert error_code(result) == "VALIDATION_FAILED", token
            assert [f["loc"] for f in body(result)["error"]["field_errors"]] == ["approval_token"]
        # null is no token: the call asks for approval
        approval_request(
            await setup.client.call_tool("charge_card", {**arguments, "approval_token": None})
        )
        # a read-only tool takes no approval_token: it is an unknown argument there
        listed = await setup.client.call_tool("list_tickets", {"approval_token": "apt_x"})
        assert error_code(listed) == "VALIDATION_FAILED"
        assert setup.effects("charge_card", key) == 0


async def test_a_denied_request_is_an_ordinary_error(tmp_path: Path) -> None:
    async with running(tmp_path) as setup:
        key = new_key()
        arguments = {**CHARGE, "idempotency_key": key}
        request = approval_request(await setup.client.call_tool("charge_card", arguments))
        record = governance.deny(
            setup.target(request, key), "op@acme", "Not agreed with the customer", datetime.now(UTC)
        )
        assert isinstance(await setup.ledger.client.command(record), ApprovalDenied)
        denied = await setup.client.call_tool("charge_card", dict(arguments))
        assert error_code(denied) == "APPROVAL_INVALID"
        assert "Not agreed" in body(denied)["error"]["message"]
        assert "approval_request" not in body(denied)
        assert setup.effects("charge_card", key) == 0


async def test_a_switched_off_tool_is_an_ordinary_error(tmp_path: Path) -> None:
    async with running(tmp_path) as setup:

        async def switch(enabled: bool) -> object:
            record = governance.switch(
                tenant_id="acme",
                tool="create_ticket",
                enabled=enabled,
                actor="op@acme",
                reason="incident 7",
                now=datetime.now(UTC),
            )
            return await setup.ledger.client.command(record, broadcast=True)

        before = {"title": "Before", "idempotency_key": new_key()}
        assert body(await setup.client.call_tool("create_ticket", before))["ok"] is True
        assert isinstance(await switch(False), ToolDisabled)
        during = {"title": "During", "idempotency_key": new_key()}
        off = await setup.client.call_tool("create_ticket", during)
        assert error_code(off) == "TOOL_DISABLED"
        assert (
            body(off)["error"]["retryable"] is True
            and "incident 7" in body(off)["error"]["message"]
        )
        assert "approval_request" not in body(off)
        # a replay executes nothing: it is served while the tool is off
        assert body(await setup.client.call_tool("create_ticket", dict(before)))["replayed"] is True
        assert isinstance(await switch(True), ToolEnabled)
        assert body(await setup.client.call_tool("create_ticket", during))["ok"] is True
        assert setup.effects("create_ticket", during["idempotency_key"]) == 1


async def test_mcp_calls_pass_the_front_doors_refusals(tmp_path: Path) -> None:
    """Rate limits and the kill switch's pre-check apply to MCP calls as to HTTP ones: refused
    before anything is appended, so the key stays unused."""
    import json as json_module

    from toolledger.mcp_wiring import mcp_server
    from toolledger.processors.toolsets.helpdesk import helpdesk_registry
    from toolledger.producers.http.auth import TokenStore
    from toolledger.serve import Security, front_door
    from toolledger.settings import LedgerSettings

    policy = tmp_path / "policy.json"
    limits = {"tools": {"create_ticket": {"per_tenant": {"rate": 0.001, "burst": 2}}}}
    policy.write_text(json_module.dumps({"rate_limits": limits}))
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    security = Security(TokenStore([]), policy=policy)
    settings = LedgerSettings(path=tmp_path / "ledger.db", create=True)
    async with front_door(settings, helpdesk_registry(store), security) as door:
        server = mcp_server(door, fixed_context=ACME)
        async with Client(server.server) as client:
            keys = [new_key() for _ in range(3)]
            answers = [
                await client.call_tool("create_ticket", {"title": "t", "idempotency_key": k})
                for k in keys
            ]
            assert [body(a)["ok"] for a in answers[:2]] == [True, True]
            assert error_code(answers[2]) == "RATE_LIMITED"
            assert store.effect_count("acme", "create_ticket", keys[2]) == 0
            assert await door.queries.get("acme", _call_id("create_ticket", keys[2])) is None
    store.close()


def _call_id(tool: str, key: str) -> str:
    from toolledger.schemas.keys import CallKey

    return CallKey("acme", tool, key).call_id
