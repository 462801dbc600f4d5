"""``toolledger replay`` rebuilds the call groups' read model (``tool_call_groups`` and
``tool_call_group_steps``) from the group log: the rows after a rebuild are the rows the
orchestrator wrote, ``updated_at`` included (each stored event carries its time), whatever
happened to the read model in between. Embedded ledger here; PostgreSQL in
``tests/integration/test_group_replay_postgres.py``."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from toolledger.embedded import EmbeddedLedger
from toolledger.processors.groups.codec import appended_at, decode_event, encode_event
from toolledger.processors.groups.core import GroupResumed
from toolledger.processors.runtime.group_runner import GroupRunner
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
from toolledger.settings import LedgerSettings

ROOT = Path(__file__).resolve().parents[2]

CHAIN = {
    "run_id": "run-replay",
    "steps": [
        {"id": "open", "tool": "create_ticket", "arguments": {"title": "replayed"}},
        {
            "id": "close",
            "tool": "close_ticket",
            "arguments": {"ticket_id": {"$from": "open", "path": "ticket_id"}},
            "depends_on": ["open"],
        },
    ],
}
COMPENSATED = {
    "run_id": "run-replay",
    "steps": [
        {"id": "first", "tool": "create_ticket", "arguments": {"title": "undone"}},
        {
            "id": "boom",
            "tool": "flaky_write",
            "arguments": {"payload": "x", "fault": "final"},
            "depends_on": ["first"],
        },
    ],
}
READ_MODEL = (
    "SELECT * FROM tool_call_groups ORDER BY group_id",
    "SELECT * FROM tool_call_group_steps ORDER BY group_id, step_id",
)


def read_model(ledger_file: Path) -> list[list[tuple[Any, ...]]]:
    with sqlite3.connect(ledger_file) as conn:
        return [conn.execute(sql).fetchall() for sql in READ_MODEL]


async def submit_both(groups: GroupRunner) -> list[str]:
    """CHAIN and COMPENSATED, run to their end; their group ids."""
    statuses, ids = [], []
    for body in (CHAIN, COMPENSATED):
        answer = await groups.submit(
            tenant_id="acme",
            principal="agent-a",
            scopes=["tools:call"],
            group_key=f"replay-{uuid.uuid4().hex}",
            body=body,
            wait_s=30,
        )
        assert answer.error is None and answer.view is not None, answer
        statuses.append(answer.view.status)
        ids.append(answer.view.group_id)
    assert statuses == ["SUCCEEDED", "COMPENSATED"], statuses
    return ids


async def run_groups(data: Path) -> list[str]:
    store = HelpdeskStore(data / "helpdesk.db")
    try:
        async with EmbeddedLedger(
            LedgerSettings(path=data / "ledger.db", create=True), helpdesk_registry(store)
        ) as led:
            assert led.groups is not None
            return await submit_both(led.groups)
    finally:
        store.close()


def replay(data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolledger.cli", "replay", "--data", str(data), "--demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_replay_rebuilds_the_group_read_model_as_it_was(tmp_path: Path) -> None:
    ids = await run_groups(tmp_path)
    ledger_file = tmp_path / "ledger.db"
    written = read_model(ledger_file)
    assert [row[0] for row in written[0]] == sorted(ids)
    assert len(written[1]) == 4  # two steps each

    with sqlite3.connect(ledger_file) as conn:  # the read model damaged or lost
        conn.execute("DELETE FROM tool_call_group_steps")
        conn.execute("UPDATE tool_call_groups SET status = 'RUNNING', view_json = '{}'")

    ran = replay(tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "2 call groups" in ran.stdout, ran.stdout
    assert read_model(ledger_file) == written  # the same rows, updated_at included

    again = replay(tmp_path)  # a rebuild of a rebuilt model changes nothing
    assert again.returncode == 0 and read_model(ledger_file) == written


async def test_a_groups_updated_at_is_its_last_events_time_not_the_time_it_is_read(
    tmp_path: Path,
) -> None:
    """The resource the runner serves (driven here, or loaded after a restart) and the stored
    read model agree: ``updated_at`` is when the group's last event was appended."""
    store = HelpdeskStore(tmp_path / "helpdesk.db")
    try:
        async with EmbeddedLedger(
            LedgerSettings(path=tmp_path / "ledger.db", create=True), helpdesk_registry(store)
        ) as led:
            assert led.groups is not None
            ids = await submit_both(led.groups)
            served = [await led.groups.view("acme", group_id) for group_id in ids]
            assert served == [await led.groups.view("acme", group_id) for group_id in ids]
        async with EmbeddedLedger(
            LedgerSettings(path=tmp_path / "ledger.db"), helpdesk_registry(store)
        ) as led:
            assert led.groups is not None
            reloaded = [await led.groups.view("acme", group_id) for group_id in ids]
    finally:
        store.close()
    assert reloaded == served
    with sqlite3.connect(tmp_path / "ledger.db") as conn:
        last = {
            group_id: appended_at(text)
            for group_id, text in conn.execute(
                "SELECT group_id, event_json FROM group_log ORDER BY seq"
            )
        }
    assert [v.updated_at if v else None for v in served] == [last[i] for i in ids]


async def test_a_group_whose_tools_are_gone_is_reported_and_left_out(tmp_path: Path) -> None:
    await run_groups(tmp_path)
    with sqlite3.connect(tmp_path / "ledger.db") as conn:  # as if a tool were renamed since
        conn.execute(
            "UPDATE group_log SET event_json = replace(event_json, '\"close_ticket\"',"
            " '\"gone_tool\"') WHERE event_json LIKE '%GroupSubmitted%'"
        )
    ran = replay(tmp_path)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "1 call groups no longer decode" in ran.stdout, ran.stdout
    rows = read_model(tmp_path / "ledger.db")
    assert len(rows[0]) == 1  # the other group is rebuilt


def test_stored_events_carry_their_time_and_older_ones_still_decode() -> None:
    from datetime import UTC, datetime

    at = datetime(2026, 12, 2, 14, 0, tzinfo=UTC)
    text = encode_event(GroupResumed(), at=at)
    assert appended_at(text) == at
    assert isinstance(decode_event(text, {}, 10), GroupResumed)
    old = encode_event(GroupResumed())  # stored before events carried their time
    assert appended_at(old) is None and isinstance(decode_event(old, {}, 10), GroupResumed)
