"""``toolledger export`` and ``toolledger report`` on both backends (issue 31): after the mixed
workload (tests/workload.py), the exported files load in DuckDB with the documented schema and
hold every row of the read model, redacted as the audit trail is; the report of a run finds
what the workload did. Through the CLI, as a user runs them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import psycopg
import pytest
from typer.testing import CliRunner

from tests.contract.conftest import open_harness
from tests.contract.harness import Harness
from tests.contract.kafka import KafkaHarness
from tests.workload import REDACTED_CUSTOMER, RUN_A, RUN_B, mixed_workload
from toolledger.cli import app

EVENT_SCHEMA = [
    ("seq", "BIGINT"),
    ("event_id", "VARCHAR"),
    ("log_partition", "INTEGER"),
    ("log_offset", "BIGINT"),
    ("call_id", "VARCHAR"),
    ("call_key", "VARCHAR"),
    ("tenant_id", "VARCHAR"),
    ("tool_name", "VARCHAR"),
    ("idempotency_key", "VARCHAR"),
    ("intent_id", "VARCHAR"),
    ("run_id", "VARCHAR"),
    ("event_type", "VARCHAR"),
    ("occurred_at", "TIMESTAMP WITH TIME ZONE"),
    ("duration_ms", "DOUBLE"),
    ("payload_json", "VARCHAR"),
    ("day", "DATE"),
]
"""docs/data-dictionary.md#export, as DuckDB reads the Parquet files (hive partitions)."""
CALL_COLUMNS = [
    "call_id", "call_key", "tenant_id", "tool_name", "tool_version", "idempotency_key",
    "args_digest", "status", "result_json", "error_json", "attempts", "rounds",
    "reconcile_attempts", "run_id", "step_id", "first_intent_id", "last_intent_id",
    "created_at", "updated_at", "expired_at", "day",
]  # fmt: skip

BACKENDS = ["embedded", pytest.param("kafka", marks=pytest.mark.services)]


