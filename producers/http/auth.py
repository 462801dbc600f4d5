"""Who is calling: the trusted context (tenant, principal, scopes) comes from authentication and
nowhere else.

Two kinds of bearer token, behind one :class:`Authenticator` protocol:

- opaque tokens listed in a tokens file (:class:`TokenStore`);
- JWTs verified against a JWKS file (:class:`producers.http.jwt_auth.JwtAuthenticator`).

:class:`CombinedAuthenticator` accepts both on one server: a token found in the tokens file is
that file's; any other token shaped like a JWT goes to the JWT verifier; anything else is
unknown. A refusal is an :class:`AuthFailure`: a stable ``reason`` (for metrics and logs) and a
``detail`` for the caller. Neither ever contains the token.

:func:`throttled_check` is how every front door checks a token a caller presents (the API, the
console's sign-in, MCP over HTTP): too many refused tokens from one client address, or with
one opaque token's first characters, and the next attempts are :class:`Throttled` before
their token is checked (``producers.http.ratelimit.AuthThrottle``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from toolledger.producers.client import TrustedContext
from toolledger.producers.http.ratelimit import AuthThrottle
from toolledger.schemas.errors import one_line

log = logging.getLogger("toolledger.http.auth")

MAX_TOKEN_CHARS = 8192
PREFIX_CHARS = 8  # an opaque token's characters a throttle bucket is kept for
# three base64url segments (RFC 7515 compact serialisation); a JWT header always starts "eyJ"
_JWT_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*")


@dataclass(frozen=True, slots=True)
class AuthFailure:
    """Why a request is not authenticated: ``reason`` is a stable label (metrics, logs),
    ``detail`` is what the caller is told. Neither contains the token."""

    reason: str
    detail: str
    kind: str = "none"  # what was presented: "none", "opaque" or "jwt"


MISSING = AuthFailure("missing", "Send 'Authorization: Bearer <token>'.")
NOT_BEARER = AuthFailure(
    "not_bearer", "Only the Bearer scheme is accepted: send 'Authorization: Bearer <token>'."
)
TOO_LONG = AuthFailure("too_long", f"The bearer token is longer than {MAX_TOKEN_CHARS} characters.")
UNKNOWN_TOKEN = AuthFailure("unknown_token", "The bearer token is not known.", "opaque")


@runtime_checkable
class Authenticator(Protocol):
    """Turns an ``Authorization`` header value into a trusted context, or says why not."""

    def check(self, authorization: str | None) -> TrustedContext | AuthFailure: ...

    def authenticate(self, authorization: str | None) -> TrustedContext | None: ...


def bearer_token(authorization: str | None) -> str | AuthFailure:
    """The token of ``Bearer <token>`` (scheme case-insensitive, surrounding blanks ignored)."""
    if not authorization or not authorization.strip():
        return MISSING
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return NOT_BEARER
    token = token.strip()
    if not token:
        return MISSING
    if len(token) > MAX_TOKEN_CHARS:
        return TOO_LONG
    return token


def looks_like_jwt(token: str) -> bool:
    """JWT by shape: three dot-separated base64url segments, or a JOSE header prefix (so a
    truncated JWT is still judged as one and gets a precise answer)."""
    return token.startswith("eyJ") or _JWT_SHAPE.fullmatch(token) is not None


class TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(min_length=16)
    tenant: str = Field(min_length=1, max_length=128)
    principal: str = Field(min_length=1, max_length=256)
    scopes: list[str] = Field(default_factory=lambda: ["tools:call"])

    @field_validator("tenant")
    @classmethod
    def _not_every_tenant(cls, tenant: str) -> str:
        if tenant == "*":  # in kill switches "*" stands for every tenant
            raise ValueError("'*' is reserved: it means every tenant")
        return tenant


class TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: list[TokenEntry]


class TokenFileError(ValueError):
    pass


RELOAD_CHECK_S = 1.0


def _digests(entries: list[TokenEntry]) -> dict[bytes, TrustedContext]:
    return {
        hashlib.sha256(e.token.encode()).digest(): TrustedContext(
            e.tenant, e.principal, frozenset(e.scopes)
        )
        for e in entries
    }


def _read_tokens(path: Path) -> list[TokenEntry]:
    try:
        return TokensFile.model_validate(json.loads(path.read_text())).tokens
    except ValidationError as exc:
        raise TokenFileError(f"{path}: not a usable tokens file ({one_line(exc)})") from None
    except (OSError, ValueError) as exc:
        raise TokenFileError(f"{path}: not a usable tokens file ({exc})") from None


def _signature(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


class TokenStore:
    """Opaque tokens of a tokens file, kept as SHA-256 digests and compared in constant time.

    Loaded from a file, it follows the file: a change (looked for at most once a second, by
    its modification time and size) takes effect without a restart. A changed file that is
    not usable is refused with a warning and the tokens in force stay, so a half-written file
    never locks everyone out."""

    def __init__(self, entries: list[TokenEntry], path: Path | None = None) -> None:
        self._by_digest = _digests(entries)
        self._path = path
        self._seen = _signature(path) if path is not None else None
        self._checked_at = time.monotonic()

    @classmethod
    def load(cls, path: Path) -> TokenStore:
        return cls(_read_tokens(path), path)

    def _follow_file(self) -> None:
        now = time.monotonic()
        if self._path is None or now - self._checked_at < RELOAD_CHECK_S:
            return
        self._checked_at = now
        signature = _signature(self._path)
        if signature == self._seen:
            return
        self._seen = signature
        try:
            self._by_digest = _digests(_read_tokens(self._path))
        except TokenFileError as exc:
            log.warning(
                "tokens file changed but is not usable; keeping the tokens in force",
                extra={"error": str(exc)},
            )
            return
        log.info(
            "tokens file reloaded", extra={"path": str(self._path), "tokens": len(self._by_digest)}
        )

    def find(self, token: str) -> TrustedContext | None:
        self._follow_file()
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for known, context in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                found = context
        return found

    def check(self, authorization: str | None) -> TrustedContext | AuthFailure:
        token = bearer_token(authorization)
        if isinstance(token, AuthFailure):
            return token
        return self.find(token) or UNKNOWN_TOKEN

    def authenticate(self, authorization: str | None) -> TrustedContext | None:
        context = self.check(authorization)
        return context if isinstance(context, TrustedContext) else None


class TokenVerifier(Protocol):
    """A verifier of one token (already taken out of its header), e.g. the JWT verifier."""

    def verify(self, token: str) -> TrustedContext | AuthFailure: ...


class CombinedAuthenticator:
    """Opaque tokens from the tokens file, JWTs (by shape) from the JWT verifier."""

    def __init__(self, tokens: TokenStore | None, jwt: TokenVerifier | None) -> None:
        self.tokens = tokens
        self.jwt = jwt

    def check(self, authorization: str | None) -> TrustedContext | AuthFailure:
        token = bearer_token(authorization)
        if isinstance(token, AuthFailure):
            return token
        if self.tokens is not None:
            context = self.tokens.find(token)
            if context is not None:
                return context
        if looks_like_jwt(token):
            if self.jwt is None:
                return AuthFailure(
                    "jwt_not_accepted", "This server does not accept JWT bearer tokens.", "jwt"
                )
            return self.jwt.verify(token)
        return UNKNOWN_TOKEN

    def authenticate(self, authorization: str | None) -> TrustedContext | None:
        context = self.check(authorization)
        return context if isinstance(context, TrustedContext) else None


@dataclass(frozen=True, slots=True)
class Throttled:
    """Too many refused tokens came from this client address (or with this token's first
    characters): nothing was checked; try again in ``retry_after_s`` seconds."""

    retry_after_s: int

    @property
    def detail(self) -> str:
        return (
            "Too many requests with a token that is not valid came from this address: the "
            f"token was not checked. Retry in {self.retry_after_s} s."
        )


def throttled_check(
    authenticator: Authenticator,
    throttle: AuthThrottle,
    client: str | None,
    authorization: str | None,
) -> TrustedContext | AuthFailure | Throttled:
    """``authenticator.check``, refused before the token is looked at while ``throttle`` says
    so. A refused token counts against the caller's address and, for an opaque token, its
    first characters (a JWT's first characters are its header, the same for everyone); no
    token, or one that could never be valid (too long, not Bearer), counts for nothing."""
    token = bearer_token(authorization)
    if isinstance(token, AuthFailure):
        return token
    keys: list[tuple[str, ...]] = [("address", client or "-")]
    if not looks_like_jwt(token):
        keys.append(("prefix", token[:PREFIX_CHARS]))
    wait = throttle.wait_s(keys)
    if wait is not None:
        return Throttled(wait)
    checked = authenticator.check(authorization)
    if isinstance(checked, AuthFailure) and checked.kind != "none":
        throttle.failed(keys)
    return checked


def failure_counter(registry: CollectorRegistry) -> Counter:
    """``toolledger_http_auth_failures_total{reason, kind}``: refused authentications."""
    return Counter(
        "toolledger_http_auth_failures",
        "Requests refused by authentication, by reason and kind of token presented.",
        ["reason", "kind"],
        registry=registry,
    )
