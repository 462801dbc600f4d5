"""OpenTelemetry spans for executor stages (processors/tracing.py), via the in-memory exporter."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace import export as sdk_export
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from toolledger.processors import tracing as telemetry
from toolledger.processors.ledger.state import CallContext
from toolledger.schemas.keys import CallKey, call_id_of

PRINCIPAL = "user:alice.principal-7f3a@example.com"
SECRET_ARG = "iban=DE89-SECRET-ARGUMENT-3704"

OTLP_HTTP = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
OTLP_GRPC = "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"


def _ctx(*, run_id: str | None = "run-1") -> CallContext:
    key = str(CallKey("tenant-a", "payments.refund", "idem-42"))
    return CallContext(
        call_key=key,
        tenant_id="tenant-a",
        tool="payments.refund",
        tool_version="2.1.0",
        idempotency_key="idem-42",
        args_digest="sha256:" + "ab" * 32,
        intent_id="intent-9",
        run_id=run_id,
        step_id="step-3",
        principal=PRINCIPAL,
        trace_id="trace-77",
    )


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    telemetry.use_tracer_provider(provider)
    try:
        yield memory
    finally:
        telemetry.use_tracer_provider(None)
        provider.shutdown()


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in spans}


def _all_strings(span: ReadableSpan) -> list[str]:
    """Every name, attribute key/value, event name/attribute and status text of a span."""
    found = [span.name, span.status.description or ""]
    attribute_sets = [span.attributes or {}] + [event.attributes or {} for event in span.events]
    found += [event.name for event in span.events]
    for attributes in attribute_sets:
        for key, value in attributes.items():
            found.append(key)
            found.extend(str(item) for item in (value if isinstance(value, tuple) else (value,)))
    return found


# ------------------------------------------------------------------------------ stages


def test_stage_names_and_nesting(exporter: InMemorySpanExporter) -> None:
    ctx = _ctx()
    provider = telemetry._provider  # the fixture's
    assert provider is not None
    app_tracer = provider.get_tracer("app")
    with (
        app_tracer.start_as_current_span("consume") as root,
        telemetry.stage("admit", ctx) as admit,
    ):
        with telemetry.stage("decide", ctx):
            pass
        with telemetry.stage("execute", ctx) as execute, telemetry.stage("commit", ctx):
            assert trace.get_current_span() is not execute
        assert trace.get_current_span() is admit
    spans = _by_name(exporter.get_finished_spans())
    assert set(spans) == {
        "consume",
        "toolledger.admit",
        "toolledger.decide",
        "toolledger.execute",
        "toolledger.commit",
    }
    root_id = root.get_span_context().span_id
    admit_id = admit.get_span_context().span_id

    def parent_of(name: str) -> int | None:
        parent = spans[name].parent
        return None if parent is None else parent.span_id

    assert parent_of("toolledger.admit") == root_id
    assert parent_of("toolledger.decide") == admit_id
    assert parent_of("toolledger.execute") == admit_id
    assert parent_of("toolledger.commit") == execute.get_span_context().span_id
    trace_ids = {span.context.trace_id for span in spans.values() if span.context is not None}
    assert len(trace_ids) == 1
    assert all(span.status.status_code is StatusCode.UNSET for span in spans.values())


def test_stage_sets_call_attributes(exporter: InMemorySpanExporter) -> None:
    ctx = _ctx()
    with telemetry.stage("execute", ctx):
        pass
    (span,) = exporter.get_finished_spans()
    assert dict(span.attributes or {}) == {
        "toolledger.tenant": "tenant-a",
        "toolledger.tool": "payments.refund",
        "toolledger.tool_version": "2.1.0",
        "toolledger.idempotency_key": "idem-42",
        "toolledger.call_id": call_id_of(ctx.call_key),
        "toolledger.intent_id": "intent-9",
        "toolledger.run_id": "run-1",
    }


def test_set_call_attributes_on_a_span_started_before_the_call_was_known(
    exporter: InMemorySpanExporter,
) -> None:
    ctx = _ctx()
    with telemetry.stage("intent", None, tool="payments.refund") as span:
        telemetry.set_call_attributes(span, ctx)
    (finished,) = exporter.get_finished_spans()
    assert dict(finished.attributes or {}) == telemetry.call_attributes(ctx)


def test_call_attributes_leave_out_absent_run_and_private_fields() -> None:
    ctx = _ctx(run_id=None)
    attributes = telemetry.call_attributes(ctx)
    assert "toolledger.run_id" not in attributes
    assert (
        attributes["toolledger.call_id"]
        == CallKey("tenant-a", "payments.refund", "idem-42").call_id
    )
    for private in (PRINCIPAL, ctx.args_digest, ctx.step_id, ctx.trace_id):
        assert private not in attributes.values()
    assert all(key.startswith("toolledger.") for key in attributes)


def test_stage_without_context_and_extra_attributes(exporter: InMemorySpanExporter) -> None:
    with telemetry.stage(
        "read_only",
        None,
        attempt=2,
        replay=True,
        tool="search",
        note=None,
        **{"http.method": "GET"},
    ):
        pass
    (span,) = exporter.get_finished_spans()
    assert span.name == "toolledger.read_only"
    assert dict(span.attributes or {}) == {
        "toolledger.attempt": 2,
        "toolledger.replay": True,
        "toolledger.tool": "search",
        "http.method": "GET",
    }


def test_no_argument_values_or_principal_in_any_span(exporter: InMemorySpanExporter) -> None:
    ctx = _ctx()
    with telemetry.stage("admit", ctx):
        with telemetry.stage("decide", ctx) as decide:
            telemetry.record_outcome(decide, status="PENDING", attempts=0)
        with pytest.raises(ValueError), telemetry.stage("execute", ctx):
            raise ValueError(f"rejected input: {SECRET_ARG} by {PRINCIPAL}")
        with telemetry.stage("reconcile", ctx) as reconcile:
            telemetry.record_outcome(
                reconcile, status="FAILED_FINAL", attempts=1, error_code="DOWNSTREAM_DECLINED"
            )
    spans = exporter.get_finished_spans()
    assert len(spans) == 4
    everything = [text for span in spans for text in _all_strings(span)]
    assert any("idem-42" in text for text in everything)  # the scan does see attributes
    for text in everything:
        assert PRINCIPAL not in text
        assert SECRET_ARG not in text
        assert "alice" not in text


# ------------------------------------------------------------------------------ errors


def test_exception_is_recorded_with_error_status_and_reraised(
    exporter: InMemorySpanExporter,
) -> None:
    class DownstreamBroke(RuntimeError):
        pass

    with pytest.raises(DownstreamBroke, match=SECRET_ARG), telemetry.stage("execute", _ctx()):
        raise DownstreamBroke(SECRET_ARG)
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description is not None
    assert span.status.description.endswith("DownstreamBroke")
    (event,) = span.events
    assert event.name == "exception"
    attributes = dict(event.attributes or {})
    assert str(attributes["exception.type"]).endswith("DownstreamBroke")
    assert attributes["exception.escaped"] is True
    assert "exception.message" not in attributes
    stacktrace = str(attributes["exception.stacktrace"])
    assert "test_exception_is_recorded_with_error_status_and_reraised" in stacktrace
    assert SECRET_ARG not in stacktrace  # the message is left out, the frames kept


def test_builtin_exception_type_is_unqualified(exporter: InMemorySpanExporter) -> None:
    with pytest.raises(KeyError), telemetry.stage("commit"):
        raise KeyError("k")
    (span,) = exporter.get_finished_spans()
    assert span.status.description == "KeyError"
    assert (span.events[0].attributes or {})["exception.type"] == "KeyError"


# ------------------------------------------------------------------------------ outcome


def test_record_outcome_sets_attributes(exporter: InMemorySpanExporter) -> None:
    with telemetry.stage("execute", _ctx()) as span:
        telemetry.record_outcome(
            span,
            status="SUCCEEDED",
            attempts=3,
            downstream_request_id="req-123",
            error_code="DOWNSTREAM_TIMEOUT",
        )
    (finished,) = exporter.get_finished_spans()
    attributes = finished.attributes or {}
    assert attributes["toolledger.status"] == "SUCCEEDED"
    assert attributes["toolledger.attempts"] == 3
    assert attributes["toolledger.downstream_request_id"] == "req-123"
    assert attributes["toolledger.error_code"] == "DOWNSTREAM_TIMEOUT"


def test_record_outcome_skips_none(exporter: InMemorySpanExporter) -> None:
    with telemetry.stage("execute", _ctx()) as span:
        telemetry.record_outcome(span, status=None, attempts=0)
    (finished,) = exporter.get_finished_spans()
    attributes = finished.attributes or {}
    assert attributes["toolledger.attempts"] == 0
    for absent in ("status", "downstream_request_id", "error_code"):
        assert f"toolledger.{absent}" not in attributes


# ------------------------------------------------------------------------------ no-op


def test_noop_provider_records_nothing_and_builds_no_attributes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def forbidden(ctx: CallContext) -> dict[str, str]:
        raise AssertionError("attributes built for a non-recording span")

    monkeypatch.setattr(telemetry, "call_attributes", forbidden)
    telemetry.use_tracer_provider(trace.NoOpTracerProvider())
    try:
        with telemetry.stage("execute", _ctx(), attempt=1) as span:
            assert not span.is_recording()
            telemetry.set_call_attributes(span, _ctx())
            telemetry.record_outcome(span, status="SUCCEEDED", attempts=1)
        with pytest.raises(ValueError), telemetry.stage("commit", _ctx()):
            raise ValueError("still propagates")
    finally:
        telemetry.use_tracer_provider(None)


def test_use_tracer_provider_none_restores_the_global(exporter: InMemorySpanExporter) -> None:
    telemetry.use_tracer_provider(None)
    with telemetry.stage("admit", _ctx()):
        pass
    assert exporter.get_finished_spans() == ()
    global_tracer = telemetry._tracer()
    assert telemetry._tracer() is global_tracer  # cached


# ------------------------------------------------------------------------------ configure


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> list[trace.TracerProvider]:
    """Capture ``trace.set_tracer_provider`` instead of setting the process-wide provider."""
    captured: list[trace.TracerProvider] = []
    monkeypatch.setattr(trace, "set_tracer_provider", captured.append)
    for name in (
        "OTEL_SERVICE_NAME",
        "OTEL_RESOURCE_ATTRIBUTES",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_SDK_DISABLED",
    ):
        monkeypatch.delenv(name, raising=False)
    return captured


def _emit(provider: TracerProvider) -> None:
    telemetry.use_tracer_provider(provider)
    try:
        with telemetry.stage("admit", _ctx()):
            pass
    finally:
        telemetry.use_tracer_provider(None)


def test_configure_tracing_simple(installed: list[trace.TracerProvider]) -> None:
    memory = InMemorySpanExporter()
    provider = telemetry.configure_tracing(memory, service_name="ledger-test", simple=True)
    try:
        assert installed == [provider]
        assert provider.resource.attributes["service.name"] == "ledger-test"
        _emit(provider)
        assert [span.name for span in memory.get_finished_spans()] == ["toolledger.admit"]
    finally:
        provider.shutdown()


def test_configure_tracing_batches_by_default(
    installed: list[trace.TracerProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []

    class Batch(sdk_export.BatchSpanProcessor):
        def __init__(self, span_exporter: SpanExporter) -> None:
            made.append("batch")
            super().__init__(span_exporter)

    monkeypatch.setattr(sdk_export, "BatchSpanProcessor", Batch)
    memory = InMemorySpanExporter()
    provider = telemetry.configure_tracing(memory)
    try:
        assert made == ["batch"]
        assert provider.resource.attributes["service.name"] == "toolledger"
        _emit(provider)
        assert provider.force_flush()
        assert len(memory.get_finished_spans()) == 1
    finally:
        provider.shutdown()


def test_env_service_name_wins(
    installed: list[trace.TracerProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    provider = telemetry.configure_tracing(InMemorySpanExporter(), simple=True)
    try:
        assert provider.resource.attributes["service.name"] == "from-env"
    finally:
        provider.shutdown()


def _no_processors(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("no span processor expected")

    monkeypatch.setattr(sdk_export, "BatchSpanProcessor", refuse)
    monkeypatch.setattr(sdk_export, "SimpleSpanProcessor", refuse)


def test_configure_tracing_without_exporter_is_silent(
    installed: list[trace.TracerProvider],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _no_processors(monkeypatch)
    provider = telemetry.configure_tracing(None)
    try:
        assert installed == []  # nowhere to export: not installed, stages stay free
        _emit(provider)
    finally:
        provider.shutdown()
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ""


def test_otlp_endpoint_without_exporter_package(
    installed: list[trace.TracerProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setitem(sys.modules, OTLP_HTTP, None)  # an import of it raises ImportError
    monkeypatch.setitem(sys.modules, OTLP_GRPC, None)
    _no_processors(monkeypatch)
    provider = telemetry.configure_tracing(None)
    provider.shutdown()
    assert installed == []


class _FakeOtlp(InMemorySpanExporter):
    instances: list[_FakeOtlp] = []  # noqa: RUF012 - a test double's registry

    def __init__(self) -> None:
        super().__init__()
        _FakeOtlp.instances.append(self)


def _fake_module(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType(name)
    module.OTLPSpanExporter = _FakeOtlp  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, name, module)


def test_otlp_endpoint_with_exporter_package(
    installed: list[trace.TracerProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    _FakeOtlp.instances.clear()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    _fake_module(OTLP_HTTP, monkeypatch)
    monkeypatch.setitem(sys.modules, OTLP_GRPC, None)
    provider = telemetry.configure_tracing(None, simple=True)
    try:
        (otlp,) = _FakeOtlp.instances
        _emit(provider)
        assert [span.name for span in otlp.get_finished_spans()] == ["toolledger.admit"]
    finally:
        provider.shutdown()


def test_otlp_protocol_asked_for_must_be_installed(
    installed: list[trace.TracerProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    _FakeOtlp.instances.clear()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    _fake_module(OTLP_HTTP, monkeypatch)  # only the other protocol's package is installed
    monkeypatch.setitem(sys.modules, OTLP_GRPC, None)
    _no_processors(monkeypatch)
    telemetry.configure_tracing(None).shutdown()
    assert _FakeOtlp.instances == []


def test_otlp_protocol_asked_for_is_used(
    installed: list[trace.TracerProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    _FakeOtlp.instances.clear()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    monkeypatch.setitem(sys.modules, OTLP_HTTP, None)
    _fake_module(OTLP_GRPC, monkeypatch)
    provider = telemetry.configure_tracing(None, simple=True)
    try:
        assert len(_FakeOtlp.instances) == 1
    finally:
        provider.shutdown()


def test_without_a_provider_stages_cost_one_check_and_record_nothing() -> None:
    from opentelemetry import trace as api

    from toolledger.processors import tracing as telemetry

    telemetry.use_tracer_provider(None)
    assert isinstance(api.get_tracer_provider(), api.ProxyTracerProvider)  # tests never set one
    assert telemetry.tracing_enabled() is False
    with telemetry.stage("admit", tenant="acme") as span:
        assert span is api.INVALID_SPAN and not span.is_recording()
