"""What a 400 VALIDATION_FAILED tells the caller to do names what is wrong: the query
parameter, path parameter, header or body member; invalid tool arguments keep the advice to
fix them and call again with the same key."""

from __future__ import annotations

import httpx

from tests.http.helpers import JSON, assert_problem, post_call, post_raw
from tests.http.servers import OPERATOR
from toolledger.producers.http.validation import body_fix, request_fix
from toolledger.schemas.errors import FieldError

ARGUMENTS_ACTION = "Fix the arguments listed in the field errors and call again with the same key."


def _error(loc: str) -> FieldError:
    return FieldError(loc=loc, msg="invalid", type="invalid")


async def test_a_bad_query_parameter_is_named(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/calls", params={"limit": "0"})
    action = assert_problem(response, 400, "VALIDATION_FAILED")["suggested_action"]
    assert "the query parameter `limit`" in action, action
    assert "arguments" not in action and "same key" not in action
    both = await client.get("/v1/calls", params={"limit": "abc", "status": "NOPE"})
    action = assert_problem(both, 400, "VALIDATION_FAILED")["suggested_action"]
    assert "query parameters" in action and "`limit`" in action and "`status`" in action, action


async def test_a_bad_query_parameter_of_an_operator_route_is_named(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get(
        "/v1/approval-requests", params={"status": "bogus"}, headers=OPERATOR.headers
    )
    action = assert_problem(response, 400, "VALIDATION_FAILED")["suggested_action"]
    assert "the query parameter `status`" in action, action


async def test_invalid_tool_arguments_keep_their_advice(
    client: httpx.AsyncClient, key: str
) -> None:
    wrong = await post_call(client, "create_ticket", {"title": 5}, key=key)
    assert assert_problem(wrong, 400, "VALIDATION_FAILED")["suggested_action"] == ARGUMENTS_ACTION
    not_an_object = await post_raw(
        client,
        "create_ticket",
        b'{"arguments": [1]}',
        {"Content-Type": JSON, "Idempotency-Key": key},
    )
    problem = assert_problem(not_an_object, 400, "VALIDATION_FAILED")
    assert problem["suggested_action"] == ARGUMENTS_ACTION


async def test_a_bad_member_of_a_call_body_is_named(client: httpx.AsyncClient, key: str) -> None:
    response = await post_call(client, "create_ticket", {"title": "t"}, key=key, run_id=1)
    action = assert_problem(response, 400, "VALIDATION_FAILED")["suggested_action"]
    assert "the body member `run_id`" in action and "same key" in action, action
    array = await post_raw(
        client, "create_ticket", b"[1]", {"Content-Type": JSON, "Idempotency-Key": key}
    )
    action = assert_problem(array, 400, "VALIDATION_FAILED")["suggested_action"]
    assert "JSON object" in action, action


async def test_a_bad_member_of_an_operator_body_is_named(client: httpx.AsyncClient) -> None:
    response = await client.post(
        f"/v1/approval-requests/apr_{'0' * 24}/deny", json={}, headers=OPERATOR.headers
    )
    action = assert_problem(response, 400, "VALIDATION_FAILED")["suggested_action"]
    assert "the body member `reason`" in action and "same key" not in action, action


def test_every_place_of_a_request_is_named() -> None:
    assert request_fix([_error("path.call_id")]) == (
        "Fix the path parameter `call_id` (see the field errors), then send the request again."
    )
    assert "the header `Idempotency-Key`" in request_fix([_error("header.Idempotency-Key")])
    assert "the cookie `session`" in request_fix([_error("cookie.session")])
    mixed = request_fix([_error("query.limit"), _error("query.cursor"), _error("header.prefer")])
    assert "the query parameters `limit`, `cursor` and the header `prefer`" in mixed
    assert request_fix([_error("query.limit"), _error("query.limit")]).count("`limit`") == 1
    assert body_fix([_error("arguments")], again="call again") is None
    assert body_fix([_error("arguments.title")], again="call again") is None
    assert "`arguments`, `run_id`" in str(
        body_fix([_error("arguments"), _error("run_id")], again="call again")
    )
