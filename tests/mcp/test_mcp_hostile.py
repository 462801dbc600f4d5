"""``toolledger mcp`` under hostile input, as real processes: raw JSON-RPC over streamable HTTP
(a session opened with the initialize handshake) and raw lines over stdio.

Every probe gets a JSON-RPC error or a tool error and the server answers the next request:
malformed JSON-RPC, unknown methods, ill-typed ``tools/call`` params, huge and deeply nested
params, a session id of another client (another tenant, or another user of the same tenant),
``idempotencyKey`` and ``idempotency_key`` edge cases (the call group tool's too), and
``tools/call`` storms on one key: 100 concurrent calls with the same arguments run once, with
other arguments one runs and the others are refused. Effects are counted in the helpdesk's
downstream store, which does not deduplicate.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from tests.http.servers import ACME as HTTP_ACME
from tests.http.servers import GLOBEX as HTTP_GLOBEX
from tests.http.servers import Server
from tests.mcp.common import (
    ACME_TOKEN,
    GLOBEX_TOKEN,
    TOKENS,
    Deployment,
    deployment,
    http_server_process,
    new_key,
    server_command,
)
from toolledger.processors.toolsets.helpdesk import HelpdeskStore
from toolledger.producers.mcp_groups import GET_GROUP, RESUME_GROUP, RUN_GROUP
from toolledger.schemas.groups import step_key
from toolledger.schemas.nesting import MAX_DEPTH

VERSION = HANDSHAKE_PROTOCOL_VERSIONS[-1]
CAROL_TOKEN = "acme-carol-token-0123456789"  # another user of acme's tenant
STORM = 100
ANSWER_WITHIN_S = 60.0  # stdio: an answer to every line, within this


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    deploy = deployment(tmp_path_factory.mktemp("mcp-hostile"))
    carol = {"token": CAROL_TOKEN, "tenant": "acme", "principal": "carol", "scopes": ["tools:call"]}
    deploy.tokens.write_text(json.dumps({"tokens": [*TOKENS["tokens"], carol]}))
    with http_server_process(deploy) as running:
        yield running


@dataclass
class Session:
    """A stateful MCP session over streamable HTTP, spoken in raw JSON-RPC."""

    http: httpx2.AsyncClient
    url: str
    token: str
    id: str = ""

    def headers(self, token: str | None = None, session: str | None = None) -> dict[str, str]:
        headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "Authorization": f"Bearer {token or self.token}",
            "MCP-Protocol-Version": VERSION,
        }
        if session or self.id:
            headers["Mcp-Session-Id"] = session or self.id
        return headers

    async def open(self) -> Session:
        opened = await self.post(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "hostile", "version": "0"},
                },
            }
        )
        assert opened.status_code == 200, opened.text
        self.id = opened.headers["mcp-session-id"]
        initialized = await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert initialized.status_code == 202, initialized.text
        return self

    async def post(self, message: Any, **headers: str) -> httpx2.Response:
        content = message if isinstance(message, bytes) else json.dumps(message).encode()
        return await self.http.post(self.url, content=content, headers=self.headers(**headers))

    async def rpc(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": uuid.uuid4().hex, "method": method}
        if params is not None:
            message["params"] = params
        response = await self.post(message)
        assert response.status_code == 200, response.text
        answer = rpc_answer(response)
        assert answer["id"] == message["id"], answer
        return answer

    async def call(self, name: str, arguments: Any, key: Any = None, **more: Any) -> dict[str, Any]:
        params: dict[str, Any] = {"name": name, "arguments": arguments, **more}
        if key is not None:
            params["idempotencyKey"] = key
        return await self.rpc("tools/call", params)


def rpc_answer(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC message of a POST's answer: a JSON body or the one SSE ``data`` line."""
    if response.headers["content-type"].startswith("text/event-stream"):
        data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        messages = [json.loads(line) for line in data if line.strip()]
        answers = [m for m in messages if "result" in m or "error" in m]
        assert len(answers) == 1, response.text
        answer: dict[str, Any] = answers[0]
        return answer
    parsed: dict[str, Any] = response.json()
    return parsed


