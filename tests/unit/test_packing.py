"""Packed values (schemas.packing): what is packed unpacks to the same bytes, a value
stored before packing reads as it was, the dictionaries never change, and a ledger file whose
values were written unpacked still replays."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processors.toolsets.helpdesk import HelpdeskStore
from schemas.packing import EVENTS, MARK, STATES, Packer, unpack
from tests.contract.harness import contract_registry
from toolledger import TrustedContext
from toolledger.embedded import EmbeddedLedger

ALICE = TrustedContext("acme", "alice")


@given(raw=st.binary(max_size=5000), packer=st.sampled_from([EVENTS, STATES]))
def test_a_packed_value_unpacks_to_its_bytes(raw: bytes, packer: Packer) -> None:
    packed = packer.pack(raw)
    assert packed[0] == MARK and packed[1] == packer.ident
    assert unpack(packed) == raw


def test_values_stored_before_packing_read_as_they_were() -> None:
    for stored in (b'{"status":"SUCCEEDED"}', b"\xc3\x01 an avro record", b""):
        assert unpack(stored) == stored


def test_an_unknown_dictionary_and_a_truncated_value_are_errors() -> None:
    with pytest.raises(ValueError, match="dictionary 7f"):
        unpack(bytes((MARK, 0x7F)) + b"...")
    packed = STATES.pack(b'{"status":"SUCCEEDED","attempts":1}' * 20)
    with pytest.raises(ValueError, match="truncated"):
        unpack(packed[: len(packed) // 2])


def test_the_dictionaries_never_change() -> None:
    """Values packed with a dictionary are unreadable without it: a new one gets a new id."""
    digests = {p.ident: hashlib.sha256(p.dictionary).hexdigest()[:16] for p in (EVENTS, STATES)}
    assert digests == {1: "44f456d9e0e33d3a", 2: "6d6ee1faa26c2a66"}


async def test_a_ledger_whose_values_were_stored_unpacked_still_replays(tmp_path: Path) -> None:
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    registry = contract_registry(store)
    args = {"title": "printer", "body": "on fire"}
    path = tmp_path / "ledger.db"
    async with EmbeddedLedger(path, registry, create=True) as ledger:
        first = await ledger.client.call("create_ticket", args, idempotency_key="k", context=ALICE)
    with sqlite3.connect(path) as conn:  # as a ledger of the previous format wrote them
        for *place, value in conn.execute(
            "SELECT topic, partition, offset, value FROM log"
        ).fetchall():
            conn.execute(
                "UPDATE log SET value = ? WHERE topic = ? AND partition = ? AND offset = ?",
                (unpack(value), *place),
            )
        packed = conn.execute("SELECT COUNT(*) FROM log WHERE substr(value, 1, 1) = x'00'")
        assert packed.fetchone()[0] == 0
    async with EmbeddedLedger(path, registry) as ledger:
        again = await ledger.client.call("create_ticket", args, idempotency_key="k", context=ALICE)
        assert ledger.log is not None
        assert len(list(ledger.log.events())) >= 3  # the old records decode beside new ones
    assert again.replayed and again.ok and again.result == first.result
    assert store.effect_count("acme", "create_ticket", "k") == 1
