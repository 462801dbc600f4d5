"""A group step that needs an approval is answered only once a lagging projection has the
request: the group then shows an approval id that an approver can already find (the race a
fresh-clone CI run found on Kafka + PostgreSQL: approve answered 404)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from toolledger.groups import step_caller
from toolledger.processors.groups.views import GroupMeta
from toolledger.processors.runtime.group_runner import StepCall
from toolledger.producers.client import CallResult, TrustedContext
from toolledger.schemas.calls import CallQueries
from toolledger.schemas.errors import ErrorCode, ErrorInfo
from toolledger.schemas.events import ApprovalRequested, Envelope

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)

REQUEST = ApprovalRequested(
    envelope=Envelope(
        event_id="evt_approval",
        call_key="tenant-a/refund/g1:a",
        tenant_id="tenant-a",
        tool="refund",
        tool_version="1.0.0",
        idempotency_key="g1:a",
        args_digest="sha256:" + "ab" * 32,
        intent_id="int_1",
        occurred_at=T0,
    ),
    approval_id="apr_1",
    arguments_redacted_json="{}",
    impact_json="{}",
    expires_at=T0 + timedelta(minutes=10),
)


class NeedsApproval:
    """A ledger that refuses every call with the approval request above."""

    def __init__(self) -> None:
        self.calls = 0

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        idempotency_key: str | None,
        context: TrustedContext,
        wait: float | None = None,
        run_id: str | None = None,
        step_id: str | None = None,
        approval_token: str | None = None,
    ) -> CallResult:
        self.calls += 1
        error = ErrorInfo.of(ErrorCode.APPROVAL_REQUIRED, "needs a human")
        return CallResult(None, error=error, event=REQUEST)


class LaggingProjection:
    """Applies the request on the ``lag``-th time it is asked."""

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.asked: list[str] = []

    async def moved(self, timeout_s: float) -> None:
        """A projection that cannot tell when it moves: the poll's interval passes."""
        await asyncio.sleep(timeout_s)

    async def applied_among(self, event_ids: Sequence[str]) -> set[str]:
        """One lookup of the awaited events (the step caller polls as a front door does)."""
        self.asked.extend(event_ids)
        return set(event_ids) if len(self.asked) >= self.lag else set()


def step() -> StepCall:
    meta = GroupMeta("grp_1", "tenant-a", "agent:a", ("tools:call",), "g1", T0)
    return StepCall("refund", {}, "g1:a", meta, "run-1", "a", None)


async def test_a_step_needing_approval_is_answered_once_the_projection_has_the_request() -> None:
    projection = LaggingProjection(lag=4)
    ledger = NeedsApproval()
    answer = await step_caller(ledger, cast(CallQueries, projection))(step())
    assert answer.status is None
    assert answer.approval_request_id == "apr_1"
    assert projection.asked == ["evt_approval"] * 4
    assert ledger.calls == 1


async def test_without_a_lagging_projection_the_answer_is_immediate() -> None:
    answer = await step_caller(NeedsApproval())(step())
    assert answer.approval_request_id == "apr_1"
    assert answer.error is not None and answer.error.code == ErrorCode.APPROVAL_REQUIRED
