"""The Avro wire format of the events: schemas.codec and schemas/avro
(docs/architecture.md#events-and-the-wire-format)."""

from __future__ import annotations

import contextlib
import json
import types
import typing
from datetime import UTC, datetime, timedelta, timezone
from enum import StrEnum
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from fastavro import schemaless_reader
from fastavro.schema import fingerprint, load_schema_ordered, to_parsing_canonical_form
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from toolledger.schemas import codec
from toolledger.schemas.codec import (
    BadMarker,
    CodecError,
    InvalidEvent,
    TruncatedOrCorrupt,
    UnknownFingerprint,
)
from toolledger.schemas.errors import ErrorCode, ErrorInfo, FieldError
from toolledger.schemas.events import (
    EVENT_TYPES,
    ApprovalConsumed,
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Envelope,
    Event,
    FailureDisposition,
    JobInfo,
    JobStatus,
    Resolution,
    ToolCallFailed,
    ToolCallJobCancelRequested,
    ToolCallJobProgressed,
    ToolCallJobReplayed,
    ToolCallJobReported,
    ToolCallJobStarted,
    ToolCallKeyExpired,
    ToolCallOutcomeUnknown,
    ToolCallReconciled,
    ToolCallRejected,
    ToolCallReplayed,
    ToolCallRequested,
    ToolCallStarted,
    ToolCallSucceeded,
    ToolDisabled,
    ToolEnabled,
)
from toolledger.schemas.status import CallStatus

AVRO_ROOT = Path(codec.__file__).resolve().parent / "avro"
NAMESPACE = "toolledger.events"
SHARED = (  # dependencies first
    "FieldError",
    "ErrorInfo",
    "Envelope",
    "CallStatus",
    "FailureDisposition",
    "JobStatus",
    "Resolution",
    "JobInfo",
)

# ------------------------------------------------------------------------------------ samples

T0 = datetime(2024, 5, 1, 12, 30, 45, 123456, tzinfo=UTC)


