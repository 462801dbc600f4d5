"""Where the real services are: ``TOOLLEDGER_KAFKA`` (bootstrap) and ``TOOLLEDGER_POSTGRES``
(DSN), e.g. from ``. services/env.sh``.

With ``TOOLLEDGER_REQUIRE_SERVICES=1`` (CI) a missing or unreachable service FAILS the tests
that need it; without it they are skipped, with the reason.
"""

from __future__ import annotations

import os
import socket

import psycopg
import pytest

REQUIRE_VAR = "TOOLLEDGER_REQUIRE_SERVICES"


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_VAR) == "1":
        pytest.fail(f"{reason} ({REQUIRE_VAR}=1)", pytrace=False)
    pytest.skip(f"{reason}; start the services (bash services/up.sh; . services/env.sh)")


def _env(name: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        _unavailable(f"{name} is not set")
    return value


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """``TOOLLEDGER_KAFKA``, once a TCP connection to each bootstrap server succeeds."""
    bootstrap = _env("TOOLLEDGER_KAFKA")
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
        except (OSError, ValueError) as exc:
            _unavailable(f"Kafka at {server} (TOOLLEDGER_KAFKA) is unreachable: {exc}")
    return bootstrap


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    """``TOOLLEDGER_POSTGRES``, once a connection to it succeeds."""
    dsn = _env("TOOLLEDGER_POSTGRES")
    try:
        psycopg.connect(dsn, connect_timeout=5).close()
    except psycopg.Error as exc:
        _unavailable(f"PostgreSQL (TOOLLEDGER_POSTGRES) is unreachable: {exc}")
    return dsn
