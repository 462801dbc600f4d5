"""Call groups over the HTTP API on the embedded backend: a DAG of ordinary ledgered calls,
run in dependency order, compensated on failure, paused for approvals, resumed from their
completion point; against a real ``toolledger serve`` process of this module's own."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.http.conftest import BACKENDS, serving
from tests.http.helpers import assert_problem
from tests.http.servers import (
    ACME,
    GLOBEX,
    OPERATOR,
    Server,
)

SLOW = {"payload": "p", "fault": "slow", "delay_ms": 400}


@pytest.fixture(scope="module", params=BACKENDS)
def groups_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A server of this module's own: its tests switch tools off and on."""
    yield from serving(request, tmp_path_factory, "http-groups")


@pytest.fixture
async def client(groups_server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=groups_server.base_url, headers=ACME.headers, timeout=90
    ) as http:
        yield http


def _key() -> str:
    return f"grp-{uuid.uuid4().hex[:16]}"


async def _submit(
    client: httpx.AsyncClient, body: dict[str, Any], key: str, wait: float = 30
) -> httpx.Response:
    return await client.post(
        "/v1/groups", json=body, headers={"Idempotency-Key": key, "Prefer": f"wait={wait:g}"}
    )


def _effects(server: Server, tool: str) -> dict[str, int]:
    """Effects per idempotency key of ``tool`` in the downstream (a double shows as 2)."""
    with sqlite3.connect(server.helpdesk_db) as conn:
        rows = conn.execute(
            "SELECT idempotency_key, COUNT(*) FROM effects WHERE tenant_id = 'acme' AND tool = ?"
            " GROUP BY idempotency_key",
            (tool,),
        ).fetchall()
    return {k: n for k, n in rows}


def _at(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["envelope"]["occurred_at"])


def _steps(group: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in group["steps"]}


async def _events(client: httpx.AsyncClient, call_id: str) -> list[dict[str, Any]]:
    """The call's audit trail once it has its outcome (the projection may lag the log)."""
    deadline = time.monotonic() + 30
    while True:
        page = await client.get(f"/v1/calls/{call_id}/events")
        items: list[dict[str, Any]] = page.json().get("items", [])
        if page.status_code == 200 and any(e["type"] == "ToolCallSucceeded" for e in items):
            return items
        assert time.monotonic() < deadline, page.text
        await asyncio.sleep(0.1)


async def test_a_diamond_runs_in_order_and_its_independent_steps_overlap(
    client: httpx.AsyncClient, groups_server: Server
) -> None:
    body = {
        "run_id": "run-diamond",
        "steps": [
            {"id": "open", "tool": "create_ticket", "arguments": {"title": "diamond"}},
            {"id": "left", "tool": "flaky_write", "arguments": SLOW, "depends_on": ["open"]},
            {"id": "right", "tool": "flaky_write", "arguments": SLOW, "depends_on": ["open"]},
            {
                "id": "close",
                "tool": "close_ticket",
                "arguments": {"ticket_id": {"$from": "open", "path": "ticket_id"}},
                "depends_on": ["left", "right"],
            },
        ],
    }
    key = _key()
    answered = await _submit(client, body, key)
    assert answered.status_code == 200, answered.text
    group = answered.json()
    assert group["status"] == "SUCCEEDED" and group["run_id"] == "run-diamond"
    assert answered.headers["location"] == f"/v1/groups/{group['group_id']}"
    steps = _steps(group)
    assert {s["status"] for s in steps.values()} == {"SUCCEEDED"}
    assert steps["close"]["result"] == {
        "ticket_id": steps["open"]["result"]["ticket_id"],
        "status": "closed",
    }
    assert steps["close"]["depends_on"] == ["open", "left", "right"]  # $from implies "open"

    def when(events: list[dict[str, Any]], kind: str) -> datetime:
        return _at(next(e for e in events if e["type"] == kind))

    trail = {sid: await _events(client, s["call_id"]) for sid, s in steps.items()}
    # in order: a step starts only after what it depends on has succeeded
    assert when(trail["open"], "ToolCallSucceeded") <= when(trail["left"], "ToolCallStarted")
    assert when(trail["right"], "ToolCallSucceeded") <= when(trail["close"], "ToolCallStarted")
    # the independent steps overlap: each started before the other finished
    assert when(trail["left"], "ToolCallStarted") < when(trail["right"], "ToolCallSucceeded")
    assert when(trail["right"], "ToolCallStarted") < when(trail["left"], "ToolCallSucceeded")
    writes = [n for k, n in _effects(groups_server, "flaky_write").items() if key in k]
    assert writes == [1, 1]  # left and right, once each


