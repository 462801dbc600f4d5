"""JWT bearer tokens verified against a JWKS file (PyJWT).

What is checked, in order (the first failure answers, with a specific ``reason``):

1. the token is a compact JWS whose header is JSON (``malformed`` otherwise);
2. ``alg``: ``none`` is refused (``alg_none``), and so is every algorithm that is not in the
   configured allow-list (``alg_not_allowed``); HMAC (``HS*``) algorithms cannot even be
   configured. The allow-list comes from configuration, never from the token;
3. ``kid`` names a key of the JWKS (``no_kid`` / ``unknown_kid``); the algorithms tried with
   that key are the configured ones that fit the key's type (and its ``alg``, if the JWK names
   one), so an RSA key is never used as an HMAC secret (no algorithm confusion);
4. the signature (``bad_signature``); then ``exp`` (required, ``expired``), ``nbf`` and ``iat``
   (``not_yet_valid``) with a small leeway, ``iss`` (``wrong_issuer``) and ``aud``
   (``wrong_audience``), all required (``missing_claim``);
5. the trusted context from configurable claims (:class:`ClaimNames`): tenant (default
   ``tenant_id``), principal (default ``sub``), scopes (default ``scope``, space-separated, or
   ``scopes``, a list; none means no scopes). A missing or unusable tenant or principal claim is
   ``missing_tenant`` / ``missing_principal`` / ``bad_claim``.

The JWKS file holds public keys only (``RSA``, ``EC`` P-256/384/521, ``OKP``), each with a
unique ``kid``; keys whose ``use`` is not ``sig`` are ignored. RSA keys shorter than 2048 bits,
symmetric (``oct``) keys and private keys are refused when the file is loaded. When a token
names an unknown ``kid`` and the file has changed since it was read (key rotation), it is read
again (at most once a second); a file that has become unusable keeps the keys read before.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt import PyJWK
from jwt.exceptions import (
    DecodeError,
    ExpiredSignatureError,
    ImmatureSignatureError,
    InvalidAlgorithmError,
    InvalidAudienceError,
    InvalidIssuedAtError,
    InvalidIssuerError,
    InvalidKeyError,
    InvalidSignatureError,
    MissingRequiredClaimError,
    PyJWKError,
    PyJWTError,
)

from toolledger.producers.client import TrustedContext
from toolledger.producers.http.auth import AuthFailure, bearer_token

log = logging.getLogger("toolledger.http.jwt")

DEFAULT_ALGORITHMS: tuple[str, ...] = ("RS256", "ES256")
DEFAULT_LEEWAY_S = 30.0
RELOAD_INTERVAL_S = 1.0

# every asymmetric algorithm this verifier accepts in its configuration, with the key it needs
_RSA = ("RSA", None)
SUPPORTED: dict[str, tuple[str, str | None]] = {
    "RS256": _RSA,
    "RS384": _RSA,
    "RS512": _RSA,
    "PS256": _RSA,
    "PS384": _RSA,
    "PS512": _RSA,
    "ES256": ("EC", "P-256"),
    "ES384": ("EC", "P-384"),
    "ES512": ("EC", "P-521"),
    "EdDSA": ("OKP", None),
}
_PRIVATE_MEMBERS = {"d", "p", "q", "dp", "dq", "qi", "oth", "k"}
_NO_CONTROL = re.compile(r"[^\x00-\x1f\x7f]+")
MAX_TENANT = 128
MAX_PRINCIPAL = 256
MAX_SCOPES = 256


class JwtConfigError(ValueError):
    """The JWT settings or the JWKS file cannot be used."""


@dataclass(frozen=True, slots=True)
class ClaimNames:
    """Which claims carry the trusted context. ``scopes=None``: ``scope`` (a space-separated
    string, OAuth 2.0 style) or else ``scopes`` (a list of strings)."""

    tenant: str = "tenant_id"
    principal: str = "sub"
    scopes: str | None = None


@dataclass(frozen=True, slots=True)
class JwtSettings:
    issuer: str
    audience: str | tuple[str, ...]
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    leeway_s: float = DEFAULT_LEEWAY_S
    claims: ClaimNames = field(default_factory=ClaimNames)

    def __post_init__(self) -> None:
        if not self.issuer:
            raise JwtConfigError("a JWT issuer is required")
        audiences = (self.audience,) if isinstance(self.audience, str) else self.audience
        if not audiences or not all(audiences):
            raise JwtConfigError("a JWT audience is required")
        if not self.algorithms:
            raise JwtConfigError("at least one JWT algorithm is required")
        for alg in self.algorithms:
            if alg not in SUPPORTED:
                raise JwtConfigError(
                    f"JWT algorithm {alg!r} is not accepted (use some of {', '.join(SUPPORTED)};"
                    " 'none' and HMAC algorithms are never accepted)"
                )
        if not 0 <= self.leeway_s <= 300:
            raise JwtConfigError("the JWT leeway must be between 0 and 300 seconds")


@dataclass(frozen=True, slots=True)
class VerificationKey:
    kid: str
    key: Any  # a cryptography public key
    algorithms: tuple[str, ...]  # the configured algorithms this key may verify


def _fits(alg: str, jwk: Mapping[str, Any]) -> bool:
    kty, crv = SUPPORTED[alg]
    if jwk.get("kty") != kty or (crv is not None and jwk.get("crv") != crv):
        return False
    return jwk.get("alg") in (None, alg)


def parse_jwks(
    text: str, algorithms: Sequence[str], source: str = "JWKS"
) -> dict[str, VerificationKey]:
    """``kid`` → :class:`VerificationKey` for a JWKS document; :class:`JwtConfigError` if it
    is not a usable set of public signing keys."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise JwtConfigError(f"{source}: not JSON ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise JwtConfigError(f'{source}: expected {{"keys": [...]}}')
    keys: dict[str, VerificationKey] = {}
    for index, jwk in enumerate(document["keys"]):
        where = f"{source}: key {index}"
        if not isinstance(jwk, dict):
            raise JwtConfigError(f"{where}: not a JSON object")
        if jwk.get("use", "sig") != "sig":
            continue  # an encryption key: not for verifying signatures
        kid = jwk.get("kid")
        if not isinstance(kid, str) or not kid:
            raise JwtConfigError(f"{where}: every key needs a 'kid' (tokens pick keys by kid)")
        where = f"{source}: key {kid!r}"
        if kid in keys:
            raise JwtConfigError(f"{where}: the kid is used twice")
        kty = jwk.get("kty")
        if kty not in ("RSA", "EC", "OKP"):
            raise JwtConfigError(f"{where}: key type {kty!r} is not accepted (RSA, EC or OKP)")
        if _PRIVATE_MEMBERS & set(jwk):
            raise JwtConfigError(f"{where}: holds private key material; publish public keys only")
        declared = jwk.get("alg")
        if declared is not None and declared not in SUPPORTED:
            raise JwtConfigError(f"{where}: algorithm {declared!r} is not accepted")
        try:
            public = PyJWK(jwk, declared).key
        except (PyJWKError, PyJWTError, ValueError, TypeError) as exc:
            raise JwtConfigError(f"{where}: not a usable key ({exc})") from None
        if isinstance(public, rsa.RSAPublicKey) and public.key_size < 2048:
            raise JwtConfigError(f"{where}: RSA keys must have at least 2048 bits")
        usable = tuple(alg for alg in algorithms if _fits(alg, jwk))
        keys[kid] = VerificationKey(kid, public, usable)
    if not keys:
        raise JwtConfigError(f"{source}: no signing keys")
    return keys


