"""Bad ledger files get a clear error naming the file (and offset), and nothing is overwritten."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from processors.runtime.sqlite_log import OUTCOMES, LedgerFileError, SqliteLog
from projections.sqlite import SqliteProjection


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.write_bytes(b"this is a text file, not a database\n" * 100)
    before = path.read_bytes()
    with pytest.raises(LedgerFileError, match="not an SQLite database") as info:
        SqliteLog(path, projection=SqliteProjection())
    assert str(path) in str(info.value)
    assert path.read_bytes() == before


def test_another_applications_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO customers (name) VALUES ('Ada')")
    before = path.read_bytes()
    with pytest.raises(LedgerFileError, match="another application") as info:
        SqliteLog(path, projection=SqliteProjection())
    assert str(path) in str(info.value)
    assert path.read_bytes() == before


def test_a_second_process_cannot_open_the_same_ledger(tmp_path: Path) -> None:
    first = SqliteLog(tmp_path / "ledger.db", projection=SqliteProjection())
    try:
        with pytest.raises(LedgerFileError, match="in use by another toolledger process"):
            SqliteLog(tmp_path / "ledger.db", projection=SqliteProjection())
    finally:
        first.close()
    SqliteLog(tmp_path / "ledger.db", projection=SqliteProjection()).close()  # released on close


def test_an_undecodable_event_names_the_file_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    log = SqliteLog(path, projection=SqliteProjection(), partitions=2)
    try:
        log.append(OUTCOMES, [(1, b"k", b"\xc3\x01" + b"\x00" * 8 + b"junk")])
        with pytest.raises(LedgerFileError) as info:
            log.rebuild_projections()
        message = str(info.value)
        assert str(path) in message and "outcomes[1]" in message and "offset 0" in message
        # the failed rebuild rolled back: the projections are still there
        tables = {r[0] for r in log.conn.execute("SELECT name FROM sqlite_master")}
        assert {"tool_calls", "tool_call_events"} <= tables
    finally:
        log.close()


def test_partition_count_is_fixed_at_creation(tmp_path: Path) -> None:
    SqliteLog(tmp_path / "ledger.db", projection=SqliteProjection(), partitions=3).close()
    reopened = SqliteLog(tmp_path / "ledger.db", projection=SqliteProjection(), partitions=8)
    try:
        assert reopened.partitions == 3  # the file's layout wins: keys must keep their partition
    finally:
        reopened.close()


def test_vacuum_reclaims_free_pages_and_needs_the_ledger_to_itself(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from toolledger.cli import app

    path = tmp_path / "ledger.db"
    log = SqliteLog(path, projection=SqliteProjection(), create=True)
    noise = random.Random(7)  # values the log's packing cannot shrink: 4 MB on disk
    log.append(OUTCOMES, [(0, b"k", noise.randbytes(2000)) for _ in range(2000)])
    log.conn.execute("DELETE FROM log")  # space left free, as by deleted records
    in_use = CliRunner().invoke(app, ["vacuum", str(tmp_path)])
    assert in_use.exit_code == 2 and "in use" in in_use.output
    log.close()
    before = path.stat().st_size
    done = CliRunner().invoke(app, ["vacuum", str(tmp_path)])
    assert done.exit_code == 0, done.output
    assert path.stat().st_size < before // 10
    reopened = SqliteLog(path, projection=SqliteProjection())  # still the same ledger
    try:
        assert reopened.read(OUTCOMES, 0, 0) == []
    finally:
        reopened.close()


def test_a_large_ledger_gets_a_bounded_check_at_start(tmp_path: Path) -> None:
    """Above the size of a full page check, a start checks the schema only (seconds at any
    size); a file whose schema cannot be read is still refused."""
    from processors.runtime.ledger_file import check_readable

    path = tmp_path / "ledger.db"
    SqliteLog(path, projection=SqliteProjection(), create=True).close()
    check_readable(path, full_check_max_bytes=0)
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # the first page: where the schema starts
    path.write_bytes(bytes(data))
    with pytest.raises(LedgerFileError, match=r"damaged|cannot"):
        check_readable(path, full_check_max_bytes=0)


def test_pruning_deletes_only_processed_intents_past_their_retention(tmp_path: Path) -> None:
    """Raw arguments live only in intents: processed ones past the retention are deleted,
    an unprocessed one never is, and the last one stays (it carries the next offset)."""
    import time

    from processors.runtime.sqlite_log import EXECUTOR, INTENTS

    log = SqliteLog(
        tmp_path / "ledger.db", projection=SqliteProjection(), partitions=1, create=True
    )
    try:
        log.mark_interval_s = 0.0  # a mark at every append
        log.append(INTENTS, [(0, b"k", b"old")] * 3)
        log.conn.execute("UPDATE log_marks SET at = at - 3600")  # appended an hour ago
        log.append(INTENTS, [(0, b"k", b"new")] * 2)
        assert log.prune(INTENTS, time.time() - 60) == 0  # nothing is processed yet
        log.conn.execute("INSERT INTO positions VALUES (?, ?, 0, 2)", (EXECUTOR, INTENTS))
        assert log.prune(INTENTS, time.time() - 60) == 2  # offsets 0, 1: processed and old
        assert [o for o, _ in log.read(INTENTS, 0, 0)] == [2, 3, 4]
        log.conn.execute("UPDATE positions SET next_offset = 5")
        assert log.prune(INTENTS, time.time() + 60) == 2  # everything old now; 4 is the last
        assert [o for o, _ in log.read(INTENTS, 0, 0)] == [4]
        assert log.append(INTENTS, [(0, b"k", b"next")]) == [5]
    finally:
        log.close()


def test_pruning_outcomes_deletes_old_ranges_and_keeps_the_last_record(tmp_path: Path) -> None:
    """Outcomes were folded into the read model when appended: old ones go as a range, the
    last one stays (it carries the next offset), and the pruning is recorded in the file."""
    import time

    log = SqliteLog(
        tmp_path / "ledger.db", projection=SqliteProjection(), partitions=1, create=True
    )
    try:
        log.mark_interval_s = 0.0
        log.append(OUTCOMES, [(0, b"k", b"old")] * 3)
        log.conn.execute("UPDATE log_marks SET at = at - 3600")
        log.append(OUTCOMES, [(0, b"k", b"new")] * 2)
        assert log.prune(OUTCOMES, time.time() - 7200) == 0  # nothing that old
        assert log.conn.execute("SELECT v FROM meta WHERE k = 'outcomes_pruned'").fetchone() is None
        assert log.prune(OUTCOMES, time.time() - 60) == 2  # offsets 0, 1 (2 is the mark)
        assert [o for o, _ in log.read(OUTCOMES, 0, 0)] == [2, 3, 4]
        assert log.prune(OUTCOMES, time.time() + 60) == 2  # 4 is the last
        assert [o for o, _ in log.read(OUTCOMES, 0, 0)] == [4]
        assert log.append(OUTCOMES, [(0, b"k", b"next")]) == [5]
        assert log.conn.execute("SELECT v FROM meta WHERE k = 'outcomes_pruned'").fetchone()
        with pytest.raises(ValueError, match="no retention"):
            log.prune("positions", time.time())
    finally:
        log.close()


async def test_a_file_with_the_earlier_call_indexes_is_served_and_its_unused_index_dropped(
    tmp_path: Path,
) -> None:
    """Files made before the projection dropped its unused indexes: ``tool_calls`` with a
    unique ``call_key`` too (a table constraint, kept) and ``tool_call_events_by_key``
    (dropped at open). Calls, replays and the call's row work as on a new file."""
    from processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
    from toolledger import Ledger, TrustedContext

    path = tmp_path / "ledger.db"
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    agent = TrustedContext("acme", "agent-a")
    args = {"title": "kept"}
    try:
        async with Ledger.embedded(path, helpdesk_registry(store), context=agent) as ledger:
            first = await ledger.call("create_ticket", args, idempotency_key="k-1")
        with sqlite3.connect(path) as conn:  # back to the earlier schema, rows kept
            (old,) = conn.execute(
                "SELECT sql FROM sqlite_master WHERE name = 'tool_calls'"
            ).fetchone()
            earlier = old.replace("call_key TEXT NOT NULL,", "call_key TEXT NOT NULL UNIQUE,")
            assert earlier != old
            conn.execute("ALTER TABLE tool_calls RENAME TO tool_calls_new")
            conn.execute(earlier)
            conn.execute("INSERT INTO tool_calls SELECT * FROM tool_calls_new")
            conn.execute("DROP TABLE tool_calls_new")
            conn.execute(
                "CREATE INDEX tool_call_events_by_key"
                " ON tool_call_events (tenant_id, tool_name, idempotency_key)"
            )
        async with Ledger.embedded(path, helpdesk_registry(store), context=agent) as ledger:
            again = await ledger.call("create_ticket", args, idempotency_key="k-1")
            other = await ledger.call("create_ticket", {"title": "new"}, idempotency_key="k-2")
            assert again.replayed and again.result == first.result
            assert other.ok and not other.replayed
        with sqlite3.connect(path) as conn:
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            rows = conn.execute(
                "SELECT idempotency_key, status FROM tool_calls ORDER BY idempotency_key"
            ).fetchall()
        assert "tool_call_events_by_key" not in names
        assert rows == [("k-1", "SUCCEEDED"), ("k-2", "SUCCEEDED")]
        assert store.effect_count("acme", "create_ticket", "k-1") == 1
    finally:
        store.close()
