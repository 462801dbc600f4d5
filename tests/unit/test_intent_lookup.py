"""Raw arguments are read back from the embedded log's intents by call key: an intent's key is
stored as its fingerprint, and an intent stored by a file made before (the whole key) is
found all the same."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from processors.runtime.intent_lookup import SqliteIntentLookup
from processors.runtime.sqlite_log import key_fingerprint
from processors.toolsets.helpdesk import HelpdeskStore
from schemas.keys import CallKey
from schemas.packing import MARK
from tests.contract.harness import contract_registry
from toolledger import TrustedContext
from toolledger.embedded import EmbeddedLedger

ALICE = TrustedContext("acme", "alice")


async def test_a_calls_intents_are_found_by_key_as_stored_now_and_before(tmp_path: Path) -> None:
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    path = tmp_path / "ledger.db"
    mine, other = {"title": "mine", "body": "x"}, {"title": "other", "body": "y"}
    async with EmbeddedLedger(path, contract_registry(store), create=True, partitions=2) as led:
        for key, args in (("k-1", mine), ("k-2", other)):
            made = await led.client.call("create_ticket", args, idempotency_key=key, context=ALICE)
            assert made.ok
    call_key = str(CallKey("acme", "create_ticket", "k-1"))
    lookup = SqliteIntentLookup(path, 2)
    try:
        found = await lookup.arguments(call_key, datetime.now(UTC))
        assert [json.loads(a) for a in found] == [mine]
        with sqlite3.connect(path) as conn:
            intents = conn.execute("SELECT key FROM log WHERE topic = 'intents'")
            stored = {bytes(k) for (k,) in intents}
            assert key_fingerprint(call_key.encode()) in stored and call_key.encode() not in stored
            conn.execute(  # as a file made before stored it: the whole key
                "UPDATE log SET key = ? WHERE topic = 'intents' AND key = ?",
                (call_key.encode(), key_fingerprint(call_key.encode())),
            )
        lookup.close()
        found = await lookup.arguments(call_key, datetime.now(UTC))
        assert [json.loads(a) for a in found] == [mine]
    finally:
        lookup.close()


def test_no_stored_key_starts_like_a_packed_value() -> None:
    """A search of the ledger file unpacks every value that starts with ``MARK``: a key's
    fingerprint never does, also when its digest does."""
    key = next(
        k
        for k in (f'["acme","t","k{i}"]'.encode() for i in range(100_000))
        if hashlib.blake2b(k, digest_size=8).digest()[0] == MARK
    )
    assert key_fingerprint(key)[0] != MARK
