"""The console over real HTTP, on every backend: sessions and their cookie, CSRF and origin
checks, scopes and tenants, the API's decision rules (403, 404, 409), and inert arguments."""

from __future__ import annotations

import html
import re
import time
import uuid
from typing import Any

import httpx

from tests.console.support import IDLE_S, console, csrf_of, own_origin, sign_in
from tests.http.servers import ACME, ALICE_CONFIRM, CAROL, GLOBEX, OPERATOR, SELF_OP, Server, Token

CHARGE = {"customer_id": "cus_private_77", "amount_cents": 4200, "currency": "USD"}


def _key() -> str:
    return f"console-{uuid.uuid4().hex[:12]}"


def _call(
    server: Server, tool: str, arguments: dict[str, Any], key: str, token: Token = ACME
) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/v1/tools/{tool}/calls",
        json={"arguments": arguments},
        headers={**token.headers, "Idempotency-Key": key},
        timeout=60,
    )


def _asked(server: Server, tool: str, arguments: dict[str, Any], token: Token = ACME) -> str:
    answer = _call(server, tool, arguments, _key(), token)
    assert answer.status_code == 428, answer.text
    approval_id: str = answer.json()["approval_request"]["id"]
    return approval_id


def _post(client: httpx.Client, server: Server, path: str, **form: str) -> httpx.Response:
    return client.post(path, data=form, headers=own_origin(server))


def test_sign_in_sets_a_strict_http_only_cookie_and_never_shows_the_token(server: Server) -> None:
    with console(server) as client:
        page = client.get("/console/sign-in")
        assert page.status_code == 200 and 'type="password"' in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        wrong = _post(client, server, "/console/sign-in", token="not-a-token-at-all")
        assert wrong.status_code == 401 and "not known" in wrong.text
        signed = _post(client, server, "/console/sign-in", token=ACME.token, next="/console/calls")
        assert signed.status_code == 303 and signed.headers["location"] == "/console/calls"
        cookie = signed.headers["set-cookie"].lower()
        for flag in ("httponly", "samesite=strict", "path=/console"):
            assert flag in cookie, cookie
        assert "secure" not in cookie  # plain http here; https adds it
        home = client.get("/console/calls")
        assert home.status_code == 200 and "alice" in home.text
        assert ACME.token not in home.text and ACME.token not in signed.headers["set-cookie"]
        # an open redirect is not followed: next must be a console page
        away = _post(client, server, "/console/sign-in", token=ACME.token, next="//evil.example/")
        assert away.headers["location"] == "/console"
    assert ACME.token not in server.logs()


def test_pages_need_a_session_and_sign_out_ends_it(server: Server) -> None:
    with console(server) as client:
        anonymous = client.get("/console/approvals")
        assert anonymous.status_code == 303
        assert anonymous.headers["location"].startswith("/console/sign-in?next=%2Fconsole")
        csrf = sign_in(client, OPERATOR)
        assert client.get("/console/approvals").status_code == 200
        assert _post(client, server, "/console/sign-out", csrf=csrf).status_code == 303
        assert client.get("/console/approvals").status_code == 303


def test_forms_without_the_csrf_token_or_from_another_origin_are_refused(server: Server) -> None:
    with console(server) as client:
        csrf = sign_in(client, OPERATOR)
        switch = {"tool": "close_ticket", "enabled": "false", "scope": "tenant", "reason": "x"}
        missing = _post(client, server, "/console/switches", **switch)
        assert missing.status_code == 403 and "CSRF" in missing.text
        # a token that differs in its last character (one of 16 values: "A" would be the same
        # token one time in 16)
        other = csrf[:-1] + ("E" if csrf.endswith("A") else "A")
        wrong = _post(client, server, "/console/switches", csrf=other, **switch)
        assert wrong.status_code == 403
        evil = {"Origin": "https://evil.example"}
        cross = client.post("/console/switches", data={"csrf": csrf, **switch}, headers=evil)
        assert cross.status_code == 403 and "not sent from this console" in cross.text
        referer = {"Referer": "https://evil.example/page"}
        by_referer = client.post(
            "/console/switches", data={"csrf": csrf, **switch}, headers=referer
        )
        assert by_referer.status_code == 403
        cross_sign_in = client.post("/console/sign-in", data={"token": ACME.token}, headers=evil)
        assert cross_sign_in.status_code == 403
    listed = httpx.get(f"{server.base_url}/console/switches", timeout=30)
    assert listed.status_code == 303  # and nothing was switched off:
    assert _call(server, "close_ticket", {"ticket_id": "T_1"}, _key()).status_code != 503


