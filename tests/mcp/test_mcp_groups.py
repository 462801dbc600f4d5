"""Call groups over MCP: ``toolledger_run_group``, ``toolledger_get_group`` and
``toolledger_resume_group`` beside the ledger's tools, on the same orchestrator as
``POST /v1/groups``. A compensated group is an isError result with the group resource; a
replay runs nothing; another definition under the key, or an invalid one, is refused with
nothing stored; a stopped group resumes from its completion point; another tenant's group is
not found. In process over the embedded ledger, and over streamable HTTP on Kafka +
PostgreSQL (``toolledger mcp`` with its executor and projector)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from mcp import Client

from tests.http.servers import ACME as HTTP_ACME
from tests.http.servers import GLOBEX as HTTP_GLOBEX
from tests.http.servers import Server
from tests.mcp.common import ACME, body, embedded, error_code, http_client, new_key
from toolledger.embedded import EmbeddedLedger
from toolledger.processors.toolsets.helpdesk import HelpdeskStore
from toolledger.producers.client import TrustedContext
from toolledger.producers.mcp_groups import GET_GROUP, GROUP_TOOLS, RESUME_GROUP, RUN_GROUP
from toolledger.producers.mcp_server import LedgerMcpServer
from toolledger.schemas.groups import compensation_key, step_key
from toolledger.serve import tool_infos

GLOBEX = TrustedContext("globex", "agent-g")


def compensated(key: str) -> dict[str, Any]:
    return {
        "idempotency_key": key,
        "run_id": "run-mcp",
        "steps": [
            {"id": "open", "tool": "create_ticket", "arguments": {"title": "undone"}},
            {
                "id": "write",
                "tool": "flaky_write",
                "arguments": {"payload": "x", "fault": "final"},
                "depends_on": ["open"],
            },
        ],
    }


def chain(key: str) -> dict[str, Any]:
    return {
        "idempotency_key": key,
        "run_id": "run-mcp",
        "steps": [
            {"id": "open", "tool": "create_ticket", "arguments": {"title": "chained"}},
            {
                "id": "close",
                "tool": "close_ticket",
                "arguments": {"ticket_id": {"$from": "open", "path": "ticket_id"}},
            },
        ],
    }


@contextlib.asynccontextmanager
async def servers(
    root: Path,
) -> AsyncIterator[tuple[EmbeddedLedger, HelpdeskStore, Client, Client]]:
    """An MCP client for acme and one for globex, over one embedded ledger that runs groups."""
    async with embedded(root) as (ledger, store):
        assert ledger.groups is not None
        tools = tool_infos(ledger.registry)

        def server(context: TrustedContext) -> LedgerMcpServer:
            return LedgerMcpServer(
                ledger.client, tools, fixed_context=context, groups=ledger.groups
            )

        async with Client(server(ACME).server) as acme, Client(server(GLOBEX).server) as globex:
            yield ledger, store, acme, globex


async def conforming(client: Client, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    """The tool's result, checked against the outputSchema the listing gives it."""
    listed = {t.name: t for t in (await client.list_tools()).tools}
    schema = listed[name].output_schema
    assert schema is not None
    result = await client.call_tool(name, arguments)
    Draft202012Validator(schema).validate(result.structured_content)
    return result


def group(result: types.CallToolResult) -> dict[str, Any]:
    parsed = body(result)
    assert "group" in parsed, parsed
    view: dict[str, Any] = parsed["group"]
    return view


async def test_the_group_tools_are_listed_with_their_schemas(tmp_path: Path) -> None:
    async with servers(tmp_path) as (_ledger, _store, acme, _globex):
        listed = {t.name: t for t in (await acme.list_tools()).tools}
    assert set(GROUP_TOOLS) <= set(listed)
    run = listed[RUN_GROUP]
    assert run.input_schema["required"] == ["idempotency_key", "run_id", "steps"]
    assert run.annotations is not None and run.annotations.destructive_hint is True
    assert "at most once" in (run.description or "")
    got = listed[GET_GROUP]
    assert got.annotations is not None and got.annotations.read_only_hint is True
    for name in GROUP_TOOLS:  # as every tool: an outputSchema, the replay rule stated once
        assert listed[name].output_schema is not None
        assert (listed[name].description or "").count("Replay:") == 1, name
    # the ledger's own tools are still there
    assert {"create_ticket", "close_ticket", "flaky_write"} <= set(listed)


