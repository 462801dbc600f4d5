"""A browser tab on the console: signed in as a token, every request to another host refused
and remembered (the console loads nothing from the network), screenshots by name."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from playwright.sync_api import Browser, Page, Route

from tests.http.servers import Server, Token

WIDTHS = (1280, 390)


@contextmanager
def tab(browser: Browser, server: Server, width: int = 1280) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": width, "height": 900})
    elsewhere: list[str] = []

    def local_only(route: Route) -> None:
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    context.route("**/*", local_only)
    page = context.new_page()
    page.set_default_timeout(30_000)
    try:
        yield page
    finally:
        context.close()
    assert elsewhere == [], f"requests to other hosts: {elsewhere}"


def sign_in(page: Page, server: Server, token: Token, path: str = "/console/calls") -> None:
    page.goto(server.base_url + path)
    assert "/console/sign-in" in page.url
    page.get_by_label("API token").fill(token.token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"**{path}*")


def shoot(page: Page, directory: Path, name: str) -> Path:
    path = directory / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