def test_an_idle_session_is_asked_to_sign_in_again(short_server: Server) -> None:
    with console(short_server) as client:
        sign_in(client, ACME)
        assert client.get("/console/calls").status_code == 200
        time.sleep(IDLE_S + 0.5)
        expired = client.get("/console/calls?key=abc")
        assert expired.status_code == 303
        location = expired.headers["location"]
        assert location.startswith("/console/sign-in?") and "expired=1" in location
        assert "next=%2Fconsole%2Fcalls%3Fkey%3Dabc" in location
        assert "expired" in client.get(location).text


def test_another_tenants_call_is_not_found(server: Server) -> None:
    theirs = _call(server, "create_ticket", {"title": "globex"}, _key(), GLOBEX).json()
    mine = _call(server, "create_ticket", {"title": "acme"}, _key()).json()
    with console(server) as client:
        sign_in(client, ACME)
        assert client.get(f"/console/calls/{mine['call_id']}").status_code == 200
        page = client.get(f"/console/calls/{theirs['call_id']}")
        assert page.status_code == 404 and "No call with this id" in page.text
        found = client.get("/console/calls", params={"call_id": theirs["call_id"]})
        assert "No call matches" in found.text
        by_key = client.get("/console/calls", params={"key": theirs["idempotency_key"]})
        assert theirs["call_id"] not in by_key.text


def test_html_in_arguments_is_inert_and_huge_values_are_cut(server: Server) -> None:
    evil = "<script>alert('pwned')</script><img src=x onerror=alert(1)>"
    body = "B" * 9_000
    call = _call(server, "create_ticket", {"title": evil, "body": body}, _key()).json()
    with console(server) as client:
        sign_in(client, ACME)
        page = client.get(f"/console/calls/{call['call_id']}").text
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;" in page
    assert "<details" in page and "Show all of the" in page
    assert body in page  # all of it, behind the <details>


def test_decisions_follow_the_apis_rules(server: Server) -> None:
    four_eyes = _asked(server, "charge_card", CHARGE, SELF_OP)
    with console(server) as client:
        csrf = sign_in(client, SELF_OP)  # an operator who asked for it: four eyes
        page = client.get(f"/console/approvals/{four_eyes}")
        assert "Four eyes" in page.text
        refused = _post(client, server, f"/console/approvals/{four_eyes}/approve", csrf=csrf)
        assert refused.status_code == 403 and "another operator" in refused.text
    theirs = _asked(server, "charge_card", CHARGE, GLOBEX)
    alices = _asked(server, "send_email", {"to": "a@b.co", "subject": "s", "body": "b"})
    with console(server) as client:
        csrf = sign_in(client, OPERATOR)
        other_tenant = _post(client, server, f"/console/approvals/{theirs}/approve", csrf=csrf)
        assert other_tenant.status_code == 404
        assert client.get(f"/console/approvals/{theirs}").status_code == 404
        first = _post(client, server, f"/console/approvals/{four_eyes}/approve", csrf=csrf)
        assert first.status_code == 303
        again = _post(client, server, f"/console/approvals/{four_eyes}/approve", csrf=csrf)
        assert again.status_code == 409 and "cannot be decided again" in again.text
        no_reason = _post(client, server, f"/console/approvals/{alices}/deny", csrf=csrf)
        assert no_reason.status_code == 400
    with console(server) as client:
        csrf = sign_in(client, CAROL)  # another user of acme: not hers to decide
        assert client.get("/console/approvals").status_code == 403  # the queue: operators
        carol = _post(client, server, f"/console/approvals/{alices}/approve", csrf=csrf)
        assert carol.status_code == 403 and "another user cannot decide" in carol.text
        assert client.get("/console/switches").status_code == 403
        assert client.get("/console/stats").status_code == 403
    with console(server) as client:
        csrf = sign_in(client, ACME)  # her agent's token asked for it: it does not confirm it
        shown = client.get(f"/console/approvals/{alices}").text
        assert "You cannot approve this request" in shown and "approvals:confirm" in shown
        agent = _post(client, server, f"/console/approvals/{alices}/approve", csrf=csrf)
        assert agent.status_code == 403
    with console(server) as client:
        csrf = sign_in(client, ALICE_CONFIRM)  # alice confirms her own agent's email herself
        assert "Approve this exact call" in client.get(f"/console/approvals/{alices}").text
        denied = _post(
            client, server, f"/console/approvals/{alices}/deny", csrf=csrf, reason="not today"
        )
        assert denied.status_code == 303
        late = _post(client, server, f"/console/approvals/{alices}/approve", csrf=csrf)
        assert late.status_code == 409