def envelope(n: int = 0, *, full: bool = True, **changes: Any) -> Envelope:
    values: dict[str, Any] = {
        "event_id": f"evt_01HX{n:04d}",
        "call_key": "tenant-a/send_email/run-42:step-7",
        "tenant_id": "tenant-a",
        "tool": "send_email",
        "tool_version": "2.1.0",
        "idempotency_key": "run-42:step-7",
        "args_digest": "sha256:" + "ab" * 32,
        "intent_id": "int_01HX0000",
        "occurred_at": T0 + timedelta(microseconds=n),
    }
    if full:
        values |= {
            "run_id": "run-42",
            "step_id": "step-7",
            "principal": "agent:planner@tenant-a",
            "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        }
    return Envelope(**(values | changes))


ERROR = ErrorInfo.of(ErrorCode.VALIDATION_FAILED, "2 arguments are invalid: «to», «subject»")
DOWNSTREAM_ERROR = ErrorInfo.downstream(
    "SMTP_550",
    "Mailbox unavailable — Postfach nicht verfügbar",
    retryable=False,
    suggested_action="Check the recipient address.",
)
RESULT = json.dumps({"message_id": "<abc@mail>", "accepted": ["ø@example.dk"]}, ensure_ascii=False)

JOB = JobInfo(id="job_1", progress=None, started_at=T0, updated_at=T0)

SAMPLES: list[Event] = [
    ToolCallRequested(
        envelope=envelope(0),
        arguments_json='{"body":"Grüße, 世界 🌍","subject":"Hi","to":["a@example.com"]}',
        scopes=["email:send", "contacts:read"],
        approval_token="apt_0123456789",
    ),
    ToolCallRequested(envelope=envelope(1, full=False), arguments_json="{}"),
    ToolCallStarted(
        envelope=envelope(2),
        attempt=1,
        round=0,
        executor_epoch=17,
        arguments_redacted_json='{"password":"[REDACTED]","user":"zoë"}',
    ),
    ToolCallSucceeded(
        envelope=envelope(3),
        attempt=2,
        result_json=RESULT,
        downstream_request_id="req_9f8e7d",
        duration_ms=1234,
    ),
    ToolCallSucceeded(
        envelope=envelope(4, full=False), attempt=1, result_json="null", duration_ms=0
    ),
    ToolCallFailed(
        envelope=envelope(5),
        attempt=3,
        error=DOWNSTREAM_ERROR,
        disposition=FailureDisposition.FINAL,
        fingerprint="sha256:" + "cd" * 32,
        duration_ms=9_876_543_210,
    ),
    ToolCallFailed(
        envelope=envelope(6, full=False),
        attempt=1,
        error=ErrorInfo.of(ErrorCode.RATE_LIMITED, "429 from downstream"),
        disposition=FailureDisposition.RETRY,
        fingerprint="",
        duration_ms=12,
    ),
    ToolCallOutcomeUnknown(
        envelope=envelope(7), attempt=1, reason="timeout after the request was sent (30 s)"
    ),
    ToolCallKeyExpired(
        envelope=envelope(7),
        status=CallStatus.SUCCEEDED,
        last_event_at=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        retention_s=86_400,
    ),
    ToolCallKeyExpired(  # a key that only had approval requests (schema v2)
        envelope=envelope(27),
        status=None,
        last_event_at=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        retention_s=60,
    ),
    ToolCallReconciled(
        envelope=envelope(8),
        resolution=Resolution.SUCCEEDED,
        reconcile_attempt=1,
        result_json=RESULT,
        downstream_request_id="req_9f8e7d",
    ),
    ToolCallReconciled(
        envelope=envelope(9),
        resolution=Resolution.FAILED_FINAL,
        reconcile_attempt=2,
        error=DOWNSTREAM_ERROR,
    ),
    ToolCallReconciled(
        envelope=envelope(10, full=False), resolution=Resolution.INCONCLUSIVE, reconcile_attempt=5
    ),
    ToolCallReplayed(
        envelope=envelope(11),
        status=CallStatus.SUCCEEDED,
        attempts=2,
        original_intent_id="int_01HW9999",
        result_json=RESULT,
    ),
    ToolCallReplayed(
        envelope=envelope(12),
        status=CallStatus.FAILED_FINAL,
        attempts=3,
        original_intent_id="int_01HW9998",
        error=DOWNSTREAM_ERROR,
    ),
    ToolCallRejected(
        envelope=envelope(13),
        error=ERROR,
        field_errors=[
            FieldError(loc="to[0]", msg="value is not a valid email address", type="value_error"),
            FieldError(loc="subject", msg="Feld ist erforderlich — 必須", type="missing"),
        ],
    ),
    ToolCallRejected(
        envelope=envelope(14, full=False),
        error=ErrorInfo.of(ErrorCode.IDEMPOTENCY_KEY_MISSING, "no Idempotency-Key header"),
    ),
    ApprovalRequested(
        envelope=envelope(15),
        approval_id="apr_001",
        arguments_redacted_json='{"amount_eur":1250.5,"iban":"hmac:0a1b"}',
        impact_json='{"amount_eur":1250.5,"recipient":"Société Générale"}',
        expires_at=T0 + timedelta(hours=24, microseconds=1),
    ),
    ApprovalGranted(
        envelope=envelope(16),
        approval_id="apr_001",
        approver="alice@example.com",
        token_digest="sha256:" + "ef" * 32,
        expires_at=datetime(2024, 5, 2, 12, 30, 45, 999999, tzinfo=UTC),
    ),
    ApprovalDenied(
        envelope=envelope(17), approval_id="apr_002", approver="bob", reason="Zu teuer. 高すぎる"
    ),
    ApprovalConsumed(envelope=envelope(18), approval_id="apr_001"),
    ToolDisabled(
        envelope=envelope(19), scope="tenant:tenant-a", actor="ops:carol", reason="incident #42"
    ),
    ToolEnabled(envelope=envelope(20), scope="*", actor="ops:carol", reason="resolved ✅"),
    ToolCallJobStarted(envelope=envelope(21), attempt=1, job=JOB, duration_ms=3),
    ToolCallJobProgressed(
        envelope=envelope(22), job=JOB.model_copy(update={"progress": 0.4}), source="poll"
    ),
    ToolCallJobReplayed(
        envelope=envelope(23),
        status=CallStatus.PENDING,
        attempts=1,
        original_intent_id="intent-21",
        job=JOB,
    ),
    ToolCallJobReported(
        envelope=envelope(24),
        status=JobStatus.FAILED,
        error=ErrorInfo(
            code="DOWNSTREAM_X", message="no", retryable=False, suggested_action="stop"
        ),
    ),
    ToolCallJobReported(
        envelope=envelope(25), status=JobStatus.SUCCEEDED, result_json='{"rows":3}'
    ),
    ToolCallJobCancelRequested(envelope=envelope(26)),
]


def sample_id(event: Event) -> str:
    return f"{event.TYPE}-{event.envelope.event_id}"


def test_every_event_type_has_a_sample() -> None:
    assert {type(e) for e in SAMPLES} == set(EVENT_TYPES)


# --------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("event", SAMPLES, ids=sample_id)
def test_round_trip(event: Event) -> None:
    data = codec.encode(event)
    decoded = codec.decode(data)
    assert type(decoded) is type(event)
    assert decoded == event
    assert codec.encode(decoded) == data  # deterministic: re-encoding gives the same bytes


@pytest.mark.parametrize("event", SAMPLES, ids=sample_id)
def test_header_is_marker_and_fingerprint_of_canonical_form(event: Event) -> None:
    data = codec.encode(event)
    schema = codec.SCHEMAS[event.TYPE]
    expected = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == expected == codec.fingerprint_of(event.TYPE)


def _newest_file(name: str) -> Path:
    """The newest committed ``<name>.avsc``: a version directory is an overlay on the older."""
    versions = sorted(
        (int(d.name[1:]), d) for d in AVRO_ROOT.glob("v*") if d.is_dir() and d.name[1:].isdigit()
    )
    return next(d / f"{name}.avsc" for _, d in reversed(versions) if (d / f"{name}.avsc").exists())


def _standalone(event_type: str) -> Any:
    """The schema as fastavro assembles it from the files, independently of the codec."""
    return load_schema_ordered([str(_newest_file(name)) for name in (*SHARED, event_type)])


@pytest.mark.parametrize("event", SAMPLES, ids=sample_id)
def test_bytes_are_plain_avro_for_other_readers(event: Event) -> None:
    """A consumer that only has the .avsc files computes the same fingerprint and body."""
    schema = _standalone(event.TYPE)
    canonical = to_parsing_canonical_form(schema)
    assert canonical == to_parsing_canonical_form(codec.SCHEMAS[event.TYPE])
    data = codec.encode(event)
    assert data[2:10].hex() == fingerprint(canonical, "CRC-64-AVRO")
    body = BytesIO(data[10:])
    assert schemaless_reader(body, schema, None) == event.model_dump()
    assert body.tell() == len(data) - 10


def test_fingerprint_byte_order_matches_the_avro_spec_vectors() -> None:
    """The header uses fastavro's hex as little-endian bytes; pin that against the spec."""
    # share/test/data/schema-tests.txt in apache/avro: "null" -> 7195948357588979594
    raw = bytes.fromhex(fingerprint('"null"', "CRC-64-AVRO"))
    assert int.from_bytes(raw, "little", signed=True) == 7195948357588979594
    raw = bytes.fromhex(fingerprint('"string"', "CRC-64-AVRO"))
    assert int.from_bytes(raw, "little", signed=True) == -8142146995180207161


def test_non_utc_datetimes_keep_their_instant() -> None:
    cest = timezone(timedelta(hours=2))
    local = T0.astimezone(cest)
    event = ApprovalConsumed(envelope=envelope(occurred_at=local), approval_id="a")
    decoded = codec.decode(codec.encode(event))
    assert decoded == event
    assert decoded.envelope.occurred_at.utcoffset() == timedelta(0)
    assert decoded.envelope.occurred_at == T0


def test_decode_accepts_bytearray_and_memoryview() -> None:
    data = codec.encode(SAMPLES[0])
    assert codec.decode(bytearray(data)) == SAMPLES[0]
    assert codec.decode(memoryview(data)) == SAMPLES[0]


# ----------------------------------------------------------------------------------- property

_TEXT = st.text(max_size=200)
_LONG = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_OPT_TEXT = st.none() | _TEXT
_OFFSETS = st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
)
_DATETIMES = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=_OFFSETS
)
_ENVELOPES = st.builds(
    Envelope,
    event_id=_TEXT,
    call_key=_TEXT,
    tenant_id=_TEXT,
    tool=_TEXT,
    tool_version=_TEXT,
    idempotency_key=_TEXT,
    args_digest=_TEXT,
    intent_id=_TEXT,
    run_id=_OPT_TEXT,
    step_id=_OPT_TEXT,
    principal=_OPT_TEXT,
    occurred_at=_DATETIMES,
    schema_version=_LONG,
    trace_id=_OPT_TEXT,
)
_ERRORS = st.builds(
    ErrorInfo, code=_TEXT, message=_TEXT, retryable=st.booleans(), suggested_action=_TEXT
)
_FIELD_ERRORS = st.builds(FieldError, loc=_TEXT, msg=_TEXT, type=_TEXT)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.builds(
        ToolCallSucceeded,
        envelope=_ENVELOPES,
        attempt=_LONG,
        result_json=_TEXT,
        downstream_request_id=_OPT_TEXT,
        duration_ms=_LONG,
    )
)
def test_property_round_trip_succeeded(event: ToolCallSucceeded) -> None:
    assert codec.decode(codec.encode(event)) == event


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.builds(
        ToolCallRejected,
        envelope=_ENVELOPES,
        error=_ERRORS,
        field_errors=st.lists(_FIELD_ERRORS, max_size=5),
    )
)
def test_property_round_trip_rejected(event: ToolCallRejected) -> None:
    assert codec.decode(codec.encode(event)) == event


