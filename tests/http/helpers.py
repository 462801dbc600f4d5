"""Small helpers shared by the HTTP tests."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.http.servers import ACME

PROBLEM = "application/problem+json"
JSON = "application/json"
PROBLEM_FIELDS = {"type", "title", "status", "detail", "code", "retryable", "suggested_action"}


def calls_path(tool: str) -> str:
    return f"/v1/tools/{tool}/calls"


async def post_call(
    client: httpx.AsyncClient,
    tool: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    key: str | None = None,
    wait: float | None = None,
    headers: Mapping[str, str] | None = None,
    **body: Any,
) -> httpx.Response:
    """``POST /v1/tools/{tool}/calls`` with a JSON body and, if given, the key and a wait."""
    sent = dict(headers or {})
    if key is not None:
        sent["Idempotency-Key"] = key
    if wait is not None:
        sent["Prefer"] = f"wait={wait:g}"
    payload = {"arguments": dict(arguments or {}), **body}
    return await client.post(calls_path(tool), json=payload, headers=sent)


async def post_raw(
    client: httpx.AsyncClient,
    tool: str,
    content: bytes,
    headers: Sequence[tuple[str, str]] | Mapping[str, str],
) -> httpx.Response:
    return await client.post(calls_path(tool), content=content, headers=headers)


def media_type(response: httpx.Response) -> str:
    return str(response.headers.get("content-type", "")).split(";")[0].strip()


def is_replay(response: httpx.Response) -> bool:
    return bool(response.headers.get("idempotent-replayed") == "true")


def assert_call(response: httpx.Response, status: str, *, replayed: bool) -> dict[str, Any]:
    """A 200 answer with the Call resource in ``status``; returns the resource."""
    assert response.status_code == 200, response.text
    assert media_type(response) == JSON
    assert is_replay(response) is replayed, dict(response.headers)
    if not replayed:
        assert "idempotent-replayed" not in response.headers
    body: dict[str, Any] = response.json()
    assert body["status"] == status, body
    assert body["ok"] is (status == "SUCCEEDED")
    return body


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """An ``application/problem+json`` error with the documented members."""
    assert response.status_code == status, (response.status_code, response.text)
    assert media_type(response) == PROBLEM, response.headers
    assert "idempotent-replayed" not in response.headers
    body: dict[str, Any] = response.json()
    assert set(body) >= PROBLEM_FIELDS, body
    assert body["code"] == code, body
    assert body["status"] == status
    assert body["type"] == f"/problems/{code}"
    assert isinstance(body["retryable"], bool)
    assert isinstance(body.get("errors", []), list)
    return body


async def eventually_get(
    client: httpx.AsyncClient,
    path: str,
    done: Callable[[httpx.Response], bool],
    *,
    timeout_s: float = 30.0,
) -> httpx.Response:
    """GET ``path`` until ``done(response)`` holds."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = await client.get(path)
        if done(response):
            return response
        if time.monotonic() > deadline:
            raise AssertionError(f"GET {path} never settled: {response.text}")
        await asyncio.sleep(0.1)


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, object]:
        value = json.loads(self.body)
        assert isinstance(value, dict)
        return value


async def raw_request(
    base_url: str,
    head: list[bytes],
    body: bytes,
    *,
    tool: str = "create_ticket",
    standard: bool = True,
) -> RawResponse:
    """One HTTP/1.1 request written byte for byte (as ACME), so no client library merges,
    trims or refuses header lines. ``standard=False``: only Host and Connection besides
    ``head`` (no Authorization, Content-Type or Content-Length of its own)."""
    url = urlsplit(base_url)
    assert url.hostname is not None and url.port is not None
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        usual = [
            f"Authorization: Bearer {ACME.token}".encode(),
            b"Content-Type: application/json",
            f"Content-Length: {len(body)}".encode(),
        ]
        lines = [
            f"POST {calls_path(tool)} HTTP/1.1".encode(),
            f"Host: {url.netloc}".encode(),
            *(usual if standard else []),
            b"Connection: close",
            *head,
        ]
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
        await writer.wait_closed()
    header_block, _, payload = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = header_block.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return RawResponse(int(status_line.split()[1]), headers, payload)


async def approval_token(
    client: httpx.AsyncClient, tool: str, arguments: Mapping[str, Any], key: str
) -> str:
    """Ask for ``tool`` (428), have the acme operator approve the request, return the token."""
    from tests.http.servers import OPERATOR

    asked = await post_call(client, tool, arguments, key=key)
    request = assert_problem(asked, 428, "APPROVAL_REQUIRED")["approval_request"]
    approved = await client.post(
        f"/v1/approval-requests/{request['id']}/approve", headers=OPERATOR.headers
    )
    assert approved.status_code == 200, approved.text
    token: str = approved.json()["approval_token"]
    return token
