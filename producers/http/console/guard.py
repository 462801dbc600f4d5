"""Who may use a console page, as FastAPI dependencies and the console's route class.

- :data:`Signed`: the live session of the request's cookie, its token checked again by the
  API's authenticator; otherwise :class:`SignInRequired` (a redirect to the sign-in page).
- :data:`CheckedForm`: a POST's form, refused with 403 unless it comes from this server's own
  origin (``Origin``, else ``Referer``, when sent) and carries the session's CSRF token
  (compared in constant time).
- :class:`ConsoleRoute` answers those refusals, the API's own problems raised by the code
  the console shares with it (403, 404, 409 ...), a request FastAPI finds invalid (400) and
  an error no one expected (500, logged) as HTML pages with the same status;
  :func:`http_error_page` answers a console path no page has (404) or a method a page does
  not take (405) the same way."""

from __future__ import annotations

import contextlib
import hmac
import logging
from collections.abc import Callable, Coroutine
from typing import Annotated, Any
from urllib.parse import parse_qsl, quote, urlsplit

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from toolledger.producers.approval_rules import is_operator
from toolledger.producers.http.auth import AuthFailure
from toolledger.producers.http.console.pages import render
from toolledger.producers.http.console.sessions import COOKIE, Session, SessionStore
from toolledger.producers.http.door import Door
from toolledger.producers.http.errors import ProblemError, answer_http_error
from toolledger.producers.http.responses import field_errors, read_capped

log = logging.getLogger("toolledger.console")

PREFIX = "/console"
SIGN_IN = f"{PREFIX}/sign-in"
MAX_FORM_BYTES = 64 << 10


class SignInRequired(Exception):
    """No live session: the sign-in page, then back to ``next``."""

    def __init__(self, next_path: str, *, expired: bool) -> None:
        super().__init__(next_path)
        self.next_path = next_path
        self.expired = expired


class Refused(Exception):
    """A console refusal, answered as a page with ``status``."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail


def sessions(request: Request) -> SessionStore:
    store: SessionStore = request.app.state.console_sessions
    return store


def safe_next(value: str | None) -> str:
    """``value`` if it is a console page of this server, else the console's home."""
    parts = urlsplit(value or "")
    if parts.scheme or parts.netloc or "\\" in (value or ""):
        return PREFIX
    if parts.path != PREFIX and not parts.path.startswith(PREFIX + "/"):
        return PREFIX
    return value or PREFIX


def sign_in_url(next_path: str, *, expired: bool) -> str:
    url = f"{SIGN_IN}?next={quote(safe_next(next_path), safe='')}"
    return url + "&expired=1" if expired else url


async def signed_in(request: Request, door: Door) -> Session:
    store = sessions(request)
    cookie = request.cookies.get(COOKIE)
    here = str(request.url.path) + (f"?{request.url.query}" if request.url.query else "")
    back = here if request.method == "GET" else PREFIX
    session = store.get(cookie)
    if session is None:
        raise SignInRequired(back, expired=cookie is not None)
    # the token again, as the API would check it now: revoked, expired or re-scoped tokens
    checked = door.authenticator_in_force.check("Bearer " + session.token)
    if isinstance(checked, AuthFailure) or (checked.tenant_id, checked.principal) != (
        session.context.tenant_id,
        session.context.principal,
    ):
        store.drop(session.id)
        raise SignInRequired(back, expired=True)
    session.context = checked
    request.state.console_session = session
    return session


Signed = Annotated[Session, Depends(signed_in)]


def require_operator(session: Session, page: str) -> None:
    """403 unless the session's token has an operator scope."""
    if not is_operator(session.context):
        raise Refused(403, "Forbidden", f"The {page} needs the scope 'operator'.")


def own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.headers.get('host', '')}"


