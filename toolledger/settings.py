"""What a ledger is and how it runs: one typed settings object shared by ``toolledger serve``,
``mcp``, ``executor`` and ``Ledger.embedded`` / ``Ledger.kafka``.

The commands build it from their options (each option's environment variable, where it has
one, is read by the command line: docs/operations.md lists them); the SDK builds it from the
keyword arguments of ``Ledger.embedded(path, registry, **settings)``. A retention may be given
as text (``"7d"``, ``"PT24H"``, ``"forever"``) or as a ``timedelta``; ``None`` keeps forever.
:func:`toolledger.backends.backend_factory` turns it into a backend.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from toolledger.config import DEFAULT_KAFKA, ConfigError
from toolledger.processors.executor import DEFAULT_CONCURRENCY
from toolledger.processors.key_cache import DEFAULT_CACHE_ENTRIES
from toolledger.processors.pipeline import DEFAULT_APPROVAL_REQUEST_TTL, DEFAULT_MAX_ARGUMENT_BYTES
from toolledger.processors.runtime.embedded import DEFAULT_INTENTS_RETENTION_S
from toolledger.processors.tools.retention import FOREVER, KeyRetention, parse_retention
from toolledger.schemas.errors import one_line
from toolledger.schemas.keys import KeyScope
from toolledger.schemas.topics import Topics

EMBEDDED = "embedded"
KAFKA = "kafka"


class LedgerSettings(BaseModel):
    """One ledger's settings. ``backend``: ``"embedded"`` (one SQLite file, ``path``, the
    executor in this process), ``"kafka"`` (intents to the Kafka cluster ``kafka``, read
    models in PostgreSQL ``postgres``), or the import name of a module that defines a
    ``Factory`` (:class:`toolledger.backends.BackendFactory`) of another backend."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str = EMBEDDED

    # embedded: the ledger file
    path: Path = Path(".toolledger") / "ledger.db"
    # make the ledger if there is none: True, never (False), or only in a new, empty
    # directory (None)
    create: bool | None = None
    synchronous: str = "FULL"  # SQLite's synchronous pragma of the ledger file

    # Kafka + PostgreSQL: the cluster, the topics' prefix and the read models' database
    kafka: str = DEFAULT_KAFKA
    postgres: str | None = None
    prefix: str = "toolledger."
    partitions: int = Field(default=4, ge=1)  # of the topics, or of the embedded log

    # the executor
    concurrency: int = Field(default=DEFAULT_CONCURRENCY, ge=1)
    cache_entries: int = Field(default=DEFAULT_CACHE_ENTRIES, ge=1)  # keys held in memory
    sweep_interval_s: float = Field(default=1.0, gt=0)
    session_timeout_ms: int = 30_000  # Kafka: the consumer group's session timeout
    state_dir: Path | None = None  # Kafka: the local stores of owned partitions
    approval_request_ttl: timedelta = DEFAULT_APPROVAL_REQUEST_TTL
    max_argument_bytes: int = Field(default=DEFAULT_MAX_ARGUMENT_BYTES, ge=1)
    # the scope of the keys of tools that set none: embedded, recorded in a new ledger's file
    # (None: the file's, or DEFAULT_KEY_SCOPE for a new one); Kafka: what the executors apply
    # and the front doors send (None: DEFAULT_KEY_SCOPE)
    key_scope: KeyScope | None = None

    # what is kept, for how long (None: forever)
    key_retention: KeyRetention | None = None  # None: the registry's default (24h)
    intents_retention: timedelta | None = timedelta(seconds=DEFAULT_INTENTS_RETENTION_S)
    audit_retention: timedelta | None = None

    # the callers
    default_wait_s: float = Field(default=10.0, ge=0)
    shutdown_timeout_s: float = Field(default=30.0, ge=0)

    @field_validator("key_retention", mode="before")
    @classmethod
    def _key_retention(cls, value: Any) -> Any:
        return parse_retention(value) if isinstance(value, str) else value

    @field_validator("key_scope", mode="before")
    @classmethod
    def _key_scope(cls, value: Any) -> Any:
        return KeyScope.parse(value) if isinstance(value, str) else value

    @field_validator("intents_retention", "audit_retention", mode="before")
    @classmethod
    def _retention(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        parsed = parse_retention(value, "retention")
        return None if parsed == FOREVER else parsed

    @property
    def topics(self) -> Topics:
        return Topics(self.prefix, self.partitions)

    @classmethod
    def of(cls, **given: Any) -> LedgerSettings:
        """The settings from ``given`` (options or keyword arguments), or
        :class:`~toolledger.config.ConfigError` in one line naming what is wrong."""
        try:
            return cls(**given)
        except ValidationError as exc:
            raise ConfigError(one_line(exc, root="settings")) from None
