"""``toolledger report`` and ``toolledger export`` (issue 31; docs/evaluation.md,
docs/data-dictionary.md#export): both read the read model of either backend through the read
side (``projections.search.CallReads``): an embedded ledger's file (opened read-only, so a
running ledger keeps it) or the PostgreSQL projection.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, date, datetime, time
from pathlib import Path
from typing import Any, Literal

from toolledger.projections.search import CallReads
from toolledger.schemas.evaluation import Report, report_of

ExportFormat = Literal["parquet", "csv", "jsonl"]
EXPORT_FORMATS: tuple[ExportFormat, ...] = ("parquet", "csv", "jsonl")
LEDGER_FILE = "ledger.db"


class AnalyticsError(Exception):
    """Bad input or a read model that cannot be read: one line for the user."""


def moment(text: str, what: str) -> datetime:
    """An ISO 8601 date (its midnight) or time; without an offset: UTC."""
    try:
        if len(text) == 10:
            return datetime.combine(date.fromisoformat(text), time(), UTC)
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise AnalyticsError(
            f"{what} {text!r} is not an ISO 8601 date or time (2026-12-05, 2026-12-05T08:00Z)"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def window(since: str, until: str) -> tuple[datetime, datetime]:
    start, end = moment(since, "--since"), moment(until, "--until")
    if end <= start:
        raise AnalyticsError(f"--until ({end.isoformat()}) must be after --since")
    return start, end


@contextlib.asynccontextmanager
async def read_side(data: Path | None, postgres: str | None) -> AsyncIterator[CallReads]:
    """The read side of the embedded ledger in ``data`` or of the PostgreSQL projection."""
    if (data is None) == (postgres is None):
        raise AnalyticsError("give the embedded ledger (--data DIR) or PostgreSQL (--postgres)")
    if data is not None:
        from toolledger.projections.sqlite import SqliteCalls

        path = data / LEDGER_FILE
        if not path.is_file():
            raise AnalyticsError(f"no embedded ledger in {data} (no {LEDGER_FILE})")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            yield SqliteCalls(conn)
        finally:
            conn.close()
        return
    assert postgres is not None
    from toolledger.projections.postgres import PostgresCalls, PostgresProjection, ProjectionError

    try:
        async with PostgresProjection(postgres) as projection:
            yield PostgresCalls(projection)
    except ProjectionError as exc:
        raise AnalyticsError(str(exc)) from None


async def report(
    reads: CallReads,
    *,
    tenant_id: str | None,
    run_id: str | None,
    since: datetime | None,
    until: datetime | None,
) -> Report:
    """The report of one run, or of the window ``[since, until)``."""
    if run_id is not None:
        facts = await reads.run_facts(tenant_id, run_id)
        return report_of(facts, tenant_id=tenant_id, run_id=run_id)
    assert since is not None and until is not None
    facts = await reads.window_facts(tenant_id, since, until)
    return report_of(facts, tenant_id=tenant_id, since=since, until=until)


# ------------------------------------------------------------------------------- export


def _schemas() -> dict[str, Any]:
    """The Arrow schema of each exported table (docs/data-dictionary.md#export)."""
    import pyarrow as pa

    text, when = pa.string(), pa.timestamp("us", tz="UTC")
    return {
        "tool_call_events": pa.schema(
            [
                ("seq", pa.int64()),
                ("event_id", text),
                ("log_partition", pa.int32()),
                ("log_offset", pa.int64()),
                ("call_id", text),
                ("call_key", text),
                ("tenant_id", text),
                ("tool_name", text),
                ("idempotency_key", text),
                ("intent_id", text),
                ("run_id", text),
                ("event_type", text),
                ("occurred_at", when),
                ("duration_ms", pa.float64()),
                ("payload_json", text),
                ("day", pa.date32()),
            ]
        ),
        "tool_calls": pa.schema(
            [
                ("call_id", text),
                ("call_key", text),
                ("tenant_id", text),
                ("tool_name", text),
                ("tool_version", text),
                ("idempotency_key", text),
                ("args_digest", text),
                ("status", text),
                ("result_json", text),
                ("error_json", text),
                ("attempts", pa.int32()),
                ("rounds", pa.int32()),
                ("reconcile_attempts", pa.int32()),
                ("run_id", text),
                ("step_id", text),
                ("first_intent_id", text),
                ("last_intent_id", text),
                ("created_at", when),
                ("updated_at", when),
                ("expired_at", when),
                ("day", pa.date32()),
            ]
        ),
    }


DAY_OF = {"tool_call_events": "occurred_at", "tool_calls": "created_at"}
"""The time each table is partitioned by (the day of it, in UTC)."""


async def _rows(
    reads: CallReads, table: str, tenant_id: str | None, since: datetime, until: datetime
) -> list[dict[str, Any]]:
    pages = (
        reads.export_events(tenant_id, since, until)
        if table == "tool_call_events"
        else reads.export_calls(tenant_id, since, until)
    )
    rows: list[dict[str, Any]] = []
    async for page in pages:
        for row in page:
            row["day"] = row[DAY_OF[table]].astimezone(UTC).date()
            rows.append(row)
    return rows


def _write(rows: Sequence[dict[str, Any]], schema: Any, target: Path, form: ExportFormat) -> int:
    """``rows`` as files ``target/day=YYYY-MM-DD/part-0.<form>`` (DuckDB's hive partitions)."""
    import duckdb
    import pyarrow as pa

    arrow = pa.Table.from_pylist(list(rows), schema=schema)
    options = {
        "parquet": "FORMAT parquet",
        "csv": "FORMAT csv, HEADER true",
        "jsonl": "FORMAT json, FILE_EXTENSION 'jsonl'",
    }[form]
    with duckdb.connect() as con:
        con.execute("SET TimeZone = 'UTC'")
        con.register("exported", arrow)
        con.execute(
            f"COPY exported TO '{_quoted(target)}' "
            f"({options}, PARTITION_BY (day), FILENAME_PATTERN 'part-{{i}}')"
        )
    return len(rows)


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")


async def export(
    reads: CallReads,
    out: Path,
    form: ExportFormat,
    *,
    tenant_id: str | None,
    since: datetime,
    until: datetime,
) -> dict[str, int]:
    """Write each table's rows of the window under ``out/<table>/``; the rows per table."""
    schemas = _schemas()
    for table in schemas:  # before anything is written
        target = out / table
        if target.exists() and any(target.iterdir()):
            raise AnalyticsError(f"{target} is not empty: export into a new directory")
    written: dict[str, int] = {}
    for table, schema in schemas.items():
        target = out / table
        rows = await _rows(reads, table, tenant_id, since, until)
        target.mkdir(parents=True, exist_ok=True)
        written[table] = _write(rows, schema, target, form) if rows else 0
    return written