@settings(max_examples=500)
@given(event=st.sampled_from(SAMPLES), data=st.data())
def test_property_damaged_bytes_raise_only_codec_errors(event: Event, data: st.DataObject) -> None:
    """Any corruption of a valid encoding decodes to some event or raises a CodecError."""
    raw = bytearray(codec.encode(event))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw) + 3))
    damaged = bytes(raw[:cut]) + bytes(max(0, cut - len(raw)))
    try:
        decoded = codec.decode(damaged)
    except CodecError:
        return
    assert isinstance(decoded, Event)


@given(st.binary(max_size=64))
def test_property_arbitrary_bytes_after_a_known_header(body: bytes) -> None:
    with contextlib.suppress(CodecError):
        codec.decode(b"\xc3\x01" + codec.fingerprint_of("ToolCallRejected") + body)


# ---------------------------------------------------------------------------------- bad input


def test_wrong_marker() -> None:
    data = codec.encode(SAMPLES[0])
    for bad in (b"\xc3\x02" + data[2:], b"\x00" + data[1:], b'{"type": "x"}', b"", b"\xc3"):
        with pytest.raises(BadMarker) as info:
            codec.decode(bad)
        assert info.value.marker == bad[:2]
        assert "marker" in str(info.value)


def test_unknown_fingerprint() -> None:
    data = codec.encode(SAMPLES[0])
    bad = data[:2] + bytes(8) + data[10:]
    with pytest.raises(UnknownFingerprint) as info:
        codec.decode(bad)
    assert info.value.fingerprint == "00" * 8
    assert "00" * 8 in str(info.value)


