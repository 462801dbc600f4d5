"""An agent that holds the token its calls are made with tries to confirm its own ``user``
request, through the HTTP API on both backends: ``403 FORBIDDEN`` naming the credential that
confirms (it used to be approved, and the call ran); the request stays pending and nothing
runs; the user's own token (scope ``approvals:confirm``) confirms it, and the call runs once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.http.conftest import BACKENDS, serving
from tests.http.helpers import assert_call, assert_problem, post_call
from tests.http.servers import ACME, ALICE_CONFIRM, Server

SMALL = {"customer_id": "cus_3", "amount_cents": 700, "currency": "EUR"}  # the user's


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from serving(request, tmp_path_factory, "user-confirmation")


async def test_the_agents_own_token_cannot_confirm_its_call(server: Server) -> None:
    key = f"confirm-{uuid.uuid4().hex[:12]}"
    async with httpx.AsyncClient(
        base_url=server.base_url, headers=ACME.headers, timeout=60
    ) as agent:
        asked = await post_call(agent, "charge_card", SMALL, key=key)
        request = assert_problem(asked, 428, "APPROVAL_REQUIRED")["approval_request"]
        assert request["approver_kind"] == "user"
        approve = f"/v1/approval-requests/{request['id']}/approve"
        refused = assert_problem(await agent.post(approve), 403, "FORBIDDEN")
        assert "approvals:confirm" in refused["detail"]
        again = await post_call(agent, "charge_card", SMALL, key=key)  # still waits
        assert (
            assert_problem(again, 428, "APPROVAL_REQUIRED")["approval_request"]["id"]
            == (request["id"])
        )
        assert server.effects(ACME.tenant, "charge_card", key) == 0
        confirmed = await agent.post(approve, headers=ALICE_CONFIRM.headers)
        assert confirmed.status_code == 200, confirmed.text
        assert confirmed.json()["approver"] == "alice"
        ran = await post_call(agent, "charge_card", SMALL, key=key)
        assert_call(ran, "SUCCEEDED", replayed=False)
    assert server.effects(ACME.tenant, "charge_card", key) == 1
