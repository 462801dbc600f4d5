"""The request headers of the idempotency contract: ``Idempotency-Key`` and ``Prefer``."""

from __future__ import annotations

import re

from schemas.keys import InvalidIdempotencyKey, check_idempotency_key

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
        value = value[1:-1]
    return check_idempotency_key(value)


def wait_seconds(prefer: list[str]) -> float:
    for value in prefer:
        match = _WAIT.search(value)
        if match:
            return min(MAX_WAIT_S, float(match.group(1)))
    return DEFAULT_WAIT_S