def test_truncated_header() -> None:
    data = codec.encode(SAMPLES[0])
    for cut in range(2, 10):
        with pytest.raises(TruncatedOrCorrupt, match="header"):
            codec.decode(data[:cut])


@pytest.mark.parametrize("event", SAMPLES, ids=sample_id)
def test_every_truncation_of_the_body(event: Event) -> None:
    data = codec.encode(event)
    for cut in range(10, len(data)):
        with pytest.raises(TruncatedOrCorrupt) as info:
            codec.decode(data[:cut])
        assert info.value.event_type == event.TYPE
        assert isinstance(info.value.__cause__, Exception)  # the raw error is chained, not raised


@pytest.mark.parametrize("garbage", [b"\x00", b"\xff\xfe", b"trailing garbage"])
def test_trailing_bytes(garbage: bytes) -> None:
    data = codec.encode(SAMPLES[3])
    with pytest.raises(TruncatedOrCorrupt, match=f"{len(garbage)} trailing bytes"):
        codec.decode(data + garbage)


def test_corrupt_body_is_translated() -> None:
    data = bytearray(codec.encode(SAMPLES[8]))  # ToolCallKeyExpired: has an enum
    assert isinstance(SAMPLES[8], ToolCallKeyExpired)
    data[-1] = 0xFF  # retention_s: the varint now wants another byte
    with pytest.raises(TruncatedOrCorrupt):
        codec.decode(bytes(data))
    # an invalid UTF-8 string: event_id is the first field, after its length byte
    data = bytearray(codec.encode(SAMPLES[5]))
    data[11] = 0xFF
    with pytest.raises(TruncatedOrCorrupt, match="UnicodeDecodeError"):
        codec.decode(bytes(data))


