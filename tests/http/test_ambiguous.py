"""Requests that could be read two ways are refused with 400 and run nothing; quoted keys are
read exactly as RFC 8941 sf-strings; every read-only call has an id of its own. On every
backend."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.http.helpers import assert_call, assert_problem, post_call, raw_request
from tests.http.servers import ACME, GLOBEX, Server


def _body(title: str) -> bytes:
    return json.dumps({"arguments": {"title": title}}).encode()


def _framing(body: bytes) -> list[bytes]:
    return [b"Content-Type: application/json", f"Content-Length: {len(body)}".encode()]


async def test_two_authorization_headers_are_refused_and_run_nothing(
    server: Server, key: str
) -> None:
    body = _body("two tenants")
    head = [
        f"Authorization: Bearer {GLOBEX.token}".encode(),
        f"Authorization: Bearer {ACME.token}".encode(),
        *_framing(body),
        f"Idempotency-Key: {key}".encode(),
    ]
    response = await raw_request(server.base_url, head, body, standard=False)
    assert response.status == 400, response.body
    assert response.json()["code"] == "VALIDATION_FAILED"
    assert "Authorization" in str(response.json()["detail"])
    assert server.effects("acme", "create_ticket", key) == 0
    assert server.effects("globex", "create_ticket", key) == 0


@pytest.mark.parametrize(
    "body",
    [
        b'{"arguments":{"title":"first","title":"second"}}',
        b'{"arguments":{"title":"a"},"arguments":{"title":"b"}}',
        b'{"arguments":{"title":"a","body":{"x":1,"x":2}}}',
        b'{"arguments":{"title":"a"},"run_id":"r1","run_id":"r2"}',
    ],
    ids=["in-arguments", "top-level", "nested", "run-id"],
)
async def test_duplicate_json_members_are_refused_and_run_nothing(
    server: Server, client: httpx.AsyncClient, key: str, body: bytes
) -> None:
    response = await client.post(
        "/v1/tools/create_ticket/calls",
        content=body,
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
    )
    problem = assert_problem(response, 400, "VALIDATION_FAILED")
    assert "twice" in problem["detail"], problem
    assert server.effects("acme", "create_ticket", key) == 0
    fresh = await post_call(client, "create_ticket", {"title": "ok"}, key=key)
    assert_call(fresh, "SUCCEEDED", replayed=False)  # the key was not used


@pytest.mark.parametrize(
    "extra",
    [
        [b"Content-Type: text/plain"],
        [b"Transfer-Encoding: chunked"],
    ],
    ids=["two-content-types", "length-and-transfer-encoding"],
)
async def test_ambiguous_framing_is_refused_and_runs_nothing(
    server: Server, key: str, extra: list[bytes]
) -> None:
    body = _body("framing")
    head = [f"Idempotency-Key: {key}".encode(), *extra]
    response = await raw_request(server.base_url, head, body)
    assert response.status == 400, (response.status, response.body)
    assert server.effects("acme", "create_ticket", key) == 0


@pytest.mark.parametrize(
    ("quoted", "bare"),
    [(rb'"a\\b"', rb"a\b"), (rb'"say \"hi\""', rb'say "hi"'), (b'"K K"', b"K K")],
    ids=["escaped-backslash", "escaped-quote", "inner-space"],
)
async def test_a_quoted_key_is_its_sf_string_value(
    server: Server, key: str, quoted: bytes, bare: bytes
) -> None:
    suffix = key.encode()
    body = _body(f"quoted {key}")
    first = await raw_request(
        server.base_url, [b"Idempotency-Key: " + quoted[:-1] + suffix + b'"'], body
    )
    assert first.status == 200, first.body
    again = await raw_request(server.base_url, [b"Idempotency-Key: " + bare + suffix], body)
    assert again.status == 200 and again.headers.get("idempotent-replayed") == "true"
    assert again.body == first.body
    assert server.effects("acme", "create_ticket", bare.decode() + key) == 1


@pytest.mark.parametrize(
    "value",
    [b'" "', b'" a"', b'"a "', rb'"a\x"', b'"a"b"', rb'"a\"'],
    ids=["one-space", "leading-space", "trailing-space", "bad-escape", "inner-quote", "dangling"],
)
async def test_a_malformed_quoted_key_is_400(server: Server, value: bytes) -> None:
    response = await raw_request(server.base_url, [b"Idempotency-Key: " + value], _body("q"))
    assert response.status == 400, response.body
    assert response.json()["code"] == "IDEMPOTENCY_KEY_INVALID"


async def test_each_read_only_call_has_its_own_readable_id(
    server: Server, client: httpx.AsyncClient
) -> None:
    ids = []
    for _ in range(3):
        response = await client.post("/v1/tools/list_tickets/calls", json={"arguments": {}})
        body = assert_call(response, "SUCCEEDED", replayed=False)
        ids.append(body["call_id"])
    assert len(set(ids)) == 3
    for call_id in ids:
        found = await client.get(f"/v1/calls/{call_id}")
        for _ in range(50):  # the projection of the distributed backend lags a little
            if found.status_code == 200:
                break
            await asyncio.sleep(0.1)
            found = await client.get(f"/v1/calls/{call_id}")
        assert found.status_code == 200, found.text
        assert found.json()["call_id"] == call_id and found.json()["status"] == "SUCCEEDED"
    foreign = await client.get(f"/v1/calls/{ids[0]}", headers=GLOBEX.headers)
    assert foreign.status_code == 404
