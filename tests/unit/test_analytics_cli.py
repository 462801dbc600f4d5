"""``toolledger report`` and ``toolledger export``: bad input gets one clear line and exit
code 2, and nothing is written (the commands on real data:
tests/integration/test_analytics_backends.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from toolledger.cli import app


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    """A directory with an (empty) ledger file of the read model's two tables."""
    data = tmp_path / "data"
    data.mkdir()
    db = sqlite3.connect(data / "ledger.db")
    db.execute("CREATE TABLE tool_calls (call_id TEXT)")
    db.execute("CREATE TABLE tool_call_events (seq INTEGER)")
    db.close()
    return data


def refused(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 2, result.output
    return " ".join(result.output.split())


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--run", "r", "--since", "2026-12-01"], "not both"),
        (["--since", "2026-12-01"], "the window: --since and --until"),
        ([], "give --run RUN_ID"),
        (["--run", "r", "--format", "pdf"], "--format 'pdf': give one of json, md, html"),
        (["--since", "yesterday", "--until", "2026-12-02"], "--since 'yesterday' is not an ISO"),
        (["--since", "2026-12-02", "--until", "2026-12-01"], "must be after --since"),
    ],
)
def test_report_refuses_bad_input(ledger: Path, args: list[str], says: str) -> None:
    assert says in refused("report", *args, "--data", str(ledger))


def test_report_and_export_want_one_backend(ledger: Path, tmp_path: Path) -> None:
    both = ["--data", str(ledger), "--postgres", "postgresql://nowhere/x"]
    assert "give the embedded ledger (--data DIR) or PostgreSQL" in refused(
        "report", "--run", "r", *both
    )
    missing = tmp_path / "nothing-here"
    assert f"no embedded ledger in {missing}" in refused(
        "report", "--run", "r", "--data", str(missing)
    )
    window = ["--since", "2026-12-01", "--until", "2026-12-02"]
    out = tmp_path / "out"
    assert "give one of parquet, csv, jsonl" in refused(
        "export", *window, "--format", "xml", "--out", str(out), "--data", str(ledger)
    )
    assert "give the window" in refused("export", "--out", str(out), "--data", str(ledger))
    assert not out.exists()
    (out / "tool_calls").mkdir(parents=True)
    (out / "tool_calls" / "mine.txt").write_text("keep me")
    assert "is not empty: export into a new directory" in refused(
        "export", *window, "--out", str(out), "--data", str(ledger)
    )
    assert (out / "tool_calls" / "mine.txt").read_text() == "keep me"
