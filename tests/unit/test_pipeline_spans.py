"""The executor's stage spans, from real calls through the embedded ledger (in-memory exporter)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util.types import AttributeValue

from tests.contract.harness import contract_registry
from toolledger.embedded import EmbeddedLedger
from toolledger.processors import tracing as telemetry
from toolledger.processors.toolsets.helpdesk import HelpdeskStore
from toolledger.producers import governance
from toolledger.producers.client import CallResult, TrustedContext
from toolledger.schemas.events import ApprovalGranted, ApprovalRequested
from toolledger.schemas.status import CallStatus
from toolledger.settings import LedgerSettings

PRINCIPAL = "alice.principal-SECRET-51c7@acme.example"
AGENT = TrustedContext("acme", PRINCIPAL)


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


class Ledger:
    def __init__(self, embedded: EmbeddedLedger, store: HelpdeskStore) -> None:
        self.embedded = embedded
        self.store = store

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        key: str | None,
        token: str | None = None,
    ) -> CallResult:
        result = await self.embedded.client.call(
            tool, arguments, idempotency_key=key, context=AGENT, approval_token=token
        )
        await self.drain()  # every run (and so its span) is over
        return result

    async def approve(self, request: ApprovalRequested) -> str:
        target = governance.ApprovalTarget.of_request(request)
        record, token = governance.approve(
            target, "op@acme", datetime.now(UTC), timedelta(minutes=5)
        )
        assert isinstance(await self.embedded.client.command(record), ApprovalGranted)
        await self.drain()
        return token

    async def drain(self) -> None:
        assert self.embedded.runtime is not None
        await self.embedded.runtime.drain()


@pytest.fixture
def sweep_interval_s() -> float:
    return 3600.0  # no background sweep unless a test asks for one


@pytest.fixture
async def ledger(
    tmp_path: Path, exporter: InMemorySpanExporter, sweep_interval_s: float
) -> AsyncIterator[Ledger]:
    """An embedded ledger, traced into ``exporter`` from its start."""
    store = HelpdeskStore(tmp_path / "downstream.db")
    embedded = EmbeddedLedger(
        LedgerSettings(path=tmp_path / "ledger.db", sweep_interval_s=sweep_interval_s, create=True),
        contract_registry(store),
    )
    await embedded.start()
    try:
        yield Ledger(embedded, store)
    finally:
        await embedded.close()
        store.close()


# ------------------------------------------------------------------------------ helpers


def _attrs(span: ReadableSpan) -> dict[str, AttributeValue]:
    return dict(span.attributes or {})


def _intents(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == "toolledger.intent"]


def _children(exporter: InMemorySpanExporter, parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [
        s
        for s in exporter.get_finished_spans()
        if s.parent is not None and s.parent.span_id == parent.context.span_id
    ]


def _stage(span: ReadableSpan) -> str:
    """A span's stage: ``toolledger.<stage>``, or ``execute`` for the GenAI conventions'
    ``execute_tool <tool>`` span of a handler's execution."""
    if span.name.startswith("execute_tool "):
        return "execute"
    return span.name.removeprefix("toolledger.")


def _names(spans: list[ReadableSpan]) -> list[str]:
    return sorted(_stage(s) for s in spans)


