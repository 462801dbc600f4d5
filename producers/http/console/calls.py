"""Calls: the tenant's recent calls (newest first, before any search), the search (by call
id, idempotency key, run id, tool, status and time) and a call's page (its timeline of
redacted events, attempts, errors, downstream request ids, approval and job). Reads go
through ``door.queries`` with the session's tenant: another tenant's call is not found."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from toolledger.producers.http.call_views import awaiting_approval_view, read_only_view
from toolledger.producers.http.console.guard import PREFIX, ConsoleRoute, Refused, Signed
from toolledger.producers.http.console.pages import render
from toolledger.producers.http.door import FrontDoor
from toolledger.producers.http.routes.calls import CALL_ID
from toolledger.schemas.calls import CallFilter, CallView, decode_cursor
from toolledger.schemas.status import CallStatus

PAGE = 50
SCAN_PAGE = 500
SCAN_LIMIT = 2_000  # a time range is applied to at most this many matching calls
FOREIGN_LINK = "The page link is not one this console gave out."

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)
Text = Annotated[str, Query(max_length=255)]


@dataclass(frozen=True, slots=True)
class Found:
    items: list[CallView]
    next_cursor: str | None = None
    scanned_all: bool = True  # False: the time range was applied to the first SCAN_LIMIT


def _moment(value: str) -> datetime | None:
    """A ``datetime-local`` value (UTC), or None."""
    try:
        return datetime.fromisoformat(value).replace(tzinfo=UTC) if value else None
    except ValueError:
        return None


async def find_call(door: FrontDoor, tenant_id: str, call_id: str) -> CallView | None:
    """The call as ``GET /v1/calls/{call_id}`` finds it for ``tenant_id``."""
    if not CALL_ID.fullmatch(call_id):
        return None
    return (
        await door.queries.get(tenant_id, call_id)
        or await read_only_view(door, tenant_id, call_id)
        or await awaiting_approval_view(door, tenant_id, call_id)
    )


async def _in_range(
    door: FrontDoor,
    tenant_id: str,
    where: CallFilter,
    since: datetime | None,
    until: datetime | None,
) -> Found:
    kept: list[CallView] = []
    after, scanned = None, 0
    while scanned < SCAN_LIMIT:
        page = await door.queries.search(tenant_id, where, limit=SCAN_PAGE, after=after)
        scanned += len(page.items)
        kept += [
            v
            for v in page.items
            if (since is None or v.created_at >= since) and (until is None or v.created_at < until)
        ]
        if page.next_cursor is None:
            break
        after = decode_cursor(page.next_cursor)
    kept.sort(key=lambda v: v.created_at, reverse=True)
    return Found(kept[:PAGE], None, scanned_all=scanned < SCAN_LIMIT)


async def recent(door: FrontDoor, tenant_id: str, cursor: str) -> Found:
    try:
        page = await door.queries.recent(tenant_id, limit=PAGE, before=cursor or None)
    except ValueError:
        raise Refused(400, "Invalid", FOREIGN_LINK) from None
    return Found(page.items, page.next_cursor)


async def search(door: FrontDoor, tenant_id: str, fields: dict[str, str], cursor: str) -> Found:
    if fields["call_id"]:
        found = await find_call(door, tenant_id, fields["call_id"])
        return Found([found] if found else [])
    where = CallFilter(
        fields["tool"] or None,
        fields["key"] or None,
        fields["run_id"] or None,
        CallStatus(fields["status"]) if fields["status"] else None,
    )
    since, until = _moment(fields["since"]), _moment(fields["until"])
    if since is not None or until is not None:
        return await _in_range(door, tenant_id, where, since, until)
    try:
        after = decode_cursor(cursor) if cursor else None
    except ValueError:
        raise Refused(400, "Invalid", FOREIGN_LINK) from None
    page = await door.queries.search(tenant_id, where, limit=PAGE, after=after)
    if not page.items and where.tool and where.idempotency_key and after is None:
        # a call waiting for a human has no row yet: find it by its key's approval request
        asked = await door.queries.key_approval(
            tenant_id, where.tool, where.idempotency_key, now=datetime.now(UTC)
        )
        waiting = await find_call(door, tenant_id, asked.call_id) if asked else None
        return Found([waiting] if waiting else [])
    return Found(page.items, page.next_cursor)


@router.get(PREFIX)
async def home(request: Request, session: Signed) -> Response:
    return await calls_page(request, session)


@router.get(f"{PREFIX}/calls")
async def calls_page(
    request: Request,
    session: Signed,
    call_id: Text = "",
    key: Text = "",
    run_id: Text = "",
    tool: Text = "",
    status: Text = "",
    since: Text = "",
    until: Text = "",
    cursor: Text = "",
) -> Response:
    door: FrontDoor = request.app.state.door
    fields = {
        "call_id": call_id.strip(),
        "key": key.strip(),
        "run_id": run_id.strip(),
        "tool": tool.strip(),
        "status": status if status in {s.value for s in CallStatus} else "",
        "since": since,
        "until": until,
    }
    tenant = session.context.tenant_id
    searched = any(fields.values())
    if searched:
        found = await search(door, tenant, fields, cursor)
    else:
        found = await recent(door, tenant, cursor)
    return render(
        request,
        "calls.html",
        session,
        fields=fields,
        searched=searched,
        paged=bool(cursor),
        found=found,
        tools=sorted(door.tools),
        statuses=[s.value for s in CallStatus],
        scan_limit=SCAN_LIMIT,
    )


def _decoded(event: dict[str, Any]) -> dict[str, Any]:
    """An event's own fields (the envelope aside), JSON strings decoded for reading."""
    shown: dict[str, Any] = {}
    for name, value in event.items():
        if name in {"type", "envelope"} or value is None:
            continue
        if name.endswith("_json") and isinstance(value, str):
            with contextlib.suppress(ValueError):
                name, value = name.removesuffix("_json"), json.loads(value)
        shown[name] = value
    return shown


