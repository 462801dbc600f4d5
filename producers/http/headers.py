"""What a request says, read so that it can only mean one thing: the ``Idempotency-Key`` and
``Prefer`` headers, headers that must come once, and JSON bodies without duplicate members."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from toolledger.schemas.keys import InvalidIdempotencyKey, check_idempotency_key

DEFAULT_WAIT_S = 10.0
MAX_WAIT_S = 60.0
_WAIT = re.compile(r"(?:^|[;,\s])wait\s*=\s*(\d+(?:\.\d+)?)\s*(?:$|[;,\s])", re.IGNORECASE)


def idempotency_key(values: list[str]) -> str | None:
    """The key from the header lines (HTTP has trimmed the value), or ``None`` if absent.

    Raises :class:`InvalidIdempotencyKey` for two header lines, an empty value, control or
    non-ASCII characters, or more than 255 characters. ``"K"`` (a structured-field String) and
    ``K`` are the same key.
    """
    if not values:
        return None
    if len(values) > 1:
        raise InvalidIdempotencyKey("send exactly one Idempotency-Key header")
    value = values[0].strip(" \t")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = sf_string(value)
        if value != value.strip(" "):  # as a bare value would be: HTTP trims those
            raise InvalidIdempotencyKey("a quoted key cannot start or end with a space")
    return check_idempotency_key(value)


def sf_string(quoted: str) -> str:
    """The value of an RFC 8941 sf-string (``"..."``): ``\\"`` and ``\\\\`` are the only
    escapes; an unescaped ``"``, another escape or a character outside 0x20-0x7E is refused."""
    out: list[str] = []
    inner, index = quoted[1:-1], 0
    while index < len(inner):
        char = inner[index]
        if char == "\\":
            escaped = inner[index + 1 : index + 2]
            if escaped not in ('"', "\\"):
                raise InvalidIdempotencyKey(
                    f'a quoted key may escape only \\ and " (position {index + 1})'
                )
            out.append(escaped)
            index += 2
            continue
        if char == '"':
            raise InvalidIdempotencyKey(f'a quoted key has an unescaped " at position {index + 1}')
        if not 0x20 <= ord(char) <= 0x7E:
            raise InvalidIdempotencyKey(
                "the idempotency key has a non-printable or non-ASCII character "
                f"at position {index + 1}"
            )
        out.append(char)
        index += 1
    return "".join(out)


def wait_seconds(prefer: list[str]) -> float:
    asked = asked_wait(prefer)
    return DEFAULT_WAIT_S if asked is None else asked


def asked_wait(prefer: list[str]) -> float | None:
    """The ``wait`` of a ``Prefer`` header (capped), None when the caller sent none."""
    for value in prefer:
        match = _WAIT.search(value)
        if match:
            return min(MAX_WAIT_S, float(match.group(1)))
    return None


# Headers whose second copy would let two parties read one request differently.
_ONCE = (b"authorization", b"content-type", b"content-length", b"transfer-encoding")


def ambiguity(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """Why the request's headers can be read two ways, or ``None``: a header of ``_ONCE``
    sent twice (the first and the last would name other callers or bodies), or a body framed
    by both ``Content-Length`` and ``Transfer-Encoding``."""
    seen: dict[bytes, int] = {}
    for name, _value in headers:
        lowered = name.lower()
        if lowered in _ONCE:
            seen[lowered] = seen.get(lowered, 0) + 1
    for name in _ONCE:
        if seen.get(name, 0) > 1:
            return f"The request has {seen[name]} {name.decode().title()} headers; send one."
    if seen.get(b"content-length") and seen.get(b"transfer-encoding"):
        return "The request has both Content-Length and Transfer-Encoding; send one of them."
    return None


class JsonBodyError(ValueError):
    """A JSON body that could be read two ways (a duplicate member) or is not standard JSON."""


def strict_json(raw: bytes) -> Any:
    """``raw`` as JSON, refusing duplicate members at any depth (the first and the last would
    be different calls) and NaN or Infinity (not JSON)."""

    def members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for name, value in pairs:
            if name in found:
                raise JsonBodyError(f"The body has the member {name!r} twice; send it once.")
            found[name] = value
        return found

    def not_json(token: str) -> Any:
        raise JsonBodyError(f"The body has {token}, which is not a JSON number.")

    try:
        return json.loads(raw, object_pairs_hook=members, parse_constant=not_json)
    except JsonBodyError:
        raise
    except (ValueError, UnicodeDecodeError) as exc:
        raise JsonBodyError(f"The body is not JSON: {exc}") from None
