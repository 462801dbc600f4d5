"""Every table and view of a read model, dumped in a defined order, to compare two states of
one database row for row and column for column, the order included (``toolledger replay``
must give back what the live projection wrote: issue 31).

A relation's rows are in the order of its primary key (the audit trail's ``seq`` is its
order), then of every column; a view's (no key) in the order of every column. Columns whose
value is the database's clock at write time (not the log's) are named in ``volatile`` and
left out: :data:`WRITE_TIMES`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

Dump = dict[str, tuple[tuple[str, ...], list[tuple[Any, ...]]]]
"""Relation name -> (its columns, its rows in the defined order)."""

WRITE_TIMES: Mapping[str, frozenset[str]] = {
    "dead_letters": frozenset({"id", "recorded_at"}),
    "projector_positions": frozenset({"updated_at"}),
    "schema_migrations": frozenset({"applied_at"}),
}
"""Columns of the PostgreSQL read model stamped by the database's clock or by a counter of
the order rows were inserted in (dead letters, positions: bookkeeping, not the log's)."""

_PG_RELATIONS = """
SELECT c.relname, c.relkind = 'v' AS is_view
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'v')
 ORDER BY c.relname
"""
_PG_COLUMNS = """
SELECT attname FROM pg_attribute
 WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum
"""
_PG_KEY = """
SELECT a.attname FROM pg_index i
  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
 WHERE i.indrelid = %s::regclass AND i.indisprimary
 ORDER BY array_position(i.indkey::int2[], a.attnum)
"""


def _order(key: Sequence[str], columns: Sequence[str]) -> str:
    return ", ".join(f'"{c}"' for c in dict.fromkeys([*key, *columns]))


async def dump_postgres(dsn: str, volatile: Mapping[str, frozenset[str]] = WRITE_TIMES) -> Dump:
    """Every table and view of the DSN's schema (``search_path``)."""
    dump: Dump = {}
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        relations = await (await conn.execute(_PG_RELATIONS)).fetchall()
        for name, is_view in relations:
            cur = await conn.execute(_PG_COLUMNS, (name,))
            skip = volatile.get(name, frozenset())
            columns = tuple(r[0] for r in await cur.fetchall() if r[0] not in skip)
            key: list[str] = []
            if not is_view:
                key = [r[0] for r in await (await conn.execute(_PG_KEY, (name,))).fetchall()]
                key = [k for k in key if k in columns]
            select = ", ".join(f'"{c}"' for c in columns)
            query = f'SELECT {select} FROM "{name}" ORDER BY {_order(key, columns)}'
            dump[name] = (columns, list(await (await conn.execute(query.encode())).fetchall()))
    return dump


def dump_sqlite(
    conn: sqlite3.Connection, volatile: Mapping[str, frozenset[str]] = WRITE_TIMES
) -> Dump:
    """Every table and view of a SQLite database (its own bookkeeping ``sqlite_*`` left out)."""
    dump: Dump = {}
    relations = conn.execute(
        "SELECT name, type = 'view' FROM sqlite_master WHERE type IN ('table', 'view') "
        "AND name NOT LIKE 'sqlite_%' ORDER BY name"
    ).fetchall()
    for name, is_view in relations:
        info = conn.execute(f'PRAGMA table_info("{name}")').fetchall()  # cid, name, ..., pk
        skip = volatile.get(name, frozenset())
        columns = tuple(r[1] for r in info if r[1] not in skip)
        key = [] if is_view else [r[1] for r in sorted(info, key=lambda r: r[5]) if r[5]]
        select = ", ".join(f'"{c}"' for c in columns)
        query = f'SELECT {select} FROM "{name}" ORDER BY {_order(key, columns)}'
        dump[name] = (columns, [tuple(r) for r in conn.execute(query)])
    return dump


def differences(before: Dump, after: Dump) -> list[str]:
    """What differs between two dumps, one line per relation (empty: identical)."""
    found: list[str] = []
    for name in sorted(set(before) | set(after)):
        if name not in before or name not in after:
            found.append(f"{name}: only {'after' if name in after else 'before'}")
            continue
        (cols_a, rows_a), (cols_b, rows_b) = before[name], after[name]
        if cols_a != cols_b:
            found.append(f"{name}: columns {cols_a} != {cols_b}")
        elif rows_a != rows_b:
            at = next(
                (i for i, (a, b) in enumerate(zip(rows_a, rows_b, strict=False)) if a != b),
                min(len(rows_a), len(rows_b)),
            )
            found.append(
                f"{name}: {len(rows_a)} vs {len(rows_b)} rows, first difference at row {at}: "
                f"{rows_a[at] if at < len(rows_a) else None} != "
                f"{rows_b[at] if at < len(rows_b) else None}"
            )
    return found
