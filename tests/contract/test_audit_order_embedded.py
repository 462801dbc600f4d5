"""The audit order is the log's on the embedded backend too (issue 31): after a mixed workload
and two call groups, ``toolledger replay`` run twice gives back every table and view of the
ledger file, every column and the order of the rows included (tests/dumps.py), as the live
ledger wrote them. The audit position of an event is its place in the file's log (``seq``)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.contract.conftest import open_harness
from tests.contract.embedded import EmbeddedHarness
from tests.dumps import Dump, differences, dump_sqlite
from tests.unit.test_group_replay import submit_both
from tests.workload import mixed_workload
from toolledger.cli import app

# the ledger's own bookkeeping, not the log's: its epoch moves at every open, its write probe
# with readiness checks
VOLATILE = {"meta": frozenset({"v"})}


@pytest.fixture
async def embedded(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[EmbeddedHarness]:
    async for harness in open_harness(request, tmp_path, "embedded"):
        assert isinstance(harness, EmbeddedHarness)
        yield harness


def _dump(path: Path) -> Dump:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return dump_sqlite(conn, VOLATILE)
    finally:
        conn.close()


async def test_two_rebuilds_give_back_every_row_in_the_same_order(
    embedded: EmbeddedHarness, tmp_path: Path
) -> None:
    await mixed_workload(embedded)
    assert embedded.ledger is not None and embedded.ledger.groups is not None
    await submit_both(embedded.ledger.groups)
    await embedded.stop()  # the file to itself: the CLI opens it
    path = tmp_path / "ledger.db"
    live = _dump(path)
    events = live["tool_call_events"]
    assert len(events[1]) > 40 and len(live["tool_call_groups"][1]) == 2
    assert len(live["tool_metrics_daily"][1]) >= 4  # acme and globex, four tools at least
    seq = events[0].index("seq")
    assert [r[seq] for r in events[1]] == sorted(r[seq] for r in events[1])
    for _ in range(2):
        replay = ["replay", "--data", str(tmp_path), "--demo"]
        rebuilt = await asyncio.to_thread(CliRunner().invoke, app, replay)
        assert rebuilt.exit_code == 0, rebuilt.output
        assert differences(live, _dump(path)) == []
