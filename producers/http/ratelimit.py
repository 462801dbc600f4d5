"""Rate limits at the front door: token buckets per (tenant, tool) and per tenant, and of
failed authentications per client address (:class:`AuthThrottle`).

Policy file (JSON; other top-level sections are left to other parts of the policy)::

    {
      "rate_limits": {
        "tenant":  {"rate": 50, "burst": 100},
        "default": {"per_tenant": {"rate": 10, "burst": 20}},
        "tools": {
          "charge_card":  {"per_tenant": {"rate": 1, "burst": 2}},
          "list_tickets": null
        },
        "auth_failures": {"rate": 1, "burst": 100}
      }
    }

- A bucket is ``{"rate": r, "burst": b}``: it holds at most ``b`` tokens (``b`` >= 1, an
  integer) and gains ``r`` tokens a second (``r`` > 0, may be fractional: ``0.5`` is one call
  every two seconds). It starts full. Each call takes one token.
- ``tenant``: one bucket per tenant, taken by every call of that tenant, whatever the tool.
- ``tools.<name>.per_tenant``: one bucket per (tenant, tool): each tenant has its own.
- ``default``: the limit of every tool that has no entry in ``tools`` and no ``rate_limit`` in
  its manifest.
- A tool's limit, most specific first: its entry in ``tools`` (``null`` = no limit, even if the
  manifest or ``default`` has one), else its manifest's ``rate_limit`` (same shape as an entry
  of ``tools``, or a bare bucket meaning ``per_tenant``), else ``default``, else none. Without a
  policy file and without manifest limits nothing is limited (the helpdesk tools have none).
- ``auth_failures``: the bucket of failed authentications (a bearer token or a console
  sign-in token that is refused) per client address, and per first characters of an opaque
  token; ``null`` switches it off. Default: a burst of 100, then one a second
  (:data:`DEFAULT_AUTH_FAILURES`). See :class:`AuthThrottle`.
- Naming a tool that is not registered, an unknown member or an impossible bucket is an error
  when the policy is loaded (a typo must not silently switch a limit off).

A call takes a token from each bucket that applies (its tenant's and its (tenant, tool)
bucket), all or none: when one of them is empty the call is refused with ``429 RATE_LIMITED``,
``Retry-After`` (whole seconds, rounded up: when every bucket it needs has a token again if
nobody else takes them), and nothing is taken from the others. The limiter runs after
authentication and request validation and before the call is appended, so a refused call is
not stored anywhere: its idempotency key stays unused, and the same call sent again later
executes. Requests refused before it (401, 400, 404) take no token. Every request that reaches
it takes one, **replays included**: whether a key has already finished is only decided after
the append, which is exactly what a rate limit must prevent, so a replay costs a token even
though it executes nothing.

**The buckets live in the memory of one server process.** Several front doors (processes or
hosts behind a load balancer) each keep their own buckets, so a tenant may get up to N times
the configured rate and burst through N doors; configure ``rate / N`` or route each tenant to
one door, or use a shared limiter (not provided) for an exact global limit. A restart fills
every bucket again. Buckets that have refilled completely are forgotten (they are the same as
new ones), so memory follows the tenants active in the last ``burst / rate`` seconds.

The clock is injectable (``clock``, seconds, monotonic) for tests.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolledger.schemas.errors import one_line

PRUNE_EVERY = 1024


class PolicyError(ValueError):
    """The rate limit policy (file or manifest) cannot be used."""


class Bucket(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    rate: float = Field(gt=0, le=1_000_000, description="Tokens added per second.")
    burst: int = Field(ge=1, le=1_000_000_000, description="Capacity: calls in a burst.")


class ToolLimit(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    per_tenant: Bucket | None = None


DEFAULT_AUTH_FAILURES = Bucket(rate=1.0, burst=100)


class RateLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    tenant: Bucket | None = None
    default: ToolLimit | None = None
    tools: dict[str, ToolLimit | None] = Field(default_factory=dict)
    auth_failures: Bucket | None = DEFAULT_AUTH_FAILURES


class PolicyFile(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    rate_limits: RateLimits = Field(default_factory=RateLimits)


@dataclass(frozen=True, slots=True)
class RatePolicy:
    limits: RateLimits

    @classmethod
    def none(cls) -> RatePolicy:
        return cls(RateLimits())

    @classmethod
    def from_dict(cls, document: Mapping[str, Any], source: str = "policy") -> RatePolicy:
        try:
            return cls(PolicyFile.model_validate(document).rate_limits)
        except ValidationError as exc:
            raise PolicyError(
                f"{source}: not a usable rate limit policy ({one_line(exc)})"
            ) from None

    @classmethod
    def load(cls, path: Path) -> RatePolicy:
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise PolicyError(f"{path}: not a usable policy file ({exc})") from None
        if not isinstance(document, dict):
            raise PolicyError(f"{path}: the policy file must hold a JSON object")
        return cls.from_dict(document, str(path))


def manifest_limit(tool: str, manifest: Mapping[str, Any]) -> ToolLimit | None:
    """The ``rate_limit`` of a tool manifest, if it has one (a tool limit or a bare bucket)."""
    raw = manifest.get("rate_limit")
    if raw is None:
        return None
    try:
        if isinstance(raw, Mapping) and "per_tenant" not in raw:
            return ToolLimit(per_tenant=Bucket.model_validate(raw))
        return ToolLimit.model_validate(raw)
    except ValidationError as exc:
        raise PolicyError(
            f"tool {tool}: unusable rate_limit in its manifest ({one_line(exc)})"
        ) from None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a call is refused: which bucket is empty and when to come back."""

    retry_after_s: int
    scope: str  # "tenant" or "tool"
    detail: str


