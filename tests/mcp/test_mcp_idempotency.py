"""SEP-3182 ("Request Idempotency") over MCP, and what the listing says about replays.

* ``idempotencyKey`` in the ``tools/call`` params, beside the ``idempotency_key`` argument;
* ``capabilities.tools.idempotency`` in the ``initialize`` and ``server/discover`` answers;
* a duplicate still running and a key used with other arguments as JSON-RPC errors whose
  ``error.data`` is ``{"type": "idempotency_key_in_progress" | "idempotency_key_conflict",
  "idempotencyKey": <key>}``; a malformed key as ``-32602`` (Invalid params);
* an ``outputSchema`` per tool that every ``structuredContent`` (errors included) matches;
* the replay behaviour stated once per tool description.

The SDK's ``CallToolRequestParams`` has no ``idempotencyKey`` (pydantic drops unknown fields),
so :func:`call_with_key` sends a plain ``tools/call`` request whose params carry it. Most
tests run in process (the SDK's client on its in-memory transport), with both the
per-request protocol and the handshake (``mode``); the HTTP ones use a real server process.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx2
import mcp_types as types
import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict

from tests.mcp.common import (
    ACME,
    ACME_TOKEN,
    CHARGE,
    KEYED,
    Deployment,
    approval_request,
    body,
    deployment,
    embedded,
    error_code,
    http_client,
    http_server_process,
    new_key,
)
from toolledger.embedded import EmbeddedLedger
from toolledger.mcp_wiring import mcp_server
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
from toolledger.producers.http.auth import TokenStore
from toolledger.producers.mcp_server import (
    KEY_IN_PROGRESS_CODE,
    LedgerMcpServer,
    mcp_description,
    mcp_output_schema,
)
from toolledger.serve import Security, front_door, tool_infos
from toolledger.settings import LedgerSettings

ToolsCall = types.Request[dict[str, Any], Literal["tools/call"]]
Discover = types.Request[dict[str, Any], Literal["server/discover"]]


class RawDiscover(BaseModel):
    """A ``server/discover`` answer as sent: the SDK's own model drops unknown capabilities."""

    model_config = ConfigDict(extra="allow")
    capabilities: dict[str, Any]


async def call_with_key(
    client: Client, name: str, arguments: dict[str, Any], key: Any
) -> types.CallToolResult:
    """``tools/call`` with ``idempotencyKey`` in its params (SEP-3182)."""
    request = ToolsCall(
        method="tools/call", params={"name": name, "arguments": arguments, "idempotencyKey": key}
    )
    return await client.session.send_request(request, types.CallToolResult)


async def idempotency_error(
    client: Client, name: str, arguments: dict[str, Any], key: Any
) -> MCPError:
    with pytest.raises(MCPError) as raised:
        await call_with_key(client, name, arguments, key)
    return raised.value


@dataclass
class Setup:
    ledger: EmbeddedLedger
    store: HelpdeskStore
    client: Client

    def effects(self, tool: str, key: str) -> int:
        return self.store.effect_count("acme", tool, key)


@contextlib.asynccontextmanager
async def running(
    root: Path, mode: str = "auto", wait_s: float | None = 10
) -> AsyncIterator[Setup]:
    """An embedded ledger, its MCP server (identity: acme) and a client connected to it."""
    async with embedded(root) as (ledger, store):
        tools = tool_infos(ledger.registry)
        server = LedgerMcpServer(ledger.client, tools, fixed_context=ACME, wait_s=wait_s)
        async with Client(server.server, mode=mode) as client:
            yield Setup(ledger, store, client)


# -- idempotencyKey in the params ----------------------------------------------------------


async def test_a_params_key_runs_the_call_once_and_replays_it(tmp_path: Path, mode: str) -> None:
    async with running(tmp_path, mode) as setup:
        versions = MODERN_PROTOCOL_VERSIONS if mode == "auto" else HANDSHAKE_PROTOCOL_VERSIONS
        assert setup.client.protocol_version in versions
        key = new_key()
        arguments = {"title": "Printer on fire"}  # no idempotency_key argument
        first = await call_with_key(setup.client, "create_ticket", arguments, key)
        assert first.is_error is False
        created = body(first)
        assert created["ok"] is True and created["replayed"] is False
        assert setup.effects("create_ticket", key) == 1

        again = body(await call_with_key(setup.client, "create_ticket", dict(arguments), key))
        assert again["replayed"] is True
        assert again["call_id"] == created["call_id"]
        assert again["result"] == created["result"]
        # the same key as the argument names the same call: one key, however it travels
        as_argument = await setup.client.call_tool(
            "create_ticket", {**arguments, "idempotency_key": key}
        )
        assert body(as_argument)["replayed"] is True
        assert body(as_argument)["call_id"] == created["call_id"]
        assert setup.effects("create_ticket", key) == 1