async def test_the_same_key_replays_and_another_definition_is_refused(
    client: httpx.AsyncClient, groups_server: Server
) -> None:
    body = {
        "run_id": "run-replay",
        "steps": [{"id": "a", "tool": "create_ticket", "arguments": {"title": "once"}}],
    }
    key = _key()
    first = await _submit(client, body, key)
    again = await _submit(client, body, key)
    assert first.status_code == again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert again.json()["group_id"] == first.json()["group_id"]
    assert again.json()["steps"] == first.json()["steps"]
    other = dict(body, steps=[{"id": "a", "tool": "create_ticket", "arguments": {"title": "x"}}])
    assert_problem(await _submit(client, other, key), 422, "IDEMPOTENCY_KEY_REUSED")
    ticket_key = next(k for k in _effects(groups_server, "create_ticket") if key in k)
    assert _effects(groups_server, "create_ticket")[ticket_key] == 1


async def test_a_failure_in_the_middle_compensates_in_reverse_order_exactly_once(
    client: httpx.AsyncClient, groups_server: Server
) -> None:
    body = {
        "run_id": "run-compensate",
        "steps": [
            {"id": "first", "tool": "create_ticket", "arguments": {"title": "one"}},
            {
                "id": "second",
                "tool": "create_ticket",
                "arguments": {"title": "two"},
                "depends_on": ["first"],
            },
            {
                "id": "boom",
                "tool": "flaky_write",
                "arguments": {"payload": "x", "fault": "final"},
                "depends_on": ["second"],
            },
            {
                "id": "never",
                "tool": "create_ticket",
                "arguments": {"title": "three"},
                "depends_on": ["boom"],
            },
        ],
    }
    key = _key()
    answered = await _submit(client, body, key)
    assert answered.status_code == 200, answered.text
    group = answered.json()
    assert group["status"] == "COMPENSATED"
    steps = _steps(group)
    assert steps["boom"]["status"] == "FAILED_FINAL"
    assert steps["boom"]["error"]["code"] == "DOWNSTREAM_REFUSED"
    assert steps["never"]["status"] == "SKIPPED" and steps["never"]["call_id"] is None
    for sid in ("first", "second"):
        assert steps[sid]["compensation"]["status"] == "SUCCEEDED"
    point = group["completion_point"]
    assert point["compensated"] == ["first", "second"] and point["failed"] == ["boom"]
    # reverse order: "second" (which depends on "first") was closed first
    first_close = await _events(client, steps["first"]["compensation"]["call_id"])
    second_close = await _events(client, steps["second"]["compensation"]["call_id"])
    started = _at(next(e for e in first_close if e["type"] == "ToolCallStarted"))
    done = _at(next(e for e in second_close if e["type"] == "ToolCallSucceeded"))
    assert done <= started
    closes = {k: n for k, n in _effects(groups_server, "close_ticket").items() if key in k}
    assert sorted(closes.values()) == [1, 1]  # each compensation ran exactly once
    replay = await _submit(client, body, key)
    assert replay.json()["status"] == "COMPENSATED"
    closes_after = {k: n for k, n in _effects(groups_server, "close_ticket").items() if key in k}
    assert closes_after == closes


async def test_stop_then_resume_runs_only_what_had_not_completed(
    client: httpx.AsyncClient, groups_server: Server
) -> None:
    switch = {"enabled": False, "reason": "incident 7: downstream is flaky"}
    off = await client.put("/v1/tools/flaky_write/switch", headers=OPERATOR.headers, json=switch)
    assert off.status_code == 200, off.text
    body = {
        "run_id": "run-stop",
        "on_failure": "stop",
        "steps": [
            {"id": "open", "tool": "create_ticket", "arguments": {"title": "stop"}},
            {
                "id": "write",
                "tool": "flaky_write",
                "arguments": {"payload": "y"},
                "depends_on": ["open"],
            },
        ],
    }
    key = _key()
    try:
        stopped = (await _submit(client, body, key)).json()
    finally:
        on = dict(switch, enabled=True)
        back = await client.put("/v1/tools/flaky_write/switch", headers=OPERATOR.headers, json=on)
        assert back.status_code == 200, back.text
    assert stopped["status"] == "FAILED", stopped
    steps = _steps(stopped)
    assert steps["open"]["status"] == "SUCCEEDED"
    assert steps["write"]["status"] == "FAILED_RETRYABLE"
    assert steps["write"]["error"]["code"] == "TOOL_DISABLED"
    assert steps["open"]["compensation"] is None  # stop leaves completed steps as they are
    resumed = await client.post(
        f"/v1/groups/{stopped['group_id']}/resume", headers={"Prefer": "wait=30"}
    )
    assert resumed.status_code == 200, resumed.text
    group = resumed.json()
    assert group["status"] == "SUCCEEDED"
    assert _steps(group)["open"]["result"] == steps["open"]["result"]
    opened = [n for k, n in _effects(groups_server, "create_ticket").items() if key in k]
    written = [n for k, n in _effects(groups_server, "flaky_write").items() if key in k]
    assert opened == [1] and written == [1]
    finished = await client.post(f"/v1/groups/{stopped['group_id']}/resume")
    assert_problem(finished, 409, "GROUP_NOT_RESUMABLE")