def test_switches_need_a_reason_and_a_registered_tool(server: Server) -> None:
    with console(server) as client:
        csrf = sign_in(client, OPERATOR)
        base = {"csrf": csrf, "enabled": "false", "scope": "tenant"}
        no_tool = _post(client, server, "/console/switches", tool="nope", reason="r", **base)
        assert no_tool.status_code == 404
        no_reason = _post(client, server, "/console/switches", tool="list_tickets", **base)
        assert no_reason.status_code == 400
        everyone = {**base, "scope": "global"}
        not_global = _post(
            client, server, "/console/switches", tool="list_tickets", reason="r", **everyone
        )
        assert not_global.status_code == 403 and "operator:global" in not_global.text
        page = client.get("/console/switches").text
        assert csrf_of(page) == csrf and 'for="reason-tenant-1"' in page


def test_docs_and_pages_load_nothing_from_another_host(server: Server) -> None:
    with console(server) as client:
        docs = client.get("/docs")
        assert docs.status_code == 200
        assert "/console/static/vendor/swagger-ui/swagger-ui-bundle.js" in docs.text
        assert "cdn" not in docs.text.lower() and "https://" not in docs.text
        assert client.get("/docs/oauth2-redirect").status_code == 200
        for asset in (
            "swagger-ui/swagger-ui-bundle.js",
            "swagger-ui/swagger-ui.css",
            "htmx/htmx.min.js",
        ):
            assert client.get(f"/console/static/vendor/{asset}").status_code == 200
        sign_in(client, OPERATOR)
        for path in ("/console/calls", "/console/approvals", "/console/switches", "/console/stats"):
            page = client.get(path)
            assert page.status_code == 200, path
            assert "http://" not in page.text and "https://" not in page.text, path
        openapi = client.get("/openapi.json").json()
        assert not any(p.startswith(("/console", "/docs")) for p in openapi["paths"])


_ROW_LINK = re.compile(
    r'<th scope="row" data-label="Call"><a href="/console/calls/(call_[0-9a-f]+)"'
)
_OLDER = re.compile(r'<a href="(/console/calls\?cursor=[^"]+)">Older calls</a>')


def _listed(page: httpx.Response) -> list[str]:
    assert page.status_code == 200, page.text[:2000]
    return _ROW_LINK.findall(page.text)


