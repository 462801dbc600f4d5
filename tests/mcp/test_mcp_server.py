"""``toolledger mcp`` through the ``mcp`` SDK's own client, over stdio and streamable HTTP.

The servers are real processes on the embedded backend; side effects are counted in the
helpdesk's downstream store, which does not deduplicate (a double execution shows as two).
Over HTTP every test runs twice: with the 2026-07-28 per-request protocol (the client's
default, ``mode="auto"``) and with the initialize handshake and a stateful session
(``mode="legacy"``, what most deployed clients speak).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from tests.mcp.common import (
    ACME,
    ACME_TOKEN,
    CHARGE,
    GLOBEX_TOKEN,
    KEYED,
    NEEDS_APPROVAL,
    ROOT,
    Deployment,
    approval_request,
    body,
    deployment,
    embedded,
    error_code,
    http_client,
    http_server_process,
    new_key,
    server_command,
    stdio_parameters,
)
from toolledger.producers.mcp_groups import GROUP_TOOLS
from toolledger.producers.mcp_server import LedgerMcpServer, mcp_input_schema
from toolledger.serve import tool_infos


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with http_server_process(deployment(tmp_path_factory.mktemp("mcp-http"))) as deploy:
        yield deploy


# -- the checks, shared by both transports --------------------------------------------------


async def check_listing(client: Client) -> None:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    # the ledger's tools, and the call groups' (this backend runs groups)
    assert set(tools) == KEYED | {"list_tickets"} | set(GROUP_TOOLS)
    for name in KEYED:
        tool = tools[name]
        schema = tool.input_schema
        assert schema["type"] == "object"
        assert "idempotency_key" in schema["required"]
        key = schema["properties"]["idempotency_key"]
        assert (key["type"], key["minLength"], key["maxLength"]) == ("string", 1, 255)
        assert key["pattern"] == r"^[\x20-\x7E]+$"
        token = schema["properties"]["approval_token"]  # optional, next to the key
        assert (token["type"], token["minLength"], token["maxLength"]) == ("string", 1, 4096)
        assert "approval_token" not in schema["required"]
        assert tool.description is not None
        assert "same key" in tool.description and "stored outcome" in tool.description
        # how long the key is kept, stated in the description (the default: 24 hours)
        assert "key is kept for PT24H (ISO 8601, 24 hours)" in tool.description, name
        # only the tools that need a human's approval say so
        assert ("APPROVAL_REQUIRED" in tool.description) is (name in NEEDS_APPROVAL), name
        annotations = tool.annotations
        assert annotations is not None
        assert annotations.read_only_hint is False
        assert annotations.idempotent_hint is True
        assert annotations.open_world_hint is True
        assert annotations.destructive_hint is (name in {"send_email", "charge_card"})
        effect = "long_running" if name == "export_tickets" else "mutation"
        assert tool.meta is not None and tool.meta["toolledger.dev/effect"] == effect
    create = tools["create_ticket"].input_schema
    assert create["required"] == ["title", "idempotency_key"]  # the model's own arguments first
    assert create["additionalProperties"] is False
    assert set(create["properties"]) == {
        "title",
        "body",
        "priority",
        "idempotency_key",
        "approval_token",
    }
    listing = tools["list_tickets"]
    assert "idempotency_key" not in listing.input_schema.get("properties", {})
    assert "idempotency_key" not in listing.input_schema.get("required", [])
    assert "approval_token" not in listing.input_schema.get("properties", {})
    assert listing.annotations is not None
    assert listing.annotations.read_only_hint is True
    assert listing.annotations.destructive_hint is None
    assert listing.annotations.idempotent_hint is None


async def check_call_and_replay(client: Client, deploy: Deployment, tenant: str) -> None:
    key = new_key()
    arguments = {"title": "Printer on fire", "priority": "high", "idempotency_key": key}
    first = await client.call_tool("create_ticket", arguments)
    assert first.is_error is False
    created = body(first)
    assert created["ok"] is True and created["replayed"] is False
    ticket_id = created["result"]["ticket_id"]
    assert deploy.effects(tenant, "create_ticket", key) == 1

    again = await client.call_tool("create_ticket", dict(arguments))
    assert again.is_error is False
    replayed = body(again)
    assert replayed["replayed"] is True
    assert replayed["result"] == {"ticket_id": ticket_id}
    assert replayed["call_id"] == created["call_id"]
    assert deploy.effects(tenant, "create_ticket", key) == 1  # no second side effect

    listed = body(await client.call_tool("list_tickets", {}))
    assert ticket_id in {t["ticket_id"] for t in listed["result"]["tickets"]}


async def check_key_reuse(client: Client, deploy: Deployment, tenant: str) -> None:
    key = new_key()
    first = await client.call_tool("create_ticket", {"title": "A", "idempotency_key": key})
    assert body(first)["ok"] is True
    reused = await client.call_tool("create_ticket", {"title": "B", "idempotency_key": key})
    assert error_code(reused) == "IDEMPOTENCY_KEY_REUSED"
    assert body(reused)["error"]["retryable"] is False
    assert deploy.effects(tenant, "create_ticket", key) == 1


async def check_validation(client: Client, deploy: Deployment, tenant: str) -> None:
    key = new_key()
    bad = await client.call_tool(
        "create_ticket", {"title": "", "priority": "urgent", "idempotency_key": key}
    )
    assert error_code(bad) == "VALIDATION_FAILED"
    fields = {f["loc"] for f in body(bad)["error"]["field_errors"]}
    assert fields == {"title", "priority"}
    assert deploy.effects(tenant, "create_ticket", key) == 0
    # a rejection before execution does not consume the key
    fixed = await client.call_tool("create_ticket", {"title": "Fixed", "idempotency_key": key})
    assert body(fixed)["ok"] is True
    assert deploy.effects(tenant, "create_ticket", key) == 1

    missing = await client.call_tool("create_ticket", {"title": "No key"})
    assert error_code(missing) == "IDEMPOTENCY_KEY_MISSING"
    for invalid in ("", "tab\tkey", "k" * 256, "clé"):
        result = await client.call_tool("create_ticket", {"title": "x", "idempotency_key": invalid})
        assert error_code(result) == "IDEMPOTENCY_KEY_INVALID", invalid
    not_a_string = await client.call_tool("create_ticket", {"title": "x", "idempotency_key": 7})
    assert error_code(not_a_string) == "IDEMPOTENCY_KEY_INVALID"


async def check_tenant_argument_is_refused(
    client: Client, deploy: Deployment, tenant: str, other: str
) -> None:
    key = new_key()
    result = await client.call_tool(
        "create_ticket", {"title": "Sneaky", "tenant_id": other, "idempotency_key": key}
    )
    assert error_code(result) == "VALIDATION_FAILED"
    assert [f["loc"] for f in body(result)["error"]["field_errors"]] == ["tenant_id"]
    assert deploy.effects(other, "create_ticket", key) == 0
    assert deploy.effects(tenant, "create_ticket", key) == 0


async def check_approval_required(client: Client, deploy: Deployment, tenant: str) -> None:
    """A call that needs approval runs nothing and answers with the approval request; a
    token that is not one for this call is an ordinary error; the key stays usable."""
    key = new_key()
    arguments = {**CHARGE, "idempotency_key": key}
    request = approval_request(await client.call_tool("charge_card", arguments))
    assert request["tool"] == "charge_card"
    assert request["arguments"]["amount_cents"] == 1250
    assert "cus_secret_42" not in str(request)  # the manifest redacts customer_id
    assert request["impact"]["cost"] == "12.50 EUR" and request["impact"]["irreversible"] is True
    again = approval_request(await client.call_tool("charge_card", dict(arguments)))
    assert again["id"] == request["id"]
    forged = await client.call_tool("charge_card", {**arguments, "approval_token": "apt_forged"})
    assert error_code(forged) == "APPROVAL_INVALID"
    assert "approval_request" not in body(forged)
    assert deploy.effects(tenant, "charge_card", key) == 0


async def check_unknown_tool(client: Client) -> None:
    with pytest.raises(MCPError) as raised:
        await client.call_tool("drop_database", {"idempotency_key": new_key()})
    assert raised.value.code == types.INVALID_PARAMS
    assert "drop_database" in raised.value.message


# -- streamable HTTP ----------------------------------------------------------------------


async def test_http_negotiates_the_requested_protocol(http_server: Deployment, mode: str) -> None:
    async with http_client(http_server.url, ACME_TOKEN, mode) as client:
        versions = MODERN_PROTOCOL_VERSIONS if mode == "auto" else HANDSHAKE_PROTOCOL_VERSIONS
        assert client.protocol_version in versions


async def test_http_listing(http_server: Deployment, mode: str) -> None:
    async with http_client(http_server.url, ACME_TOKEN, mode) as client:
        await check_listing(client)


async def test_http_call_and_replay(http_server: Deployment, mode: str) -> None:
    async with http_client(http_server.url, ACME_TOKEN, mode) as client:
        await check_call_and_replay(client, http_server, "acme")


async def test_http_replay_across_sessions(http_server: Deployment, mode: str) -> None:
    """A client that reconnects (new session, new process) and retries gets the replay."""
    key = new_key()
    arguments = {"payload": "p", "idempotency_key": key}
    async with http_client(http_server.url, ACME_TOKEN, mode) as client:
        first = body(await client.call_tool("flaky_write", arguments))
    async with http_client(http_server.url, ACME_TOKEN, mode) as client:
        second = body(await client.call_tool("flaky_write", arguments))
    assert first["replayed"] is False and second["replayed"] is True
    assert first["result"] == second["result"]
    assert http_server.effects("acme", "flaky_write", key) == 1


async def test_http_key_reuse_with_other_arguments(http_server: Deployment, mode: str) -> None:
    async with http_client(http_server.url, ACME_TOKEN, mode) as client:
        await check_key_reuse(client, http_server, "acme")


async def test_http_validation_failures(http_server: Deployment, mode: str) -> None:
    async with http_client(http_server.url, ACME_TOKEN, mode) as client:
        await check_validation(client, http_server, "acme")


async def test_http_execution_failure_is_an_error_result(
    http_server: Deployment, mode: str
) -> None:
    async with http_client(http_server.url, ACME_TOKEN, mode) as client:
        key = new_key()
        arguments = {"payload": "p", "fault": "final", "idempotency_key": key}
        failed = await client.call_tool("flaky_write", arguments)
        assert error_code(failed) == "DOWNSTREAM_REFUSED"
        assert body(failed)["status"] == "FAILED_FINAL"
        replayed = await client.call_tool("flaky_write", arguments)
        assert error_code(replayed) == "DOWNSTREAM_REFUSED"
        assert body(replayed)["replayed"] is True


async def test_http_tenant_comes_from_the_token(http_server: Deployment, mode: str) -> None:
    async with http_client(http_server.url, ACME_TOKEN, mode) as acme:
        await check_tenant_argument_is_refused(acme, http_server, "acme", "globex")
        key = new_key()
        mine = body(await acme.call_tool("create_ticket", {"title": "A", "idempotency_key": key}))
    async with http_client(http_server.url, GLOBEX_TOKEN, mode) as globex:
        # the same key in another tenant is another call: no reuse error, its own effect
        theirs = await globex.call_tool("create_ticket", {"title": "G", "idempotency_key": key})
        assert theirs.is_error is False
        assert body(theirs)["replayed"] is False
        listed = body(await globex.call_tool("list_tickets", {}))
    assert http_server.effects("acme", "create_ticket", key) == 1
    assert http_server.effects("globex", "create_ticket", key) == 1
    tickets = {t["ticket_id"] for t in listed["result"]["tickets"]}
    assert body(theirs)["result"]["ticket_id"] in tickets
    assert mine["result"]["ticket_id"] not in tickets


async def test_http_approval_required(http_server: Deployment, mode: str) -> None:
    async with http_client(http_server.url, ACME_TOKEN, mode) as client:
        await check_approval_required(client, http_server, "acme")


async def test_http_unknown_tool_is_a_protocol_error(http_server: Deployment, mode: str) -> None:
    async with http_client(http_server.url, ACME_TOKEN, mode) as client:
        await check_unknown_tool(client)


_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": HANDSHAKE_PROTOCOL_VERSIONS[-1],
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
_ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def test_http_needs_a_known_bearer_token(http_server: Deployment) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:
        for headers in ({}, {"Authorization": "Bearer not-a-known-token-at-all"}):
            response = await http.post(
                http_server.url, json=_INITIALIZE, headers={**_ACCEPT, **headers}
            )
            assert response.status_code == 401
            assert response.headers["www-authenticate"].startswith("Bearer")


async def test_http_session_is_bound_to_the_identity_that_opened_it(
    http_server: Deployment,
) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:
        opened = await http.post(
            http_server.url,
            json=_INITIALIZE,
            headers={**_ACCEPT, "Authorization": f"Bearer {ACME_TOKEN}"},
        )
        assert opened.status_code == 200
        session = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        hijack = await http.post(
            http_server.url,
            json=listing,
            headers={
                **_ACCEPT,
                "Authorization": f"Bearer {GLOBEX_TOKEN}",
                "Mcp-Session-Id": session,
                "MCP-Protocol-Version": HANDSHAKE_PROTOCOL_VERSIONS[-1],
            },
        )
        assert hijack.status_code == 404


# -- stdio --------------------------------------------------------------------------------


async def test_stdio(tmp_path: Path) -> None:
    """One server process per client, its identity fixed at start from the token."""
    deploy = deployment(tmp_path)
    async with Client(stdio_parameters(deploy, ACME_TOKEN)) as client:
        await check_listing(client)
        await check_call_and_replay(client, deploy, "acme")
        await check_key_reuse(client, deploy, "acme")
        await check_validation(client, deploy, "acme")
        await check_tenant_argument_is_refused(client, deploy, "acme", "globex")
        await check_approval_required(client, deploy, "acme")
        await check_unknown_tool(client)
        key = new_key()
        arguments = {"title": "Across processes", "idempotency_key": key}
        first = body(await client.call_tool("create_ticket", arguments))
    # a new server process (a restarted client) answers the retry from the ledger
    async with Client(stdio_parameters(deploy, ACME_TOKEN), mode="legacy") as client:
        assert client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
        again = body(await client.call_tool("create_ticket", arguments))
    assert again["replayed"] is True and again["result"] == first["result"]
    assert deploy.effects("acme", "create_ticket", key) == 1


def test_stdio_refuses_to_start_without_a_known_token(tmp_path: Path) -> None:
    deploy = deployment(tmp_path)
    for token in ("", "not-a-known-token-at-all"):
        done = subprocess.run(
            server_command(deploy, "--transport", "stdio"),
            cwd=ROOT,
            env={**os.environ, "TOOLLEDGER_MCP_TOKEN": token},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        assert done.stdout == b""  # stdout is the protocol's
        assert b"TOOLLEDGER_MCP_TOKEN" in done.stderr


# -- in process ---------------------------------------------------------------------------


async def test_a_call_still_running_after_the_wait_is_a_retryable_error(tmp_path: Path) -> None:
    async with embedded(tmp_path) as (ledger, store):
        tools = tool_infos(ledger.registry)
        impatient = LedgerMcpServer(ledger.client, tools, fixed_context=ACME, wait_s=0.2)
        patient = LedgerMcpServer(ledger.client, tools, fixed_context=ACME, wait_s=10)
        key = new_key()
        arguments = {"payload": "p", "fault": "slow", "delay_ms": 1500, "idempotency_key": key}
        async with Client(impatient.server) as client:
            pending = await client.call_tool("flaky_write", arguments)
        assert error_code(pending) == "IDEMPOTENCY_KEY_IN_USE"
        assert body(pending)["status"] == "PENDING"
        assert body(pending)["error"]["retryable"] is True
        async with Client(patient.server) as client:
            done = await client.call_tool("flaky_write", arguments)
        assert done.is_error is False
        assert body(done)["replayed"] is True  # the retry waited for the first execution
        assert store.effect_count("acme", "flaky_write", key) == 1


async def test_without_an_identity_nothing_runs(tmp_path: Path) -> None:
    async with embedded(tmp_path) as (ledger, store):
        server = LedgerMcpServer(ledger.client, tool_infos(ledger.registry))
        key = new_key()
        async with Client(server.server) as client:
            result = await client.call_tool("create_ticket", {"title": "x", "idempotency_key": key})
        assert error_code(result) == "UNAUTHENTICATED"
        assert store.effect_counts() == {}


@pytest.mark.parametrize("name", ["idempotency_key", "approval_token"])
def test_an_argument_named_like_a_reserved_one_cannot_be_exposed(name: str) -> None:
    @dataclass
    class Spec:
        name: str
        keyed: bool
        manifest: dict[str, Any]

    schema = {"type": "object", "properties": {name: {"type": "string"}}}
    with pytest.raises(ValueError, match="reserves"):
        mcp_input_schema(Spec("clash", True, {"arguments_schema": schema}))
    read_only = mcp_input_schema(Spec("fine", False, {"arguments_schema": schema}))
    assert read_only == schema
