"""Refusals the front door gives itself (scope, kill switch, run budget) are audit events:
findable by key in the call's events, and they never consume the key. On every backend."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from tests.http.helpers import assert_call, assert_problem, post_call
from tests.http.servers import ACME, NO_SCOPE, OPERATOR, Server, Token
from toolledger.schemas.keys import CallKey


async def door_refusals(
    client: httpx.AsyncClient, tool: str, key: str, caller: Token = ACME, reader: Token = ACME
) -> list[dict[str, Any]]:
    """The ToolCallRejected events recorded for ``caller``'s ``key`` (the server's default key
    scope, tenant+principal: the principal is part of the call key), read by ``reader`` (the
    projection may lag: polled)."""
    call_id = CallKey("acme", tool, key, caller.principal).call_id
    deadline = time.monotonic() + 30
    while True:
        response = await client.get(f"/v1/calls/{call_id}/events", headers=reader.headers)
        if response.status_code == 200:
            found = [e for e in response.json()["items"] if e["type"] == "ToolCallRejected"]
            if found:
                return found
        assert time.monotonic() < deadline, response.text
        await asyncio.sleep(0.1)


async def test_a_missing_scope_is_audited_and_leaves_the_key_unused(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    refused = await post_call(
        client, "create_ticket", {"title": "no scope"}, key=key, headers=NO_SCOPE.headers
    )
    assert_problem(refused, 403, "FORBIDDEN")
    # mallory's key is hers (tenant+principal): the tenant's operator reads her refusal and
    # searches the key among every principal's calls
    [event] = await door_refusals(client, "create_ticket", key, NO_SCOPE, OPERATOR)
    assert event["error"]["code"] == "FORBIDDEN"
    assert event["envelope"]["principal"] == "mallory"
    found = await client.get("/v1/calls", params={"idempotency_key": key}, headers=OPERATOR.headers)
    assert found.json()["items"] == []  # no call: the key is unused
    fresh = await post_call(client, "create_ticket", {"title": "no scope"}, key=key)
    assert_call(fresh, "SUCCEEDED", replayed=False)
    assert server.effects("acme", "create_ticket", key) == 1


async def test_a_switched_off_tool_refused_at_the_door_is_audited(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    body = {"enabled": False, "reason": "audit test", "scope": "tenant"}
    off = await client.put("/v1/tools/send_email/switch", headers=OPERATOR.headers, json=body)
    assert off.status_code == 200, off.text
    try:
        email = {"to": "a@example.com", "subject": "s", "body": "b"}
        await asyncio.sleep(1.5)  # past the door's switch cache (1 s): the door refuses
        refused = await post_call(client, "send_email", email, key=key)
        assert_problem(refused, 503, "TOOL_DISABLED")
        events = await door_refusals(client, "send_email", key)
        assert [e["error"]["code"] for e in events] == ["TOOL_DISABLED"]
        # recorded by the front door (before validation: no tool version, no digest)
        assert events[0]["envelope"]["tool_version"] == ""
    finally:
        on = {"enabled": True, "reason": "audit test over", "scope": "tenant"}
        back = await client.put("/v1/tools/send_email/switch", headers=OPERATOR.headers, json=on)
        assert back.status_code == 200, back.text
    assert server.effects("acme", "send_email", key) == 0
