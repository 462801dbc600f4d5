"""``tool_metrics_daily``'s text is portable (projections.governance.DAILY_VIEWS_SQL): run
on SQLite over given day facts, it answers the documented definitions (nearest-rank
percentiles, rates of the day). PostgreSQL runs the same text from migration 0008
(tests/integration/test_analytics_backends.py reads it there)."""

from __future__ import annotations

import sqlite3

from toolledger.projections.governance import DAILY_VIEWS_SQL

CALLS = [  # tenant, tool, day, status, run
    ("acme", "t", "2026-12-05", "SUCCEEDED", "r1"),
    ("acme", "t", "2026-12-05", "SUCCEEDED", "r1"),
    ("acme", "t", "2026-12-05", "FAILED_FINAL", "r2"),
    ("acme", "t", "2026-12-05", "PENDING", None),
    ("acme", "t", "2026-12-05", "UNKNOWN", "r2"),
    ("acme", "t", "2026-12-06", "SUCCEEDED", "r3"),
]
EVENTS = [  # tenant, tool, day, intent, type, error code, duration
    *[
        ("acme", "t", "2026-12-05", f"i{n}", "ToolCallSucceeded", None, float(n))
        for n in range(1, 21)
    ],
    ("acme", "t", "2026-12-05", "i21", "ToolCallRejected", "VALIDATION_FAILED", None),
    ("acme", "t", "2026-12-05", "i22", "ToolCallReplayed", None, None),
    ("acme", "t", "2026-12-05", "i23", "ToolCallRejected", "IDEMPOTENCY_KEY_IN_USE", None),
    ("acme", "t", "2026-12-05", "i24", "ApprovalGranted", None, None),
    ("acme", "t", "2026-12-05", "i25", "ApprovalDenied", None, None),
    ("acme", "t", "2026-12-05", "i26", "ApprovalDenied", None, None),
    ("acme", "t", "2026-12-06", "i27", "ToolCallFailed", "X", 7.5),
]


def test_the_daily_view_runs_on_sqlite_and_answers_the_definitions() -> None:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE call_day_facts (tenant_id, tool_name, day, status, run_id)")
    db.execute(
        "CREATE TABLE event_day_facts "
        "(tenant_id, tool_name, day, intent_id, event_type, error_code, duration_ms)"
    )
    db.executemany("INSERT INTO call_day_facts VALUES (?, ?, ?, ?, ?)", CALLS)
    db.executemany("INSERT INTO event_day_facts VALUES (?, ?, ?, ?, ?, ?, ?)", EVENTS)
    db.executescript(DAILY_VIEWS_SQL)
    cur = db.execute("SELECT * FROM tool_metrics_daily ORDER BY day")
    names = [d[0] for d in cur.description]
    first, second = (dict(zip(names, row, strict=True)) for row in cur.fetchall())

    assert first["day"] == "2026-12-05" and second["day"] == "2026-12-06"
    assert (first["calls"], first["succeeded"], first["pending"], first["unknown"]) == (5, 2, 1, 1)
    assert first["success_rate"] == 2 / 4  # of the finished calls
    assert (first["calls_in_runs"], first["runs"], first["calls_per_run"]) == (4, 2, 2.0)
    assert first["intents"] == 23  # ToolCall* events; the approval decisions are not calls
    assert first["validation_failure_rate"] == 1 / 23
    assert first["duplicate_rate"] == 2 / 23
    assert first["human_rejection_rate"] == 2 / 3
    # nearest rank over the 20 durations 1..20: the 10th and the 19th
    assert (first["p50_duration_ms"], first["p95_duration_ms"]) == (10.0, 19.0)
    assert (second["calls"], second["success_rate"], second["intents"]) == (1, 1.0, 1)
    assert second["p50_duration_ms"] == second["p95_duration_ms"] == 7.5
    assert second["validation_failure_rate"] == 0.0 and second["human_rejection_rate"] is None
