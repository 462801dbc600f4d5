"""``toolledger serve`` (embedded) under process faults: SIGKILL mid-load, SIGTERM during a
running call. Effects are counted in the helpdesk store: 0 doubles, 0 lost, 0 stuck."""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path

import httpx

from tests.faults.serve import EmbeddedServe

CALLS = 500
DUPLICATE_SHARE = 0.3


def _plan(seed: int) -> list[str]:
    """500 calls, 30% of which repeat an earlier key (same arguments), shuffled."""
    rng = random.Random(seed)
    distinct = [f"k9-{n}" for n in range(int(CALLS * (1 - DUPLICATE_SHARE)))]
    keys = distinct + [rng.choice(distinct) for _ in range(CALLS - len(distinct))]
    rng.shuffle(keys)
    return keys


async def _send(client: httpx.AsyncClient, key: str) -> int:
    try:
        response = await client.post(
            "/v1/tools/create_ticket/calls",
            json={"arguments": {"title": f"ticket {key}"}},
            headers={"Idempotency-Key": key, "Prefer": "wait=5"},
        )
    except httpx.HTTPError:
        return 0  # the server died under it: the key is sent again later
    return response.status_code


async def _settle(server: EmbeddedServe, keys: set[str]) -> dict[str, dict[str, object]]:
    """Send every key again until each has its final answer (bounded)."""
    final: dict[str, dict[str, object]] = {}
    async with server.client() as client:
        for _round in range(60):
            for key in sorted(keys - set(final)):
                response = await client.post(
                    "/v1/tools/create_ticket/calls",
                    json={"arguments": {"title": f"ticket {key}"}},
                    headers={"Idempotency-Key": key, "Prefer": "wait=10"},
                )
                if response.status_code == 200:
                    final[key] = response.json()
            if len(final) == len(keys):
                return final
            await asyncio.sleep(1.0)
    raise AssertionError(f"stuck keys: {sorted(keys - set(final))[:10]}")


async def test_sigkill_during_500_calls_with_duplicates_loses_and_doubles_nothing(
    tmp_path: Path,
) -> None:
    server = EmbeddedServe.new(tmp_path, "--create")
    keys = _plan(9)
    server.start()
    try:
        sent = 0
        for kill_after in (120, 260, 400, CALLS):
            async with server.client() as client:
                window = asyncio.Semaphore(32)

                async def one(
                    key: str,
                    client: httpx.AsyncClient = client,
                    window: asyncio.Semaphore = window,
                ) -> None:
                    async with window:
                        await _send(client, key)

                batch = keys[sent:kill_after]
                tasks = [asyncio.create_task(one(k)) for k in batch]
                # kill while the batch is in flight, not after it
                await asyncio.wait(tasks, timeout=0.4 + random.Random(kill_after).random())
                if kill_after < CALLS:
                    server.kill()
                await asyncio.gather(*tasks)
            sent = kill_after
            if kill_after < CALLS:
                server.start()
        final = await _settle(server, set(keys))
        assert all(body["status"] == "SUCCEEDED" for body in final.values())
        doubles = [k for k in set(keys) if server.effects("create_ticket", k) > 1]
        lost = [k for k in set(keys) if server.effects("create_ticket", k) == 0]
        assert doubles == [] and lost == [], (doubles[:5], lost[:5])
        # one ticket per key, the one every answer for it names
        assert len({str(b["result"]) for b in final.values()}) == len(set(keys))
    finally:
        server.stop()


async def test_sigterm_lets_a_running_call_finish_and_exits_0(tmp_path: Path) -> None:
    server = EmbeddedServe.new(tmp_path, "--create", "--shutdown-timeout", "20")
    server.start()
    try:
        async with server.client() as client:
            accepted = await client.post(
                "/v1/tools/flaky_write/calls",
                json={"arguments": {"payload": "p", "fault": "slow", "delay_ms": 1500}},
                headers={"Idempotency-Key": "term-1", "Prefer": "wait=0"},
            )
            assert accepted.status_code == 202, accepted.text
            location = accepted.headers["location"]
        server.signal(signal.SIGTERM)
        assert server.wait_exit(60) == 0, server.process.log() if server.process else ""
        assert not (server.data / "ledger.db-wal").exists() or (
            (server.data / "ledger.db-wal").stat().st_size == 0
        )  # checkpointed at the close
        server.start()
        async with server.client() as client:
            done = (await client.get(location)).json()
            assert done["status"] == "SUCCEEDED" and done["attempts"] == 1, done
            events = (await client.get(f"{location}/events")).json()["items"]
            kinds = [e["type"] for e in events]
            assert "ToolCallOutcomeUnknown" not in kinds and "ToolCallReconciled" not in kinds
        assert server.effects("flaky_write", "term-1") == 1
    finally:
        server.stop()
