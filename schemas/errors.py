"""Machine-readable errors: one shape for callers, models and the audit trail.

Like aiokafka's ``errors.py``, whether an error is worth retrying is data (``retryable``),
not something a caller infers from a class name or a message.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, ValidationError


class ErrorCode(StrEnum):
    VALIDATION_FAILED = "VALIDATION_FAILED"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    IDEMPOTENCY_KEY_MISSING = "IDEMPOTENCY_KEY_MISSING"
    IDEMPOTENCY_KEY_INVALID = "IDEMPOTENCY_KEY_INVALID"
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    IDEMPOTENCY_KEY_IN_USE = "IDEMPOTENCY_KEY_IN_USE"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    FORBIDDEN = "FORBIDDEN"
    TOOL_NOT_FOUND = "TOOL_NOT_FOUND"
    TOOL_DISABLED = "TOOL_DISABLED"
    APPROVAL_REQUIRED = "APPROVAL_REQUIRED"
    APPROVAL_INVALID = "APPROVAL_INVALID"
    RATE_LIMITED = "RATE_LIMITED"
    RETRY_LIMIT_EXCEEDED = "RETRY_LIMIT_EXCEEDED"
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    INTERNAL = "INTERNAL"
    JOB_NOT_FOUND = "JOB_NOT_FOUND"
    JOB_FINISHED = "JOB_FINISHED"
    JOB_NOT_CANCELLABLE = "JOB_NOT_CANCELLABLE"
    CANCELLED = "CANCELLED"


DOWNSTREAM_PREFIX = "DOWNSTREAM_"

# code -> (retryable, suggested_action)
_DEFAULTS: dict[ErrorCode, tuple[bool, str]] = {
    ErrorCode.VALIDATION_FAILED: (
        False,
        "Fix the arguments listed in the field errors and call again with the same key.",
    ),
    ErrorCode.PAYLOAD_TOO_LARGE: (
        False,
        "Send smaller arguments; large documents belong in storage.",
    ),
    ErrorCode.IDEMPOTENCY_KEY_MISSING: (
        False,
        "Send an idempotency key derived from the run id and step id.",
    ),
    ErrorCode.IDEMPOTENCY_KEY_INVALID: (
        False,
        "Use 1 to 255 printable ASCII characters for the idempotency key.",
    ),
    ErrorCode.IDEMPOTENCY_KEY_REUSED: (
        False,
        "This key was used with other arguments: use a new key for a new action.",
    ),
    ErrorCode.IDEMPOTENCY_KEY_IN_USE: (
        True,
        "The same call is still running: retry later with the same key and arguments.",
    ),
    ErrorCode.UNAUTHENTICATED: (False, "Authenticate and call again."),
    ErrorCode.FORBIDDEN: (False, "Ask an operator for the scope this tool needs."),
    ErrorCode.TOOL_NOT_FOUND: (False, "List the available tools and pick one of them."),
    ErrorCode.TOOL_DISABLED: (True, "The tool is switched off by an operator: try later."),
    ErrorCode.APPROVAL_REQUIRED: (
        False,
        "Ask a human to approve this exact call; once approved, call again with the same "
        "idempotency key and the same arguments (no token needed: the grant is kept with the "
        "key), or send it with 'Prefer: wait=N' to wait for the decision.",
    ),
    ErrorCode.APPROVAL_INVALID: (
        False,
        "The approval token does not match this call: request a new approval.",
    ),
    ErrorCode.RATE_LIMITED: (
        True,
        "Wait for the Retry-After period, then retry with the same key.",
    ),
    ErrorCode.RETRY_LIMIT_EXCEEDED: (False, "Stop retrying this action and hand over to a human."),
    ErrorCode.OUTCOME_UNKNOWN: (
        True,
        "Retry with the same key: the ledger checks the downstream before doing anything.",
    ),
    ErrorCode.INTERNAL: (True, "Retry with the same key; report the call id if it persists."),
    ErrorCode.JOB_NOT_FOUND: (False, "Check the call id: it names no job of this tenant."),
    ErrorCode.JOB_FINISHED: (False, "The job has finished: read the call for its outcome."),
    ErrorCode.JOB_NOT_CANCELLABLE: (
        False,
        "This job cannot be cancelled: wait for it to finish, or ask an operator.",
    ),
    ErrorCode.CANCELLED: (False, "The job was cancelled: use a new key to start it again."),
}


class ErrorInfo(BaseModel):
    """The error shape every caller sees: ``{code, message, retryable, suggested_action}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: str
    message: str
    retryable: bool
    suggested_action: str

    @classmethod
    def of(
        cls,
        code: ErrorCode,
        message: str,
        *,
        retryable: bool | None = None,
        suggested_action: str | None = None,
    ) -> ErrorInfo:
        default_retryable, default_action = _DEFAULTS[code]
        return cls(
            code=code.value,
            message=message,
            retryable=default_retryable if retryable is None else retryable,
            suggested_action=suggested_action or default_action,
        )

    @classmethod
    def downstream(
        cls, code: str, message: str, *, retryable: bool, suggested_action: str
    ) -> ErrorInfo:
        """An error reported by a tool; its code always carries the ``DOWNSTREAM_`` prefix."""
        if not code.startswith(DOWNSTREAM_PREFIX):
            code = DOWNSTREAM_PREFIX + code
        return cls(
            code=code, message=message, retryable=retryable, suggested_action=suggested_action
        )


class FieldError(BaseModel):
    """One argument that failed validation: where, what and the validator's error type."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    loc: str
    msg: str
    type: str


def one_line(exc: ValidationError, root: str = "$", most: int = 5) -> str:
    """A validation error of a file or a setting as one line: ``where: what`` for each of its
    first ``most`` errors (``root`` names the document itself), joined by ``; ``."""
    errors = exc.errors(include_url=False)
    parts = [
        f"{'.'.join(str(p) for p in e['loc']) or root}: {e['msg'].removeprefix('Value error, ')}"
        for e in errors[:most]
    ]
    if len(errors) > most:
        parts.append(f"and {len(errors) - most} more")
    return "; ".join(parts)
