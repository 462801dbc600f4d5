"""What a dead letter carries (docs/consuming.md#dead-letters).

A record the ledger cannot process (an intent the executor cannot decode, an outcome the
projector cannot decode) is kept as Kafka Connect's dead letter queue keeps one: the original
record's key, value and headers as they were, plus headers that say where it was read and
why it was refused, with Kafka Connect's names:

==========================================  ==========================================
header                                      value (UTF-8 text)
==========================================  ==========================================
``__connect.errors.topic``                  the topic the record was read from
``__connect.errors.partition``              its partition (decimal)
``__connect.errors.offset``                 its offset (decimal)
``__connect.errors.exception.message``      why it was refused
==========================================  ==========================================

The original record's own headers come first, unchanged (its CloudEvents headers, if it had
any, still describe its value). An intent's dead letter holds the intent as it was, raw
arguments included: the dead-letters topic has the intents' retention and sensitivity.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from toolledger.schemas.cloudevents import Header

__all__ = [
    "ERROR_HEADERS",
    "DeadLetterRecord",
    "UnreadableDeadLetter",
]

TOPIC_HEADER: Final = "__connect.errors.topic"
PARTITION_HEADER: Final = "__connect.errors.partition"
OFFSET_HEADER: Final = "__connect.errors.offset"
MESSAGE_HEADER: Final = "__connect.errors.exception.message"
ERROR_HEADERS: Final = (TOPIC_HEADER, PARTITION_HEADER, OFFSET_HEADER, MESSAGE_HEADER)


class UnreadableDeadLetter(ValueError):
    """A record on the dead-letters topic without the headers that say where it came from."""


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """The original record (where it was read, its key, value and headers) and why."""

    topic: str
    partition: int
    offset: int
    reason: str
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()

    def kafka_headers(self) -> list[Header]:
        """The headers of the dead letter: the original ones, then the error headers."""
        return [
            *self.headers,
            (TOPIC_HEADER, self.topic.encode()),
            (PARTITION_HEADER, str(self.partition).encode()),
            (OFFSET_HEADER, str(self.offset).encode()),
            (MESSAGE_HEADER, self.reason.encode()),
        ]

    def headers_json(self) -> list[dict[str, str]]:
        """The original headers as JSON (the ``headers`` column of ``dead_letters``):
        ``{"name", "value"}`` for UTF-8 text, ``{"name", "base64"}`` for other bytes."""
        out = []
        for name, raw in self.headers:
            try:
                out.append({"name": name, "value": raw.decode()})
            except UnicodeDecodeError:
                out.append({"name": name, "base64": base64.b64encode(raw).decode("ascii")})
        return out

    @classmethod
    def from_kafka(
        cls,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]],
    ) -> DeadLetterRecord:
        """The dead letter a record of the dead-letters topic holds. Raises
        :class:`UnreadableDeadLetter` naming what is missing."""
        errors = {name: raw for name, raw in headers if name in ERROR_HEADERS}
        missing = [name for name in ERROR_HEADERS if name not in errors]
        if missing:
            raise UnreadableDeadLetter(f"dead letter without the header(s) {missing}")
        try:
            partition = int(errors[PARTITION_HEADER])
            offset = int(errors[OFFSET_HEADER])
            topic = errors[TOPIC_HEADER].decode()
            reason = errors[MESSAGE_HEADER].decode()
        except (ValueError, UnicodeDecodeError) as exc:
            raise UnreadableDeadLetter(
                f"dead letter with unreadable error headers ({exc})"
            ) from exc
        original = tuple((n, v) for n, v in headers if n not in ERROR_HEADERS)
        return cls(topic, partition, offset, reason, key, value, original)
