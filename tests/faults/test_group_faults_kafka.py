"""kill -9 in the middle of call groups on Kafka + PostgreSQL: ``toolledger serve`` is the front
door that drives the groups (its group log in PostgreSQL), the executor a separate process.

- the executor is SIGKILLed while steps of three groups are in its handlers (one has written
  its effect and not yet answered, two are asleep before theirs); a new executor takes the
  partitions over;
- the front door (the orchestrator) is SIGKILLed while steps run and started again on the same
  database and topics;
- the executor is SIGKILLed while a long-running job runs.

Every group finishes (one compensated), no step and no compensation has two downstream effects
(the helpdesk store's rows), and the calls that were in flight were resolved by reconcile,
never re-run blind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.faults.procs import CliProcess, Cluster, read_outcomes
from tests.http.servers import ACME, JOB_REPORTER, Process, free_port, spawn, write_tokens
from tests.services import Services
from toolledger.processors.groups import compensation_key, step_key
from toolledger.schemas.events import (
    Event,
    ToolCallOutcomeUnknown,
    ToolCallReconciled,
    ToolCallSucceeded,
)
from toolledger.schemas.keys import CallKey, KeyScope
from toolledger.schemas.topics import Topics

pytestmark = [pytest.mark.services, pytest.mark.timeout(280)]

TENANT = ACME.tenant
FINISHED = {"SUCCEEDED", "FAILED", "COMPENSATED", "NEEDS_ATTENTION"}
RECOVERED = "The executor stopped or lost its partition"  # the takeover's OutcomeUnknown reason
FLAKY_TIMEOUT_S = 4.0  # how long a hang_after_effect step hangs: the window for the kill
LONG_MS = 2500  # the steps asleep in the executor when it is killed (under FLAKY_TIMEOUT_S)


def _slow(ms: int) -> dict[str, Any]:
    return {"payload": "p", "fault": "slow", "delay_ms": ms}


def _step(sid: str, tool: str, arguments: dict[str, Any], after: str | None) -> dict[str, Any]:
    step: dict[str, Any] = {"id": sid, "tool": tool, "arguments": arguments}
    if after is not None:
        step["depends_on"] = [after]
    return step


def _groups() -> dict[str, dict[str, Any]]:
    """Three chains that reach their third step together (about 0.4 s in): ``g-hang``'s writes
    its effect and hangs, ``g-slow``'s and ``g-fail``'s sleep before theirs; ``g-fail`` then
    fails for good and its ticket is closed again (the compensation)."""
    hang = {"payload": "h", "fault": "hang_after_effect"}
    ticket = {"ticket_id": {"$from": "open", "path": "ticket_id"}}
    return {
        "g-hang": {
            "run_id": "run-kafka-kill",
            "steps": [
                _step("open", "create_ticket", {"title": "hang"}, None),
                _step("w0", "flaky_write", _slow(300), "open"),
                _step("mid", "flaky_write", hang, "w0"),
                _step("w2", "flaky_write", _slow(100), "mid"),
                _step("close", "close_ticket", ticket, "w2"),
            ],
        },
        "g-slow": {
            "run_id": "run-kafka-kill",
            "steps": [
                _step("open", "create_ticket", {"title": "slow"}, None),
                _step("w0", "flaky_write", _slow(300), "open"),
                _step("mid", "flaky_write", _slow(LONG_MS), "w0"),
                _step("w2", "flaky_write", _slow(100), "mid"),
            ],
        },
        "g-fail": {
            "run_id": "run-kafka-kill",
            "steps": [
                _step("open", "create_ticket", {"title": "fail"}, None),
                _step("w0", "flaky_write", _slow(300), "open"),
                _step("mid", "flaky_write", _slow(LONG_MS), "w0"),
                _step("boom", "flaky_write", {"payload": "x", "fault": "final"}, "mid"),
            ],
        },
    }


@dataclass
class KafkaServe:
    """``toolledger serve`` on Kafka + PostgreSQL (the front door; it drives the groups), as a
    process to kill -9 and start again on the same port, database and topics."""

    workdir: Path
    services: Services
    topics: Topics
    dsn: str
    port: int = field(default_factory=free_port)
    process: Process | None = None
    runs: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, timeout_s: float = 90.0) -> None:
        self.runs += 1
        tokens = self.workdir / "tokens.json"
        if not tokens.exists():
            write_tokens(tokens)
        args = ["serve", "--host", "127.0.0.1", "--port", str(self.port), "--demo"]
        args += ["--data", str(self.workdir / "serve-data"), "--tokens", str(tokens)]
        args += ["--kafka", self.services.kafka, "--postgres", self.dsn]
        args += ["--prefix", self.topics.prefix, "--partitions", str(self.topics.partitions)]
        self.process = spawn(f"serve-{self.runs}", args, self.workdir)
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(base_url=self.base_url, timeout=2) as http:
            while True:
                self.process.check_alive()
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/readyz")).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise AssertionError(f"serve not ready in {timeout_s} s:\n{self.process.log()}")
                await asyncio.sleep(0.1)

    def kill(self) -> None:
        assert self.process is not None
        if self.process.popen.poll() is None:
            os.kill(self.process.popen.pid, signal.SIGKILL)
        self.process.popen.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()  # SIGTERM, then SIGKILL after 20 s

    def client(self, timeout_s: float = 60.0) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, headers=ACME.headers, timeout=timeout_s)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in self.workdir.glob("*.log"))


@pytest.fixture
async def front(cluster: Cluster, services: Services) -> AsyncIterator[KafkaServe]:
    """A front door on the cluster's topics and a fresh database; stopped in the end (the
    ``cluster`` fixture stops the executors)."""
    cluster.flaky_timeout_s = FLAKY_TIMEOUT_S
    serve = KafkaServe(cluster.workdir, services, cluster.topics, await services.fresh_database())
    try:
        yield serve
    finally:
        serve.stop()


async def _until(
    what: str, check: Callable[[], Awaitable[bool]], timeout_s: float, logs: Callable[[], str]
) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout_s} s:\n{logs()}")
        await asyncio.sleep(0.05)


def _effects(cluster: Cluster) -> dict[tuple[str, str], int]:
    """Downstream effects per (tool, idempotency key): each row is a real side effect."""
    store = cluster.store()
    try:
        return {(tool, key): n for (_, tool, key), n in store.effect_counts().items()}
    finally:
        store.close()


async def _submit(serve: KafkaServe, groups: dict[str, dict[str, Any]]) -> dict[str, str]:
    ids: dict[str, str] = {}
    async with serve.client() as http:
        for key, body in groups.items():
            answered = await http.post(
                "/v1/groups", json=body, headers={"Idempotency-Key": key, "Prefer": "wait=0"}
            )
            assert answered.status_code == 202, answered.text
            ids[key] = answered.json()["group_id"]
    return ids


async def _views(serve: KafkaServe, ids: dict[str, str]) -> dict[str, dict[str, Any]]:
    views: dict[str, dict[str, Any]] = {}
    async with serve.client(timeout_s=10) as http:
        for key, group_id in ids.items():
            got = await http.get(f"/v1/groups/{group_id}")
            assert got.status_code == 200, got.text
            views[key] = got.json()
    return views


def _step_status(view: dict[str, Any], step_id: str) -> str:
    return str(next(s for s in view["steps"] if s["id"] == step_id)["status"])


async def _all_mid_flight(cluster: Cluster, serve: KafkaServe, ids: dict[str, str]) -> None:
    """Wait until every group's ``mid`` step is in the executor: ``g-hang``'s has written its
    effect (and hangs until its timeout), the others are PENDING (asleep)."""

    mids = [_call_key("flaky_write", step_key(key, "mid")) for key in ids]

    async def in_flight() -> bool:
        if _effects(cluster).get(("flaky_write", step_key("g-hang", "mid"))) != 1:
            return False
        views = await _views(serve, ids)
        if not all(_step_status(v, "mid") == "PENDING" for v in views.values()):
            return False
        # and the executor has committed their Started events (their handlers run)
        by_key = _by_key(await read_outcomes(cluster.services.kafka, cluster.topics))
        return all(_kinds(by_key.get(k, []))["ToolCallStarted"] == 1 for k in mids)

    await _until("mid-flight", in_flight, 30, serve.logs)
    views = await _views(serve, ids)
    assert {k: v["status"] for k, v in views.items()} == dict.fromkeys(ids, "RUNNING"), views


async def _finished(
    serve: KafkaServe, ids: dict[str, str], timeout_s: float = 120
) -> dict[str, Any]:
    finished: dict[str, Any] = {}

    async def done() -> bool:
        try:
            finished.update(await _views(serve, ids))
        except httpx.HTTPError:
            return False  # the front door is (re)starting
        return all(v["status"] in FINISHED for v in finished.values())

    await _until("finished", done, timeout_s, serve.logs)
    return finished


def _call_key(tool: str, key: str) -> str:
    """The call key of ACME's call (the default key scope: tenant and principal)."""
    return str(CallKey.scoped(KeyScope.TENANT_PRINCIPAL, TENANT, ACME.principal, tool, key))


