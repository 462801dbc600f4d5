"""An in-memory :class:`~processors.ports.PartitionStore` for property tests of
the partition worker: what a real store keeps (states, books, switches, refused offsets,
the position), with a commit that can be made to fail as a crash would."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from processors.ledger import CallState
from processors.ledger.governance import ApprovalBook, Switch
from processors.ports import CommitBatch, KeyEntry, Snapshot
from processors.runtime.state_table import book_meta, settled_at
from schemas.events import Event
from schemas.status import CallStatus


class Crash(Exception):
    pass


@dataclass
class MemoryStore:
    """Durable state of one partition; ``crash_at`` makes that commit fail (the process dies)."""

    states: dict[str, CallState] = field(default_factory=dict)
    books: dict[str, ApprovalBook] = field(default_factory=dict)
    switches: dict[str, Switch] = field(default_factory=dict)
    refused: frozenset[int] = frozenset()
    position: int = 0
    outcomes: list[Event] = field(default_factory=list)
    commits: int = 0
    crash_at: int | None = None
    reads: int = 0

    async def load(self, partition: int) -> Snapshot:
        unresolved = {
            k: s
            for k, s in self.states.items()
            if s.status in (CallStatus.PENDING, CallStatus.UNKNOWN)
        }
        books = {k: b for k, b in self.books.items() if k in unresolved}
        return Snapshot(unresolved, books, dict(self.switches), self.refused)

    async def read(self, keys: Sequence[str]) -> Mapping[str, KeyEntry]:
        self.reads += 1
        await asyncio.sleep(0)  # another task may run meanwhile, as with a thread
        return {
            k: KeyEntry(self.states.get(k), self.books.get(k))
            for k in keys
            if k in self.states or k in self.books
        }

    async def due(
        self, tool: str, settled_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[tuple[float, str]]:
        by_state = (
            (state.context.tool, settled_at(state.status.value, state.updated_at), key)
            for key, state in self.states.items()
        )
        by_book = (  # keys that only had approval requests
            (*book_meta(book), key) for key, book in self.books.items() if key not in self.states
        )
        settled = sorted(
            (at, key)
            for of, at, key in (*by_state, *by_book)
            if of == tool and at is not None and at <= settled_before
        )
        return [item for item in settled if after is None or item > after][:limit]

    async def commit(self, batch: CommitBatch) -> None:
        self.commits += 1
        if self.crash_at is not None and self.commits == self.crash_at:
            raise Crash(f"crash at commit {self.commits}")
        await asyncio.sleep(0)
        self.outcomes.extend(batch.events)
        for key in batch.expired:
            self.states.pop(key, None)
            self.books.pop(key, None)
        self.states.update(batch.states)
        self.books.update(batch.approvals)
        self.switches.update(batch.switches)
        if batch.refused is not None:
            self.refused = frozenset(batch.refused)
        if batch.next_offset is not None:
            self.position = batch.next_offset
