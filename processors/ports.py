"""The ports: what the executor core, the tool stages and the runtimes share.

Types only (protocols and plain data), no I/O. The executor core
(:mod:`processors.executor`) decides a batch at a time; it meets

* the tool stages (:mod:`processors.pipeline`) through :class:`ToolStages`: admission, the
  approval gate, and the effects (handler, reconcile, poll, cancel), each returning its outcome
  as data;
* its durable state through a :class:`StateStore`: synchronous reads (the start's
  :class:`Snapshot`, a key's :class:`KeyEntry`, the keys whose retention may have passed);
* its runtime through one function, ``write(batch)``, which makes a :class:`CommitBatch`
  durable in one atomic write or raises.

Each runtime (embedded SQLite, Kafka) implements the store and the write; nothing here knows
which one runs. See docs/architecture.md#the-executor-invariant for what a write must
guarantee.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel

from toolledger.processors.ledger import (
    AttemptOutcome,
    CallContext,
    CallState,
    Gate,
    JobOutcome,
    Policy,
    ReconcileOutcome,
)
from toolledger.processors.ledger.governance import ApprovalBook, Switch
from toolledger.schemas.errors import ErrorInfo
from toolledger.schemas.events import (
    Event,
    ToolCallJobCancelRequested,
    ToolCallJobReported,
    ToolCallRejected,
    ToolCallRequested,
)

if TYPE_CHECKING:
    from toolledger.processors.tools.manifest import Tool

__all__ = [
    "Admitted",
    "Clock",
    "CommitBatch",
    "DeadLetter",
    "KeyEntry",
    "Snapshot",
    "StateStore",
    "SystemClock",
    "ToolStages",
    "Write",
]


class Clock(Protocol):
    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


# -- the tool stages' side --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Admitted:
    """An intent that passed parse, validation and authorisation (admitted once)."""

    tool: Tool
    arguments: BaseModel  # the tool's validated argument model
    context: CallContext  # with the tool version and the args digest
    redacted_json: str  # the arguments as the audit trail keeps them


class ToolStages(Protocol):
    """What the executor core asks of the tools: everything that reads a tool or runs one."""

    def admit(self, intent: ToolCallRequested) -> Admitted | ToolCallRejected: ...

    def tool(self, name: str) -> Tool | None: ...

    def tools(self) -> Sequence[Tool]: ...

    def policy(self, tool: Tool) -> Policy: ...

    def gate(
        self, intent: ToolCallRequested, admitted: Admitted, disabled: ErrorInfo | None
    ) -> Gate: ...

    def backoff_s(self, tool: Tool, round_attempt: int) -> float: ...

    async def execute(self, admitted: Admitted, attempt: int) -> tuple[AttemptOutcome, float]:
        """Run the handler once; the outcome and its duration in milliseconds."""

    async def reconcile(self, tool: Tool, ctx: CallContext, n: int) -> ReconcileOutcome: ...

    async def poll(self, tool: Tool, state: CallState) -> JobOutcome: ...

    async def cancel(self, tool: Tool, state: CallState) -> ErrorInfo | None:
        """Call the tool's cancel; the error when it failed (the job may still run)."""

    async def read_only(self, admitted: Admitted) -> Event: ...

    def job_outcome(
        self, tool: Tool, report: ToolCallJobReported
    ) -> JobOutcome | ToolCallRejected: ...

    def job_call(
        self, record: ToolCallJobReported | ToolCallJobCancelRequested, state: CallState | None
    ) -> tuple[Tool, CallContext] | ToolCallRejected: ...


# -- the store's side -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """What the store holds for one call key; both None: the key is unused (or expired)."""

    state: CallState | None = None
    book: ApprovalBook | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An input record that cannot be decided: kept whole (key, value, headers) with the
    reason, never executed."""

    partition: int
    offset: int | None
    reason: str
    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(slots=True)
class CommitBatch:
    """What the executor hands its runtime in one atomic write."""

    events: list[Event] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)  # the log partition of each event
    states: dict[str, CallState] = field(default_factory=dict)
    created: set[str] = field(default_factory=set)  # keys of ``states`` new in this batch
    approvals: dict[str, ApprovalBook] = field(default_factory=dict)
    switches: dict[tuple[int, str], Switch] = field(default_factory=dict)  # (partition, key)
    expired: set[str] = field(default_factory=set)  # keys forgotten: state and book deleted
    dead_letters: list[DeadLetter] = field(default_factory=list)
    positions: dict[int, int] = field(default_factory=dict)  # input position per partition
    # offsets past a partition's position answered with a refusal (only when they changed)
    refused: dict[int, list[int]] = field(default_factory=dict)
    # the raw intents of calls that opened an approval request: the decider sees their
    # arguments (a runtime whose intents stream keeps them anyway may ignore these)
    approval_intents: list[ToolCallRequested] = field(default_factory=list)

    def add(self, event: Event, partition: int) -> None:
        self.events.append(event)
        self.partitions.append(partition)

    def __bool__(self) -> bool:
        return bool(
            self.events
            or self.states
            or self.approvals
            or self.switches
            or self.expired
            or self.dead_letters
            or self.positions
            or self.refused
        )


Write = Callable[[CommitBatch], Awaitable[None]]


@dataclass(slots=True)
class Snapshot:
    """What an executor holds from its start: the unresolved calls (PENDING, UNKNOWN) with
    their books, every switch, and per partition the input position and the refused offsets.
    Any other key's entry is read from the store when the key is used."""

    states: dict[str, CallState] = field(default_factory=dict)
    approvals: dict[str, ApprovalBook] = field(default_factory=dict)  # by call key
    switches: dict[str, Switch] = field(default_factory=dict)  # by switch_key
    positions: dict[int, int] = field(default_factory=dict)
    refused: dict[int, frozenset[int]] = field(default_factory=dict)


class StateStore(Protocol):
    """An executor's durable state, read synchronously (a local SQLite file, or memory)."""

    def load(self) -> Snapshot:
        """What the executor holds from its start (see :class:`Snapshot`)."""

    def read(self, keys: Sequence[str]) -> Mapping[str, KeyEntry]:
        """The stored entries of ``keys``, as of the last write that returned."""

    def due(
        self, tool: str, settled_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[tuple[float, str]]:
        """Keys of ``tool`` settled at or before ``settled_before`` (epoch seconds), oldest
        first, after the cursor ``after``: those whose retention may have passed."""
