"""The embedded backend: one SQLite file (``settings.path``) holds the log, the state and the
read models, and the executor runs in this process (:class:`toolledger.embedded.EmbeddedLedger`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import datetime

from toolledger.backends import BackendFactory, BackendParts
from toolledger.config import ConfigError
from toolledger.embedded import EmbeddedLedger
from toolledger.processors.runtime.intent_lookup import SqliteIntentLookup
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.projections.audit_retention import prune_sqlite


class Factory(BackendFactory):
    @contextlib.asynccontextmanager
    async def open(self, registry: ToolRegistry | None) -> AsyncIterator[BackendParts]:
        if registry is None:
            raise ConfigError("the embedded backend runs the tools here: give their registry")
        async with EmbeddedLedger(self.settings, registry) as ledger:
            assert ledger.file is not None and ledger.runtime is not None
            runtime, file = ledger.runtime, ledger.file

            async def ready() -> dict[str, bool]:
                return {"executor": runtime.running, "ledger_writable": ledger.writable()}

            async def prune(cutoff: datetime) -> int:  # in turn with the writer (locked_write)
                return await asyncio.to_thread(prune_sqlite, file.locked_write, cutoff)

            queries = ledger.queries()
            intents = SqliteIntentLookup(self.settings.path)
            try:
                yield BackendParts(ledger.client, queries, ledger.groups, intents, ready, prune)
            finally:
                intents.close()
                queries.close()
