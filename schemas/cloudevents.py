"""CloudEvents headers for the ledger's Kafka records (docs/consuming.md#headers).

The records of ``intents``, ``outcomes`` and ``groups`` are CloudEvents in the *binary content
mode* of CloudEvents' Kafka protocol binding (spec 1.0): the record's value is the event's
data as it is, its ``content-type`` header is the data's media type, and every other
attribute is a header named ``ce_<attribute>`` whose value is the attribute's UTF-8 text.

==================  ===========================================================================
header              value
==================  ===========================================================================
``ce_specversion``  ``1.0``
``ce_id``           the event's id (a ledger event: ``envelope.event_id``; a group event:
                    ``<group id>/<seq>``); ``ce_source`` + ``ce_id`` name one event, and two
                    records with both equal are copies of it (a switch sent to every
                    partition, a record published again)
``ce_source``       ``/tenants/<tenant>/tools/<tool>`` or ``/tenants/<tenant>/groups``
                    (each part percent-encoded)
``ce_type``         the event's full name: ``toolledger.events.<Avro record name>`` or
                    ``toolledger.groups.<event type>``
``ce_subject``      the call id (``call_...``) or the group id (``grp_...``)
``ce_time``         when it happened, RFC 3339 in UTC (``2024-05-01T12:00:00.000000Z``)
``ce_dataschema``   (Confluent framing only) ``<registry URL>/schemas/ids/<id>``
``content-type``    the media type of the value (see :mod:`schemas.wire`)
==================  ===========================================================================

The ``state`` topic is a changelog of the executor's call states, not events: its records
carry no CloudEvents headers. A dead letter keeps the headers of the record it holds.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import Final
from urllib.parse import quote

from toolledger.schemas.events import Event
from toolledger.schemas.keys import call_id_for

__all__ = [
    "EVENT_NAMESPACE",
    "GROUP_NAMESPACE",
    "SPECVERSION",
    "Header",
    "event_headers",
    "group_event_headers",
    "rfc3339",
]

SPECVERSION: Final = "1.0"
EVENT_NAMESPACE: Final = "toolledger.events"
GROUP_NAMESPACE: Final = "toolledger.groups"

Header = tuple[str, bytes]
"""A Kafka record header: name, value."""

_SPECVERSION: Final = (("ce_specversion", SPECVERSION.encode("ascii")),)


def rfc3339(moment: datetime) -> str:
    """``moment`` in UTC with microseconds and a ``Z``: the text of ``ce_time``."""
    if moment.utcoffset() is None:
        raise ValueError(f"a CloudEvents time must be timezone-aware, got {moment.isoformat()}")
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


@lru_cache(maxsize=4096)
def _tool_source(tenant_id: str, tool: str) -> bytes:
    return f"/tenants/{quote(tenant_id, safe='')}/tools/{quote(tool, safe='')}".encode()


@lru_cache(maxsize=64)
def _event_type(name: str) -> bytes:
    return f"{EVENT_NAMESPACE}.{name}".encode()


def event_headers(event: Event, content_type: str, dataschema: str | None = None) -> list[Header]:
    """The CloudEvents headers of a ledger event whose value has media type ``content_type``."""
    env = event.envelope
    headers = [
        *_SPECVERSION,
        ("ce_id", env.event_id.encode()),
        ("ce_source", _tool_source(env.tenant_id, env.tool)),
        ("ce_type", _event_type(type(event).TYPE)),
        ("ce_subject", call_id_for(env.call_key, env.idempotency_key, env.intent_id).encode()),
        ("ce_time", rfc3339(env.occurred_at).encode()),
    ]
    if dataschema is not None:
        headers.append(("ce_dataschema", dataschema.encode()))
    headers.append(("content-type", content_type.encode()))
    return headers


def group_event_headers(
    tenant_id: str, group_id: str, seq: int, event_type: str, at: datetime | None
) -> list[Header]:
    """The CloudEvents headers of a call group's event (JSON, ``seq``: its place in the group
    log; ``at``: when it was appended, if the stored event says)."""
    headers = [
        *_SPECVERSION,
        ("ce_id", f"{group_id}/{seq}".encode()),
        ("ce_source", f"/tenants/{quote(tenant_id, safe='')}/groups".encode()),
        ("ce_type", f"{GROUP_NAMESPACE}.{event_type}".encode()),
        ("ce_subject", group_id.encode()),
    ]
    if at is not None:
        headers.append(("ce_time", rfc3339(at).encode()))
    headers.append(("content-type", b"application/json"))
    return headers
