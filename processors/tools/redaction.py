"""Redaction of sensitive argument fields before anything leaves the intents stream."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from toolledger.schemas.canonical import canonical_bytes, canonical_json


class Redactor:
    """Replaces declared fields by a keyed hash: equal values stay comparable, none readable."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the redaction secret must have at least 16 bytes")
        self._secret = secret

    def mask(self, value: Any) -> str:
        mac = hmac.new(self._secret, canonical_bytes(value), hashlib.sha256).hexdigest()
        return f"redacted:hmac-sha256:{mac[:24]}"

    def redact(self, arguments: Mapping[str, Any], fields: frozenset[str]) -> dict[str, Any]:
        return {k: (self.mask(v) if k in fields else v) for k, v in arguments.items()}

    def redacted_json(self, arguments: Mapping[str, Any], fields: frozenset[str]) -> str:
        return canonical_json(self.redact(arguments, fields))
