"""The console's tests run against real ``toolledger serve`` processes, once per backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.console.support import BACKENDS, serve, serve_short_sessions
from tests.http.servers import Server


@pytest.fixture(scope="session", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    running = serve(request, tmp_path_factory.mktemp(f"console-{request.param}"), request.param)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def short_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = serve_short_sessions(tmp_path_factory.mktemp("console-short"))
    try:
        yield running
    finally:
        running.stop()
