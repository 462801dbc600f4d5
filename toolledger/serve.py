"""Wiring of the HTTP front door for the embedded or the distributed backend, with its
authenticator (tokens file and/or JWTs verified against a JWKS file) and its rate limiter
(policy file and/or tool manifests)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from processors.key_cache import DEFAULT_CACHE_ENTRIES
from processors.pipeline import DEFAULT_APPROVAL_REQUEST_TTL
from processors.runtime.embedded import DEFAULT_INTENTS_RETENTION_S
from processors.tools.registry import ToolRegistry
from processors.tools.retention import describe, seconds_of
from producers.client import LedgerClient
from producers.governance import DEFAULT_TOKEN_TTL
from producers.http.app import FrontDoor, ToolInfo, create_app
from producers.http.auth import Authenticator, CombinedAuthenticator, TokenStore
from producers.http.door_state import RunBudget
from producers.http.jwt_auth import (
    DEFAULT_ALGORITHMS,
    DEFAULT_LEEWAY_S,
    ClaimNames,
    JwtAuthenticator,
    JwtConfigError,
    JwtSettings,
)
from producers.http.ratelimit import AuthThrottle, PolicyError, RateLimiter, RatePolicy
from schemas.calls import CallQueries
from schemas.keys import KeyScope
from schemas.topics import Topics
from toolledger.audit import audit_retention as keep_audit
from toolledger.config import ConfigError
from toolledger.http_server import ConnectionLimits, serve_app

log = logging.getLogger("toolledger.serve")

DEFAULT_INTENTS_RETENTION = timedelta(seconds=DEFAULT_INTENTS_RETENTION_S)


def tool_infos(registry: ToolRegistry) -> dict[str, ToolInfo]:
    return {t.name: ToolInfo(t.name, t.keyed, registry.manifest(t), t.digest_of) for t in registry}


def authenticator(
    tokens: TokenStore | None,
    jwks: Path | None = None,
    issuer: str | None = None,
    audience: str | Sequence[str] | None = None,
    *,
    algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
    claims: ClaimNames | None = None,
    leeway_s: float = DEFAULT_LEEWAY_S,
) -> Authenticator:
    """Opaque tokens from the tokens file and, with ``jwks``, JWTs from ``issuer`` for
    ``audience`` (both then required). :class:`ConfigError` if that is not usable."""
    if jwks is None:
        if issuer is not None or audience is not None:
            raise ConfigError("a JWT issuer or audience needs a JWKS file (--jwks)")
        if tokens is None:
            raise ConfigError("no way to authenticate: give a tokens file or a JWKS file")
        return tokens
    if not issuer or not audience:
        raise ConfigError("JWT bearer tokens need both an issuer and an audience")
    try:
        settings = JwtSettings(
            issuer,
            audience if isinstance(audience, str) else tuple(audience),
            tuple(algorithms),
            leeway_s,
            claims or ClaimNames(),
        )
        verifier = JwtAuthenticator.load(jwks, settings)
    except JwtConfigError as exc:
        raise ConfigError(str(exc)) from None
    return CombinedAuthenticator(tokens, verifier)


def rate_policy(policy: Path | None) -> RatePolicy:
    """The policy file's rate limits (the defaults without one); :class:`ConfigError`."""
    try:
        return RatePolicy.load(policy) if policy is not None else RatePolicy.none()
    except PolicyError as exc:
        raise ConfigError(str(exc)) from None


def rate_limiter(registry: ToolRegistry, policy: Path | None = None) -> RateLimiter | None:
    """The rate limits of the policy file and the tools' manifests; ``None`` if there are none.
    :class:`ConfigError` if they are not usable."""
    try:
        limiter = RateLimiter(rate_policy(policy), {t.name: t.manifest() for t in registry})
    except PolicyError as exc:
        raise ConfigError(str(exc)) from None
    return limiter if limiter.active else None