async def test_a_step_that_needs_approval_pauses_the_group_until_resume(
    client: httpx.AsyncClient, groups_server: Server
) -> None:
    charge = {"customer_id": "cus_group", "amount_cents": 500, "currency": "EUR"}
    body = {
        "run_id": "run-approval",
        "steps": [
            {"id": "open", "tool": "create_ticket", "arguments": {"title": "refund"}},
            {"id": "pay", "tool": "charge_card", "arguments": charge, "depends_on": ["open"]},
        ],
    }
    key = _key()
    blocked = await _submit(client, body, key, wait=10)
    assert blocked.status_code == 202, blocked.text
    group = blocked.json()
    assert group["status"] == "BLOCKED"
    request_id = _steps(group)["pay"]["approval_request"]["id"]
    approved = await client.post(
        f"/v1/approval-requests/{request_id}/approve", headers=OPERATOR.headers
    )
    assert approved.status_code == 200, approved.text
    token = approved.json()["approval_token"]
    resumed = await client.post(
        f"/v1/groups/{group['group_id']}/resume",
        json={"approval_tokens": {"pay": token}},
        headers={"Prefer": "wait=30"},
    )
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["status"] == "SUCCEEDED"
    charges = [n for k, n in _effects(groups_server, "charge_card").items() if key in k]
    assert charges == [1]


@pytest.mark.parametrize(
    ("steps", "loc"),
    [
        ([{"id": "a", "tool": "no_such_tool", "arguments": {}}], "steps.0.tool"),
        (
            [
                {"id": "a", "tool": "create_ticket", "arguments": {"title": "x"}},
                {"id": "a", "tool": "create_ticket", "arguments": {"title": "y"}},
            ],
            "steps.1.id",
        ),
        (
            [
                {
                    "id": "a",
                    "tool": "create_ticket",
                    "arguments": {"title": "x"},
                    "depends_on": ["a"],
                }
            ],
            "steps.0.depends_on.0",
        ),
        (
            [{"id": "a", "tool": "create_ticket", "arguments": {"title": 5}}],
            "steps.0.arguments.title",
        ),
    ],
)
async def test_an_invalid_group_is_400_and_nothing_is_stored(
    client: httpx.AsyncClient, steps: list[dict[str, Any]], loc: str
) -> None:
    run_id = f"run-invalid-{uuid.uuid4().hex[:8]}"
    refused = await _submit(client, {"run_id": run_id, "steps": steps}, _key())
    problem = assert_problem(refused, 400, "VALIDATION_FAILED")
    assert loc in {e["loc"] for e in problem["errors"]}, problem
    found = await client.get("/v1/groups", params={"run_id": run_id})
    assert found.status_code == 200 and found.json()["items"] == []


async def test_a_group_needs_its_key_and_is_found_by_id_and_run_only_in_its_tenant(
    client: httpx.AsyncClient, groups_server: Server
) -> None:
    body = {"run_id": "run-find", "steps": [{"id": "a", "tool": "list_tickets", "arguments": {}}]}
    missing = await client.post("/v1/groups", json=body)
    assert_problem(missing, 400, "IDEMPOTENCY_KEY_MISSING")
    group = (await _submit(client, body, _key())).json()
    assert group["status"] == "SUCCEEDED"
    got = await client.get(f"/v1/groups/{group['group_id']}")
    assert got.status_code == 200 and got.json()["group_id"] == group["group_id"]
    listed = await client.get("/v1/groups", params={"run_id": "run-find"})
    assert group["group_id"] in {g["group_id"] for g in listed.json()["items"]}
    theirs = await client.get(f"/v1/groups/{group['group_id']}", headers=GLOBEX.headers)
    assert_problem(theirs, 404, "NOT_FOUND")
    assert_problem(await client.get("/v1/groups/grp_nope"), 404, "NOT_FOUND")
