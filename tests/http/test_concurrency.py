"""Races over real HTTP: many identical requests at once execute exactly once."""

from __future__ import annotations

import asyncio

import httpx

from tests.http.helpers import is_replay, post_call
from tests.http.servers import Server

RACERS = 50


async def test_fifty_identical_requests_make_exactly_one_side_effect(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    arguments = {"payload": "race", "fault": "slow", "delay_ms": 300}
    gate = asyncio.Event()

    async def racer() -> httpx.Response:
        await gate.wait()
        return await post_call(client, "flaky_write", arguments, key=key, wait=60)

    tasks = [asyncio.create_task(racer()) for _ in range(RACERS)]
    await asyncio.sleep(0.1)
    gate.set()
    responses = await asyncio.gather(*tasks)
    assert [r.status_code for r in responses] == [200] * RACERS, [
        (r.status_code, r.text) for r in responses if r.status_code != 200
    ]
    first = [r for r in responses if not is_replay(r)]
    assert len(first) == 1
    assert all(r.content == first[0].content for r in responses)
    assert first[0].json()["status"] == "SUCCEEDED"
    assert server.effects("acme", "flaky_write", key) == 1


async def test_racing_two_argument_sets_on_one_key(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    gate = asyncio.Event()

    async def racer(n: int) -> tuple[int, httpx.Response]:
        await gate.wait()
        title = f"variant-{n % 2}"
        return n % 2, await post_call(client, "create_ticket", {"title": title}, key=key, wait=60)

    tasks = [asyncio.create_task(racer(n)) for n in range(RACERS)]
    await asyncio.sleep(0.1)
    gate.set()
    answers = await asyncio.gather(*tasks)
    executed = [(v, r) for v, r in answers if r.status_code == 200 and not is_replay(r)]
    assert len(executed) == 1
    winner = executed[0][0]
    for variant, response in answers:
        if variant == winner:
            assert response.status_code == 200
            assert response.content == executed[0][1].content
        else:
            assert response.status_code == 422, response.text
            assert response.json()["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert server.effects("acme", "create_ticket", key) == 1
