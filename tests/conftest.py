"""Fixtures shared by every suite."""

from __future__ import annotations

import pytest

from tests.services import Services


@pytest.fixture(scope="session")
def services() -> Services:
    """The real Kafka and PostgreSQL that ``make test`` starts; their absence fails the test."""
    return Services.from_env()
