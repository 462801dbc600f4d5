"""Calls over the HTTP API in front of an in-process embedded ledger, for suites that run once
in-process and once through the HTTP transport (:class:`producers.http_client.HttpLedgerClient`
over httpx's ASGI transport: real HTTP semantics, no socket). Each caller the suite names gets
a bearer token of its own; the server takes tenant, principal and scopes from it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

from toolledger.embedded import EmbeddedLedger
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.producers.client import CallResult, LedgerClient, TrustedContext
from toolledger.producers.http.app import ToolInfo, create_app
from toolledger.producers.http.auth import UNKNOWN_TOKEN, AuthFailure, TokenStore, bearer_token
from toolledger.producers.http_client import HttpLedgerClient, RemoteTool
from toolledger.projections.sqlite import SqliteCalls
from toolledger.schemas.events import Event
from toolledger.serve import Security, tool_infos


class LiveTools(Mapping[str, ToolInfo]):
    """The registry's tools as the front door sees them, read on every use: the suite
    registers tools of its own while the ledger runs."""

    def __init__(self, registry: Callable[[], ToolRegistry]) -> None:
        self._registry = registry

    def _infos(self) -> dict[str, ToolInfo]:
        return tool_infos(self._registry())

    def __getitem__(self, name: str) -> ToolInfo:
        return self._infos()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._infos())

    def __len__(self) -> int:
        return len(self._infos())


class ContextTokens:
    """The server's authentication: one bearer token per caller the suite names (its tenant,
    principal and scopes), made when the caller first calls."""

    def __init__(self) -> None:
        self.contexts: dict[str, TrustedContext] = {}

    def token_for(self, context: TrustedContext) -> str:
        caller = TrustedContext(context.tenant_id, context.principal, context.scopes)
        for token, known in self.contexts.items():
            if known == caller:
                return token
        token = f"contract-token-{len(self.contexts):04d}-{uuid.uuid4().hex}"
        self.contexts[token] = caller
        return token

    def check(self, authorization: str | None) -> TrustedContext | AuthFailure:
        token = bearer_token(authorization)
        if isinstance(token, AuthFailure):
            return token
        return self.contexts.get(token, UNKNOWN_TOKEN)

    def authenticate(self, authorization: str | None) -> TrustedContext | None:
        context = self.check(authorization)
        return context if isinstance(context, TrustedContext) else None


class OverHttp:
    """``client.call`` over HTTP with the caller's own token; operators' commands (which the
    suite sends as events) go to the ledger directly."""

    def __init__(
        self, app: Any, tokens: ContextTokens, direct: LedgerClient, calls: SqliteCalls
    ) -> None:
        self._app = app
        self._calls = calls
        self._tokens = tokens
        self._clients: dict[str, HttpLedgerClient] = {}
        self._direct = direct

    def _client(self, context: TrustedContext) -> HttpLedgerClient:
        token = self._tokens.token_for(context)
        if token not in self._clients:
            transport = httpx.ASGITransport(app=self._app)
            self._clients[token] = HttpLedgerClient(
                "http://ledger.test", token, transport=transport
            )
        return self._clients[token]

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._calls.close()

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        idempotency_key: str | None,
        context: TrustedContext,
        wait: float | None = None,
        run_id: str | None = None,
        step_id: str | None = None,
        approval_token: str | None = None,
    ) -> CallResult:
        return await self._client(context).call(
            tool,
            arguments,
            idempotency_key=idempotency_key,
            context=context,
            wait=wait,
            run_id=run_id,
            step_id=step_id,
            approval_token=approval_token,
        )

    def http_ledger(self, context: TrustedContext) -> HttpLedgerClient:
        """The HTTP transport as ``context``'s token sees the server."""
        return self._client(context)

    async def tools(self, context: TrustedContext) -> list[RemoteTool]:
        return await self._client(context).tools()

    async def command(
        self, record: Event, *, broadcast: bool = False, wait: float | None = None
    ) -> Event | None:
        return await self._direct.command(record, broadcast=broadcast, wait=wait)


def over_http(ledger: EmbeddedLedger, registry: Callable[[], ToolRegistry]) -> OverHttp:
    """A client whose calls go through the HTTP API in front of ``ledger``."""
    assert ledger.file is not None
    calls = ledger.queries()
    door = Security(TokenStore([])).build(registry())(ledger.client, calls, _ready)
    tokens = ContextTokens()
    door.authenticator = tokens
    door.tools = LiveTools(registry)
    door.groups = ledger.groups
    return OverHttp(create_app(door), tokens, ledger.client, calls)


async def _ready() -> dict[str, bool]:
    return {"executor": True}