def tool_body(answer: dict[str, Any]) -> dict[str, Any]:
    """The normalised body of a tool result (a JSON-RPC error fails here)."""
    assert "result" in answer, answer
    result = answer["result"]
    body: dict[str, Any] = result["structuredContent"]
    assert json.loads(result["content"][0]["text"]) == body
    assert result["isError"] is (body["ok"] is False)
    return body


def tool_error(answer: dict[str, Any]) -> str:
    body = tool_body(answer)
    assert body["ok"] is False, body
    code: str = body["error"]["code"]
    return code


def rpc_error(answer: dict[str, Any]) -> dict[str, Any]:
    assert "error" in answer and "result" not in answer, answer
    error: dict[str, Any] = answer["error"]
    return error


@pytest.fixture
async def acme(http_server: Deployment) -> AsyncIterator[Session]:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=120)) as http:
        yield await Session(http, http_server.url, ACME_TOKEN).open()


def effects(deploy: Deployment) -> dict[tuple[str, str, str], int]:
    store = HelpdeskStore(deploy.data / "helpdesk.db")
    try:
        return store.effect_counts()
    finally:
        store.close()


async def assert_alive(session: Session) -> None:
    listed = await session.rpc("tools/list", {})
    assert "create_ticket" in {t["name"] for t in listed["result"]["tools"]}


# -- malformed JSON-RPC ---------------------------------------------------------------------

NOT_JSON = {
    "garbage": b"{not json",
    "empty": b"",
    "truncated": b'{"jsonrpc": "2.0", "id": 1, "method": "tools/li',
    "invalid UTF-8": b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "x": "\xff\xfe"}',
}
STDIO_NOT_JSON = ("garbage", "empty", "truncated")
NOT_A_MESSAGE = {
    "null": b"null",
    "a number": b"7",
    "a batch": b'[{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}]',
    "no jsonrpc": b'{"id": 1, "method": "tools/list"}',
    "jsonrpc 1.0": b'{"jsonrpc": "1.0", "id": 1, "method": "tools/list"}',
    "method not a string": b'{"jsonrpc": "2.0", "id": 1, "method": 5}',
    "params an array": b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": [1]}',
}


async def test_malformed_json_rpc_is_a_protocol_error_and_the_server_goes_on(
    acme: Session,
) -> None:
    """Not JSON: -32700 (Parse error); JSON that is no JSON-RPC message: the SDK's -32602
    (JSON-RPC's own code would be -32600, Invalid Request); HTTP 400, ``id`` null, either way."""
    for name, raw in [*NOT_JSON.items(), *NOT_A_MESSAGE.items()]:
        response = await acme.post(raw)
        assert response.status_code == 400, (name, response.status_code, response.text)
        answer = response.json()
        assert answer["jsonrpc"] == "2.0" and answer["id"] is None, (name, answer)
        expected = {types.PARSE_ERROR} if name in NOT_JSON else {-32600, types.INVALID_PARAMS}
        assert answer["error"]["code"] in expected, (name, answer)
    await assert_alive(acme)


async def test_unknown_methods_and_ill_typed_call_params_are_protocol_errors(
    acme: Session, http_server: Deployment
) -> None:
    before = effects(http_server)
    for method in ("tools/explode", "resources/list", "x" * 10_000):
        error = rpc_error(await acme.rpc(method, {}))
        assert error["code"] == types.METHOD_NOT_FOUND, (method[:20], error)
    for params in (
        {"arguments": {"title": "no name"}},
        {"name": 5, "arguments": {}},
        {"name": "create_ticket", "arguments": ["title"]},
        {"name": "create_ticket", "arguments": "title=x"},
        {"name": "create_ticket", "arguments": {}, "_meta": {"progressToken": {"x": 1}}},
    ):
        error = rpc_error(await acme.rpc("tools/call", params))
        assert error["code"] == types.INVALID_PARAMS, (params, error)
    unknown = rpc_error(await acme.call("drop_database", {"idempotency_key": new_key()}))
    assert unknown["code"] == types.INVALID_PARAMS and "drop_database" in unknown["message"]
    assert effects(http_server) == before
    await assert_alive(acme)


