"""The integration tests' view of the real services (``tests/services.py``): a missing or
unreachable broker or database fails them."""

from __future__ import annotations

import pytest

from tests.services import Services


@pytest.fixture(scope="session")
def kafka_bootstrap(services: Services) -> str:
    return services.kafka


@pytest.fixture(scope="session")
def postgres_dsn(services: Services) -> str:
    return services.postgres