def _only(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    (span,) = [s for s in spans if _stage(s) == name]
    return span


def _commit_types(spans: list[ReadableSpan]) -> list[str]:
    """The event types of each commit span, in the order they started."""
    commits = sorted(
        (s for s in spans if s.name == "toolledger.commit"), key=lambda s: s.start_time or 0
    )
    return [str(_attrs(s)["toolledger.event_types"]) for s in commits]


OUTCOME_KEYS = ("status", "attempts", "downstream_request_id", "error_code")


def _outcome(span: ReadableSpan) -> dict[str, AttributeValue]:
    attributes = _attrs(span)
    return {
        k: attributes[f"toolledger.{k}"] for k in OUTCOME_KEYS if f"toolledger.{k}" in attributes
    }


# ------------------------------------------------------------------------------ a call


async def test_a_successful_call_spans_its_stages(
    ledger: Ledger, exporter: InMemorySpanExporter
) -> None:
    result = await ledger.call("create_ticket", {"title": "Printer on fire"}, "ticket-1")
    assert result.ok, result
    ticket_id = result.result["ticket_id"]

    (intent,) = _intents(exporter)
    assert intent.parent is None
    attributes = _attrs(intent)
    outcome_keys = {f"toolledger.{k}" for k in OUTCOME_KEYS}
    assert {k: v for k, v in attributes.items() if k not in outcome_keys} == {
        "toolledger.tenant": "acme",
        "toolledger.tool": "create_ticket",
        "toolledger.tool_version": "1",
        "toolledger.idempotency_key": "ticket-1",
        "toolledger.call_id": result.call_id,
        "toolledger.intent_id": result.intent_id,
    }
    assert _outcome(intent) == {
        "status": "SUCCEEDED",
        "attempts": 1,
        "downstream_request_id": ticket_id,
    }

    children = _children(exporter, intent)
    assert _names(children) == ["admit", "commit", "commit", "decide", "decide", "execute"]
    assert _attrs(_only(children, "admit")) == {
        "toolledger.tenant": "acme",
        "toolledger.tool": "create_ticket",
    }
    assert _commit_types(children) == ["ToolCallStarted", "ToolCallSucceeded"]
    for commit in (s for s in children if s.name == "toolledger.commit"):
        assert set(_attrs(commit)) == {"toolledger.events", "toolledger.event_types"}
        assert _attrs(commit)["toolledger.events"] == 1
    decides = [s for s in children if s.name == "toolledger.decide"]
    assert sorted(str(_attrs(s)["toolledger.command"]) for s in decides) == [
        "AttemptFinished",
        "Submit",
    ]
    execute = _only(children, "execute")
    assert _attrs(execute)["toolledger.attempt"] == 1
    assert _attrs(execute)["toolledger.call_id"] == result.call_id
    assert _outcome(execute) == {"status": "SUCCEEDED", "downstream_request_id": ticket_id}
    assert _children(exporter, execute) == []  # the handler's work has no stage spans

    trace_ids = {s.context.trace_id for s in exporter.get_finished_spans() if s.context}
    assert len(trace_ids) == 1


async def test_a_replay_executes_nothing(ledger: Ledger, exporter: InMemorySpanExporter) -> None:
    first = await ledger.call("create_ticket", {"title": "Printer on fire"}, "ticket-2")
    exporter.clear()
    again = await ledger.call("create_ticket", {"title": "Printer on fire"}, "ticket-2")
    assert again.ok and again.replayed, again

    (intent,) = _intents(exporter)
    assert _outcome(intent) == {"status": "SUCCEEDED", "attempts": 1}
    assert _attrs(intent)["toolledger.call_id"] == first.call_id
    children = _children(exporter, intent)
    assert _names(children) == ["admit", "commit", "decide"]
    assert _attrs(_only(children, "commit"))["toolledger.event_types"] == "ToolCallReplayed"
    assert not [s for s in exporter.get_finished_spans() if _stage(s) == "execute"]


async def test_retries_show_one_execute_span_per_attempt(
    ledger: Ledger, exporter: InMemorySpanExporter
) -> None:
    result = await ledger.call(
        "flaky_write", {"payload": "p", "fault": "retryable_always"}, "flaky-1"
    )
    assert result.status is CallStatus.FAILED_RETRYABLE and result.attempts == 3, result

    (intent,) = _intents(exporter)
    assert _outcome(intent) == {
        "status": "FAILED_RETRYABLE",
        "attempts": 3,
        "error_code": "DOWNSTREAM_UNAVAILABLE",
    }
    executes = [s for s in _children(exporter, intent) if _stage(s) == "execute"]
    assert sorted(int(str(_attrs(s)["toolledger.attempt"])) for s in executes) == [1, 2, 3]
    for span in executes:
        assert _outcome(span) == {"status": "FAILED", "error_code": "DOWNSTREAM_UNAVAILABLE"}
    assert _commit_types(_children(exporter, intent)) == [
        "ToolCallStarted",
        "ToolCallFailed,ToolCallStarted",
        "ToolCallFailed,ToolCallStarted",
        "ToolCallFailed",
    ]


HANG = {"payload": "p", "fault": "hang_after_effect"}  # writes, then outlives the timeout


async def test_an_unknown_outcome_is_reconciled_by_the_next_call(
    ledger: Ledger, exporter: InMemorySpanExporter
) -> None:
    first = await ledger.call("flaky_write", HANG, "flaky-2")
    assert first.status is CallStatus.UNKNOWN, first
    (intent,) = _intents(exporter)
    assert _outcome(intent) == {"status": "UNKNOWN", "attempts": 1, "error_code": "OUTCOME_UNKNOWN"}
    assert _outcome(_only(_children(exporter, intent), "execute")) == {"status": "UNKNOWN"}

    exporter.clear()
    again = await ledger.call("flaky_write", HANG, "flaky-2")
    assert again.ok, again
    write_id = again.result["write_id"]
    (intent,) = _intents(exporter)
    assert _outcome(intent) == {"status": "SUCCEEDED", "downstream_request_id": write_id}
    children = _children(exporter, intent)
    assert _names(children) == ["admit", "commit", "commit", "decide", "decide", "reconcile"]
    assert _commit_types(children) == ["", "ToolCallReconciled"]  # nothing to commit first
    reconcile = _only(children, "reconcile")
    assert _attrs(reconcile)["toolledger.reconcile_attempt"] == 1
    assert _attrs(reconcile)["toolledger.call_id"] == again.call_id
    assert _outcome(reconcile) == {"status": "SUCCEEDED", "downstream_request_id": write_id}


@pytest.mark.parametrize("sweep_interval_s", [0.05])
async def test_a_sweep_reconciles_an_unknown_call(
    ledger: Ledger, exporter: InMemorySpanExporter
) -> None:
    first = await ledger.call("flaky_write", HANG, "flaky-4")
    assert first.status is CallStatus.UNKNOWN, first

    def sweeps() -> list[ReadableSpan]:
        return [s for s in exporter.get_finished_spans() if s.name == "toolledger.sweep"]

    deadline = asyncio.get_running_loop().time() + 10
    while not sweeps():
        assert asyncio.get_running_loop().time() < deadline, "no sweep within 10 s"
        await asyncio.sleep(0.02)
    (sweep,) = sweeps()
    assert sweep.parent is None
    assert _attrs(sweep)["toolledger.call_id"] == first.call_id
    assert _attrs(sweep)["toolledger.tool_version"] == "1"
    assert _outcome(sweep)["status"] == "SUCCEEDED"
    children = _children(exporter, sweep)
    assert _names(children) == ["commit", "commit", "decide", "decide", "reconcile"]
    assert _commit_types(children) == ["", "ToolCallReconciled"]


async def test_a_read_only_call(ledger: Ledger, exporter: InMemorySpanExporter) -> None:
    result = await ledger.call("list_tickets", {}, None)
    assert result.ok, result
    (intent,) = _intents(exporter)
    assert _outcome(intent) == {"status": "SUCCEEDED", "attempts": 1}
    children = _children(exporter, intent)
    assert _names(children) == ["admit", "commit", "read_only"]
    read_only = _only(children, "read_only")
    assert _attrs(read_only)["toolledger.tool"] == "list_tickets"
    assert _names(_children(exporter, read_only)) == ["execute"]


# ------------------------------------------------------------------------------ refusals


async def test_a_validation_failure_is_rejected(
    ledger: Ledger, exporter: InMemorySpanExporter
) -> None:
    result = await ledger.call("flaky_write", {"payload": 5}, "flaky-3")
    assert result.rejected and result.error is not None, result
    (intent,) = _intents(exporter)
    assert _outcome(intent) == {"status": "REJECTED", "error_code": "VALIDATION_FAILED"}
    assert _attrs(intent)["toolledger.tool"] == "flaky_write"
    assert "toolledger.tool_version" not in _attrs(intent)  # never admitted
    children = _children(exporter, intent)
    assert _names(children) == ["admit", "commit"]
    assert _outcome(_only(children, "admit")) == _outcome(intent)


async def test_a_call_that_needs_approval(ledger: Ledger, exporter: InMemorySpanExporter) -> None:
    args = {"customer_id": "cus_1", "amount_cents": 1250, "currency": "EUR"}
    result = await ledger.call("charge_card", args, "pay-1")
    assert isinstance(result.event, ApprovalRequested), result
    (intent,) = _intents(exporter)
    assert _outcome(intent) == {"status": "APPROVAL_REQUIRED", "error_code": "APPROVAL_REQUIRED"}
    children = _children(exporter, intent)
    assert _names(children) == ["admit", "commit", "decide"]
    assert _attrs(_only(children, "commit"))["toolledger.event_types"] == "ApprovalRequested"

    exporter.clear()
    token = await ledger.approve(result.event)
    (decision,) = exporter.get_finished_spans()[-1:]
    assert decision.name == "toolledger.approval_decision"
    assert _attrs(decision)["toolledger.decision"] == "ApprovalGranted"
    assert _names(_children(exporter, decision)) == ["commit", "decide"]

    exporter.clear()
    assert (await ledger.call("charge_card", args, "pay-1", token)).ok
    (intent,) = _intents(exporter)
    assert _outcome(intent)["status"] == "SUCCEEDED"


# ------------------------------------------------------------------------------ secrets


SECRETS = {
    "to": "jane.SECRET-to-8d1e@private.example",
    "body": "BODY-SECRET-4a9b: the wire code is 7731",
    "subject": "SUBJECT-SECRET-c03f",  # free text, not redacted in the ledger
    "customer_id": "cus_SECRET-e61d",
}


async def test_no_argument_token_or_principal_reaches_any_span(
    ledger: Ledger, exporter: InMemorySpanExporter
) -> None:
    email = {k: SECRETS[k] for k in ("to", "subject", "body")}
    charge = {"customer_id": SECRETS["customer_id"], "amount_cents": 990, "currency": "USD"}
    tokens: list[str] = []
    for tool, args, key in (("send_email", email, "mail-1"), ("charge_card", charge, "pay-2")):
        request = (await ledger.call(tool, args, key)).event
        assert isinstance(request, ApprovalRequested), request
        token = await ledger.approve(request)
        tokens.append(token)
        assert (await ledger.call(tool, args, key, token)).ok
        assert (await ledger.call(tool, args, key)).replayed
    # refused: the secret quoted in a free-text argument that fails validation
    bad = {**email, "to": "not an address " + SECRETS["to"], "cc": SECRETS["body"]}
    assert (await ledger.call("send_email", bad, "mail-2")).rejected
    mismatch = {**charge, "amount_cents": 991}  # the same key with other arguments
    assert (await ledger.call("charge_card", mismatch, "pay-2", tokens[-1])).rejected

    spans = exporter.get_finished_spans()
    names = {_stage(s) for s in spans}
    assert {"execute", "approval_decision", "commit"} <= names
    dumped = [span.to_json() for span in spans]
    assert any("mail-1" in text for text in dumped)  # the search does see attributes
    for text in dumped:
        for secret in [*SECRETS.values(), *tokens, PRINCIPAL, "SECRET"]:
            assert secret not in text, (secret, text)


async def test_an_execution_span_follows_the_genai_semantic_conventions(
    ledger: Ledger, exporter: InMemorySpanExporter
) -> None:
    """OpenTelemetry's GenAI conventions for a tool's execution: the span's name, operation,
    tool name, call id and type; the ledger's attributes under ``toolledger.*``; a failure's
    ``error.type``. Never the arguments or the result."""
    done = await ledger.call("create_ticket", {"title": "Printer SECRET-TITLE"}, "ticket-genai")
    assert done.ok, done
    failed = await ledger.call("flaky_write", {"payload": "p", "fault": "final"}, "flaky-genai")
    assert failed.status is CallStatus.FAILED_FINAL, failed
    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool ")]
    by_tool = {str(_attrs(s)["gen_ai.tool.name"]): s for s in spans}
    ok, bad = by_tool["create_ticket"], by_tool["flaky_write"]
    assert ok.name == "execute_tool create_ticket"
    attributes = _attrs(ok)
    assert {k: v for k, v in attributes.items() if k.startswith("gen_ai.")} == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "create_ticket",
        "gen_ai.tool.call.id": done.call_id,
        "gen_ai.tool.type": "function",
    }
    assert "error.type" not in attributes
    assert all(k.startswith(("gen_ai.", "toolledger.")) for k in attributes), attributes
    assert "SECRET-TITLE" not in repr(attributes)
    assert _attrs(bad)["error.type"] == failed.error.code if failed.error else False


async def test_executions_are_measured_as_the_genai_conventions_name_it(
    ledger: Ledger, exporter: InMemorySpanExporter
) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    telemetry.use_meter_provider(provider)
    try:
        assert (await ledger.call("create_ticket", {"title": "t"}, "ticket-metric")).ok
        failed = await ledger.call("flaky_write", {"payload": "p", "fault": "final"}, "m-2")
        assert failed.status is CallStatus.FAILED_FINAL
        data = reader.get_metrics_data()
    finally:
        telemetry.use_meter_provider(None)
        provider.shutdown()
    assert data is not None
    (metric,) = [
        m
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "gen_ai.execute_tool.duration"
    ]
    assert metric.unit == "s"
    points = {
        str(dict(p.attributes or {}).get("gen_ai.tool.name")): p for p in metric.data.data_points
    }
    assert dict(points["create_ticket"].attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "create_ticket",
    }
    ticket = points["create_ticket"]
    assert isinstance(ticket, HistogramDataPoint) and ticket.count == 1 and ticket.sum >= 0
    assert (
        dict(points["flaky_write"].attributes or {})["error.type"] == failed.error.code
        if failed.error
        else False
    )
