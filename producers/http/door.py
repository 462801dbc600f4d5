"""The front door: what the HTTP API needs, built by the composition root for a backend, and
the dependency every route reaches it through (``app.state.door``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request
from prometheus_client import Counter

from toolledger.producers.client import LedgerClient
from toolledger.producers.governance import DEFAULT_TOKEN_TTL
from toolledger.producers.http.applied import AppliedWatch
from toolledger.producers.http.auth import (
    Authenticator,
    CombinedAuthenticator,
    TokenStore,
    failure_counter,
)
from toolledger.producers.http.door_state import RunBudget, SwitchCache
from toolledger.producers.http.jwt_auth import JwtAuthenticator
from toolledger.producers.http.metrics import Metrics
from toolledger.producers.http.ratelimit import DEFAULT_AUTH_FAILURES, AuthThrottle, RateLimiter
from toolledger.schemas.calls import CallQueries
from toolledger.schemas.groups import GroupService
from toolledger.schemas.keys import DEFAULT_KEY_SCOPE


def _no_digest(_arguments: Any) -> str | None:
    return None


@dataclass(frozen=True, slots=True)
class ToolInfo:
    name: str
    keyed: bool  # needs an Idempotency-Key (mutation, long_running)
    manifest: dict[str, Any]
    # the args digest the executor will compute (None: invalid, the executor refuses them)
    digest: Callable[[Any], str | None] = _no_digest


class IntentArguments(Protocol):
    """Where a backend's raw arguments live: its intents (log or topic)."""

    async def arguments(self, call_key: str, around: datetime) -> list[str]:
        """The ``arguments_json`` of the call key's intents appended near ``around``, newest
        first (empty once the intents' retention dropped them)."""


@dataclass
class FrontDoor:
    """What the HTTP API needs; the composition root builds it for a backend."""

    client: LedgerClient
    queries: CallQueries
    tools: Mapping[str, ToolInfo]
    tokens: TokenStore  # the tokens file (the MCP server authenticates with it too)
    ready: Callable[[], Awaitable[dict[str, bool]]]
    key_retention: str = "forever"  # the default for tools that set none, ISO 8601
    key_retention_seconds: int | None = None  # the same in seconds (None: forever)
    key_scope: str = DEFAULT_KEY_SCOPE.value  # the ledger's, for tools that set none
    metrics: Metrics = field(default_factory=Metrics)
    limiter: RateLimiter | None = None
    # what the HTTP API authenticates with: the tokens file unless given (e.g. JWTs as well)
    authenticator: Authenticator | None = None
    # refused tokens per client address: the API, the console's sign-in and MCP over HTTP
    auth_throttle: AuthThrottle = field(default_factory=lambda: AuthThrottle(DEFAULT_AUTH_FAILURES))
    budget: RunBudget | None = field(default_factory=RunBudget)
    approval_token_ttl: timedelta = DEFAULT_TOKEN_TTL
    switch_cache: SwitchCache = field(default_factory=SwitchCache)
    groups: GroupService | None = None  # None: this backend has no group orchestrator
    intents: IntentArguments | None = None  # None: raw arguments are not shown to approvers
    auth_failures: Counter = field(init=False, repr=False)
    # read-your-writes: the events answers wait for the projection to apply, polled together
    applied: AppliedWatch = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.auth_failures = failure_counter(self.metrics.registry)
        self.applied = AppliedWatch(self.queries)

    @property
    def authenticator_in_force(self) -> Authenticator:
        return self.tokens if self.authenticator is None else self.authenticator

    @property
    def accepts_jwts(self) -> bool:
        """Whether bearer tokens may be JWTs (verified against a JWKS file)."""
        auth = self.authenticator
        if isinstance(auth, CombinedAuthenticator):
            return auth.jwt is not None
        return isinstance(auth, JwtAuthenticator)


async def door_of(request: Request) -> FrontDoor:
    """The front door of the app serving ``request``."""
    door: FrontDoor = request.app.state.door
    return door


Door = Annotated[FrontDoor, Depends(door_of)]
