"""Building the API's responses: problems with stable codes, capped request bodies."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from toolledger.producers.http.problems import Problem, problem, problem_bytes
from toolledger.schemas.errors import ErrorCode, ErrorInfo, FieldError

PROBLEM = "application/problem+json"
JSON = "application/json"


def field_errors(errors: Any) -> list[FieldError]:
    return [
        FieldError(
            loc=".".join(str(p) for p in e.get("loc", ())) or "$",
            msg=str(e.get("msg", "invalid")),
            type=str(e.get("type", "invalid")),
        )
        for e in errors
    ]


def json_response(body: Any, status: int = 200) -> Response:
    """``body`` as compact JSON; values JSON has no type for (dates) as their strings."""
    return Response(
        json.dumps(body, separators=(",", ":"), default=str).encode(),
        status_code=status,
        media_type=JSON,
    )


def problem_response(p: Problem, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        problem_bytes(p), status_code=p.status, media_type=PROBLEM, headers=dict(headers or {})
    )


def error_response(
    code: ErrorCode,
    message: str,
    *,
    status: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    return problem_response(problem(ErrorInfo.of(code, message), status=status), headers)


async def read_capped(request: Request, cap: int) -> bytes | None:
    """The body, or ``None`` if it is larger than ``cap`` (stops reading there)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > cap:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
