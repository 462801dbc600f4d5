"""The SQL dialects of the read side: what differs between the SQLite and the PostgreSQL
projection when the same query is written once (:mod:`projections.search`,
:mod:`projections.governance`).

A query builder takes a :class:`Dialect` and returns a :data:`Query` (the SQL text with the
driver's placeholders, and its parameters); an adapter only runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "POSTGRES",
    "SQLITE",
    "Dialect",
    "Query",
    "aware",
    "parsed_time",
    "sqlite_table_time",
    "sqlite_time",
    "within",
]

Query = tuple[str, Sequence[Any]]
"""SQL text with the dialect's placeholders, and its parameters in order."""


@dataclass(frozen=True, slots=True)
class Dialect:
    mark: str  # the driver's placeholder
    collate: str  # appended to text comparisons and orderings: code point order everywhere
    time: Callable[[datetime], Any]  # a time parameter as the views' time columns hold it
    # a time parameter compared with a time column of the tables themselves (tool_calls)
    table_time: Callable[[datetime], Any]
    table_exists: str  # one row if the table (or view) the one parameter names exists
    # the principal a row's call key is scoped to (NULL for a tenant-scoped key): its JSON's
    # fourth part (schemas.keys.CallKey)
    key_principal: str


def aware(value: datetime) -> datetime:
    """``value`` in UTC; a naive time is refused (the read side never guesses a zone)."""
    if value.tzinfo is None:
        raise ValueError("naive datetime: give the read side timezone-aware times")
    return value.astimezone(UTC)


def parsed_time(value: Any) -> datetime | None:
    """A time column as either database returns it (SQLite: ISO text) as an aware time."""
    if value is None:
        return None
    return aware(value if isinstance(value, datetime) else datetime.fromisoformat(value))


def within(since: datetime, until: datetime, at: datetime | None) -> bool:
    """Whether ``at`` is in ``[since, until)``."""
    return at is not None and aware(since) <= at < aware(until)


def sqlite_time(value: datetime) -> str:
    """The SQLite views' time text: ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` in UTC."""
    return aware(value).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def sqlite_table_time(value: datetime) -> str:
    """The SQLite tables' time text: what ``isoformat()`` wrote there, the offset kept (a
    time read from those tables compares equal to its own row)."""
    aware(value)  # a naive time is refused
    return value.isoformat()


SQLITE = Dialect(
    "?",
    "",
    sqlite_time,
    sqlite_table_time,
    "SELECT 1 FROM sqlite_master WHERE type IN ('table', 'view') AND name = ?",
    "json_extract(call_key, '$[3]')",
)
POSTGRES = Dialect(
    "%s",
    ' COLLATE "C"',
    aware,
    aware,
    "SELECT 1 WHERE to_regclass(%s::text) IS NOT NULL",
    "(call_key::json ->> 3)",
)
