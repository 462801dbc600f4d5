"""Calls that are still running: 202 with Location, duplicates that wait, 409, and 422."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.http.helpers import assert_call, assert_problem, eventually_get, post_call
from tests.http.servers import Server

SLOW_MS = 2500  # below every backend's flaky_write timeout


def slow(payload: str) -> dict[str, object]:
    return {"payload": payload, "fault": "slow", "delay_ms": SLOW_MS}


async def test_first_call_that_outlasts_its_wait_gets_202_then_the_location_settles(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    started = time.monotonic()
    accepted = await post_call(client, "flaky_write", slow("a"), key=key, wait=0.5)
    assert time.monotonic() - started < SLOW_MS / 1000
    assert accepted.status_code == 202, accepted.text
    assert "idempotent-replayed" not in accepted.headers
    body = accepted.json()
    assert body["status"] == "PENDING" and body["ok"] is False
    location = accepted.headers["location"]
    assert location == f"/v1/calls/{body['call_id']}"

    done = await eventually_get(
        client, location, lambda r: r.status_code == 200 and r.json()["status"] != "PENDING"
    )
    final = done.json()
    assert final["status"] == "SUCCEEDED"
    assert final["result"]["write_id"].startswith("W_")
    # asking again with the same key gets the stored outcome, as a replay
    replay = await post_call(client, "flaky_write", slow("a"), key=key)
    assert replay.content == done.content
    assert replay.headers["idempotent-replayed"] == "true"
    assert server.effects("acme", "flaky_write", key) == 1


async def test_duplicate_waits_for_the_running_original_and_gets_its_outcome(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    original = asyncio.create_task(post_call(client, "flaky_write", slow("d"), key=key, wait=30))
    await asyncio.sleep(0.5)
    duplicate = await post_call(client, "flaky_write", slow("d"), key=key, wait=30)
    first = await original
    assert_call(first, "SUCCEEDED", replayed=False)
    assert duplicate.status_code == 200
    assert duplicate.headers["idempotent-replayed"] == "true"
    assert duplicate.content == first.content
    assert server.effects("acme", "flaky_write", key) == 1


async def test_duplicate_whose_wait_runs_out_gets_409_retryable_with_retry_after(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    original = asyncio.create_task(post_call(client, "flaky_write", slow("w"), key=key, wait=30))
    await asyncio.sleep(0.5)
    started = time.monotonic()
    duplicate = await post_call(client, "flaky_write", slow("w"), key=key, wait=0.5)
    elapsed = time.monotonic() - started
    problem = assert_problem(duplicate, 409, "IDEMPOTENCY_KEY_IN_USE")
    assert problem["retryable"] is True
    assert int(duplicate.headers["retry-after"]) >= 1
    assert 0.4 < elapsed < 2.0, elapsed  # it waited for its own Prefer: wait, not longer
    first = await original
    assert_call(first, "SUCCEEDED", replayed=False)
    later = await post_call(client, "flaky_write", slow("w"), key=key)
    assert later.content == first.content
    assert server.effects("acme", "flaky_write", key) == 1


async def test_other_arguments_while_running_are_refused_at_once(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    original = asyncio.create_task(post_call(client, "flaky_write", slow("r"), key=key, wait=30))
    await asyncio.sleep(0.5)
    started = time.monotonic()
    reused = await post_call(client, "flaky_write", slow("other"), key=key, wait=30)
    assert time.monotonic() - started < 1.5
    assert_problem(reused, 422, "IDEMPOTENCY_KEY_REUSED")
    assert not original.done()
    assert_call(await original, "SUCCEEDED", replayed=False)
    assert server.effects("acme", "flaky_write", key) == 1


async def test_prefer_wait_is_read_from_the_header(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    locations = []
    for n, prefer in enumerate(("wait=0", "respond-async, wait=0", "handling=lenient; wait=0")):
        started = time.monotonic()
        response = await post_call(
            client, "flaky_write", slow(f"p{n}"), key=f"{key}-{n}", headers={"Prefer": prefer}
        )
        assert response.status_code == 202, (prefer, response.text)
        assert time.monotonic() - started < 1.5, prefer
        locations.append(response.headers["location"])
    # an absurd wait is capped (at 60 s) rather than refused; a malformed one uses the default
    capped = await post_call(
        client, "create_ticket", {"title": "w"}, key=key, headers={"Prefer": "wait=100000"}
    )
    assert_call(capped, "SUCCEEDED", replayed=False)
    odd = await post_call(
        client, "create_ticket", {"title": "w"}, key=key, headers={"Prefer": "wait=soon"}
    )
    assert odd.content == capped.content
    assert odd.headers["idempotent-replayed"] == "true"
    for n, location in enumerate(locations):  # the accepted calls finish on their own, once
        await eventually_get(client, location, lambda r: r.json()["status"] == "SUCCEEDED")
        assert server.effects("acme", "flaky_write", f"{key}-{n}") == 1
