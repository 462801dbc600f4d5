"""Deeply nested JSON at every front door of ``toolledger serve --mcp``, on both backends:
arguments nested past the documented limit (64 levels, ``schemas.nesting``) are refused with a
``400 VALIDATION_FAILED`` that names the limit, at any depth (a thousand levels used to be a
``RecursionError`` answered ``503``), for calls and for groups, over HTTP and over MCP; the
key stays unused and nothing runs."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from tests.http.conftest import BACKENDS, serving
from tests.http.servers import ACME, Server
from tests.mcp.common import body, http_client
from toolledger.schemas.nesting import MAX_DEPTH

LIMIT = "the limit is 64 levels"
DEEP = [MAX_DEPTH + 1, 1000, 100_000]


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from serving(request, tmp_path_factory, "deep", "--mcp")


def nested_text(depth: int) -> str:
    """JSON arguments ``depth`` levels deep (the object itself is the first): a ticket with
    an unknown member ``extra`` holding the rest."""
    inner = "[" * (depth - 1) + "]" * (depth - 1)
    return f'{{"title": "deep", "extra": {inner}}}'


def _key() -> str:
    return f"deep-{uuid.uuid4().hex[:12]}"


async def _post(client: httpx.AsyncClient, path: str, text: str, key: str) -> httpx.Response:
    return await client.post(
        path,
        content=text,
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
    )


def _refused_for_depth(answer: httpx.Response) -> None:
    assert answer.status_code == 400, answer.text
    problem = answer.json()
    assert problem["code"] == "VALIDATION_FAILED"
    assert problem["retryable"] is False
    assert LIMIT in problem["detail"]


async def _key_is_unused(client: httpx.AsyncClient, server: Server, key: str) -> None:
    ran = await client.post(
        "/v1/tools/create_ticket/calls",
        json={"arguments": {"title": "after"}},
        headers={"Idempotency-Key": key, "Prefer": "wait=30"},
    )
    assert ran.status_code == 200, ran.text
    assert ran.json()["status"] == "SUCCEEDED"
    assert "idempotent-replayed" not in ran.headers
    assert server.effects(ACME.tenant, "create_ticket", key) == 1


@pytest.mark.parametrize("depth", DEEP)
async def test_a_call_nested_past_the_limit_is_400_naming_it(server: Server, depth: int) -> None:
    key = _key()
    async with httpx.AsyncClient(
        base_url=server.base_url, headers=ACME.headers, timeout=60
    ) as client:
        answer = await _post(
            client, "/v1/tools/create_ticket/calls", f'{{"arguments": {nested_text(depth)}}}', key
        )
        _refused_for_depth(answer)
        await _key_is_unused(client, server, key)


async def test_a_call_at_the_limit_reaches_the_tool_validation(server: Server) -> None:
    async with httpx.AsyncClient(
        base_url=server.base_url, headers=ACME.headers, timeout=60
    ) as client:
        answer = await _post(
            client,
            "/v1/tools/create_ticket/calls",
            f'{{"arguments": {nested_text(MAX_DEPTH)}}}',
            _key(),
        )
    assert answer.status_code == 400, answer.text
    assert LIMIT not in answer.json()["detail"]
    assert [e["loc"] for e in answer.json()["errors"]] == ["extra"]


@pytest.mark.parametrize("depth", DEEP)
async def test_a_group_nested_past_the_limit_is_400_naming_it(server: Server, depth: int) -> None:
    key = _key()
    group = (
        '{"run_id": "deep", "steps": [{"id": "a", "tool": "create_ticket", '
        f'"arguments": {nested_text(depth)}}}]}}'
    )
    async with httpx.AsyncClient(
        base_url=server.base_url, headers=ACME.headers, timeout=60
    ) as client:
        answer = await _post(client, "/v1/groups", group, key)
        _refused_for_depth(answer)
        found = await client.get("/v1/groups", params={"run_id": "deep"})
        assert found.status_code == 200
        assert found.json()["items"] == []  # nothing stored


async def test_mcp_arguments_past_the_limit_are_refused_naming_it(server: Server) -> None:
    key = _key()
    deep: Any = "x"
    for _ in range(MAX_DEPTH):  # with the arguments object: 65 levels
        deep = [deep]
    async with http_client(f"{server.base_url}/mcp", ACME.token) as mcp:
        result = await mcp.call_tool(
            "create_ticket", {"idempotency_key": key, "title": "deep", "extra": deep}
        )
        assert result.is_error
        refused = body(result)
        assert refused["error"]["code"] == "VALIDATION_FAILED"
        assert LIMIT in refused["error"]["message"]
        step = {"id": "a", "tool": "create_ticket", "arguments": {"title": "t", "extra": deep}}
        with pytest.raises(MCPError) as protocol_error:  # refused before the SDK parses it
            await mcp.call_tool(
                "toolledger_run_group", {"idempotency_key": key, "run_id": "d", "steps": [step]}
            )
        assert protocol_error.value.error.code == types.INVALID_PARAMS
        assert LIMIT in protocol_error.value.error.message
        ran = await mcp.call_tool("create_ticket", {"idempotency_key": key, "title": "after"})
        assert not ran.is_error, body(ran)
    assert server.effects(ACME.tenant, "create_ticket", key) == 1


@pytest.mark.parametrize("tool", ["create_ticket", "toolledger_run_group"])
async def test_a_100000_deep_mcp_request_is_400_naming_the_limit(server: Server, tool: str) -> None:
    arguments: dict[str, Any] = {"idempotency_key": _key(), "title": "t", "extra": "@"}
    if tool == "toolledger_run_group":
        step = {"id": "a", "tool": "create_ticket", "arguments": arguments}
        arguments = {"idempotency_key": _key(), "run_id": "d", "steps": [step]}
    request = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    text = json.dumps(request).replace('"@"', "[" * 100_000 + "]" * 100_000)
    async with httpx.AsyncClient(timeout=60) as client:
        answer = await client.post(
            f"{server.base_url}/mcp",
            content=text,
            headers={
                **ACME.headers,
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
            },
        )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == types.INVALID_PARAMS
    assert LIMIT in answer.json()["error"]["message"]
