"""The operator commands (``toolledger calls``, ``approvals``, ``switch``) against a real
``toolledger serve``, once per backend: an approval from the 428 to the call that runs once,
a denial, the kill switch, the reads, and what the commands say when the server refuses or is
not there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, get_args

import httpx
from typer.testing import CliRunner, Result

from tests.http.servers import ACME, OPERATOR, ROOT, SELF_OP, Server, Token, free_port
from toolledger.cli import app
from toolledger.operator_cli import TOKEN_ENV, URL_ENV, ApprovalStatus
from toolledger.schemas.calls import ApprovalStatusName

CHARGE = {"customer_id": "cus_cli_1", "amount_cents": 1234, "currency": "EUR"}
TICKET = {"title": "Printer on fire", "body": "Smoke from tray 2."}


def cli(
    server: Server, token: Token | None, *args: str, env: dict[str, str] | None = None
) -> Result:
    """``toolledger ARGS --url ... --token ...`` in this process (no TOOLLEDGER_* from outside)."""
    given = ["--url", server.base_url] if env is None or URL_ENV not in env else []
    given += ["--token", token.token] if token is not None else []
    isolated: dict[str, str | None] = {URL_ENV: None, TOKEN_ENV: None, **(env or {})}
    return CliRunner().invoke(app, [*args, *given], env=isolated)


def answer(result: Result) -> Any:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return json.loads(result.stdout)


def call(
    server: Server, tool: str, arguments: dict[str, Any], key: str, **body: Any
) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/v1/tools/{tool}/calls",
        json={"arguments": arguments, **body},
        headers={**ACME.headers, "Idempotency-Key": key},
        timeout=90,
    )


def ask_approval(server: Server, key: str, token: Token = ACME) -> dict[str, Any]:
    asked = httpx.post(
        f"{server.base_url}/v1/tools/charge_card/calls",
        json={"arguments": CHARGE},
        headers={**token.headers, "Idempotency-Key": key},
        timeout=90,
    )
    assert asked.status_code == 428, asked.text
    request: dict[str, Any] = asked.json()["approval_request"]
    return request


def test_an_approval_from_the_428_to_the_call_that_runs_once(server: Server, key: str) -> None:
    request = ask_approval(server, key)
    pending = answer(cli(server, OPERATOR, "approvals", "list", "--status", "pending"))
    assert request["id"] in [item["id"] for item in pending["items"]]
    one = answer(cli(server, OPERATOR, "approvals", "get", request["id"]))
    assert one["status"] == "pending" and one["requested_by"] == ACME.principal

    approved = answer(cli(server, OPERATOR, "approvals", "approve", request["id"]))
    token = approved["approval_token"]
    assert approved["approval_request"]["approver"] == OPERATOR.principal
    done = call(server, "charge_card", CHARGE, key, approval_token=token)
    assert done.status_code == 200 and done.json()["status"] == "SUCCEEDED", done.text
    call_id = done.json()["call_id"]
    assert server.effects(ACME.tenant, "charge_card", key) == 1

    got = answer(cli(server, ACME, "calls", "get", call_id))
    assert got["call_id"] == call_id and got["status"] == "SUCCEEDED"
    found = answer(cli(server, ACME, "calls", "search", "--key", key, "--tool", "charge_card"))
    assert [item["call_id"] for item in found["items"]] == [call_id]
    succeeded = answer(
        cli(server, OPERATOR, "calls", "search", "--key", key, "--status", "succeeded")
    )
    assert [item["call_id"] for item in succeeded["items"]] == [call_id]
    events = answer(cli(server, ACME, "calls", "events", call_id))
    granted = [e for e in events["items"] if e["type"] == "ApprovalGranted"]
    assert granted and granted[0]["approver"] == OPERATOR.principal

    # decided once: the second approval is a problem, on stderr, with a non-zero exit
    again = cli(server, OPERATOR, "approvals", "approve", request["id"])
    assert again.exit_code == 1 and again.stdout == ""
    assert "APPROVAL_INVALID" in again.stderr and "cannot be decided again" in again.stderr


def test_four_eyes_is_a_problem_with_its_title_detail_and_action(server: Server, key: str) -> None:
    request = ask_approval(server, key, SELF_OP)
    refused = cli(server, SELF_OP, "approvals", "approve", request["id"])
    assert refused.exit_code == 1 and refused.stdout == ""
    lines = refused.stderr.splitlines()
    assert lines[0] == "The caller may not do this (HTTP 403, FORBIDDEN)"
    assert "Four eyes" in lines[1]
    assert lines[-1].startswith("  what to do: Ask another operator of this tenant")
    assert "Traceback" not in refused.output
    denied = answer(
        cli(server, OPERATOR, "approvals", "deny", request["id"], "--reason", "not this one")
    )
    assert denied["approval_request"]["status"] == "denied"
    assert denied["approval_request"]["reason"] == "not this one"
    listed = answer(cli(server, OPERATOR, "approvals", "list", "--status", "denied", "--json"))
    assert request["id"] in [item["id"] for item in listed["items"]]


def test_the_switch_off_refuses_new_calls_until_it_is_on(server: Server, key: str) -> None:
    try:
        off = answer(
            cli(server, OPERATOR, "switch", "off", "create_ticket", "--reason", "incident 7")
        )
        assert off["enabled"] is False and off["tool"] == "create_ticket"
        assert off["scope"] == "tenant" and off["actor"] == OPERATOR.principal
        refused = call(server, "create_ticket", TICKET, key)
        assert refused.status_code == 503 and refused.json()["code"] == "TOOL_DISABLED"
        assert "incident 7" in refused.json()["detail"]
        assert server.effects(ACME.tenant, "create_ticket", key) == 0
    finally:
        on = answer(cli(server, OPERATOR, "switch", "on", "create_ticket", "--reason", "fixed"))
    assert on["enabled"] is True
    done = call(server, "create_ticket", TICKET, key)
    assert done.status_code == 200 and done.json()["status"] == "SUCCEEDED", done.text


def test_the_switch_needs_an_operator_and_a_global_scope_needs_operator_global(
    server: Server,
) -> None:
    agent = cli(server, ACME, "switch", "off", "create_ticket", "--reason", "no")
    assert agent.exit_code == 1 and "needs the scope 'operator'" in agent.stderr
    scope = ["--scope", "global", "--reason", "no"]
    local = cli(server, OPERATOR, "switch", "off", "create_ticket", *scope)
    assert local.exit_code == 1 and "operator:global" in local.stderr
    unknown = cli(server, OPERATOR, "switch", "off", "no_such_tool", "--reason", "no")
    assert unknown.exit_code == 1 and "TOOL_NOT_FOUND" in unknown.stderr
    no_reason = cli(server, OPERATOR, "switch", "off", "create_ticket")
    assert no_reason.exit_code == 2 and "--reason" in no_reason.output


def test_pretty_by_default_and_compact_with_json(server: Server) -> None:
    pretty = cli(server, ACME, "calls", "search", "--limit", "1")
    compact = cli(server, ACME, "calls", "search", "--limit", "1", "--json")
    assert json.loads(pretty.stdout) == json.loads(compact.stdout)
    assert pretty.stdout.startswith("{\n  ") and compact.stdout.count("\n") == 1


def test_the_url_and_the_token_come_from_the_environment(server: Server) -> None:
    env = {URL_ENV: server.base_url, TOKEN_ENV: ACME.token}
    assert "items" in answer(cli(server, None, "calls", "search", "--limit", "1", env=env))
    missing = cli(server, None, "calls", "search")
    assert missing.exit_code == 2 and TOKEN_ENV in missing.stderr
    bad = cli(server, Token("not-a-token-at-all-x", "acme", "x", ()), "calls", "search")
    assert bad.exit_code == 1 and "UNAUTHENTICATED" in bad.stderr


def test_a_call_that_is_not_there_is_a_problem(server: Server) -> None:
    result = cli(server, ACME, "calls", "get", "call_" + "0" * 32)
    assert result.exit_code == 1 and result.stdout == ""
    assert "No call with this id." in result.stderr and "what to do:" in result.stderr
    # an id is one path segment: it cannot name another route
    other = cli(server, OPERATOR, "approvals", "get", "../../calls")
    assert other.exit_code == 1 and other.stdout == "" and "HTTP 404" in other.stderr


def test_a_server_that_is_down_is_one_line_naming_the_url_and_exit_code_2() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "toolledger.cli", "calls", "get", "call_x", "--url", url]
    env = {k: v for k, v in os.environ.items() if k not in (URL_ENV, TOKEN_ENV)}
    ran = subprocess.run(
        command,
        cwd=ROOT,
        env={**env, TOKEN_ENV: ACME.token},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 2, ran
    assert ran.stdout == "" and len(ran.stderr.splitlines()) == 1, ran.stderr
    assert url in ran.stderr and "Traceback" not in ran.stderr
    bad = CliRunner().invoke(app, ["calls", "search", "--url", "127.0.0.1:1", "--token", "t"])
    assert bad.exit_code == 2 and "not a usable URL" in bad.stderr


def test_the_approval_status_filter_is_the_servers() -> None:
    assert [s.value for s in ApprovalStatus] == list(get_args(ApprovalStatusName))
