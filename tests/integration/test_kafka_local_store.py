"""The Kafka executor's local stores on a real broker: a restart on the same disk reads only
the state topic's tail, a takeover without a store restores it and then serves, and a store
made for something else, or one that has not read its topic for longer than tombstones are
kept, is rebuilt, never used. In every case each key still replays."""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest

from tests.contract.harness import ACME, eventually
from tests.contract.kafka import KafkaHarness
from tests.services import Services
from toolledger.processors.runtime import kafka as kafka_runtime
from toolledger.processors.runtime.kafka import restore_local
from toolledger.processors.runtime.local_store import LocalStore

pytestmark = pytest.mark.services


async def _calls(harness: KafkaHarness, keys: range) -> None:
    for i in keys:
        result = await harness.client.call(
            "create_ticket", {"title": f"t{i}"}, idempotency_key=f"k{i}", context=ACME
        )
        assert result.ok, result


async def _all_replay(harness: KafkaHarness, keys: range) -> None:
    for i in keys:
        result = await harness.client.call(
            "create_ticket", {"title": f"t{i}"}, idempotency_key=f"k{i}", context=ACME
        )
        assert result.ok and result.replayed, (i, result)
        assert harness.effects("create_ticket", f"k{i}") == 1


def _restored(harness: KafkaHarness) -> int:
    assert harness.executor is not None
    return sum(harness.executor.restored.values())


async def test_local_stores_restart_warm_take_over_cold_and_refuse_a_stranger(
    tmp_path: Path, services: Services
) -> None:
    harness = KafkaHarness(tmp_path, services, cache_entries=4)  # replays read the store
    state_dir = tmp_path / "executor-state"
    await harness.start()
    try:
        await _calls(harness, range(20))
        cold = _restored(harness)
        await harness.stop()
        snapshot = tmp_path / "store-after-20"
        shutil.copytree(state_dir, snapshot)

        await harness.start()  # the same disk: nothing new on the topic since the stop
        assert _restored(harness) == 0
        await _all_replay(harness, range(20))
        await _calls(harness, range(20, 25))
        await harness.stop()

        shutil.rmtree(state_dir)
        shutil.copytree(snapshot, state_dir)  # a store that missed the last five calls
        await harness.start()
        tail = _restored(harness)
        # each call wrote its state twice (PENDING, then SUCCEEDED); no earlier record is read
        assert 5 <= tail <= 10, tail
        await _all_replay(harness, range(25))
        await harness.stop()

        shutil.rmtree(state_dir)  # a new host: no store at all
        await harness.start()
        full = _restored(harness)
        assert full >= 25 + tail and full > cold, (full, cold)
        await _all_replay(harness, range(25))
        await harness.stop()

        for store in state_dir.glob("*.db"):  # made for another cluster: rebuilt from the topic
            with sqlite3.connect(store) as conn:
                conn.execute(
                    "UPDATE meta SET v = replace(v, 'cluster=', 'cluster=other') "
                    "WHERE k = 'identity'"
                )
        await harness.start()
        assert _restored(harness) == full
        await _all_replay(harness, range(25))
        await harness.stop()

        for store in state_dir.glob("*.db"):  # not read for longer than tombstones are kept
            with sqlite3.connect(store) as conn:
                conn.execute("UPDATE meta SET v = '0' WHERE k = 'checkpoint_at'")
        await harness.start()
        assert _restored(harness) == full
        await _all_replay(harness, range(25))
    finally:
        await harness.close()
        harness.store.close()


def _store_rows(local: LocalStore) -> list[tuple[object, ...]]:
    return [
        *local.conn.execute("SELECT * FROM call_state ORDER BY call_key"),
        *local.conn.execute("SELECT * FROM executor_state ORDER BY partition, key"),
    ]


