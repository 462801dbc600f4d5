"""A key that only has an approval request, through the HTTP API on both backends: other
arguments under it are ``422 IDEMPOTENCY_KEY_REUSED`` at once, as against a finished call (they
used to open a second request, ``428``), before and after the request is approved; the
request's own call still runs, once."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.http.conftest import BACKENDS, serving
from tests.http.helpers import assert_call, assert_problem, post_call
from tests.http.servers import ACME, OPERATOR, Server

CHARGE = {"customer_id": "cus_7", "amount_cents": 1250, "currency": "EUR"}  # an operator's


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from serving(request, tmp_path_factory, "approval-keys")


@pytest.fixture
async def client(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=server.base_url, headers=ACME.headers, timeout=60
    ) as http:
        yield http


async def test_other_arguments_on_a_key_with_only_an_approval_request_are_422(
    server: Server, client: httpx.AsyncClient
) -> None:
    key = f"taken-{uuid.uuid4().hex[:12]}"
    asked = await post_call(client, "charge_card", CHARGE, key=key)
    request = assert_problem(asked, 428, "APPROVAL_REQUIRED")["approval_request"]
    for amount in (1300, 500):  # an operator's and a user's to confirm: neither is asked
        other = await post_call(client, "charge_card", {**CHARGE, "amount_cents": amount}, key=key)
        problem = assert_problem(other, 422, "IDEMPOTENCY_KEY_REUSED")
        assert "first used with other arguments" in problem["detail"]
    pending = await client.get(
        "/v1/approval-requests", params={"status": "pending"}, headers=OPERATOR.headers
    )
    assert pending.status_code == 200, pending.text
    mine = [r for r in pending.json()["items"] if r["idempotency_key"] == key]
    assert [r["id"] for r in mine] == [request["id"]]  # no second request
    approved = await client.post(
        f"/v1/approval-requests/{request['id']}/approve", headers=OPERATOR.headers
    )
    assert approved.status_code == 200, approved.text
    other = await post_call(client, "charge_card", {**CHARGE, "amount_cents": 1300}, key=key)
    assert_problem(other, 422, "IDEMPOTENCY_KEY_REUSED")
    assert server.effects(ACME.tenant, "charge_card", key) == 0
    ran = await post_call(client, "charge_card", CHARGE, key=key)
    assert_call(ran, "SUCCEEDED", replayed=False)
    assert server.effects(ACME.tenant, "charge_card", key) == 1