@pytest.mark.parametrize("request_id", ["1.5", "NaN", '{"a": 1}', "[1]", "true"])
async def test_a_call_whose_id_is_no_string_or_integer_runs_nothing(
    acme: Session, http_server: Deployment, request_id: str
) -> None:
    """JSON-RPC would answer -32600 (Invalid Request); the SDK reads such a message as a
    notification (HTTP 202, no answer): what matters here is that the call does not run."""
    before = effects(http_server)
    arguments = json.dumps({"title": "odd id", "idempotency_key": new_key()})
    raw = (
        f'{{"jsonrpc": "2.0", "id": {request_id}, "method": "tools/call", '
        f'"params": {{"name": "create_ticket", "arguments": {arguments}}}}}'
    ).encode()
    response = await acme.post(raw)
    assert response.status_code in (202, 400), (response.status_code, response.text)
    await assert_alive(acme)
    assert effects(http_server) == before


# -- huge and deeply nested params ------------------------------------------------------------


async def test_huge_params_are_refused_before_anything_runs(
    acme: Session, http_server: Deployment
) -> None:
    before = effects(http_server)
    key = new_key()
    too_long = await acme.call("create_ticket", {"title": "t" * 1_000_000, "idempotency_key": key})
    assert tool_error(too_long) == "VALIDATION_FAILED"
    too_big = await acme.call("flaky_write", {"payload": "p" * 3_000_000, "idempotency_key": key})
    assert tool_error(too_big) == "PAYLOAD_TOO_LARGE"
    many = {f"field_{i}": i for i in range(50_000)}
    assert tool_error(await acme.call("create_ticket", {**many, "idempotency_key": key})) in (
        "VALIDATION_FAILED",
        "PAYLOAD_TOO_LARGE",
    )
    huge_body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "flaky_write", "arguments": {"payload": "p" * 20_000_000}},
        }
    ).encode()
    assert (await acme.post(huge_body)).status_code == 413  # the SDK's cap on a request body
    huge_id = await acme.post({"jsonrpc": "2.0", "id": "i" * 1_000_000, "method": "ping"})
    assert rpc_answer(huge_id)["result"] == {}
    assert effects(http_server) == before
    await assert_alive(acme)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [60, 100, 1_000, 100_000])
async def test_deeply_nested_params_get_a_clear_error(
    acme: Session, http_server: Deployment, depth: int
) -> None:
    """Nesting the tool's model does not allow is its validation error; nesting past the
    arguments' limit (64 levels, docs/limits.md) is refused before the JSON parser reads the
    request: 400 with an Invalid params error that names the limit. Never a 5xx."""
    before = effects(http_server)
    key = new_key()
    arguments = f'{{"title": {nested(depth)}, "idempotency_key": "{key}"}}'
    raw = (
        '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": '
        f'{{"name": "create_ticket", "arguments": {arguments}}}}}'
    ).encode()
    response = await acme.post(raw)
    if depth <= MAX_DEPTH:
        assert tool_error(rpc_answer(response)) == "VALIDATION_FAILED"
    else:
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == types.INVALID_PARAMS
        assert f"the limit is {MAX_DEPTH} levels" in error["message"]
    assert effects(http_server) == before
    await assert_alive(acme)


# -- a session id of another client ---------------------------------------------------------


async def test_a_session_of_another_client_is_not_found_and_survives(
    acme: Session, http_server: Deployment
) -> None:
    """Another tenant's and another user's (same tenant) requests on acme's session, a
    forged session id: 404 to a call, to the event stream and to DELETE; the session lives on
    and its data stays its own."""
    key = new_key()
    mine = tool_body(await acme.call("create_ticket", {"title": "mine", "idempotency_key": key}))
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "create_ticket", "arguments": {"title": "mine", "idempotency_key": key}},
    }
    for token, session in (
        (GLOBEX_TOKEN, acme.id),
        (CAROL_TOKEN, acme.id),
        (ACME_TOKEN, uuid.uuid4().hex),
    ):
        headers = acme.headers(token=token, session=session)
        posted = await acme.http.post(acme.url, json=call, headers=headers)
        stream = await acme.http.get(acme.url, headers=headers)
        deleted = await acme.http.delete(acme.url, headers=headers)
        statuses = (posted.status_code, stream.status_code, deleted.status_code)
        assert statuses == (404, 404, 404), (token[:6], statuses, posted.text)
    again = tool_body(await acme.call("create_ticket", {"title": "mine", "idempotency_key": key}))
    assert again["replayed"] is True and again["call_id"] == mine["call_id"]
    async with httpx2.AsyncClient(timeout=30) as http:  # the same key is globex's own call
        globex = await Session(http, acme.url, GLOBEX_TOKEN).open()
        theirs = tool_body(
            await globex.call("create_ticket", {"title": "theirs", "idempotency_key": key})
        )
    assert theirs["replayed"] is False and theirs["call_id"] != mine["call_id"]
    assert theirs["result"]["ticket_id"] != mine["result"]["ticket_id"]
    counted = effects(http_server)
    assert (counted[("acme", "create_ticket", key)], counted[("globex", "create_ticket", key)]) == (
        1,
        1,
    )