async def test_a_restore_in_many_chunks_makes_the_store_a_restore_in_one_makes(
    tmp_path: Path, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore applies the topic in chunks, each with its checkpoint, in a thread while the
    next is fetched: cut into one record per chunk, it must leave the store exactly as one
    chunk does (a key's states, its book and the governance pairs across chunk ends)."""
    harness = KafkaHarness(tmp_path, services)
    await harness.start()
    try:
        await _calls(harness, range(12))
        await _calls(harness, range(6))  # replays: nothing new on the topic
        charge = {"customer_id": "cus_1", "amount_cents": 1250, "currency": "EUR"}
        asked = await harness.client.call(  # an approval book on the topic
            "charge_card", charge, idempotency_key="pay-1", context=ACME
        )
        assert asked.error is not None and asked.error.code == "APPROVAL_REQUIRED", asked
        await harness.stop()
        stores = sorted((tmp_path / "executor-state").glob("*.db"))
        states = books = 0
        for store in stores:
            with sqlite3.connect(store) as conn:
                rendered = conn.execute("SELECT v FROM meta WHERE k = 'identity'").fetchone()[0]
            identity = dict(pair.split("=", 1) for pair in rendered.split(","))
            identity.pop("format")
            whole = LocalStore(tmp_path / f"whole-{store.name}", identity)
            records = await restore_local(services.kafka, harness.topics, whole)
            monkeypatch.setattr(kafka_runtime, "RESTORE_CHUNK_BYTES", 1)
            cut = LocalStore(tmp_path / f"cut-{store.name}", identity)
            assert await restore_local(services.kafka, harness.topics, cut) == records
            monkeypatch.undo()
            assert cut.checkpoint == whole.checkpoint
            assert _store_rows(cut) == _store_rows(whole)
            books += whole.conn.execute(
                "SELECT COUNT(*) FROM call_state WHERE book_json IS NOT NULL"
            ).fetchone()[0]
            states += whole.conn.execute(
                "SELECT COUNT(*) FROM call_state WHERE state_json IS NOT NULL"
            ).fetchone()[0]
            whole.close()
            cut.close()
        assert (states, books) == (12, 1)
    finally:
        await harness.close()
        harness.store.close()


async def test_a_store_open_elsewhere_is_left_alone_and_its_partition_restored_apart(
    tmp_path: Path, services: Services
) -> None:
    """Executors on one host share a state directory by default: a store still locked by
    another executor (a paused former owner) is neither read nor written; the partition is
    restored into a store of the new owner's own, and every key still replays."""
    harness = KafkaHarness(tmp_path, services)
    state_dir = tmp_path / "executor-state"
    await harness.start()
    held: list[int] = []
    try:
        await _calls(harness, range(12))
        await harness.stop()
        stores = sorted(state_dir.glob("*.db"))
        assert len(stores) == harness.topics.partitions
        before = {store: store.read_bytes() for store in stores}
        for store in stores:  # what another process holding the stores holds
            fd = os.open(f"{store}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            held.append(fd)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

        await harness.start()
        assert _restored(harness) > 0  # restored from the topic, not read from the stores
        await _all_replay(harness, range(12))
        await harness.stop()
        assert {store: store.read_bytes() for store in stores} == before
    finally:
        for fd in held:
            os.close(fd)
        await harness.close()
        harness.store.close()


async def test_an_expiry_survives_a_takeover_by_a_host_without_the_store(
    tmp_path: Path, services: Services
) -> None:
    """The expiry reaches the state topic as the key's tombstone: a new owner that restores
    the partition from the topic alone (no local store) finds the key gone, and a call with
    it runs as a new call; a key that did not expire still replays."""
    harness = KafkaHarness(tmp_path, services)
    await harness.start()
    try:
        harness.registry.set_default_key_retention(timedelta(seconds=1))
        gone = await harness.client.call(
            "create_ticket", {"title": "gone"}, idempotency_key="k-gone", context=ACME
        )
        assert gone.ok

        async def expired() -> bool:
            row = await harness.call_row(gone.call_id)
            return row is not None and row["expired_at"] is not None

        await eventually(expired)
        harness.registry.set_default_key_retention(timedelta(hours=1))  # nothing else expires
        await _calls(harness, range(2))  # k0, k1: kept
        await harness.stop()
        shutil.rmtree(tmp_path / "executor-state")  # a new host: the topic is all there is
        await harness.start()
        assert _restored(harness) > 0
        await _all_replay(harness, range(2))
        again = await harness.client.call(
            "create_ticket", {"title": "gone"}, idempotency_key="k-gone", context=ACME
        )
        assert again.ok and not again.replayed, again
        assert harness.effects("create_ticket", "k-gone") == 2
    finally:
        await harness.close()
        harness.store.close()
