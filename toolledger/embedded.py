"""Wiring of the embedded backend: one SQLite file, the executor in this process."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from types import TracebackType

from toolledger.groups import embedded_groups
from toolledger.processors.pipeline import Stages
from toolledger.processors.ports import Clock
from toolledger.processors.runtime.embedded import EmbeddedRuntime
from toolledger.processors.runtime.group_runner import GroupRunner
from toolledger.processors.runtime.sqlite_ledger import SqliteLedger
from toolledger.processors.tools.redaction import Redactor
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.producers.client import LedgerClient
from toolledger.producers.outcomes import OutcomeHub
from toolledger.projections.sqlite import SqliteCalls, SqliteReadModel
from toolledger.schemas.events import Event
from toolledger.settings import LedgerSettings

log = logging.getLogger("toolledger.embedded")

PROBE_INTERVAL_S = 1.0


class EmbeddedLedger:
    """``async with EmbeddedLedger(LedgerSettings(path=...), registry) as ledger:
    await ledger.client.call(...)``: the ledger file ``settings.path`` and its executor in this
    process (``clock`` and ``rng``: the executor's, for tests)."""

    def __init__(
        self,
        settings: LedgerSettings,
        registry: ToolRegistry,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.path = settings.path
        self.shutdown_timeout_s = settings.shutdown_timeout_s
        self._probed_at = float("-inf")
        self._writable = True
        self.registry = registry
        if settings.key_retention is not None:
            registry.set_default_key_retention(settings.key_retention)
        self.outcomes = OutcomeHub()
        self._clock = clock
        self._rng = rng
        self.client = LedgerClient(
            self,
            default_wait_s=settings.default_wait_s,
            max_argument_bytes=settings.max_argument_bytes,
            key_scopes=registry.key_scope_of,
        )
        self.file: SqliteLedger | None = None
        self.runtime: EmbeddedRuntime | None = None
        self.groups: GroupRunner | None = None

    async def start(self) -> EmbeddedLedger:
        settings = self.settings
        self.file = SqliteLedger(
            self.path,
            read_model=SqliteReadModel(),
            partitions=settings.partitions,
            synchronous=settings.synchronous,
            create=settings.create,
            key_scope=settings.key_scope,
        )
        self.registry.set_default_key_scope(self.file.key_scope)
        stages = Stages(
            self.registry,
            Redactor(bytes.fromhex(self.file.meta("redaction_secret"))),
            clock=self._clock,
            rng=self._rng,
            max_argument_bytes=settings.max_argument_bytes,
            approval_request_ttl=settings.approval_request_ttl,
        )
        retention = settings.intents_retention
        self.runtime = EmbeddedRuntime(
            self.file,
            stages,
            clock=self._clock,
            concurrency=settings.concurrency,
            on_committed=self.outcomes.publish,
            on_abandoned=self.outcomes.fail,
            sweep_interval_s=settings.sweep_interval_s,
            cache_entries=settings.cache_entries,
            intents_retention_s=None if retention is None else retention.total_seconds(),
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
        return SqliteCalls(
            self.file.conn,
            path=self.path,
            moved=self.runtime.derived,
            caught_up=self.runtime.caught_up,
        )

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
