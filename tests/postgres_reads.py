"""Whole-table reads of a PostgreSQL projection, for the tests and benchmarks that compare
what it holds (the product reads it through :class:`projections.postgres.PostgresCalls`).

They go through the projection's own pool, so the JSON columns read as their text (as the
product's reads and SQLite's do)."""

from __future__ import annotations

import json
from typing import Any

from psycopg import sql
from psycopg.rows import dict_row

from toolledger.projections.postgres import _CALL_COLUMNS, _EVENT_COLUMNS, PostgresProjection, _ids


async def _rows(
    projection: PostgresProjection, query: sql.Composed | sql.SQL
) -> list[dict[str, Any]]:
    async with (
        projection._transaction("read rows") as conn,
        conn.cursor(row_factory=dict_row) as cur,
    ):
        await cur.execute(query)
        return await cur.fetchall()


async def call_rows(projection: PostgresProjection) -> list[dict[str, Any]]:
    """Every ``tool_calls`` row (the columns of ``CALL_COLUMNS`` and the analysts'), by
    ``call_id``."""
    return await _rows(
        projection,
        sql.SQL("SELECT {} FROM tool_calls ORDER BY call_id").format(_ids(_CALL_COLUMNS)),
    )


async def event_rows(projection: PostgresProjection) -> list[dict[str, Any]]:
    """Every audit row (``EVENT_COLUMNS`` and the analysts': ``seq`` left out), by
    ``event_id``."""
    return await _rows(
        projection,
        sql.SQL("SELECT {} FROM tool_call_events ORDER BY event_id").format(_ids(_EVENT_COLUMNS)),
    )


async def dead_letter_rows(projection: PostgresProjection) -> list[dict[str, Any]]:
    """Every dead letter (topic, partition, offset, reason, payload, record_key, headers),
    by topic and place."""
    rows = await _rows(
        projection,
        sql.SQL(
            'SELECT topic, partition, "offset", reason, payload, record_key, headers '
            'FROM dead_letters ORDER BY topic, partition, "offset"'
        ),
    )
    # jsonb reads as its text on the pool's connections: the headers' list
    return [row | {"headers": json.loads(row["headers"])} for row in rows]


async def dead_letter_reasons(
    projection: PostgresProjection, topic: str | None = None
) -> list[str]:
    """The reasons of the dead letters (of ``topic``, if given), in the order recorded."""
    rows = await _rows(
        projection,
        sql.SQL(
            "SELECT reason FROM dead_letters WHERE {topic}::text IS NULL OR topic = {topic} "
            "ORDER BY id"
        ).format(topic=sql.Literal(topic)),
    )
    return [str(row["reason"]) for row in rows]


async def dead_letter_count(projection: PostgresProjection) -> int:
    (row,) = await _rows(projection, sql.SQL("SELECT count(*) AS n FROM dead_letters"))
    return int(row["n"])
