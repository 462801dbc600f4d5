"""SIGKILL the projector mid-batch and restart it: the projection equals the fold of the log."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import psycopg
import pytest

from tests import postgres_reads
from tests.faults.procs import AGENT, Cluster, read_outcomes
from toolledger.producers.client import LedgerClient
from toolledger.projections.postgres import PostgresProjection
from toolledger.projections.projector import rebuild

pytestmark = pytest.mark.services


def _applied(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM tool_call_events").fetchone()
        return int(row[0]) if row else 0


async def test_sigkilled_projector_resumes_without_gaps_or_duplicates(
    cluster: Cluster, client: LedgerClient, tmp_path: Path
) -> None:
    executor = cluster.spawn()
    await executor.ready()
    rng = random.Random(99)
    keys = [f"p-{i:05d}" for i in range(1500)]
    work = keys + [rng.choice(keys) for _ in range(500)]
    gate = asyncio.Semaphore(64)

    async def call(key: str) -> None:
        async with gate:
            result = await client.call(
                "create_ticket", {"title": key}, idempotency_key=key, context=AGENT, wait=30
            )
            assert result.ok, result

    await asyncio.gather(*(call(k) for k in work))
    total = len(await read_outcomes(cluster.services.kafka, cluster.topics))

    live_dsn = await cluster.services.fresh_database()
    kills = 0
    for _ in range(6):
        # small transactions: a kill lands mid-way even on a fast machine
        projector = cluster.spawn_projector(live_dsn, "--batch-max", "100").process
        while projector.poll() is None and _applied(live_dsn) < total:
            await asyncio.sleep(rng.uniform(0.01, 0.1))
            applied = _applied(live_dsn)
            if 0 < applied < total and kills < 3:
                projector.kill()  # SIGKILL, wherever it is
                kills += 1
                break
        else:
            break
        projector.wait(timeout=30)
    else:
        pytest.fail("the projector never caught up")
    assert kills >= 1, "no kill landed mid-way; the log is too short for this machine"
    projector.terminate()
    projector.wait(timeout=30)

    rebuilt_dsn = await cluster.services.fresh_database()
    async with PostgresProjection(live_dsn) as live, PostgresProjection(rebuilt_dsn) as rebuilt:
        await rebuild(cluster.services.kafka, cluster.topics, rebuilt)
        live_events, rebuilt_events = (
            await postgres_reads.event_rows(live),
            await postgres_reads.event_rows(rebuilt),
        )
        assert len(live_events) == total
        assert live_events == rebuilt_events
        assert await postgres_reads.call_rows(live) == await postgres_reads.call_rows(rebuilt)
