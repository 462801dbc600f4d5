"""Call groups: the search by run id and a group's page (its steps, their calls, approvals and
compensations, and the completion point). A call's job is on the call's page."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from toolledger.producers.http.console.guard import PREFIX, ConsoleRoute, Refused, Signed
from toolledger.producers.http.console.pages import render
from toolledger.producers.http.door import FrontDoor
from toolledger.producers.http.routes.groups import GROUP_ID
from toolledger.schemas.groups import GroupService

PAGE = 50

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


def _groups(request: Request) -> GroupService | None:
    door: FrontDoor = request.app.state.door
    return door.groups


@router.get(f"{PREFIX}/groups")
async def groups_page(
    request: Request, session: Signed, run_id: Annotated[str, Query(max_length=255)] = ""
) -> Response:
    groups = _groups(request)
    found = None
    if groups is not None and run_id.strip():
        found = await groups.search(session.context.tenant_id, run_id.strip(), PAGE)
    return render(
        request,
        "groups.html",
        session,
        available=groups is not None,
        run_id=run_id.strip(),
        found=found,
    )


@router.get(f"{PREFIX}/groups/{{group_id}}")
async def group_page(request: Request, session: Signed, group_id: str) -> Response:
    groups = _groups(request)
    view = None
    if groups is not None and GROUP_ID.fullmatch(group_id):
        view = await groups.view(session.context.tenant_id, group_id)
    if view is None:
        raise Refused(404, "Not found", "No group with this id in your tenant.")
    return render(request, "group.html", session, group=view)
