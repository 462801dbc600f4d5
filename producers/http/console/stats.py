"""The stats of ``/v1/stats`` for operators: the current numbers per tool, and charts of the
totals over time (success rate, validation failure rate, duplicate rate, UNKNOWN count, human
rejection rate, calls per run). An operator sees its tenant; ``operator:global`` every
tenant, as ``GET /v1/stats`` answers them."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import Response

from toolledger.producers.http.access import tenant_of
from toolledger.producers.http.console.charts import (
    BOTTOM,
    HEIGHT,
    LEFT,
    RIGHT,
    SAMPLE_S,
    TOP,
    WIDTH,
    History,
)
from toolledger.producers.http.console.guard import PREFIX, ConsoleRoute, Signed, require_operator
from toolledger.producers.http.console.pages import render
from toolledger.producers.http.door import FrontDoor

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


@router.get(f"{PREFIX}/stats")
async def stats_page(request: Request, session: Signed) -> Response:
    require_operator(session, "stats page")
    door: FrontDoor = request.app.state.door
    history: History = request.app.state.console_stats
    scope = tenant_of(session.context)
    stats = await door.queries.stats(scope)
    history.add(scope, datetime.now(UTC), stats.totals)
    return render(
        request,
        "stats.html",
        session,
        stats=stats,
        charts=history.charts(scope),
        sample_s=SAMPLE_S,
        width=WIDTH,
        height=HEIGHT,
        left=LEFT,
        right=RIGHT,
        top_margin=TOP,
        bottom=BOTTOM,
    )
