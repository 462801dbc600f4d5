"""``GET /v1/runs/{run_id}/report``: the evaluation report of a run (docs/evaluation.md) of the
caller's tenant, as JSON, Markdown or HTML (``format``); ``operator:global`` reads another
tenant's run (``tenant``). A run with nothing recorded answers an empty report, as a search
finds nothing: run ids are the agents' own, not the ledger's."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from toolledger.producers.http.access import GLOBAL_OPERATOR, Authenticated
from toolledger.producers.http.door import Door
from toolledger.producers.http.errors import refused
from toolledger.producers.http.models import NO_CONTROL
from toolledger.producers.http.openapi import ERRORS
from toolledger.schemas.errors import ErrorCode
from toolledger.schemas.evaluation import Format, render, report_of

router = APIRouter(tags=["runs"])

MEDIA_TYPES: dict[Format, str] = {
    "json": "application/json",
    "md": "text/markdown; charset=utf-8",
    "html": "text/html; charset=utf-8",
}


_REPORT = {
    200: {
        "description": "The run's evaluation report, in the format asked for",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/markdown": {"schema": {"type": "string"}},
            "text/html": {"schema": {"type": "string"}},
        },
    },
    **ERRORS,
}


@router.get("/v1/runs/{run_id}/report", operation_id="getRunReport", responses=_REPORT)
async def run_report(
    door: Door,
    context: Authenticated,
    run_id: Annotated[str, Path(max_length=255, pattern=NO_CONTROL)],
    form: Annotated[Format, Query(alias="format")] = "json",
    tenant: Annotated[str | None, Query(max_length=128, pattern=NO_CONTROL)] = None,
) -> Response:
    if tenant is not None and tenant != context.tenant_id and GLOBAL_OPERATOR not in context.scopes:
        raise refused(ErrorCode.FORBIDDEN, "Only 'operator:global' reads other tenants' runs.")
    tenant_id = tenant if tenant is not None else context.tenant_id
    facts = await door.queries.run_facts(tenant_id, run_id)
    report = report_of(facts, tenant_id=tenant_id, run_id=run_id)
    return Response(render(report, form).encode(), media_type=MEDIA_TYPES[form])
