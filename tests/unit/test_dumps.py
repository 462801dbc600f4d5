"""tests/dumps.py on SQLite: a dump holds every table and view in a defined order, leaves
the write-time columns out, and ``differences`` sees a changed value, a changed order and a
missing relation."""

from __future__ import annotations

import sqlite3

from tests.dumps import differences, dump_sqlite


def _db(rows: list[tuple[int, str]]) -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE tool_call_events (seq INTEGER PRIMARY KEY, event_id TEXT)")
    db.execute("CREATE TABLE dead_letters (id INTEGER PRIMARY KEY, reason TEXT, recorded_at)")
    db.execute("CREATE VIEW newest AS SELECT event_id FROM tool_call_events WHERE seq > 1")
    db.executemany("INSERT INTO tool_call_events VALUES (?, ?)", rows)
    db.execute("INSERT INTO dead_letters (reason, recorded_at) VALUES ('bad', datetime('now'))")
    return db


def test_a_dump_is_ordered_and_differences_find_what_changed() -> None:
    rows = [(2, "b"), (1, "a"), (3, "c")]
    dump = dump_sqlite(_db(rows))
    assert dump["tool_call_events"] == (("seq", "event_id"), [(1, "a"), (2, "b"), (3, "c")])
    assert dump["newest"] == (("event_id",), [("b",), ("c",)])
    assert dump["dead_letters"] == (("reason",), [("bad",)])  # id and recorded_at left out
    assert differences(dump, dump_sqlite(_db(list(reversed(rows))))) == []

    moved = dump_sqlite(_db([(1, "a"), (2, "c"), (3, "b")]))  # the same rows, another order
    # the table differs in its order; the view, ordered by its values, does not
    assert [d.split(":")[0] for d in differences(dump, moved)] == ["tool_call_events"]
    fewer = dump_sqlite(_db(rows[:2]))
    assert "tool_call_events: 3 vs 2 rows" in differences(dump, fewer)[1]
    del fewer["newest"]
    assert differences(dump, fewer)[0] == "newest: only before"
