"""Signing in and out: ``/console/sign-in`` takes a bearer token of the API (the tokens file,
or a JWT where the server verifies them) and sets the session cookie (``HttpOnly``,
``SameSite=Strict``, ``Path=/console``, ``Secure`` over https); ``/console/sign-out`` ends
the session. Sign-ins count against the API's throttle of refused tokens: after too many from
one address the page answers ``429`` with ``Retry-After`` and checks nothing."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import Response

from toolledger.producers.http.auth import AuthFailure, Throttled, throttled_check
from toolledger.producers.http.console.guard import (
    PREFIX,
    SIGN_IN,
    CheckedForm,
    ConsoleRoute,
    read_form,
    redirect,
    refuse_cross_site,
    safe_next,
    sessions,
)
from toolledger.producers.http.console.pages import render
from toolledger.producers.http.console.sessions import COOKIE
from toolledger.producers.http.door import Door

log = logging.getLogger("toolledger.console")

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


@router.get(SIGN_IN)
async def sign_in_page(request: Request, next: str = PREFIX, expired: bool = False) -> Response:
    return render(request, "sign_in.html", None, next=safe_next(next), expired=expired)


@router.post(SIGN_IN)
async def sign_in(request: Request, door: Door) -> Response:
    refuse_cross_site(request)  # no session yet: the origin is what there is to check
    form = await read_form(request)
    next_path = safe_next(form.get("next"))
    checked = throttled_check(
        door.authenticator_in_force,
        door.auth_throttle,
        request.client.host if request.client else None,
        "Bearer " + form.get("token", "").strip(),
    )
    if isinstance(checked, Throttled):
        door.auth_failures.labels("throttled", "unchecked").inc()
        log.warning("console sign-in throttled", extra={"retry_after_s": checked.retry_after_s})
        page = render(
            request,
            "sign_in.html",
            None,
            code=429,
            next=next_path,
            failure=(
                "Too many sign-ins with a token that is not valid came from this address. "
                f"Try again in {checked.retry_after_s} s."
            ),
        )
        page.headers["Retry-After"] = str(checked.retry_after_s)
        return page
    if isinstance(checked, AuthFailure):
        door.auth_failures.labels(checked.reason, checked.kind).inc()
        log.warning("console sign-in failed", extra={"reason": checked.reason})
        message = "Enter a token." if checked.reason == "missing" else "This token is not known."
        return render(request, "sign_in.html", None, code=401, next=next_path, failure=message)
    store = sessions(request)
    store.drop(request.cookies.get(COOKIE))  # a new id on every sign-in (no fixation)
    session = store.create(form["token"].strip(), checked)
    log.info(
        "console sign-in",
        extra={"tenant": checked.tenant_id, "principal": checked.principal},
    )
    response = redirect(next_path, request)
    response.set_cookie(
        COOKIE,
        session.id,
        httponly=True,
        samesite="strict",
        path=PREFIX,
        secure=request.url.scheme == "https",
    )
    return response


@router.post(f"{PREFIX}/sign-out")
async def sign_out(request: Request, form: CheckedForm) -> Response:
    sessions(request).drop(request.cookies.get(COOKIE))
    response = redirect(SIGN_IN, request)
    response.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict")
    return response