async def test_the_params_key_and_the_argument_key_must_agree(tmp_path: Path, mode: str) -> None:
    """Both given and equal: one key. Both given and different: Invalid params, nothing runs
    under either key."""
    async with running(tmp_path, mode) as setup:
        key = new_key()
        both = await call_with_key(
            setup.client, "create_ticket", {"title": "Both", "idempotency_key": key}, key
        )
        assert body(both)["ok"] is True
        assert setup.effects("create_ticket", key) == 1

        params_key, argument_key = new_key(), new_key()
        for argument in (argument_key, 7):
            error = await idempotency_error(
                setup.client,
                "create_ticket",
                {"title": "Which one?", "idempotency_key": argument},
                params_key,
            )
            assert error.code == types.INVALID_PARAMS
            assert "idempotencyKey" in error.message and "idempotency_key" in error.message
        assert setup.effects("create_ticket", params_key) == 0
        assert setup.effects("create_ticket", argument_key) == 0
        # an argument set to null is an absent one
        null = await call_with_key(
            setup.client, "create_ticket", {"title": "Null", "idempotency_key": None}, params_key
        )
        assert body(null)["ok"] is True
        assert setup.effects("create_ticket", params_key) == 1


@pytest.mark.parametrize(
    "key",
    ["", "tab\tkey", "k" * 256, "clé", "line\nbreak", 7, ["k"], {"k": 1}],
    ids=["empty", "tab", "256-chars", "non-ascii", "newline", "number", "array", "object"],
)
async def test_a_malformed_params_key_is_invalid_params(tmp_path: Path, key: Any) -> None:
    async with running(tmp_path) as setup:
        for name, arguments in (("create_ticket", {"title": "x"}), ("list_tickets", {})):
            error = await idempotency_error(setup.client, name, arguments, key)
            assert error.code == types.INVALID_PARAMS, (name, error.message)
            assert "idempotencyKey" in error.message
        assert setup.store.effect_counts() == {}


async def test_the_longest_and_a_null_params_key(tmp_path: Path) -> None:
    """255 printable ASCII characters are a key; ``null`` is no key (the argument's is used;
    without one, the ledger's own ``IDEMPOTENCY_KEY_MISSING``)."""
    async with running(tmp_path) as setup:
        longest = "~" * 254 + " "
        assert body(await call_with_key(setup.client, "create_ticket", {"title": "L"}, longest))[
            "ok"
        ]
        assert setup.effects("create_ticket", longest) == 1
        key = new_key()
        arguments = {"title": "N", "idempotency_key": key}
        assert body(await call_with_key(setup.client, "create_ticket", arguments, None))["ok"]
        assert setup.effects("create_ticket", key) == 1
        missing = await call_with_key(setup.client, "create_ticket", {"title": "N"}, None)
        assert error_code(missing) == "IDEMPOTENCY_KEY_MISSING"


async def test_a_read_only_tool_takes_a_params_key_and_ignores_it(tmp_path: Path) -> None:
    async with running(tmp_path) as setup:
        key = new_key()
        created = body(await call_with_key(setup.client, "create_ticket", {"title": "R"}, key))
        listed = await call_with_key(setup.client, "list_tickets", {}, key)
        assert listed.is_error is False
        tickets = {t["ticket_id"] for t in body(listed)["result"]["tickets"]}
        assert created["result"]["ticket_id"] in tickets
        assert body(listed)["replayed"] is False  # a read is never replayed


# -- the errors of SEP-3182 ----------------------------------------------------------------


async def test_a_conflict_is_an_error_with_the_proposals_data(tmp_path: Path, mode: str) -> None:
    async with running(tmp_path, mode) as setup:
        key = new_key()
        assert body(await call_with_key(setup.client, "create_ticket", {"title": "A"}, key))["ok"]
        error = await idempotency_error(setup.client, "create_ticket", {"title": "B"}, key)
        assert error.code == types.INVALID_PARAMS
        assert error.data == {"type": "idempotency_key_conflict", "idempotencyKey": key}
        assert setup.effects("create_ticket", key) == 1
        # the key stays the first call's: its own arguments still replay
        replayed = body(await call_with_key(setup.client, "create_ticket", {"title": "A"}, key))
        assert replayed["replayed"] is True
        # without the params key the same conflict is the result the model reads, as before
        reused = await setup.client.call_tool(
            "create_ticket", {"title": "B", "idempotency_key": key}
        )
        assert error_code(reused) == "IDEMPOTENCY_KEY_REUSED"
        assert setup.effects("create_ticket", key) == 1


