"""``GET /problems/{code}``: the page a problem's ``type`` points at (what happened, whether
to retry, what to do)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from toolledger.producers.http.errors import not_found
from toolledger.producers.http.problems import Problem, page
from toolledger.producers.http.responses import PROBLEM

router = APIRouter(tags=["problems"])


@router.get(
    "/problems/{code}",
    operation_id="getProblemType",
    response_class=HTMLResponse,
    responses={404: {"model": Problem, "content": {PROBLEM: {}}}},
)
async def problem_page(code: str) -> Response:
    text = page(code)
    if text is None:
        raise not_found("No such problem type.", "See /openapi.json for the error codes.")
    return HTMLResponse(text)
