"""Who is calling, as FastAPI dependencies: the bearer token's trusted context (401
UNAUTHENTICATED otherwise, 429 RATE_LIMITED after too many refused tokens from the client's
address) and the operator scopes (403 FORBIDDEN otherwise).

:data:`bearer` is a security scheme to FastAPI, so every operation that depends on it is
documented with the ``bearerAuth`` scheme (Swagger UI's Authorize button)."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import Depends, Request
from fastapi.openapi.models import HTTPBearer
from fastapi.security.base import SecurityBase

from toolledger.producers.approval_rules import GLOBAL_OPERATOR as GLOBAL_OPERATOR
from toolledger.producers.approval_rules import OPERATOR as OPERATOR
from toolledger.producers.client import TrustedContext
from toolledger.producers.http.auth import AuthFailure, Throttled, throttled_check
from toolledger.producers.http.door import Door, FrontDoor, door_of
from toolledger.producers.http.errors import ProblemError, refused
from toolledger.schemas.errors import ErrorCode

log = logging.getLogger("toolledger.http")

SCHEME = "bearerAuth"  # the security scheme's name in the OpenAPI document


def unauthenticated(door: FrontDoor, request: Request, failure: AuthFailure) -> ProblemError:
    """401, counted and logged (never with the token)."""
    door.auth_failures.labels(failure.reason, failure.kind).inc()
    log.log(
        logging.INFO if failure.reason == "missing" else logging.WARNING,
        "authentication failed",
        extra={
            "reason": failure.reason,
            "token_kind": failure.kind,
            "method": request.method,
            "path": request.url.path[:256],
            "client": request.client.host if request.client else None,
        },
    )
    challenge = "Bearer" if failure.reason == "missing" else 'Bearer error="invalid_token"'
    return refused(
        ErrorCode.UNAUTHENTICATED, failure.detail, headers={"WWW-Authenticate": challenge}
    )


def throttled(door: FrontDoor, request: Request, refusal: Throttled) -> ProblemError:
    """429 with ``Retry-After``: the token was not checked (counted and logged)."""
    door.auth_failures.labels("throttled", "unchecked").inc()
    log.warning(
        "authentication throttled",
        extra={
            "method": request.method,
            "path": request.url.path[:256],
            "client": request.client.host if request.client else None,
            "retry_after_s": refusal.retry_after_s,
        },
    )
    return refused(
        ErrorCode.RATE_LIMITED,
        refusal.detail,
        headers={"Retry-After": str(refusal.retry_after_s)},
    )


class BearerAuthentication(SecurityBase):
    """``Authorization: Bearer <token>``: the trusted context of the token, checked by the
    front door's authenticator (the tokens file, and JWTs when configured)."""

    def __init__(self) -> None:
        self.model = HTTPBearer(
            description="An opaque token of the tokens file or, where the server verifies "
            "JWTs, a JWT of the configured issuer.",
        )
        self.scheme_name = SCHEME

    async def __call__(self, request: Request) -> TrustedContext:
        door = await door_of(request)
        context = throttled_check(
            door.authenticator_in_force,
            door.auth_throttle,
            request.client.host if request.client else None,
            request.headers.get("authorization"),
        )
        if isinstance(context, Throttled):
            raise throttled(door, request, context)
        if isinstance(context, AuthFailure):
            raise unauthenticated(door, request, context)
        return context


bearer = BearerAuthentication()
Authenticated = Annotated[TrustedContext, Depends(bearer)]


async def operator(context: Authenticated, door: Door) -> TrustedContext:
    if OPERATOR not in context.scopes and GLOBAL_OPERATOR not in context.scopes:
        door.metrics.rejections.labels("-", ErrorCode.FORBIDDEN.value).inc()
        raise refused(ErrorCode.FORBIDDEN, "This needs the scope 'operator'.")
    return context


Operator = Annotated[TrustedContext, Depends(operator)]


def tenant_of(context: TrustedContext) -> str | None:
    """The tenant an operator acts on: its own, or every tenant (``None``) for a global one."""
    return None if GLOBAL_OPERATOR in context.scopes else context.tenant_id