async def test_a_call_still_in_progress_is_an_error_with_the_proposals_data(
    tmp_path: Path,
) -> None:
    """The first call outlives the server's wait; so does a duplicate sent while it runs
    (queued behind it, told so by the wiring's probe of the projection). Both answer
    ``idempotency_key_in_progress``; once it is done, the retry gets its outcome. One effect.
    The servers are the wiring's (``toolledger mcp``), on an embedded front door."""
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    security = Security(TokenStore([]))
    try:
        settings = LedgerSettings(path=tmp_path / "ledger.db", create=True)
        async with front_door(settings, helpdesk_registry(store), security) as door:
            impatient = mcp_server(door, fixed_context=ACME, wait_s=0.2)
            patient = mcp_server(door, fixed_context=ACME, wait_s=10)
            key = new_key()
            arguments = {"payload": "p", "fault": "slow", "delay_ms": 3500}
            expected = {"type": "idempotency_key_in_progress", "idempotencyKey": key}
            async with Client(impatient.server) as client:
                started = time.monotonic()
                first = await idempotency_error(client, "flaky_write", arguments, key)
                assert (first.code, first.data) == (KEY_IN_PROGRESS_CODE, expected)
                duplicate = await idempotency_error(client, "flaky_write", dict(arguments), key)
                assert (duplicate.code, duplicate.data) == (KEY_IN_PROGRESS_CODE, expected)
                assert "in progress" in duplicate.message
                # answered after the wait, not after the running call's outcome
                assert time.monotonic() - started < 2.5
                # the argument key's duplicate: the same answer, as a result the model reads
                as_argument = await client.call_tool(
                    "flaky_write", {**arguments, "idempotency_key": key}
                )
                assert error_code(as_argument) == "IDEMPOTENCY_KEY_IN_USE"
                assert body(as_argument)["error"]["retryable"] is True
            async with Client(patient.server) as client:
                done = await call_with_key(client, "flaky_write", arguments, key)
            assert done.is_error is False
            assert body(done)["replayed"] is True
            assert store.effect_count("acme", "flaky_write", key) == 1
    finally:
        store.close()


# -- the capability ------------------------------------------------------------------------


async def test_server_discover_advertises_the_capability(tmp_path: Path) -> None:
    async with running(tmp_path, "auto") as setup:
        assert setup.client.protocol_version in MODERN_PROTOCOL_VERSIONS
        answer = await setup.client.session.send_request(
            Discover(method="server/discover", params={}), RawDiscover
        )
        assert answer.capabilities["tools"]["idempotency"] == {}


# -- outputSchema and structuredContent ----------------------------------------------------


def validator(schema: dict[str, Any]) -> Any:
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


async def test_every_tool_has_an_output_schema_that_its_results_match(
    tmp_path: Path, mode: str
) -> None:
    async with running(tmp_path, mode) as setup:
        tools = {tool.name: tool for tool in (await setup.client.list_tools()).tools}
        manifests = {
            name: info.manifest for name, info in tool_infos(setup.ledger.registry).items()
        }
        assert set(tools) == set(manifests)
        for name, tool in tools.items():
            schema = tool.output_schema
            assert schema is not None, name
            assert schema["type"] == "object"  # what MCP requires of an outputSchema
            result_schema = {
                k: v for k, v in manifests[name]["result_schema"].items() if k != "$defs"
            }
            assert schema["properties"]["result"] == result_schema
            validator(schema)
        check = {name: validator(tool.output_schema or {}) for name, tool in tools.items()}

        key = new_key()
        answers = {
            "success": await setup.client.call_tool(
                "create_ticket", {"title": "S", "idempotency_key": key}
            ),
            "replay": await call_with_key(setup.client, "create_ticket", {"title": "S"}, key),
            "validation": await setup.client.call_tool(
                "create_ticket", {"title": "", "idempotency_key": new_key()}
            ),
            "reused": await setup.client.call_tool(
                "create_ticket", {"title": "T", "idempotency_key": key}
            ),
            "missing key": await setup.client.call_tool("create_ticket", {"title": "M"}),
        }
        for label, answer in answers.items():
            assert answer.structured_content is not None, label
            assert not list(check["create_ticket"].iter_errors(answer.structured_content)), label
        assert [label for label, answer in answers.items() if not answer.is_error] == [
            "success",
            "replay",
        ]
        charge = await setup.client.call_tool("charge_card", {**CHARGE, "idempotency_key": key})
        approval_request(charge)
        assert not list(check["charge_card"].iter_errors(charge.structured_content))
        listed = await setup.client.call_tool("list_tickets", {})
        assert not list(check["list_tickets"].iter_errors(listed.structured_content))