def _by_key(events: list[Event]) -> dict[str, list[Event]]:
    found: dict[str, list[Event]] = {}
    for event in events:
        found.setdefault(event.call_key, []).append(event)
    return found


async def _assert_nothing_twice(
    cluster: Cluster, groups: dict[str, dict[str, Any]], finished: dict[str, Any]
) -> dict[str, list[Event]]:
    """Statuses, the downstream's effects (each step and compensation once), one success per
    key in the outcome log; returns the outcome events by call key."""
    statuses = {k: v["status"] for k, v in finished.items()}
    assert statuses == {"g-hang": "SUCCEEDED", "g-slow": "SUCCEEDED", "g-fail": "COMPENSATED"}, (
        finished
    )
    fail = {s["id"]: s for s in finished["g-fail"]["steps"]}
    assert fail["boom"]["status"] == "FAILED_FINAL", fail
    assert fail["open"]["compensation"]["status"] == "SUCCEEDED", fail
    effects = _effects(cluster)
    doubled = {k: n for k, n in effects.items() if n > 1}
    assert doubled == {}, f"double side effects: {doubled}"
    expected: set[tuple[str, str]] = set()
    for key, body in groups.items():
        for step in body["steps"]:
            if step["id"] != "boom":
                expected.add((step["tool"], step_key(key, step["id"])))
    expected.add(("close_ticket", compensation_key("g-fail", "open")))
    assert set(effects) == expected, {  # every step and the compensation once, nothing else
        "missing": expected - set(effects),
        "unexpected": set(effects) - expected,
    }
    for key in ("g-hang", "g-slow"):  # succeeded: nothing of theirs compensated
        assert ("close_ticket", compensation_key(key, "open")) not in effects
    by_key = _by_key(await read_outcomes(cluster.services.kafka, cluster.topics))
    succeeded = Counter(
        k for k, events in by_key.items() for e in events if isinstance(e, ToolCallSucceeded)
    )
    assert succeeded and max(succeeded.values()) == 1, succeeded
    return by_key


