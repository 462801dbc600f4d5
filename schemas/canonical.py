"""Canonical JSON and the arguments digest.

The normalisation, in order:

1. Strings (values *and* object keys) are Unicode-normalised to NFC, so "é" typed as one
   code point or as "e" + combining accent is the same argument.
2. Object keys are sorted by code point; duplicate keys after normalisation are an error.
3. Numbers: a float with an integral value is written as an integer (``1.0`` -> ``1``,
   ``-0.0`` -> ``0``); other floats use Python's shortest round-trip repr; ``NaN`` and
   ``Infinity`` are rejected because JSON cannot carry them. Booleans stay booleans.
4. No insignificant whitespace (``,`` and ``:`` separators), UTF-8 output, non-ASCII
   characters written as themselves (no ``\\u`` escapes), so escapes in the input do not matter.

The digest is ``"sha256:" + hex(sha256(canonical_bytes))``.
"""

from __future__ import annotations

import hashlib
import json
import math
import unicodedata
from typing import Any

__all__ = [
    "CanonicalJsonError",
    "args_digest",
    "canonical_bytes",
    "canonical_json",
    "digest_of_canonical",
    "normalise",
]

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]


class CanonicalJsonError(ValueError):
    """A value that has no canonical JSON form (NaN, Infinity, non-JSON types, key clashes)."""


def normalise(value: Any, _path: str = "$") -> JsonValue:
    """Return the normalised JSON value (rules 1-3 of the module docstring)."""
    if isinstance(value, str):
        if value.isascii():  # always valid UTF-8, and its own NFC
            return value
        _encodable(value, _path)
        return unicodedata.normalize("NFC", value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise CanonicalJsonError(f"{_path}: NaN and Infinity are not valid JSON numbers")
        if value.is_integer():
            return int(value)
        return value
    if isinstance(value, (list, tuple)):
        return [normalise(item, f"{_path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, JsonValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalJsonError(f"{_path}: object keys must be strings, got {key!r}")
            if key.isascii():
                nkey = key
            else:
                _encodable(key, _path)
                nkey = unicodedata.normalize("NFC", key)
            if nkey in out:
                raise CanonicalJsonError(f"{_path}: duplicate key {nkey!r} after NFC normalisation")
            # scalars need no path of their own (only a float or a string can be refused,
            # and their error names the object's path and key)
            out[nkey] = (
                item
                if type(item) is int or (type(item) is str and item.isascii())
                else normalise(item, f"{_path}.{nkey}")
            )
        return {k: out[k] for k in sorted(out)}
    raise CanonicalJsonError(f"{_path}: {type(value).__name__} is not a JSON value")


def _encodable(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise CanonicalJsonError(f"{path}: a lone surrogate is not valid Unicode text") from None


def canonical_json(value: Any) -> str:
    return json.dumps(normalise(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def canonical_bytes(value: Any) -> bytes:
    return canonical_json(value).encode("utf-8")


def args_digest(arguments: Any) -> str:
    return digest_of_canonical(canonical_json(arguments))


def digest_of_canonical(text: str) -> str:
    """The digest of a text that *is* canonical JSON (what :func:`canonical_json` returned):
    for a caller that needs the canonical text too, so it is made once."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
