"""``toolledger mcp`` through the ``mcp`` SDK's own client, over stdio and streamable HTTP.

The servers are real processes on the embedded backend; side effects are counted in the
helpdesk's downstream store, which does not deduplicate (a double execution shows as two).
Over HTTP every test runs twice: with the 2026-07-28 per-request protocol (the client's
default, ``mode="auto"``) and with the initialize handshake and a stateful session
(``mode="legacy"``, what most deployed clients speak).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
from producers.client import TrustedContext
from producers.mcp_server import LedgerMcpServer, mcp_input_schema
from toolledger.embedded import EmbeddedLedger
from toolledger.serve import tool_infos

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ["-m", "toolledger.cli", "mcp"]  # becomes ["-m", "toolledger.cli", "mcp"] once wired

ACME_TOKEN = "acme-agent-token-0123456789"
GLOBEX_TOKEN = "globex-agent-token-0123456789"
TOKENS = {
    "tokens": [
        {"token": ACME_TOKEN, "tenant": "acme", "principal": "agent-a", "scopes": ["tools:call"]},
        {"token": GLOBEX_TOKEN, "tenant": "globex", "principal": "agent-g"},
    ]
}
ACME = TrustedContext("acme", "agent-a")
KEYED = {"create_ticket", "close_ticket", "send_email", "charge_card", "flaky_write"}


@dataclass
class Deployment:
    data: Path
    tokens: Path
    url: str = ""

    def effects(self, tenant: str, tool: str, key: str) -> int:
        store = HelpdeskStore(self.data / "helpdesk.db")
        try:
            return store.effect_count(tenant, tool, key)
        finally:
            store.close()


def deployment(root: Path) -> Deployment:
    root.mkdir(parents=True, exist_ok=True)
    tokens = root / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    return Deployment(root / "data", tokens)


def server_command(deploy: Deployment, *options: str) -> list[str]:
    return [
        sys.executable,
        *ENTRY,
        *options,
        *("--data", str(deploy.data), "--tokens", str(deploy.tokens)),
    ]


def new_key() -> str:
    return f"mcp-test:{uuid.uuid4().hex}"


def body(result: types.CallToolResult) -> dict[str, Any]:
    """The normalised JSON of a result; the text content and structuredContent agree."""
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    parsed: dict[str, Any] = json.loads(block.text)
    assert parsed == result.structured_content
    return parsed


def error_code(result: types.CallToolResult) -> str:
    assert result.is_error, result
    parsed = body(result)
    assert parsed["ok"] is False
    assert set(parsed["error"]) >= {"code", "message", "retryable", "suggested_action"}
    code: str = parsed["error"]["code"]
    return code


# -- servers ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise AssertionError(f"the MCP server exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the MCP server is not up:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    deploy = deployment(tmp_path_factory.mktemp("mcp-http"))
    port = _free_port()
    log = deploy.tokens.parent / "server.log"
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            server_command(
                deploy, "--transport", "http", "--host", "127.0.0.1", "--port", str(port)
            ),
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_healthy(f"http://127.0.0.1:{port}/healthz", process, log)
        deploy.url = f"http://127.0.0.1:{port}/mcp"
        yield deploy
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


@pytest.fixture(params=["auto", "legacy"], ids=["per-request", "handshake"])
def mode(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@contextlib.asynccontextmanager
async def http_client(url: str, token: str, mode: str) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,
    ):
        yield client


def stdio_parameters(deploy: Deployment, token: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=server_command(deploy, "--transport", "stdio")[1:],
        env={"TOOLLEDGER_MCP_TOKEN": token},
        cwd=ROOT,
    )


# -- the checks, shared by both transports --------------------------------------------------


async def check_listing(client: Client) -> None:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == KEYED | {"list_tickets"}
    for name in KEYED:
        tool = tools[name]
        schema = tool.input_schema
        assert schema["type"] == "object"
        assert "idempotency_key" in schema["required"]
        key = schema["properties"]["idempotency_key"]
        assert (key["type"], key["minLength"], key["maxLength"]) == ("string", 1, 255)
        assert key["pattern"] == r"^[\x20-\x7E]+$"
        assert tool.description is not None
        assert "same key" in tool.description and "stored outcome" in tool.description
        annotations = tool.annotations
        assert annotations is not None
        assert annotations.read_only_hint is False
        assert annotations.idempotent_hint is True
        assert annotations.open_world_hint is True
        assert annotations.destructive_hint is (name in {"send_email", "charge_card"})
        assert tool.meta is not None and tool.meta["toolledger.dev/effect"] == "mutation"
    create = tools["create_ticket"].input_schema
    assert create["required"] == ["title", "idempotency_key"]  # the model's own arguments first
    assert create["additionalProperties"] is False
    assert set(create["properties"]) == {"title", "body", "priority", "idempotency_key"}
    listing = tools["list_tickets"]
    assert "idempotency_key" not in listing.input_schema.get("properties", {})
    assert "idempotency_key" not in listing.input_schema.get("required", [])
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


@contextlib.asynccontextmanager
async def embedded(root: Path) -> AsyncIterator[tuple[EmbeddedLedger, HelpdeskStore]]:
    store = HelpdeskStore(root / "helpdesk.db")
    registry = helpdesk_registry(store)
    try:
        async with EmbeddedLedger(root / "ledger.db", registry) as ledger:
            yield ledger, store
    finally:
        store.close()


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


def test_an_argument_named_idempotency_key_cannot_be_exposed() -> None:
    @dataclass
    class Spec:
        name: str
        keyed: bool
        manifest: dict[str, Any]

    schema = {"type": "object", "properties": {"idempotency_key": {"type": "string"}}}
    with pytest.raises(ValueError, match="reserves"):
        mcp_input_schema(Spec("clash", True, {"arguments_schema": schema}))
    read_only = mcp_input_schema(Spec("fine", False, {"arguments_schema": schema}))
    assert read_only == schema
