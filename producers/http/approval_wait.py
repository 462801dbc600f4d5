"""``Prefer: wait=N`` on a call that needs a human: the answer waits for the decision.

The call that opens an approval request answers ``APPROVAL_REQUIRED`` at once (a human must
be asked). Sent again while the request is pending, with time left in the caller's wait, the
front door follows the
request in the projection until it is decided, then sends the same call (same key, same
arguments) once more: a grant in the key's approval book lets it start (the grant is consumed
with the Started event, so it runs once however many callers wait), a denial answers the
refusal. The projection shows a decision only after the ledger committed it, so the second
pass always finds the grant in the book. If the wait runs out first, the caller gets the
``428`` it would have got without waiting.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from toolledger.producers.client import CallResult
from toolledger.schemas.calls import CallQueries
from toolledger.schemas.events import ApprovalRequested
from toolledger.schemas.governance import approval_id_for

_FIRST_POLL_S = 0.02
_MAX_POLL_S = 0.5


def awaited_request(result: CallResult) -> ApprovalRequested | None:
    """The approval request a call sent *again* waits for: one an earlier call opened. A call
    that opens the request answers 428 at once, so that a human can be asked."""
    event = result.event
    if not (result.rejected and isinstance(event, ApprovalRequested)):
        return None
    return None if event.approval_id == approval_id_for(result.intent_id) else event


async def decided_within(
    queries: CallQueries, tenant_id: str, approval_id: str, deadline: float
) -> bool:
    """Whether the request is decided (approved, denied) or expired before ``deadline`` (a
    ``time.monotonic()`` value). Polls the projection with a growing interval."""
    delay = _FIRST_POLL_S
    while True:
        view = await queries.approval(tenant_id, approval_id, now=datetime.now(UTC))
        if view is not None and view.status != "pending":
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(delay, left))
        delay = min(delay * 2, _MAX_POLL_S)