# -- idempotency keys ---------------------------------------------------------------------------

BAD_KEYS: dict[str, Any] = {
    "empty": "",
    "256 characters": "k" * 256,
    "non-ASCII": "clé",
    "a control character": "a\x00b",
    "100,000 characters": "x" * 100_000,
    "a number": 7,
    "a boolean": True,
    "an object": {"k": 1},
    "an array": ["k"],
}


async def test_idempotency_key_edge_cases_refuse_and_run_nothing(
    acme: Session, http_server: Deployment
) -> None:
    """In the params (SEP-3182's ``idempotencyKey``): -32602; as the ``idempotency_key``
    argument: the tool error IDEMPOTENCY_KEY_INVALID; none at all for a mutating tool:
    IDEMPOTENCY_KEY_MISSING (a ``null`` parameter is none). Nothing runs, nothing retryable."""
    before = effects(http_server)
    for name, key in BAD_KEYS.items():
        error = rpc_error(await acme.call("create_ticket", {"title": "t"}, key=key))
        assert error["code"] == types.INVALID_PARAMS and "idempotencyKey" in error["message"], (
            name,
            error,
        )
        refused = await acme.call("create_ticket", {"title": "t", "idempotency_key": key})
        assert tool_error(refused) == "IDEMPOTENCY_KEY_INVALID", name
        assert tool_body(refused)["error"]["retryable"] is False
    for missing in (
        await acme.call("create_ticket", {"title": "t"}),
        await acme.call("create_ticket", {"title": "t"}, key=None, idempotencyKey=None),
        await acme.call("flaky_write", {"payload": "p", "idempotency_key": None}),
    ):
        assert tool_error(missing) == "IDEMPOTENCY_KEY_MISSING"
    assert effects(http_server) == before
    await assert_alive(acme)


def steps() -> list[dict[str, Any]]:
    return [{"id": "open", "tool": "create_ticket", "arguments": {"title": "grouped"}}]


async def test_the_group_tools_check_their_key_and_ids_before_anything_runs(
    acme: Session, http_server: Deployment
) -> None:
    """A group's key follows the same rules as a call's (it was: a missing or ill-typed key
    a retryable INTERNAL, a non-ASCII or 256-character one accepted); a group id that is not
    one is a validation error (it was INTERNAL); ``idempotencyKey`` alone is the key."""
    before = effects(http_server)
    group = {"run_id": "run-hostile", "steps": steps()}
    assert tool_error(await acme.call(RUN_GROUP, group)) == "IDEMPOTENCY_KEY_MISSING"
    for name, key in BAD_KEYS.items():
        refused = await acme.call(RUN_GROUP, {**group, "idempotency_key": key})
        assert tool_error(refused) == "IDEMPOTENCY_KEY_INVALID", name
        assert tool_body(refused)["error"]["retryable"] is False
    for arguments in ({}, {"group_id": 5}, {"group_id": ["grp"]}, {"group_id": "grp_1"}):
        for tool in (GET_GROUP, RESUME_GROUP):
            refused = await acme.call(tool, arguments)
            assert tool_error(refused) == "VALIDATION_FAILED", (tool, arguments)
            assert tool_body(refused)["error"]["field_errors"][0]["loc"] == "group_id"
    resume = {"group_id": "grp_" + "0" * 32, "approval_tokens": ["token"]}
    assert tool_error(await acme.call(RESUME_GROUP, resume)) == "VALIDATION_FAILED"
    assert effects(http_server) == before

    key = new_key()
    first = tool_body(await acme.call(RUN_GROUP, group, key=key))
    again = tool_body(await acme.call(RUN_GROUP, {**group, "idempotency_key": key}, key=key))
    assert first["group"]["status"] == "SUCCEEDED" and first["group"]["idempotency_key"] == key
    assert again["replayed"] is True and again["group"]["group_id"] == first["group"]["group_id"]
    differ = rpc_error(await acme.call(RUN_GROUP, {**group, "idempotency_key": "other"}, key=key))
    assert differ["code"] == types.INVALID_PARAMS
    after = effects(http_server)
    assert {k: n for k, n in after.items() if k not in before} == {
        ("acme", "create_ticket", step_key(key, "open")): 1
    }


