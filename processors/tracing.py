"""Tracing of the executor: OpenTelemetry spans for its stages and runs.

Each stage of a call (admit, decide, execute, reconcile, commit, read_only) runs inside
``stage(...)``, a span named ``toolledger.<stage>`` that carries the call's identifying
attributes (tenant, tool, version, idempotency key, call id, intent and run ids) and, once
known, its outcome (status, attempts, downstream request id, error code). A whole run (an
intent, a decision, a switch, a sweep, an expiry) is one span (:class:`Run`) around its
stages, across the executor's decision passes; it records the outcome of the last event the
run committed.

Spans never carry tool arguments, results or the principal, and a failing stage records only
the exception's type and frames, never its message (a validation error's message quotes the
arguments it rejected).

Only ``opentelemetry-api`` is imported here: without an SDK configured every span is a
non-recording no-op. ``configure_tracing`` (the app's wiring) imports the SDK when called.
"""

from __future__ import annotations

import importlib
import os
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from toolledger.processors.ledger import (
    AttemptOutcome,
    CallContext,
    Failure,
    Found,
    FoundFailed,
    NotHappened,
    ReconcileOutcome,
    Success,
    TimedOut,
)
from toolledger.schemas.errors import ErrorCode
from toolledger.schemas.events import (
    ApprovalRequested,
    Envelope,
    Event,
    FailureDisposition,
    Resolution,
    ToolCallFailed,
    ToolCallOutcomeUnknown,
    ToolCallReconciled,
    ToolCallRejected,
    ToolCallReplayed,
    ToolCallStarted,
    ToolCallSucceeded,
)
from toolledger.schemas.keys import call_id_for

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = [
    "TRACER_NAME",
    "Outcome",
    "Run",
    "attempt_outcome",
    "call_attributes",
    "configure_tracing",
    "envelope_attributes",
    "event_outcome",
    "execute_tool",
    "open_run",
    "reconcile_outcome",
    "record",
    "record_execution",
    "record_outcome",
    "set_call_attributes",
    "stage",
    "tracing_enabled",
    "use_meter_provider",
    "use_tracer_provider",
]

TRACER_NAME = "toolledger"
"""The instrumentation scope name of every span this module starts."""

_PREFIX = "toolledger."
SPANS_FILE_ENV = "TOOLLEDGER_SPANS_FILE"

# The OTLP span exporter module of each OTEL_EXPORTER_OTLP_PROTOCOL value.
_OTLP_MODULES = {
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
}

_provider: trace.TracerProvider | None = None  # None: the global provider
_cached_tracer: Tracer | None = None


def use_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Make ``stage`` use ``provider`` instead of the global one (None restores the global)."""
    global _provider, _cached_tracer
    _provider = provider
    _cached_tracer = None


def _tracer() -> Tracer:
    """The tracer ``stage`` starts spans with: from ``use_tracer_provider``'s, else the global."""
    global _cached_tracer
    if _cached_tracer is None:
        if _provider is None:
            # A proxy until a global SDK provider is set, then it delegates to that one.
            _cached_tracer = trace.get_tracer(TRACER_NAME)
        else:
            _cached_tracer = _provider.get_tracer(TRACER_NAME)
    return _cached_tracer


def call_attributes(ctx: CallContext) -> dict[str, str]:
    """The span attributes identifying a call: never its arguments, never its principal."""
    attributes = {
        "toolledger.tenant": ctx.tenant_id,
        "toolledger.tool": ctx.tool,
        "toolledger.tool_version": ctx.tool_version,
        "toolledger.idempotency_key": ctx.idempotency_key,
        "toolledger.call_id": call_id_for(ctx.call_key, ctx.idempotency_key, ctx.intent_id),
        "toolledger.intent_id": ctx.intent_id,
    }
    if ctx.run_id is not None:
        attributes["toolledger.run_id"] = ctx.run_id
    return attributes


class _Untraced:
    """What ``stage`` returns while no tracer provider is configured: a reusable no-op, so
    the executor's hot path pays one check per stage instead of a no-op span's context
    switches."""

    def __enter__(self) -> Span:
        return trace.INVALID_SPAN

    def __exit__(self, *exc_info: object) -> None:
        return None


_UNTRACED = _Untraced()


_global_set = False  # a global SDK provider was seen (it can never be replaced or removed)
_next_check = 0.0


def tracing_enabled() -> bool:
    """Whether spans go anywhere: a provider given to ``use_tracer_provider``, or a global
    one that is not the API's proxy or no-op default (looked for at most once a second: the
    lookup reads the environment)."""
    global _global_set, _next_check
    if _provider is not None or _global_set:
        return True
    now = time.monotonic()
    if now < _next_check:
        return False
    _next_check = now + 1.0
    _global_set = not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    )
    return _global_set


