"""The kill switch: ``PUT /v1/tools/{tool}/switch`` turns a tool (or ``*``, every tool) off or
on for the operator's tenant, or with ``operator:global`` for every tenant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from producers import governance
from producers.http.access import GLOBAL_OPERATOR, Operator
from producers.http.door import Door
from producers.http.errors import refused
from producers.http.governance import PROJECTION_WAIT_S, applied_within, command
from producers.http.openapi import documented, request_body
from producers.http.operator_input import SwitchableTool, json_body
from producers.http.responses import json_response
from schemas.calls import SwitchView
from schemas.errors import ErrorCode

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
    if body.scope == "global" and GLOBAL_OPERATOR not in context.scopes:
        raise refused(
            ErrorCode.FORBIDDEN, "Switching a tool off for every tenant needs 'operator:global'."
        )
    target = "*" if body.scope == "global" else context.tenant_id
    # the latest change wins by time: never stamp one before the change it follows, even
    # when this front door's clock is behind the one that made that change
    now = datetime.now(UTC)
    for seen in await door.queries.switches(context.tenant_id):
        if (seen.tenant_id, seen.tool) == (target, tool):
            now = max(now, seen.changed_at + timedelta(microseconds=1))
    record = governance.switch(
        tenant_id=target,
        tool=tool,
        enabled=body.enabled,
        actor=context.principal,
        reason=body.reason,
        now=now,
    )
    answer = await command(door, record, broadcast=True)
    if answer is not None:  # the front door's pre-check reads the projection: let it catch up
        await applied_within(door.queries, answer.event_id, PROJECTION_WAIT_S)
    door.switch_cache.clear()
    door.metrics.operator_actions.labels("enable" if body.enabled else "disable").inc()
    env = record.envelope
    view = SwitchView(
        tenant_id=env.tenant_id,
        tool=env.tool,
        enabled=body.enabled,
        reason=body.reason,
        actor=context.principal,
        changed_at=env.occurred_at,
    )
    return json_response(
        {**view.to_json(), "scope": body.scope, "confirmed": answer is not None},
        status=200 if answer is not None else 202,
    )
