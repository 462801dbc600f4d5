"""The console's Attempts table (``attempts_of``): one row per attempt with its outcome, from a
call's events as the read side returns them. Only ``ToolCallStarted`` carries the round, so
an outcome must be put in the row of the round last started, not in a row of its own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from toolledger.producers.http.console.calls import attempts_of
from toolledger.schemas.codec import event_to_json
from toolledger.schemas.errors import ErrorInfo
from toolledger.schemas.events import (
    Envelope,
    Event,
    FailureDisposition,
    ToolCallFailed,
    ToolCallOutcomeUnknown,
    ToolCallReplayed,
    ToolCallStarted,
    ToolCallSucceeded,
)
from toolledger.schemas.status import CallStatus

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


class Trail:
    """A call's events, one second apart, as ``door.queries.events`` gives them."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def _env(self) -> Envelope:
        n = len(self.events)
        return Envelope(
            event_id=f"e{n}",
            call_key="acme/charge_card/k1",
            tenant_id="acme",
            tool="charge_card",
            tool_version="1",
            idempotency_key="k1",
            args_digest="sha256:00",
            intent_id="i1",
            occurred_at=T0 + timedelta(seconds=n),
        )

    def add(self, kind: type[Event], **fields: Any) -> Trail:
        self.events.append(event_to_json(kind(envelope=self._env(), **fields)))
        return self

    def started(self, attempt: int, round_: int = 1) -> Trail:
        return self.add(
            ToolCallStarted,
            attempt=attempt,
            round=round_,
            executor_epoch=1,
            arguments_redacted_json="{}",
        )

    def succeeded(self, attempt: int) -> Trail:
        return self.add(ToolCallSucceeded, attempt=attempt, result_json="{}", duration_ms=12)

    def failed(self, attempt: int, disposition: FailureDisposition) -> Trail:
        error = ErrorInfo.downstream("TIMEOUT", "timed out", retryable=True, suggested_action="")
        return self.add(
            ToolCallFailed,
            attempt=attempt,
            error=error,
            disposition=disposition,
            fingerprint="fp",
            duration_ms=30,
        )


def _at(seconds: int) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", ".000000Z")


def _shown(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["round"], r["attempt"], r["outcome"], r["error"]) for r in rows]


def test_a_succeeded_call_has_one_row_with_its_outcome() -> None:
    rows = attempts_of(Trail().started(1).succeeded(1).events)
    assert rows == [
        {
            "attempt": 1,
            "round": 1,
            "started_at": _at(0),
            "outcome": "ToolCallSucceeded",
            "ended_at": _at(1),
            "duration_ms": 12,
            "error": None,
        }
    ]


def test_retries_in_a_round_and_a_second_round_each_have_their_row() -> None:
    retry, retryable = FailureDisposition.RETRY, FailureDisposition.RETRYABLE
    trail = (
        Trail()
        .started(1)
        .failed(1, retry)
        .started(2)
        .failed(2, retryable)
        .started(1, round_=2)  # the same key called again: a new round, attempts from 1
        .succeeded(1)
    )
    assert _shown(attempts_of(trail.events)) == [
        (1, 1, "ToolCallFailed", "DOWNSTREAM_TIMEOUT: timed out"),
        (1, 2, "ToolCallFailed", "DOWNSTREAM_TIMEOUT: timed out"),
        (2, 1, "ToolCallSucceeded", None),
    ]


def test_an_attempt_in_flight_has_no_outcome_and_an_unknown_one_says_why() -> None:
    in_flight = attempts_of(Trail().started(1).events)
    assert _shown(in_flight) == [(1, 1, None, None)]
    assert in_flight[0]["ended_at"] is None
    unknown = Trail().started(1).add(ToolCallOutcomeUnknown, attempt=1, reason="timed out")
    assert _shown(attempts_of(unknown.events)) == [(1, 1, "ToolCallOutcomeUnknown", "timed out")]


def test_events_without_an_attempt_add_no_row() -> None:
    trail = (
        Trail()
        .started(1)
        .succeeded(1)
        .add(
            ToolCallReplayed,
            status=CallStatus.SUCCEEDED,
            attempts=1,
            original_intent_id="i1",
            result_json="{}",
        )
    )
    assert len(attempts_of(trail.events)) == 1
