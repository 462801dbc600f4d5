"""Long-running tools over HTTP, on both backends (``export_tickets``, a real background job
that writes a file): the call stays PENDING with its ``job``; a retry answers 202 with the
same job and starts nothing; the job reports (``POST /v1/calls/{id}/job``) or the sweeper's
poll finishes it, whichever comes first; a cancel ends it CANCELLED."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any

import httpx

from tests.http.helpers import assert_problem, post_call
from tests.http.servers import GLOBEX_REPORTER, JOB_REPORTER, OPERATOR, Server

SLOW = {"delay_ms": 60_000}  # the job would take a minute: a report or a cancel ends it first


async def _started(client: httpx.AsyncClient, key: str, args: dict[str, Any]) -> dict[str, Any]:
    first = await post_call(client, "export_tickets", args, key=key, wait=5)
    assert first.status_code == 202, first.text
    call: dict[str, Any] = first.json()
    assert call["status"] == "PENDING" and call["job"]["status"] == "running"
    return call


async def _final(client: httpx.AsyncClient, call_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        got = (await client.get(f"/v1/calls/{call_id}")).json()
        if got["status"] != "PENDING":
            return got  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, got
        await asyncio.sleep(0.1)


async def test_a_retry_returns_the_same_job_and_the_poll_finishes_it(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    call = await _started(client, key, {"delay_ms": 500})
    again = await post_call(client, "export_tickets", {"delay_ms": 500}, key=key, wait=0)
    assert again.status_code == 202, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["job"]["id"] == call["job"]["id"]
    done = await _final(client, call["call_id"])  # the sweeper's poll sees the file
    assert done["status"] == "SUCCEEDED" and done["job"]["status"] == "succeeded"
    assert done["result"]["tickets"] >= 0 and done["result"]["path"].endswith(".json")
    replay = await post_call(client, "export_tickets", {"delay_ms": 500}, key=key)
    assert replay.status_code == 200 and replay.json()["result"] == done["result"]
    assert server_effects(server, key) == 1  # one job, however often it was asked


def server_effects(server: Server, key: str) -> int:
    with sqlite3.connect(server.helpdesk_db) as conn:
        (n,) = conn.execute(
            "SELECT COUNT(*) FROM effects WHERE tool = 'export_tickets' AND idempotency_key = ?",
            (key,),
        ).fetchone()
    return int(n)


async def test_the_job_reports_its_result_and_a_second_report_is_409(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    call = await _started(client, key, SLOW)
    path = f"/v1/calls/{call['call_id']}/job"
    running = await client.post(
        path, json={"status": "running", "progress": 0.4}, headers=JOB_REPORTER.headers
    )
    assert running.status_code in (200, 202), running.text
    result = {"path": "/exports/reported.json", "tickets": 7}
    done = await client.post(
        path, json={"status": "succeeded", "result": result}, headers=JOB_REPORTER.headers
    )
    assert done.status_code in (200, 202), done.text
    final = await _final(client, call["call_id"])
    assert final["status"] == "SUCCEEDED" and final["result"] == result
    late = await client.post(
        path, json={"status": "failed", "error": {"code": "X", "message": "late"}},
        headers=JOB_REPORTER.headers,
    )  # fmt: skip
    assert_problem(late, 409, "JOB_FINISHED")
    retry = await post_call(client, "export_tickets", SLOW, key=key)
    assert retry.status_code == 200 and retry.json()["result"] == result


async def test_reports_need_the_scope_and_a_call_of_the_tenant(
    client: httpx.AsyncClient, key: str
) -> None:
    call = await _started(client, key, SLOW)
    path = f"/v1/calls/{call['call_id']}/job"
    report = {"status": "running", "progress": 0.1}
    assert_problem(await client.post(path, json=report), 403, "FORBIDDEN")  # tools:call only
    foreign = await client.post(path, json=report, headers=GLOBEX_REPORTER.headers)
    assert_problem(foreign, 404, "JOB_NOT_FOUND")
    unknown = await client.post(
        "/v1/calls/call_00000000000000000000000000000000/job",
        json=report,
        headers=JOB_REPORTER.headers,
    )
    assert_problem(unknown, 404, "JOB_NOT_FOUND")
    bad = await client.post(path, json={"status": "sleeping"}, headers=JOB_REPORTER.headers)
    assert_problem(bad, 400, "VALIDATION_FAILED")
    cancelled = await client.post(f"{path}/cancel", headers=OPERATOR.headers)
    assert cancelled.status_code in (200, 202), cancelled.text


async def test_cancel_ends_the_call_cancelled_and_a_finished_job_cannot_be_cancelled(
    client: httpx.AsyncClient, key: str
) -> None:
    call = await _started(client, key, SLOW)
    cancel = f"/v1/calls/{call['call_id']}/job/cancel"
    answered = await client.post(cancel)
    assert answered.status_code in (200, 202), answered.text
    final = await _final(client, call["call_id"])
    assert final["status"] == "FAILED_FINAL" and final["error"]["code"] == "CANCELLED"
    assert final["job"]["status"] == "cancelled"
    assert_problem(await client.post(cancel), 409, "JOB_FINISHED")
