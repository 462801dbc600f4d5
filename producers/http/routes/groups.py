"""Call groups: ``POST /v1/groups`` (the ``Idempotency-Key`` is the group's key), the group
resource ``GET /v1/groups/{group_id}``, the search ``GET /v1/groups?run_id=`` and
``POST /v1/groups/{group_id}/resume``. Another tenant's group is not found, never forbidden."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from toolledger.producers.http.access import Authenticated
from toolledger.producers.http.call_input import required_key
from toolledger.producers.http.door import Door, FrontDoor
from toolledger.producers.http.errors import ProblemError, not_found, refused
from toolledger.producers.http.headers import JsonBodyError, strict_json, wait_seconds
from toolledger.producers.http.models import NO_CONTROL
from toolledger.producers.http.openapi import ERRORS
from toolledger.producers.http.problems import problem
from toolledger.producers.http.responses import JSON, read_capped
from toolledger.schemas.errors import ErrorCode
from toolledger.schemas.groups import GroupAnswer, GroupService, GroupView
from toolledger.schemas.nesting import NestingTooDeep, check_text_depth

GROUP_ID = re.compile(r"grp_[0-9a-f]{32}")
MAX_GROUP_BODY_BYTES = 4 << 20
_NO_GROUP = "Check the group id (groups of other tenants are not visible to this token)."

router = APIRouter(tags=["groups"])


def _groups(door: FrontDoor) -> GroupService:
    if door.groups is None:
        raise refused(
            ErrorCode.INTERNAL,
            "Call groups are not available on this backend yet: they run on the embedded "
            "ledger (toolledger serve --data DIR).",
            status=501,
        )
    return door.groups


async def _json_body(request: Request, what: str, envelope: int) -> Any:
    """The body as JSON; ``what`` sits ``envelope`` levels down and may nest no deeper than
    its limit (``schemas.nesting``)."""
    raw = await read_capped(request, MAX_GROUP_BODY_BYTES)
    if raw is None:
        raise refused(
            ErrorCode.PAYLOAD_TOO_LARGE, f"The body is larger than {MAX_GROUP_BODY_BYTES} bytes."
        )
    if not raw.strip():
        return {}
    try:
        check_text_depth(raw, what, envelope=envelope)
        return strict_json(raw)
    except (JsonBodyError, NestingTooDeep) as exc:
        raise refused(ErrorCode.VALIDATION_FAILED, str(exc)) from None


def _answer(answer: GroupAnswer) -> Response:
    if answer.error is not None:
        if answer.error.code == "NOT_FOUND":
            raise not_found(answer.error.message, _NO_GROUP)
        status = 409 if answer.error.code == "GROUP_NOT_RESUMABLE" else None
        raise ProblemError(problem(answer.error, status=status, errors=list(answer.field_errors)))
    assert answer.view is not None
    view = answer.view
    headers = {"Location": f"/v1/groups/{view.group_id}"}
    if answer.replayed:
        headers["Idempotent-Replayed"] = "true"
    status = 200 if view.finished else 202
    return Response(view.model_dump_json(), status_code=status, media_type=JSON, headers=headers)


@router.post(
    "/v1/groups",
    operation_id="submitGroup",
    responses={200: {"model": GroupView}, 202: {"model": GroupView}, **ERRORS},
)
async def submit_group(request: Request, door: Door, context: Authenticated) -> Response:
    """Run a group of dependent calls: each step an ordinary ledgered call under a key derived
    from the group's key and the step id; independent steps run concurrently."""
    groups = _groups(door)
    key = required_key(request, "A group needs an Idempotency-Key header: it is the group's key.")
    # {"steps": [{"arguments": ...}]}
    body = await _json_body(request, "a step's arguments", envelope=3)
    answer = await groups.submit(
        tenant_id=context.tenant_id,
        principal=context.principal,
        scopes=sorted(context.scopes),
        group_key=key,
        body=body,
        wait_s=wait_seconds(request.headers.getlist("prefer")),
    )
    return _answer(answer)


@router.get(
    "/v1/groups/{group_id}",
    operation_id="getGroup",
    responses={200: {"model": GroupView}, **ERRORS},
)
async def get_group(group_id: str, door: Door, context: Authenticated) -> Response:
    groups = _groups(door)
    view = await groups.view(context.tenant_id, group_id) if GROUP_ID.fullmatch(group_id) else None
    if view is None:
        raise not_found("No group with this id.", _NO_GROUP)
    return Response(view.model_dump_json(), media_type=JSON)


@router.get("/v1/groups", operation_id="searchGroups", responses=ERRORS)
async def search_groups(
    door: Door,
    context: Authenticated,
    run_id: Annotated[str | None, Query(max_length=255, pattern=NO_CONTROL)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Response:
    found = await _groups(door).search(context.tenant_id, run_id, limit)
    items = ",".join(v.model_dump_json() for v in found)
    return Response(f'{{"items":[{items}]}}', media_type=JSON)


@router.post(
    "/v1/groups/{group_id}/resume",
    operation_id="resumeGroup",
    responses={200: {"model": GroupView}, 202: {"model": GroupView}, **ERRORS},
)
async def resume_group(
    group_id: str, request: Request, door: Door, context: Authenticated
) -> Response:
    """Continue a BLOCKED or FAILED group from its completion point: completed steps are not
    run again. Body (optional): ``{"approval_tokens": {"<step id>": "<token>"}}`` for steps
    that waited for an approval."""
    groups = _groups(door)
    if not GROUP_ID.fullmatch(group_id):
        raise not_found("No group with this id.", _NO_GROUP)
    body = await _json_body(request, "the body", envelope=0)
    tokens = body.get("approval_tokens", {}) if isinstance(body, dict) else None
    if not isinstance(tokens, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in tokens.items()
    ):
        raise refused(
            ErrorCode.VALIDATION_FAILED,
            "approval_tokens must be an object of step ids to approval tokens.",
        )
    answer = await groups.resume(
        context.tenant_id, group_id, tokens, wait_seconds(request.headers.getlist("prefer"))
    )
    return _answer(answer)
