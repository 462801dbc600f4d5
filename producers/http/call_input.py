"""What a call request says, each part read by a FastAPI dependency that refuses it with the
documented problem: the tool (404), the body (400, 413) and the idempotency key (400), and the
wait asked for in ``Prefer``."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends, Header, Request
from pydantic import ValidationError

from toolledger.producers.http.door import Door, ToolInfo
from toolledger.producers.http.errors import invalid, refused
from toolledger.producers.http.headers import (
    JsonBodyError,
    asked_wait,
    idempotency_key,
    strict_json,
    wait_seconds,
)
from toolledger.producers.http.models import CallBody
from toolledger.producers.http.responses import JSON, field_errors, read_capped
from toolledger.producers.http.validation import body_fix
from toolledger.schemas.errors import ErrorCode
from toolledger.schemas.keys import InvalidIdempotencyKey
from toolledger.schemas.nesting import NestingTooDeep, check_text_depth

MAX_BODY_BYTES = (1 << 20) + (64 << 10)  # the 1 MiB argument limit plus room for the envelope


async def request_started() -> float:
    return time.monotonic()


async def known_tool(tool: str, door: Door) -> ToolInfo:
    info = door.tools.get(tool)
    if info is None:
        raise refused(ErrorCode.TOOL_NOT_FOUND, f"There is no tool named {tool!r}.")
    return info


KnownTool = Annotated[ToolInfo, Depends(known_tool)]


async def call_body(request: Request, info: KnownTool) -> CallBody:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != JSON:
        raise refused(ErrorCode.VALIDATION_FAILED, "Send the body as application/json.")
    raw = await read_capped(request, MAX_BODY_BYTES)
    if raw is None:
        raise refused(
            ErrorCode.PAYLOAD_TOO_LARGE, f"The body is larger than {MAX_BODY_BYTES} bytes."
        )
    try:
        check_text_depth(raw, envelope=1)  # {"arguments": ...}
        return CallBody.model_validate(strict_json(raw))
    except (JsonBodyError, NestingTooDeep) as exc:
        raise refused(ErrorCode.VALIDATION_FAILED, str(exc)) from None
    except ValidationError as exc:
        errors = field_errors(exc.errors())
        again = "call again with the same key" if info.keyed else "call again"
        action = body_fix(errors, again=again)
        raise invalid("The body is not a valid call:", errors, action) from None


async def call_key(
    request: Request,
    info: KnownTool,
    idempotency_key_header: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="Required for mutation and long_running tools: 1..255 printable "
            'ASCII characters; "K" and K are the same key. Ignored for read_only tools.',
            # documented only: checked here (400 IDEMPOTENCY_KEY_INVALID)
            json_schema_extra={"minLength": 1, "maxLength": 255, "pattern": "^[ -~]+$"},
        ),
    ] = None,
) -> str | None:
    """The idempotency key of a tool that needs one (``None`` for a read-only tool)."""
    if not info.keyed:
        return None
    return required_key(request, f"{info.name} changes something: send an Idempotency-Key header.")


def required_key(request: Request, missing: str) -> str:
    """The request's Idempotency-Key; 400 ``IDEMPOTENCY_KEY_INVALID`` or, saying ``missing``,
    ``IDEMPOTENCY_KEY_MISSING``."""
    try:
        key = idempotency_key(request.headers.getlist("idempotency-key"))
    except InvalidIdempotencyKey as exc:
        raise refused(ErrorCode.IDEMPOTENCY_KEY_INVALID, str(exc).capitalize() + ".") from None
    if key is None:
        raise refused(ErrorCode.IDEMPOTENCY_KEY_MISSING, missing)
    return key


async def wait_asked(
    request: Request,
    prefer: Annotated[
        str | None, Header(description="wait=<seconds>: how long to wait (default 10, max 60).")
    ] = None,
) -> float:
    return wait_seconds(request.headers.getlist("prefer"))


async def decision_wait_asked(request: Request) -> float:
    """How long a call sent again may wait for a human's decision: only as long as the caller
    asked with ``Prefer: wait=N`` (the default wait does not cover a human)."""
    return asked_wait(request.headers.getlist("prefer")) or 0.0


Started = Annotated[float, Depends(request_started)]
Body = Annotated[CallBody, Depends(call_body)]
Key = Annotated[str | None, Depends(call_key)]
Wait = Annotated[float, Depends(wait_asked)]
DecisionWait = Annotated[float, Depends(decision_wait_asked)]
