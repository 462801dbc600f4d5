"""Wiring of the HTTP front door on a backend (:mod:`toolledger.backends`), with its
authenticator (tokens file and/or JWTs verified against a JWKS file) and its rate limiter
(policy file and/or tool manifests)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from toolledger.audit import audit_retention as keep_audit
from toolledger.backends import backend_factory
from toolledger.config import ConfigError
from toolledger.http_server import ConnectionLimits, serve_app
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.processors.tools.retention import describe, seconds_of
from toolledger.producers.client import LedgerClient
from toolledger.producers.governance import DEFAULT_TOKEN_TTL
from toolledger.producers.http.app import FrontDoor, ToolInfo, create_app
from toolledger.producers.http.auth import Authenticator, CombinedAuthenticator, TokenStore
from toolledger.producers.http.door_state import RunBudget
from toolledger.producers.http.jwt_auth import (
    DEFAULT_ALGORITHMS,
    DEFAULT_LEEWAY_S,
    ClaimNames,
    JwtAuthenticator,
    JwtConfigError,
    JwtSettings,
)
from toolledger.producers.http.ratelimit import AuthThrottle, PolicyError, RateLimiter, RatePolicy
from toolledger.schemas.calls import CallQueries
from toolledger.settings import LedgerSettings

log = logging.getLogger("toolledger.serve")


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
            # the tools as they are when the door opens (on Kafka, with the deployment's key
            # retention, read from its settings topic after this check; an embedded file keeps
            # its key scope)
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
async def front_door(
    settings: LedgerSettings, registry: ToolRegistry, security: Security
) -> AsyncIterator[FrontDoor]:
    """The front door of the backend ``settings`` name (opened through its factory,
    :func:`toolledger.backends.backend_factory`), with ``security``; the audit trail pruned
    at ``settings.audit_retention`` (one front door at a time prunes on Kafka + PostgreSQL)."""
    door = security.build(registry)  # the security settings, checked before anything opens
    async with backend_factory(settings).open(registry) as parts:
        if parts.queries is None or parts.prune is None:
            raise ConfigError(f"a front door on {settings.backend} needs the read model")
        front = door(parts.client, parts.queries, parts.ready)
        front.groups = parts.groups
        front.intents = parts.intents
        async with keep_audit(parts.prune, settings.audit_retention):
            yield front


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
