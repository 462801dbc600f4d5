"""The contract suite's embedded binding: the SQLite log in this process."""

from __future__ import annotations

import sqlite3
from typing import Any

from tests.contract.harness import Harness
from toolledger.embedded import EmbeddedLedger
from toolledger.processors.key_cache import DEFAULT_CACHE_ENTRIES
from toolledger.producers.client import LedgerClient
from toolledger.settings import LedgerSettings


class EmbeddedHarness(Harness):
    name = "embedded"
    ledger: EmbeddedLedger | None = None

    @property
    def client(self) -> LedgerClient:
        assert self.ledger is not None
        return self.ledger.client

    async def start(self) -> None:
        self.ledger = EmbeddedLedger(
            LedgerSettings(
                path=self.workdir / "ledger.db",
                sweep_interval_s=0.1,
                create=True,
                cache_entries=self.cache_entries or DEFAULT_CACHE_ENTRIES,
            ),
            self.registry,
        )
        await self.ledger.start()

    async def stop(self) -> None:
        if self.ledger is not None:
            assert self.ledger.runtime is not None
            await self.ledger.runtime.drain()
            await self.ledger.close()
            self.ledger = None

    async def crash(self) -> None:
        if self.ledger is not None:
            await self.ledger.close()  # cancels in-flight work wherever it is
            self.ledger = None

    def _rows(self, sql: str) -> list[dict[str, Any]]:
        assert self.ledger is not None and self.ledger.file is not None
        conn = self.ledger.file.conn
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute(sql)]
        finally:
            conn.row_factory = None

    async def call_rows(self) -> list[dict[str, Any]]:
        assert self.ledger is not None and self.ledger.runtime is not None
        await self.ledger.runtime.drain()
        return self._rows("SELECT * FROM tool_calls ORDER BY call_id")

    async def event_rows(self) -> list[dict[str, Any]]:
        assert self.ledger is not None and self.ledger.runtime is not None
        await self.ledger.runtime.drain()
        rows = self._rows("SELECT * FROM tool_call_events ORDER BY event_id")
        for row in rows:
            del row["seq"]
        return rows

    async def rebuild(self) -> None:
        assert self.ledger is not None and self.ledger.file is not None
        assert self.ledger.runtime is not None
        await self.ledger.runtime.drain()
        self.ledger.file.rebuild()

    async def send_raw(self, value: bytes) -> None:
        assert self.ledger is not None and self.ledger.runtime is not None
        executor = self.ledger.runtime.executor
        assert executor is not None, "the embedded ledger is not running"
        executor.feed_raw(0, value)  # decoded, or dead-lettered

    async def dead_letter_reasons(self) -> list[str]:
        assert self.ledger is not None and self.ledger.runtime is not None
        await self.ledger.runtime.drain()
        return [r["reason"] for r in self._rows("SELECT reason FROM dead_letters ORDER BY id")]