def test_the_output_schema_can_fail_and_resolves_the_result_models_refs() -> None:
    @dataclass
    class Spec:
        name: str
        keyed: bool
        manifest: dict[str, Any]

    result_schema = {
        "type": "object",
        "properties": {"owner": {"$ref": "#/$defs/Person"}},
        "required": ["owner"],
        "$defs": {
            "Person": {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
            }
        },
    }
    schema = mcp_output_schema(Spec("owned", True, {"result_schema": result_schema}))
    assert "$defs" not in schema["properties"]["result"] and "Person" in schema["$defs"]
    check = validator(schema)
    ok = {
        "ok": True,
        "status": "SUCCEEDED",
        "result": {"owner": {"name": "Ada"}},
        "replayed": False,
        "attempts": 1,
        "call_id": "c",
    }
    assert not list(check.iter_errors(ok))
    bad_results = [
        {**ok, "result": {"owner": {}}},  # through the $ref
        {**ok, "result": {}},
        {key: value for key, value in ok.items() if key != "result"},
        {**ok, "ok": False},  # a failure needs an error
        {**ok, "status": "FAILED_FINAL"},
        {key: value for key, value in ok.items() if key != "call_id"},
    ]
    for bad in bad_results:
        assert list(check.iter_errors(bad)), bad


# -- the replay behaviour, stated once -----------------------------------------------------


def test_each_description_states_the_replay_behaviour_exactly_once(tmp_path: Path) -> None:
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    try:
        infos = list(tool_infos(helpdesk_registry(store)).values())
    finally:
        store.close()
    assert {info.name for info in infos} >= KEYED
    for info in infos:
        text = mcp_description(info)
        manifest_text = info.manifest["description"]
        assert text.startswith(manifest_text), info.name
        added = text[len(manifest_text) :]
        replay_lines = [line for line in text.splitlines() if line.startswith("Replay:")]
        assert len(replay_lines) == 1, (info.name, text)
        if info.keyed:
            assert text.count("stored outcome") == 1, (info.name, text)
        else:
            assert text.count("replayed") == 1, (info.name, text)
        # what the MCP layer adds (key retention, approval) does not restate it
        restatements = ("stored outcome", "replay", "other arguments", "again", "Read-only")
        for restated in (*restatements, "Idempotency:"):
            assert restated.lower() not in added.lower(), (info.name, restated, added)


def test_a_description_without_a_replay_line_gets_one() -> None:
    @dataclass
    class Spec:
        name: str
        keyed: bool
        manifest: dict[str, Any]

    keyed = mcp_description(Spec("bare", True, {"description": "Do a thing."}))
    read = mcp_description(Spec("look", False, {"description": "Look at a thing."}))
    for text in (keyed, read):
        assert [line for line in text.splitlines() if line.startswith("Replay:")] != []
        assert text.count("Replay:") == 1
    assert keyed.count("stored outcome") == 1
    assert read.count("never replayed") == 1


# -- over streamable HTTP ------------------------------------------------------------------


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with http_server_process(deployment(tmp_path_factory.mktemp("mcp-idem"))) as deploy:
        yield deploy


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


_ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def test_http_initialize_and_discover_advertise_the_capability(
    http_server: Deployment,
) -> None:
    auth = {"Authorization": f"Bearer {ACME_TOKEN}"}
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": HANDSHAKE_PROTOCOL_VERSIONS[-1],
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    version = MODERN_PROTOCOL_VERSIONS[-1]
    discover = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "server/discover",
        "params": {
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": version,
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
            }
        },
    }
    modern = {"MCP-Protocol-Version": version, "Mcp-Method": "server/discover"}
    async with httpx2.AsyncClient(timeout=30) as http:
        for request, headers in ((initialize, {}), (discover, modern)):
            response = await http.post(
                http_server.url, json=request, headers={**_ACCEPT, **auth, **headers}
            )
            assert response.status_code == 200, response.text
            answer = rpc_answer(response)
            assert answer["result"]["capabilities"]["tools"]["idempotency"] == {}, answer


async def test_http_params_key(http_server: Deployment, mode: str) -> None:
    """Dedup, the conflict's and the malformed key's errors through the HTTP transport."""
    async with http_client(http_server.url, ACME_TOKEN, mode) as client:
        key = new_key()
        first = body(await call_with_key(client, "create_ticket", {"title": "H"}, key))
        again = body(await call_with_key(client, "create_ticket", {"title": "H"}, key))
        assert (first["replayed"], again["replayed"]) == (False, True)
        assert again["call_id"] == first["call_id"]
        conflict = await idempotency_error(client, "create_ticket", {"title": "I"}, key)
        assert conflict.code == types.INVALID_PARAMS
        assert conflict.data == {"type": "idempotency_key_conflict", "idempotencyKey": key}
        malformed = await idempotency_error(client, "create_ticket", {"title": "J"}, "clé")
        assert malformed.code == types.INVALID_PARAMS
    assert http_server.effects("acme", "create_ticket", key) == 1
