"""``GET /v1/tools``: the registered tools' manifests (what they do, their effect and risk,
their arguments and result schemas, each with its key retention and key scope), and the
ledger's default key retention and key scope."""

from __future__ import annotations

import json

from fastapi import APIRouter
from fastapi.responses import Response

from toolledger.producers.http.access import Authenticated
from toolledger.producers.http.door import Door
from toolledger.producers.http.models import ToolPage
from toolledger.producers.http.openapi import ERRORS
from toolledger.producers.http.responses import JSON

router = APIRouter(tags=["tools"])


@router.get("/v1/tools", operation_id="listTools", responses={200: {"model": ToolPage}, **ERRORS})
async def list_tools(door: Door, context: Authenticated) -> Response:
    body = {
        "items": [t.manifest for t in door.tools.values()],
        "next_cursor": None,
        "key_retention": door.key_retention,
        "key_retention_seconds": door.key_retention_seconds,
        "key_scope": door.key_scope,
    }
    return Response(json.dumps(body, separators=(",", ":")).encode(), media_type=JSON)
