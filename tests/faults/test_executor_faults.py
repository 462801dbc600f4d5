"""Crash and fault tests of the executor on the real broker.

See docs/architecture.md#the-kafka-path.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections import Counter
from datetime import UTC, datetime

import pytest

from tests.faults.procs import AGENT, ROOT, Cluster, read_outcomes, settle
from toolledger.producers import governance
from toolledger.producers.client import CallResult, LedgerClient
from toolledger.schemas.events import (
    ApprovalGranted,
    ApprovalRequested,
    ToolCallStarted,
    ToolCallSucceeded,
)
from toolledger.schemas.status import CallStatus

pytestmark = pytest.mark.services


def _workload(
    rng: random.Random, calls: int, duplicate_share: float
) -> list[tuple[str, dict[str, object]]]:
    distinct = round(calls * (1 - duplicate_share))
    keys = [f"key-{i:05d}" for i in range(distinct)]
    arguments = {k: {"payload": k, "fault": "slow", "delay_ms": rng.randint(0, 30)} for k in keys}
    work = keys + [rng.choice(keys) for _ in range(calls - distinct)]
    rng.shuffle(work)
    return [(key, arguments[key]) for key in work]


async def _run(
    client: LedgerClient, work: list[tuple[str, dict[str, object]]], in_flight: int = 64
) -> list[tuple[str, dict[str, object], CallResult]]:
    gate = asyncio.Semaphore(in_flight)

    async def one(
        key: str, arguments: dict[str, object]
    ) -> tuple[str, dict[str, object], CallResult]:
        async with gate:
            result = await client.call(
                "flaky_write", arguments, idempotency_key=key, context=AGENT, wait=40
            )
            return key, arguments, result

    return await asyncio.gather(*(one(k, a) for k, a in work))


async def _assert_exactly_once(
    cluster: Cluster, client: LedgerClient, results: list[tuple[str, dict[str, object], CallResult]]
) -> Counter[str]:
    """Every key ends SUCCEEDED (after same-key retries) with exactly one downstream effect."""
    final: dict[str, CallResult] = {}
    statuses: Counter[str] = Counter()
    for key, arguments, result in results:
        statuses[str(result.status)] += 1
        if key not in final or not final[key].ok:
            final[key] = await settle(client, "flaky_write", key, arguments, result)
    store = cluster.store()
    try:
        effects = store.effect_counts()
        doubled = {k: n for k, n in effects.items() if n > 1}
        assert doubled == {}, f"double side effects: {doubled}"
        not_done = {k: r.status for k, r in final.items() if r.status is not CallStatus.SUCCEEDED}
        assert not_done == {}, f"keys not SUCCEEDED after retries: {not_done}"
        for key in final:
            assert effects.get(("acme", "flaky_write", key)) == 1, key
    finally:
        store.close()
    events = await read_outcomes(cluster.services.kafka, cluster.topics)
    succeeded = Counter(e.call_key for e in events if isinstance(e, ToolCallSucceeded))
    assert max(succeeded.values()) == 1, "a key has two ToolCallSucceeded events"
    assert sum(isinstance(e, ToolCallStarted) for e in events) >= len(final)
    return statuses


async def test_sigkill_executor_during_load_never_doubles_an_effect(
    cluster: Cluster, client: LedgerClient
) -> None:
    rng = random.Random(20261129)
    work = _workload(rng, calls=2000, duplicate_share=0.3)
    executor = cluster.spawn()
    await executor.ready()
    load = asyncio.create_task(_run(client, work))
    kills = 0
    while not load.done() and kills < 3:
        await asyncio.sleep(rng.uniform(0.8, 2.5))
        if load.done():
            break
        executor.kill()  # SIGKILL: no shutdown, no flush, transactions left open
        kills += 1
        executor = cluster.spawn()
        await executor.ready()
    results = await load
    assert kills >= 1, "the load finished before the first kill; make it longer"
    statuses = await _assert_exactly_once(cluster, client, results)
    print(f"killed {kills} times; first answers: {dict(statuses)}")


async def test_paused_executor_is_fenced_and_no_effect_happens_twice(
    cluster: Cluster, client: LedgerClient
) -> None:
    first = cluster.spawn()
    await first.ready()
    work = [
        (f"zombie-{i:03d}", {"payload": f"z{i}", "fault": "slow", "delay_ms": 1500})
        for i in range(40)
    ]
    load = asyncio.create_task(_run(client, work))
    await asyncio.sleep(0.7)  # calls are Started and sleeping in the first executor's handlers
    first.signal(signal.SIGSTOP)
    second = cluster.spawn()
    await second.ready(timeout_s=90)  # gets the partitions once the first's session expired
    results = await load
    first.signal(signal.SIGCONT)  # the zombie wakes up with handlers past their deadline
    await asyncio.sleep(3.0)
    await _assert_exactly_once(cluster, client, results)
    assert second.process.poll() is None


async def _restart_broker(bootstrap: str, down_s: float) -> None:
    port = bootstrap.rpartition(":")[2]
    process = await asyncio.create_subprocess_exec(
        "bash",
        str(ROOT / "services" / "kafka" / "restart.sh"),
        str(down_s),
        env={**os.environ, "TOOLLEDGER_KAFKA_PORT": port},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    assert process.returncode == 0, output.decode(errors="replace")


async def test_broker_restart_mid_load_loses_nothing_and_doubles_nothing(
    cluster: Cluster, client: LedgerClient
) -> None:
    rng = random.Random(7)
    work = _workload(rng, calls=800, duplicate_share=0.3)
    executor = cluster.spawn()
    await executor.ready()
    load = asyncio.create_task(_run(client, work, in_flight=32))
    await asyncio.sleep(1.0)
    assert not load.done(), "the load finished before the restart; make it longer"
    await _restart_broker(cluster.services.kafka, down_s=2)
    results = await load
    statuses = await _assert_exactly_once(cluster, client, results)
    assert executor.process.poll() is None, "the executor must survive a broker restart"
    print(f"first answers around a broker restart: {dict(statuses)}")


async def test_sigkill_during_approved_charges_never_uses_a_token_twice(
    cluster: Cluster, client: LedgerClient
) -> None:
    """Approved charges race with the same tokens presented on other keys while the executor
    is SIGKILLed: each approved charge happens once, a stolen token never charges anything,
    and the approvals survive the takeovers (they live in the state topic)."""
    rng = random.Random(7)
    executor = cluster.spawn()
    await executor.ready()
    keys = [f"pay-{i:03d}" for i in range(400)]
    charges: dict[str, dict[str, object]] = {
        k: {"customer_id": f"cus_{i}", "amount_cents": 100 + i, "currency": "EUR"}
        for i, k in enumerate(keys)
    }

    async def call(key: str, args: dict[str, object], token: str | None) -> CallResult:
        return await client.call(
            "charge_card", args, idempotency_key=key, context=AGENT, wait=40, approval_token=token
        )

    asked = await asyncio.gather(*(call(k, charges[k], None) for k in keys))
    tokens: dict[str, str] = {}
    for key, ask in zip(keys, asked, strict=True):
        assert isinstance(ask.event, ApprovalRequested), ask
        target = governance.ApprovalTarget.of_request(ask.event)
        record, tokens[key] = governance.approve(target, "olga", datetime.now(UTC))
        assert isinstance(await client.command(record, wait=40), ApprovalGranted)

    work = [(k, charges[k], tokens[k]) for k in keys]
    work += [(f"steal-{k}", charges[k], tokens[k]) for k in keys]  # the token on another key
    rng.shuffle(work)

    async def everything() -> list[CallResult]:
        return await asyncio.gather(*(call(k, a, t) for k, a, t in work))

    load = asyncio.create_task(everything())
    kills = 0
    while not load.done() and kills < 2:
        await asyncio.sleep(rng.uniform(0.05, 0.3))
        if load.done():
            break
        executor.kill()
        kills += 1
        executor = cluster.spawn()
        await executor.ready()
    results = await load
    assert kills >= 1, "the load finished before the first kill; make it longer"
    for (key, args, token), result in zip(work, results, strict=True):
        if not key.startswith("steal-"):
            final = await settle(client, "charge_card", key, args, result, approval_token=token)
            assert final.ok, (key, final)
        elif result.status is not None:  # answered after a crash: ask again, same key
            final = await settle(client, "charge_card", key, args, result, approval_token=token)
            assert final.error is not None and final.error.code == "APPROVAL_INVALID"
    store = cluster.store()
    try:
        effects = store.effect_counts()
    finally:
        store.close()
    assert {k: effects.get(("acme", "charge_card", k)) for k in keys} == dict.fromkeys(keys, 1)
    stolen = {k: n for (_, tool, k), n in effects.items() if k.startswith("steal-")}
    assert stolen == {}, stolen
    print(f"killed {kills} times")


async def test_sigterm_lets_the_executor_finish_a_running_call_and_exit_0(
    cluster: Cluster, client: LedgerClient
) -> None:
    """SIGTERM while a call runs: the executor lets it finish and commit, leaves its group and
    exits 0; the call is SUCCEEDED with one attempt, never recovered as UNKNOWN."""
    executor = cluster.spawn()
    await executor.ready()
    arguments = {"payload": "term", "fault": "slow", "delay_ms": 1500}
    first = await client.call(
        "flaky_write", arguments, idempotency_key="term-1", context=AGENT, wait=0.3
    )
    assert first.status is CallStatus.PENDING and first.running, first
    executor.signal(signal.SIGTERM)
    assert await asyncio.to_thread(executor.process.wait, 60) == 0, executor.log()[-3000:]
    successor = cluster.spawn()
    await successor.ready()
    done = await client.call(
        "flaky_write", arguments, idempotency_key="term-1", context=AGENT, wait=30
    )
    assert done.status is CallStatus.SUCCEEDED and done.replayed, done
    assert done.attempts == 1
    events = await read_outcomes(cluster.services.kafka, cluster.topics)
    kinds = [e.TYPE for e in events if e.envelope.idempotency_key == "term-1"]
    assert "ToolCallOutcomeUnknown" not in kinds, kinds
    store = cluster.store()
    try:
        assert store.effect_counts().get(("acme", "flaky_write", "term-1")) == 1
    finally:
        store.close()
