"""The embedded read model is derived from the log after the callers are answered (never in
the hot transaction), yet a caller reads its own writes: a read of the audit trail or of the
governance views waits (bounded) until the read model holds every event written before it.
The derivation is slowed down here so that a read that did not wait would miss the events."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.contract.harness import contract_registry
from toolledger import TrustedContext
from toolledger.embedded import EmbeddedLedger
from toolledger.processors.runtime.sqlite_ledger import SqliteLedger
from toolledger.processors.toolsets.helpdesk import HelpdeskStore
from toolledger.settings import LedgerSettings

ALICE = TrustedContext("acme", "alice")
SLOW_S = 0.05


async def test_a_caller_reads_the_events_that_answered_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tail = SqliteLedger.tail

    def slow_tail(self: SqliteLedger, limit: int = 4096) -> int:
        time.sleep(SLOW_S)  # in the writer's thread, after the answers
        return tail(self, limit)

    monkeypatch.setattr(SqliteLedger, "tail", slow_tail)
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    settings = LedgerSettings(path=tmp_path / "ledger.db", create=True, partitions=2)
    async with EmbeddedLedger(settings, contract_registry(store)) as led:
        queries = led.queries()
        try:
            for n in range(5):
                args = {"title": f"t{n}"}
                made = await led.client.call(
                    "create_ticket", args, idempotency_key=f"k-{n}", context=ALICE
                )
                assert made.ok and made.call_id is not None
                events = await queries.events("acme", made.call_id)
                assert events is not None
                assert [e["type"] for e in events] == ["ToolCallStarted", "ToolCallSucceeded"]
                again = await led.client.call(
                    "create_ticket", args, idempotency_key=f"k-{n}", context=ALICE
                )
                assert again.replayed
                events = await queries.events("acme", made.call_id)
                assert events is not None and events[-1]["type"] == "ToolCallReplayed"
        finally:
            queries.close()
    store.close()
