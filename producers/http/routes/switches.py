"""The kill switch: ``PUT /v1/tools/{tool}/switch`` turns a tool (or ``*``, every tool) off or
on for the operator's tenant, or with ``operator:global`` for every tenant."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from toolledger.producers import governance
from toolledger.producers.http import switch_changes
from toolledger.producers.http.access import Operator
from toolledger.producers.http.door import Door
from toolledger.producers.http.openapi import documented, request_body
from toolledger.producers.http.operator_input import SwitchableTool, json_body
from toolledger.producers.http.responses import json_response

router = APIRouter(tags=["switches"])


class SwitchBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    enabled: bool
    reason: Annotated[str, Field(min_length=1, max_length=governance.MAX_REASON_CHARS)]
    scope: Literal["tenant", "global"] = "tenant"


switch_body = json_body(SwitchBody)


@router.put(
    "/v1/tools/{tool}/switch",
    operation_id="setToolSwitch",
    responses=documented(200, 202),
    openapi_extra=request_body(SwitchBody.model_json_schema()),
)
async def switch_tool(
    door: Door,
    context: Operator,
    tool: SwitchableTool,
    body: Annotated[SwitchBody, Depends(switch_body)],
) -> Response:
    switched = await switch_changes.switch(
        door, context, tool, enabled=body.enabled, reason=body.reason, scope=body.scope
    )
    return json_response(
        {**switched.view.to_json(), "scope": body.scope, "confirmed": switched.confirmed},
        status=200 if switched.confirmed else 202,
    )
