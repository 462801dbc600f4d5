"""Requests still in flight when ``toolledger serve``'s ``--shutdown-timeout`` runs out, on both
backends: each is answered ``503`` with a problem document and ``Retry-After`` (it was a bare
``text/plain`` 500), the server exits 0, and no call ran twice."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.http.conftest import BACKENDS, serving
from tests.http.servers import ACME, Server

SLOW_MS = 6000  # the handler's time: longer than the shutdown timeout, shorter than the wait


@pytest.fixture(params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from serving(request, tmp_path_factory, "shutdown", "--shutdown-timeout", "1")


async def test_requests_in_flight_at_the_shutdown_timeout_get_503_with_retry_after(
    server: Server,
) -> None:
    front = server.processes[-1]  # the serve process (after the executor and projector)
    async with httpx.AsyncClient(
        base_url=server.base_url, headers=ACME.headers, timeout=60
    ) as client:
        in_flight = [
            asyncio.create_task(
                client.post(
                    "/v1/tools/flaky_write/calls",
                    json={"arguments": {"payload": "p", "fault": "slow", "delay_ms": SLOW_MS}},
                    headers={"Idempotency-Key": f"shutdown-{n}", "Prefer": "wait=30"},
                )
            )
            for n in range(3)
        ]
        await asyncio.sleep(1.0)  # the calls run
        started = time.monotonic()
        os.kill(front.popen.pid, signal.SIGTERM)
        answers = await asyncio.gather(*in_flight)
        assert time.monotonic() - started < SLOW_MS / 1000  # cut at the shutdown timeout
    for answer in answers:
        assert answer.status_code == 503, (answer.status_code, answer.headers, answer.text)
        assert answer.headers["content-type"] == "application/problem+json"
        assert int(answer.headers["retry-after"]) >= 1
        problem = answer.json()
        assert problem["status"] == 503 and problem["retryable"] is True
        assert "shutting down" in problem["detail"]
    assert front.popen.wait(timeout=60) == 0, front.log()
    await asyncio.sleep(SLOW_MS / 1000)  # the executor has finished with them
    effects = [server.effects(ACME.tenant, "flaky_write", f"shutdown-{n}") for n in range(3)]
    assert max(effects) <= 1, effects
