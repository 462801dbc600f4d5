"""Probes and metrics, without authentication: ``/healthz`` (the process answers), ``/readyz``
(its backends are ready) and ``/metrics`` (Prometheus)."""

from __future__ import annotations

import json

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response

from toolledger.producers.http.door import Door
from toolledger.producers.http.responses import JSON

router = APIRouter(tags=["health"])


@router.get("/healthz", operation_id="healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz", operation_id="readyz", responses={503: {"description": "A backend is not ready"}}
)
async def readyz(door: Door) -> Response:
    checks = await door.ready()
    ok = all(checks.values())
    return Response(
        json.dumps({"ready": ok, "checks": checks}).encode(),
        status_code=200 if ok else 503,
        media_type=JSON,
    )


@router.get("/metrics", operation_id="metrics", response_class=PlainTextResponse)
async def metrics(door: Door) -> Response:
    return Response(door.metrics.render(), media_type=door.metrics.content_type)
