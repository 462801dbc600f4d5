"""``HttpLedgerClient`` reads the HTTP API's answers as the in-process client gives them, and
follows its wait, 202, 409 and Retry-After semantics (against a scripted server)."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from toolledger import CallStatus, HttpLedgerClient, Ledger, TransportError, TrustedContext

PROBLEM = {"content-type": "application/problem+json"}
CALL = {
    "call_id": "call_1",
    "tenant_id": "acme",
    "tool": "create_ticket",
    "tool_version": "1",
    "idempotency_key": "k-1",
    "args_digest": "d",
    "status": "SUCCEEDED",
    "ok": True,
    "result": {"ticket_id": "T1"},
    "error": None,
    "attempts": 1,
    "created_at": "2026-12-02T00:00:00Z",
    "updated_at": "2026-12-02T00:00:00Z",
}


def _problem(status: int, code: str, *, retry_after: str | None = None) -> httpx.Response:
    headers = dict(PROBLEM)
    if retry_after is not None:
        headers["retry-after"] = retry_after
    body = {
        "type": f"/problems/{code}",
        "title": code,
        "status": status,
        "detail": f"{code} detail",
        "code": code,
        "retryable": status >= 500,
        "suggested_action": "do this",
        "errors": [{"loc": "title", "msg": "too long", "type": "string_too_long"}],
    }
    return httpx.Response(status, json=body, headers=headers)


def _client(answers: list[httpx.Response], seen: list[httpx.Request]) -> HttpLedgerClient:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0)

    return HttpLedgerClient("http://ledger.test", "tok", transport=httpx.MockTransport(handler))


async def _call(client: HttpLedgerClient, wait: float = 5.0) -> object:
    return await client.call(
        "create_ticket", {"title": "x"}, idempotency_key="k-1", wait=wait, run_id="r-1"
    )


async def test_a_call_sends_key_wait_token_and_body_and_reads_the_call() -> None:
    seen: list[httpx.Request] = []
    answers = [httpx.Response(200, json=CALL, headers={"idempotent-replayed": "true"})]
    async with _client(answers, seen) as client:
        result = await client.call(
            "create_ticket", {"title": "x"}, idempotency_key="k-1", wait=5, run_id="r-1"
        )
    assert result.ok and result.replayed and result.result == {"ticket_id": "T1"}
    assert result.call_id == "call_1" and result.attempts == 1
    request = seen[0]
    assert request.url.path == "/v1/tools/create_ticket/calls"
    assert request.headers["authorization"] == "Bearer tok"
    assert request.headers["idempotency-key"] == "k-1"
    prefer = request.headers["prefer"]
    assert prefer.startswith("wait=") and 4.0 < float(prefer[5:]) <= 5.0
    assert json.loads(request.content) == {"arguments": {"title": "x"}, "run_id": "r-1"}


async def test_202_is_pending_and_running_and_409_is_pending_in_use() -> None:
    seen: list[httpx.Request] = []
    pending = dict(CALL, status="PENDING", ok=False, result=None)
    answers = [httpx.Response(202, json=pending), _problem(409, "IDEMPOTENCY_KEY_IN_USE")]
    async with _client(answers, seen) as client:
        running = await client.call("create_ticket", {}, idempotency_key="k-1")
        in_use = await client.call("create_ticket", {}, idempotency_key="k-1")
    assert running.status is CallStatus.PENDING and running.running
    assert in_use.status is CallStatus.PENDING and not in_use.running
    assert in_use.error is not None and in_use.error.code == "IDEMPOTENCY_KEY_IN_USE"


async def test_a_problem_is_a_refusal_with_its_error_and_field_errors() -> None:
    seen: list[httpx.Request] = []
    async with _client([_problem(400, "VALIDATION_FAILED")], seen) as client:
        result = await client.call(
            "create_ticket",
            {"title": "x"},
            idempotency_key="k-1",
            context=TrustedContext("acme", "alice"),
        )
    assert result.rejected and result.error is not None
    assert (result.error.code, result.error.message) == (
        "VALIDATION_FAILED",
        "VALIDATION_FAILED detail",
    )
    assert [f.loc for f in result.field_errors] == ["title"]
    assert result.call_id.startswith("call_")  # named from the caller's tenant and key


async def test_retry_after_is_followed_while_the_wait_lasts_then_returned() -> None:
    seen: list[httpx.Request] = []
    answers = [
        _problem(503, "INTERNAL", retry_after="0"),
        _problem(429, "RATE_LIMITED", retry_after="0"),
        httpx.Response(200, json=CALL),
    ]
    async with _client(answers, seen) as client:
        result = await client.call("create_ticket", {}, idempotency_key="k-1", wait=5)
    assert result.ok and len(seen) == 3
    assert {r.headers["idempotency-key"] for r in seen} == {"k-1"}

    seen.clear()
    later = [_problem(503, "INTERNAL", retry_after="30")]
    async with _client(later, seen) as client:
        result = await client.call("create_ticket", {}, idempotency_key="k-1", wait=1)
    assert len(seen) == 1  # 30 s is past the wait: answered now
    assert result.status is CallStatus.PENDING and result.error is not None
    assert result.error.retryable


@pytest.mark.parametrize(
    ("key", "arguments"),
    [("bad\nkey", {"title": "x"}), ("k-1", {"n": float("nan")})],
)
async def test_what_can_be_refused_here_is_refused_without_a_request(
    key: str, arguments: dict[str, object]
) -> None:
    seen: list[httpx.Request] = []
    async with _client([], seen) as client:
        result = await client.call("create_ticket", arguments, idempotency_key=key)
    assert result.rejected and not seen


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_server_that_is_down_is_a_transport_error_naming_the_url() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    async with Ledger.http(url, "tok") as ledger:
        with pytest.raises(TransportError, match=url.replace(".", r"\.")) as raised:
            await ledger.call("create_ticket", {"title": "x"}, idempotency_key="k-1")
    assert "same key" in str(raised.value)


async def test_a_proxy_page_is_a_transport_error() -> None:
    seen: list[httpx.Request] = []
    async with _client([httpx.Response(502, text="<html>bad gateway")], seen) as client:
        with pytest.raises(TransportError, match="502"):
            await _call(client)