def test_decode_wants_bytes() -> None:
    with pytest.raises(TypeError):
        codec.decode("c301")  # type: ignore[arg-type]


def test_naive_datetime_in_envelope_is_rejected() -> None:
    event = ApprovalConsumed(envelope=envelope(occurred_at=datetime(2024, 5, 1)), approval_id="a")
    with pytest.raises(InvalidEvent, match=r"envelope\.occurred_at is a naive datetime"):
        codec.encode(event)


def test_naive_datetime_in_payload_is_rejected() -> None:
    event = ApprovalRequested(
        envelope=envelope(),
        approval_id="a",
        arguments_redacted_json="{}",
        impact_json="{}",
        expires_at=datetime(2024, 5, 2),
    )
    with pytest.raises(InvalidEvent, match="expires_at is a naive datetime") as info:
        codec.encode(event)
    assert info.value.event_type == "ApprovalRequested"
    with pytest.raises(InvalidEvent):
        codec.event_to_json(event)


def test_datetime_outside_the_utc_range_is_rejected() -> None:
    early = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1)))
    event = ApprovalConsumed(envelope=envelope(occurred_at=early), approval_id="a")
    with pytest.raises(InvalidEvent, match="out of range"):
        codec.encode(event)


def test_values_avro_cannot_carry_are_rejected() -> None:
    too_big = ToolCallOutcomeUnknown(envelope=envelope(), attempt=2**63, reason="r")
    with pytest.raises(InvalidEvent, match="OverflowError"):
        codec.encode(too_big)
    surrogate = ToolCallOutcomeUnknown(envelope=envelope(), attempt=1, reason="\ud800")
    with pytest.raises(InvalidEvent, match="UnicodeEncodeError"):
        codec.encode(surrogate)


def test_event_without_schema() -> None:
    with pytest.raises(CodecError, match="no Avro schema"):
        codec.encode(Event(envelope=envelope()))
    with pytest.raises(CodecError, match="no Avro schema"):
        codec.fingerprint_of("NoSuchEvent")


def test_errors_are_value_errors() -> None:
    for cls in (BadMarker, UnknownFingerprint, TruncatedOrCorrupt, InvalidEvent):
        assert issubclass(cls, CodecError)
    assert issubclass(CodecError, ValueError)


# ---------------------------------------------------------------------------------- JSON view


def test_event_to_json() -> None:
    event = SAMPLES[5]  # ToolCallFailed
    assert isinstance(event, ToolCallFailed)
    out = codec.event_to_json(event)
    assert list(out)[:2] == ["type", "envelope"]
    assert out["type"] == "ToolCallFailed"
    assert out["envelope"]["occurred_at"] == "2024-05-01T12:30:45.123461Z"
    assert out["disposition"] == "FINAL" and type(out["disposition"]) is str
    assert out["error"] == event.error.model_dump()
    assert json.loads(json.dumps(out, ensure_ascii=False)) == out


