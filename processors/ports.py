"""The ports: what the executor stages, the partition worker and the runtimes share.

Types only (protocols and plain data), no I/O: the stages (:mod:`processors.pipeline`) and
their tracing (:mod:`processors.tracing`) talk to a runtime through a :class:`CallPort`; the
partition worker (:mod:`processors.runtime.partition`) talks to its durable store through a
:class:`PartitionStore`, which starts it from a :class:`Snapshot`, reads :class:`KeyEntry` s
and writes one :class:`CommitBatch` per atomic commit. Each runtime (embedded SQLite, Kafka)
implements these; nothing here knows which one runs.

See docs/architecture.md#the-executor-invariant for what a commit must guarantee.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from processors.ledger import CallState
from processors.ledger.governance import ApprovalBook, Switch
from schemas.events import Event

__all__ = [
    "CallPort",
    "Clock",
    "CommitBatch",
    "DeadLetter",
    "KeyEntry",
    "PartitionStore",
    "Snapshot",
    "SystemClock",
]

# -- the stages' side: one call port per input record ------------------------------------------


class CallPort(Protocol):
    """What the stages need from a runtime, for the call keys of one partition."""

    epoch: int

    def state(self, call_key: str) -> CallState | None: ...

    def approvals(self, call_key: str) -> ApprovalBook | None: ...

    def disabled(self, tenant_id: str, tool: str) -> Switch | None:
        """The kill switch that keeps ``tool`` off for ``tenant_id``, if one is in force."""

    async def commit(self, events: Sequence[Event], *, final: bool) -> None:
        """Durably append ``events`` (and the states they lead to) or raise.

        ``final`` marks the last commit for the current input record, so its position may
        be committed with it.
        """


class Clock(Protocol):
    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


# -- the store's side: one partition store per owned partition ---------------------------------


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """What the store holds for one call key; both None: the key is unused (or expired)."""

    state: CallState | None = None
    book: ApprovalBook | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    offset: int
    reason: str
    value: bytes


@dataclass(slots=True)
class CommitBatch:
    """What a partition worker hands its store in one atomic write."""

    partition: int
    events: list[Event] = field(default_factory=list)
    states: dict[str, CallState] = field(default_factory=dict)
    next_offset: int | None = None  # input position after this batch; None: unchanged
    dead_letters: list[DeadLetter] = field(default_factory=list)
    approvals: dict[str, ApprovalBook] = field(default_factory=dict)
    switches: dict[str, Switch] = field(default_factory=dict)
    # offsets past next_offset answered with a refusal (None: unchanged since the last batch)
    refused: list[int] | None = None
    expired: set[str] = field(default_factory=set)  # keys forgotten: state and book deleted


@dataclass(slots=True)
class Snapshot:
    """What a partition's executor holds from its start: the unresolved calls (PENDING,
    UNKNOWN) with their books, every switch and the refused offsets. Any other key's state
    is read from the store when the key is used."""

    states: dict[str, CallState] = field(default_factory=dict)
    approvals: dict[str, ApprovalBook] = field(default_factory=dict)  # by call key
    switches: dict[str, Switch] = field(default_factory=dict)  # by switch_key
    refused: frozenset[int] = frozenset()


class PartitionStore(Protocol):
    """A partition's durable state, as its worker uses it (one store per owned partition)."""

    async def load(self, partition: int) -> Snapshot:
        """What the worker holds from its start (see :class:`Snapshot`)."""

    async def read(self, keys: Sequence[str]) -> Mapping[str, KeyEntry]:
        """The stored entries of ``keys``, as of the last commit that returned."""

    async def due(
        self, tool: str, settled_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[tuple[float, str]]:
        """Keys of ``tool`` settled at or before ``settled_before`` (epoch seconds), oldest
        first, after the cursor ``after``: those whose retention may have passed."""

    async def commit(self, batch: CommitBatch) -> None:
        """Write the batch atomically, or raise (e.g. fenced by a newer owner)."""
