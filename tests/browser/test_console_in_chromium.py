"""The seven scenarios of the operator console in Chromium, against a real server, with a
screenshot of each page at 1280 and 390 pixels wide."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Browser, Page, expect

from tests.browser.pages import WIDTHS, shoot, sign_in, tab
from tests.console.support import IDLE_S
from tests.http.servers import ACME, GLOBEX, OPERATOR, Server, Token, free_port

CHARGE = {"customer_id": "cus_private_77", "amount_cents": 4200, "currency": "USD"}
EMAIL = {"to": "customer@example.com", "subject": "Your refund", "body": "<b>Hello</b>"}


def _key(name: str) -> str:
    return f"browser-{name}-{uuid.uuid4().hex[:10]}"


def _call(
    server: Server, tool: str, arguments: dict[str, Any], key: str, token: Token = ACME
) -> httpx.Response:
    """What an agent does: the call over the API."""
    return httpx.post(
        f"{server.base_url}/v1/tools/{tool}/calls",
        json={"arguments": arguments},
        headers={**token.headers, "Idempotency-Key": key},
        timeout=60,
    )


def _retry_until_decided(
    server: Server, tool: str, arguments: dict[str, Any], key: str
) -> httpx.Response:
    """The agent's retry with the same key and arguments, once the decision has applied."""
    deadline = time.monotonic() + 30
    while True:
        answer = _call(server, tool, arguments, key)
        if answer.status_code != 428 or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def _approval(server: Server, tool: str, arguments: dict[str, Any], key: str) -> str:
    asked = _call(server, tool, arguments, key)
    assert asked.status_code == 428, asked.text
    approval_id: str = asked.json()["approval_request"]["id"]
    return approval_id


def _review(page: Page, server: Server, approval_id: str) -> None:
    page.goto(server.base_url + "/console/approvals")
    page.get_by_role("link", name=f"Review {approval_id}").click()
    expect(page.get_by_role("heading", name="The exact action")).to_be_visible()


def test_sign_in_and_find_a_call_by_its_key(browser: Browser, server: Server) -> None:
    key = _key("find")
    made = _call(server, "create_ticket", {"title": "Printer on fire"}, key).json()
    with tab(browser, server) as page:
        sign_in(page, server, ACME)
        page.get_by_label("Idempotency key").fill(key)
        page.get_by_role("button", name="Search").click()
        link = page.get_by_role("link", name=made["call_id"])
        expect(link).to_be_visible()
        link.click()
        expect(page.get_by_role("heading", name=f"Call {made['call_id']}")).to_be_visible()
        expect(page.get_by_text("SUCCEEDED").first).to_be_visible()
        expect(page.locator("ol.timeline").get_by_text("ToolCallSucceeded")).to_be_visible()


def test_approve_a_pending_charge_and_it_runs_exactly_once(
    browser: Browser, server: Server
) -> None:
    key = _key("charge")
    approval_id = _approval(server, "charge_card", CHARGE, key)
    with tab(browser, server) as page:
        sign_in(page, server, OPERATOR, "/console/approvals")
        _review(page, server, approval_id)
        expect(page.get_by_text("Charge 42.00 USD to a customer's card on file.")).to_be_visible()
        page.get_by_role("button", name="Approve this exact call").click()
        expect(page.locator("#done")).to_contain_text("Approved")
    done = _retry_until_decided(server, "charge_card", CHARGE, key)
    assert done.status_code == 200 and done.json()["status"] == "SUCCEEDED", done.text
    again = _call(server, "charge_card", CHARGE, key)
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert server.effects("acme", "charge_card", key) == 1


def test_deny_an_email_and_the_agent_gets_the_refusal(browser: Browser, server: Server) -> None:
    key = _key("email")
    approval_id = _approval(server, "send_email", EMAIL, key)
    with tab(browser, server) as page:
        sign_in(page, server, OPERATOR, "/console/approvals")
        _review(page, server, approval_id)
        page.get_by_label("Reason for denying").fill("We never email this customer.")
        page.get_by_role("button", name="Deny").click()
        expect(page.locator("#done")).to_contain_text("Denied")
    refused = _retry_until_decided(server, "send_email", EMAIL, key)
    assert refused.status_code == 403, refused.text
    assert refused.json()["code"] == "APPROVAL_INVALID"
    assert "never email this customer" in refused.json()["detail"]
    assert server.effects("acme", "send_email", key) == 0


def _toggle(page: Page, server: Server, label: str, reason: str) -> None:
    page.goto(server.base_url + "/console/switches")
    form = page.locator("form.toggle").filter(
        has=page.get_by_role("button", name=label, exact=True)
    )
    form.get_by_label("Reason").fill(reason)
    form.get_by_role("button", name=label, exact=True).click()
    expect(page.locator("#done")).to_be_visible()