def stage(
    name: str, ctx: CallContext | None = None, **attributes: str | int | bool | None
) -> AbstractContextManager[Span]:
    """Run the block in a child span ``toolledger.<name>`` carrying the call's attributes.

    Extra attributes are namespaced ``toolledger.<key>`` (unless the key already has a dot);
    None values are skipped. If the block raises, the span records the exception's type and
    frames (not its message), gets an error status, and the exception propagates.
    """
    if not tracing_enabled():
        return _UNTRACED
    return _stage(name, ctx, attributes)


def execute_tool(ctx: CallContext, attempt: int) -> AbstractContextManager[Span]:
    """The span of one execution of a tool's handler, as OpenTelemetry's GenAI semantic
    conventions name it: ``execute_tool <tool>``, ``gen_ai.operation.name`` ``execute_tool``,
    ``gen_ai.tool.name``, ``gen_ai.tool.call.id`` (the ledger's call id) and
    ``gen_ai.tool.type``; the ledger's own attributes under ``toolledger.*``, and
    ``error.type`` (the error code) when it did not succeed (see :func:`record`)."""
    if not tracing_enabled():
        return _UNTRACED
    attributes: dict[str, str | int | bool | None] = {
        GEN_AI_OPERATION: EXECUTE_TOOL,
        "gen_ai.tool.name": ctx.tool,
        "gen_ai.tool.call.id": call_id_for(ctx.call_key, ctx.idempotency_key, ctx.intent_id),
        "gen_ai.tool.type": "function",
        "attempt": attempt,
    }
    return _stage(f"{EXECUTE_TOOL} {ctx.tool}", ctx, attributes, prefix="")


GEN_AI_OPERATION = "gen_ai.operation.name"
EXECUTE_TOOL = "execute_tool"

_meter_provider: metrics.MeterProvider | None = None  # None: the global provider
_duration: metrics.Histogram | None = None


def use_meter_provider(provider: metrics.MeterProvider | None) -> None:
    """Record the executor's metrics with ``provider`` (None restores the global one)."""
    global _meter_provider, _duration
    _meter_provider, _duration = provider, None


def record_execution(ctx: CallContext, seconds: float, error_code: str | None) -> None:
    """The GenAI conventions' ``gen_ai.execute_tool.duration`` histogram (seconds), by tool
    and ``error.type``. A no-op while no meter provider is configured."""
    global _duration
    if _duration is None:
        meter = (_meter_provider or metrics.get_meter_provider()).get_meter(TRACER_NAME)
        _duration = meter.create_histogram(
            "gen_ai.execute_tool.duration", unit="s", description="Duration of tool executions"
        )
    attributes = {GEN_AI_OPERATION: EXECUTE_TOOL, "gen_ai.tool.name": ctx.tool}
    if error_code is not None:
        attributes["error.type"] = error_code
    _duration.record(seconds, attributes)


@contextmanager
def _stage(
    name: str,
    ctx: CallContext | None,
    attributes: dict[str, str | int | bool | None],
    parent: Context | None = None,
    prefix: str = _PREFIX,
) -> Iterator[Span]:
    with _tracer().start_as_current_span(
        prefix + name, context=parent, record_exception=False, set_status_on_exception=False
    ) as span:
        if span.is_recording():
            if ctx is not None:
                set_call_attributes(span, ctx)
            for key, value in attributes.items():
                if value is not None:
                    span.set_attribute(key if "." in key else _PREFIX + key, value)
        try:
            yield span
        except BaseException as exc:
            if span.is_recording():
                _record_exception(span, exc)
            raise


def set_call_attributes(span: Span, ctx: CallContext) -> None:
    """Add a call's attributes to a span (one started before the call's context was known)."""
    if span.is_recording():
        span.set_attributes(call_attributes(ctx))


def _record_exception(span: Span, exc: BaseException) -> None:
    """An ``exception`` event with the type and frames only, and an error status."""
    module, qualname = type(exc).__module__, type(exc).__qualname__
    type_name = qualname if module == "builtins" else f"{module}.{qualname}"
    frames = "".join(traceback.format_tb(exc.__traceback__))
    span.add_event(
        "exception",
        {
            "exception.type": type_name,
            "exception.stacktrace": f"Traceback (most recent call last):\n{frames}{type_name}",
            "exception.escaped": True,
        },
    )
    span.set_status(Status(StatusCode.ERROR, type_name))


