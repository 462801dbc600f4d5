"""Raw arguments are read back, by call key, only for the calls that asked for approval: a
call that needed none leaves its arguments nowhere (its outcome events hold them redacted)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from tests.contract.harness import contract_registry
from toolledger import TrustedContext
from toolledger.embedded import EmbeddedLedger
from toolledger.processors.runtime.intent_lookup import SqliteIntentLookup
from toolledger.processors.toolsets.helpdesk import HelpdeskStore
from toolledger.schemas.keys import CallKey
from toolledger.settings import LedgerSettings

ALICE = TrustedContext("acme", "alice")


async def test_only_an_approval_requests_raw_arguments_are_kept_and_found_by_key(
    tmp_path: Path,
) -> None:
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    path = tmp_path / "ledger.db"
    ticket = {"title": "mine", "body": "x"}
    charge = {"customer_id": "cus_1", "amount_cents": 1200, "currency": "USD"}
    async with EmbeddedLedger(
        LedgerSettings(path=path, create=True, partitions=2), contract_registry(store)
    ) as led:
        made = await led.client.call("create_ticket", ticket, idempotency_key="k-1", context=ALICE)
        assert made.ok
        asked = await led.client.call("charge_card", charge, idempotency_key="k-2", context=ALICE)
        assert asked.error is not None and asked.error.code == "APPROVAL_REQUIRED"
    lookup = SqliteIntentLookup(path)
    try:
        now = datetime.now(UTC)
        charged = str(CallKey("acme", "charge_card", "k-2", ALICE.principal))
        assert [json.loads(a) for a in await lookup.arguments(charged, now)] == [charge]
        ticketed = str(CallKey("acme", "create_ticket", "k-1", ALICE.principal))
        assert await lookup.arguments(ticketed, now) == []
    finally:
        lookup.close()
    store.close()
