"""Whose keys a key names a call among (docs/guarantees.md#key-scope), on every backend: under
``tenant+principal`` (a new ledger's default) two principals of a tenant sending the same key
and arguments make two calls, each with its own execution and result; under ``tenant`` (here a
tool's own setting) the second principal gets the first one's outcome, and other arguments are
refused as today."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from tests.contract.conftest import IN_PROCESS_BACKENDS, open_harness
from tests.contract.harness import ACME, Harness, register_tool
from toolledger.processors.tools.manifest import ToolContext
from toolledger.producers import governance
from toolledger.producers.client import CallResult, TrustedContext
from toolledger.schemas.events import ApprovalGranted, ApprovalRequested
from toolledger.schemas.keys import CallKey

BOB = TrustedContext("acme", "bob@acme")  # another user of alice's tenant (ACME is alice)


class Stamp(BaseModel):
    text: str


class Stamped(BaseModel):
    run: int
    principal: str | None


def _stamp_tool(ledger: Harness, name: str, **manifest: object) -> list[str | None]:
    """A tool whose result says which run made it and for whom; returns the runs' principals."""
    runs: list[str | None] = []

    async def stamp(_args: Stamp, ctx: ToolContext) -> Stamped:
        runs.append(ctx.principal)
        return Stamped(run=len(runs), principal=ctx.principal)

    register_tool(ledger, name, Stamp, Stamped, stamp, **manifest)
    return runs


async def _call(
    ledger: Harness, tool: str, who: TrustedContext, text: str, key: str = "k-shared"
) -> CallResult:
    return await ledger.client.call(tool, {"text": text}, idempotency_key=key, context=who)


async def test_two_principals_with_one_key_and_the_same_arguments_make_two_calls(
    ledger: Harness,
) -> None:
    runs = _stamp_tool(ledger, "stamp_mine")
    alice = await _call(ledger, "stamp_mine", ACME, "same")
    bob = await _call(ledger, "stamp_mine", BOB, "same")
    assert alice.ok and not alice.replayed and alice.result == {"run": 1, "principal": "alice@acme"}
    assert bob.ok and not bob.replayed and bob.result == {"run": 2, "principal": "bob@acme"}
    assert runs == ["alice@acme", "bob@acme"]
    assert alice.call_id != bob.call_id
    assert alice.call_id == CallKey("acme", "stamp_mine", "k-shared", "alice@acme").call_id
    # each replays its own outcome, never the other's
    again = [await _call(ledger, "stamp_mine", who, "same") for who in (BOB, ACME)]
    assert [(r.replayed, r.result, r.call_id) for r in again] == [
        (True, bob.result, bob.call_id),
        (True, alice.result, alice.call_id),
    ]
    assert len(runs) == 2
    # the digest is checked against the principal's own call: bob's other arguments are his
    # own call's to refuse, not alice's
    other = await _call(ledger, "stamp_mine", BOB, "other")
    assert other.rejected and other.error is not None
    assert other.error.code == "IDEMPOTENCY_KEY_REUSED" and len(runs) == 2
    rows = [r for r in await ledger.call_rows() if r["tool_name"] == "stamp_mine"]
    assert sorted(r["call_id"] for r in rows) == sorted([alice.call_id, bob.call_id])


async def test_a_principal_may_use_the_key_of_another_with_other_arguments(
    ledger: Harness,
) -> None:
    runs = _stamp_tool(ledger, "stamp_apart")
    alice = await _call(ledger, "stamp_apart", ACME, "alice's")
    bob = await _call(ledger, "stamp_apart", BOB, "bob's")
    assert alice.ok and bob.ok and not bob.replayed  # not 422: it is another call
    assert runs == ["alice@acme", "bob@acme"]


async def test_under_tenant_scope_another_principal_gets_the_first_outcome(
    ledger: Harness,
) -> None:
    runs = _stamp_tool(ledger, "stamp_shared", key_scope="tenant")
    alice = await _call(ledger, "stamp_shared", ACME, "same")
    bob = await _call(ledger, "stamp_shared", BOB, "same")
    assert alice.ok and not alice.replayed
    assert (
        bob.ok
        and bob.replayed
        and bob.result == alice.result == {"run": 1, "principal": "alice@acme"}
    )
    assert bob.call_id == alice.call_id == CallKey("acme", "stamp_shared", "k-shared").call_id
    other = await _call(ledger, "stamp_shared", BOB, "other")
    assert other.rejected and other.error is not None
    assert other.error.code == "IDEMPOTENCY_KEY_REUSED"
    assert runs == ["alice@acme"]


def test_the_manifest_states_each_tools_key_scope(ledger: Harness) -> None:
    _stamp_tool(ledger, "stamp_listed", key_scope="tenant")
    scopes = {t.name: ledger.registry.manifest(t)["key_scope"] for t in ledger.registry}
    assert scopes["stamp_listed"] == "tenant"
    assert scopes["create_ticket"] == "tenant+principal"  # a new ledger's


@pytest.fixture(params=IN_PROCESS_BACKENDS)
async def in_process(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    """The approval is decided from the call's own event: in-process backends (the HTTP API's
    story is tests/faults/test_key_scope.py)."""
    async for harness in open_harness(request, tmp_path):
        yield harness


CHARGE = {"customer_id": "cus_1", "amount_cents": 1250, "currency": "EUR"}


async def test_an_approved_charge_is_its_callers_only(in_process: Harness) -> None:
    """The issue's story: an operator approved alice's charge and it ran; bob's same key and
    arguments are his own call, which asks for its own approval and runs nothing."""
    ledger = in_process

    async def charge(who: TrustedContext) -> CallResult:
        return await ledger.client.call("charge_card", CHARGE, idempotency_key="pay-1", context=who)

    asked = await charge(ACME)
    assert isinstance(asked.event, ApprovalRequested)
    target = governance.ApprovalTarget.of_request(asked.event)
    assert target.call_key == str(CallKey("acme", "charge_card", "pay-1", "alice@acme"))
    record, _token = governance.approve(target, "op@acme", asked.event.envelope.occurred_at)
    assert isinstance(await ledger.client.command(record), ApprovalGranted)
    ran = await charge(ACME)
    assert ran.ok and not ran.replayed and ledger.effects("charge_card", "pay-1") == 1
    theirs = await charge(BOB)
    assert theirs.result is None and theirs.error is not None
    assert theirs.error.code == "APPROVAL_REQUIRED" and isinstance(theirs.event, ApprovalRequested)
    assert theirs.event.approval_id != asked.event.approval_id
    assert theirs.call_id != ran.call_id
    assert ledger.effects("charge_card", "pay-1") == 1
