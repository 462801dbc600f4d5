"""What a partition worker hands its store in one atomic write."""

from __future__ import annotations

from dataclasses import dataclass, field

from processors.ledger import CallState
from processors.ledger.governance import ApprovalBook, Switch
from schemas.events import Event


@dataclass(frozen=True, slots=True)
class DeadLetter:
    offset: int
    reason: str
    value: bytes


@dataclass(slots=True)
class CommitBatch:
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
