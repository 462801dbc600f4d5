"""The API's outermost middleware: a request whose headers could be read two ways is refused
before any route reads it, and an error no route answered becomes a 503 problem, as does a
request the server stops waiting for when it shuts down."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toolledger.producers.http.headers import ambiguity
from toolledger.producers.http.problems import problem
from toolledger.producers.http.responses import error_response, problem_response
from toolledger.schemas.errors import ErrorCode, ErrorInfo

log = logging.getLogger("toolledger.http")

SHUTDOWN_RETRY_AFTER_S = 5  # for a restart, or another front door behind the same address


class AnswerErrors:
    """An error no route answered becomes a 503 problem sent here, so the exception never
    reaches the server, which would drop the keep-alive connection without saying so; a
    client that went away mid-request is logged once, at INFO, without a traceback.

    A request still running when the server's shutdown timeout runs out is cancelled by
    uvicorn, which would answer a bare ``text/plain`` 500: it gets a 503 problem with
    ``Retry-After`` here instead (the call may have been appended: the same key is safe)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        ambiguous = ambiguity(scope["headers"])
        if ambiguous is not None:  # refused before any route reads it: nothing can run
            refused = problem_response(
                problem(
                    ErrorInfo.of(
                        ErrorCode.VALIDATION_FAILED,
                        ambiguous,
                        suggested_action="Send each of these headers once, and a body framed "
                        "one way; then call again.",
                    )
                )
            )
            await refused(scope, receive, send)
            return
        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            # only the server cancels a request (its shutdown timeout ran out): the task ends
            # with this answer, so the cancellation stops here
            log.warning("request cut short by the shutdown", extra=_where(scope))
            if started:
                raise
            answer = error_response(
                ErrorCode.INTERNAL,
                "The server is shutting down and could not finish this request in time.",
                status=503,
                headers={"Retry-After": str(SHUTDOWN_RETRY_AFTER_S)},
            )
            await answer(scope, receive, send)
        except ClientDisconnect:
            log.info("client disconnected before its request was read", extra=_where(scope))
        except Exception as exc:
            # never a stack trace or a driver message to the caller; the log has the details
            log.error("unhandled error", exc_info=exc, extra=_where(scope))
            if started:
                raise
            answer = error_response(
                ErrorCode.INTERNAL,
                "The ledger could not answer this request.",
                headers={"Retry-After": "1"},
            )
            await answer(scope, receive, send)


def _where(scope: Scope) -> dict[str, Any]:
    return {"method": scope.get("method"), "path": str(scope.get("path", ""))[:256]}