def record_outcome(
    span: Span,
    *,
    status: str | None,
    attempts: int | None,
    downstream_request_id: str | None = None,
    error_code: str | None = None,
) -> None:
    """Set a stage span's outcome attributes (``toolledger.status`` etc.); None ones are skipped."""
    if not span.is_recording():
        return
    outcome: dict[str, str | int | None] = {
        "toolledger.status": status,
        "toolledger.attempts": attempts,
        "toolledger.downstream_request_id": downstream_request_id,
        "toolledger.error_code": error_code,
    }
    for key, value in outcome.items():
        if value is not None:
            span.set_attribute(key, value)
    if error_code is not None or status == "UNKNOWN":
        # OpenTelemetry's error.type: the ledger's error code (an unknown outcome: a timeout)
        span.set_attribute("error.type", error_code or "OUTCOME_UNKNOWN")


def configure_tracing(
    exporter: SpanExporter | None,
    *,
    service_name: str = "toolledger",
    simple: bool = False,
) -> SdkTracerProvider:
    """Build an SDK tracer provider exporting to ``exporter``, set it globally and return it
    (not set when there is no exporter: spans would go nowhere, and stages stay free).

    ``simple=True`` exports each span synchronously (tests); otherwise spans are batched.
    Without an exporter, spans are appended as JSON lines to the file named by
    ``TOOLLEDGER_SPANS_FILE`` if set (audits, tests); else OTLP is used when
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or its traces variant) is set and an OTLP exporter
    package is installed; else nothing is installed and nothing is printed.
    ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` take precedence over
    ``service_name``. The global provider
    can be set only once per process: later calls still return a new provider but the
    global one stays the first.
    """
    from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    resource = Resource.create({SERVICE_NAME: service_name}).merge(OTELResourceDetector().detect())
    provider = SdkTracerProvider(resource=resource)
    if exporter is None and os.environ.get(SPANS_FILE_ENV):
        exporter, simple = _file_exporter(Path(os.environ[SPANS_FILE_ENV])), True
    if exporter is None:
        exporter = _otlp_exporter_from_env()
    if exporter is None:
        return provider  # nowhere to send spans: not installed, so stages stay free
    processor = SimpleSpanProcessor(exporter) if simple else BatchSpanProcessor(exporter)
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    global _next_check
    _next_check = 0.0  # seen by tracing_enabled() at once
    return provider


def _file_exporter(path: Path) -> SpanExporter:
    """Finished spans as JSON lines appended to ``path``."""
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    out = path.open("a", encoding="utf-8")  # held for the process's lifetime
    return ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")


def _otlp_exporter_from_env() -> SpanExporter | None:
    """An OTLP span exporter configured by the environment, if asked for and installed."""
    from opentelemetry.sdk.trace.export import SpanExporter

    if not (
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        return None
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or ""
    ).strip()
    if protocol:  # asked for: that one only (the other speaks to another port)
        candidates = [_OTLP_MODULES[protocol]] if protocol in _OTLP_MODULES else []
    else:  # the spec's default first, then whichever is installed
        candidates = [_OTLP_MODULES["http/protobuf"], _OTLP_MODULES["grpc"]]
    for module_name in candidates:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        exporter_class: object = getattr(module, "OTLPSpanExporter", None)
        if isinstance(exporter_class, type) and issubclass(exporter_class, SpanExporter):
            # The exporter reads its endpoint, headers and timeout from the environment.
            return exporter_class()
    return None


# -- runs: a span around a whole run of the stages, with the outcome it committed --------------


class Outcome(NamedTuple):
    """What a stage's span records once the stage is over."""

    status: str
    attempts: int | None = None
    downstream_request_id: str | None = None
    error_code: str | None = None


def record(span: Span, outcome: Outcome | None) -> None:
    if outcome is not None:
        record_outcome(
            span,
            status=outcome.status,
            attempts=outcome.attempts,
            downstream_request_id=outcome.downstream_request_id,
            error_code=outcome.error_code,
        )


