"""Approvals that travel with the call (issue 13 §1-2, §5), on both backends:

- who decides: ``user`` requests are confirmed by the user the call runs for with their own
  credential (scope ``approvals:confirm``), never with the agent's token that made the call,
  nor by another user (403), or by an operator; ``operator`` requests need four eyes;
- once granted, the same key and arguments go ahead without a token, once;
- the call resource of a call that waits shows its ``approval``;
- a call sent again with ``Prefer: wait=N`` waits for the decision, then answers the call
  (approved: it ran once; denied: the refusal);
- bad decisions: twice 409, another tenant's 404, another user's 403; nothing runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.http.helpers import assert_call, assert_problem, post_call
from tests.http.servers import ACME, ALICE_CONFIRM, CAROL, GLOBEX, OPERATOR, Server, Token

EMAIL = {"to": "a@example.com", "subject": "Your refund", "body": "It is on its way."}
SMALL = {"customer_id": "cus_small_1", "amount_cents": 900, "currency": "USD"}  # the user's
LARGE = {"customer_id": "cus_large_1", "amount_cents": 9000, "currency": "USD"}  # four eyes


async def _ask(client: httpx.AsyncClient, tool: str, args: dict[str, Any], key: str) -> Any:
    asked = await post_call(client, tool, args, key=key)
    return assert_problem(asked, 428, "APPROVAL_REQUIRED")["approval_request"]


async def _decide(
    client: httpx.AsyncClient, approval_id: str, verb: str, token: Token, **body: Any
) -> httpx.Response:
    return await client.post(
        f"/v1/approval-requests/{approval_id}/{verb}", headers=token.headers, json=body or None
    )


async def test_the_user_confirms_their_own_agents_email_and_the_retry_needs_no_token(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    request = await _ask(client, "send_email", EMAIL, key)
    assert request["approver_kind"] == "user" and request["call_id"].startswith("call_")
    # another user of the tenant may not decide it; another tenant does not find it
    assert_problem(await _decide(client, request["id"], "approve", CAROL), 403, "FORBIDDEN")
    assert_problem(await _decide(client, request["id"], "approve", GLOBEX), 404, "NOT_FOUND")
    # the call resource shows where the call stands while it waits
    waiting = await client.get(f"/v1/calls/{request['call_id']}")
    assert waiting.status_code == 200, waiting.text
    assert waiting.json()["status"] == "PENDING"
    assert waiting.json()["approval"]["id"] == request["id"]
    assert waiting.json()["approval"]["status"] == "pending"

    # the token that made the call does not confirm it: an agent holding it cannot say yes
    agent = assert_problem(await _decide(client, request["id"], "approve", ACME), 403, "FORBIDDEN")
    assert "approvals:confirm" in agent["detail"]
    approved = await _decide(client, request["id"], "approve", ALICE_CONFIRM)  # alice herself
    assert approved.status_code == 200, approved.text
    decided = approved.json()
    assert decided["approver"] == "alice" and decided["decided_at"]
    assert decided["approval_request"]["status"] == "approved"
    assert server.effects("acme", "send_email", key) == 0  # approving runs nothing

    sent = await post_call(client, "send_email", EMAIL, key=key)  # no token
    call = assert_call(sent, "SUCCEEDED", replayed=False)
    again = await post_call(client, "send_email", EMAIL, key=key)
    assert assert_call(again, "SUCCEEDED", replayed=True)["call_id"] == call["call_id"]
    assert server.effects("acme", "send_email", key) == 1
    assert_problem(
        await _decide(client, request["id"], "approve", ALICE_CONFIRM), 409, "APPROVAL_INVALID"
    )


async def test_a_grant_is_bound_to_its_arguments(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    request = await _ask(client, "charge_card", LARGE, key)
    assert request["approver_kind"] == "operator"
    assert (await _decide(client, request["id"], "approve", OPERATOR)).status_code == 200
    other = {**LARGE, "amount_cents": 9001}
    # other arguments with the key: the grant does not move to them, and the key is the
    # request's arguments' (a reused key, no request of their own)
    refused = await post_call(client, "charge_card", other, key=key)
    assert_problem(refused, 422, "IDEMPOTENCY_KEY_REUSED")
    assert server.effects("acme", "charge_card", key) == 0
    done = await post_call(client, "charge_card", LARGE, key=key)
    assert_call(done, "SUCCEEDED", replayed=False)
    assert server.effects("acme", "charge_card", key) == 1


async def test_a_small_charge_is_the_users_and_a_large_one_needs_four_eyes(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    small = await _ask(client, "charge_card", SMALL, key + "-small")
    assert small["approver_kind"] == "user"
    large = await _ask(client, "charge_card", LARGE, key + "-large")
    forbidden = assert_problem(
        await _decide(client, large["id"], "approve", ALICE_CONFIRM), 403, "FORBIDDEN"
    )
    assert "operator" in forbidden["detail"]
    assert_problem(await _decide(client, small["id"], "approve", ACME), 403, "FORBIDDEN")
    assert (await _decide(client, small["id"], "approve", ALICE_CONFIRM)).status_code == 200
    assert_call(await post_call(client, "charge_card", SMALL, key=key + "-small"), "SUCCEEDED",
                replayed=False)  # fmt: skip
    assert server.effects("acme", "charge_card", key + "-large") == 0


async def test_a_call_sent_again_with_prefer_wait_waits_for_the_approval(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    request = await _ask(client, "charge_card", LARGE, key)

    async def approve_soon() -> httpx.Response:
        await asyncio.sleep(0.5)
        return await _decide(client, request["id"], "approve", OPERATOR)

    waited, approved = await asyncio.gather(
        post_call(client, "charge_card", LARGE, key=key, wait=20), approve_soon()
    )
    assert approved.status_code == 200, approved.text
    assert_call(waited, "SUCCEEDED", replayed=False)
    assert server.effects("acme", "charge_card", key) == 1


async def test_a_call_sent_again_with_prefer_wait_gets_the_denial(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    request = await _ask(client, "send_email", EMAIL, key)

    async def deny_soon() -> httpx.Response:
        await asyncio.sleep(0.5)
        return await _decide(client, request["id"], "deny", OPERATOR, reason="Not this customer.")

    waited, denied = await asyncio.gather(
        post_call(client, "send_email", EMAIL, key=key, wait=20), deny_soon()
    )
    assert denied.status_code == 200, denied.text
    problem = assert_problem(waited, 403, "APPROVAL_INVALID")
    assert "Not this customer." in problem["detail"]
    assert server.effects("acme", "send_email", key) == 0
    shown = (await client.get(f"/v1/calls/{request['call_id']}")).json()
    assert shown["status"] == "FAILED_FINAL" and shown["approval"]["status"] == "denied"


async def test_the_wait_ends_with_the_428_when_nobody_decides(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    request = await _ask(client, "send_email", EMAIL, key)
    again = await post_call(client, "send_email", EMAIL, key=key, wait=0.5)
    assert (
        assert_problem(again, 428, "APPROVAL_REQUIRED")["approval_request"]["id"] == request["id"]
    )
    assert server.effects("acme", "send_email", key) == 0


async def test_those_who_decide_see_the_exact_arguments_and_the_audit_stays_redacted(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    secret = {**EMAIL, "to": f"private.{key[-12:]}@example.com", "body": "<script>x</script>"}
    request = await _ask(client, "send_email", secret, key)
    assert secret["to"] not in str(request)  # the 428 shows the redacted audit values
    path = f"/v1/approval-requests/{request['id']}"
    for reader in (OPERATOR, ACME):  # the tenant's operator; the user it is for
        shown = await client.get(path, headers=reader.headers)
        assert shown.status_code == 200, shown.text
        assert shown.json()["raw_arguments"] == secret
        assert shown.json()["arguments"]["to"].startswith("redacted:")
        assert shown.headers["cache-control"] == "no-store"
    assert_problem(await client.get(path, headers=CAROL.headers), 404, "NOT_FOUND")
    listed = await client.get("/v1/approval-requests", headers=OPERATOR.headers)
    assert secret["to"] not in listed.text  # lists and the audit trail keep the redaction
    events = await client.get(f"/v1/calls/{request['call_id']}/events")
    assert secret["to"] not in events.text
