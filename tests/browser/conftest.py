"""The console in a real Chromium: Debian's ``/usr/bin/chromium`` (installed by
``services/chromium/install.sh``), driven by Playwright, against real ``toolledger serve``
processes. A missing browser fails these tests; it never skips them.

Screenshots go to ``$TOOLLEDGER_SCREENSHOTS`` (default: a temporary directory)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Playwright, sync_playwright

from tests.console.support import BACKENDS, serve, serve_short_sessions
from tests.http.servers import Server

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    running = serve(request, tmp_path_factory.mktemp(f"browser-{request.param}"), request.param)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def short_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = serve_short_sessions(tmp_path_factory.mktemp("browser-short"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def playwright(server: Server) -> Iterator[Playwright]:
    """Playwright's sync API runs an event loop in this thread while it is open: it starts
    after the server (whose start may use ``asyncio.run``) and ends with the module, so the
    suites after this one have the thread to themselves."""
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    assert CHROMIUM.exists(), (
        f"{CHROMIUM} is missing: run 'bash services/chromium/install.sh' (make test does)"
    )
    launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
    try:
        yield launched
    finally:
        launched.close()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("TOOLLEDGER_SCREENSHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path
