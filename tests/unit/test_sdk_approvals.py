"""``Ledger.approve`` and ``Ledger.deny`` in the application's own process: the request a
call was answered with is decided as the application's human (the user it is for, with her
own credential, or an operator other than its caller), with the same rules as the HTTP API,
and the same call then runs once without a token, or is refused. The context that made the
call does not confirm it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from toolledger import Ledger, TrustedContext, pending_approval
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry

USER = TrustedContext("acme", "alice")  # what the ledger calls as: alice's agent
CONFIRMS = TrustedContext("acme", "alice", frozenset({"approvals:confirm"}))  # alice herself
OPERATOR = TrustedContext("acme", "olga", frozenset({"tools:call", "operator"}))
OTHER_TENANT_OPERATOR = TrustedContext("globex", "gus", frozenset({"operator"}))
EMAIL = {"to": "customer@example.com", "subject": "Refund", "body": "On its way."}
BIG_CHARGE = {"customer_id": "cus_1", "amount_cents": 5000, "currency": "EUR"}


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[tuple[Ledger, HelpdeskStore]]:
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    try:
        async with Ledger.embedded(
            tmp_path / "ledger.db", helpdesk_registry(store), context=USER
        ) as led:
            yield led, store
    finally:
        store.close()


async def test_a_user_confirms_their_own_agents_email(
    ledger: tuple[Ledger, HelpdeskStore],
) -> None:
    led, store = ledger
    key = f"sdk-{uuid.uuid4().hex}"
    asked = await led.call("send_email", EMAIL, idempotency_key=key)
    request = pending_approval(asked)
    assert request is not None and request.approver_kind == "user"
    mine = await led.approve(request)  # as the ledger's context, the agent's: refused
    assert mine.error is not None and mine.error.code == "FORBIDDEN", mine
    assert "approvals:confirm" in mine.error.message
    assert store.effect_count("acme", "send_email", key) == 0
    decided = await led.approve(request, CONFIRMS)  # alice, with her own credential
    assert decided.ok, decided
    sent = await led.call("send_email", EMAIL, idempotency_key=key)
    assert sent.ok and sent.replayed is False, sent
    again = await led.call("send_email", EMAIL, idempotency_key=key)
    assert again.replayed is True
    assert store.effect_count("acme", "send_email", key) == 1


async def test_four_eyes_the_caller_may_not_and_an_operator_may(
    ledger: tuple[Ledger, HelpdeskStore],
) -> None:
    led, store = ledger
    key = f"sdk-{uuid.uuid4().hex}"
    asked = await led.call("charge_card", BIG_CHARGE, idempotency_key=key)
    request = pending_approval(asked)
    assert request is not None and request.approver_kind == "operator"
    mine = await led.approve(request)  # the caller itself
    assert mine.error is not None and mine.error.code == "FORBIDDEN", mine
    for decide in (
        led.approve(request, OTHER_TENANT_OPERATOR),
        led.deny(request, OTHER_TENANT_OPERATOR),
    ):
        foreign = await decide  # another tenant's operator decides nothing here
        assert foreign.error is not None and foreign.error.code == "FORBIDDEN", foreign
        assert "another tenant" in foreign.error.message
    assert store.effect_count("acme", "charge_card", key) == 0
    assert (await led.approve(request, OPERATOR)).ok
    paid = await led.call("charge_card", BIG_CHARGE, idempotency_key=key)
    assert paid.ok, paid
    assert store.effect_count("acme", "charge_card", key) == 1


async def test_a_denied_request_refuses_the_call(ledger: tuple[Ledger, HelpdeskStore]) -> None:
    led, store = ledger
    key = f"sdk-{uuid.uuid4().hex}"
    request = pending_approval(await led.call("send_email", EMAIL, idempotency_key=key))
    assert request is not None
    decided = await led.deny(request, reason="wrong customer")
    assert decided.ok, decided
    refused = await led.call("send_email", EMAIL, idempotency_key=key)
    assert refused.error is not None and refused.error.code == "APPROVAL_INVALID"
    assert "wrong customer" in refused.error.message
    assert store.effect_count("acme", "send_email", key) == 0
