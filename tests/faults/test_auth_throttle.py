"""Guessing tokens against ``toolledger serve --mcp``, on both backends, with a policy of 20
refused tokens per client address, then one every 5 s (the default is 100, then one a second:
tests/unit/test_auth_throttle.py): past it, bearer tokens, console sign-ins and MCP requests
from that address are answered ``429`` with ``Retry-After`` and nothing is checked (a right
token neither, so that a hit is not told from a miss) until the wait is over. The probe found
300 wrong sign-ins in 9.5 s all answered 401. Another address is not held back, unless it
guesses at the same opaque token."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.http.conftest import BACKENDS, serving
from tests.http.servers import ACME, CAROL, Server

BURST, RATE = 20, 0.2
GUESSES = BURST + 10


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A server of this module's own (the throttle's buckets are the process's); each test
    guesses from addresses of its own."""
    policy = tmp_path_factory.mktemp("policy") / "policy.json"
    policy.write_text(
        json.dumps({"rate_limits": {"auth_failures": {"rate": RATE, "burst": BURST}}})
    )
    yield from serving(request, tmp_path_factory, "throttle", "--mcp", "--policy", str(policy))


@contextlib.asynccontextmanager
async def client_from(server: Server, address: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client whose requests come from ``address`` (any of 127.0.0.0/8 is this host)."""
    transport = httpx.AsyncHTTPTransport(local_address=address)
    async with httpx.AsyncClient(
        base_url=server.base_url, transport=transport, timeout=60
    ) as client:
        yield client


def _guess(n: int) -> dict[str, str]:
    return {"Authorization": f"Bearer guess-{n:04d}-{'x' * 24}"}


async def _until_throttled(client: httpx.AsyncClient) -> list[int]:
    statuses = []
    for n in range(GUESSES):
        answer = await client.get("/v1/tools", headers=_guess(n))
        statuses.append(answer.status_code)
        if answer.status_code == 429:
            break
    return statuses


def _throttled_problem(answer: httpx.Response) -> int:
    assert answer.status_code == 429, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    problem = answer.json()
    assert problem["code"] == "RATE_LIMITED" and problem["retryable"] is True
    assert "was not checked" in problem["detail"]
    wait = int(answer.headers["retry-after"])
    assert 1 <= wait <= 1 / RATE, wait
    return wait


async def test_wrong_tokens_then_429_everywhere_until_the_wait_is_over(server: Server) -> None:
    async with (
        client_from(server, "127.0.0.11") as client,
        client_from(server, "127.0.0.12") as other_address,
    ):
        statuses = await _until_throttled(client)
        assert statuses[-1] == 429, statuses
        assert set(statuses[:-1]) == {401} and BURST <= len(statuses) - 1 <= BURST + 2
        _throttled_problem(await client.get("/v1/tools", headers=_guess(9999)))
        # the right token from this address is not checked either
        _throttled_problem(await client.get("/v1/tools", headers=ACME.headers))
        sign_in = await client.post(
            "/console/sign-in",
            data={"token": ACME.token, "next": "/console/calls"},
            headers={"Origin": server.base_url},
        )
        assert sign_in.status_code == 429
        assert sign_in.headers["content-type"].startswith("text/html")
        assert "Too many sign-ins" in sign_in.text and "set-cookie" not in sign_in.headers
        assert int(sign_in.headers["retry-after"]) >= 1
        mcp = await client.post(
            "/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={**ACME.headers, "Accept": "application/json, text/event-stream"},
        )
        assert mcp.status_code == 429 and mcp.json()["error"] == "rate_limited"
        wait = int(mcp.headers["retry-after"])
        assert 1 <= wait <= 1 / RATE
        # another address is not held back
        assert (await other_address.get("/v1/tools", headers=ACME.headers)).status_code == 200
        await asyncio.sleep(wait)
        assert (await client.get("/v1/tools", headers=ACME.headers)).status_code == 200
        metrics = (await client.get("/metrics")).text
        assert 'toolledger_http_auth_failures_total{kind="unchecked",reason="throttled"}' in metrics


async def test_wrong_console_sign_ins_are_throttled_too(server: Server) -> None:
    async with client_from(server, "127.0.0.13") as client:
        statuses = []
        for n in range(GUESSES):
            answer = await client.post(
                "/console/sign-in",
                data={"token": f"signin-{n:04d}-{'y' * 24}", "next": "/console/calls"},
                headers={"Origin": server.base_url},
            )
            statuses.append(answer.status_code)
            if answer.status_code == 429:
                break
        assert statuses[-1] == 429, statuses
        assert set(statuses[:-1]) == {401} and BURST <= len(statuses) - 1 <= BURST + 2
        assert "Try again in" in answer.text and int(answer.headers["retry-after"]) >= 1
        _throttled_problem(await client.get("/v1/tools", headers=ACME.headers))


async def test_guesses_at_one_token_are_held_back_from_another_address(server: Server) -> None:
    prefix = CAROL.token[:8]
    async with (
        client_from(server, "127.0.0.14") as client,
        client_from(server, "127.0.0.15") as other_address,
    ):
        for n in range(GUESSES):
            answer = await client.get(
                "/v1/tools", headers={"Authorization": f"Bearer {prefix}{n:030d}"}
            )
            if answer.status_code == 429:
                break
        assert answer.status_code == 429
        # the same first characters from elsewhere wait too, CAROL's own token as well
        _throttled_problem(await other_address.get("/v1/tools", headers=CAROL.headers))
        fresh = {"Authorization": "Bearer unrelated-token-0123456789"}
        assert (await other_address.get("/v1/tools", headers=fresh)).status_code == 401