# -- storms on one key ------------------------------------------------------------------------


async def storm(
    url: str, token: str, calls: list[tuple[dict[str, Any], str | None]]
) -> list[dict[str, Any]]:
    """``tools/call`` of flaky_write with each (arguments, params key), all at once, in one
    session over as many connections."""
    limits = httpx2.Limits(max_connections=len(calls))
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=120), limits=limits) as http:
        session = await Session(http, url, token).open()
        return await asyncio.gather(*(session.call("flaky_write", a, key=k) for a, k in calls))


def slow(payload: str, key: str | None = None) -> dict[str, Any]:
    arguments: dict[str, Any] = {"payload": payload, "fault": "slow", "delay_ms": 500}
    if key is not None:
        arguments["idempotency_key"] = key
    return arguments


@pytest.mark.parametrize("where", ["argument", "params"])
async def test_a_storm_with_the_same_arguments_runs_once(
    http_server: Deployment, where: str
) -> None:
    key = new_key()
    in_params = where == "params"
    answers = await storm(
        http_server.url,
        ACME_TOKEN,
        [(slow("same", None if in_params else key), key if in_params else None)] * STORM,
    )
    bodies = [tool_body(a) for a in answers]
    assert {b["status"] for b in bodies} == {"SUCCEEDED"}
    assert len({b["call_id"] for b in bodies}) == 1
    assert Counter(b["replayed"] for b in bodies) == {True: STORM - 1, False: 1}
    assert effects(http_server)[("acme", "flaky_write", key)] == 1


@pytest.mark.parametrize("where", ["argument", "params"])
async def test_a_storm_with_other_arguments_runs_one_and_refuses_the_rest(
    http_server: Deployment, where: str
) -> None:
    key = new_key()
    in_params = where == "params"
    answers = await storm(
        http_server.url,
        ACME_TOKEN,
        [
            (slow(f"p{i}", None if in_params else key), key if in_params else None)
            for i in range(STORM)
        ],
    )
    ran = [tool_body(a) for a in answers if "result" in a and tool_body(a)["ok"]]
    assert len(ran) == 1 and ran[0]["replayed"] is False, ran
    refused = [a for a in answers if not ("result" in a and tool_body(a)["ok"])]
    if in_params:  # SEP-3182's conflict, with the key in error.data
        data = [rpc_error(a).get("data") for a in refused]
        assert data == [{"type": "idempotency_key_conflict", "idempotencyKey": key}] * (STORM - 1)
    else:
        assert [tool_error(a) for a in refused] == ["IDEMPOTENCY_KEY_REUSED"] * (STORM - 1)
    assert effects(http_server)[("acme", "flaky_write", key)] == 1


async def test_a_storm_of_two_tenants_on_one_key_runs_once_each_and_mixes_nothing(
    http_server: Deployment,
) -> None:
    key = new_key()
    half = STORM // 2
    acme, globex = await asyncio.gather(
        storm(http_server.url, ACME_TOKEN, [(slow("acme's", key), None)] * half),
        storm(http_server.url, GLOBEX_TOKEN, [(slow("globex's", key), None)] * half),
    )
    for answers in (acme, globex):
        bodies = [tool_body(a) for a in answers]
        assert {b["status"] for b in bodies} == {"SUCCEEDED"}
        assert len({b["call_id"] for b in bodies}) == 1
        assert Counter(b["replayed"] for b in bodies) == {True: half - 1, False: 1}
    assert tool_body(acme[0])["call_id"] != tool_body(globex[0])["call_id"]
    assert tool_body(acme[0])["result"] != tool_body(globex[0])["result"]
    counted = effects(http_server)
    assert (counted[("acme", "flaky_write", key)], counted[("globex", "flaky_write", key)]) == (
        1,
        1,
    )


