"""Bad ledger files get a clear error naming the file (and offset), and nothing is overwritten."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from toolledger.processors.runtime.sqlite_ledger import LedgerFileError, SqliteLedger
from toolledger.projections.sqlite import SqliteReadModel
from toolledger.schemas.keys import KeyScope


def SqliteLog(path: Path, **options: object) -> SqliteLedger:  # the tests' name
    return SqliteLedger(path, read_model=SqliteReadModel(), **options)  # type: ignore[arg-type]


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.write_bytes(b"this is a text file, not a database\n" * 100)
    before = path.read_bytes()
    with pytest.raises(LedgerFileError, match="not an SQLite database") as info:
        SqliteLog(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == before


def test_another_applications_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO customers (name) VALUES ('Ada')")
    before = path.read_bytes()
    with pytest.raises(LedgerFileError, match="another application") as info:
        SqliteLog(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == before


def test_a_second_process_cannot_open_the_same_ledger(tmp_path: Path) -> None:
    first = SqliteLog(tmp_path / "ledger.db")
    try:
        with pytest.raises(LedgerFileError, match="in use by another toolledger process"):
            SqliteLog(tmp_path / "ledger.db")
    finally:
        first.close()
    SqliteLog(tmp_path / "ledger.db").close()  # released on close


def test_an_undecodable_event_names_the_file_and_position(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    log = SqliteLog(path, partitions=2)
    try:
        with log.locked_write() as conn:
            conn.execute("INSERT INTO events (partition, event) VALUES (1, 'junk')")
        with pytest.raises(LedgerFileError) as info:
            log.rebuild()
        message = str(info.value)
        assert str(path) in message and "partition 1" in message and "seq 1" in message
        # the failed rebuild rolled back: the read model is still there
        tables = {r[0] for r in log.conn.execute("SELECT name FROM sqlite_master")}
        assert {"tool_calls", "tool_call_events"} <= tables
    finally:
        log.close()


def test_partition_count_is_fixed_at_creation(tmp_path: Path) -> None:
    SqliteLog(tmp_path / "ledger.db", partitions=3).close()
    reopened = SqliteLog(tmp_path / "ledger.db", partitions=8)
    try:
        assert reopened.partitions == 3  # the file's layout wins: keys must keep their partition
    finally:
        reopened.close()


def test_the_key_scope_is_recorded_at_creation_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    made = SqliteLog(path)
    assert made.key_scope is KeyScope.TENANT_PRINCIPAL  # a new ledger's default
    made.close()
    SqliteLog(path).close()  # without a scope asked: the file's
    before = path.read_bytes()
    with pytest.raises(LedgerFileError) as info:
        SqliteLog(path, key_scope=KeyScope.TENANT)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    assert "scopes keys by tenant+principal, not tenant" in message and "untouched" in message
    assert path.read_bytes() == before
    again = SqliteLog(path, key_scope=KeyScope.TENANT_PRINCIPAL)  # the same one: fine
    assert again.key_scope is KeyScope.TENANT_PRINCIPAL
    again.close()
    tenant = SqliteLog(tmp_path / "other" / "ledger.db", key_scope=KeyScope.TENANT)
    assert tenant.key_scope is KeyScope.TENANT
    tenant.close()


def test_a_ledger_made_before_key_scopes_keeps_its_tenant_keys(tmp_path: Path) -> None:
    """A file without a recorded scope made its keys the tenant's: it is not the new default
    (its keys would name other calls), and it keeps "tenant" from then on."""
    path = tmp_path / "ledger.db"
    SqliteLog(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM meta WHERE k = 'key_scope'")
    before = path.read_bytes()
    with pytest.raises(LedgerFileError, match="scopes keys by tenant, not tenant\\+principal"):
        SqliteLog(path, key_scope=KeyScope.TENANT_PRINCIPAL)
    assert path.read_bytes() == before
    old = SqliteLog(path)
    assert old.key_scope is KeyScope.TENANT
    old.close()
    with pytest.raises(LedgerFileError, match="scopes keys by tenant, not tenant\\+principal"):
        SqliteLog(path, key_scope=KeyScope.TENANT_PRINCIPAL)


def test_vacuum_reclaims_free_pages_and_needs_the_ledger_to_itself(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from toolledger.cli import app

    path = tmp_path / "ledger.db"
    log = SqliteLog(path, create=True)
    noise = random.Random(7)  # 4 MB on disk
    with log.locked_write() as conn:
        conn.executemany(
            "INSERT INTO events (partition, event) VALUES (0, ?)",
            [(noise.randbytes(2000).hex(),) for _ in range(1000)],
        )
        conn.execute("DELETE FROM events")  # space left free, as by deleted records
    in_use = CliRunner().invoke(app, ["vacuum", str(tmp_path)])
    assert in_use.exit_code == 2 and "in use" in in_use.output
    log.close()
    before = path.stat().st_size
    done = CliRunner().invoke(app, ["vacuum", str(tmp_path)])
    assert done.exit_code == 0, done.output
    assert path.stat().st_size < before // 10
    reopened = SqliteLog(path)  # still the same ledger
    try:
        assert list(reopened.events()) == []
    finally:
        reopened.close()


def test_a_large_ledger_gets_a_bounded_check_at_start(tmp_path: Path) -> None:
    """Above the size of a full page check, a start checks the schema only (seconds at any
    size); a file whose schema cannot be read is still refused."""
    from toolledger.processors.runtime.ledger_file import check_readable

    path = tmp_path / "ledger.db"
    SqliteLog(path, create=True).close()
    check_readable(path, full_check_max_bytes=0)
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # the first page: where the schema starts
    path.write_bytes(bytes(data))
    with pytest.raises(LedgerFileError, match=r"damaged|cannot"):
        check_readable(path, full_check_max_bytes=0)


def test_pruning_deletes_only_raw_intents_past_their_retention(tmp_path: Path) -> None:
    """Raw arguments live only in intents (of calls that asked for approval): those past the
    retention are deleted, newer ones stay."""
    import time

    log = SqliteLog(tmp_path / "ledger.db", partitions=1, create=True)
    try:
        with log.locked_write() as conn:
            conn.executemany(
                "INSERT INTO intents (call_key, at, arguments_json) VALUES ('k', ?, ?)",
                [(time.time() - 3600, '{"old":1}')] * 3 + [(time.time(), '{"new":1}')] * 2,
            )
        assert log.prune_intents(time.time() - 7200) == 0  # nothing that old
        assert log.prune_intents(time.time() - 60) == 3
        kept = [a for (a,) in log.conn.execute("SELECT arguments_json FROM intents ORDER BY seq")]
        assert kept == ['{"new":1}'] * 2
    finally:
        log.close()