@dataclass(frozen=True)
class Security:
    """How a front door authenticates, rate-limits and governs: the tokens file and/or JWTs
    verified against a JWKS file, a policy file of rate limits, how long an approval token
    lasts, and the per-run budget (None: no budget)."""

    tokens: TokenStore | None
    jwks: Path | None = None
    issuer: str | None = None
    audience: str | Sequence[str] | None = None
    policy: Path | None = None
    jwt_algorithms: Sequence[str] = DEFAULT_ALGORITHMS
    jwt_claims: ClaimNames | None = None
    approval_token_ttl: timedelta = DEFAULT_TOKEN_TTL
    run_budget: RunBudget | None = field(default_factory=RunBudget)

    def build(self, registry: ToolRegistry) -> DoorFactory:
        """Check the settings now (:class:`ConfigError`), before any backend is opened."""
        auth = authenticator(
            self.tokens,
            self.jwks,
            self.issuer,
            self.audience,
            algorithms=self.jwt_algorithms,
            claims=self.jwt_claims,
        )
        limiter = rate_limiter(registry, self.policy)
        throttle = AuthThrottle(rate_policy(self.policy).limits.auth_failures)
        tokens = self.tokens if self.tokens is not None else TokenStore([])

        def door(
            client: LedgerClient,
            queries: CallQueries,
            ready: Callable[[], Awaitable[dict[str, bool]]],
        ) -> FrontDoor:
            # the tools as the ledger has them once open (an embedded file keeps its key scope)
            return FrontDoor(
                client,
                queries,
                tool_infos(registry),
                tokens,
                ready,
                limiter=limiter,
                authenticator=auth,
                auth_throttle=throttle,
                budget=self.run_budget,
                approval_token_ttl=self.approval_token_ttl,
                key_retention=describe(registry.default_key_retention),
                key_retention_seconds=seconds_of(registry.default_key_retention),
                key_scope=registry.default_key_scope.value,
            )

        return door


DoorFactory = Callable[
    [LedgerClient, CallQueries, Callable[[], Awaitable[dict[str, bool]]]], FrontDoor
]


@contextlib.asynccontextmanager
async def embedded_door(
    data: Path,
    registry: ToolRegistry,
    security: Security,
    approval_request_ttl: timedelta = DEFAULT_APPROVAL_REQUEST_TTL,
    create: bool | None = None,
    shutdown_timeout_s: float = 30.0,
    cache_entries: int = DEFAULT_CACHE_ENTRIES,
    intents_retention: timedelta | None = DEFAULT_INTENTS_RETENTION,
    audit_retention: timedelta | None = None,
    key_scope: KeyScope | None = None,
) -> AsyncIterator[FrontDoor]:
    """The front door of an embedded ledger in ``data`` (its executor in this process);
    ``create``, ``intents_retention`` and ``key_scope`` as
    :class:`~toolledger.embedded.EmbeddedLedger` takes them. ``audit_retention``: how long the
    audit trail keeps an expired key's record (None: forever)."""
    from processors.runtime.intent_lookup import SqliteIntentLookup
    from projections.audit_retention import prune_sqlite
    from toolledger.embedded import EmbeddedLedger

    door = security.build(registry)
    ledger_file = data / "ledger.db"
    async with EmbeddedLedger(
        ledger_file,
        registry,
        approval_request_ttl=approval_request_ttl,
        create=create,
        shutdown_timeout_s=shutdown_timeout_s,
        cache_entries=cache_entries,
        intents_retention=intents_retention,
        key_scope=key_scope,
    ) as ledger:
        assert ledger.file is not None and ledger.runtime is not None
        runtime, file = ledger.runtime, ledger.file

        async def ready() -> dict[str, bool]:
            return {"executor": runtime.running, "ledger_writable": ledger.writable()}

        calls = ledger.queries()
        intents = SqliteIntentLookup(ledger_file)

        async def prune(cutoff: datetime) -> int:  # in turn with the writer (locked_write)
            return await asyncio.to_thread(prune_sqlite, file.locked_write, cutoff)

        try:
            front = door(ledger.client, calls, ready)
            front.groups = ledger.groups
            front.intents = intents
            async with keep_audit(prune, audit_retention):
                yield front
        finally:
            intents.close()
            calls.close()


