"""Governance over real HTTP, on every backend: approvals bound to the exact call, kill
switches, run budgets, the operator scope and the metrics views."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from tests.http.helpers import (
    approval_token,
    assert_call,
    assert_problem,
    post_call,
)
from tests.http.servers import ACME, GLOBEX, NO_SCOPE, OPERATOR, PLATFORM_OP, SELF_OP, Server, Token
from tests.http.test_door_refusals import door_refusals
from toolledger.schemas.keys import CallKey

CHARGE = {"customer_id": "cus_private_77", "amount_cents": 4200, "currency": "USD"}


async def _poll(
    client: httpx.AsyncClient,
    path: str,
    token: Token,
    done: Callable[[httpx.Response], bool],
    params: dict[str, Any] | None = None,
) -> httpx.Response:
    deadline = time.monotonic() + 30
    while True:
        response = await client.get(path, headers=token.headers, params=params)
        if done(response):
            return response
        assert time.monotonic() < deadline, response.text
        await asyncio.sleep(0.1)


async def _decide(
    client: httpx.AsyncClient, approval_id: str, verb: str, token: Token = OPERATOR, **body: Any
) -> httpx.Response:
    return await client.post(
        f"/v1/approval-requests/{approval_id}/{verb}", headers=token.headers, json=body or None
    )


async def _switch(
    client: httpx.AsyncClient, tool: str, enabled: bool, token: Token = OPERATOR, **extra: Any
) -> httpx.Response:
    body = {"enabled": enabled, "reason": "incident 42: duplicate tickets", **extra}
    return await client.put(f"/v1/tools/{tool}/switch", headers=token.headers, json=body)


async def test_428_shows_the_impact_then_the_approved_call_runs_once(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    asked = await post_call(client, "charge_card", CHARGE, key=key, run_id="run-approve")
    body = assert_problem(asked, 428, "APPROVAL_REQUIRED")
    request = body["approval_request"]
    assert set(request) >= {"id", "tool", "arguments", "args_digest", "impact", "status"}
    assert request["tool"] == "charge_card" and request["status"] == "pending"
    assert request["impact"] == {
        "summary": "Charge 42.00 USD to a customer's card on file.",
        "target": "one customer (id redacted)",
        "scope": "one card payment",
        "cost": "42.00 USD",
        "irreversible": True,
    }
    assert request["arguments"]["amount_cents"] == 4200
    assert "cus_private_77" not in asked.text  # sensitive fields are redacted
    assert request["args_digest"].startswith("sha256:")
    assert server.effects("acme", "charge_card", key) == 0
    # nothing is ledgered for the call itself: its key is unused
    call_id = (await client.get("/v1/calls", params={"idempotency_key": key})).json()["items"]
    assert call_id == []

    listed = await _poll(
        client,
        "/v1/approval-requests",
        OPERATOR,
        lambda r: any(i["id"] == request["id"] for i in r.json().get("items", [])),
        {"status": "pending"},
    )
    assert listed.json()["next_cursor"] is None or isinstance(listed.json()["next_cursor"], str)
    one = await client.get(f"/v1/approval-requests/{request['id']}", headers=OPERATOR.headers)
    assert one.status_code == 200 and one.json()["status"] == "pending"
    assert one.json()["requested_by"] == "alice" and one.json()["impact"] == request["impact"]
    approved = await _decide(client, request["id"], "approve")
    assert approved.status_code == 200, approved.text
    token = approved.json()["approval_token"]
    assert approved.json()["expires_at"] and approved.json()["approval_request"]["id"]

    done = await post_call(client, "charge_card", CHARGE, key=key, approval_token=token)
    result = assert_call(done, "SUCCEEDED", replayed=False)
    replay = await post_call(client, "charge_card", CHARGE, key=key, approval_token=token)
    assert assert_call(replay, "SUCCEEDED", replayed=True)["result"] == result["result"]
    assert server.effects("acme", "charge_card", key) == 1
    # single use: the same token on another call is refused, and runs nothing
    other = await post_call(client, "charge_card", CHARGE, key=key + "-2", approval_token=token)
    assert_problem(other, 403, "APPROVAL_INVALID")
    assert server.effects("acme", "charge_card", key + "-2") == 0
    again = await _decide(client, request["id"], "approve")
    assert_problem(again, 409, "APPROVAL_INVALID")
    # approver, decision and times are in the audit trail
    events = (await client.get(f"/v1/calls/{result['call_id']}/events")).json()["items"]
    granted = [e for e in events if e["type"] == "ApprovalGranted"]
    assert granted and granted[0]["approver"] == "olga" and token not in str(events)


async def test_bad_tokens_get_approval_invalid_and_run_nothing(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    token = await approval_token(client, "charge_card", CHARGE, key)
    # other arguments under the request's key: a reused key, whatever token comes with them
    other = await post_call(
        client, "charge_card", {**CHARGE, "amount_cents": 1}, key=key, approval_token=token
    )
    assert_problem(other, 422, "IDEMPOTENCY_KEY_REUSED")
    cases = {
        "truncated": (CHARGE, token[:20], client.headers),
        "forged": (CHARGE, "apt_" + "A" * 43, client.headers),
        "another tenant": (CHARGE, token, GLOBEX.headers),
    }
    for name, (args, presented, headers) in cases.items():
        response = await post_call(
            client, "charge_card", args, key=key, approval_token=presented, headers=headers
        )
        assert response.status_code == 403, (name, response.text)
        assert_problem(response, 403, "APPROVAL_INVALID")
    assert server.effects("acme", "charge_card", key) == 0
    assert server.effects("globex", "charge_card", key) == 0
    ok = await post_call(client, "charge_card", CHARGE, key=key, approval_token=token)
    assert_call(ok, "SUCCEEDED", replayed=False)


async def test_racing_calls_with_one_token_run_once(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    token = await approval_token(client, "charge_card", CHARGE, key)
    keys = [key] * 4 + [f"{key}-{i}" for i in range(4)]
    answers = await asyncio.gather(
        *(post_call(client, "charge_card", CHARGE, key=k, approval_token=token) for k in keys)
    )
    statuses = sorted(a.status_code for a in answers)
    assert statuses.count(403) == 4, statuses  # the other keys: never approved
    assert sum(server.effects("acme", "charge_card", k) for k in set(keys)) == 1


async def test_operators_deny_with_a_reason_and_scopes_are_enforced(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    charge = await post_call(client, "charge_card", CHARGE, key=key + "-charge")
    charge_id = assert_problem(charge, 428, "APPROVAL_REQUIRED")["approval_request"]
    assert charge_id["approver_kind"] == "operator"  # above what a user confirms
    for verb in ("approve", "deny"):  # an operator's request, a caller without the scope
        forbidden = await _decide(client, charge_id["id"], verb, ACME, reason="no")
        assert "operator" in assert_problem(forbidden, 403, "FORBIDDEN")["detail"]
    assert_problem(await client.get("/v1/approval-requests"), 403, "FORBIDDEN")
    asked = await post_call(
        client, "send_email", {"to": "a@b.co", "subject": "s", "body": "b"}, key=key
    )
    approval_id = assert_problem(asked, 428, "APPROVAL_REQUIRED")["approval_request"]["id"]
    huge = await _decide(client, approval_id, "deny", reason="x" * 5000)
    assert_problem(huge, 400, "VALIDATION_FAILED")
    assert_problem(await _decide(client, approval_id, "deny"), 400, "VALIDATION_FAILED")
    missing = await _decide(client, "apr_" + uuid.uuid4().hex[:24], "approve")
    assert_problem(missing, 404, "NOT_FOUND")

    denied = await _decide(client, approval_id, "deny", reason="We never email this customer.")
    assert denied.status_code == 200, denied.text
    assert denied.json()["approval_request"]["status"] == "denied"
    retried = await post_call(
        client, "send_email", {"to": "a@b.co", "subject": "s", "body": "b"}, key=key
    )
    problem = assert_problem(retried, 403, "APPROVAL_INVALID")
    assert "never email" in problem["detail"] and problem["retryable"] is False
    assert_problem(await _decide(client, approval_id, "approve"), 409, "APPROVAL_INVALID")
    assert server.effects("acme", "send_email", key) == 0
    listed = await _poll(
        client,
        "/v1/approval-requests",
        OPERATOR,
        lambda r: any(i["id"] == approval_id for i in r.json().get("items", [])),
        {"status": "denied"},
    )
    mine = next(i for i in listed.json()["items"] if i["id"] == approval_id)
    assert mine["approver"] == "olga" and mine["reason"] == "We never email this customer."


async def test_approval_requests_are_tenant_scoped_and_not_self_approved(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    theirs = await post_call(client, "charge_card", CHARGE, key=key, headers=GLOBEX.headers)
    their_id = assert_problem(theirs, 428, "APPROVAL_REQUIRED")["approval_request"]["id"]
    assert_problem(await _decide(client, their_id, "approve"), 404, "NOT_FOUND")
    theirs_read = await client.get(f"/v1/approval-requests/{their_id}", headers=OPERATOR.headers)
    assert_problem(theirs_read, 404, "NOT_FOUND")
    mine = await post_call(client, "charge_card", CHARGE, key=key, headers=SELF_OP.headers)
    my_id = assert_problem(mine, 428, "APPROVAL_REQUIRED")["approval_request"]["id"]
    assert_problem(await _decide(client, my_id, "approve", SELF_OP), 403, "FORBIDDEN")
    # a platform operator sees and decides every tenant's requests
    await _poll(
        client,
        "/v1/approval-requests",
        PLATFORM_OP,
        lambda r: any(i["id"] == their_id for i in r.json().get("items", [])),
        {"status": "pending"},
    )
    assert (await _decide(client, their_id, "approve", PLATFORM_OP)).status_code == 200


async def test_the_kill_switch_refuses_new_calls_and_still_replays(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    before = await post_call(client, "close_ticket", {"ticket_id": "T_1"}, key=key)
    try:
        off = await _switch(client, "close_ticket", False)
        assert off.status_code == 200, off.text
        assert off.json()["enabled"] is False and off.json()["tenant_id"] == "acme"
        refused = await post_call(client, "close_ticket", {"ticket_id": "T_2"}, key=key + "-new")
        problem = assert_problem(refused, 503, "TOOL_DISABLED")
        assert "incident 42" in problem["detail"] and refused.headers["retry-after"]
        assert server.effects("acme", "close_ticket", key + "-new") == 0
        replay = await post_call(client, "close_ticket", {"ticket_id": "T_1"}, key=key)
        assert replay.status_code == before.status_code and replay.content == before.content
        assert replay.headers["idempotent-replayed"] == "true"
        theirs = await post_call(
            client, "close_ticket", {"ticket_id": "T_9"}, key=key, headers=GLOBEX.headers
        )
        assert theirs.status_code != 503  # another tenant's switch is its own
        assert_problem(
            await _switch(client, "close_ticket", False, scope="global"), 403, "FORBIDDEN"
        )
        assert_problem(await _switch(client, "no_such_tool", False), 404, "TOOL_NOT_FOUND")
        assert_problem(
            await _switch(client, "close_ticket", False, reason=""), 400, "VALIDATION_FAILED"
        )
    finally:
        on = await _switch(client, "close_ticket", True)
        assert on.status_code == 200, on.text
    after = await post_call(client, "close_ticket", {"ticket_id": "T_2"}, key=key + "-new")
    assert after.status_code != 503, after.text


async def test_a_global_switch_needs_the_platform_scope_and_covers_every_tenant(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    try:
        off = await _switch(client, "create_ticket", False, PLATFORM_OP, scope="global")
        assert off.status_code == 200 and off.json()["tenant_id"] == "*", off.text
        for token in (None, GLOBEX):
            headers = token.headers if token else None
            refused = await post_call(
                client, "create_ticket", {"title": "t"}, key=key, headers=headers
            )
            assert_problem(refused, 503, "TOOL_DISABLED")
    finally:
        on = await _switch(client, "create_ticket", True, PLATFORM_OP, scope="global")
        assert on.status_code == 200, on.text
    assert_call(
        await post_call(client, "create_ticket", {"title": "t"}, key=key),
        "SUCCEEDED",
        replayed=False,
    )


async def test_a_run_that_repeats_one_failure_is_stopped(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    run = f"run-{uuid.uuid4().hex[:8]}"
    failing = {"payload": "p", "fault": "retryable_always"}
    done = await post_call(client, "flaky_write", {"payload": "ok"}, key=key + "-ok", run_id=run)
    assert_call(done, "SUCCEEDED", replayed=False)
    # a transient failure that recovered is not a repeat: the run goes on
    blip = {"payload": "p", "fault": "transient_once"}
    for n in range(3):
        healed = await post_call(client, "flaky_write", blip, key=f"{key}-t{n}", run_id=run)
        assert_call(healed, "SUCCEEDED", replayed=False)
    for n in range(3):  # three rounds ending in the same failure (3 attempts each)
        failed = await post_call(
            client, "flaky_write", failing, key=f"{key}-{n}", run_id=run, wait=30
        )
        assert failed.status_code == 200, failed.text
        assert failed.json()["status"] == "FAILED_RETRYABLE"
    deadline = time.monotonic() + 30
    while True:  # the budget reads the projection: wait until it has the failures
        stopped = await post_call(client, "flaky_write", failing, key=key + "-b", run_id=run)
        if stopped.status_code == 422:
            break
        assert time.monotonic() < deadline, stopped.text
        await asyncio.sleep(0.2)
    problem = assert_problem(stopped, 422, "RETRY_LIMIT_EXCEEDED")
    assert "human" in problem["suggested_action"] and problem["retryable"] is False
    assert server.effects_with_key(key + "-b") == 0
    audited = await door_refusals(client, "flaky_write", key + "-b")  # in the audit trail
    assert "RETRY_LIMIT_EXCEEDED" in {e["error"]["code"] for e in audited}
    # retrying a failed key of the run is a new round: refused too
    assert_problem(
        await post_call(client, "flaky_write", failing, key=f"{key}-0", run_id=run),
        422,
        "RETRY_LIMIT_EXCEEDED",
    )
    # a finished call of the run is still answered from the ledger
    replay = await post_call(client, "flaky_write", {"payload": "ok"}, key=key + "-ok", run_id=run)
    assert_call(replay, "SUCCEEDED", replayed=True)
    # another tool in the run, and the same tool in another run, are not affected
    ticket = await post_call(client, "create_ticket", {"title": "x"}, key=key, run_id=run)
    assert_call(ticket, "SUCCEEDED", replayed=False)
    other = await post_call(
        client, "flaky_write", {"payload": "ok"}, key=key + "-c", run_id=run + "-other"
    )
    assert_call(other, "SUCCEEDED", replayed=False)


async def test_stats_are_per_tenant_and_all_tenants_for_platform_operators(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    assert_call(
        await post_call(client, "create_ticket", {"title": "s"}, key=key),
        "SUCCEEDED",
        replayed=False,
    )
    every = await _poll(client, "/v1/stats", PLATFORM_OP, lambda r: r.json()["totals"]["calls"] > 0)
    body = every.json()
    assert body["tenant_id"] is None  # a platform operator reads every tenant
    own_op = (await client.get("/v1/stats", headers=OPERATOR.headers)).json()
    assert own_op["tenant_id"] == "acme"  # a tenant's operator, its own tenant only
    other_op = await client.get("/v1/stats", params={"tenant": "globex"}, headers=OPERATOR.headers)
    assert_problem(other_op, 403, "FORBIDDEN")
    totals = body["totals"]
    for name in (
        "success_rate", "validation_failure_rate", "calls_per_run", "duplicate_rate",
        "human_rejection_rate", "unknown",
    ):  # fmt: skip
        assert name in totals, totals
    assert 0 <= totals["success_rate"] <= 1
    own = (await client.get("/v1/stats", headers=GLOBEX.headers)).json()
    assert own["tenant_id"] == "globex"
    other = await client.get("/v1/stats", params={"tenant": "acme"}, headers=GLOBEX.headers)
    assert_problem(other, 403, "FORBIDDEN")


async def test_a_tenant_smuggled_into_the_arguments_is_refused_and_audited(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    smuggled = {"title": "x", "tenant_id": "globex", "principal": "root"}
    refused = await post_call(client, "create_ticket", smuggled, key=key)
    problem = assert_problem(refused, 400, "VALIDATION_FAILED")
    assert {"tenant_id", "principal"} <= {e["loc"] for e in problem["errors"]}
    assert server.effects("globex", "create_ticket", key) == 0
    assert server.effects("acme", "create_ticket", key) == 0
    call_id = CallKey("acme", "create_ticket", key, ACME.principal).call_id  # alice's key
    trail = await _poll(
        client,
        f"/v1/calls/{call_id}/events",
        OPERATOR,
        lambda r: r.status_code == 200 and bool(r.json()["items"]),
    )
    (event,) = trail.json()["items"]
    assert event["type"] == "ToolCallRejected" and event["error"]["code"] == "VALIDATION_FAILED"
    # the refusal consumed nothing: the key works with the right arguments
    assert_call(
        await post_call(client, "create_ticket", {"title": "x"}, key=key),
        "SUCCEEDED",
        replayed=False,
    )


async def test_the_caller_reads_its_own_approval_request_and_nobody_else_does(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    asked = await post_call(client, "charge_card", CHARGE, key=key)
    approval_id = assert_problem(asked, 428, "APPROVAL_REQUIRED")["approval_request"]["id"]
    mine = await client.get(f"/v1/approval-requests/{approval_id}")
    assert mine.status_code == 200, mine.text
    assert mine.json()["id"] == approval_id and mine.json()["status"] == "pending"
    as_operator = await client.get(f"/v1/approval-requests/{approval_id}", headers=OPERATOR.headers)
    assert as_operator.status_code == 200 and as_operator.json()["id"] == approval_id
    for other in (NO_SCOPE, GLOBEX):  # another principal of the tenant; another tenant
        theirs = await client.get(f"/v1/approval-requests/{approval_id}", headers=other.headers)
        assert_problem(theirs, 404, "NOT_FOUND")
    assert_problem(await client.get("/v1/approval-requests"), 403, "FORBIDDEN")  # the list
