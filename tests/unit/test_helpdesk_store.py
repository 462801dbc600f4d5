"""The helpdesk's downstream names each effect's call (its reconcile hooks find effects by call
id: under "tenant+principal" two principals' calls may share a key)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from toolledger.processors.toolsets.helpdesk import HelpdeskStore
from toolledger.schemas.keys import CallKey


def test_two_calls_under_one_key_are_found_apart(tmp_path: Path) -> None:
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    try:
        alice = CallKey("acme", "create_ticket", "k", "alice@acme").call_id
        bob = CallKey("acme", "create_ticket", "k", "bob@acme").call_id
        store.record("acme", "create_ticket", "k", alice, "t-1", "{}")
        store.record("acme", "create_ticket", "k", bob, "t-2", "{}")
        assert store.find(alice) == ("t-1", "{}")
        assert store.find(bob) == ("t-2", "{}")
        assert store.find(CallKey("acme", "create_ticket", "k").call_id) is None
    finally:
        store.close()


def test_a_store_made_before_effects_named_their_call_gets_their_tenant_keys(
    tmp_path: Path,
) -> None:
    path = tmp_path / "helpdesk.db"
    with sqlite3.connect(path) as conn:  # the table as it was, with one effect
        conn.execute(
            "CREATE TABLE effects (seq INTEGER PRIMARY KEY AUTOINCREMENT, tenant_id TEXT NOT "
            "NULL, tool TEXT NOT NULL, idempotency_key TEXT NOT NULL, resource_id TEXT NOT "
            "NULL, data TEXT NOT NULL)"
        )
        conn.execute(
            "INSERT INTO effects (tenant_id, tool, idempotency_key, resource_id, data) "
            "VALUES ('acme', 'create_ticket', 'k-old', 't-0', '{\"x\": 1}')"
        )
    conn.close()
    store = HelpdeskStore(path)
    try:
        assert store.find(CallKey("acme", "create_ticket", "k-old").call_id) == (
            "t-0",
            '{"x": 1}',
        )
    finally:
        store.close()
    HelpdeskStore(path).close()  # opened again: the column is there, nothing changes