def test_the_calls_page_lists_recent_calls_newest_first_in_pages(server: Server) -> None:
    """Before any search: the tenant's calls, newest first, 50 a page, then older ones; a
    succeeded call's page has one attempt, with its outcome."""
    ours = [
        _call(server, "create_ticket", {"title": f"t{i}"}, _key(), GLOBEX).json()["call_id"]
        for i in range(51)
    ]
    acme = _call(server, "create_ticket", {"title": "acme's"}, _key()).json()["call_id"]
    newest_first = ours[::-1]
    with console(server) as client:
        sign_in(client, GLOBEX)
        deadline = time.monotonic() + 30  # the Kafka backend's projection may lag a moment
        while (first := client.get("/console/calls")).text.count(newest_first[0]) == 0:
            assert time.monotonic() < deadline, "the newest call never showed"
            time.sleep(0.2)
        assert "Recent calls" in first.text and "Older calls" in first.text
        assert _listed(first) == newest_first[:50]
        older = _OLDER.search(first.text)
        assert older, first.text[:2000]
        second = client.get(html.unescape(older.group(1)))
        assert _listed(second)[:1] == newest_first[50:] and "back to the newest" in second.text
        assert acme not in first.text + second.text
        call = client.get(f"/console/calls/{ours[0]}").text
        attempts = call[call.index('id="attempts-title"') : call.index('id="timeline-title"')]
        assert attempts.count("<tr>") == 2  # the header and one attempt
        assert "ToolCallSucceeded" in attempts and "no outcome yet" not in attempts


def test_unknown_pages_wrong_methods_and_bad_links_are_pages(server: Server) -> None:
    """The console answers errors as pages of their status (signed in: with the console's
    navigation); the API's paths still answer problems."""
    with console(server) as client:
        anonymous = client.get("/console/nope")
        assert anonymous.status_code == 404
        assert anonymous.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in anonymous.headers["content-security-policy"]
        assert "The console has no page at /console/nope." in anonymous.text
        assert 'href="/console/sign-in"' in anonymous.text
        asset = client.get("/console/static/nope.css")
        assert asset.status_code == 404 and "<!doctype html>" in asset.text
        csrf = sign_in(client, ACME)
        signed = client.get("/console/calls/x/y/<b>z</b>")
        assert signed.status_code == 404 and "Signed in as" in signed.text
        assert "&lt;b&gt;z&lt;/b&gt;" in signed.text and "<b>z</b>" not in signed.text
        wrong = _post(client, server, "/console/calls", csrf=csrf)
        assert wrong.status_code == 405 and wrong.headers["allow"] == "GET"
        assert "does not take POST" in wrong.text and "Signed in as" in wrong.text
        too_long = client.get("/console/calls", params={"key": "k" * 256})
        assert too_long.status_code == 400 and "This page cannot take" in too_long.text
        assert "query.key" in too_long.text
        foreign = client.get("/console/calls", params={"cursor": "not-a-cursor"})
        assert foreign.status_code == 400
        assert "The page link is not one this console gave out." in foreign.text
        api = client.get("/v1/nope")
        assert api.status_code == 404
        assert api.headers["content-type"].startswith("application/problem+json")


def test_a_runs_page_shows_its_evaluation_for_the_tenant_only(server: Server) -> None:
    run = f"run-{uuid.uuid4().hex[:12]}"
    for n in range(2):
        made = httpx.post(
            f"{server.base_url}/v1/tools/create_ticket/calls",
            json={"arguments": {"title": "<b>same</b>"}, "run_id": run},
            headers={**ACME.headers, "Idempotency-Key": f"{run}-{n}"},
            timeout=60,
        )
        assert made.status_code == 200, made.text
    with console(server) as client:
        sign_in(client, ACME)
        found = client.get("/console/runs", params={"run_id": run}, follow_redirects=True)
        assert found.status_code == 200 and found.url.path == f"/console/runs/{run}"
        page = found.text
        assert f'Run <span class="id">{run}</span>' in page
        assert "Repeated calls: the same arguments under different keys" in page
        assert f"{run}-0, {run}-1" in page  # the two keys of the same arguments
        assert "<b>same</b>" not in page
    with console(server) as client:
        sign_in(client, GLOBEX)
        theirs = client.get(f"/console/runs/{run}").text
        assert f"{run}-0" not in theirs and "<td>calls</td>" not in theirs