def _kinds(events: list[Event]) -> Counter[str]:
    return Counter(e.TYPE for e in events)


def _recovered(events: list[Event]) -> bool:
    return any(isinstance(e, ToolCallOutcomeUnknown) and RECOVERED in e.reason for e in events)


async def test_kill_9_of_the_executor_mid_group_runs_nothing_twice_and_groups_finish(
    cluster: Cluster, front: KafkaServe
) -> None:
    executor = cluster.spawn()
    await executor.ready()
    await front.start()
    groups = _groups()
    ids = await _submit(front, groups)
    await _all_mid_flight(cluster, front, ids)
    executor.kill()  # SIGKILL: three handlers in flight, transactions left open
    successor: CliProcess = cluster.spawn()
    await successor.ready(timeout_s=90)
    finished = await _finished(front, ids)
    by_key = await _assert_nothing_twice(cluster, groups, finished)

    # the hanging step had written its effect: the new owner recovered it as UNKNOWN and
    # reconcile found it; its handler ran once
    hang = by_key[_call_key("flaky_write", step_key("g-hang", "mid"))]
    assert _recovered(hang), _kinds(hang)
    assert _kinds(hang)["ToolCallStarted"] == 1, _kinds(hang)
    found = [e for e in hang if isinstance(e, ToolCallReconciled)]
    assert [e.resolution.value for e in found] == ["SUCCEEDED"], found
    # the sleeping steps had not: reconcile said so and they ran again, once, to success
    for key in ("g-slow", "g-fail"):
        slept = by_key[_call_key("flaky_write", step_key(key, "mid"))]
        assert _recovered(slept), (key, _kinds(slept))
        assert _kinds(slept)["ToolCallStarted"] == 2, (key, _kinds(slept))
        assert _kinds(slept)["ToolCallSucceeded"] == 1, (key, _kinds(slept))
    assert successor.process.poll() is None, successor.log()[-3000:]


