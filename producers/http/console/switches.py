"""Kill switches: the state of every tool's switch for the operator's tenant (and the global
ones), and a toggle per tool, for the tenant or (``operator:global``) every tenant, with a
reason. The change is ``producers.http.switch_changes``, as for ``PUT /v1/tools/{tool}/switch``."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import Response

from toolledger.producers import governance
from toolledger.producers.http import switch_changes
from toolledger.producers.http.access import GLOBAL_OPERATOR
from toolledger.producers.http.console.guard import (
    PREFIX,
    CheckedForm,
    ConsoleRoute,
    Refused,
    Signed,
    redirect,
    require_operator,
)
from toolledger.producers.http.console.pages import render
from toolledger.producers.http.door import FrontDoor
from toolledger.producers.http.operator_input import switchable_tool
from toolledger.schemas.calls import ANY, SwitchView, effective_switch

PAGE = f"{PREFIX}/switches"

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


@dataclass(frozen=True, slots=True)
class Row:
    tool: str
    tenant: SwitchView | None  # the tenant's own switch of this tool
    every_tenant: SwitchView | None  # the global one
    off_by: SwitchView | None  # what keeps the tool off for the tenant, if anything


def latest(switches: list[SwitchView]) -> dict[tuple[str, str], SwitchView]:
    found: dict[tuple[str, str], SwitchView] = {}
    for seen in switches:
        current = found.get((seen.tenant_id, seen.tool))
        if current is None or seen.changed_at >= current.changed_at:
            found[(seen.tenant_id, seen.tool)] = seen
    return found


@router.get(PAGE)
async def switches_page(request: Request, session: Signed, done: str = "") -> Response:
    require_operator(session, "switches page")
    door: FrontDoor = request.app.state.door
    tenant = session.context.tenant_id
    switches = await door.queries.switches(tenant)
    by_pair = latest(switches)
    rows = [
        Row(
            tool,
            by_pair.get((tenant, tool)),
            by_pair.get((ANY, tool)),
            effective_switch(switches, tenant, tool),
        )
        for tool in [ANY, *sorted(door.tools)]
    ]
    return render(
        request,
        "switches.html",
        session,
        rows=rows,
        is_global=GLOBAL_OPERATOR in session.context.scopes,
        done=done if done in {"changed", "changed-later"} else "",
        max_reason=governance.MAX_REASON_CHARS,
    )


@router.post(PAGE)
async def change(request: Request, session: Signed, form: CheckedForm) -> Response:
    require_operator(session, "switches page")
    door: FrontDoor = request.app.state.door
    tool = await switchable_tool(form.get("tool", ""), door)
    reason = form.get("reason", "").strip()
    enabled = form.get("enabled")
    scope = form.get("scope", "tenant")
    if enabled not in {"true", "false"} or scope not in {"tenant", "global"}:
        raise Refused(400, "Invalid", "Choose on or off, for the tenant or every tenant.")
    if not 1 <= len(reason) <= governance.MAX_REASON_CHARS:
        raise Refused(
            400, "Invalid", f"Give a reason of 1 to {governance.MAX_REASON_CHARS} characters."
        )
    switched = await switch_changes.switch(
        door,
        session.context,
        tool,
        enabled=enabled == "true",
        reason=reason,
        scope="global" if scope == "global" else "tenant",
    )
    done = "changed" if switched.confirmed else "changed-later"
    return redirect(f"{PAGE}?done={done}", request)
