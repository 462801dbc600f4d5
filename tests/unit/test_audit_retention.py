"""The audit trail's retention (``projections.audit_retention``) on the embedded read model:
past the cutoff an expired key's finished call loses its row and events; an open (PENDING,
UNKNOWN) call and a live key keep their whole record; nothing newer than the cutoff goes; an
expired key whose record went runs as a new call."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import BaseModel

from toolledger import Ledger, Registry, TrustedContext
from toolledger.processors.runtime.state_table import transaction
from toolledger.projections.audit_retention import prune_sqlite

ALICE = TrustedContext("acme", "alice")


class Note(BaseModel):
    text: str


def _registry(effects: list[str]) -> Registry:
    registry = Registry(default_key_retention=timedelta(seconds=1))

    @registry.mutation()
    async def write_note(args: Note) -> Note:
        """Write a note. Use when: something must be kept."""
        effects.append(args.text)
        return args

    return registry


async def _expired(path: Path, call_ids: set[str]) -> None:
    """Wait until the keys of ``call_ids`` have expired (their rows say so)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.closing(sqlite3.connect(path)) as conn:
            rows = conn.execute("SELECT call_id FROM tool_calls WHERE expired_at IS NOT NULL")
            if call_ids <= {r[0] for r in rows}:
                return
        await asyncio.sleep(0.05)
    raise AssertionError("the keys did not expire")


def _counts(conn: sqlite3.Connection) -> dict[str, int]:
    rows = conn.execute("SELECT call_id, count(*) FROM tool_call_events GROUP BY call_id")
    return dict(rows.fetchall())


async def test_past_the_cutoff_finished_records_go_open_ones_stay(tmp_path: Path) -> None:
    effects: list[str] = []
    path = tmp_path / "ledger.db"
    fast = {"sweep_interval_s": 0.05}
    async with Ledger.embedded(path, _registry(effects), context=ALICE, **fast) as ledger:
        done = [await ledger.call("write_note", {"text": f"n{i}"}, idempotency_key=f"k{i}")
                for i in range(3)]  # fmt: skip
        live = await ledger.call("write_note", {"text": "live"}, idempotency_key="k-live")
        assert all(r.ok for r in [*done, live])
        await _expired(path, {r.call_id for r in done})
    conn = sqlite3.connect(path)
    try:
        open_id = done[0].call_id
        conn.execute("UPDATE tool_calls SET status = 'UNKNOWN' WHERE call_id = ?", (open_id,))
        conn.commit()
        before = _counts(conn)
        assert set(before) >= {r.call_id for r in done}
        conn.execute("UPDATE tool_calls SET expired_at = NULL WHERE call_id = ?", (live.call_id,))
        conn.commit()  # a key still alive, however old its record (when the sweep was late)

        # nothing is older than a cutoff in the past
        assert prune_sqlite(lambda: transaction(conn), datetime.now(UTC) - timedelta(hours=1)) == 0
        assert _counts(conn) == before

        deleted = prune_sqlite(
            lambda: transaction(conn), datetime.now(UTC) + timedelta(seconds=1), limit=2
        )
        kept = {open_id, live.call_id}  # the UNKNOWN call and the live key keep it all
        assert deleted == sum(n for c, n in before.items() if c not in kept)
        assert _counts(conn) == {c: before[c] for c in kept}
        rows = {r[0] for r in conn.execute("SELECT call_id FROM tool_calls")}
        assert rows == kept
        assert (
            prune_sqlite(lambda: transaction(conn), datetime.now(UTC) + timedelta(seconds=1)) == 0
        )  # idempotent
    finally:
        conn.close()

    # an expired key whose record went: a new call with it executes as a new call
    async with Ledger.embedded(path, _registry(effects), context=ALICE) as ledger:
        again = await ledger.call("write_note", {"text": "n1"}, idempotency_key="k1")
        assert again.ok and not again.replayed
    assert effects == ["n0", "n1", "n2", "live", "n1"]


def test_serve_refuses_an_audit_retention_that_is_not_a_duration(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tests.http.servers import write_tokens
    from toolledger.cli import app

    tokens = write_tokens(tmp_path / "tokens.json")
    args = ["serve", "--data", str(tmp_path / "d"), "--tokens", str(tokens), "--create", "--demo"]
    answer = CliRunner().invoke(app, [*args, "--audit-retention", "soon"])
    assert answer.exit_code == 2, answer.output
    assert "not a duration" in answer.output


def test_the_projector_refuses_an_audit_retention_that_is_not_a_duration() -> None:
    from typer.testing import CliRunner

    from toolledger.cli import app

    answer = CliRunner().invoke(app, ["projector", "--audit-retention", "soon"])
    assert answer.exit_code == 2, answer.output
    assert "not a duration" in answer.output


async def test_rounds_succeed_while_the_ledger_writes_back_to_back(tmp_path: Path) -> None:
    """Under a constant stream of calls the writer commits back to back; a round takes its
    turn behind it (``SqliteLedger.locked_write``) and deletes what is past the cutoff, where a
    connection of its own lost the race for SQLite's lock ("database is locked")."""
    from toolledger.embedded import EmbeddedLedger
    from toolledger.settings import LedgerSettings

    effects: list[str] = []
    path = tmp_path / "ledger.db"
    registry = _registry(effects)
    async with EmbeddedLedger(
        LedgerSettings(path=path, create=True, sweep_interval_s=0.05), registry
    ) as ledger:
        assert ledger.file is not None
        first = [
            await ledger.client.call("write_note", {"text": f"old{i}"}, idempotency_key=f"o{i}",
                                     context=ALICE)
            for i in range(20)
        ]  # fmt: skip
        await _expired(path, {r.call_id for r in first})
        stop = asyncio.Event()

        async def load(n: int) -> None:
            i = 0
            while not stop.is_set():
                await ledger.client.call(
                    "write_note", {"text": "x"}, idempotency_key=f"l{n}-{i}", context=ALICE
                )
                i += 1

        callers = [asyncio.create_task(load(n)) for n in range(32)]
        try:
            deleted = 0
            for _ in range(5):  # rounds while the callers keep the writer busy
                cutoff = datetime.now(UTC) + timedelta(seconds=1)
                deleted += await asyncio.to_thread(prune_sqlite, ledger.file.locked_write, cutoff)
        finally:
            stop.set()
            await asyncio.gather(*callers)
        assert deleted >= 2 * len(first)  # each old call's Started and Succeeded, at least
        with contextlib.closing(sqlite3.connect(path)) as conn:
            left = {r[0] for r in conn.execute("SELECT call_id FROM tool_calls")}
        assert not left & {r.call_id for r in first}
