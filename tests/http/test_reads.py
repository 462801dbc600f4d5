"""The read side and the service endpoints: calls, search, audit trail, tools, health,
metrics, the OpenAPI document and the problem pages."""

from __future__ import annotations

import uuid

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.http.helpers import (
    JSON,
    PROBLEM,
    approval_token,
    assert_call,
    assert_problem,
    media_type,
    post_call,
)
from tests.http.servers import GLOBEX, Server


async def test_get_call_is_the_call_resource_and_other_tenants_get_404(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    made = await post_call(client, "create_ticket", {"title": "mine"}, key=key, run_id="r")
    body = assert_call(made, "SUCCEEDED", replayed=False)
    got = await client.get(f"/v1/calls/{body['call_id']}")
    assert got.status_code == 200 and media_type(got) == JSON
    assert got.content == made.content
    assert set(body) == {
        "call_id", "tenant_id", "tool", "tool_version", "idempotency_key", "args_digest",
        "status", "ok", "result", "error", "attempts", "run_id", "step_id", "created_at",
        "updated_at",
    }  # fmt: skip
    # another tenant's call: exactly the answer for a call that does not exist, never 403
    theirs = await client.get(f"/v1/calls/{body['call_id']}", headers=GLOBEX.headers)
    assert_problem(theirs, 404, "NOT_FOUND")
    missing = await client.get("/v1/calls/call_00000000000000000000000000000000")
    assert theirs.content == missing.content
    events = await client.get(f"/v1/calls/{body['call_id']}/events", headers=GLOBEX.headers)
    assert_problem(events, 404, "NOT_FOUND")
    no_events = await client.get("/v1/calls/call_00000000000000000000000000000000/events")
    assert events.content == no_events.content
    mine = await client.get(f"/v1/calls/{body['call_id']}/events")
    assert mine.status_code == 200


async def test_search_within_the_tenant_with_cursor_paging(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    run = f"run-{uuid.uuid4().hex}"
    made = set()
    for n in range(5):
        response = await post_call(
            client, "create_ticket", {"title": f"t{n}"}, key=f"{key}-{n}", run_id=run
        )
        made.add(assert_call(response, "SUCCEEDED", replayed=False)["call_id"])
    failed = await post_call(
        client, "flaky_write", {"payload": "p", "fault": "final"}, key=key, run_id=run
    )
    failed_id = assert_call(failed, "FAILED_FINAL", replayed=False)["call_id"]
    theirs = await post_call(
        client, "create_ticket", {"title": "x"}, key=key, run_id=run, headers=GLOBEX.headers
    )
    assert theirs.status_code == 200

    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params = {"run_id": run, "limit": "2", **({"cursor": cursor} if cursor else {})}
        page = await client.get("/v1/calls", params=params)
        assert page.status_code == 200 and media_type(page) == JSON
        data = page.json()
        assert set(data) == {"items", "next_cursor"}
        assert len(data["items"]) <= 2
        seen += [item["call_id"] for item in data["items"]]
        pages += 1
        cursor = data["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert sorted(seen) == seen and len(set(seen)) == 6
    assert set(seen) == made | {failed_id}  # globex's call is not there

    by_key = (await client.get("/v1/calls", params={"idempotency_key": f"{key}-3"})).json()
    assert [i["idempotency_key"] for i in by_key["items"]] == [f"{key}-3"]
    assert by_key["next_cursor"] is None
    by_status = await client.get("/v1/calls", params={"run_id": run, "status": "FAILED_FINAL"})
    assert [i["call_id"] for i in by_status.json()["items"]] == [failed_id]
    by_tool = await client.get("/v1/calls", params={"run_id": run, "tool": "create_ticket"})
    assert {i["call_id"] for i in by_tool.json()["items"]} == made
    theirs_only = await client.get("/v1/calls", params={"run_id": run}, headers=GLOBEX.headers)
    assert [i["tenant_id"] for i in theirs_only.json()["items"]] == ["globex"]
    bad_cursor = await client.get("/v1/calls", params={"cursor": "not-a-cursor"})
    assert_problem(bad_cursor, 400, "VALIDATION_FAILED")


async def test_events_are_the_redacted_audit_trail_in_order(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    secret_to = f"very.private.{uuid.uuid4().hex[:8]}@example.com"
    secret_body = f"body-{uuid.uuid4().hex}"
    args = {"to": secret_to, "subject": "Your refund", "body": secret_body}
    token = await approval_token(client, "send_email", args, key)
    sent = await post_call(client, "send_email", args, key=key, approval_token=token)
    call = assert_call(sent, "SUCCEEDED", replayed=False)
    replay = await post_call(client, "send_email", args, key=key)
    assert replay.headers["idempotent-replayed"] == "true"
    response = await client.get(f"/v1/calls/{call['call_id']}/events")
    assert response.status_code == 200 and media_type(response) == JSON
    data = response.json()
    assert set(data) >= {"items"} and "next_cursor" in data
    types = [event["type"] for event in data["items"]]
    assert types[:5] == [
        "ApprovalRequested", "ApprovalGranted", "ApprovalConsumed", "ToolCallStarted",
        "ToolCallSucceeded",
    ], types  # fmt: skip
    assert token not in response.text  # the log keeps only the token's digest
    assert "ToolCallReplayed" in types
    assert secret_to not in response.text and secret_body not in response.text
    assert "very.private" not in response.text
    assert "Your refund" in response.text  # fields not declared sensitive stay readable
    # the Call resource carries the result, never the arguments
    assert secret_to not in sent.text
    assert server.effects("acme", "send_email", key) == 1


async def test_tools_lists_manifests_with_json_schemas_and_key_retention(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/v1/tools")
    assert response.status_code == 200 and media_type(response) == JSON
    data = response.json()
    # the default is bounded (issue 10): 24 hours, as Stripe keeps keys, for every tool
    # whose manifest sets none; each manifest states the retention in force
    assert (data["key_retention"], data["key_retention_seconds"]) == ("PT24H", 86_400)
    assert "next_cursor" in data
    tools = {t["name"]: t for t in data["items"]}
    for tool in tools.values():
        assert (tool["key_retention"], tool["key_retention_seconds"]) == ("PT24H", 86_400)
    assert set(tools) >= {
        "create_ticket", "list_tickets", "close_ticket", "send_email", "charge_card",
        "flaky_write",
    }  # fmt: skip
    create = tools["create_ticket"]
    assert create["effect"] == "mutation" and create["idempotency_key_required"] is True
    assert tools["list_tickets"]["effect"] == "read_only"
    assert tools["list_tickets"]["idempotency_key_required"] is False
    schema = create["arguments_schema"]
    assert schema["type"] == "object" and "title" in schema["properties"]
    assert schema["required"] == ["title"]
    assert create["result_schema"]["type"] == "object"
    assert "retryable_always" in str(tools["flaky_write"]["arguments_schema"])
    assert tools["send_email"]["redact_fields"] == ["body", "to"]
    assert "Replay:" in create["description"]


async def test_health_readiness_and_metrics(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    health = await client.get("/healthz", headers={"Authorization": ""})
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["ready"] is True and all(ready.json()["checks"].values())

    first = await post_call(client, "create_ticket", {"title": "m"}, key=key)
    assert_call(first, "SUCCEEDED", replayed=False)
    await post_call(client, "create_ticket", {"title": "m"}, key=key)
    await post_call(client, "create_ticket", {"title": "other"}, key=key)
    metrics = await client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics.text)
        for sample in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    assert (
        value(
            "toolledger_http_calls_total",
            tool="create_ticket",
            status="SUCCEEDED",
            http_status="200",
        )
        >= 2
    )
    assert value("toolledger_http_replays_total", tool="create_ticket") >= 1
    assert (
        value(
            "toolledger_http_rejections_total", tool="create_ticket", code="IDEMPOTENCY_KEY_REUSED"
        )
        >= 1
    )
    assert value("toolledger_http_call_seconds_count", tool="create_ticket") >= 3


async def test_openapi_document_describes_the_contract(client: httpx.AsyncClient) -> None:
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    doc = response.json()
    assert doc["openapi"].startswith("3.")
    paths = doc["paths"]
    assert set(paths) >= {
        "/v1/tools/{tool}/calls", "/v1/calls/{call_id}", "/v1/calls",
        "/v1/calls/{call_id}/events", "/v1/tools", "/healthz", "/readyz", "/metrics",
    }  # fmt: skip
    post = paths["/v1/tools/{tool}/calls"]["post"]
    assert set(post["responses"]) >= {
        "200", "202", "400", "401", "403", "404", "409", "413", "422", "428", "429", "503",
    }  # fmt: skip
    assert set(paths["/v1/tools/{tool}/calls"]) == {"post"}
    for status in ("400", "409", "422"):
        content = post["responses"][status]["content"]
        assert list(content) == [PROBLEM], content
        assert content[PROBLEM]["schema"]["$ref"].endswith("/Problem")
    headers = {p["name"].lower() for p in post["parameters"] if p["in"] == "header"}
    assert {"idempotency-key", "prefer"} <= headers
    call_ref = post["responses"]["200"]["content"][JSON]["schema"]["$ref"]
    call_schema = doc["components"]["schemas"][call_ref.rsplit("/", 1)[1]]
    assert "last_event_id" not in call_schema["properties"]
    assert set(call_schema["required"]) >= {"call_id", "status", "ok", "attempts"}
    assert "arguments" in str(post["requestBody"])


async def test_problem_types_are_pages_served_by_the_server(
    client: httpx.AsyncClient, key: str
) -> None:
    codes = [
        "VALIDATION_FAILED", "IDEMPOTENCY_KEY_MISSING", "IDEMPOTENCY_KEY_INVALID",
        "IDEMPOTENCY_KEY_REUSED", "IDEMPOTENCY_KEY_IN_USE", "UNAUTHENTICATED", "FORBIDDEN",
        "TOOL_NOT_FOUND", "TOOL_DISABLED", "APPROVAL_REQUIRED", "APPROVAL_INVALID",
        "RATE_LIMITED", "PAYLOAD_TOO_LARGE", "INTERNAL", "METHOD_NOT_ALLOWED",
    ]  # fmt: skip
    async with httpx.AsyncClient(base_url=str(client.base_url), timeout=30) as anonymous:
        for code in codes:
            page = await anonymous.get(f"/problems/{code}")
            assert page.status_code == 200, code
            assert page.headers["content-type"].startswith("text/html")
            assert code in page.text and "What to do" in page.text
        missing = await anonymous.get("/problems/NO_SUCH_CODE")
        assert missing.status_code == 404
        assert media_type(missing) == PROBLEM
        # the type of a live problem resolves to its page
        problem = await anonymous.post("/v1/tools/create_ticket/calls", json={"arguments": {}})
        assert problem.status_code == 401
        assert (await anonymous.get(problem.json()["type"])).status_code == 200
