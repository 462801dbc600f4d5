"""Fixtures of the MCP tests."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["auto", "legacy"], ids=["per-request", "handshake"])
def mode(request: pytest.FixtureRequest) -> str:
    """The MCP client's protocol: the 2026-07-28 per-request protocol (the client's default,
    ``auto``) or the initialize handshake with a stateful session (``legacy``)."""
    value: str = request.param
    return value
