"""``Prefer: wait=0`` keeps the replay contract: the wait only decides whether a *running* call
is answered now (202 / 409) or later; every refusal is answered whatever the wait, and a replay
is only ever served to the same arguments. On every backend."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from tests.http.helpers import assert_call, assert_problem, eventually_get, post_call
from tests.http.servers import OPERATOR, Server

SLOW_MS = 2500
WAITS = [0, 0.001]  # no wait at all, and one shorter than any decision


def slow(payload: str) -> dict[str, object]:
    return {"payload": payload, "fault": "slow", "delay_ms": SLOW_MS}


@pytest.mark.parametrize("wait", WAITS)
async def test_a_finished_key_with_other_arguments_is_refused_not_replayed(
    server: Server, client: httpx.AsyncClient, key: str, wait: float
) -> None:
    first = await post_call(client, "create_ticket", {"title": "first"}, key=key)
    assert_call(first, "SUCCEEDED", replayed=False)
    other = await post_call(client, "create_ticket", {"title": "other"}, key=key, wait=wait)
    assert_problem(other, 422, "IDEMPOTENCY_KEY_REUSED")
    same = await post_call(client, "create_ticket", {"title": "first"}, key=key, wait=wait)
    assert_call(same, "SUCCEEDED", replayed=True)
    assert same.content == first.content
    assert server.effects("acme", "create_ticket", key) == 1


@pytest.mark.parametrize("wait", WAITS)
async def test_a_running_key_answers_other_arguments_422_and_the_same_409(
    server: Server, client: httpx.AsyncClient, key: str, wait: float
) -> None:
    started = await post_call(client, "flaky_write", slow("run"), key=key, wait=0)
    assert started.status_code == 202, started.text
    location = started.headers["location"]
    other = await post_call(client, "flaky_write", slow("other"), key=key, wait=wait)
    assert_problem(other, 422, "IDEMPOTENCY_KEY_REUSED")
    same = await post_call(client, "flaky_write", slow("run"), key=key, wait=wait)
    problem = assert_problem(same, 409, "IDEMPOTENCY_KEY_IN_USE")
    assert problem["retryable"] is True and same.headers["retry-after"]
    invalid = await post_call(client, "flaky_write", {"payload": ["x"]}, key=key, wait=wait)
    assert_problem(invalid, 400, "VALIDATION_FAILED")
    # all three were answered while the call that holds the key still runs
    assert (await client.get(location)).json()["status"] == "PENDING"
    done = await eventually_get(client, location, lambda r: r.json()["status"] == "SUCCEEDED")
    assert done.json()["result"]["write_id"].startswith("W_")
    assert server.effects("acme", "flaky_write", key) == 1


async def test_a_storm_at_wait_0_refuses_every_other_argument_call(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    sends = [
        post_call(client, "flaky_write", slow("same" if n % 2 else f"other-{n}"), key=key, wait=0)
        for n in range(100)
    ]
    responses = await asyncio.gather(*sends)
    same = Counter(r.status_code for n, r in enumerate(responses) if n % 2)
    other = Counter(r.status_code for n, r in enumerate(responses) if not n % 2)
    # whichever came first holds the key: every call with other arguments than its own is 422
    first_is_same = same[202] == 1
    if first_is_same:
        assert other == Counter({422: 50}), other
        assert same == Counter({202: 1, 409: 49}), same
    else:
        assert other == Counter({202: 1, 422: 49}), other
        assert same == Counter({422: 50}), same
    for response in responses:
        assert "idempotent-replayed" not in response.headers
    assert server.effects("acme", "flaky_write", key) <= 1  # still running: 0 or 1 so far
    location = next(r.headers["location"] for r in responses if r.status_code == 202)
    await eventually_get(client, location, lambda r: r.json()["status"] == "SUCCEEDED")
    assert server.effects("acme", "flaky_write", key) == 1


@pytest.mark.parametrize("wait", WAITS)
async def test_refusals_are_answered_whatever_the_wait(
    server: Server, client: httpx.AsyncClient, key: str, wait: float
) -> None:
    invalid = await post_call(client, "create_ticket", {"title": 7}, key=f"{key}-v", wait=wait)
    assert_problem(invalid, 400, "VALIDATION_FAILED")
    unknown = await post_call(client, "create_ticket", {"nope": 1}, key=f"{key}-u", wait=wait)
    assert_problem(unknown, 400, "VALIDATION_FAILED")
    charge = {"customer_id": "cus_w0", "amount_cents": 4200, "currency": "USD"}
    needs = await post_call(client, "charge_card", charge, key=f"{key}-a", wait=wait)
    body = assert_problem(needs, 428, "APPROVAL_REQUIRED")
    assert body["approval_request"]["status"] == "pending"
    forged = await post_call(
        client, "charge_card", charge, key=f"{key}-t", wait=wait, approval_token="forged"
    )
    assert_problem(forged, 403, "APPROVAL_INVALID")
    for suffix in ("v", "u", "a", "t"):  # refusals never consume the key
        assert server.effects("acme", "create_ticket", f"{key}-{suffix}") == 0
        assert server.effects("acme", "charge_card", f"{key}-{suffix}") == 0
    after = await post_call(client, "create_ticket", {"title": "ok"}, key=f"{key}-v", wait=wait)
    assert after.status_code in (200, 202), after.text


@pytest.mark.parametrize("wait", WAITS)
async def test_a_switched_off_tool_is_refused_at_wait_0_and_still_replays(
    server: Server, client: httpx.AsyncClient, key: str, wait: float
) -> None:
    ticket = await post_call(client, "create_ticket", {"title": "to close"}, key=f"{key}-t")
    ticket_id = assert_call(ticket, "SUCCEEDED", replayed=False)["result"]["ticket_id"]
    closing = {"ticket_id": ticket_id}
    done = await post_call(client, "close_ticket", closing, key=f"{key}-old")
    assert_call(done, "SUCCEEDED", replayed=False)
    switched = await client.put(
        "/v1/tools/close_ticket/switch",
        headers=OPERATOR.headers,
        json={"enabled": False, "reason": "wait=0 test", "scope": "tenant"},
    )
    assert switched.status_code == 200, switched.text
    try:
        refused = await post_call(client, "close_ticket", closing, key=f"{key}-new", wait=wait)
        assert_problem(refused, 503, "TOOL_DISABLED")
        replay = await post_call(client, "close_ticket", closing, key=f"{key}-old", wait=wait)
        assert replay.content == done.content
        assert replay.headers.get("idempotent-replayed") == "true"
    finally:
        enabled = await client.put(
            "/v1/tools/close_ticket/switch",
            headers=OPERATOR.headers,
            json={"enabled": True, "reason": "wait=0 test over", "scope": "tenant"},
        )
        assert enabled.status_code == 200, enabled.text
