"""An in-memory :class:`~processors.ports.StateStore` and write for property tests of the
executor (one input partition, 0): what a real store keeps (states, books, switches, refused
offsets, the position), with a commit that can be made to fail as a crash would."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from toolledger.processors.ledger import CallState
from toolledger.processors.ledger.governance import ApprovalBook, Switch
from toolledger.processors.ports import CommitBatch, KeyEntry, Snapshot
from toolledger.processors.runtime.state_table import book_meta, settled_at
from toolledger.schemas.events import Event
from toolledger.schemas.status import CallStatus

PARTITION = 0  # the one partition whose inputs the store's executor decides


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

    def load(self) -> Snapshot:
        unresolved = {
            k: s
            for k, s in self.states.items()
            if s.status in (CallStatus.PENDING, CallStatus.UNKNOWN)
        }
        books = {k: b for k, b in self.books.items() if k in unresolved}
        return Snapshot(
            unresolved,
            books,
            dict(self.switches),
            positions={PARTITION: self.position},
            refused={PARTITION: self.refused},
        )

    def read(self, keys: Sequence[str]) -> Mapping[str, KeyEntry]:
        self.reads += 1
        return {
            k: KeyEntry(self.states.get(k), self.books.get(k))
            for k in keys
            if k in self.states or k in self.books
        }

    def due(
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
        await asyncio.sleep(0)  # the write takes a while: other tasks run meanwhile
        assert batch.partitions == [PARTITION] * len(batch.events), batch.partitions
        self.outcomes.extend(batch.events)
        for key in batch.expired:
            self.states.pop(key, None)
            self.books.pop(key, None)
        self.states.update(batch.states)
        self.books.update(batch.approvals)
        for (_partition, key), switch in batch.switches.items():
            self.switches[key] = switch
        if PARTITION in batch.refused:
            self.refused = frozenset(batch.refused[PARTITION])
        if PARTITION in batch.positions:
            self.position = batch.positions[PARTITION]
