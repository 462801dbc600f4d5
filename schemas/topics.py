"""Topic names, partition keys and the co-partitioning rule shared by producers and processors."""

from __future__ import annotations

from dataclasses import dataclass

from toolledger.schemas.events import Event
from toolledger.schemas.keys import call_id_for, partition_for

INTENT_ID_HEADER = "intent_id"
ANSWER_HEADER = "answer"  # "1" on the event that answers its intent's caller


@dataclass(frozen=True, slots=True)
class Position:
    """Where a record is in its topic: the partition and the offset within it (the same on
    Kafka and in the embedded log)."""

    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Topics:
    """``intents``, ``outcomes``, ``state`` (compacted) and ``dead-letters``, co-partitioned:
    the same call key maps to the same partition number in each of them; ``groups``, the
    call groups' events, partitioned by group id (Kafka + PostgreSQL backend); and
    ``settings``, one partition: the settings every process of the deployment shares (the
    key retention)."""

    prefix: str = "toolledger."
    partitions: int = 4

    @property
    def intents(self) -> str:
        return f"{self.prefix}intents"

    @property
    def outcomes(self) -> str:
        return f"{self.prefix}outcomes"

    @property
    def state(self) -> str:
        return f"{self.prefix}state"

    @property
    def dead_letters(self) -> str:
        return f"{self.prefix}dead-letters"

    @property
    def groups(self) -> str:
        return f"{self.prefix}groups"

    @property
    def settings(self) -> str:
        return f"{self.prefix}settings"

    @property
    def executor_group(self) -> str:
        return f"{self.prefix}executor"

    @property
    def projector_group(self) -> str:
        return f"{self.prefix}projector"

    def partition_of(self, record: Event) -> int:
        return partition_for(partition_key(record), self.partitions)


def partition_key(record: Event) -> bytes:
    """The Kafka key of every record of a call, on every topic, and what partitions it: a
    keyed call's (and operators' decisions on it) is its call key; an unkeyed (read-only)
    call's is its own call id (``call_...``), as is a switch's (which is appended to every
    partition all the same)."""
    env = record.envelope
    if env.idempotency_key:
        return env.call_key.encode("utf-8")
    return call_id_for(env.call_key, "", env.intent_id).encode("utf-8")
