"""Bearer tokens from a tokens file: the trusted context comes from here and nowhere else."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from producers.client import TrustedContext


class TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(min_length=16)
    tenant: str = Field(min_length=1, max_length=128)
    principal: str = Field(min_length=1, max_length=256)
    scopes: list[str] = Field(default_factory=lambda: ["tools:call"])


class TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: list[TokenEntry]


class TokenFileError(ValueError):
    pass


class TokenStore:
    """Tokens are kept as SHA-256 digests and compared in constant time."""

    def __init__(self, entries: list[TokenEntry]) -> None:
        self._by_digest = {
            hashlib.sha256(e.token.encode()).digest(): TrustedContext(
                e.tenant, e.principal, frozenset(e.scopes)
            )
            for e in entries
        }

    @classmethod
    def load(cls, path: Path) -> TokenStore:
        try:
            return cls(TokensFile.model_validate(json.loads(path.read_text())).tokens)
        except (OSError, ValueError, ValidationError) as exc:
            raise TokenFileError(f"{path}: not a usable tokens file ({exc})") from None

    def authenticate(self, authorization: str | None) -> TrustedContext | None:
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        digest = hashlib.sha256(token.strip().encode()).digest()
        for known, context in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                return context
        return None
