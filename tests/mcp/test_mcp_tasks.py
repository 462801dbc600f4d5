"""Long-running tools over MCP's Tasks extension (``io.modelcontextprotocol/tasks``, 2026-07-28):
a call whose job runs is answered with a task handle (its id the call id), a retry answers the
same task and starts nothing, ``tasks/get`` follows the job to its outcome, ``tasks/cancel``
runs the tool's cancel; a client that does not declare the extension gets the tool result with
the job. In process, over the embedded ledger and its projection."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import mcp_types as types
import pytest
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict

from tests.http.servers import ACME as HTTP_ACME
from tests.http.servers import GLOBEX as HTTP_GLOBEX
from tests.http.servers import Server
from tests.mcp.common import (
    ACME,
    ACME_TOKEN,
    GLOBEX_TOKEN,
    body,
    deployment,
    embedded,
    http_client,
    http_server_process,
    new_key,
)
from toolledger.embedded import EmbeddedLedger
from toolledger.processors.toolsets.helpdesk import HelpdeskStore
from toolledger.producers.client import TrustedContext
from toolledger.producers.mcp_server import LedgerMcpServer
from toolledger.producers.mcp_tasks import TASKS_EXTENSION
from toolledger.projections.sqlite import SqliteCalls
from toolledger.serve import tool_infos

GLOBEX = TrustedContext("globex", "agent-g")
SLOW = {"delay_ms": 60_000}  # a minute's job: a cancel ends it first


class Wire(BaseModel):
    """Any result, kept as it came (camelCase keys)."""

    model_config = ConfigDict(extra="allow")


class TaskHandle(types.Result):
    """The extension's ``CreateTaskResult``, as this test client reads it."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None


async def _unresolved(handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
    raise AssertionError("the tests drive tasks themselves (allow_claimed=True)")


class Tasks(ClientExtension):
    identifier = TASKS_EXTENSION

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=TaskHandle, resolve=_unresolved),)


@dataclass
class Setup:
    ledger: EmbeddedLedger
    store: HelpdeskStore
    queries: SqliteCalls

    def server(self, context: TrustedContext = ACME) -> LedgerMcpServer:
        tools = tool_infos(self.ledger.registry)
        return LedgerMcpServer(
            self.ledger.client, tools, fixed_context=context, queries=self.queries
        )

    def exports(self, key: str) -> int:
        return self.store.effect_count("acme", "export_tickets", key)


@contextlib.asynccontextmanager
async def ledger(root: Path) -> AsyncIterator[Setup]:
    async with embedded(root) as (led, store):
        assert led.file is not None
        yield Setup(led, store, led.queries())


async def start(client: Client, arguments: dict[str, Any]) -> TaskHandle | types.CallToolResult:
    answer = await client.session.call_tool("export_tickets", arguments, allow_claimed=True)
    assert isinstance(answer, TaskHandle | types.CallToolResult), answer
    return answer


async def get_task(client: Client, task_id: str) -> dict[str, Any]:
    request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id))
    return (await client.session.send_request(request, Wire)).model_dump()


async def cancel_task(client: Client, task_id: str) -> dict[str, Any]:
    request = types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id))
    return (await client.session.send_request(request, Wire)).model_dump()


