"""What the front door keeps between requests for its governance pre-checks: the run budget in
force and the switches it read last (its own module: the front door holds them, and the
pre-checks in :mod:`producers.http.governance` read them through it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from toolledger.schemas.calls import SwitchView

SWITCH_CACHE_S = 1.0


@dataclass(frozen=True, slots=True)
class RunBudget:
    """Per run: at most ``max_attempts`` handler attempts over all its calls, and no more
    calls of a tool once one failure fingerprint of that tool repeated ``max_repeats`` times."""

    max_attempts: int = 100
    max_repeats: int = 3


class SwitchCache:
    """The switches in force per tenant, read from the projection at most once a second.

    A pre-check only: the executor applies the switch authoritatively, in log order."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, list[SwitchView]]] = {}
        self._loading: dict[str, asyncio.Task[list[SwitchView]]] = {}

    async def get(
        self, tenant_id: str, load: Callable[[str], Awaitable[list[SwitchView]]]
    ) -> list[SwitchView]:
        """One read per tenant at a time: the callers that find the entry stale while it is
        read wait for that read (not 64 reads of the audit trail at once, every second)."""
        now = time.monotonic()
        cached = self._entries.get(tenant_id)
        if cached is not None and now - cached[0] < SWITCH_CACHE_S:
            return cached[1]
        loading = self._loading.get(tenant_id)
        if loading is None:
            loading = self._loading[tenant_id] = asyncio.ensure_future(load(tenant_id))
            loading.add_done_callback(lambda _: self._loading.pop(tenant_id, None))
        switches = await asyncio.shield(loading)
        self._entries[tenant_id] = (now, switches)
        return switches

    def clear(self) -> None:
        self._entries.clear()
