"""``GET /v1/stats``: the calls' metrics of the caller's tenant; ``operator:global`` reads
another tenant's, or every tenant's together."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from toolledger.producers.http.access import GLOBAL_OPERATOR, Authenticated
from toolledger.producers.http.door import Door
from toolledger.producers.http.errors import refused
from toolledger.producers.http.models import NO_CONTROL
from toolledger.producers.http.openapi import documented
from toolledger.producers.http.responses import json_response
from toolledger.schemas.errors import ErrorCode

router = APIRouter(tags=["stats"])


@router.get("/v1/stats", operation_id="getStats", responses=documented(200))
async def stats(
    door: Door,
    context: Authenticated,
    tenant: Annotated[str | None, Query(max_length=128, pattern=NO_CONTROL)] = None,
) -> Response:
    every_tenant = GLOBAL_OPERATOR in context.scopes
    if tenant is not None and tenant != context.tenant_id and not every_tenant:
        raise refused(ErrorCode.FORBIDDEN, "Only 'operator:global' reads other tenants' metrics.")
    scope = tenant if tenant is not None else (None if every_tenant else context.tenant_id)
    return json_response((await door.queries.stats(scope)).to_json())
