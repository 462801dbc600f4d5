"""Faults of a replicated Kafka: three KRaft nodes (``services/kafka-cluster``: replication
factor 3, ``min.insync.replicas`` 2, the transaction state and offsets logs replicated the same
way), the executor, the projector and the front door (``serve --kafka --postgres``) as real
processes on them, and a real PostgreSQL. Under a few hundred calls with duplicate keys, paced
so that the load runs through the whole fault:

1. kill -9 of the node that leads the most intents and outcomes partitions, then its restart;
2. kill -9 of the transaction coordinator of most of the executor's transactional ids, then its
   restart;
3. a rolling restart of the three nodes (controlled shutdown, start, wait for full ISRs).

After each: no double (one downstream effect per key in the helpdesk store), no loss (every key
answered SUCCEEDED and executed), nothing stuck (no PENDING or UNKNOWN left in the projection; an
UNKNOWN on the log only with a reconcile after it), and the PostgreSQL projection agreeing with
the answers and holding each outcome event of the log once.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.faults.kafka_cluster import NODES, REPLICAS, KafkaCluster
from tests.faults.procs import ROOT, read_outcomes
from tests.http.servers import ACME, PARTITIONS, Server, start_distributed
from tests.services import Services
from toolledger.processors.toolsets.helpdesk.store import HelpdeskStore
from toolledger.schemas.events import (
    Event,
    ToolCallOutcomeUnknown,
    ToolCallReconciled,
    ToolCallSucceeded,
)
from toolledger.schemas.topics import Topics

pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]

RATE = 10.0  # calls started per second (the rolling restart, three times longer: half of it)
MIN_CALLS = 150  # and at least this many, however quick the fault
DUPLICATE_SHARE = 0.3  # of the calls reuse an earlier call's key (and arguments)
WARMUP_S = 2.0  # load before the fault starts
DOWN_S = 4.0  # how long a killed node stays down
ANSWER_WITHIN_S = 150.0  # a call is answered with its final outcome within this, retries included
RETRIED = (202, 409, 429, 503)  # running, in use, rate limited, not reachable: ask again


@dataclass
class Deployment:
    cluster: KafkaCluster
    server: Server
    topics: Topics

    @property
    def topic_names(self) -> list[str]:
        return _names(self.topics)


def _names(topics: Topics) -> list[str]:
    return [topics.intents, topics.outcomes, topics.state, topics.dead_letters, topics.groups]


async def _create_topics(bootstrap: str, topics: Topics) -> None:
    """``toolledger topics --replication-factor 3``: the CLI an operator runs first."""
    command = [sys.executable, "-m", "toolledger.cli", "topics", "--kafka", bootstrap]
    command += ["--prefix", topics.prefix, "--partitions", str(topics.partitions)]
    process = await asyncio.create_subprocess_exec(
        *command,
        "--replication-factor",
        str(REPLICAS),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    assert process.returncode == 0, output.decode(errors="replace")


@pytest.fixture
async def deployment(
    kafka_cluster: KafkaCluster, services: Services, tmp_path: Path
) -> AsyncIterator[Deployment]:
    """Fresh topics with three replicas, a fresh database, and executor + projector + serve on
    them, once every node runs and every replica is in sync."""
    topics = Topics(f"c{uuid.uuid4().hex[:10]}.", PARTITIONS)
    names = _names(topics)
    await kafka_cluster.heal([])
    await _create_topics(kafka_cluster.bootstrap, topics)
    # until the nodes know the new topics: one asked just after the creation may not yet
    await kafka_cluster.wait_in_sync(names)
    described = await kafka_cluster.describe(names)
    for _ in range(60):  # another node than the one wait_in_sync asked: at most 30 s more
        if all(t["partitions"] for t in described):
            break
        await asyncio.sleep(0.5)
        described = await kafka_cluster.describe(names)
    assert {len(p["replicas"]) for t in described for p in t["partitions"]} == {REPLICAS}
    on_cluster = Services(kafka_cluster.bootstrap, services.postgres)
    server = await asyncio.to_thread(start_distributed, tmp_path, on_cluster, prefix=topics.prefix)
    try:
        yield Deployment(kafka_cluster, server, topics)
    finally:
        server.stop()
        await kafka_cluster.delete(names)  # fewer partitions for the next test's restarts


@dataclass
class Answered:
    key: str
    first_status: int
    body: dict[str, Any]
    started: float  # monotonic time the call was sent


@dataclass
class Timeline:
    """When the fault ran, to check that calls were sent across it."""

    began: float = 0.0
    ended: float = 0.0
    notes: list[str] = field(default_factory=list)


async def _call_until_final(
    http: httpx.AsyncClient, key: str, arguments: dict[str, Any]
) -> Answered:
    """POST the call, then the same key and arguments again until the outcome is final: how an
    agent resolves a timeout, a 503, a call still running or an UNKNOWN."""
    started = time.monotonic()
    deadline = started + ANSWER_WITHIN_S
    first = 0
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            response = await http.post(
                "/v1/tools/flaky_write/calls",
                json={"arguments": arguments},
                headers={"Idempotency-Key": key, "Prefer": "wait=20"},
            )
        except httpx.HTTPError as exc:  # a timeout: the same key again is safe
            last = repr(exc)
        else:
            first = first or response.status_code
            last = f"{response.status_code} {response.text[:300]}"
            if response.status_code == 200:
                body = response.json()
                if body["status"] in ("SUCCEEDED", "FAILED_FINAL"):
                    return Answered(key, first, body, started)
            elif response.status_code not in RETRIED:
                raise AssertionError(f"{key}: {last}")
        await asyncio.sleep(0.5)
    raise AssertionError(f"{key}: no final outcome within {ANSWER_WITHIN_S} s; last: {last}")


async def _load_through(
    deployment: Deployment, fault: Callable[[Timeline], Awaitable[None]], rate: float = RATE
) -> tuple[list[Answered], Timeline]:
    """Start calls at ``rate`` per second until the fault is over and ``MIN_CALLS`` are sent;
    ``DUPLICATE_SHARE`` of them reuse an earlier key with its arguments."""
    rng = random.Random(33)
    arguments: dict[str, dict[str, Any]] = {}
    timeline = Timeline()
    calls: list[asyncio.Task[Answered]] = []
    limits = httpx.Limits(max_connections=64)
    base = deployment.server.base_url
    async with httpx.AsyncClient(
        base_url=base, headers=ACME.headers, timeout=30, limits=limits
    ) as http:

        async def run_fault() -> None:
            await asyncio.sleep(WARMUP_S)
            timeline.began = time.monotonic()
            await fault(timeline)
            timeline.ended = time.monotonic()

        faulting = asyncio.create_task(run_fault())
        try:
            while not faulting.done() or len(calls) < MIN_CALLS:
                if arguments and rng.random() < DUPLICATE_SHARE:
                    key = rng.choice(list(arguments))
                else:
                    key = f"k-{len(arguments):04d}"
                    arguments[key] = {
                        "payload": key,
                        "fault": "slow",
                        "delay_ms": rng.randint(20, 80),
                    }
                calls.append(asyncio.create_task(_call_until_final(http, key, arguments[key])))
                await asyncio.sleep(1 / rate)
            await faulting
            answers = await asyncio.gather(*calls)
        finally:
            for task in [faulting, *calls]:
                task.cancel()
            await asyncio.gather(faulting, *calls, return_exceptions=True)
    during = sum(timeline.began <= a.started <= timeline.ended for a in answers)
    assert during >= 10, f"only {during} calls were sent during the fault: {timeline}"
    return answers, timeline


def _by_key(events: list[Event]) -> dict[str, list[Event]]:
    found: dict[str, list[Event]] = {}
    for event in events:
        found.setdefault(event.envelope.idempotency_key, []).append(event)
    return found


async def _projected(dsn: str, keys: set[str], events: int) -> dict[str, dict[str, Any]]:
    """The projection's rows of ``keys`` once it holds them all final and ``events`` event
    rows (bounded: the projector catches up after the fault)."""
    deadline = time.monotonic() + 60
    while True:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            rows = await (
                await conn.execute(
                    "SELECT idempotency_key, call_id, status, result_json "
                    "FROM tool_calls WHERE tenant_id = %s AND tool_name = 'flaky_write'",
                    (ACME.tenant,),
                )
            ).fetchall()
            counted = await (
                await conn.execute(
                    "SELECT count(*), count(DISTINCT event_id) FROM tool_call_events"
                )
            ).fetchone()
        found = {
            r[0]: {"call_id": r[1], "status": r[2], "result": r[3]}  # jsonb: psycopg decodes it
            for r in rows
        }
        final = all(found.get(k, {}).get("status") == "SUCCEEDED" for k in keys)
        if (final and counted == (events, events)) or time.monotonic() > deadline:
            assert counted == (events, events), f"event rows {counted}, outcome log {events}"
            return found
        await asyncio.sleep(0.5)


async def _assert_once_and_agreeing(deployment: Deployment, answers: list[Answered]) -> str:
    """No double, no loss, nothing stuck, projection = answers; returns a one-line summary."""
    keys = {a.key for a in answers}
    final: dict[str, dict[str, Any]] = {}
    for answer in answers:  # every call of a key got the same call, finished, with its result
        body = answer.body
        assert body["status"] == "SUCCEEDED", (answer.key, body)
        seen = final.setdefault(answer.key, body)
        assert (seen["call_id"], seen["result"]) == (body["call_id"], body["result"]), (
            seen,
            body,
        )
    store = HelpdeskStore(deployment.server.helpdesk_db)
    try:
        effects = store.effect_counts()
    finally:
        store.close()
    doubled = {k: n for k, n in effects.items() if n > 1}
    assert doubled == {}, f"double side effects: {doubled}"
    executed = {
        k for (tenant, tool, k) in effects if (tenant, tool) == (ACME.tenant, "flaky_write")
    }
    assert executed == keys, {"lost": keys - executed, "unexpected": executed - keys}

    events = await read_outcomes(deployment.cluster.bootstrap, deployment.topics)
    by_key = _by_key(events)
    for key in keys:
        kinds = [type(e) for e in by_key[key]]
        succeeded = kinds.count(ToolCallSucceeded) + sum(
            isinstance(e, ToolCallReconciled) and e.resolution.value == "SUCCEEDED"
            for e in by_key[key]
        )
        assert succeeded == 1, (key, [e.TYPE for e in by_key[key]])
        if ToolCallOutcomeUnknown in kinds:  # UNKNOWN only on the way to a reconcile
            last_unknown = len(kinds) - 1 - kinds[::-1].index(ToolCallOutcomeUnknown)
            assert ToolCallReconciled in kinds[last_unknown:], (key, [e.TYPE for e in by_key[key]])

    assert deployment.server.dsn is not None
    projected = await _projected(deployment.server.dsn, keys, len(events))
    stuck = {k: r["status"] for k, r in projected.items() if r["status"] != "SUCCEEDED"}
    assert stuck == {}, f"calls left unfinished in the projection: {stuck}"
    disagree = {
        k: (projected.get(k), final[k]["call_id"], final[k]["result"])
        for k in keys
        if (projected.get(k, {}).get("call_id"), projected.get(k, {}).get("result"))
        != (final[k]["call_id"], final[k]["result"])
    }
    assert disagree == {}, f"projection and answers differ: {disagree}"
    for process in deployment.server.processes:  # executor, projector and front door lived
        process.check_alive()
    unknown = sum(ToolCallOutcomeUnknown in [type(e) for e in v] for v in by_key.values())
    firsts = dict(Counter(a.first_status for a in answers))
    return f"{len(answers)} calls, {len(keys)} keys, first answers {firsts}, {unknown} reconciled"


async def test_kill_9_of_a_busy_partition_leader_and_its_restart(deployment: Deployment) -> None:
    cluster = deployment.cluster

    async def fault(timeline: Timeline) -> None:
        leaders = [
            *(await cluster.leaders(deployment.topics.intents)).values(),
            *(await cluster.leaders(deployment.topics.outcomes)).values(),
        ]
        node, led = Counter(leaders).most_common(1)[0]
        timeline.notes.append(f"node {node} led {led} of {len(leaders)} partitions")
        await cluster.node("kill", node)
        killed = time.monotonic()
        await cluster.wait_led_without(node, deployment.topic_names)
        timeline.notes.append(
            f"its partitions led by others after {time.monotonic() - killed:.1f} s"
        )
        await asyncio.sleep(DOWN_S)  # and the load runs on the two others for a while
        await cluster.node("start", node)
        await cluster.wait_in_sync(deployment.topic_names)

    answers, timeline = await _load_through(deployment, fault)
    summary = await _assert_once_and_agreeing(deployment, answers)
    print(f"{timeline.notes}: {summary}")


async def test_kill_9_of_the_transaction_coordinator_and_its_restart(
    deployment: Deployment,
) -> None:
    cluster = deployment.cluster
    topics = deployment.topics

    async def fault(timeline: Timeline) -> None:
        ids = [f"{topics.executor_group}-{p}" for p in range(topics.partitions)]
        coordinators = [await cluster.transaction_coordinator(i) for i in ids]
        node, coordinated = Counter(coordinators).most_common(1)[0]
        timeline.notes.append(f"node {node} coordinated {coordinated} of {len(ids)} ids")
        await cluster.node("kill", node)
        await asyncio.sleep(DOWN_S)
        await cluster.node("start", node)
        await cluster.wait_in_sync(deployment.topic_names)

    answers, timeline = await _load_through(deployment, fault)
    summary = await _assert_once_and_agreeing(deployment, answers)
    print(f"{timeline.notes}: {summary}")


async def test_rolling_restart_of_all_three_nodes(deployment: Deployment) -> None:
    cluster = deployment.cluster

    async def fault(timeline: Timeline) -> None:
        for node in NODES:
            began = time.monotonic()
            await cluster.node("stop", node)  # controlled shutdown: its leaderships move first
            stopped = time.monotonic()
            await cluster.node("start", node)  # on the same data
            serving = time.monotonic()
            await cluster.wait_in_sync(deployment.topic_names)
            timeline.notes.append(
                f"node {node}: stopped in {stopped - began:.1f} s, serving after "
                f"{serving - stopped:.1f} s, in sync after {time.monotonic() - serving:.1f} s"
            )

    answers, timeline = await _load_through(deployment, fault, RATE / 2)
    summary = await _assert_once_and_agreeing(deployment, answers)
    print(f"{timeline.notes}: {summary}")
