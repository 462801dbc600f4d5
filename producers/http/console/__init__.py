"""The operator console at ``/console``: server-rendered pages (Jinja2, a little htmx) over the
API's own reads, scopes and decisions, with every asset vendored in the package. See
docs/console.md."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from toolledger.producers.http.console import (
    approvals,
    calls,
    docs,
    groups,
    runs,
    signin,
    stats,
    switches,
)
from toolledger.producers.http.console.charts import History
from toolledger.producers.http.console.guard import http_error_page
from toolledger.producers.http.console.pages import STATIC
from toolledger.producers.http.console.sessions import SessionSettings, SessionStore

__all__ = ["install"]


def install(app: FastAPI, settings: SessionSettings | None = None) -> None:
    """Serve the console, its assets and ``/docs`` from ``app`` (sessions: ``settings``, else
    the defaults or the environment's, see :meth:`SessionSettings.from_env`); a console path
    no page has, or a method it does not take, is answered with a page (404, 405)."""
    app.state.console_sessions = SessionStore(settings or SessionSettings.from_env())
    app.state.console_stats = History()
    for module in (signin, calls, approvals, switches, stats, groups, runs, docs):
        app.include_router(module.router)
    app.mount("/console/static", StaticFiles(directory=STATIC), name="console-static")
    for status in (404, 405):
        app.exception_handler(status)(http_error_page)
