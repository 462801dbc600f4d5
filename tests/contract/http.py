"""The contract suite's HTTP binding: the calls go through ``Ledger.http``'s transport
(:class:`producers.http_client.HttpLedgerClient`) and the HTTP API, in front of an embedded
ledger. Each caller calls with its own bearer token; the server takes the tenant from it."""

from __future__ import annotations

from tests.contract.embedded import EmbeddedHarness
from tests.over_http import OverHttp, over_http
from toolledger.producers.client import LedgerClient


class HttpHarness(EmbeddedHarness):
    name = "http"
    _over_http: OverHttp | None = None

    @property
    def client(self) -> LedgerClient:
        assert self._over_http is not None
        return self._over_http  # type: ignore[return-value]  # the suite's part of it

    async def start(self) -> None:
        await super().start()
        assert self.ledger is not None
        # the registry is read on every use: the suite registers tools while the ledger runs
        self._over_http = over_http(self.ledger, lambda: self.registry)

    async def _close_http(self) -> None:
        if self._over_http is not None:
            await self._over_http.close()
            self._over_http = None

    async def stop(self) -> None:
        await self._close_http()
        await super().stop()

    async def crash(self) -> None:
        await self._close_http()
        await super().crash()
