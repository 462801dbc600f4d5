"""A ledger event as a Kafka record: key, framed value and headers (docs/consuming.md).

The value is the event's Avro binary body behind one of two framings:

* :class:`SingleObject` (the default): the Avro single-object encoding,
  ``C3 01`` + 8-byte CRC-64-AVRO fingerprint (little-endian) + body (:mod:`schemas.codec`);
  ``content-type: application/avro; format=single-object; schema=toolledger.events.<Name>``.
* :class:`Confluent`: the Confluent Schema Registry wire format, ``00`` + 4-byte schema id
  (big-endian) + body, the schemas registered under the record name strategy (subject =
  the record's full name, since one topic carries several types);
  ``content-type: application/avro; format=confluent; schema=toolledger.events.<Name>`` and
  ``ce_dataschema: <registry URL>/schemas/ids/<id>``.

The body is the same bytes in both, so one framing is turned into the other by swapping the
header, without decoding. The key is :func:`schemas.topics.partition_key`; the headers are
the CloudEvents headers (:mod:`schemas.cloudevents`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Final, Protocol

from toolledger.schemas import codec
from toolledger.schemas.cloudevents import EVENT_NAMESPACE, Header, event_headers
from toolledger.schemas.events import Event
from toolledger.schemas.topics import partition_key

__all__ = [
    "CONFLUENT_MAGIC",
    "SINGLE_OBJECT",
    "Confluent",
    "SingleObject",
    "UnknownSchemaId",
    "WireFormat",
]

CONFLUENT_MAGIC: Final = b"\x00"
_CONFLUENT_HEADER: Final = len(CONFLUENT_MAGIC) + 4


class UnknownSchemaId(codec.CodecError):
    """A Confluent-framed value whose schema id is not one of the ledger's registered schemas."""

    def __init__(self, schema_id: int) -> None:
        self.schema_id = schema_id
        super().__init__(
            f"schema id {schema_id} is not one of the ledger's schemas registered in the "
            "schema registry this process uses"
        )


class WireFormat(Protocol):
    name: str

    def record(self, event: Event) -> tuple[bytes, bytes, list[Header]]:
        """The Kafka key, value and CloudEvents headers of ``event``."""
        ...

    def to_single_object(self, data: bytes) -> bytes:
        """``data`` in the single-object encoding (as it is if it cannot be translated)."""
        ...

    def decode(self, data: bytes) -> Event:
        """The event in ``data``, in this framing or in the single-object encoding."""
        ...


@lru_cache(maxsize=64)
def _content_type(framing: str, event_type: str) -> str:
    return f"application/avro; format={framing}; schema={EVENT_NAMESPACE}.{event_type}"


class SingleObject:
    """The Avro single-object encoding (:mod:`schemas.codec`)."""

    name = "single-object"

    def record(self, event: Event) -> tuple[bytes, bytes, list[Header]]:
        headers = event_headers(event, _content_type(self.name, type(event).TYPE))
        return partition_key(event), codec.encode(event), headers

    def to_single_object(self, data: bytes) -> bytes:
        return data

    def decode(self, data: bytes) -> Event:
        return codec.decode(data)


SINGLE_OBJECT: Final = SingleObject()


class Confluent:
    """The Confluent wire format over the ids a schema registry gave the ledger's schemas.

    ``ids``: CRC-64-AVRO fingerprint (8 bytes, as in the single-object header) -> schema id,
    for every committed schema version (registering them is the composition root's part).
    """

    name = "confluent"

    def __init__(self, registry_url: str, ids: Mapping[bytes, int]) -> None:
        self.registry_url = registry_url.rstrip("/")
        self._ids = dict(ids)
        self._fingerprints = {schema_id: fp for fp, schema_id in self._ids.items()}
        if len(self._fingerprints) != len(self._ids):
            raise ValueError("two schemas have the same schema id")

    def record(self, event: Event) -> tuple[bytes, bytes, list[Header]]:
        event_type = type(event).TYPE
        single = codec.encode(event)
        schema_id = self._ids.get(single[len(codec.MARKER) : codec.HEADER_SIZE])
        if schema_id is None:
            raise codec.CodecError(f"the schema of {event_type} is not registered")
        headers = event_headers(
            event,
            _content_type(self.name, event_type),
            f"{self.registry_url}/schemas/ids/{schema_id}",
        )
        value = CONFLUENT_MAGIC + schema_id.to_bytes(4, "big") + single[codec.HEADER_SIZE :]
        return partition_key(event), value, headers

    def to_single_object(self, data: bytes) -> bytes:
        if data[:1] != CONFLUENT_MAGIC or len(data) < _CONFLUENT_HEADER:
            return data
        fingerprint = self._fingerprints.get(int.from_bytes(data[1:_CONFLUENT_HEADER], "big"))
        if fingerprint is None:
            return data
        return codec.MARKER + fingerprint + data[_CONFLUENT_HEADER:]

    def decode(self, data: bytes) -> Event:
        if data[:1] == CONFLUENT_MAGIC and len(data) >= _CONFLUENT_HEADER:
            schema_id = int.from_bytes(data[1:_CONFLUENT_HEADER], "big")
            if schema_id not in self._fingerprints:
                raise UnknownSchemaId(schema_id)
        return codec.decode(self.to_single_object(data))