def test_event_to_json_converts_to_utc() -> None:
    local = datetime(2024, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    out = codec.event_to_json(
        ApprovalConsumed(envelope=envelope(occurred_at=local), approval_id="a")
    )
    assert out["envelope"]["occurred_at"] == "2024-05-01T12:00:00.000000Z"


def test_event_to_json_round_trips_through_the_model() -> None:
    for event in SAMPLES:
        body = codec.event_to_json(event)
        assert body.pop("type") == event.TYPE
        assert type(event).model_validate(body) == event


# ------------------------------------------------------------- schemas mirror the pydantic models


def _current_file(name: str) -> Path:
    """The newest committed definition of ``name`` (version directories overlay older ones)."""
    found = sorted(
        (int(d.name[1:]), d / f"{name}.avsc")
        for d in AVRO_ROOT.glob("v*")
        if d.name[1:].isdigit() and (d / f"{name}.avsc").is_file()
    )
    assert found, f"no schemas/avro/v*/{name}.avsc"
    return found[-1][1]


def _expected_avro_type(annotation: Any) -> Any:
    """The Avro type the project's mapping gives a pydantic field annotation."""
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        assert len(args) == 1, f"only X | None unions are mapped: {annotation}"
        return ["null", _expected_avro_type(args[0])]
    if origin is list:
        (item,) = typing.get_args(annotation)
        return {"type": "array", "items": _expected_avro_type(item)}
    if annotation is str:
        return "string"
    if annotation is bool:
        return "boolean"
    if annotation is int:
        return "long"
    if annotation is float:
        return "double"
    if annotation is datetime:
        return {"type": "long", "logicalType": "timestamp-micros"}
    if isinstance(annotation, type) and issubclass(annotation, StrEnum | BaseModel):
        # each named type is declared once, in its own file, and referred to by full name
        return f"{NAMESPACE}.{annotation.__name__}"
    raise AssertionError(f"no Avro mapping for {annotation!r}")


def _without_docs(avro_type: Any) -> Any:
    if isinstance(avro_type, dict):
        return {k: _without_docs(v) for k, v in avro_type.items() if k not in ("doc", "default")}
    if isinstance(avro_type, list):
        return [_without_docs(t) for t in avro_type]
    return avro_type


MODELS: list[type[BaseModel]] = [*EVENT_TYPES, Envelope, ErrorInfo, FieldError]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_avsc_mirrors_the_model(model: type[BaseModel]) -> None:
    raw = json.loads(_current_file(model.__name__).read_text(encoding="utf-8"))
    assert raw["type"] == "record"
    assert raw["name"] == model.__name__
    assert raw["namespace"] == NAMESPACE
    assert isinstance(raw.get("doc"), str) and raw["doc"].strip() and "\n" not in raw["doc"]

    avro_fields = raw["fields"]
    assert [f["name"] for f in avro_fields] == list(model.model_fields)

    hints = typing.get_type_hints(model)
    for field in avro_fields:
        info = model.model_fields[field["name"]]
        assert _without_docs(field["type"]) == _expected_avro_type(hints[field["name"]]), field
        if info.is_required():
            assert "default" not in field, field["name"]
        else:
            assert "default" in field, f"{field['name']} has a default in the model"
            assert field["default"] == info.get_default(call_default_factory=True), field


ENUMS: list[type[StrEnum]] = [CallStatus, FailureDisposition, JobStatus, Resolution]


@pytest.mark.parametrize("enum", ENUMS, ids=lambda e: e.__name__)
def test_enum_avsc_mirrors_the_enum(enum: type[StrEnum]) -> None:
    raw = json.loads(_current_file(enum.__name__).read_text(encoding="utf-8"))
    assert raw["type"] == "enum"
    assert raw["name"] == enum.__name__
    assert raw["namespace"] == NAMESPACE
    assert isinstance(raw.get("doc"), str) and raw["doc"].strip()
    assert raw["symbols"] == [member.value for member in enum]


def test_each_named_type_is_declared_in_one_file() -> None:
    declared: dict[str, list[str]] = {}

    def walk(node: Any, path: Path) -> None:
        if isinstance(node, dict):
            if node.get("type") in ("record", "enum", "fixed", "error"):
                declared.setdefault(node["name"], []).append(str(path))
            for value in node.values():
                walk(value, path)
        elif isinstance(node, list):
            for value in node:
                walk(value, path)

    for directory in sorted(AVRO_ROOT.glob("v*")):
        for path in sorted(directory.glob("*.avsc")):
            walk(json.loads(path.read_text(encoding="utf-8")), path.relative_to(AVRO_ROOT))
    for name, files in declared.items():
        assert [Path(f).name for f in files] == [f"{name}.avsc"] * len(files), (name, files)


def test_events_start_with_the_envelope() -> None:
    for model in EVENT_TYPES:
        raw = json.loads(_current_file(model.TYPE).read_text(encoding="utf-8"))
        assert raw["fields"][0] == {"name": "envelope", "type": f"{NAMESPACE}.Envelope"}
        assert model.__name__ == model.TYPE


def test_codec_knows_every_event_type() -> None:
    assert set(codec.SCHEMAS) == {model.TYPE for model in EVENT_TYPES}
    for model in EVENT_TYPES:
        assert len(codec.fingerprint_of(model.TYPE)) == 8
    assert len({codec.fingerprint_of(m.TYPE) for m in EVENT_TYPES}) == len(EVENT_TYPES)
