"""A ledger is never silently re-created and a failed start writes nothing: an emptied, deleted
or damaged ``ledger.db`` is refused by ``toolledger serve`` with one line naming the file, and
the file is left byte for byte as it was."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
from producers.client import TrustedContext
from tests.http.servers import ROOT, write_tokens
from toolledger.embedded import EmbeddedLedger

AGENT = TrustedContext("acme", "alice")


async def _ledger_with_calls(data: Path, calls: int = 20) -> None:
    registry = helpdesk_registry(HelpdeskStore(data / "helpdesk.db"))
    async with EmbeddedLedger(data / "ledger.db", registry, create=True) as ledger:
        for n in range(calls):
            done = await ledger.client.call(
                "create_ticket", {"title": f"t{n}"}, idempotency_key=f"k{n}", context=AGENT
            )
            assert done.ok, done


def _serve(workdir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``toolledger serve`` on the data directory; it must refuse and exit by itself."""
    tokens = write_tokens(workdir / "tokens.json")
    command = [sys.executable, "-m", "toolledger.cli", "serve", "--port", "1"]
    command += ["--data", str(workdir / "data"), "--tokens", str(tokens), *extra]
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=60, env=dict(os.environ)
    )


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def _empty(db: Path) -> None:
    db.write_bytes(b"")


def _empty_without_wal(db: Path) -> None:
    db.write_bytes(b"")
    db.with_name("ledger.db-wal").unlink(missing_ok=True)


def _delete_keep_wal(db: Path) -> None:
    db.with_name("ledger.db-wal").write_bytes(b"\x37\x7f\x06\x82" + b"\x00" * 28)
    db.unlink()


def _delete(db: Path) -> None:
    db.unlink()
    for side in ("ledger.db-wal", "ledger.db-shm"):
        db.with_name(side).unlink(missing_ok=True)


def _damage(db: Path) -> None:
    data = bytearray(db.read_bytes())
    middle = len(data) // 2 // 4096 * 4096
    data[middle : middle + 64 * 1024] = random.Random(7).randbytes(64 * 1024)
    db.write_bytes(bytes(data))


def _not_sqlite(db: Path) -> None:
    db.write_bytes(b"this is not a ledger\n" * 500)


TAMPERINGS: dict[str, tuple[Callable[[Path], None], str]] = {
    "emptied": (_empty, "is empty"),
    "emptied-without-wal": (_empty_without_wal, "is empty"),
    "deleted-wal-left": (_delete_keep_wal, "write-ahead log"),
    "deleted": (_delete, "does not exist"),
    "damaged": (_damage, "is damaged"),
    "foreign": (_not_sqlite, "not an SQLite database"),
}


@pytest.mark.parametrize("name", sorted(TAMPERINGS))
async def test_a_tampered_ledger_is_refused_untouched_with_one_line(
    tmp_path: Path, name: str
) -> None:
    data = tmp_path / "data"
    await _ledger_with_calls(data)
    db = data / "ledger.db"
    tamper, expected = TAMPERINGS[name]
    tamper(db)
    before = {p.name: _digest(p) for p in (db, db.with_name("ledger.db-wal"))}
    refused = _serve(tmp_path)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    message = (refused.stdout + refused.stderr).strip()
    assert str(db) in message and expected in message, message
    assert len(message.splitlines()) == 1, message  # one line, no traceback
    assert "Traceback" not in message
    after = {p.name: _digest(p) for p in (db, db.with_name("ledger.db-wal"))}
    assert after == before  # nothing was written to the file or its WAL
    if name != "deleted":
        # --create makes a ledger only where none is: it never replaces a file
        again = _serve(tmp_path, "--create")
        assert again.returncode == 2, again.stdout
        assert {p.name: _digest(p) for p in (db, db.with_name("ledger.db-wal"))} == before


def test_init_makes_a_ledger_once_and_never_again(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "toolledger.cli", "init", str(tmp_path / "data")]
    made = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stdout + made.stderr
    assert (tmp_path / "data" / "ledger.db").stat().st_size > 0
    twice = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert twice.returncode == 2 and "exists already" in twice.stdout + twice.stderr


async def test_another_ledgers_file_put_in_place_is_refused_untouched(tmp_path: Path) -> None:
    data = tmp_path / "data"
    await _ledger_with_calls(data, calls=3)
    other = tmp_path / "other"
    await _ledger_with_calls(other, calls=2)
    db = data / "ledger.db"
    db.write_bytes((other / "ledger.db").read_bytes())  # a wrong backup restored here
    before = _digest(db)
    refused = _serve(tmp_path)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    message = (refused.stdout + refused.stderr).strip()
    assert str(db) in message and "another ledger" in message, message
    assert len(message.splitlines()) == 1, message
    assert _digest(db) == before
