"""Binds the contract suite to every backend: each test runs once per backend, and once more
per backend with a key cache of one entry (a differential run: every key that is not in use
is read from the store, so an answer that depended on what the cache holds would differ)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.contract.embedded import EmbeddedHarness
from tests.contract.harness import Harness


@pytest.fixture(
    params=[
        "embedded",
        "embedded-cache1",
        pytest.param("kafka", marks=pytest.mark.services),
        pytest.param("kafka-cache1", marks=pytest.mark.services),
    ]
)
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    harness: Harness
    backend, _, cache = str(request.param).partition("-")
    cache_entries = 1 if cache == "cache1" else None
    if backend == "kafka":
        from tests.contract.kafka import KafkaHarness

        harness = KafkaHarness(
            tmp_path, request.getfixturevalue("services"), cache_entries=cache_entries
        )
    else:
        harness = EmbeddedHarness(tmp_path, cache_entries=cache_entries)
    await harness.start()
    try:
        yield harness
    finally:
        await harness.close()
        harness.store.close()
