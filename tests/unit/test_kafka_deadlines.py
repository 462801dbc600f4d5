"""A Kafka transaction or producer that never ends does not hold a partition for ever: the
commit raises after its deadline (the executor stops, the partition is taken over again) and
a producer that does not stop is left behind after a bounded wait."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from toolledger.processors.ports import CommitBatch
from toolledger.processors.runtime import kafka as kafka_runtime
from toolledger.processors.runtime.kafka import KafkaStore
from toolledger.processors.runtime.local_store import LocalStore
from toolledger.schemas.topics import Topics

IDENTITY = {"cluster": "c", "group": "g", "topic": "t.state", "partition": "0", "partitions": "1"}


class HangingProducer:
    """A transactional producer whose transactions never end and which never stops."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.forever = asyncio.Event()

    async def begin_transaction(self) -> None:
        self.calls.append("begin")

    async def send_offsets_to_transaction(self, offsets: Any, group_id: str) -> None:
        self.calls.append("offsets")

    async def commit_transaction(self) -> None:
        self.calls.append("commit")
        await self.forever.wait()

    async def abort_transaction(self) -> None:
        self.calls.append("abort")
        await self.forever.wait()

    async def stop(self) -> None:
        self.calls.append("stop")
        await self.forever.wait()


async def test_a_commit_that_never_ends_raises_after_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_runtime, "COMMIT_DEADLINE_S", 0.2)
    monkeypatch.setattr(kafka_runtime, "CLOSE_WAIT_S", 0.1)
    producer = HangingProducer()
    local = LocalStore(tmp_path / "p0.db", IDENTITY)
    try:
        store = KafkaStore(producer, Topics("t.", 1), 0, local, 0)
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            await store.commit(CommitBatch(positions={0: 5}))
        assert time.monotonic() - began < 5
        assert producer.calls == ["begin", "offsets", "commit", "abort"]
        assert store.load().positions[0] == 0  # nothing counted as committed
    finally:
        local.close()


async def test_a_producer_that_never_stops_is_left_behind_after_the_close_wait(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(kafka_runtime, "CLOSE_WAIT_S", 0.1)
    producer = HangingProducer()
    began = time.monotonic()
    await kafka_runtime._stop_producer(producer)
    assert time.monotonic() - began < 5
    assert producer.calls == ["stop"]
    assert "did not stop cleanly" in caplog.text