def cross_site(request: Request) -> bool:
    """Whether the request says it comes from another origin (``Origin``, else ``Referer``);
    a request that says nothing is judged by its CSRF token alone."""
    origin = request.headers.get("origin")
    if origin is None:
        referer = request.headers.get("referer")
        if referer is None:
            return False
        parts = urlsplit(referer)
        origin = f"{parts.scheme}://{parts.netloc}"
    return origin != own_origin(request)


async def read_form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (the first value of each name)."""
    raw = await read_capped(request, MAX_FORM_BYTES)
    if raw is None:
        raise Refused(413, "Too large", f"The form is larger than {MAX_FORM_BYTES} bytes.")
    form: dict[str, str] = {}
    for name, value in parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True):
        form.setdefault(name, value)
    return form


def refuse_cross_site(request: Request) -> None:
    if cross_site(request):
        log.warning("cross-site form refused", extra={"path": request.url.path[:256]})
        raise Refused(403, "Refused", "This form was not sent from this console.")


async def checked_form(request: Request, session: Signed) -> dict[str, str]:
    refuse_cross_site(request)
    form = await read_form(request)
    if not hmac.compare_digest(form.get("csrf", "").encode(), session.csrf.encode()):
        log.warning("form without a valid CSRF token", extra={"path": request.url.path[:256]})
        raise Refused(403, "Refused", "The form's CSRF token is missing or wrong: reload the page.")
    return form


CheckedForm = Annotated[dict[str, str], Depends(checked_form)]


def redirect(url: str, request: Request) -> Response:
    """303 to ``url``; an htmx request is told to navigate there itself."""
    if request.headers.get("hx-request") == "true":
        return Response(status_code=204, headers={"HX-Redirect": url})
    return RedirectResponse(url, status_code=303)


class ConsoleRoute(APIRoute):
    """Console refusals as pages: sign-in redirects, and problems as HTML of their status."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInRequired as exc:
                return redirect(sign_in_url(exc.next_path, expired=exc.expired), request)
            except Refused as exc:
                return _refusal(request, exc.status, exc.title, exc.detail, None)
            except ProblemError as exc:
                p = exc.problem
                return _refusal(request, p.status, p.title, p.detail, p.suggested_action)
            except RequestValidationError as exc:
                fields = "; ".join(f"{e.loc}: {e.msg}" for e in field_errors(exc.errors())[:5])
                return _refusal(request, 400, "Invalid", f"This page cannot take {fields}.", None)
            except StarletteHTTPException as exc:
                return await http_error_page(request, exc)
            except Exception:
                log.exception("console page failed", extra={"path": request.url.path[:256]})
                return _refusal(
                    request,
                    500,
                    "Something went wrong",
                    "The console could not show this page; the server's log has the details.",
                    "Try again; if it keeps failing, tell whoever runs this server.",
                )

        return answer


def _refusal(
    request: Request, status: int, title: str, detail: str, action: str | None
) -> Response:
    session = getattr(request.state, "console_session", None)
    return render(
        request,
        "refused.html",
        session,
        code=status,
        title=title,
        detail=detail,
        action=action,
    )


async def http_error_page(request: Request, exc: StarletteHTTPException) -> Response:
    """An HTTP error under ``/console`` as a page (the session's, when the request has a live
    one), with the error's headers (``Allow``); elsewhere the API's problem."""
    path = request.url.path
    if path != PREFIX and not path.startswith(PREFIX + "/"):
        return await answer_http_error(request, exc)
    if getattr(request.state, "console_session", None) is None:
        with contextlib.suppress(SignInRequired):
            await signed_in(request, request.app.state.door)
    shown = path if len(path) <= 200 else path[:200] + "…"
    if exc.status_code == 404:
        title, detail = "Not found", f"The console has no page at {shown}."
    elif exc.status_code == 405:
        title, detail = "Not allowed", f"The page at {shown} does not take {request.method}."
    else:
        title, detail = "Refused", str(exc.detail)
    page = _refusal(request, exc.status_code, title, detail, None)
    page.headers.update(exc.headers or {})
    return page
