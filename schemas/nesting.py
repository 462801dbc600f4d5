"""How deep a call's arguments may nest, checked by every front door before anything is parsed
further or stored (docs/limits.md).

The arguments object itself is level 1; each array or object inside it is one level more. A
document deeper than :data:`MAX_DEPTH` is refused with :class:`NestingTooDeep` (a
``VALIDATION_FAILED``) at any depth: the checks never recurse, and the text check runs before a
parser, whose own recursion would otherwise fail at about a thousand levels.

Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MAX_DEPTH", "NestingTooDeep", "check_depth", "check_text_depth"]

MAX_DEPTH = 64

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_OPENERS = frozenset(b"[{")
_CONTAINERS = (dict, list, tuple)


class NestingTooDeep(ValueError):
    """``what`` nests arrays and objects deeper than :data:`MAX_DEPTH` levels."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"Too deeply nested: the arrays and objects in {what} go more than {MAX_DEPTH} "
            f"levels deep; the limit is {MAX_DEPTH} levels."
        )


def check_depth(value: object, what: str = "the arguments") -> None:
    """Raises :class:`NestingTooDeep` if the parsed JSON ``value`` (dicts, lists, tuples and
    scalars) has more than :data:`MAX_DEPTH` levels of containers, itself included."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list | tuple):
            continue
        if depth > MAX_DEPTH:
            raise NestingTooDeep(what)
        stack.extend((child, depth + 1) for child in item if isinstance(child, _CONTAINERS))


def check_text_depth(text: bytes | str, what: str = "the arguments", *, envelope: int = 0) -> None:
    """Raises :class:`NestingTooDeep` if the JSON ``text``, whose documents of arguments sit
    ``envelope`` levels down (0: the text *is* the arguments; 1: ``{"arguments": ...}``),
    nests deeper than that allows. Brackets inside strings do not count; text that is not
    JSON is left to the parser (an unterminated string's brackets count)."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    limit = MAX_DEPTH + envelope
    if brackets.count(b"[") + brackets.count(b"{") <= limit:  # cannot open more levels
        return
    depth = 0
    for byte in brackets:
        if byte in _OPENERS:
            depth += 1
            if depth > limit:
                raise NestingTooDeep(what)
        else:
            depth -= 1
