"""Refusals as exceptions: a route or a dependency raises :class:`ProblemError`, and the handlers
installed here answer it (and FastAPI's own errors) as ``application/problem+json``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from toolledger.producers.http.problems import Problem, problem
from toolledger.producers.http.responses import field_errors, problem_response
from toolledger.producers.http.validation import request_fix
from toolledger.schemas.errors import ErrorCode, ErrorInfo, FieldError


class ProblemError(Exception):
    """A refusal: answered with its problem and headers (e.g. ``Retry-After``)."""

    def __init__(self, body: Problem, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(body.detail)
        self.problem = body
        self.headers = dict(headers or {})

    def response(self) -> Response:
        return problem_response(self.problem, self.headers)


def refused(
    code: ErrorCode,
    message: str,
    *,
    status: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> ProblemError:
    return ProblemError(problem(ErrorInfo.of(code, message), status=status), headers)


def not_found(detail: str, action: str) -> ProblemError:
    info = ErrorInfo(code="NOT_FOUND", message=detail, retryable=False, suggested_action=action)
    return ProblemError(problem(info, status=404))


def invalid(summary: str, errors: Sequence[FieldError], action: str | None = None) -> ProblemError:
    """400 VALIDATION_FAILED with the field errors; ``action``: what to fix (default: the
    arguments)."""
    detail = "; ".join(f"{e.loc}: {e.msg}" for e in errors[:5])
    info = ErrorInfo.of(
        ErrorCode.VALIDATION_FAILED, f"{summary} {detail}".strip()[:1000], suggested_action=action
    )
    return ProblemError(problem(info, errors=list(errors[:50])))


async def _answer_problem(request: Request, exc: ProblemError) -> Response:
    return exc.response()


async def answer_http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """FastAPI's own HTTP errors (no route for the path, not this method) as problems."""
    code = {405: "METHOD_NOT_ALLOWED", 404: "NOT_FOUND"}.get(exc.status_code, "INTERNAL")
    p = Problem(
        type=f"/problems/{code}",
        title=code.replace("_", " ").capitalize(),
        status=exc.status_code,
        detail=str(exc.detail),
        code=code,
        retryable=False,
        suggested_action="Check the method and the path against /openapi.json.",
    )
    return problem_response(p, getattr(exc, "headers", None))


async def _invalid_request(request: Request, exc: RequestValidationError) -> Response:
    errors = field_errors(exc.errors())
    return invalid("The request is invalid:", errors, request_fix(errors)).response()


def install_problem_handlers(app: FastAPI) -> None:
    app.exception_handler(ProblemError)(_answer_problem)
    app.exception_handler(StarletteHTTPException)(answer_http_error)
    app.exception_handler(RequestValidationError)(_invalid_request)
