"""The seams between the layers (docs/architecture.md): the embedded log writes the projection
it is handed, the executor loads no read model, and the read side's queries are written once
over a dialect."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from toolledger.processors.ledger.rows import event_json
from toolledger.processors.ports import CommitBatch
from toolledger.processors.runtime.sqlite_ledger import ReadModel, SqliteLedger
from toolledger.projections import search
from toolledger.projections.dialect import POSTGRES, SQLITE
from toolledger.projections.sqlite import SqliteReadModel
from toolledger.schemas.calls import CallFilter
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.events import Envelope, Event, ToolCallRejected
from toolledger.schemas.keys import CallKey


class Recording(SqliteReadModel):
    """The SQLite read model, noting what the ledger asks of it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def derive(self, conn: sqlite3.Connection, events: Sequence[tuple[int, int, Event]]) -> None:
        self.calls.append(f"derive {[seq for seq, _, _ in events]}")
        super().derive(conn, events)

    def drop(self, conn: sqlite3.Connection) -> None:
        self.calls.append("drop")
        super().drop(conn)


def test_the_ledger_derives_the_read_model_it_is_handed(tmp_path: Path) -> None:
    read_model = Recording()
    typed: ReadModel = read_model  # the SQLite read model is a ReadModel
    log = SqliteLedger(tmp_path / "ledger.db", create=True, read_model=typed)
    try:
        assert log.read_model is read_model
        assert read_model.calls == []
        tables = {r[0] for r in log.conn.execute("SELECT name FROM sqlite_master")}
        assert {"tool_calls", "events", "audit_events"} <= tables
        refused = ToolCallRejected(
            envelope=Envelope(
                event_id="i1/rejected/1",
                call_key=str(CallKey("t", "op", "k")),
                tenant_id="t",
                tool="op",
                tool_version="",
                idempotency_key="k",
                args_digest="",
                intent_id="i1",
                occurred_at=datetime.now(UTC),
            ),
            error=ErrorInfo.of(ErrorCode.VALIDATION_FAILED, "no"),
        )
        log.write(CommitBatch(), [(0, event_json(refused))])
        assert read_model.calls == []  # the write derived nothing
        assert log.tail() == 1  # derived after the write, in a transaction of its own
        assert read_model.calls == ["derive [1]"]
    finally:
        log.close()


def test_the_executor_loads_no_read_model() -> None:
    code = (
        "import sys, toolledger.processors.runtime.embedded, toolledger.processors.runtime.kafka\n"
        "import toolledger.processors.pipeline\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('toolledger.') and "
        "m.split('.')[1] not in ('schemas', 'processors'))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


def test_a_read_query_differs_between_the_dialects_only_in_its_placeholders() -> None:
    where = CallFilter(tool="t", idempotency_key="k", run_id="r")
    pairs = [
        (search.get_sql(SQLITE, "a", "c"), search.get_sql(POSTGRES, "a", "c")),
        (
            search.search_sql(SQLITE, "a", where, 10, "c"),
            search.search_sql(POSTGRES, "a", where, 10, "c"),
        ),
        (search.events_sql(SQLITE, "a", "c"), search.events_sql(POSTGRES, "a", "c")),
        (search.applied_sql(SQLITE, "e"), search.applied_sql(POSTGRES, "e")),
    ]
    for (lite, lite_params), (pg, pg_params) in pairs:
        assert "%s" not in lite and "?" not in pg
        assert lite.replace("?", "%s") == pg
        assert list(lite_params) == list(pg_params)
