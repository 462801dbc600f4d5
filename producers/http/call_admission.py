"""The front door's own refusals of a call, made before anything is appended and each kept in
the audit trail (the key stays unused): the tool's scopes (403), the rate limits (429), the kill
switch and the run budget (503, 422). A FastAPI dependency, after the call's input is read."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import Depends

from toolledger.producers.client import TrustedContext
from toolledger.producers.http import governance
from toolledger.producers.http.access import Authenticated
from toolledger.producers.http.call_answer import retry_after
from toolledger.producers.http.call_input import Body, Key, KnownTool
from toolledger.producers.http.door import Door, FrontDoor
from toolledger.producers.http.errors import ProblemError
from toolledger.producers.http.problems import problem
from toolledger.producers.http.ratelimit import Refusal
from toolledger.schemas.errors import ErrorCode, ErrorInfo

log = logging.getLogger("toolledger.http")


async def admit(door: Door, context: Authenticated, info: KnownTool, body: Body, key: Key) -> None:
    """Refuses the call (raises) if this front door refuses it itself."""
    tool = info.name

    def audited(error: ErrorInfo) -> ErrorInfo:
        door.client.record_refusal(
            tool, key, context, error, run_id=body.run_id, step_id=body.step_id
        )
        return error

    missing = sorted(set(info.manifest.get("scopes", ())) - context.scopes)
    if missing:  # before the limits and pre-checks, which would tell it more
        door.metrics.rejections.labels(tool, ErrorCode.FORBIDDEN.value).inc()
        message = f"{tool} needs the scope(s) {missing}, which this caller lacks."
        raise ProblemError(problem(audited(ErrorInfo.of(ErrorCode.FORBIDDEN, message))))
    if door.limiter is not None:
        refusal = door.limiter.acquire(context.tenant_id, tool)
        if refusal is not None:  # nothing appended: the key stays unused
            error = audited(_rate_limited(door, context, tool, refusal))
            raise ProblemError(problem(error), {"Retry-After": str(refusal.retry_after_s)})
    refused = await governance.precheck(door, context, tool, key, body.run_id)
    if refused is not None:
        raise ProblemError(problem(audited(refused)), retry_after(refused.code))


def _rate_limited(
    door: FrontDoor, context: TrustedContext, tool: str, refusal: Refusal
) -> ErrorInfo:
    """429 before anything is appended, counted and logged."""
    door.metrics.rejections.labels(tool, ErrorCode.RATE_LIMITED.value).inc()
    door.metrics.calls.labels(tool, "REJECTED", "429").inc()
    log.info(
        "rate limited",
        extra={
            "tenant": context.tenant_id,
            "tool": tool,
            "bucket": refusal.scope,
            "retry_after_s": refusal.retry_after_s,
        },
    )
    return ErrorInfo.of(
        ErrorCode.RATE_LIMITED, f"{refusal.detail} Retry in {refusal.retry_after_s} s."
    )


AdmissionChecked = Annotated[None, Depends(admit)]
