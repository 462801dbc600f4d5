"""The replay contract of the Idempotency-Key header (docs/architecture.md#the-http-contract)."""

from __future__ import annotations

import unicodedata

import httpx

from tests.http.helpers import (
    JSON,
    assert_call,
    assert_problem,
    calls_path,
    media_type,
    post_call,
    post_raw,
    raw_request,
)
from tests.http.servers import ACME, GLOBEX, Server


async def test_first_execution_then_byte_for_byte_replay(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    first = await post_call(client, "create_ticket", {"title": "printer on fire"}, key=key)
    body = assert_call(first, "SUCCEEDED", replayed=False)
    assert body["tool"] == "create_ticket"
    assert body["tenant_id"] == "acme"
    assert body["idempotency_key"] == key
    assert body["tool_version"] == "1"
    assert body["args_digest"].startswith("sha256:")
    assert body["attempts"] == 1
    assert body["error"] is None
    assert body["result"]["ticket_id"].startswith("T_")
    assert "last_event_id" not in body and "last_intent_id" not in body
    stored = await client.get(f"/v1/calls/{body['call_id']}")
    assert stored.status_code == 200

    for _ in range(3):
        replay = await post_call(client, "create_ticket", {"title": "printer on fire"}, key=key)
        assert replay.status_code == first.status_code
        assert replay.headers["content-type"] == first.headers["content-type"]
        assert replay.content == first.content
        assert replay.headers["idempotent-replayed"] == "true"
    # a replay is not a state change
    after = await client.get(f"/v1/calls/{body['call_id']}")
    assert after.content == stored.content
    assert after.json()["updated_at"] == body["updated_at"]
    assert server.effects("acme", "create_ticket", key) == 1


async def test_quoted_key_is_the_same_key(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    first = await post_call(client, "create_ticket", {"title": "q"}, key=f'"{key}"')
    assert assert_call(first, "SUCCEEDED", replayed=False)["idempotency_key"] == key
    replay = await post_call(client, "create_ticket", {"title": "q"}, key=key)
    assert_call(replay, "SUCCEEDED", replayed=True)
    assert replay.content == first.content
    again = await post_call(client, "create_ticket", {"title": "q"}, key=f'"{key}"')
    assert again.content == first.content and again.headers["idempotent-replayed"] == "true"
    assert server.effects("acme", "create_ticket", key) == 1


async def test_surrounding_whitespace_is_trimmed_inner_spaces_and_commas_kept(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    inner = f"{key} a, b"
    first = await post_call(client, "create_ticket", {"title": "ws"}, key=inner)
    assert assert_call(first, "SUCCEEDED", replayed=False)["idempotency_key"] == inner
    padded = await raw_request(
        server.base_url,
        [b"Idempotency-Key:  \t " + inner.encode() + b" \t"],
        b'{"arguments":{"title":"ws"}}',
    )
    assert padded.status == 200
    assert padded.body == first.content
    assert padded.headers["idempotent-replayed"] == "true"
    assert server.effects("acme", "create_ticket", inner) == 1


async def test_header_name_is_case_insensitive_key_value_is_case_sensitive(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    args = b'{"arguments":{"title":"case"}}'
    first = await post_raw(
        client, "create_ticket", args, [("content-type", JSON), ("idempotency-key", key)]
    )
    assert_call(first, "SUCCEEDED", replayed=False)
    for name in ("IDEMPOTENCY-KEY", "Idempotency-Key", "iDeMpOtEnCy-KeY"):
        replay = await post_raw(
            client, "create_ticket", args, [("Content-Type", JSON), (name, key)]
        )
        assert replay.content == first.content
        assert replay.headers["idempotent-replayed"] == "true"
    other = await post_raw(
        client, "create_ticket", args, [("Content-Type", JSON), ("Idempotency-Key", key.upper())]
    )
    assert_call(other, "SUCCEEDED", replayed=False)
    assert other.json()["call_id"] != first.json()["call_id"]
    assert server.effects("acme", "create_ticket", key) == 1
    assert server.effects("acme", "create_ticket", key.upper()) == 1


async def test_keys_are_scoped_by_tenant_and_by_tool(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    acme = await post_call(client, "create_ticket", {"title": "scoped"}, key=key)
    globex = await post_call(
        client, "create_ticket", {"title": "scoped"}, key=key, headers=GLOBEX.headers
    )
    other_tool = await post_call(client, "flaky_write", {"payload": "scoped"}, key=key)
    bodies = [assert_call(r, "SUCCEEDED", replayed=False) for r in (acme, globex, other_tool)]
    assert len({b["call_id"] for b in bodies}) == 3
    assert bodies[1]["tenant_id"] == "globex"
    assert server.effects("acme", "create_ticket", key) == 1
    assert server.effects("globex", "create_ticket", key) == 1
    assert server.effects("acme", "flaky_write", key) == 1
    # each is replayed in its own scope
    again = await post_call(
        client, "create_ticket", {"title": "scoped"}, key=key, headers=GLOBEX.headers
    )
    assert again.content == globex.content and again.headers["idempotent-replayed"] == "true"


async def test_digest_ignores_formatting_key_order_escapes_and_normal_form(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    title = unicodedata.normalize("NFC", "Café crème")
    first = await post_call(
        client, "create_ticket", {"title": title, "priority": "high", "body": "ü"}, key=key
    )
    body = assert_call(first, "SUCCEEDED", replayed=False)
    nfd = unicodedata.normalize("NFD", title)
    assert nfd != title
    variants = [
        # key order, whitespace and newlines
        '{\n  "arguments" : { "priority" : "high" ,\t"body":"ü", "title" : "TITLE" }\n}'.replace(
            "TITLE", title
        ),
        # string escapes
        '{"arguments":{"title":"Caf\\u00e9 cr\\u00e8me","priority":"\\u0068igh","body":"\\u00fc"}}',
        # decomposed (NFD) characters
        '{"arguments":{"body":"u\u0308","title":"TITLE","priority":"high"}}'.replace("TITLE", nfd),
    ]
    for text in variants:
        replay = await post_raw(
            client,
            "create_ticket",
            text.encode(),
            {"Content-Type": "application/json; charset=utf-8", "Idempotency-Key": key},
        )
        assert replay.content == first.content, (text, replay.text)
        assert replay.headers["idempotent-replayed"] == "true"
    assert body["args_digest"] == replay.json()["args_digest"]
    assert server.effects("acme", "create_ticket", key) == 1


async def test_run_step_and_approval_token_are_not_part_of_the_digest(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    first = await post_call(
        client, "create_ticket", {"title": "ctx"}, key=key, run_id="run-1", step_id="s-1"
    )
    body = assert_call(first, "SUCCEEDED", replayed=False)
    assert (body["run_id"], body["step_id"]) == ("run-1", "s-1")
    extras: list[dict[str, str]] = [
        {"run_id": "run-2"},
        {"step_id": "s-9"},
        {"approval_token": "tok-ignored"},
        {},
        {"run_id": "run-3", "step_id": "s-3", "approval_token": "t"},
    ]
    for extra in extras:
        body_json = {"arguments": {"title": "ctx"}, **extra}
        replay = await client.post(
            calls_path("create_ticket"), json=body_json, headers={"Idempotency-Key": key}
        )
        assert replay.content == first.content, extra
        assert replay.headers["idempotent-replayed"] == "true"
    assert server.effects("acme", "create_ticket", key) == 1


async def test_same_key_other_arguments_is_422_at_once(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    first = await post_call(client, "create_ticket", {"title": "one"}, key=key)
    assert_call(first, "SUCCEEDED", replayed=False)
    reused = await post_call(client, "create_ticket", {"title": "two"}, key=key)
    problem = assert_problem(reused, 422, "IDEMPOTENCY_KEY_REUSED")
    assert problem["retryable"] is False
    # the refusal consumed nothing: the original still replays
    replay = await post_call(client, "create_ticket", {"title": "one"}, key=key)
    assert replay.content == first.content
    assert server.effects("acme", "create_ticket", key) == 1


async def test_failed_final_is_answered_200_and_replayed(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    args = {"payload": "p", "fault": "final"}
    first = await post_call(client, "flaky_write", args, key=key)
    body = assert_call(first, "FAILED_FINAL", replayed=False)
    assert body["error"]["code"] == "DOWNSTREAM_REFUSED"
    assert body["error"]["retryable"] is False
    assert set(body["error"]) >= {"code", "message", "retryable", "suggested_action"}
    assert body["result"] is None
    replay = await post_call(client, "flaky_write", args, key=key)
    assert replay.status_code == 200
    assert replay.content == first.content
    assert replay.headers["idempotent-replayed"] == "true"
    assert server.effects("acme", "flaky_write", key) == 0


async def test_failed_retryable_executes_again_until_the_cap_then_replays(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    args = {"payload": "p", "fault": "retryable_always"}
    first = await post_call(client, "flaky_write", args, key=key)
    body = assert_call(first, "FAILED_RETRYABLE", replayed=False)
    assert body["error"]["retryable"] is True
    assert body["error"]["code"] == "DOWNSTREAM_UNAVAILABLE"
    assert body["attempts"] == 3
    second = await post_call(client, "flaky_write", args, key=key)  # a new round, not a replay
    assert assert_call(second, "FAILED_RETRYABLE", replayed=False)["attempts"] == 6
    third = await post_call(client, "flaky_write", args, key=key)
    final = assert_call(third, "FAILED_FINAL", replayed=False)
    assert final["error"]["code"] == "RETRY_LIMIT_EXCEEDED"
    assert final["call_id"] == body["call_id"]
    replay = await post_call(client, "flaky_write", args, key=key)
    assert replay.content == third.content
    assert replay.headers["idempotent-replayed"] == "true"
    assert server.effects("acme", "flaky_write", key) == 0


async def test_unknown_outcome_is_reconciled_on_retry_never_rerun(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    args = {"payload": "p", "fault": "hang_after_effect"}
    first = await post_call(client, "flaky_write", args, key=key, wait=server.flaky_timeout_s + 20)
    body = assert_call(first, "UNKNOWN", replayed=False)
    assert body["result"] is None
    retry = await post_call(client, "flaky_write", args, key=key)
    reconciled = assert_call(retry, "SUCCEEDED", replayed=True)
    assert reconciled["result"]["write_id"].startswith("W_")
    assert reconciled["call_id"] == body["call_id"]
    again = await post_call(client, "flaky_write", args, key=key)
    assert again.content == retry.content
    assert again.headers["idempotent-replayed"] == "true"
    assert server.effects("acme", "flaky_write", key) == 1
    assert body["error"] is not None, "an UNKNOWN call says why"
    assert body["error"]["code"] == "OUTCOME_UNKNOWN"
    assert body["error"]["retryable"] is True


async def test_read_only_tool_ignores_the_key(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    made = await post_call(client, "create_ticket", {"title": "listed"}, key=key)
    ticket = assert_call(made, "SUCCEEDED", replayed=False)["result"]["ticket_id"]
    for headers in (
        [("Content-Type", JSON)],
        [("Content-Type", JSON), ("Idempotency-Key", key)],
        [("Content-Type", JSON), ("Idempotency-Key", "x" * 300)],
        [("Content-Type", JSON), ("Idempotency-Key", "a"), ("Idempotency-Key", "b")],
    ):
        listed = await post_raw(client, "list_tickets", b'{"arguments":{}}', headers)
        body = assert_call(listed, "SUCCEEDED", replayed=False)
        assert ticket in {t["ticket_id"] for t in body["result"]["tickets"]}
    assert media_type(listed) == JSON
    # nothing was ledgered under the key for the read-only tool
    found = await client.get("/v1/calls", params={"tool": "list_tickets"})
    assert found.status_code == 200 and found.json()["items"] == []
    assert (await client.post(calls_path("list_tickets"), json={"arguments": {}})).is_success


async def test_tenant_comes_from_the_token_never_from_the_body(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    smuggled: list[dict[str, str]] = [
        {"tenant_id": "globex"},
        {"tenant": "globex"},
        {"principal": "root"},
    ]
    for extra in smuggled:
        body = {"arguments": {"title": "t"}, **extra}
        refused = await client.post(
            calls_path("create_ticket"), json=body, headers={"Idempotency-Key": key}
        )
        assert_problem(refused, 400, "VALIDATION_FAILED")
    in_arguments = await post_call(
        client, "create_ticket", {"title": "t", "tenant_id": "x"}, key=key
    )
    assert_problem(in_arguments, 400, "VALIDATION_FAILED")
    assert server.effects_with_key(key) == 0
    made = await post_call(client, "create_ticket", {"title": "t"}, key=key, headers=GLOBEX.headers)
    assert assert_call(made, "SUCCEEDED", replayed=False)["tenant_id"] == GLOBEX.tenant
    assert server.effects(GLOBEX.tenant, "create_ticket", key) == 1
    assert server.effects(ACME.tenant, "create_ticket", key) == 0
