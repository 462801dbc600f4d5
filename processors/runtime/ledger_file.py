"""Checks made on an embedded ledger file *before* anything is written to it.

A ledger file is the only record of which keys ran. If it were silently re-created (deleted,
emptied, its WAL left behind) every old key would execute again; if a damaged file were opened
for writing, the start itself could spread the damage. So the file is inspected first, read
only, and a new ledger is made only when the caller says so (``create``) or in a new, empty
directory, and never where a ledger's traces are (its id file, WAL, shared memory or lock):
such a directory held a ledger, whatever the caller says. Every refusal is one line that names
the file and says what to do.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

SQLITE_MAGIC = b"SQLite format 3\x00"
_SIDE_FILES = ("-wal", "-shm", ".lock", ".id")


class LedgerFileError(RuntimeError):
    """The file is not a usable toolledger database; nothing in it was changed."""


def side_file(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def must_create(path: Path, create: bool | None) -> bool:
    """Whether ``path`` is to be made as a new ledger; raises for a file that must not be
    opened or re-created. ``create``: True to allow a new ledger where none was (no traces of
    one beside ``path``), False to forbid one, None to allow it only in a directory that does
    not exist or is empty."""
    wal = side_file(path, "-wal")
    if not path.exists():
        if wal.exists():
            raise LedgerFileError(
                f"{path} is missing but its write-ahead log {wal.name} is there: the database "
                "was deleted or moved; restore it (a WAL alone is not a ledger)"
            )
        left = traces(path)
        if left:
            raise LedgerFileError(
                f"{path} is missing but {', '.join(p.name for p in left)} of a ledger "
                f"{'is' if len(left) == 1 else 'are'} there: the database was deleted or "
                f"moved; restore it, or delete the whole directory {path.parent} for a new, "
                "empty ledger (whose keys all run again)"
            )
        if create or (create is None and _new_directory(path.parent)):
            return True
        raise LedgerFileError(
            f"{path} does not exist: create a new ledger with 'toolledger init "
            f"{path.parent}' or --create (a new ledger has no keys: each runs again)"
        )
    if not path.is_file():
        raise LedgerFileError(f"{path} is not a regular file")
    if path.stat().st_size == 0:
        raise LedgerFileError(
            f"{path} is empty (0 bytes): a ledger file never is; restore it from a backup. It "
            "was left untouched"
        )
    with path.open("rb") as handle:
        if handle.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
            raise LedgerFileError(
                f"{path} is not an SQLite database (no SQLite header); it was left untouched"
            )
    return False


def read_only(path: Path) -> sqlite3.Connection:
    """A connection that cannot write ``path``. Without a WAL beside it the file is opened as
    immutable, so not even an empty WAL or shared-memory file is created next to it."""
    wal = side_file(path, "-wal")
    mode = "ro" if wal.exists() and wal.stat().st_size > 0 else "ro&immutable=1"
    return sqlite3.connect(f"file:{path}?mode={mode}", uri=True)


FULL_CHECK_MAX_BYTES = 256 << 20


def check_readable(path: Path, *, full_check_max_bytes: int = FULL_CHECK_MAX_BYTES) -> None:
    """Open ``path`` read only and check it before anything is written: every page
    (``PRAGMA quick_check``) up to ``full_check_max_bytes``; above that only the schema and
    the free-page list, so that a start stays within seconds at any ledger size (a damaged
    data page of a large file is then found when it is read: its partition stops loudly)."""
    try:
        conn = read_only(path)
    except sqlite3.Error as exc:
        raise LedgerFileError(f"{path} cannot be opened ({exc}); it was left untouched") from None
    full = path.stat().st_size <= full_check_max_bytes
    check = "PRAGMA quick_check(3)" if full else "SELECT 'ok' FROM sqlite_master LIMIT 1"
    try:
        found = [str(r[0]) for r in conn.execute(check)]
        if not full:
            conn.execute("PRAGMA freelist_count").fetchone()
    except sqlite3.DatabaseError as exc:
        found = [str(exc)]
    finally:
        conn.close()
    if found != ["ok"]:
        raise LedgerFileError(
            f"{path} is damaged ({' '.join('; '.join(found).split())[:200]}): restore it from "
            "a backup; it was "
            "left untouched"
        )


def write_failure(path: Path, exc: BaseException) -> LedgerFileError:
    """One line for a start that could not write: what happened and what to do."""
    text = str(exc)
    errno_ = getattr(exc, "errno", None)
    read_only = errno_ in (errno.EROFS, errno.EACCES) or not os.access(path.parent, os.W_OK)
    if read_only or "readonly" in text or "read-only" in text:
        advice = "the file or its directory is read-only: make both writable"
    elif "full" in text or errno_ == errno.ENOSPC:
        advice = "the disk is full: free space and start again"
    else:
        advice = "check the file and its directory"
    return LedgerFileError(f"{path} could not be written ({text}): {advice}")


def _new_directory(directory: Path) -> bool:
    return not directory.exists() or not any(directory.iterdir())


def traces(path: Path) -> list[Path]:
    """The ledger's files beside it that exist (its WAL, shared memory, lock and id)."""
    return [p for p in (side_file(path, s) for s in _SIDE_FILES) if p.exists()]


def check_identity(path: Path, ledger_id: str | None) -> None:
    """A ledger's id is kept beside its file (``ledger.db.id``): a ``ledger.db`` of another
    ledger put in its place (a wrong backup, a copy from another directory) is refused, as
    its keys are not this ledger's. A file without an id, or a directory without the side
    file, is taken as it is (the id is recorded then)."""
    recorded = _recorded_identity(path)
    if ledger_id is not None and recorded is not None and recorded != ledger_id:
        raise LedgerFileError(
            f"{path} belongs to another ledger (id {ledger_id}; this directory's ledger is "
            f"{recorded}): put this directory's own file back; it was left untouched"
        )


def record_identity(path: Path, ledger_id: str) -> None:
    """Write the ledger's id beside its file (atomically: a new file renamed over the old)."""
    if _recorded_identity(path) == ledger_id:
        return
    side = side_file(path, ".id")
    fresh = side.with_name(side.name + ".new")
    fresh.write_text(ledger_id + "\n")
    os.replace(fresh, side)


def _recorded_identity(path: Path) -> str | None:
    try:
        return side_file(path, ".id").read_text().strip() or None
    except FileNotFoundError:
        return None
