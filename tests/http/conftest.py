"""Every test of the HTTP API runs against a real server process, once per backend.

One server per backend serves the whole session (starting Kafka processes is slow); tests do
not see each other because each uses its own idempotency keys and run ids.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Generator, Iterator

import httpx
import pytest

from tests.http.servers import ACME, Server, start_distributed, start_embedded

BACKENDS = ["embedded", pytest.param("kafka", marks=pytest.mark.services)]


def serving(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    *extra: str,
) -> Iterator[Server]:
    """A server (with ``extra`` options) of the backend ``request.param`` names, in a new
    directory, until the end."""
    workdir = tmp_path_factory.mktemp(f"{name}-{request.param}")
    if request.param == "kafka":
        running = start_distributed(workdir, request.getfixturevalue("services"), *extra)
    else:
        running = start_embedded(workdir, *extra)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from serving(request, tmp_path_factory, "http")


@pytest.fixture(scope="session")
def embedded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server of its own for tests that must own the whole tenant (e.g. the fuzzer)."""
    running = start_embedded(tmp_path_factory.mktemp("http-fuzz"))
    try:
        yield running
    finally:
        running.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call" and report.failed:
        funcargs = getattr(item, "funcargs", {})
        for name in ("server", "embedded_server"):
            running = funcargs.get(name)
            if isinstance(running, Server):
                report.sections.append((f"{name} logs ({running.backend})", running.logs()))
    return report


@pytest.fixture
async def client(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=server.base_url, headers=ACME.headers, timeout=90
    ) as http:
        yield http


@pytest.fixture
def key(request: pytest.FixtureRequest) -> str:
    """A fresh idempotency key, readable in the server's records."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[:80]
    return f"{name}-{uuid.uuid4().hex[:12]}"
