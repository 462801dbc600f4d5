"""The job of a long-running call: ``POST /v1/calls/{call_id}/job`` (the job reports its status,
scope ``jobs:report``) and ``POST /v1/calls/{call_id}/job/cancel`` (calls the tool's cancel).

Both are appended to the call key's partition and decided there by the pure core, in order with
the executor's polls: the first word that finishes a job wins, any later one gets ``409``. A call
of another tenant, or one without a job, is ``404``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from toolledger.producers.approval_rules import reads
from toolledger.producers.client import TrustedContext, job_record
from toolledger.producers.http.access import OPERATOR, Authenticated
from toolledger.producers.http.call_views import projected, view_bytes
from toolledger.producers.http.door import Door, FrontDoor
from toolledger.producers.http.errors import refused
from toolledger.producers.http.openapi import documented, request_body
from toolledger.producers.http.operator_input import json_body
from toolledger.producers.http.problems import problem
from toolledger.producers.http.responses import JSON, json_response, problem_response
from toolledger.producers.http.routes.calls import CALL_ID
from toolledger.schemas.calls import CallView
from toolledger.schemas.errors import DOWNSTREAM_PREFIX, ErrorCode, ErrorInfo
from toolledger.schemas.events import Event, ToolCallRejected

JOBS_REPORT = "jobs:report"

router = APIRouter(tags=["jobs"])


class JobError(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    code: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Z][A-Z0-9_]*$")]
    message: Annotated[str, Field(max_length=2000)]
    retryable: bool = False


class JobReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: Literal["running", "succeeded", "failed"]
    progress: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    result: Any = None
    error: JobError | None = None


report_body = json_body(JobReport)


async def _job_call(
    door: FrontDoor, context: TrustedContext, call_id: str, *, reporting: bool = False
) -> CallView:
    """The call's view; ``reporting``: for a job's report (a worker's credential reports the
    jobs of every principal of its tenant), else only a call ``context`` reads."""
    view = (
        await door.queries.get(context.tenant_id, call_id) if CALL_ID.fullmatch(call_id) else None
    )
    if view is not None and not (reporting or reads(context, view.call_key)):
        view = None
    if view is None or view.job is None:
        raise refused(
            ErrorCode.JOB_NOT_FOUND,
            "No job with this call id (calls of other tenants are not visible to this token).",
        )
    return view


async def _answered(
    door: FrontDoor, context: TrustedContext, call_id: str, answer: Event | None
) -> Response:
    if answer is None:  # appended, not decided within the wait: it may still apply
        return json_response({"call_id": call_id, "confirmed": False}, status=202)
    if isinstance(answer, ToolCallRejected):
        return problem_response(problem(answer.error))
    view = await projected(door, context.tenant_id, call_id, answer.event_id)
    if view is None:
        return json_response({"call_id": call_id, "confirmed": True}, status=202)
    return Response(view_bytes(view), media_type=JSON)


@router.post(
    "/v1/calls/{call_id}/job",
    operation_id="reportJob",
    responses=documented(200, 202),
    openapi_extra=request_body(JobReport.model_json_schema()),
)
async def report_job(
    call_id: str,
    door: Door,
    context: Authenticated,
    body: Annotated[JobReport, Depends(report_body)],
) -> Response:
    if JOBS_REPORT not in context.scopes:
        raise refused(ErrorCode.FORBIDDEN, f"Reporting a job needs the scope {JOBS_REPORT!r}.")
    view = await _job_call(door, context, call_id, reporting=True)
    error = None
    if body.status == "failed":
        reported = body.error or JobError(code="JOB_FAILED", message="The job failed.")
        code = reported.code
        error = ErrorInfo(
            code=code if code.startswith(DOWNSTREAM_PREFIX) else DOWNSTREAM_PREFIX + code,
            message=reported.message,
            retryable=reported.retryable,
            suggested_action="Retry with the same key." if reported.retryable else "Do not retry.",
        )
    record = job_record(
        "report",
        context=context,
        call_key=view.call_key,
        tool=view.tool,
        idempotency_key=view.idempotency_key,
        status=body.status,
        progress=body.progress,
        result=body.result if body.status == "succeeded" else None,
        error=error,
    )
    answer = await door.client.command(record)
    return await _answered(door, context, call_id, answer)


@router.post(
    "/v1/calls/{call_id}/job/cancel", operation_id="cancelJob", responses=documented(200, 202)
)
async def cancel_job(call_id: str, door: Door, context: Authenticated) -> Response:
    if not context.scopes & {"tools:call", OPERATOR}:
        raise refused(ErrorCode.FORBIDDEN, "Cancelling a job needs the scope 'tools:call'.")
    view = await _job_call(door, context, call_id)
    record = job_record(
        "cancel",
        context=context,
        call_key=view.call_key,
        tool=view.tool,
        idempotency_key=view.idempotency_key,
    )
    answer = await door.client.command(record)
    return await _answered(door, context, call_id, answer)
