"""Binds the contract suite to every backend: each test runs once per backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.contract.embedded import EmbeddedHarness
from tests.contract.harness import Harness

BACKENDS: dict[str, Callable[[Path], Harness]] = {"embedded": EmbeddedHarness}


@pytest.fixture(params=sorted(BACKENDS))
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    harness = BACKENDS[request.param](tmp_path)
    await harness.start()
    try:
        yield harness
    finally:
        await harness.crash()
        harness.store.close()