@contextlib.asynccontextmanager
async def distributed_door(
    kafka: str,
    postgres: str,
    topics: Topics,
    registry: ToolRegistry,
    security: Security,
    audit_retention: timedelta | None = None,
) -> AsyncIterator[FrontDoor]:
    """The front door of the Kafka + PostgreSQL backend (``audit_retention``: see
    :func:`embedded_door`; one front door at a time prunes)."""
    from producers.kafka import KafkaTransport
    from producers.kafka_intents import KafkaIntentLookup
    from projections.audit_retention import prune_postgres
    from projections.postgres import PostgresCalls, PostgresProjection, migrate
    from toolledger.groups import postgres_groups
    from toolledger.kafka_admin import ensure_topics

    door = security.build(registry)
    await ensure_topics(kafka, topics)
    await migrate(postgres)
    transport = KafkaTransport(kafka, topics)
    await transport.start()
    try:
        async with contextlib.AsyncExitStack() as stack:
            projection = await stack.enter_async_context(PostgresProjection(postgres))
            calls = PostgresCalls(projection)
            client = LedgerClient(transport, key_scopes=registry.key_scope_of)
            groups = await postgres_groups(
                stack, projection, postgres, kafka, topics, client, lambda: registry
            )

            async def ready() -> dict[str, bool]:
                try:
                    await calls.applied("readiness-probe")
                    database = True
                except Exception:
                    database = False
                return {
                    "postgres": database,
                    "kafka": transport.running and await transport.reachable(),
                }

            front = door(client, calls, ready)
            front.groups = groups
            front.intents = KafkaIntentLookup(kafka, topics)

            async with keep_audit(functools.partial(prune_postgres, postgres), audit_retention):
                yield front
    finally:
        await transport.stop()


def open_door(
    registry: ToolRegistry,
    security: Security,
    *,
    data: Path,
    kafka: str | None,
    postgres: str | None,
    topics: Topics,
    approval_request_ttl: timedelta = DEFAULT_APPROVAL_REQUEST_TTL,
    create: bool | None = None,
    shutdown_timeout_s: float = 30.0,
    cache_entries: int = DEFAULT_CACHE_ENTRIES,
    intents_retention: timedelta | None = DEFAULT_INTENTS_RETENTION,
    audit_retention: timedelta | None = None,
    key_scope: KeyScope | None = None,
) -> contextlib.AbstractAsyncContextManager[FrontDoor]:
    """Embedded in ``data`` unless both ``kafka`` and ``postgres`` are given. ``key_scope``:
    the keys' scope for tools that set none (None: the embedded ledger's, or the default);
    on Kafka the executors must scope keys alike (they refuse other keys)."""
    if kafka is not None and postgres is not None:
        if key_scope is not None:
            registry.set_default_key_scope(key_scope)
        return distributed_door(kafka, postgres, topics, registry, security, audit_retention)
    return embedded_door(
        data,
        registry,
        security,
        approval_request_ttl,
        create,
        shutdown_timeout_s,
        cache_entries,
        intents_retention,
        audit_retention,
        key_scope,
    )


async def serve(
    door: FrontDoor,
    host: str,
    port: int,
    limits: ConnectionLimits | None = None,
    *,
    mcp_path: str | None = None,
) -> None:
    """Serve the HTTP API until SIGTERM/SIGINT (then return: the caller closes the ledger).
    With ``mcp_path``, the same process and port also serve the tools over MCP's streamable
    HTTP there, on the same front door (so approvals asked for over MCP are decided on the
    HTTP API's approval routes)."""
    app = create_app(door)
    limits = limits or ConnectionLimits()
    if mcp_path is None:
        await serve_app(app, host, port, limits)
        return
    from toolledger.mcp_wiring import mcp_http_app

    mcp = mcp_http_app(door, host=host, path=mcp_path, wait_s=None)
    app.router.routes[0:0] = [r for r in mcp.routes if getattr(r, "path", None) == mcp_path]
    async with mcp.router.lifespan_context(mcp):  # the MCP session manager
        await serve_app(app, host, port, limits)