@dataclass(slots=True)
class _Level:
    tokens: float
    stamp: float


class RateLimiter:
    """Token buckets of one server process (see the module docstring)."""

    def __init__(
        self,
        policy: RatePolicy,
        manifests: Mapping[str, Mapping[str, Any]],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        limits = policy.limits
        unknown = sorted(set(limits.tools) - set(manifests))
        if unknown:
            raise PolicyError(f"rate limits name tools that are not registered: {unknown}")
        self.tenant_bucket = limits.tenant
        self.tool_buckets: dict[str, Bucket] = {}
        for tool, manifest in manifests.items():
            if tool in limits.tools:
                limit = limits.tools[tool]
            else:
                limit = manifest_limit(tool, manifest) or limits.default
            if limit is not None and limit.per_tenant is not None:
                self.tool_buckets[tool] = limit.per_tenant
        self._clock = clock
        self._levels: dict[tuple[str, ...], _Level] = {}
        self._lock = threading.Lock()
        self._since_prune = 0

    @property
    def active(self) -> bool:
        return self.tenant_bucket is not None or bool(self.tool_buckets)

    def _buckets(self, tenant: str, tool: str) -> list[tuple[tuple[str, ...], str, Bucket]]:
        found: list[tuple[tuple[str, ...], str, Bucket]] = []
        if self.tenant_bucket is not None:
            found.append((("tenant", tenant), "tenant", self.tenant_bucket))
        bucket = self.tool_buckets.get(tool)
        if bucket is not None:
            found.append((("tool", tenant, tool), "tool", bucket))
        return found

    def _level(self, key: tuple[str, ...], bucket: Bucket, now: float) -> _Level:
        return _refilled(self._levels, key, bucket, now)

    def acquire(self, tenant: str, tool: str) -> Refusal | None:
        """Take one token from every bucket of (tenant, tool), or none and say why."""
        buckets = self._buckets(tenant, tool)
        if not buckets:
            return None
        with self._lock:
            now = self._clock()
            levels = [
                (scope, bucket, self._level(key, bucket, now)) for key, scope, bucket in buckets
            ]
            short = [
                ((1.0 - level.tokens) / bucket.rate, scope, bucket)
                for scope, bucket, level in levels
                if level.tokens < 1.0
            ]
            if short:
                wait, scope, bucket = max(short, key=lambda s: s[0])
                return Refusal(
                    max(1, math.ceil(wait - 1e-9)), scope, _describe(scope, tool, bucket)
                )
            for _, _, level in levels:
                level.tokens -= 1.0
            self._since_prune += 1
            if self._since_prune >= PRUNE_EVERY:
                self._prune(now)
        return None

    def _prune(self, now: float) -> None:
        """Forget the buckets that are full again: a new bucket is the same."""
        self._since_prune = 0
        for key in list(self._levels):
            bucket = self.tenant_bucket if key[0] == "tenant" else self.tool_buckets.get(key[-1])
            if bucket is None or self._level(key, bucket, now).tokens >= bucket.burst:
                del self._levels[key]

    def __len__(self) -> int:
        """How many buckets are remembered."""
        return len(self._levels)


def _refilled(
    levels: dict[tuple[str, ...], _Level], key: tuple[str, ...], bucket: Bucket, now: float
) -> _Level:
    """The level of ``key``'s bucket at ``now`` (a new bucket starts full)."""
    level = levels.get(key)
    if level is None:
        level = levels[key] = _Level(float(bucket.burst), now)
    elif now > level.stamp:
        level.tokens = min(float(bucket.burst), level.tokens + (now - level.stamp) * bucket.rate)
        level.stamp = now
    return level


class AuthThrottle:
    """Failed authentications, one token bucket per key (a client address, an opaque token's
    first characters): each refused token takes one from every bucket of its attempt, and
    while one of them is empty the next attempts with those keys are refused (``429``,
    ``Retry-After``) *before* their token is checked, so that a right guess is not told apart
    from a wrong one. A request without a token takes nothing. Like :class:`RateLimiter`, the
    buckets live in one server process and full ones are forgotten."""

    def __init__(self, bucket: Bucket | None, *, clock: Callable[[], float] = time.monotonic):
        self.bucket = bucket
        self._clock = clock
        self._levels: dict[tuple[str, ...], _Level] = {}
        self._lock = threading.Lock()
        self._since_prune = 0

    def wait_s(self, keys: Sequence[tuple[str, ...]]) -> int | None:
        """Whole seconds until an attempt with ``keys`` may be checked again; None: now."""
        if self.bucket is None:
            return None
        bucket = self.bucket
        with self._lock:
            if not self._levels:  # nothing refused lately: every bucket is full
                return None
            now = self._clock()
            short: list[float] = []
            for key in keys:  # read only: a key without a level has a full bucket
                level = self._levels.get(key)
                if level is not None:
                    tokens = min(bucket.burst, level.tokens + (now - level.stamp) * bucket.rate)
                    if tokens < 1.0:
                        short.append(1.0 - tokens)
        if not short:
            return None
        return max(1, math.ceil(max(short) / self.bucket.rate - 1e-9))

    def failed(self, keys: Sequence[tuple[str, ...]]) -> None:
        """An attempt with ``keys`` presented a token that was refused."""
        if self.bucket is None:
            return
        with self._lock:
            now = self._clock()
            for key in keys:
                level = _refilled(self._levels, key, self.bucket, now)
                level.tokens = max(0.0, level.tokens - 1.0)
            self._since_prune += 1
            if self._since_prune >= PRUNE_EVERY:
                self._since_prune = 0
                for key in list(self._levels):
                    if _refilled(self._levels, key, self.bucket, now).tokens >= self.bucket.burst:
                        del self._levels[key]

    def __len__(self) -> int:
        """How many buckets are remembered."""
        return len(self._levels)


def _describe(scope: str, tool: str, bucket: Bucket) -> str:
    pace = f"a burst of {bucket.burst}, then {bucket.rate:g} calls per second"
    if scope == "tenant":
        return f"This tenant's rate limit ({pace}, all tools together) is reached."
    return f"The rate limit of {tool} for this tenant ({pace}) is reached."
