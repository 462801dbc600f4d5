"""Wiring of the embedded backend: one SQLite file, the executor in this process."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from datetime import timedelta
from pathlib import Path
from types import TracebackType

from processors.executor import DEFAULT_CONCURRENCY
from processors.key_cache import DEFAULT_CACHE_ENTRIES
from processors.pipeline import (
    DEFAULT_APPROVAL_REQUEST_TTL,
    DEFAULT_MAX_ARGUMENT_BYTES,
    Stages,
)
from processors.ports import Clock
from processors.runtime.embedded import DEFAULT_INTENTS_RETENTION_S, EmbeddedRuntime
from processors.runtime.group_runner import GroupRunner
from processors.runtime.sqlite_ledger import SqliteLedger
from processors.tools.redaction import Redactor
from processors.tools.registry import ToolRegistry
from producers.client import LedgerClient
from producers.outcomes import OutcomeHub
from projections.sqlite import SqliteCalls, SqliteReadModel
from schemas.events import Event
from schemas.keys import KeyScope
from toolledger.groups import embedded_groups

log = logging.getLogger("toolledger.embedded")

PROBE_INTERVAL_S = 1.0


class EmbeddedLedger:
    """``async with EmbeddedLedger(path, registry) as ledger: await ledger.client.call(...)``."""

    def __init__(
        self,
        path: Path,
        registry: ToolRegistry,
        *,
        partitions: int = 4,
        concurrency: int = DEFAULT_CONCURRENCY,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        synchronous: str = "FULL",
        sweep_interval_s: float = 1.0,
        max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES,
        default_wait_s: float = 10.0,
        approval_request_ttl: timedelta = DEFAULT_APPROVAL_REQUEST_TTL,
        create: bool | None = None,
        shutdown_timeout_s: float = 30.0,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
        intents_retention: timedelta | None = timedelta(seconds=DEFAULT_INTENTS_RETENTION_S),
        key_scope: KeyScope | None = None,
    ) -> None:
        """``create``: make the ledger if it does not exist (True), never (False), or only in a
        new, empty directory (None); see :class:`SqliteLedger`. ``cache_entries``: call keys
        held in memory (the others are read from the file when used). ``intents_retention``:
        how long the raw arguments of approval requests (their only copy) are kept; None:
        forever. ``key_scope``: the scope of the keys of tools that set none, recorded in a new
        ledger's file (None: the file's, or :data:`DEFAULT_KEY_SCOPE` for a new one); the
        ledger sets it as ``registry``'s default when it starts."""
        self.path = Path(path)
        self._cache_entries = cache_entries
        self._intents_retention_s = _seconds(intents_retention)
        self._create = create
        self.shutdown_timeout_s = shutdown_timeout_s
        self._probed_at = float("-inf")
        self._writable = True
        self.registry = registry
        self.outcomes = OutcomeHub()
        self._partitions = partitions
        self._concurrency = concurrency
        self._clock = clock
        self._rng = rng
        self._synchronous = synchronous
        self._sweep_interval_s = sweep_interval_s
        self._max_argument_bytes = max_argument_bytes
        self._approval_request_ttl = approval_request_ttl
        self._key_scope = key_scope
        self.client = LedgerClient(
            self,
            default_wait_s=default_wait_s,
            max_argument_bytes=max_argument_bytes,
            key_scopes=registry.key_scope_of,
        )
        self.file: SqliteLedger | None = None
        self.runtime: EmbeddedRuntime | None = None
        self.groups: GroupRunner | None = None

    async def start(self) -> EmbeddedLedger:
        self.file = SqliteLedger(
            self.path,
            read_model=SqliteReadModel(),
            partitions=self._partitions,
            synchronous=self._synchronous,
            create=self._create,
            key_scope=self._key_scope,
        )
        self.registry.set_default_key_scope(self.file.key_scope)
        stages = Stages(
            self.registry,
            Redactor(bytes.fromhex(self.file.meta("redaction_secret"))),
            clock=self._clock,
            rng=self._rng,
            max_argument_bytes=self._max_argument_bytes,
            approval_request_ttl=self._approval_request_ttl,
        )
        self.runtime = EmbeddedRuntime(
            self.file,
            stages,
            clock=self._clock,
            concurrency=self._concurrency,
            on_committed=self.outcomes.publish,
            on_abandoned=self.outcomes.fail,
            sweep_interval_s=self._sweep_interval_s,
            cache_entries=self._cache_entries,
            intents_retention_s=self._intents_retention_s,
        )
        try:
            await self.runtime.start()
        except BaseException:
            self.file.close()
            raise
        # call groups: their orchestrator drives again what had not finished
        self.groups = embedded_groups(self.file, self.client, lambda: self.registry)
        await self.groups.start()
        return self

    def queries(self) -> SqliteCalls:
        """The read side over this ledger's file (close it when done)."""
        assert self.file is not None and self.runtime is not None, "start() the ledger first"
        return SqliteCalls(self.file.conn, path=self.path, moved=self.runtime.derived)

    def writable(self) -> bool:
        """Whether the ledger can commit now: the last write succeeded, and a probe write
        does (at most once a second)."""
        assert self.runtime is not None, "start() the ledger first"
        now = time.monotonic()
        if now - self._probed_at >= PROBE_INTERVAL_S:
            self._probed_at = now
            ok = self.runtime.writable()
            if ok != self._writable:
                log.warning("the ledger can commit" if ok else "the ledger cannot commit")
            self._writable = ok
        elif self.runtime.failing:
            self._writable = False
        return self._writable

    async def send(self, intent: Event) -> None:
        assert self.runtime is not None, "start() the ledger first"
        await self.runtime.send(intent)

    async def broadcast(self, record: Event) -> None:
        assert self.runtime is not None, "start() the ledger first"
        await self.runtime.broadcast(record)

    async def close(self, *, grace_s: float = 0.0) -> None:
        """Stop the executor and release the file. With ``grace_s``, running calls first get
        that long to finish and commit (a call still running then is recovered as UNKNOWN at
        the next start, as after a crash); without it, in-flight work is cancelled at once."""
        try:
            if self.groups is not None:
                await self.groups.stop()  # recorded decisions are driven again at the start
                self.groups = None
            if self.runtime is not None:
                if grace_s > 0:
                    try:
                        await asyncio.wait_for(self.runtime.drain(), grace_s)
                    except TimeoutError:
                        log.warning(
                            "calls still running at the shutdown timeout: they will be "
                            "reconciled at the next start",
                            extra={"timeout_s": grace_s},
                        )
                await self.runtime.stop()
        finally:
            self.runtime = None
            if self.file is not None:
                self.file.close()  # releases the file lock, whatever happened above
                self.file = None

    async def __aenter__(self) -> EmbeddedLedger:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close(grace_s=self.shutdown_timeout_s if exc is None else 0.0)


def _seconds(retention: timedelta | None) -> float | None:
    return None if retention is None else retention.total_seconds()