@pytest.mark.services
async def test_storms_on_kafka_and_postgres(kafka_mcp: Server) -> None:
    """The same storms through ``toolledger mcp`` on Kafka + PostgreSQL (executor and
    projector as processes): one execution per key, the conflicts refused."""
    url = f"{kafka_mcp.base_url}/mcp"
    same, other = new_key(), new_key()
    answers = await storm(url, HTTP_ACME.token, [(slow("same", same), None)] * STORM)
    bodies = [tool_body(a) for a in answers]
    assert {b["status"] for b in bodies} == {"SUCCEEDED"}
    assert len({b["call_id"] for b in bodies}) == 1
    conflicts = await storm(url, HTTP_GLOBEX.token, [(slow(f"p{i}"), other) for i in range(STORM)])
    ran = [a for a in conflicts if "result" in a]
    assert len(ran) == 1 and tool_body(ran[0])["ok"], ran
    assert {rpc_error(a)["data"]["type"] for a in conflicts if "error" in a} == {
        "idempotency_key_conflict"
    }
    assert kafka_mcp.effects("acme", "flaky_write", same) == 1
    assert kafka_mcp.effects("globex", "flaky_write", other) == 1


# -- stdio ------------------------------------------------------------------------------------


async def test_stdio_answers_every_malformed_line_and_goes_on(tmp_path: Path) -> None:
    """Over stdio a line that is not a JSON-RPC message was dropped without an answer (the
    client waited forever); now it is answered -32700 or -32600 with ``id`` null, and the
    server goes on: deep nesting, a huge call, an unknown method, then a call that runs."""
    deploy = deployment(tmp_path)
    command = server_command(deploy, "--transport", "stdio")
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "TOOLLEDGER_MCP_TOKEN": ACME_TOKEN},
        limit=1 << 26,
    )
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    async def ask(line: bytes) -> dict[str, Any]:
        stdin.write(line + b"\n")
        await stdin.drain()
        answer: dict[str, Any] = json.loads(
            await asyncio.wait_for(stdout.readline(), ANSWER_WITHIN_S)
        )
        return answer

    def request(number: int, method: str, params: dict[str, Any]) -> bytes:
        return json.dumps(
            {"jsonrpc": "2.0", "id": number, "method": method, "params": params}
        ).encode()

    try:
        hello = {
            "protocolVersion": VERSION,
            "capabilities": {},
            "clientInfo": {"name": "h", "version": "0"},
        }
        assert "result" in await ask(request(1, "initialize", hello))
        stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        deep = (
            b'{"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"x": '
            + nested(5000).encode()
            + b"}}"
        )
        for raw, code in [
            # stdio reads UTF-8 with replacement characters: invalid bytes are no parse error
            *((raw, types.PARSE_ERROR) for n, raw in NOT_JSON.items() if n in STDIO_NOT_JSON),
            *((raw, types.INVALID_REQUEST) for raw in NOT_A_MESSAGE.values()),
            (deep, types.PARSE_ERROR),
        ]:
            answer = await ask(raw)
            assert answer["id"] is None and answer["error"]["code"] == code, (raw[:60], answer)
        huge = {
            "name": "flaky_write",
            "arguments": {"payload": "p" * 3_000_000, "idempotency_key": "h"},
        }
        assert tool_error(await ask(request(3, "tools/call", huge))) == "PAYLOAD_TOO_LARGE"
        assert (
            rpc_error(await ask(request(4, "tools/explode", {})))["code"] == types.METHOD_NOT_FOUND
        )
        key = new_key()
        ran = await ask(
            request(
                5,
                "tools/call",
                {"name": "create_ticket", "arguments": {"title": "t", "idempotency_key": key}},
            )
        )
        assert tool_body(ran)["ok"] is True
    finally:
        stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await process.wait()
    assert process.returncode == 0
    assert effects(deploy) == {("acme", "create_ticket", key): 1}