async def _worked(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    async for harness in open_harness(request, tmp_path):
        await mixed_workload(harness)
        await harness.call_rows()  # caught up
        yield harness


@pytest.fixture(params=BACKENDS)
async def worked(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    """A backend after the mixed workload, its read model caught up."""
    async for harness in _worked(request, tmp_path):
        yield harness


@pytest.fixture(params=[pytest.param("kafka", marks=pytest.mark.services)])
async def worked_kafka(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[KafkaHarness]:
    """Kafka + PostgreSQL after the mixed workload."""
    async for harness in _worked(request, tmp_path):
        assert isinstance(harness, KafkaHarness)
        yield harness


def backend(harness: Harness) -> list[str]:
    if isinstance(harness, KafkaHarness):
        return ["--postgres", harness.dsn]
    return ["--data", str(harness.workdir)]


async def cli(*args: str) -> str:
    """The command's output (it runs its own event loop: in a thread of its own)."""
    result = await asyncio.to_thread(CliRunner().invoke, app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return str(result.output)


DAY = datetime.now(UTC).date()
WINDOW = [
    *("--since", (DAY - timedelta(days=1)).isoformat()),
    *("--until", (DAY + timedelta(days=2)).isoformat()),
]
READERS = {
    "parquet": "read_parquet('{}/*/*.parquet', hive_partitioning = true)",
    "csv": "read_csv('{}/*/*.csv', hive_partitioning = true)",
    "jsonl": "read_json('{}/*/*.jsonl', format = 'newline_delimited', hive_partitioning = true)",
}


async def test_export_loads_in_duckdb_with_every_row(worked: Harness, tmp_path: Path) -> None:
    events = await worked.event_rows()
    calls = await worked.call_rows()
    for form, reader in READERS.items():
        out = tmp_path / f"export-{form}"
        await cli("export", *WINDOW, "--format", form, "--out", str(out), *backend(worked))
        db = duckdb.connect()
        db.execute("SET TimeZone = 'UTC'")
        exported_events = reader.format(out / "tool_call_events")
        exported_calls = reader.format(out / "tool_calls")
        if form == "parquet":
            described = db.execute(f"DESCRIBE SELECT * FROM {exported_events}").fetchall()
            assert [(c[0], c[1]) for c in described] == EVENT_SCHEMA
        columns = [c[0] for c in db.execute(f"DESCRIBE SELECT * FROM {exported_calls}").fetchall()]
        assert columns == CALL_COLUMNS, form
        got = db.execute(f"SELECT event_id, event_type, day FROM {exported_events}").fetchall()
        assert sorted(e for e, _, _ in got) == sorted(r["event_id"] for r in events), form
        assert {d for _, _, d in got} == {DAY}
        ids = db.execute(f"SELECT call_id, status FROM {exported_calls}").fetchall()
        assert sorted(ids) == sorted((r["call_id"], r["status"]) for r in calls), form
        # the audit trail is redacted: the charge's customer is in no file, only as a hash
        for path in out.rglob("part-0.*"):
            assert REDACTED_CUSTOMER not in path.read_bytes().decode("utf-8", "replace"), path
        started = db.execute(
            f"SELECT payload_json FROM {exported_events} WHERE event_type = 'ToolCallStarted' "
            "AND tool_name = 'charge_card'"
        ).fetchone()
        assert started is not None
        assert "customer_id" in json.loads(json.loads(started[0])["arguments_redacted_json"])
        durations = db.execute(
            f"SELECT count(*) FROM {exported_events} WHERE event_type = 'ToolCallSucceeded' "
            "AND duration_ms IS NULL"
        ).fetchone()
        assert durations == (0,)
    # a window before the workload exports nothing (and the directories say so)
    empty = tmp_path / "empty"
    await cli("export", "--since", "2001-01-01", "--until", "2001-01-02", "--out", str(empty),
        *backend(worked))  # fmt: skip
    assert sorted(p.name for p in empty.iterdir()) == ["tool_call_events", "tool_calls"]
    assert not any(empty.rglob("part-0.*"))


async def test_the_report_of_a_run_finds_what_the_run_did(worked: Harness, tmp_path: Path) -> None:
    found = json.loads(await cli("report", "--run", RUN_A, "--tenant", "acme", *backend(worked)))
    assert found["scope"] == {"tenant_id": "acme", "run_id": RUN_A}
    checks, metrics = found["checks"], found["metrics"]
    assert [(r["tool"], r["field"]) for r in checks["argument_refusals"]] == [
        ("create_ticket", "title")
    ]
    assert [(r["tool"], r["keys"]) for r in checks["repeated_calls"]] == [
        ("create_ticket", ["a-1", "a-2"])
    ]
    assert sorted((r["tool"], r["how"]) for r in checks["recoveries"]) == [
        ("flaky_write", "a later call"),  # a-5 failed for good, a-6 then succeeded
        ("flaky_write", "retried in the call"),  # a-4's first attempt failed
    ]
    assert [r["code"] for r in checks["permission_refusals"]] == ["FORBIDDEN", "TOOL_DISABLED"]
    assert "RETRY_LIMIT_EXCEEDED" in {r["code"] for r in checks["budget_refusals"]}
    assert [(r["tool"], r["reason"]) for r in checks["human_rejections"]] == [
        ("charge_card", "not this one")
    ]
    assert checks["unknowns"] == []
    # duplicates: a-1's replay, and a-11's fourth call (the stored retry limit, replayed)
    assert (metrics["validation_failures"], metrics["duplicates"]) == (1, 2)
    assert (metrics["approvals_granted"], metrics["approvals_denied"]) == (1, 1)
    assert metrics["human_rejection_rate"] == 0.5 and metrics["runs"] == 1
    # seven keyed calls ran (a refusal runs nothing) and a read, a call of the run on every
    # backend
    assert metrics["calls"] == 8 and metrics["calls_in_runs"] == 8

    other = json.loads(await cli("report", "--run", RUN_B, "--tenant", "acme", *backend(worked)))
    assert other["metrics"]["calls"] == 0  # run-b is globex's
    markdown = await cli("report", "--run", RUN_A, "--format", "md", *backend(worked))
    assert markdown.startswith(f"# Evaluation of run {RUN_A}\n") and "| not this one |" in markdown
    page = tmp_path / "report.html"
    await cli("report", "--run", RUN_A, "--format", "html", "--out", str(page), *backend(worked))
    assert "<h1>Evaluation of run run-a</h1>" in page.read_text()
    window = json.loads(await cli("report", *WINDOW, *backend(worked)))
    assert window["metrics"]["runs"] == 2
    assert window["metrics"]["calls"] == metrics["calls"] + 3  # and run-b's three


async def test_postgres_daily_metrics_and_analysts_columns(worked_kafka: KafkaHarness) -> None:
    """tool_metrics_daily, jsonb and duration_ms as an analyst reads them with SQL."""
    async with await psycopg.AsyncConnection.connect(worked_kafka.dsn) as conn:
        row = await (
            await conn.execute(
                "SELECT calls, validation_failures, duplicates, approvals_denied, "
                "validation_failure_rate, p50_duration_ms IS NOT NULL FROM tool_metrics_daily "
                "WHERE tenant_id = 'acme' AND tool_name = 'create_ticket' AND day = %s",
                (DAY,),
            )
        ).fetchone()
        assert row is not None and row[:4] == (2, 1, 1, 0) and row[5]
        typed = await (
            await conn.execute(
                "SELECT payload_json -> 'envelope' ->> 'run_id', duration_ms FROM "
                "tool_call_events WHERE event_type IN ('ApprovalGranted', 'ApprovalDenied') "
                "ORDER BY seq"
            )
        ).fetchall()
        assert typed == [(RUN_A, None), (RUN_A, None)]  # decisions carry the run
        read = await (
            await conn.execute(
                "SELECT status, duration_ms IS NOT NULL FROM tool_calls "
                "WHERE tool_name = 'list_tickets'"
            )
        ).fetchall()
        assert read == [("SUCCEEDED", True)]