def test_flip_a_switch_and_the_agent_gets_503(browser: Browser, server: Server) -> None:
    with tab(browser, server) as page:
        sign_in(page, server, OPERATOR, "/console/switches")
        _toggle(page, server, "Turn off close_ticket for acme", "incident 7: duplicate closes")
        try:
            refused = _call(server, "close_ticket", {"ticket_id": "T_1"}, _key("switch"))
            assert refused.status_code == 503, refused.text
            assert refused.json()["code"] == "TOOL_DISABLED"
            assert "incident 7" in refused.json()["detail"]
        finally:
            _toggle(page, server, "Turn on close_ticket for acme", "incident 7 is over")
    after = _call(server, "close_ticket", {"ticket_id": "T_1"}, _key("switch"))
    assert after.status_code != 503, after.text


def test_another_tenants_call_is_not_found(browser: Browser, server: Server) -> None:
    theirs = _call(server, "create_ticket", {"title": "globex's"}, _key("tenant"), GLOBEX).json()
    with tab(browser, server) as page:
        sign_in(page, server, ACME)
        answer = page.goto(f"{server.base_url}/console/calls/{theirs['call_id']}")
        assert answer is not None and answer.status == 404
        expect(page.get_by_text("No call with this id in your tenant.")).to_be_visible()


def test_a_cross_site_post_is_refused(browser: Browser, server: Server) -> None:
    """A page of another origin (another port of the same host: the same *site*, so even the
    SameSite=Strict cookie goes along) posts a switch form to the console: 403, nothing
    switched."""
    evil = f"http://127.0.0.1:{free_port()}/evil.html"
    form = (
        f'<form id="f" method="post" action="{server.base_url}/console/switches">'
        '<input name="tool" value="create_ticket"><input name="enabled" value="false">'
        '<input name="scope" value="tenant"><input name="reason" value="pwned">'
        '<input name="csrf" value="guessed"></form>'
    )
    with tab(browser, server) as page:
        sign_in(page, server, OPERATOR, "/console/switches")
        page.route(evil, lambda route: route.fulfill(body=form, content_type="text/html"))
        page.goto(evil)
        with page.expect_navigation() as navigation:
            page.locator("#f").evaluate("f => f.submit()")
        answer = navigation.value
        assert answer is not None and answer.status == 403
        expect(page.get_by_text("This form was not sent from this console.")).to_be_visible()
    ticket = _call(server, "create_ticket", {"title": "still on"}, _key("csrf"))
    assert ticket.status_code == 200, ticket.text


def test_an_expired_session_is_asked_to_sign_in_again(
    browser: Browser, short_server: Server
) -> None:
    with tab(browser, short_server) as page:
        sign_in(page, short_server, OPERATOR, "/console/switches")
        time.sleep(IDLE_S + 0.5)
        page.get_by_role("link", name="Approvals").click()
        page.wait_for_url("**/console/sign-in?*")
        expect(page.get_by_role("status")).to_contain_text("Your session has expired")
        page.get_by_label("API token").fill(OPERATOR.token)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url("**/console/approvals")


def _no_page_scroll(page: Page) -> None:
    wide = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert wide <= 0, f"{page.url} scrolls sideways by {wide} px"


def test_every_page_at_1280_and_390(browser: Browser, server: Server, screenshots: Path) -> None:
    """Each page readable at both widths (no sideways scroll of the page) and reachable by
    keyboard (the skip link comes first); a screenshot of each."""
    made = _call(server, "create_ticket", {"title": "<script>alert(1)</script>"}, _key("shot"))
    call_id = made.json()["call_id"]
    approval_id = _approval(server, "charge_card", CHARGE, _key("shot"))
    # a run without calls: its metrics table (the report's tables are in
    # tests/console/test_console.py; calls with a run id here would widen the recent calls'
    # table of tests/browser/test_console_layout.py, which reads this server's calls)
    run = f"run-{uuid.uuid4().hex[:12]}"
    pages = {
        "recent": "/console/calls",
        "calls": f"/console/calls?tool=create_ticket&key={made.json()['idempotency_key']}",
        "call": f"/console/calls/{call_id}",
        "approvals": "/console/approvals",
        "approval": f"/console/approvals/{approval_id}",
        "switches": "/console/switches",
        "stats": "/console/stats",
        "groups": "/console/groups",
        "run": f"/console/runs/{run}",
        "not-found": "/console/calls/call_" + "0" * 32,
        "no-page": "/console/nope",
        "docs": "/docs",
    }
    for width in WIDTHS:
        with tab(browser, server, width) as page:
            page.goto(server.base_url + "/console/sign-in")
            shoot(page, screenshots, f"{server.backend}-{width}-sign-in")
            sign_in(page, server, OPERATOR)
            page.keyboard.press("Tab")
            assert page.evaluate("document.activeElement.textContent") == "Skip to main content"
            for name, path in pages.items():
                page.goto(server.base_url + path)
                if name == "docs":
                    expect(page.get_by_text("toolledger").first).to_be_visible()
                    page.wait_for_selector(".opblock", timeout=30_000)
                else:
                    expect(page.locator("main h1")).to_be_visible()
                    _no_page_scroll(page)
                shoot(page, screenshots, f"{server.backend}-{width}-{name}")
    assert len(list(screenshots.glob(f"{server.backend}-*.png"))) >= 2 * (len(pages) + 1)
