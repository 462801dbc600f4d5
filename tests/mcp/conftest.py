"""Fixtures of the MCP tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.http.servers import Server, start_distributed
from tests.services import Services


@pytest.fixture(params=["auto", "legacy"], ids=["per-request", "handshake"])
def mode(request: pytest.FixtureRequest) -> str:
    """The MCP client's protocol: the 2026-07-28 per-request protocol (the client's default,
    ``auto``) or the initialize handshake with a stateful session (``legacy``)."""
    value: str = request.param
    return value


@pytest.fixture
def kafka_mcp(tmp_path: Path, services: Services) -> Iterator[Server]:
    """``toolledger mcp --transport http`` on Kafka + PostgreSQL, with its executor and
    projector."""
    front = start_distributed(tmp_path, services, front="mcp")
    try:
        yield front
    finally:
        front.stop()
