"""The governance read side over PostgreSQL (migration 0002): the scenarios of
``tests/unit/test_governance_views.py``, run on both databases, must pass on each and answer
the same on both.

Needs ``TOOLLEDGER_POSTGRES`` (see ``tests/services.py``); each test gets a fresh database.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, date, datetime
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.services import Services
from tests.unit.test_governance_views import (
    SCENARIOS,
    STATS,
    SWITCHES,
    Batch,
    Scenario,
    rates_match,
    run_on_sqlite,
    snapshot,
    sqlite_load,
    sqlite_with,
    view_rows,
)
from toolledger.projections.dialect import POSTGRES, sqlite_time
from toolledger.projections.postgres import PostgresCalls, PostgresProjection, load_migrations
from toolledger.projections.rows import Position
from toolledger.projections.search import recent_sql
from toolledger.projections.sqlite import GOVERNANCE_VIEWS, SqliteCalls
from toolledger.schemas.calls import STAT_COUNTS, STAT_RATES, CallView, encode_recent_cursor
from toolledger.schemas.status import CallStatus

pytestmark = pytest.mark.services

CONSUMER = "governance-test"
TOPIC = "test.outcomes"


@pytest.fixture
async def dsn(services: Services) -> str:
    return await services.fresh_database()


@pytest.fixture
async def projection(dsn: str) -> AsyncIterator[PostgresProjection]:
    async with PostgresProjection(dsn) as p:
        yield p


async def run_on_postgres(projection: PostgresProjection, scenario: Scenario) -> Any:
    async def load(batch: Batch) -> None:
        await projection.apply(batch, CONSUMER, TOPIC)

    return await scenario.run(PostgresCalls(projection), load)


async def pg_view_rows(dsn: str, view: str) -> list[dict[str, Any]]:
    async with (
        await psycopg.AsyncConnection.connect(dsn) as conn,
        conn.cursor(row_factory=dict_row) as cur,
    ):
        await cur.execute(f"SELECT * FROM {view}".encode())
        return await cur.fetchall()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
async def test_scenario_on_postgres_answers_as_on_sqlite(
    projection: PostgresProjection, scenario: Scenario
) -> None:
    on_postgres = await run_on_postgres(projection, scenario)
    lite, on_sqlite = await run_on_sqlite(scenario)
    assert on_postgres == on_sqlite
    assert await snapshot(PostgresCalls(projection)) == await snapshot(SqliteCalls(lite))


def comparable(rows: list[dict[str, Any]]) -> list[tuple[tuple[str, Any], ...]]:
    """Rows of either database in one form: times as the SQLite views' UTC text, days as ISO
    dates, booleans as 0/1, in a stable order; without ``seq``, the audit position, which each
    database derives from its own log's positions (PostgreSQL: 0008_analytics.sql; the embedded
    file: its log's sequence)."""

    def value(v: Any) -> Any:
        if isinstance(v, datetime):
            return sqlite_time(v)
        if isinstance(v, date):
            return v.isoformat()
        if isinstance(v, bool):
            return int(v)
        return v

    return sorted(
        (tuple(sorted((k, value(v)) for k, v in row.items() if k != "seq")) for row in rows),
        key=repr,
    )


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
async def test_every_view_has_the_same_rows_as_in_sqlite(
    projection: PostgresProjection, dsn: str, scenario: Scenario
) -> None:
    await run_on_postgres(projection, scenario)
    lite, _ = await run_on_sqlite(scenario)
    for view in GOVERNANCE_VIEWS:
        pg_rows = await pg_view_rows(dsn, view)
        assert comparable(pg_rows) == comparable(view_rows(lite, view)), view
    if scenario is SWITCHES:  # a switch is in every partition: once in switch_changes
        assert len(await pg_view_rows(dsn, "switch_changes")) == 10


