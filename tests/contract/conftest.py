"""Binds the contract suite to every backend: each test runs once per backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.contract.embedded import EmbeddedHarness
from tests.contract.harness import Harness


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.services)])
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    harness: Harness
    if request.param == "kafka":
        from tests.contract.kafka import KafkaHarness

        harness = KafkaHarness(tmp_path, request.getfixturevalue("services"))
    else:
        harness = EmbeddedHarness(tmp_path)
    await harness.start()
    try:
        yield harness
    finally:
        await harness.close()
        harness.store.close()
