"""A ledger event as a Kafka record (schemas/wire.py, schemas/cloudevents.py, schemas/topics.py
partition_key, schemas/dead_letters.py): docs/consuming.md."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from toolledger.schemas import codec
from toolledger.schemas.cloudevents import group_event_headers, rfc3339
from toolledger.schemas.dead_letters import (
    ERROR_HEADERS,
    DeadLetterRecord,
    UnreadableDeadLetter,
)
from toolledger.schemas.events import Envelope, ToolCallRequested, ToolCallSucceeded, ToolDisabled
from toolledger.schemas.keys import CallKey, call_id_for, partition_for
from toolledger.schemas.topics import Topics, partition_key
from toolledger.schemas.wire import SINGLE_OBJECT, Confluent, UnknownSchemaId

AT = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)


def envelope(key: str, intent_id: str, event_id: str, tool: str = "create ticket/é") -> Envelope:
    return Envelope(
        event_id=event_id,
        call_key=str(CallKey("acme corp", tool, key)),
        tenant_id="acme corp",
        tool=tool,
        tool_version="1",
        idempotency_key=key,
        args_digest="sha256:00",
        intent_id=intent_id,
        occurred_at=AT,
    )


def succeeded(key: str = "k-1", intent_id: str = "i-1") -> ToolCallSucceeded:
    return ToolCallSucceeded(
        envelope=envelope(key, intent_id, f"{intent_id}/succeeded/1"),
        attempt=1,
        result_json="{}",
        duration_ms=3,
    )


def requested(key: str = "k-1", intent_id: str = "i-1") -> ToolCallRequested:
    return ToolCallRequested(
        envelope=envelope(key, intent_id, f"{intent_id}/requested/1"), arguments_json="{}"
    )


# ------------------------------------------------------------------------------ CloudEvents


def test_every_event_gets_the_binary_mode_headers() -> None:
    event = succeeded()
    _, value, headers = SINGLE_OBJECT.record(event)
    assert value == codec.encode(event)
    assert dict(headers) == {
        "ce_specversion": b"1.0",
        "ce_id": b"i-1/succeeded/1",
        "ce_source": b"/tenants/acme%20corp/tools/create%20ticket%2F%C3%A9",
        "ce_type": b"toolledger.events.ToolCallSucceeded",
        "ce_subject": CallKey("acme corp", "create ticket/é", "k-1").call_id.encode(),
        "ce_time": b"2024-05-01T12:00:00.123456Z",
        "content-type": (
            b"application/avro; format=single-object; schema=toolledger.events.ToolCallSucceeded"
        ),
    }
    assert len(headers) == len(dict(headers)), "a header name twice"
    for name, raw in headers:
        assert name == name.lower() and raw.decode("utf-8")  # UTF-8 text, as the binding says


def test_ce_time_is_utc_rfc3339() -> None:
    east = AT.astimezone(timezone(timedelta(hours=5)))
    assert rfc3339(east) == "2024-05-01T12:00:00.123456Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        rfc3339(datetime(2024, 5, 1))


def test_group_events_are_cloudevents_of_their_own_type() -> None:
    headers = dict(group_event_headers("acme", "grp_1", 42, "StepStarted", AT))
    assert headers["ce_id"] == b"grp_1/42"
    assert headers["ce_type"] == b"toolledger.groups.StepStarted"
    assert headers["ce_subject"] == b"grp_1"
    assert headers["ce_source"] == b"/tenants/acme/groups"
    assert headers["content-type"] == b"application/json"
    assert "ce_time" not in dict(group_event_headers("acme", "grp_1", 1, "GroupResumed", None))


# --------------------------------------------------------------------------------- the keys


def test_a_keyed_call_is_keyed_by_its_call_key_on_every_topic() -> None:
    key = partition_key(requested())
    assert (
        key
        == partition_key(succeeded())
        == str(CallKey("acme corp", "create ticket/é", "k-1")).encode()
    )
    assert SINGLE_OBJECT.record(succeeded())[0] == key
    topics = Topics(partitions=8)
    assert topics.partition_of(requested()) == partition_for(key, 8)


def test_a_read_only_call_is_keyed_by_its_own_call_id() -> None:
    first, second = requested("", "i-1"), requested("", "i-2")
    env = first.envelope
    assert partition_key(first) == call_id_for(env.call_key, "", "i-1").encode()
    assert partition_key(first) == partition_key(succeeded("", "i-1"))
    assert partition_key(first) != partition_key(second)  # two reads: two calls, two keys
    assert dict(SINGLE_OBJECT.record(first)[2])["ce_subject"] == partition_key(first)


def test_a_switch_has_a_key_of_its_own() -> None:
    switch = ToolDisabled(
        envelope=envelope("", "i-9", "i-9/disabled/1"), scope="tool", actor="op", reason="x"
    )
    assert partition_key(switch).startswith(b"call_")


# ---------------------------------------------------------------------- the Confluent framing


def test_confluent_framing_is_magic_byte_schema_id_and_the_same_body() -> None:
    event = succeeded()
    single = codec.encode(event)
    fingerprint = codec.fingerprint_of("ToolCallSucceeded")
    wire = Confluent("http://registry:8081/", {fingerprint: 0x01020304})
    key, value, headers = wire.record(event)
    assert value == b"\x00\x01\x02\x03\x04" + single[10:]
    assert key == partition_key(event)
    assert dict(headers)["ce_dataschema"] == b"http://registry:8081/schemas/ids/16909060"
    assert dict(headers)["content-type"] == (
        b"application/avro; format=confluent; schema=toolledger.events.ToolCallSucceeded"
    )
    assert wire.to_single_object(value) == single
    assert wire.decode(value) == event
    assert wire.decode(single) == event  # a topic written before the switch stays readable


def test_confluent_framing_refuses_what_it_cannot_frame_or_read() -> None:
    wire = Confluent("http://registry", {codec.fingerprint_of("ToolCallSucceeded"): 7})
    with pytest.raises(codec.CodecError, match="ToolCallRequested is not registered"):
        wire.record(requested())
    with pytest.raises(UnknownSchemaId, match="schema id 8 "):
        wire.decode(b"\x00\x00\x00\x00\x08\x02")
    assert wire.to_single_object(b"\x00\x00\x00\x00\x08") == b"\x00\x00\x00\x00\x08"
    with pytest.raises(ValueError, match="same schema id"):
        Confluent("http://r", {b"a" * 8: 1, b"b" * 8: 1})


# -------------------------------------------------------------------------- the dead letters


def test_a_dead_letter_keeps_the_original_record_and_says_why() -> None:
    original = (("ce_id", b"i-1/requested/1"), ("odd", b"\xff"))
    letter = DeadLetterRecord("p.intents", 3, 17, "undecodable record", b"k", b"v", original)
    headers = letter.kafka_headers()
    assert headers[:2] == list(original)
    assert dict(headers[2:]) == {
        "__connect.errors.topic": b"p.intents",
        "__connect.errors.partition": b"3",
        "__connect.errors.offset": b"17",
        "__connect.errors.exception.message": b"undecodable record",
    }
    assert DeadLetterRecord.from_kafka(b"k", b"v", headers) == letter
    assert letter.headers_json() == [
        {"name": "ce_id", "value": "i-1/requested/1"},
        {"name": "odd", "base64": "/w=="},
    ]


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ([], "without the header"),
        ([("reason", b'{"partition": 2, "offset": 5, "reason": "x"}')], "without the header"),
        ([(ERROR_HEADERS[0], b"t")], "without the header"),
        ([(name, b"x") for name in ERROR_HEADERS], "unreadable error headers"),
    ],
)
def test_an_unreadable_dead_letter_is_named(headers: list[tuple[str, bytes]], message: str) -> None:
    with pytest.raises(UnreadableDeadLetter, match=message):
        DeadLetterRecord.from_kafka(None, b"v", headers)
