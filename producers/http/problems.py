"""``application/problem+json`` errors with stable codes, and the pages their ``type`` URLs
point at."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from toolledger.schemas.errors import ErrorCode, ErrorInfo, FieldError

STATUS: dict[str, int] = {
    ErrorCode.VALIDATION_FAILED: 400,
    ErrorCode.IDEMPOTENCY_KEY_MISSING: 400,
    ErrorCode.IDEMPOTENCY_KEY_INVALID: 400,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.APPROVAL_INVALID: 403,
    ErrorCode.TOOL_NOT_FOUND: 404,
    ErrorCode.IDEMPOTENCY_KEY_IN_USE: 409,
    ErrorCode.JOB_NOT_FOUND: 404,
    ErrorCode.JOB_FINISHED: 409,
    ErrorCode.JOB_NOT_CANCELLABLE: 409,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.IDEMPOTENCY_KEY_REUSED: 422,
    ErrorCode.RETRY_LIMIT_EXCEEDED: 422,
    ErrorCode.APPROVAL_REQUIRED: 428,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.TOOL_DISABLED: 503,
    ErrorCode.INTERNAL: 503,
}

TITLES: dict[str, str] = {
    ErrorCode.VALIDATION_FAILED: "The request or its arguments are invalid",
    ErrorCode.IDEMPOTENCY_KEY_MISSING: "This tool needs an Idempotency-Key header",
    ErrorCode.IDEMPOTENCY_KEY_INVALID: "The Idempotency-Key header is not usable",
    ErrorCode.IDEMPOTENCY_KEY_REUSED: "The idempotency key was used with other arguments",
    ErrorCode.IDEMPOTENCY_KEY_IN_USE: "A call with this key is still running",
    ErrorCode.UNAUTHENTICATED: "Authentication is required",
    ErrorCode.FORBIDDEN: "The caller may not do this",
    ErrorCode.TOOL_NOT_FOUND: "There is no such tool",
    ErrorCode.TOOL_DISABLED: "The tool is switched off",
    ErrorCode.JOB_NOT_FOUND: "There is no such job",
    ErrorCode.JOB_FINISHED: "The job has finished",
    ErrorCode.JOB_NOT_CANCELLABLE: "The job cannot be cancelled",
    ErrorCode.CANCELLED: "The job was cancelled",
    ErrorCode.APPROVAL_REQUIRED: "A human must approve this exact call",
    ErrorCode.APPROVAL_INVALID: "The approval token does not fit this call",
    ErrorCode.RATE_LIMITED: "Too many calls",
    ErrorCode.RETRY_LIMIT_EXCEEDED: "The retry budget is spent",
    ErrorCode.PAYLOAD_TOO_LARGE: "The request is too large",
    ErrorCode.OUTCOME_UNKNOWN: "The outcome is not known yet",
    ErrorCode.INTERNAL: "The ledger is temporarily unavailable",
    "METHOD_NOT_ALLOWED": "Only POST executes a tool",
    "NOT_FOUND": "There is nothing at this address",
}


class Problem(BaseModel):
    """RFC 9457 problem details, with the ledger's error fields."""

    type: str
    title: str
    status: int
    detail: str
    code: str
    retryable: bool
    suggested_action: str
    errors: list[FieldError] = Field(default_factory=list)
    approval_request: dict[str, Any] | None = None
    call_id: str | None = None  # the call a tool call's refusal is about (whose key it is)


def status_of(code: str) -> int:
    if code.startswith("DOWNSTREAM_"):
        return 502
    return STATUS.get(code, 400)


def problem(
    error: ErrorInfo, *, status: int | None = None, errors: list[FieldError] | None = None
) -> Problem:
    return Problem(
        type=f"/problems/{error.code}",
        title=TITLES.get(error.code, error.code.replace("_", " ").capitalize()),
        status=status or status_of(error.code),
        detail=error.message,
        code=error.code,
        retryable=error.retryable,
        suggested_action=error.suggested_action,
        errors=errors or [],
    )


def problem_bytes(p: Problem) -> bytes:
    body = p.model_dump(exclude_none=True)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def page(code: str) -> str | None:
    """The short page a problem ``type`` URL serves."""
    if code not in TITLES:
        return None
    info = ErrorInfo.of(ErrorCode(code), "") if code in ErrorCode.__members__ else None
    action = info.suggested_action if info else "See the API documentation."
    retry = "yes" if info and info.retryable else "no"
    return (
        f"<!doctype html><title>{code}</title><h1>{code}</h1><p>{TITLES[code]}.</p>"
        f"<p>Retryable: {retry}.</p><p>What to do: {action}</p>"
    )
