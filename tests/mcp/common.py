"""Helpers of the MCP tests: deployments of ``toolledger mcp``, results, keys."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClientExtension
from mcp.client.streamable_http import streamable_http_client

from toolledger.embedded import EmbeddedLedger
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
from toolledger.producers.client import TrustedContext
from toolledger.settings import LedgerSettings

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ["-m", "toolledger.cli", "mcp"]

ACME_TOKEN = "acme-agent-token-0123456789"
GLOBEX_TOKEN = "globex-agent-token-0123456789"
TOKENS = {
    "tokens": [
        {"token": ACME_TOKEN, "tenant": "acme", "principal": "agent-a", "scopes": ["tools:call"]},
        {"token": GLOBEX_TOKEN, "tenant": "globex", "principal": "agent-g"},
    ]
}
ACME = TrustedContext("acme", "agent-a")
KEYED = {
    "create_ticket",
    "close_ticket",
    "send_email",
    "charge_card",
    "flaky_write",
    "export_tickets",
}
NEEDS_APPROVAL = {"send_email", "charge_card"}
CHARGE: dict[str, Any] = {"customer_id": "cus_secret_42", "amount_cents": 1250, "currency": "EUR"}
APPROVAL_REQUEST_FIELDS = {
    "id",
    "tool",
    "arguments",
    "args_digest",
    "impact",
    "status",
    "expires_at",
    "approver_kind",  # who decides: "user" or "operator"
    "call_id",  # the call resource, which shows the request while the call waits
}


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
        *("--demo", "--data", str(deploy.data), "--tokens", str(deploy.tokens)),
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


def approval_request(result: types.CallToolResult) -> dict[str, Any]:
    """The approval request of an ``APPROVAL_REQUIRED`` result (checked for its shape)."""
    assert error_code(result) == "APPROVAL_REQUIRED"
    parsed = body(result)
    assert parsed["status"] is None and parsed["error"]["retryable"] is False
    request: dict[str, Any] = parsed["approval_request"]
    assert set(request) == APPROVAL_REQUEST_FIELDS
    assert request["status"] == "pending"
    assert request["id"] in parsed["error"]["suggested_action"]
    assert "approval_token" in parsed["error"]["suggested_action"]
    assert set(request["impact"]) == {"summary", "target", "scope", "cost", "irreversible"}
    return request


# -- servers ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
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


@contextlib.contextmanager
def http_server_process(deploy: Deployment, *options: str) -> Iterator[Deployment]:
    """``toolledger mcp --transport http`` (plus ``options``) in a subprocess, until exit."""
    port = free_port()
    log = deploy.tokens.parent / "server.log"
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            server_command(
                deploy,
                *("--transport", "http", "--host", "127.0.0.1", "--port", str(port)),
                *options,
            ),
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/healthz", process, log)
        deploy.url = f"http://127.0.0.1:{port}/mcp"
        yield deploy
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


@contextlib.asynccontextmanager
async def http_client(
    url: str, token: str, mode: str = "auto", extensions: Sequence[ClientExtension] = ()
) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http,
        Client(
            streamable_http_client(url, http_client=http), mode=mode, extensions=list(extensions)
        ) as client,
    ):
        yield client


def stdio_parameters(deploy: Deployment, token: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=server_command(deploy, "--transport", "stdio")[1:],
        env={"TOOLLEDGER_MCP_TOKEN": token},
        cwd=ROOT,
    )


@contextlib.asynccontextmanager
async def embedded(root: Path) -> AsyncIterator[tuple[EmbeddedLedger, HelpdeskStore]]:
    """An embedded ledger with the helpdesk tools, in this process."""
    store = HelpdeskStore(root / "helpdesk.db")
    registry = helpdesk_registry(store)
    try:
        async with EmbeddedLedger(
            LedgerSettings(path=root / "ledger.db", create=True), registry
        ) as ledger:
            yield ledger, store
    finally:
        store.close()
