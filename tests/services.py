"""Access to the real services that ``services/with-services.sh`` starts for ``make test``.

A test that needs them and does not find them fails: it never skips. ``make test-unit``
deselects those tests (marker ``services``) for a quick run without services.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import NoReturn

import psycopg
import pytest

from toolledger.projections.postgres import migrate


def _reachable(host_port: str) -> bool:
    host, _, port = host_port.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def unavailable(reason: str) -> NoReturn:
    pytest.fail(f"{reason}: run 'make test', which starts the real services", pytrace=False)


@dataclass
class Services:
    kafka: str
    postgres: str
    _template: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls) -> Services:
        kafka = os.environ.get("TOOLLEDGER_KAFKA", "")
        postgres = os.environ.get("TOOLLEDGER_POSTGRES", "")
        if not kafka or not postgres:
            unavailable("TOOLLEDGER_KAFKA and TOOLLEDGER_POSTGRES are not set")
        if not _reachable(kafka):
            unavailable(f"no Kafka broker at {kafka}")
        try:
            psycopg.connect(postgres, connect_timeout=3).close()
        except psycopg.OperationalError as exc:
            unavailable(f"no PostgreSQL at {postgres}: {exc}")
        return cls(kafka, postgres)

    def _dsn(self, database: str) -> str:
        return psycopg.conninfo.make_conninfo(self.postgres, dbname=database)

    async def fresh_database(self) -> str:
        """A new database with the projections migrated (copied from a migrated template)."""
        if self._template is None:
            template = f"tl_template_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(self.postgres, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{template}"')
            await migrate(self._dsn(template))
            self._template = template
        name = f"tl_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.postgres, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"')
        return self._dsn(name)
