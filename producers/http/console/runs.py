"""A run's page: its evaluation report (docs/evaluation.md), as ``GET /v1/runs/{run_id}/report``
answers it for the session's tenant, with a form to open another run's."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse, Response
from markupsafe import Markup

from toolledger.producers.http.console.guard import PREFIX, ConsoleRoute, Signed
from toolledger.producers.http.console.pages import render
from toolledger.producers.http.door import FrontDoor
from toolledger.schemas.evaluation import report_of, to_html_fragment

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


@router.get(f"{PREFIX}/runs")
async def runs_page(
    request: Request, session: Signed, run_id: Annotated[str, Query(max_length=255)] = ""
) -> Response:
    """The form; with a run id, that run's page."""
    if run_id.strip():
        return RedirectResponse(request.url_for("run_page", run_id=run_id.strip()), 303)
    return render(request, "run.html", session, run_id="", report=None, sections=None)


@router.get(f"{PREFIX}/runs/{{run_id}}", name="run_page")
async def run_page(request: Request, session: Signed, run_id: str) -> Response:
    door: FrontDoor = request.app.state.door
    tenant_id = session.context.tenant_id
    report = report_of(
        await door.queries.run_facts(tenant_id, run_id), tenant_id=tenant_id, run_id=run_id
    )
    # the fragment escapes every value it shows (schemas.evaluation.to_html_fragment)
    sections = Markup(to_html_fragment(report))
    return render(request, "run.html", session, run_id=run_id, report=report, sections=sections)
