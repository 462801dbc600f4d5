"""A ledger is never silently re-created and a failed start writes nothing: an emptied, deleted
or damaged ``ledger.db`` is refused by ``toolledger serve`` with one line naming the file, and
the file is left byte for byte as it was."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.faults.serve import EmbeddedServe
from tests.http.servers import ROOT, free_port, write_tokens
from toolledger.embedded import EmbeddedLedger
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
from toolledger.producers.client import TrustedContext
from toolledger.settings import LedgerSettings

AGENT = TrustedContext("acme", "alice")


async def _ledger_with_calls(data: Path, calls: int = 20) -> None:
    registry = helpdesk_registry(HelpdeskStore(data / "helpdesk.db"))
    async with EmbeddedLedger(
        LedgerSettings(path=data / "ledger.db", create=True), registry
    ) as ledger:
        for n in range(calls):
            done = await ledger.client.call(
                "create_ticket", {"title": f"t{n}"}, idempotency_key=f"k{n}", context=AGENT
            )
            assert done.ok, done


def _serve(workdir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``toolledger serve`` on the data directory; it must refuse and exit by itself."""
    tokens = write_tokens(workdir / "tokens.json")
    command = [sys.executable, "-m", "toolledger.cli", "serve", "--port", "1"]
    command += ["--data", str(workdir / "data"), "--tokens", str(tokens), "--demo", *extra]
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
    "deleted": (_delete, "was deleted or moved"),
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
    # --create makes a ledger only where none ever was: it never replaces one
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


def _one_line(refused: subprocess.CompletedProcess[str]) -> str:
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    message = (refused.stdout + refused.stderr).strip()
    assert len(message.splitlines()) == 1, message
    assert "Traceback" not in message
    return message


def _effects(data: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(data / "helpdesk.db") as conn:
        rows = conn.execute(
            "SELECT idempotency_key, COUNT(*) FROM effects GROUP BY idempotency_key ORDER BY 1"
        ).fetchall()
    return [(str(k), int(n)) for k, n in rows]


@pytest.mark.parametrize(
    "left",
    [
        ("ledger.db.id", "ledger.db.lock", "helpdesk.db"),  # ledger.db deleted: the probe's case
        ("ledger.db.id",),
        ("ledger.db.lock",),
        ("ledger.db-shm",),
        ("helpdesk.db",),  # every trace of the ledger deleted, not its tools' store
    ],
    ids=lambda left: "+".join(left),
)
async def test_serve_create_where_a_ledger_was_refuses_and_runs_nothing_again(
    tmp_path: Path, left: tuple[str, ...]
) -> None:
    data = tmp_path / "data"
    await _ledger_with_calls(data)
    effects = _effects(data)
    assert [n for _, n in effects] == [1] * 20
    keep = set(left) | ({"helpdesk.db-wal", "helpdesk.db-shm"} if "helpdesk.db" in left else set())
    for path in data.iterdir():
        if path.name not in keep:
            path.unlink()
    if "ledger.db-shm" in left and not (data / "ledger.db-shm").exists():
        (data / "ledger.db-shm").write_bytes(b"\x00" * 32768)
    kept = {p.name: _digest(p) for p in data.iterdir() if not p.name.endswith("-shm")}
    for extra in (("--create",), ()):
        message = _one_line(_serve(tmp_path, *extra))
        assert str(data / "ledger.db") in message, message
        assert "deleted or moved" in message and "delete the whole directory" in message
    # nothing made, nothing run (a reader of a store's WAL writes its shared memory)
    assert {p.name: _digest(p) for p in data.iterdir() if not p.name.endswith("-shm")} == kept
    if "helpdesk.db" in left:
        assert _effects(data) == effects


async def test_serve_create_in_a_directory_that_never_held_a_ledger_makes_one(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("the operator's notes\n")
    assert "does not exist" in _one_line(_serve(tmp_path))  # not new: only with --create
    server = EmbeddedServe.new(tmp_path, "--create", data=data)
    server.start()
    try:
        async with server.client() as client:
            ran = await client.post(
                "/v1/tools/create_ticket/calls",
                json={"arguments": {"title": "first"}},
                headers={"Idempotency-Key": "first"},
            )
        assert ran.status_code == 200, ran.text
    finally:
        server.stop()
    assert (data / "ledger.db").exists() and server.effects("create_ticket", "first") == 1


def _make_serve(dev: Path, port: int, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = dev.parent / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["make", "--no-print-directory", "serve", f"DEV_DIR={dev}", f"SERVE_PORT={port}"],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # make and the server it starts: one group to stop
        )
    return process, log


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def _ready(process: subprocess.Popen[bytes], log: Path, port: int) -> str:
    """The agent token ``make serve`` printed, once the server answers."""
    deadline = time.monotonic() + 90
    while True:
        assert process.poll() is None, log.read_text()
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                break
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    found = re.search(r"AGENT=(\S+)", log.read_text())
    assert found is not None, log.read_text()
    return found.group(1)


def _charge(port: int, token: str) -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{port}/v1/tools/create_ticket/calls",
        json={"arguments": {"title": "make serve"}},
        headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "make-1"},
        timeout=60,
    )


def test_make_serve_keeps_its_ledger_and_refuses_once_it_was_deleted(tmp_path: Path) -> None:
    dev, port = tmp_path / "dev", free_port()
    first, log = _make_serve(dev, port, "first")
    try:
        ran = _charge(port, _ready(first, log, port))
        assert ran.status_code == 200 and "idempotent-replayed" not in ran.headers, ran.text
    finally:
        _stop(first)
    second, log = _make_serve(dev, port, "second")
    try:
        again = _charge(port, _ready(second, log, port))  # new tokens, the same ledger
        assert again.status_code == 200, again.text
        assert again.headers["idempotent-replayed"] == "true"
    finally:
        _stop(second)
    data = dev / "data"
    (data / "ledger.db").unlink()
    for side in ("ledger.db-wal", "ledger.db-shm"):
        (data / side).unlink(missing_ok=True)
    third, log = _make_serve(dev, port, "third")
    try:
        assert third.wait(timeout=90) != 0
    finally:
        _stop(third)
    refusal = [line for line in log.read_text().splitlines() if "ledger.db" in line]
    assert len(refusal) == 1 and "deleted or moved" in refusal[0], log.read_text()
    assert not (data / "ledger.db").exists()
    assert _effects(data) == [("make-1", 1)]