async def test_kill_9_of_the_front_door_mid_group_runs_nothing_twice_and_groups_finish(
    cluster: Cluster, front: KafkaServe
) -> None:
    executor = cluster.spawn()
    await executor.ready()
    await front.start()
    groups = _groups()
    ids = await _submit(front, groups)
    await _all_mid_flight(cluster, front, ids)
    front.kill()  # the orchestrator dies with three steps asked and not answered
    await front.start()  # same database: it claims the unfinished groups and asks again
    finished = await _finished(front, ids)
    by_key = await _assert_nothing_twice(cluster, groups, finished)
    # the executor lived: no call was recovered, every step's handler ran exactly once
    for key, body in groups.items():
        for step in body["steps"]:
            events = by_key[_call_key(step["tool"], step_key(key, step["id"]))]
            assert not _recovered(events), (key, step["id"], _kinds(events))
            assert _kinds(events)["ToolCallStarted"] == 1, (key, step["id"], _kinds(events))
    close = by_key[_call_key("close_ticket", compensation_key("g-fail", "open"))]
    assert _kinds(close)["ToolCallStarted"] == 1 and _kinds(close)["ToolCallSucceeded"] == 1
    assert executor.process.poll() is None, executor.log()[-3000:]


async def _projector(serve: KafkaServe, timeout_s: float = 60.0) -> Process:
    """The projector on the front door's topics and database: the HTTP answers of calls (a
    job's view) are read from its tables."""
    ready = serve.workdir / "projector.ready"
    args = ["projector", "--kafka", serve.services.kafka, "--prefix", serve.topics.prefix]
    args += ["--partitions", str(serve.topics.partitions), "--postgres", serve.dsn]
    process = spawn("projector", [*args, "--ready-file", str(ready)], serve.workdir)
    try:

        async def started() -> bool:
            process.check_alive()
            return ready.exists()

        await _until("projector ready", started, timeout_s, serve.logs)
    except BaseException:
        process.stop()
        raise
    return process


async def test_kill_9_of_the_executor_while_a_job_runs_keeps_the_job_and_one_outcome(
    cluster: Cluster, front: KafkaServe
) -> None:
    """The helpdesk's export job runs inside the executor, so it dies with it: the new owner
    does not start it again (one effect); retries answer the same job; its poll finds the job
    gone and records the one outcome, which every later retry replays."""
    executor = cluster.spawn()
    await executor.ready()
    projector = await _projector(front)
    try:
        await front.start()
        body = {"arguments": {"delay_ms": 60_000}}  # a minute: it runs when the executor dies
        key = "export-kill-1"
        path = "/v1/tools/export_tickets/calls"
        async with front.client() as http:
            first = await http.post(path, json=body, headers={"Idempotency-Key": key})
            assert first.status_code == 202, first.text
            call = first.json()
            assert call["status"] == "PENDING" and call["job"]["status"] == "running", call
            job_id = call["job"]["id"]
            executor.kill()  # the job task dies with its process
            successor = cluster.spawn()
            await successor.ready(timeout_s=90)
            headers = {"Idempotency-Key": key, "Prefer": "wait=1"}
            answers: list[dict[str, Any]] = []

            async def final() -> bool:
                again = await http.post(path, json=body, headers=headers)
                if again.status_code == 503:  # the projection has not caught up: retry
                    return False
                assert again.status_code in (200, 202), again.text
                assert again.headers["idempotent-replayed"] == "true", again.headers
                answers.append(again.json())
                return again.status_code == 200

            await _until("the job's outcome", final, 60, front.logs)
            report = await http.post(
                f"/v1/calls/{call['call_id']}/job",
                json={"status": "succeeded", "result": {"path": "/late.json", "tickets": 0}},
                headers=JOB_REPORTER.headers,
            )
        assert {a["job"]["id"] for a in answers} == {job_id}, answers  # the same job, always
        assert {a["call_id"] for a in answers} == {call["call_id"]}, answers
        done = answers[-1]
        assert done["status"] == "FAILED_FINAL", done
        assert done["error"]["code"] == "DOWNSTREAM_EXPORT_LOST", done
        assert done["job"]["status"] == "failed" and done["attempts"] == 1, done
        assert report.status_code == 409 and report.json()["code"] == "JOB_FINISHED", report.text
    finally:
        projector.stop()
    assert _effects(cluster) == {("export_tickets", key): 1}  # one job was ever started
    events = _by_key(await read_outcomes(cluster.services.kafka, cluster.topics))
    kinds = _kinds(events[_call_key("export_tickets", key)])
    assert kinds["ToolCallStarted"] == kinds["ToolCallJobStarted"] == 1, kinds
    assert kinds["ToolCallFailed"] == 1 and kinds["ToolCallSucceeded"] == 0, kinds  # once
    assert kinds["ToolCallOutcomeUnknown"] == 0, kinds  # a running job is not recovered
    assert successor.process.poll() is None, successor.log()[-3000:]
