"""Binds the contract suite to every backend: each test runs once per backend, and once more
per backend with a key cache of one entry (a differential run: every key that is not in use
is read from the store, so an answer that depended on what the cache holds would differ), and
once through the HTTP transport (``Ledger.http``) in front of the embedded backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.contract.embedded import EmbeddedHarness
from tests.contract.harness import Harness

BACKENDS: list[Any] = [
    "embedded",
    "embedded-cache1",
    "http",
    pytest.param("kafka", marks=pytest.mark.services),
    pytest.param("kafka-cache1", marks=pytest.mark.services),
]
# the suites that read the ledger's events from a call's result, which only an in-process
# client has (over HTTP a result is what the HTTP API answers)
IN_PROCESS_BACKENDS = [b for b in BACKENDS if b != "http"]


async def open_harness(
    request: pytest.FixtureRequest, tmp_path: Path, variant: str | None = None
) -> AsyncIterator[Harness]:
    """The harness of ``variant`` (one of :data:`BACKENDS`; default: the fixture's param)."""
    harness: Harness
    backend, _, cache = (variant or str(request.param)).partition("-")
    cache_entries = 1 if cache == "cache1" else None
    if backend == "kafka":
        from tests.contract.kafka import KafkaHarness

        harness = KafkaHarness(
            tmp_path, request.getfixturevalue("services"), cache_entries=cache_entries
        )
    elif backend == "http":
        from tests.contract.http import HttpHarness

        harness = HttpHarness(tmp_path)
    else:
        harness = EmbeddedHarness(tmp_path, cache_entries=cache_entries)
    await harness.start()
    try:
        yield harness
    finally:
        await harness.close()
        harness.store.close()


@pytest.fixture(params=BACKENDS)
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    async for harness in open_harness(request, tmp_path):
        yield harness
