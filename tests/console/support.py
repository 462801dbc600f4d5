"""What the console's tests share: servers started with console settings, signing in over
plain HTTP, and reading a page's CSRF token."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.http.servers import Server, Token, start_distributed, start_embedded

BACKENDS = ["embedded", pytest.param("kafka", marks=pytest.mark.services)]
IDLE_S = 3.0  # the idle timeout of the server the expiry tests use
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """``values`` in the environment the servers started inside inherit."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def serve(request: pytest.FixtureRequest, workdir: Path, backend: str) -> Server:
    if backend == "kafka":
        return start_distributed(workdir, request.getfixturevalue("services"))
    return start_embedded(workdir)


def serve_short_sessions(workdir: Path) -> Server:
    """An embedded server whose console sessions end after :data:`IDLE_S` idle."""
    with environment(TOOLLEDGER_CONSOLE_IDLE_S=str(IDLE_S)):
        return start_embedded(workdir)


def csrf_of(html: str) -> str:
    found = _CSRF.search(html)
    assert found, html[:2000]
    return found.group(1)


def sign_in(client: httpx.Client, token: Token) -> str:
    """Sign ``client`` in as ``token``; the session's CSRF token."""
    response = client.post(
        "/console/sign-in",
        data={"token": token.token, "next": "/console/calls"},
        headers={"Origin": str(client.base_url).rstrip("/")},
        follow_redirects=True,
    )
    assert response.status_code == 200, response.text[:2000]
    assert str(response.url).endswith("/console/calls"), response.url
    return csrf_of(response.text)


def console(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, timeout=60)


def own_origin(server: Server) -> dict[str, str]:
    return {"Origin": server.base_url}
