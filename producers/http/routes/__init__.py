"""The API's routes, one router per resource."""

from __future__ import annotations

from fastapi import APIRouter

from toolledger.producers.http.routes import (
    approvals,
    calls,
    groups,
    health,
    jobs,
    problem_pages,
    runs,
    stats,
    switches,
    tool_calls,
    tools,
)

ROUTERS: tuple[APIRouter, ...] = (
    tool_calls.router,
    approvals.router,
    switches.router,
    stats.router,
    runs.router,
    jobs.router,
    calls.router,
    groups.router,
    tools.router,
    health.router,
    problem_pages.router,
)
