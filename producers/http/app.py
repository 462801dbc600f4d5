"""``create_app``: the HTTP API. Every route answers JSON or ``application/problem+json``;
bad input gets its documented 4xx and executes nothing.

The routes are one ``APIRouter`` per resource (``producers.http.routes``); they reach the
front door through a dependency (``app.state.door``), and refuse by raising
:class:`producers.http.errors.ProblemError` from the route or from a dependency
(authentication, scopes, the parts of a request). The operator console (``/console``) and the
Swagger UI (``/docs``, from vendored assets) are served by the same app."""

from __future__ import annotations

from fastapi import FastAPI

from toolledger.producers.http import console, openapi
from toolledger.producers.http.answer_errors import AnswerErrors
from toolledger.producers.http.console.sessions import SessionSettings
from toolledger.producers.http.door import FrontDoor, ToolInfo
from toolledger.producers.http.errors import install_problem_handlers
from toolledger.producers.http.routes import ROUTERS
from toolledger.producers.http.routes.tool_calls import FAST_ROUTE

__all__ = ["FrontDoor", "ToolInfo", "_AnswerErrors", "create_app"]

_AnswerErrors = AnswerErrors  # the name it had here (tests/unit)


def create_app(door: FrontDoor, console_sessions: SessionSettings | None = None) -> FastAPI:
    app = FastAPI(
        docs_url=None,  # the console serves /docs from its vendored Swagger UI
        redoc_url=None,  # ReDoc would load its script from a CDN
        title="toolledger",
        version="1",
        description="An execution ledger for AI agents' tool calls: at most once per "
        "idempotency key, replays answered from the ledger.",
    )
    app.state.door = door
    install_problem_handlers(app)
    app.add_middleware(AnswerErrors)
    for router in ROUTERS:
        app.include_router(router)
    app.router.routes.insert(0, FAST_ROUTE)  # POST /v1/tools/{tool}/calls, before its twin
    console.install(app, console_sessions)
    openapi.install(app, door)
    return app
