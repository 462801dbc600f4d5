"""kill -9 of ``toolledger serve`` (embedded: executor and group orchestrator in the process)
in the middle of call groups: after the restart every group finishes, and no step or
compensation ran twice."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx

from tests.faults.serve import EmbeddedServe
from toolledger.processors.groups import compensation_key, step_key

SLOW = {"payload": "p", "fault": "slow", "delay_ms": 300}
FINISHED = {"SUCCEEDED", "FAILED", "COMPENSATED", "NEEDS_ATTENTION"}


def _chain(n: int, *, fail: bool) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [
        {"id": "open", "tool": "create_ticket", "arguments": {"title": "chain"}}
    ]
    for i in range(n):
        steps.append(
            {
                "id": f"w{i}",
                "tool": "flaky_write",
                "arguments": SLOW,
                "depends_on": [steps[-1]["id"]],
            }
        )
    if fail:
        last = steps[-1]["id"]
        bad = {"payload": "x", "fault": "final"}
        steps.append({"id": "boom", "tool": "flaky_write", "arguments": bad, "depends_on": [last]})
    return {"run_id": "run-kill", "steps": steps}


def _all_effects(server: EmbeddedServe) -> dict[tuple[str, str], int]:
    with sqlite3.connect(server.data / "helpdesk.db", timeout=30) as conn:
        rows = conn.execute(
            "SELECT tool, idempotency_key, COUNT(*) FROM effects GROUP BY tool, idempotency_key"
        ).fetchall()
    return {(tool, key): n for tool, key, n in rows}


async def _finished(
    client: httpx.AsyncClient, group_id: str, timeout_s: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        got = await client.get(f"/v1/groups/{group_id}")
        assert got.status_code == 200, got.text
        body: dict[str, Any] = got.json()
        if body["status"] in FINISHED:
            return body
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.2)


async def test_kill_9_in_the_middle_of_groups_runs_nothing_twice_and_they_finish(
    tmp_path: Path,
) -> None:
    server = EmbeddedServe.new(tmp_path, "--create")
    server.start()
    groups = {"g-ok": _chain(4, fail=False), "g-fail": _chain(3, fail=True)}
    try:
        ids: dict[str, str] = {}
        async with server.client() as client:
            for key, body in groups.items():
                answered = await client.post(
                    "/v1/groups", json=body, headers={"Idempotency-Key": key, "Prefer": "wait=0"}
                )
                assert answered.status_code == 202, answered.text
                ids[key] = answered.json()["group_id"]
            await asyncio.sleep(0.7)  # a step or two in: the rest is recorded as to come
            midway = await client.get(f"/v1/groups/{ids['g-ok']}")
            assert midway.json()["status"] == "RUNNING", midway.text
        server.kill()
        server.start()
        async with server.client() as client:
            ok = await _finished(client, ids["g-ok"])
            failed = await _finished(client, ids["g-fail"])
        assert ok["status"] == "SUCCEEDED", ok
        assert failed["status"] == "COMPENSATED", failed
        effects = _all_effects(server)
        assert max(effects.values()) == 1, effects  # no double anywhere
        for key, body in groups.items():
            for step in body["steps"]:
                if step["id"] == "boom":
                    continue
                assert effects.get((step["tool"], step_key(key, step["id"]))) == 1, step
        closed = effects.get(("close_ticket", compensation_key("g-fail", "open")))
        assert closed == 1  # the compensation ran, once
    finally:
        server.stop()