async def test_all_scenarios_in_one_database_answer_as_sqlite(
    projection: PostgresProjection,
) -> None:
    """Every scenario's events together (tenants, runs and ids overlap), then a rebuild."""
    lite = sqlite_with()
    offset = 0
    for scenario in SCENARIOS:
        # one log: positions must grow, so shift each scenario's offsets
        batch = [(e, Position(p.partition, p.offset + offset)) for e, p in scenario.events()]
        offset += len(batch)
        await projection.apply(batch, CONSUMER, TOPIC)
        sqlite_load(lite, batch)
    live = await snapshot(PostgresCalls(projection))
    assert live == await snapshot(SqliteCalls(lite))
    assert live["stats/None"]["totals"]["calls"] > 0 and live["switches/acme"]

    events = [(e, p) for scenario in SCENARIOS for e, p in scenario.events()]
    await projection.reset()  # toolledger replay: empty, then fold the log again
    await projection.apply(
        [(e, Position(p.partition, i)) for i, (e, p) in enumerate(events)], CONSUMER, TOPIC
    )
    assert await snapshot(PostgresCalls(projection)) == live


def by_key(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda row: (row["tenant_id"], row.get("tool_name", "")))


async def test_metrics_views_in_postgres(projection: PostgresProjection, dsn: str) -> None:
    await run_on_postgres(projection, STATS)
    lite, _ = await run_on_sqlite(STATS)
    for view in ("tool_metrics", "tenant_metrics"):
        rows = await pg_view_rows(dsn, view)
        assert rows
        rates_match(rows)
        assert by_key(rows) == by_key(view_rows(lite, view))
        assert all(type(r[c]) is int for r in rows for c in STAT_COUNTS)
        assert all(r[c] is None or type(r[c]) is float for r in rows for c in STAT_RATES)
    approvals = {r["approval_id"]: r for r in await pg_view_rows(dsn, "approvals")}
    assert {k: (r["state"], r["status"]) for k, r in approvals.items()} == {
        "ap-c8": ("consumed", "consumed"),
        "ap-c9": ("denied", "denied"),
        "ap-c10": ("pending", "pending"),
        "ap-c11": ("pending", "expired"),  # by the database's clock
    }


async def test_migration_0002_is_applied_and_recorded(dsn: str) -> None:
    versions = [m.version for m in load_migrations()]
    assert versions[:2] == ["0001", "0002"]
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT version FROM schema_migrations ORDER BY version")
        assert [r[0] for r in await cur.fetchall()] == versions
        cur = await conn.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'tool_call_events'"
        )
        indexes = {r[0] for r in await cur.fetchall()}
        assert {"tool_call_events_by_approval", "tool_call_events_governance"} <= indexes
        assert "tool_call_events_by_run" in indexes  # from 0001: the run budgets use it


async def test_the_recent_calls_are_read_from_their_index(dsn: str) -> None:
    """Migration 0006: a page of the recent calls, first or later, is a backward scan of
    ``tool_calls_recent`` (the planner told to avoid a sort of the whole table)."""
    first = recent_sql(POSTGRES, "acme", 50, None)
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    later = recent_sql(POSTGRES, "acme", 50, encode_recent_cursor(_view_at(at)))
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute("SET enable_seqscan = off")
        await conn.execute("SET enable_sort = off")
        for sql, params in (first, later):
            cur = await conn.execute(f"EXPLAIN {sql}".encode(), params)
            plan = "\n".join(r[0] for r in await cur.fetchall())
            assert "Index Scan Backward using tool_calls_recent" in plan, plan
            assert "Sort" not in plan, plan


def _view_at(created_at: datetime) -> CallView:
    return CallView(
        call_id="call_" + "0" * 32,
        tenant_id="acme",
        tool="t",
        tool_version="1",
        idempotency_key="k",
        args_digest="d",
        status=CallStatus.SUCCEEDED,
        ok=True,
        attempts=1,
        created_at=created_at,
        updated_at=created_at,
        last_event_id="e",
        last_intent_id="i",
    )