def attempts_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per attempt: its round, when it started and how it ended. Only
    ``ToolCallStarted`` names the round: an outcome belongs to the round last started."""
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    current_round = 0
    for event in events:
        attempt = event.get("attempt")
        if not isinstance(attempt, int):
            continue
        if event["type"] == "ToolCallStarted":
            current_round = int(event["round"])
        row = rows.setdefault(
            (current_round, attempt),
            {
                "attempt": attempt,
                "round": current_round or None,
                "started_at": None,
                "outcome": None,
                "ended_at": None,
                "duration_ms": None,
                "error": None,
            },
        )
        at = event["envelope"]["occurred_at"]
        if event["type"] == "ToolCallStarted":
            row["started_at"] = at
            continue
        row.update(outcome=event["type"], ended_at=at, duration_ms=event.get("duration_ms"))
        error = event.get("error")
        if isinstance(error, dict):
            row["error"] = f"{error.get('code')}: {error.get('message')}"
        elif isinstance(event.get("reason"), str):  # an outcome unknown: why
            row["error"] = event["reason"]
    return list(rows.values())


@router.get(f"{PREFIX}/calls/{{call_id}}")
async def call_page(request: Request, session: Signed, call_id: str) -> Response:
    door: FrontDoor = request.app.state.door
    tenant = session.context.tenant_id
    view = await find_call(door, tenant, call_id)
    if view is None:
        raise Refused(404, "Not found", "No call with this id in your tenant.")
    events = await door.queries.events(tenant, call_id) or []
    approval = await door.queries.call_approval(tenant, call_id, now=datetime.now(UTC))
    downstream = sorted(
        {str(e["downstream_request_id"]) for e in events if e.get("downstream_request_id")}
    )
    return render(
        request,
        "call.html",
        session,
        call=view,
        timeline=[(e["envelope"]["occurred_at"], e["type"], _decoded(e)) for e in events],
        attempts=attempts_of(events),
        downstream=downstream,
        approval=approval,
    )
