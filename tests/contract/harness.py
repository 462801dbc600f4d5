"""What the contract suite needs from a backend. One subclass per backend binds the suite."""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from toolledger.processors.tools.manifest import RetryPolicy, Tool, ToolDescription
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry
from toolledger.producers.client import LedgerClient, TrustedContext

ACME = TrustedContext("acme", "alice@acme")
GLOBEX = TrustedContext("globex", "bob@globex")
# flaky_write's tool timeout. The suite's slow calls sleep 300-400 ms inside it and then write
# their effect (an fsync): on a loaded two-core CI machine that write and the event loop's
# scheduling have taken more than the 100-200 ms a 0.5 s timeout left, turning a slow call
# into an UNKNOWN one. The hanging calls wait for this timeout, so it stays short.
FLAKY_TIMEOUT_S = 1.0
FAST_RETRY = RetryPolicy(backoff_base_s=0.01, backoff_cap_s=0.05)


def contract_registry(store: HelpdeskStore) -> ToolRegistry:
    """The helpdesk with short timeouts and backoffs, so the suite stays quick."""
    return helpdesk_registry(
        store, flaky_timeout_s=FLAKY_TIMEOUT_S, timeout_s=5.0, retry=FAST_RETRY
    )


class Harness(ABC):
    name: str
    store: HelpdeskStore

    def __init__(self, workdir: Path, *, cache_entries: int | None = None) -> None:
        """``cache_entries``: the executor's key cache (None: its default; 1: every key but
        the running ones is read from the store when used)."""
        self.workdir = workdir
        self.cache_entries = cache_entries
        self.store = HelpdeskStore(workdir / "downstream.db")
        self.registry = contract_registry(self.store)

    @property
    @abstractmethod
    def client(self) -> LedgerClient: ...

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    @abstractmethod
    async def crash(self) -> None:
        """Stop the executor abruptly: nothing after the last durable commit survives."""

    async def close(self) -> None:
        """Release everything the harness holds (after the test)."""
        await self.crash()

    async def restart(self, *, crash: bool = False) -> None:
        await (self.crash() if crash else self.stop())
        await self.start()

    @abstractmethod
    async def call_rows(self) -> list[dict[str, Any]]:
        """``tool_calls`` once the projection has caught up with the log, ordered by call_id."""

    @abstractmethod
    async def event_rows(self) -> list[dict[str, Any]]:
        """``tool_call_events`` once caught up, ordered by event_id (``seq`` excluded)."""

    @abstractmethod
    async def rebuild(self) -> None:
        """Drop the projections and rebuild them from the log (``toolledger replay``)."""

    @abstractmethod
    async def send_raw(self, value: bytes) -> None:
        """Put bytes on the intents stream as they are."""

    @abstractmethod
    async def dead_letter_reasons(self) -> list[str]: ...

    def effects(self, tool: str, key: str, tenant: str = "acme") -> int:
        return self.store.effect_count(tenant, tool, key)

    async def call_row(self, call_id: str) -> dict[str, Any] | None:
        return next((r for r in await self.call_rows() if r["call_id"] == call_id), None)


def register_tool(
    ledger: Harness,
    name: str,
    arguments: type[BaseModel],
    result: type[BaseModel],
    handler: Any,
    **manifest: Any,
) -> None:
    """A tool of a test's own, registered while the ledger runs (it reads its registry on
    every use); ``manifest``: the rest of the :class:`Tool`'s fields."""
    ledger.registry.register(
        Tool(
            name=name,
            version="1",
            arguments=arguments,
            result=result,
            handler=handler,
            description=ToolDescription(name, "tests", "never", "none", "replayed"),
            **manifest,
        )
    )


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.05)
