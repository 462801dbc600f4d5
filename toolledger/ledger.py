"""``Ledger``: one client API over three transports.

- ``Ledger.embedded(path, registry)``: the ledger in this process, on one SQLite file;
- ``Ledger.kafka(bootstrap)``: intents to Kafka, answered by ``toolledger executor``
  processes elsewhere;
- ``Ledger.http(url, token)``: a remote ``toolledger serve`` over its HTTP API.

Each is an async context manager whose :meth:`Ledger.call` is the same call, with the same
answers (a :class:`CallResult`), so an application and the agent adapters can move from one to
another without a change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from toolledger.processors.runtime.group_runner import GroupRunner
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.producers.approvals import Approvals, Decision, PendingApproval, approvals_for
from toolledger.producers.client import DEFAULT_WAIT_S, CallResult, TrustedContext
from toolledger.producers.http_client import HttpLedgerClient, RemoteTool
from toolledger.schemas.groups import GroupAnswer

if TYPE_CHECKING:  # `import toolledger` stays light: a backend loads when a ledger is built
    from toolledger.backends import BackendParts
    from toolledger.settings import LedgerSettings

_NO_KAFKA_GROUPS = (
    "call groups on Kafka keep their log in PostgreSQL and need the tools: build the ledger "
    "with Ledger.kafka(bootstrap, registry, postgres=<dsn>)"
)


class _Caller(Protocol):
    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        idempotency_key: str | None,
        context: Any,  # a TrustedContext; over HTTP it may be None (the token says who)
        wait: float | None = None,
        run_id: str | None = None,
        step_id: str | None = None,
        approval_token: str | None = None,
    ) -> CallResult: ...


class _Backend(Protocol):
    authenticated: bool  # the server takes tenant and principal from authentication

    @property
    def runs_groups(self) -> bool: ...

    async def open(self) -> _Caller: ...

    async def close(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    async def tools(self) -> list[RemoteTool]: ...

    async def run_group(
        self, body: dict[str, Any], key: str, who: TrustedContext | None, wait_s: float
    ) -> GroupAnswer: ...

    async def resume_group(
        self, group_id: str, tokens: dict[str, str], who: TrustedContext | None, wait_s: float
    ) -> GroupAnswer: ...


class _Local:
    """A backend in this process, opened through its factory (embedded, or Kafka)."""

    authenticated = False

    def __init__(self, settings: LedgerSettings, registry: ToolRegistry | None) -> None:
        from toolledger.backends import backend_factory

        if registry is not None:
            registry.check()
        self.factory = backend_factory(settings)
        self.registry = registry
        self.parts: BackendParts | None = None
        self._opened: contextlib.AbstractAsyncContextManager[BackendParts] | None = None

    @property
    def runs_groups(self) -> bool:
        if self.parts is not None:
            return self.parts.groups is not None and self.registry is not None
        from toolledger.settings import KAFKA

        settings = self.factory.settings
        return self.registry is not None and (
            settings.backend != KAFKA or settings.postgres is not None
        )

    async def open(self) -> _Caller:
        self._opened = self.factory.open(self.registry)
        self.parts = await self._opened.__aenter__()
        return self.parts.client

    async def close(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        opened, self._opened, self.parts = self._opened, None, None
        if opened is not None:  # a failed block closes at once, a clean one drains first
            await opened.__aexit__(exc_type, exc, tb)

    async def tools(self) -> list[RemoteTool]:
        return _registry_tools(self.registry) if self.registry is not None else []

    def _runner(self) -> GroupRunner:
        if self.parts is None or self.parts.groups is None or self.registry is None:
            raise RuntimeError(_NO_KAFKA_GROUPS)
        return self.parts.groups

    async def run_group(
        self, body: dict[str, Any], key: str, who: TrustedContext | None, wait_s: float
    ) -> GroupAnswer:
        assert who is not None
        return await self._runner().submit(
            tenant_id=who.tenant_id,
            principal=who.principal,
            scopes=sorted(who.scopes),
            group_key=key,
            body=body,
            wait_s=wait_s,
        )

    async def resume_group(
        self, group_id: str, tokens: dict[str, str], who: TrustedContext | None, wait_s: float
    ) -> GroupAnswer:
        assert who is not None
        return await self._runner().resume(who.tenant_id, group_id, tokens, wait_s)


class _Http:
    authenticated = True
    runs_groups = True

    def __init__(self, url: str, token: str, wait_s: float) -> None:
        self.client = HttpLedgerClient(url, token, default_wait_s=wait_s)

    async def open(self) -> _Caller:
        return self.client

    async def close(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.client.close()

    async def tools(self) -> list[RemoteTool]:
        return await self.client.tools()

    async def run_group(
        self, body: dict[str, Any], key: str, who: TrustedContext | None, wait_s: float
    ) -> GroupAnswer:
        return await self.client.run_group(
            body["steps"],
            idempotency_key=key,
            run_id=body["run_id"],
            on_failure=body["on_failure"],
            wait=wait_s,
        )

    async def resume_group(
        self, group_id: str, tokens: dict[str, str], who: TrustedContext | None, wait_s: float
    ) -> GroupAnswer:
        return await self.client.resume_group(group_id, approval_tokens=tokens, wait=wait_s)


class Ledger:
    """Build one with :meth:`embedded`, :meth:`kafka` or :meth:`http`, then
    ``async with ledger: await ledger.call(tool, arguments, idempotency_key=..., ...)``."""

    def __init__(self, backend: _Backend, context: TrustedContext | None = None) -> None:
        self._backend = backend
        self._context = context
        self._caller: _Caller | None = None

    @classmethod
    def embedded(
        cls,
        path: str | Path,
        registry: ToolRegistry,
        *,
        context: TrustedContext | None = None,
        **settings: Any,
    ) -> Ledger:
        """The ledger in this process, on the SQLite file ``path`` (made if it does not exist).
        ``context``: who calls when :meth:`call` is given none; ``settings``: the other fields
        of :class:`toolledger.settings.LedgerSettings` (partitions, cache_entries,
        key_retention, ...)."""
        from toolledger.settings import EMBEDDED, LedgerSettings

        given = {"create": True, **settings, "backend": EMBEDDED, "path": Path(path)}
        return cls(_Local(LedgerSettings.of(**given), registry), context)

    @classmethod
    def kafka(
        cls,
        bootstrap: str,
        registry: ToolRegistry | None = None,
        *,
        prefix: str = "toolledger.",
        partitions: int = 4,
        context: TrustedContext | None = None,
        default_wait_s: float = 10.0,
        postgres: str | None = None,
        **settings: Any,
    ) -> Ledger:
        """Intents appended to the Kafka cluster at ``bootstrap`` (topics ``<prefix>intents``
        and so on, made by ``toolledger topics``), executed by ``toolledger executor``
        processes. ``registry`` lists the tools (the executors hold theirs) and, with
        ``postgres`` (the projection's DSN), lets :meth:`run_group` run call groups here, their
        log in PostgreSQL as ``toolledger serve`` keeps it. ``settings``: the other fields of
        :class:`toolledger.settings.LedgerSettings` (``key_scope``: as the executors'
        ``--key-scope`` says; they refuse a call whose key is of another scope). The tools' key
        retention is the deployment's (:mod:`toolledger.kafka_settings`)."""
        from toolledger.settings import KAFKA, LedgerSettings

        chosen = LedgerSettings.of(
            **settings,
            backend=KAFKA,
            kafka=bootstrap,
            prefix=prefix,
            partitions=partitions,
            default_wait_s=default_wait_s,
            postgres=postgres,
        )
        return cls(_Local(chosen, registry), context)

    @classmethod
    def http(cls, url: str, token: str, *, default_wait_s: float = 10.0) -> Ledger:
        """A remote ``toolledger serve`` at ``url``; ``token`` is the bearer token that names
        the tenant, the principal and the scopes (the server authenticates every call)."""
        return cls(_Http(url, token, default_wait_s))

    async def __aenter__(self) -> Ledger:
        self._caller = await self._backend.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._caller = None
        await self._backend.close(exc_type, exc, tb)

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        idempotency_key: str | None,
        context: TrustedContext | None = None,
        wait: float | None = None,
        run_id: str | None = None,
        step_id: str | None = None,
        approval_token: str | None = None,
    ) -> CallResult:
        """Run ``tool`` at most once per ``idempotency_key`` and wait up to ``wait`` seconds
        for its outcome (see :meth:`producers.client.LedgerClient.call`). ``context``: who
        calls, from the application's own authentication (embedded and Kafka); over HTTP the
        token says who calls and ``context`` may be left out."""
        if self._caller is None:
            raise RuntimeError("use the ledger inside `async with ledger:`")
        who = self._who(context)
        return await self._caller.call(
            tool,
            arguments,
            idempotency_key=idempotency_key,
            context=who,
            wait=wait,
            run_id=run_id,
            step_id=step_id,
            approval_token=approval_token,
        )

    @property
    def runs_groups(self) -> bool:
        """Whether :meth:`run_group` works here: always, except on ``Ledger.kafka`` without
        ``postgres=`` (or the tools). The agent adapters submit a turn as a group only then."""
        return self._backend.runs_groups

    async def tools(self) -> list[RemoteTool]:
        """The tools and their manifests, as the agent adapters take them (``ToolSpec``)."""
        return await self._backend.tools()

    async def run_group(
        self,
        steps: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str,
        run_id: str,
        on_failure: str = "compensate",
        context: TrustedContext | None = None,
        wait: float | None = None,
    ) -> GroupAnswer:
        """Run a group of dependent calls, each step ``{"id", "tool", "arguments",
        "depends_on"}`` (an argument may be ``{"$from": step, "path": "a.b"}``): in dependency
        order, independent steps concurrently, compensated in reverse order if one fails
        (``on_failure="compensate"``) or left for :meth:`resume_group` (``"stop"``). The same
        key with the same steps replays the group; each step runs at most once."""
        body = {"run_id": run_id, "on_failure": on_failure, "steps": list(steps)}
        return await self._backend.run_group(
            body, idempotency_key, self._who(context), DEFAULT_WAIT_S if wait is None else wait
        )

    async def resume_group(
        self,
        group_id: str,
        *,
        approval_tokens: Mapping[str, str] | None = None,
        context: TrustedContext | None = None,
        wait: float | None = None,
    ) -> GroupAnswer:
        """Continue a BLOCKED or FAILED group from its completion point."""
        return await self._backend.resume_group(
            group_id,
            dict(approval_tokens or {}),
            self._who(context),
            DEFAULT_WAIT_S if wait is None else wait,
        )

    async def approve(
        self, request: PendingApproval, context: TrustedContext | None = None
    ) -> Decision:
        """Grant the approval request a call was answered with (``pending_approval(result)``)
        as ``context``: the user the call runs for, with the scope ``approvals:confirm`` (a
        ``user`` request; the context that made the call does not confirm it), or an operator
        of the tenant other than its caller (four eyes); over HTTP the token says who decides.
        The same call (same key and arguments) then runs once, without a token."""
        who = self._who(context)
        approvals = self._approvals()
        if who is None:  # over HTTP: the token decides
            assert isinstance(approvals, HttpLedgerClient)
            return await approvals.approve(request)
        return await approvals.approve(request, who)

    async def deny(
        self, request: PendingApproval, context: TrustedContext | None = None, reason: str = ""
    ) -> Decision:
        """Deny the request with ``reason`` (the agent reads it); the same call is then
        refused (``APPROVAL_INVALID``). Who may: as :meth:`approve`."""
        who = self._who(context)
        approvals = self._approvals()
        if who is None:
            assert isinstance(approvals, HttpLedgerClient)
            return await approvals.deny(request, reason=reason)
        return await approvals.deny(request, who, reason)

    def _approvals(self) -> Approvals:
        if self._caller is None:
            raise RuntimeError("use the ledger inside `async with ledger:`")
        return approvals_for(self._caller)

    def _who(self, context: TrustedContext | None) -> TrustedContext | None:
        who = context or self._context
        if who is None and not self._backend.authenticated:
            raise ValueError(
                "pass context=TrustedContext(tenant_id, principal): in this process there is "
                "no authentication to take the tenant and the principal from"
            )
        return who


def _registry_tools(registry: ToolRegistry) -> list[RemoteTool]:
    return [RemoteTool(t.name, t.keyed, registry.manifest(t)) for t in registry]