async def until_terminal(client: Client, task_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        task = await get_task(client, task_id)
        if task["status"] in ("completed", "failed", "cancelled"):
            return task
        assert task["status"] == "working", task
        assert time.monotonic() < deadline, task
        await asyncio.sleep(0.05)


async def test_a_running_job_is_a_task_and_a_retry_is_the_same_task(tmp_path: Path) -> None:
    async with (
        ledger(tmp_path) as setup,
        Client(setup.server().server, extensions=[Tasks()]) as client,
    ):
        assert TASKS_EXTENSION in (client.server_capabilities.extensions or {})
        key = new_key()
        arguments = {"delay_ms": 400, "idempotency_key": key}
        handle = await start(client, arguments)
        assert isinstance(handle, TaskHandle), handle
        assert handle.status == "working" and handle.ttl_ms is None
        assert handle.task_id.startswith("call_")
        # the task resolves at once (it is durable before the handle is returned)
        working = await get_task(client, handle.task_id)
        assert working["resultType"] == "complete" and working["status"] == "working"
        assert "is running" in working["statusMessage"]

        again = await start(client, dict(arguments))
        assert isinstance(again, TaskHandle) and again.task_id == handle.task_id

        done = await until_terminal(client, handle.task_id)
        assert done["status"] == "completed", done
        result = types.CallToolResult.model_validate(done["result"])
        outcome = body(result)
        assert result.is_error is False and outcome["status"] == "SUCCEEDED"
        assert outcome["result"]["path"].endswith(".json")
        assert outcome["call_id"] == handle.task_id
        # a finished task lives as long as its key: the tool's retention (24 h here)
        assert done["ttlMs"] >= 24 * 3600 * 1000

        # once finished, a retry is the stored outcome itself, not a task
        replay = await start(client, dict(arguments))
        assert isinstance(replay, types.CallToolResult)
        assert body(replay)["replayed"] is True
        assert body(replay)["result"] == outcome["result"]
        assert setup.exports(key) == 1  # one job, however often it was asked


async def test_tasks_cancel_runs_the_tools_cancel(tmp_path: Path) -> None:
    async with (
        ledger(tmp_path) as setup,
        Client(setup.server().server, extensions=[Tasks()]) as client,
    ):
        key = new_key()
        handle = await start(client, {**SLOW, "idempotency_key": key})
        assert isinstance(handle, TaskHandle)
        ack = await cancel_task(client, handle.task_id)
        assert ack == {"resultType": "complete"} or ack.get("resultType") == "complete"
        cancelled = await until_terminal(client, handle.task_id)
        assert cancelled["status"] == "cancelled", cancelled
        assert "result" not in cancelled
        # cancellation is cooperative: a second one is acknowledged and changes nothing
        await cancel_task(client, handle.task_id)
        assert (await get_task(client, handle.task_id))["status"] == "cancelled"
        # the call itself ended FAILED_FINAL with CANCELLED
        view = await setup.queries.get("acme", handle.task_id)
        assert view is not None and view.error is not None
        assert view.error.code == "CANCELLED" and view.status.value == "FAILED_FINAL"


async def test_unknown_and_foreign_tasks_are_errors(tmp_path: Path) -> None:
    async with (
        ledger(tmp_path) as setup,
        Client(setup.server().server, extensions=[Tasks()]) as acme,
    ):
        handle = await start(acme, {**SLOW, "idempotency_key": new_key()})
        assert isinstance(handle, TaskHandle)
        async with Client(setup.server(GLOBEX).server, extensions=[Tasks()]) as globex:
            for task_id in (handle.task_id, "call_" + "0" * 32, "not-a-call"):
                with pytest.raises(MCPError) as got:
                    await get_task(globex, task_id)
                assert got.value.error.code == types.INVALID_PARAMS
                with pytest.raises(MCPError):
                    await cancel_task(globex, task_id)
        # the other tenant's cancel changed nothing
        assert (await get_task(acme, handle.task_id))["status"] == "working"
        await cancel_task(acme, handle.task_id)


async def test_a_call_that_is_not_a_job_has_no_task(tmp_path: Path) -> None:
    async with (
        ledger(tmp_path) as setup,
        Client(setup.server().server, extensions=[Tasks()]) as client,
    ):
        created = await client.session.call_tool(
            "create_ticket",
            {"title": "Printer", "body": "jammed", "idempotency_key": new_key()},
            allow_claimed=True,
        )
        assert isinstance(created, types.CallToolResult)
        call_id = body(created)["call_id"]
        with pytest.raises(MCPError):
            await get_task(client, call_id)


@pytest.mark.parametrize("mode", ["auto", "legacy"], ids=["per-request", "handshake"])
async def test_a_client_without_the_extension_gets_the_job_in_the_result(
    tmp_path: Path, mode: str
) -> None:
    async with (
        ledger(tmp_path) as setup,
        Client(setup.server().server, mode=mode) as client,
    ):
        key = new_key()
        first = await client.call_tool("export_tickets", {**SLOW, "idempotency_key": key})
        running = body(first)
        assert running["status"] == "PENDING" and running["job"]["status"] == "running"
        assert "same key" in running["error"]["suggested_action"]
        again = body(await client.call_tool("export_tickets", {**SLOW, "idempotency_key": key}))
        assert again["job"]["id"] == running["job"]["id"] and again["replayed"] is True
        assert setup.exports(key) == 1


async def check_tasks_over_http(url: str, acme: str, globex: str) -> str:
    """A job followed to its outcome and another cancelled, through a ``toolledger mcp
    --transport http`` at ``url``: the wiring hands the server its ledger's projection, each
    request is authenticated, another tenant's token does not find the task (``Mcp-Name``
    carries the task id, as the extension asks). The finished job's key."""
    async with http_client(url, acme, extensions=[Tasks()]) as client:
        key = new_key()
        handle = await start(client, {"delay_ms": 300, "idempotency_key": key})
        assert isinstance(handle, TaskHandle), handle
        again = await start(client, {"delay_ms": 300, "idempotency_key": key})
        assert isinstance(again, TaskHandle) and again.task_id == handle.task_id
        done = await until_terminal(client, handle.task_id)
        assert done["status"] == "completed"
        assert body(types.CallToolResult.model_validate(done["result"]))["ok"] is True
        slow = await start(client, {**SLOW, "idempotency_key": new_key()})
        assert isinstance(slow, TaskHandle)
        async with http_client(url, globex, extensions=[Tasks()]) as other:
            with pytest.raises(MCPError):
                await get_task(other, slow.task_id)
        await cancel_task(client, slow.task_id)
        assert (await until_terminal(client, slow.task_id))["status"] == "cancelled"
    return key


async def test_tasks_over_streamable_http_on_the_embedded_backend(tmp_path: Path) -> None:
    with http_server_process(deployment(tmp_path)) as deploy:
        key = await check_tasks_over_http(deploy.url, ACME_TOKEN, GLOBEX_TOKEN)
        assert deploy.effects("acme", "export_tickets", key) == 1


@pytest.mark.services
async def test_tasks_over_streamable_http_on_kafka_and_postgres(kafka_mcp: Server) -> None:
    """The task is read from the PostgreSQL projection, which the projector fills after the
    executor's commit: the handle is returned only once ``tasks/get`` resolves it."""
    url = f"{kafka_mcp.base_url}/mcp"
    key = await check_tasks_over_http(url, HTTP_ACME.token, HTTP_GLOBEX.token)
    assert kafka_mcp.effects("acme", "export_tickets", key) == 1


async def test_cancelling_needs_the_call_scope(tmp_path: Path) -> None:
    # the caller's own principal with a read-only token: under the default key scope
    # (tenant+principal) another principal of the tenant does not see the task at all
    reader = TrustedContext("acme", ACME.principal, frozenset({"tools:read"}))
    async with (
        ledger(tmp_path) as setup,
        Client(setup.server().server, extensions=[Tasks()]) as acme,
        Client(setup.server(reader).server, extensions=[Tasks()]) as other,
    ):
        handle = await start(acme, {**SLOW, "idempotency_key": new_key()})
        assert isinstance(handle, TaskHandle)
        assert (await get_task(other, handle.task_id))["status"] == "working"  # it may look
        with pytest.raises(MCPError) as refused:
            await cancel_task(other, handle.task_id)
        assert "tools:call" in refused.value.error.message
        assert (await get_task(acme, handle.task_id))["status"] == "working"
        await cancel_task(acme, handle.task_id)
