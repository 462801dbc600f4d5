"""The seams between the layers (docs/architecture.md): the embedded log writes the projection
it is handed, the executor loads no read model, and the read side's queries are written once
over a dialect."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from processors.ledger import CallState
from processors.runtime.sqlite_log import LogProjection, SqliteLog
from projections import search
from projections.dialect import POSTGRES, SQLITE
from projections.sqlite import SqliteProjection
from schemas.calls import CallFilter
from schemas.events import Event
from schemas.topics import Position


class Recording(SqliteProjection):
    """The SQLite projection, noting what the log asks of it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def migrate(self, conn: sqlite3.Connection) -> None:
        self.calls.append("migrate")
        super().migrate(conn)

    def apply(
        self,
        conn: sqlite3.Connection,
        events: Sequence[tuple[Event, Position]],
        states: Mapping[str, CallState] | None = None,
    ) -> None:
        self.calls.append(f"apply {len(events)}")
        super().apply(conn, events, states)

    def drop(self, conn: sqlite3.Connection) -> None:
        self.calls.append("drop")
        super().drop(conn)


def test_the_log_writes_the_projection_it_is_handed(tmp_path: Path) -> None:
    projection = Recording()
    typed: LogProjection = projection  # the SQLite projection is a LogProjection
    log = SqliteLog(tmp_path / "ledger.db", create=True, projection=typed)
    try:
        assert log.projection is projection
        assert projection.calls == ["migrate"]  # its tables are made when the file opens
        tables = {r[0] for r in log.conn.execute("SELECT name FROM sqlite_master")}
        assert {"tool_calls", "tool_call_events"} <= tables
        assert log.rebuild_projections() == 0
        assert projection.calls == ["migrate", "drop", "apply 0"]
    finally:
        log.close()


def test_the_executor_loads_no_read_model() -> None:
    code = (
        "import sys, processors.runtime.embedded, processors.runtime.kafka, processors.pipeline\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('projections', 'producers', 'toolledger'))\n"
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