async def test_a_compensated_group_is_an_error_result_and_its_replay_runs_nothing(
    tmp_path: Path,
) -> None:
    async with servers(tmp_path) as (_ledger, store, acme, globex):
        key = new_key()
        first = await conforming(acme, RUN_GROUP, compensated(key))
        assert first.is_error
        view = group(first)
        assert view["status"] == "COMPENSATED", view
        steps = {s["id"]: s for s in view["steps"]}
        assert steps["open"]["compensation"]["status"] == "SUCCEEDED"
        assert steps["write"]["status"] == "FAILED_FINAL"
        opened = step_key(key, "open")
        assert store.effect_count("acme", "create_ticket", opened) == 1
        undone = compensation_key(key, "open")
        assert store.effect_count("acme", "close_ticket", undone) == 1

        again = await acme.call_tool(RUN_GROUP, compensated(key))
        assert body(again)["replayed"] is True and group(again)["status"] == "COMPENSATED"
        assert group(again)["group_id"] == view["group_id"]
        assert store.effect_count("acme", "create_ticket", opened) == 1
        assert store.effect_count("acme", "close_ticket", undone) == 1

        other = chain(key)
        reused = await conforming(acme, RUN_GROUP, other)
        assert error_code(reused) == "IDEMPOTENCY_KEY_REUSED"

        read = await conforming(acme, GET_GROUP, {"group_id": view["group_id"]})
        assert group(read) == group(again)
        # another tenant's group is not found, whoever asks by id
        foreign = await globex.call_tool(GET_GROUP, {"group_id": view["group_id"]})
        assert error_code(foreign) == "NOT_FOUND"
        foreign_resume = await globex.call_tool(RESUME_GROUP, {"group_id": view["group_id"]})
        assert error_code(foreign_resume) == "NOT_FOUND"


async def test_a_chain_succeeds_with_a_value_taken_from_an_earlier_step(tmp_path: Path) -> None:
    async with servers(tmp_path) as (_ledger, _store, acme, _globex):
        answer = await acme.call_tool(RUN_GROUP, chain(new_key()))
        assert not answer.is_error, body(answer)
        view = group(answer)
        assert view["status"] == "SUCCEEDED" and body(answer)["ok"] is True
        opened, closed = view["steps"]
        assert closed["result"]["ticket_id"] == opened["result"]["ticket_id"]
        resumed = await conforming(acme, RESUME_GROUP, {"group_id": view["group_id"]})
        assert error_code(resumed) == "GROUP_NOT_RESUMABLE"


async def test_an_invalid_group_is_refused_with_field_errors_and_nothing_stored(
    tmp_path: Path,
) -> None:
    async with servers(tmp_path) as (ledger, _store, acme, _globex):
        key = new_key()
        cycle = {
            "idempotency_key": key,
            "run_id": "run-mcp",
            "steps": [
                {
                    "id": "a",
                    "tool": "create_ticket",
                    "arguments": {"title": "a"},
                    "depends_on": ["b"],
                },
                {
                    "id": "b",
                    "tool": "create_ticket",
                    "arguments": {"title": "b"},
                    "depends_on": ["a"],
                },
            ],
        }
        refused = await conforming(acme, RUN_GROUP, cycle)
        assert error_code(refused) == "VALIDATION_FAILED"
        assert body(refused)["error"]["field_errors"], body(refused)
        unknown = {"idempotency_key": key, "run_id": "r", "steps": [{"id": "a", "tool": "nope"}]}
        assert error_code(await acme.call_tool(RUN_GROUP, unknown)) == "VALIDATION_FAILED"
        # nothing was stored under the key: a valid definition now runs
        answer = await acme.call_tool(RUN_GROUP, {**chain(key)})
        assert group(answer)["status"] == "SUCCEEDED" and body(answer)["replayed"] is False
        assert ledger.groups is not None


async def test_a_stopped_group_resumes_from_its_completion_point(tmp_path: Path) -> None:
    async with servers(tmp_path) as (_ledger, store, acme, _globex):
        key = new_key()
        definition = {
            "idempotency_key": key,
            "run_id": "run-mcp",
            "on_failure": "stop",
            "steps": [
                {"id": "open", "tool": "create_ticket", "arguments": {"title": "kept"}},
                {
                    "id": "write",
                    "tool": "flaky_write",
                    "arguments": {"payload": "x", "fault": "retryable_always"},
                    "depends_on": ["open"],
                },
            ],
        }
        first = group(await acme.call_tool(RUN_GROUP, definition))
        assert first["status"] == "FAILED", first
        opened = first["steps"][0]
        assert opened["status"] == "SUCCEEDED" and opened["compensation"] is None
        resumed = await acme.call_tool(RESUME_GROUP, {"group_id": first["group_id"]})
        again = group(resumed)
        assert again["status"] == "FAILED" and resumed.is_error
        assert again["steps"][0]["call_id"] == opened["call_id"]
        assert store.effect_count("acme", "create_ticket", step_key(key, "open")) == 1
        # the failed retryable step got a new round: more attempts than the first round's
        write = step_key(key, "write")
        assert store.effect_count("acme", "flaky_write", write) == 0  # it never took effect


@pytest.mark.services
async def test_groups_over_streamable_http_on_kafka_and_postgres(kafka_mcp: Server) -> None:
    url = f"{kafka_mcp.base_url}/mcp"
    key = new_key()
    async with http_client(url, HTTP_ACME.token) as acme:
        first = await acme.call_tool(RUN_GROUP, compensated(key))
        view = group(first)
        assert view["status"] == "COMPENSATED" and first.is_error, view
        again = await acme.call_tool(RUN_GROUP, compensated(key))
        assert body(again)["replayed"] is True and group(again)["group_id"] == view["group_id"]
    async with http_client(url, HTTP_GLOBEX.token) as globex:
        foreign = await globex.call_tool(GET_GROUP, {"group_id": view["group_id"]})
        assert error_code(foreign) == "NOT_FOUND"
    assert kafka_mcp.effects("acme", "create_ticket", step_key(key, "open")) == 1
    assert kafka_mcp.effects("acme", "close_ticket", compensation_key(key, "open")) == 1
