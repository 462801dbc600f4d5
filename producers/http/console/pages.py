"""Rendering the console's pages: Jinja2 templates (package data, autoescaped: arguments, keys
and errors are shown inert) answered with the headers every page gets."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from toolledger.producers.approval_rules import is_operator
from toolledger.producers.http.console.sessions import Session
from toolledger.schemas.status import CallStatus

HERE = Path(__file__).parent
STATIC = HERE / "static"
CUT_CHARS = 2_000  # a longer value is cut short, with a <details> to see all of it
HEADERS = {
    # scripts and styles from this server only: no inline script can run, whatever a value holds
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
_STATUS_TEXT = {
    # the status is always written out; the mark and colour only repeat it
    CallStatus.SUCCEEDED.value: ("ok", "✓"),
    CallStatus.FAILED_FINAL.value: ("bad", "✗"),
    CallStatus.FAILED_RETRYABLE.value: ("warn", "↻"),
    CallStatus.UNKNOWN.value: ("warn", "?"),
    CallStatus.PENDING.value: ("info", "…"),
    "pending": ("info", "…"),
    "approved": ("ok", "✓"),
    "consumed": ("ok", "✓"),
    "denied": ("bad", "✗"),
    "expired": ("warn", "⌛"),
}


def pretty(value: Any) -> str:
    """A value as indented JSON (strings as they are)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def when(value: datetime | str | None) -> Markup | str:
    """A time in UTC, as a ``<time>`` whose date and clock may go on two lines but are never
    broken themselves (a browser would break a date after a hyphen)."""
    if value is None:
        return "—"
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    utc = value.astimezone(UTC)
    return Markup('<time datetime="{}"><span>{}</span> <span>{} UTC</span></time>').format(
        utc.isoformat(), f"{utc:%Y-%m-%d}", f"{utc:%H:%M:%S}"
    )


def status_class(status: str) -> str:
    return _STATUS_TEXT.get(status, ("info", "•"))[0]


def status_mark(status: str) -> str:
    return _STATUS_TEXT.get(status, ("info", "•"))[1]


def percent(rate: float | None) -> str:
    return "—" if rate is None else f"{rate * 100:.1f} %"


templates = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters.update(
    pretty=pretty, when=when, status_class=status_class, status_mark=status_mark, percent=percent
)
templates.globals["CUT_CHARS"] = CUT_CHARS


def render(
    request: Request,
    name: str,
    session: Session | None,
    *,
    code: int = 200,
    **context: Any,
) -> HTMLResponse:
    """The page ``name`` for ``session`` (None: signed out)."""
    html = templates.get_template(name).render(
        request_path=request.url.path,
        session=session,
        context=session.context if session is not None else None,
        csrf=session.csrf if session is not None else None,
        operator=session is not None and is_operator(session.context),
        http_status=code,
        **context,
    )
    return HTMLResponse(html, status_code=code, headers=HEADERS)
