"""A console page that fails in a way no one expected answers a 500 page (the details in the
server's log, never in the page), not the API's JSON problem."""

from __future__ import annotations

import httpx
import pytest
from fastapi import APIRouter, FastAPI

from toolledger.producers.http.console.guard import ConsoleRoute


async def test_an_unexpected_error_is_a_500_page_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = APIRouter(route_class=ConsoleRoute)

    @router.get("/console/broken")
    async def broken() -> None:
        raise RuntimeError("driver said: disk I/O error at /secret/path")

    app = FastAPI()
    app.include_router(router)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as client:
        page = await client.get("/console/broken")
    assert page.status_code == 500
    assert page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "The console could not show this page" in page.text
    assert "secret" not in page.text
    failed = [r for r in caplog.records if r.getMessage() == "console page failed"]
    assert failed and failed[0].exc_info is not None and failed[0].levelname == "ERROR"
