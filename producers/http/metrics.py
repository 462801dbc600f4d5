"""Prometheus metrics of the HTTP front door (one registry per app, so tests can read it)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from toolledger.producers.client import CallResult


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "toolledger_http_calls",
            "Tool calls answered, by outcome.",
            ["tool", "status", "http_status"],
            registry=self.registry,
        )
        self.replays = Counter(
            "toolledger_http_replays",
            "Calls answered from the ledger.",
            ["tool"],
            registry=self.registry,
        )
        self.rejections = Counter(
            "toolledger_http_rejections",
            "Calls refused before execution, by code.",
            ["tool", "code"],
            registry=self.registry,
        )
        self.operator_actions = Counter(
            "toolledger_http_operator_actions",
            "Approvals, denials and switches confirmed by the ledger or appended.",
            ["action"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "toolledger_http_call_seconds",
            "Latency of tool calls.",
            ["tool"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )

    def observe(self, tool: str, http_status: int, result: CallResult, seconds: float) -> None:
        status = result.status.value if result.status else "REJECTED"
        self.calls.labels(tool, status, str(http_status)).inc()
        if result.replayed:
            self.replays.labels(tool).inc()
        if result.rejected and result.error is not None:
            self.rejections.labels(tool, result.error.code).inc()
        self.latency.labels(tool).observe(seconds)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