class JwksFile:
    """The keys of a JWKS file, read again when a token names an unknown ``kid`` and the file
    has changed (key rotation)."""

    def __init__(
        self,
        path: Path,
        algorithms: Sequence[str],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.algorithms = tuple(algorithms)
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp, self.keys = self._read()
        self._checked = clock()

    def _read(self) -> tuple[tuple[int, int], dict[str, VerificationKey]]:
        try:
            stat = os.stat(self.path)
            text = self.path.read_text()
        except OSError as exc:
            raise JwtConfigError(f"{self.path}: cannot read the JWKS file ({exc})") from None
        return (stat.st_mtime_ns, stat.st_size), parse_jwks(text, self.algorithms, str(self.path))

    def get(self, kid: str) -> VerificationKey | None:
        found: VerificationKey | None = self.keys.get(kid)
        if found is not None:
            return found
        with self._lock:
            now = self._clock()
            if now - self._checked < RELOAD_INTERVAL_S:
                return self.keys.get(kid)
            self._checked = now
            try:
                stamp = os.stat(self.path)
            except OSError:
                return None
            if (stamp.st_mtime_ns, stamp.st_size) != self._stamp:
                try:
                    self._stamp, self.keys = self._read()
                    log.info("jwks reloaded", extra={"jwks": str(self.path)})
                except JwtConfigError as exc:
                    log.error(
                        "jwks reload failed; keeping the keys read before",
                        extra={"jwks": str(self.path), "error": str(exc)},
                    )
        return self.keys.get(kid)


def _failure(reason: str, detail: str) -> AuthFailure:
    return AuthFailure(reason, detail, "jwt")


MALFORMED = _failure("malformed", "The bearer token is not a well-formed JWT.")


class JwtAuthenticator:
    """Verifies JWT bearer tokens; satisfies :class:`producers.http.auth.Authenticator`."""

    def __init__(self, keys: JwksFile, settings: JwtSettings) -> None:
        self.keys = keys
        self.settings = settings
        self._audience: str | list[str] = (
            settings.audience if isinstance(settings.audience, str) else list(settings.audience)
        )

    @classmethod
    def load(cls, jwks: Path, settings: JwtSettings) -> JwtAuthenticator:
        return cls(JwksFile(jwks, settings.algorithms), settings)

    def check(self, authorization: str | None) -> TrustedContext | AuthFailure:
        token = bearer_token(authorization)
        return token if isinstance(token, AuthFailure) else self.verify(token)

    def authenticate(self, authorization: str | None) -> TrustedContext | None:
        context = self.check(authorization)
        return context if isinstance(context, TrustedContext) else None

    def verify(self, token: str) -> TrustedContext | AuthFailure:
        try:
            header = jwt.get_unverified_header(token)
        except (PyJWTError, ValueError, TypeError):
            return MALFORMED
        alg = header.get("alg")
        if not isinstance(alg, str) or not alg:
            return _failure("malformed", "The JWT header names no algorithm ('alg').")
        if alg.lower() == "none":
            return _failure("alg_none", "Unsigned JWTs ('alg: none') are refused.")
        if alg not in self.settings.algorithms:
            return _failure(
                "alg_not_allowed",
                "The JWT is signed with an algorithm this server does not accept "
                f"(accepted: {', '.join(self.settings.algorithms)}).",
            )
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            return _failure("no_kid", "The JWT header names no key ('kid').")
        key = self.keys.get(kid)
        if key is None:
            return _failure(
                "unknown_kid", "The JWT is signed with a key this server does not know."
            )
        if alg not in key.algorithms:
            return _failure(
                "alg_not_allowed", "The JWT's algorithm does not fit the key its 'kid' names."
            )
        try:
            claims = jwt.decode(
                token,
                key=key.key,
                algorithms=list(key.algorithms),  # from configuration and the key, not the token
                audience=self._audience,
                issuer=self.settings.issuer,
                leeway=self.settings.leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except PyJWTError as exc:
            return _decode_failure(exc)
        except (ValueError, TypeError):
            return MALFORMED
        return self._context(claims)

    def _context(self, claims: Mapping[str, Any]) -> TrustedContext | AuthFailure:
        names = self.settings.claims
        tenant = claims.get(names.tenant)
        if tenant is None:
            return _failure("missing_tenant", f"The JWT has no {names.tenant!r} claim (tenant).")
        if not _text(tenant, MAX_TENANT) or tenant == "*":  # "*": every tenant, in switches
            return _failure("bad_claim", f"The JWT's {names.tenant!r} claim is not a tenant id.")
        principal = claims.get(names.principal)
        if principal is None:
            return _failure(
                "missing_principal", f"The JWT has no {names.principal!r} claim (principal)."
            )
        if not _text(principal, MAX_PRINCIPAL):
            return _failure("bad_claim", f"The JWT's {names.principal!r} claim is not a principal.")
        scopes = self._scopes(claims)
        if scopes is None:
            return _failure("bad_claim", "The JWT's scopes are not a string or a list of strings.")
        assert isinstance(tenant, str) and isinstance(principal, str)
        return TrustedContext(tenant, principal, scopes)

    def _scopes(self, claims: Mapping[str, Any]) -> frozenset[str] | None:
        names = [self.settings.claims.scopes] if self.settings.claims.scopes else []
        names = names or ["scope", "scopes"]
        for name in names:
            if name in claims:
                return _scope_set(claims[name])
        return frozenset()


def _text(value: object, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit and bool(_NO_CONTROL.fullmatch(value))


def _scope_set(value: object) -> frozenset[str] | None:
    items: Iterable[object]
    if isinstance(value, str):
        items = value.split()
    elif isinstance(value, list):
        items = value
    else:
        return None
    if not all(_text(s, 256) and " " not in str(s) for s in items):
        return None
    scopes = frozenset(str(s) for s in items)
    return scopes if len(scopes) <= MAX_SCOPES else None


def _decode_failure(exc: PyJWTError) -> AuthFailure:
    """The reason for a failure of ``jwt.decode``: most specific exception classes first."""
    if isinstance(exc, ExpiredSignatureError):
        return _failure("expired", "The JWT has expired ('exp').")
    if isinstance(exc, ImmatureSignatureError):
        return _failure("not_yet_valid", "The JWT is not valid yet ('nbf' or 'iat').")
    if isinstance(exc, InvalidIssuedAtError):
        return _failure("bad_claim", "The JWT's 'iat' claim is not a time.")
    if isinstance(exc, MissingRequiredClaimError):
        return _failure("missing_claim", f"The JWT has no {exc.claim!r} claim.")
    if isinstance(exc, InvalidIssuerError):
        return _failure("wrong_issuer", "The JWT was not issued by the issuer this server trusts.")
    if isinstance(exc, InvalidAudienceError):
        return _failure("wrong_audience", "The JWT is not meant for this server (audience).")
    if isinstance(exc, InvalidSignatureError):
        return _failure(
            "bad_signature", "The JWT's signature does not verify with the key its 'kid' names."
        )
    if isinstance(exc, InvalidAlgorithmError | InvalidKeyError):
        return _failure(
            "alg_not_allowed", "The JWT's algorithm does not fit the key its 'kid' names."
        )
    if isinstance(exc, DecodeError):
        return MALFORMED
    return _failure("invalid", "The JWT is not valid.")
