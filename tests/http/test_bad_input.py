"""Bad input: every malformed request gets its documented status and code, never a 5xx, and
executes nothing (the downstream store shows no effect and the key stays unused)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.http.helpers import (
    JSON,
    assert_call,
    assert_problem,
    calls_path,
    post_call,
    post_raw,
    raw_request,
)
from tests.http.servers import ACME, NO_SCOPE, Server

BODY = b'{"arguments":{"title":"bad input"}}'


@pytest.fixture
async def nothing_ran(server: Server, client: httpx.AsyncClient, key: str) -> AsyncIterator[None]:
    """After the test: nothing ran under ``key``, and the key is still free to use."""
    yield
    assert server.effects_with_key(key) == 0
    found = await client.get("/v1/calls", params={"idempotency_key": key})
    assert found.status_code == 200 and found.json()["items"] == []
    fresh = await post_call(client, "create_ticket", {"title": "bad input"}, key=key)
    assert_call(fresh, "SUCCEEDED", replayed=False)
    assert server.effects("acme", "create_ticket", key) == 1


BAD_BODIES = {
    "wrong content type": ([("Content-Type", "text/plain")], BODY),
    "form content type": ([("Content-Type", "application/x-www-form-urlencoded")], b"a=b"),
    "no content type": ([], BODY),
    "invalid json": ([("Content-Type", JSON)], b'{"arguments": {"title": '),
    "not utf-8": ([("Content-Type", JSON)], b'{"arguments": {"title": "\xff\xfe"}}'),
    "lone surrogate": ([("Content-Type", JSON)], b'{"arguments": {"title": "\\ud800"}}'),
    "body is an array": ([("Content-Type", JSON)], b"[1, 2]"),
    "body is a string": ([("Content-Type", JSON)], b'"arguments"'),
    "body is null": ([("Content-Type", JSON)], b"null"),
    "empty body": ([("Content-Type", JSON)], b""),
    "missing arguments": ([("Content-Type", JSON)], b'{"run_id": "r"}'),
    "arguments not an object": ([("Content-Type", JSON)], b'{"arguments": [1]}'),
    "arguments null": ([("Content-Type", JSON)], b'{"arguments": null}'),
    "extra field": ([("Content-Type", JSON)], b'{"arguments": {"title": "x"}, "tenant": "t"}'),
    "run_id not a string": ([("Content-Type", JSON)], b'{"arguments": {}, "run_id": 1}'),
    "empty run_id": ([("Content-Type", JSON)], b'{"arguments": {"title": "x"}, "run_id": ""}'),
    "NUL in run_id": ([("Content-Type", JSON)], b'{"arguments": {}, "run_id": "a\\u0000b"}'),
    "control in step_id": ([("Content-Type", JSON)], b'{"arguments": {}, "step_id": "a\\u001b"}'),
    "argument of the wrong type": ([("Content-Type", JSON)], b'{"arguments": {"title": 5}}'),
    "unknown argument": ([("Content-Type", JSON)], b'{"arguments": {"title": "x", "z": 1}}'),
    "missing argument": ([("Content-Type", JSON)], b'{"arguments": {}}'),
    "NaN argument": ([("Content-Type", JSON)], b'{"arguments": {"title": NaN}}'),
    "duplicate member": ([("Content-Type", JSON)], b'{"arguments": {}, "arguments": 1}'),
}


@pytest.mark.parametrize("case", list(BAD_BODIES), ids=list(BAD_BODIES))
async def test_malformed_body_is_400_validation_failed(
    client: httpx.AsyncClient, key: str, case: str, nothing_ran: None
) -> None:
    headers, content = BAD_BODIES[case]
    response = await post_raw(
        client, "create_ticket", content, [*headers, ("Idempotency-Key", key)]
    )
    problem = assert_problem(response, 400, "VALIDATION_FAILED")
    assert problem["retryable"] is False
    if case in ("missing arguments", "extra field", "argument of the wrong type"):
        assert problem["errors"], problem
        assert all({"loc", "msg", "type"} <= set(e) for e in problem["errors"])


async def test_field_errors_name_the_fields(client: httpx.AsyncClient, key: str) -> None:
    headers = {"Content-Type": JSON, "Idempotency-Key": key}
    missing = await post_raw(client, "create_ticket", b"{}", headers)
    errors = assert_problem(missing, 400, "VALIDATION_FAILED")["errors"]
    assert [e["loc"] for e in errors] == ["arguments"]
    wrong = await post_call(client, "create_ticket", {"title": 5, "priority": "urgent"}, key=key)
    errors = assert_problem(wrong, 400, "VALIDATION_FAILED")["errors"]
    assert {e["loc"] for e in errors} == {"title", "priority"}


BAD_KEYS: dict[str, bytes] = {
    "control character": b"abc\x01def",
    "escape character": b"abc\x1bdef",
    "delete character": b"abc\x7fdef",
    "inner tab": b"abc\tdef",
    "256 characters": b"k" * 256,
    "non-ascii utf-8": "cl\u00e9-caf\u00e9".encode(),
    "non-ascii latin-1": b"cl\xe9",
    "empty": b"",
    "only spaces": b"   ",
    "empty quoted": b'""',
}


@pytest.mark.parametrize("case", list(BAD_KEYS), ids=list(BAD_KEYS))
async def test_unusable_key_is_400_idempotency_key_invalid(
    server: Server, key: str, case: str, nothing_ran: None
) -> None:
    response = await raw_request(server.base_url, [b"Idempotency-Key: " + BAD_KEYS[case]], BODY)
    assert response.status == 400, response.body
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == "IDEMPOTENCY_KEY_INVALID"


async def test_nul_and_control_characters_inside_arguments_are_just_data(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    arguments = {"title": "nul\u0000 esc\u001b del\u007f", "body": "\u0000"}
    first = await post_call(client, "create_ticket", arguments, key=key)
    assert_call(first, "SUCCEEDED", replayed=False)
    replay = await post_call(client, "create_ticket", arguments, key=key)
    assert replay.content == first.content and replay.headers["idempotent-replayed"] == "true"
    events = await client.get(f"/v1/calls/{first.json()['call_id']}/events")
    assert events.status_code == 200
    assert server.effects("acme", "create_ticket", key) == 1


async def test_key_of_255_characters_is_fine(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    key = (key + "-" + "k" * 255)[:255]
    assert len(key) == 255
    response = await post_call(client, "create_ticket", {"title": "long key"}, key=key)
    assert assert_call(response, "SUCCEEDED", replayed=False)["idempotency_key"] == key


async def test_two_key_header_lines_are_400(server: Server, key: str, nothing_ran: None) -> None:
    for lines in (
        [f"Idempotency-Key: {key}".encode(), f"Idempotency-Key: {key}".encode()],
        [f"Idempotency-Key: {key}".encode(), f"idempotency-key: {key}-2".encode()],
    ):
        response = await raw_request(server.base_url, lines, BODY)
        assert response.status == 400
        assert response.json()["code"] == "IDEMPOTENCY_KEY_INVALID"
    assert server.effects_with_key(f"{key}-2") == 0
    # one line with a comma is one key (commas are allowed inside a key), not two
    response = await raw_request(server.base_url, [f"Idempotency-Key: {key},x".encode()], BODY)
    assert response.status == 200 and response.json()["idempotency_key"] == f"{key},x"


async def test_missing_key_on_a_mutation_is_400_missing(
    client: httpx.AsyncClient, key: str, nothing_ran: None
) -> None:
    for tool, arguments in (
        ("create_ticket", {"title": "bad input"}),
        ("flaky_write", {"payload": "x"}),
        ("send_email", {"to": "a@example.com", "subject": "s", "body": "b"}),
    ):
        response = await post_call(client, tool, arguments)
        assert_problem(response, 400, "IDEMPOTENCY_KEY_MISSING")


async def test_two_mib_body_is_413(
    server: Server, client: httpx.AsyncClient, key: str, nothing_ran: None
) -> None:
    big = b'{"arguments":{"title":"' + b"x" * (2 << 20) + b'"}}'
    response = await post_raw(
        client, "create_ticket", big, {"Content-Type": JSON, "Idempotency-Key": key}
    )
    assert_problem(response, 413, "PAYLOAD_TOO_LARGE")

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked upload
        for start in range(0, len(big), 1 << 16):
            yield big[start : start + (1 << 16)]

    streamed = await client.post(
        calls_path("create_ticket"),
        content=chunks(),
        headers={"Content-Type": JSON, "Idempotency-Key": key},
    )
    assert_problem(streamed, 413, "PAYLOAD_TOO_LARGE")


async def test_arguments_over_one_mib_are_413(
    client: httpx.AsyncClient, key: str, nothing_ran: None
) -> None:
    body = json.dumps({"arguments": {"payload": "x" * ((1 << 20) + 16)}}).encode()
    response = await post_raw(
        client, "flaky_write", body, {"Content-Type": JSON, "Idempotency-Key": key}
    )
    assert_problem(response, 413, "PAYLOAD_TOO_LARGE")


async def test_unknown_tool_is_404(client: httpx.AsyncClient, key: str, nothing_ran: None) -> None:
    for tool in ("no_such_tool", "CREATE_TICKET", "create_ticket%20"):
        response = await post_raw(
            client, tool, BODY, {"Content-Type": JSON, "Idempotency-Key": key}
        )
        assert_problem(response, 404, "TOOL_NOT_FOUND")


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer wrong-token-0123456789",
        f"Basic {ACME.token}",
        f"Bearer {ACME.token}x",
        ACME.token,
    ],
    ids=["none", "empty", "scheme only", "wrong token", "basic", "extended", "no scheme"],
)
async def test_no_or_wrong_token_is_401(
    server: Server,
    key: str,
    authorization: str | None,
    nothing_ran: None,
) -> None:
    headers = {"Content-Type": JSON, "Idempotency-Key": key}
    if authorization is not None:
        headers["Authorization"] = authorization
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as anonymous:
        response = await post_raw(anonymous, "create_ticket", BODY, headers)
        assert_problem(response, 401, "UNAUTHENTICATED")
        assert response.headers["www-authenticate"].lower().startswith("bearer")
        for path in ("/v1/calls", "/v1/tools", "/v1/calls/call_x", "/v1/calls/call_x/events"):
            read = await anonymous.get(path, headers=headers)
            assert_problem(read, 401, "UNAUTHENTICATED")


async def test_missing_scope_is_403_forbidden(
    server: Server, client: httpx.AsyncClient, key: str, nothing_ran: None
) -> None:
    response = await post_call(
        client, "create_ticket", {"title": "bad input"}, key=key, headers=NO_SCOPE.headers
    )
    assert_problem(response, 403, "FORBIDDEN")


@pytest.mark.parametrize("method", ["GET", "PUT", "PATCH", "DELETE", "OPTIONS"])
async def test_only_post_executes(
    server: Server,
    client: httpx.AsyncClient,
    key: str,
    method: str,
    nothing_ran: None,
) -> None:
    response = await client.request(
        method,
        calls_path("create_ticket"),
        content=BODY,
        headers={"Content-Type": JSON, "Idempotency-Key": key},
    )
    assert_problem(response, 405, "METHOD_NOT_ALLOWED")
    assert "POST" in response.headers["allow"]


async def test_nothing_is_a_server_error(server: Server, client: httpx.AsyncClient) -> None:
    """Odd but harmless requests around the API never produce a 5xx."""
    odd = [
        ("GET", "/v1/calls?limit=0"),
        ("GET", "/v1/calls?limit=100000"),
        ("GET", "/v1/calls?limit=abc"),
        ("GET", "/v1/calls?status=NOPE"),
        ("GET", "/v1/calls?cursor=%00%01"),
        ("GET", "/v1/calls?cursor=" + "A" * 120),
        ("GET", "/v1/calls/" + "x" * 5000),
        ("GET", "/v1/calls/%00/events"),
        ("GET", "/v1/calls/%00"),
        ("GET", "/v1/calls?tool=%00"),
        ("GET", "/v1/calls?idempotency_key=%00"),
        ("GET", "/v1/calls?run_id=%00&status=SUCCEEDED"),
        ("POST", "/v1/tools/%00/calls"),
        ("POST", "/v1/calls"),
        ("DELETE", "/v1/calls/call_x"),
        ("GET", "/v1/tools/create_ticket"),
        ("GET", "/problems/%00"),
        ("GET", "/nowhere"),
    ]
    for method, path in odd:
        response = await client.request(method, path)
        assert response.status_code < 500, (method, path, response.text)
        if path.startswith("/v1/calls?") and response.status_code == 200:
            assert response.json()["items"] == [], path  # matches nothing
            continue
        assert response.status_code >= 400, (method, path)
        assert response.headers["content-type"].startswith("application/problem+json")