class Run:
    """A traced run (an intent, an operator's decision, a switch, a sweep, an expiry) across
    the decision passes it takes: a span ``toolledger.<name>`` whose children are its stages
    (``admit``, ``decide``, ``commit`` for each decision's events, ``execute``...), ended
    once its last events are written, with the outcome of the last of them.

    Only made while tracing is on (:func:`open_run` returns None otherwise): the executor pays
    one check per run when it is off."""

    __slots__ = ("_context", "outcome", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self._context = trace.set_span_in_context(span)
        self.outcome: Outcome | None = None

    def stage(
        self, name: str, ctx: CallContext | None = None, **attributes: str | int | bool | None
    ) -> AbstractContextManager[Span]:
        """A child stage span, current inside the block (for what it calls)."""
        return _stage(name, ctx, attributes, self._context)

    def commit(self, events: Sequence[Event]) -> Span:
        """A ``commit`` span for one decision's events, started now; :meth:`written` ends it
        once the batch holding them is durable."""
        span = _tracer().start_span(_PREFIX + "commit", context=self._context)
        if span.is_recording():
            span.set_attribute("toolledger.events", len(events))
            span.set_attribute("toolledger.event_types", ",".join(e.TYPE for e in events))
        for event in events:
            self.outcome = event_outcome(event) or self.outcome
        return span

    @contextmanager
    def current(self) -> Iterator[None]:
        """The run's span as the current one (a task started inside inherits it)."""
        with trace.use_span(self.span, end_on_exit=False):
            yield

    def set_call(self, ctx: CallContext) -> None:
        set_call_attributes(self.span, ctx)

    def end(self) -> None:
        record(self.span, self.outcome)
        self.span.end()


def open_run(name: str, env: Envelope | None, **extra: str | int | None) -> Run | None:
    """A :class:`Run` named ``toolledger.<name>`` for the record with envelope ``env`` (None:
    a sweep or an expiry), or None while tracing is off."""
    if not tracing_enabled():
        return None
    attributes = (envelope_attributes(env) if env is not None else {}) | extra
    span = _tracer().start_span(_PREFIX + name, context=trace.set_span_in_context(INVALID))
    if span.is_recording():
        for key, value in attributes.items():
            if value is not None:
                span.set_attribute(key if "." in key else _PREFIX + key, value)
    return Run(span)


INVALID = trace.INVALID_SPAN


def envelope_attributes(env: Envelope) -> dict[str, str | int | None]:
    """Who asked for what, before the call is admitted (no arguments, no principal)."""
    return {
        "tenant": env.tenant_id,
        "tool": env.tool,
        "idempotency_key": env.idempotency_key or None,
        "intent_id": env.intent_id,
    }


def attempt_outcome(outcome: AttemptOutcome) -> Outcome:
    if isinstance(outcome, Success):
        return Outcome("SUCCEEDED", downstream_request_id=outcome.downstream_request_id)
    if isinstance(outcome, Failure):
        return Outcome("FAILED", error_code=outcome.error.code)
    if isinstance(outcome, TimedOut):
        return Outcome("UNKNOWN")
    return Outcome("JOB_STARTED")


def reconcile_outcome(found: ReconcileOutcome) -> Outcome:
    if isinstance(found, Found):
        return Outcome("SUCCEEDED", downstream_request_id=found.downstream_request_id)
    if isinstance(found, FoundFailed):
        return Outcome("FAILED_FINAL", error_code=found.error.code)
    if isinstance(found, NotHappened):
        return Outcome("NOT_HAPPENED")
    return Outcome("INCONCLUSIVE")


# The call's status after a reconcile, as its caller sees it.
_RECONCILED = {
    Resolution.SUCCEEDED: "SUCCEEDED",
    Resolution.FAILED_FINAL: "FAILED_FINAL",
    Resolution.NOT_HAPPENED: "FAILED_RETRYABLE",
    Resolution.INCONCLUSIVE: "UNKNOWN",
}


def event_outcome(event: Event) -> Outcome | None:
    """The status (and attempts, request id, error code) a committed event leaves its run in."""
    if isinstance(event, ToolCallStarted):
        return Outcome("PENDING", event.attempt)
    if isinstance(event, ToolCallSucceeded):
        return Outcome("SUCCEEDED", event.attempt, event.downstream_request_id)
    if isinstance(event, ToolCallFailed):
        final = event.disposition is FailureDisposition.FINAL
        status = "FAILED_FINAL" if final else "FAILED_RETRYABLE"
        return Outcome(status, event.attempt, error_code=event.error.code)
    if isinstance(event, ToolCallOutcomeUnknown):
        return Outcome("UNKNOWN", event.attempt, error_code=ErrorCode.OUTCOME_UNKNOWN.value)
    if isinstance(event, ToolCallReconciled):
        code = event.error.code if event.error else None
        return Outcome(_RECONCILED[event.resolution], None, event.downstream_request_id, code)
    if isinstance(event, ToolCallReplayed):
        code = event.error.code if event.error else None
        return Outcome(event.status.value, event.attempts, error_code=code)
    if isinstance(event, ToolCallRejected):
        return Outcome("REJECTED", error_code=event.error.code)
    if isinstance(event, ApprovalRequested):
        return Outcome("APPROVAL_REQUIRED", error_code=ErrorCode.APPROVAL_REQUIRED.value)
    return None  # approval bookkeeping, decisions and switches: see the commit span
