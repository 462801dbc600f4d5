"""Group events as JSON documents, as the group log stores them.

A :class:`GroupSubmitted` is stored as its submission body and parsed again, with the tools in
force, when the log is read (the definition holds each tool's facts, which are code). A body
that no longer parses (a tool was removed) is a :class:`GroupDecodeError` naming why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from datetime import datetime
from typing import Any

from toolledger.processors.groups.core import (
    CompensationFinished,
    CompensationStarted,
    CompletionPoint,
    GroupEvent,
    GroupFinished,
    GroupResumed,
    GroupStatus,
    GroupSubmitted,
    StepFailure,
    StepFinished,
    StepStarted,
    StepStatus,
)
from toolledger.processors.groups.definition import InvalidGroup, parse_group
from toolledger.processors.groups.facts import StepTool
from toolledger.schemas.errors import ErrorInfo


class GroupDecodeError(ValueError):
    pass


def encode_event(event: GroupEvent, at: datetime | None = None) -> str:
    """The stored form of ``event``; ``at``: when it was appended (the read model's
    ``updated_at``, so a rebuild of the read model from the log gives the same rows)."""
    body: dict[str, Any]
    if isinstance(event, GroupSubmitted):
        body = {"group_key": event.group_key, "body": event.definition.as_body()}
    elif isinstance(event, StepFinished | CompensationFinished):
        body = {
            "step_id": event.step_id,
            "status": event.status.value,
            "result_json": event.result_json,
            "error": event.error.model_dump() if event.error else None,
            "approval_request_id": event.approval_request_id,
        }
    elif isinstance(event, GroupFinished):
        body = {"status": event.status.value, "completion_point": completion_json(event)}
    else:  # StepStarted, CompensationStarted, GroupResumed: plain fields
        body = asdict(event)
    stamped = {} if at is None else {"at": at.isoformat()}
    return json.dumps({"type": type(event).__name__, **body, **stamped}, separators=(",", ":"))


def appended_at(text: str) -> datetime | None:
    """When a stored event was appended (None: stored before events carried their time)."""
    at = json.loads(text).get("at")
    return datetime.fromisoformat(at) if isinstance(at, str) else None


def completion_json(event: GroupFinished) -> dict[str, Any]:
    point = event.completion_point
    failure = point.failure
    return {
        "succeeded": list(point.succeeded),
        "failed": list(point.failed),
        "skipped": list(point.skipped),
        "compensated": list(point.compensated),
        "left_done": list(point.left_done),
        "irreversible": list(point.irreversible),
        "compensation_failed": list(point.compensation_failed),
        "uncompensated": list(point.uncompensated),
        "failure": None
        if failure is None
        else {
            "step_id": failure.step_id,
            "status": failure.status.value,
            "error": failure.error.model_dump() if failure.error else None,
        },
    }


def decode_event(text: str, tools: Mapping[str, StepTool], max_steps: int) -> GroupEvent:
    data = json.loads(text)
    kind = data.pop("type")
    data.pop("at", None)
    if kind == "GroupSubmitted":
        definition = parse_group(data["body"], tools, max_steps=max_steps)
        if isinstance(definition, InvalidGroup):
            problems = "; ".join(f"{e.loc}: {e.msg}" for e in definition.field_errors[:5])
            raise GroupDecodeError(f"the stored group no longer parses: {problems}")
        return GroupSubmitted(data["group_key"], definition)
    if kind in ("StepFinished", "CompensationFinished"):
        finished = StepFinished if kind == "StepFinished" else CompensationFinished
        return finished(
            data["step_id"],
            StepStatus(data["status"]),
            data["result_json"],
            ErrorInfo.model_validate(data["error"]) if data["error"] else None,
            data["approval_request_id"],
        )
    if kind == "GroupFinished":
        return GroupFinished(GroupStatus(data["status"]), _point(data["completion_point"]))
    if kind == "StepStarted":
        return StepStarted(**data)
    if kind == "CompensationStarted":
        return CompensationStarted(**data)
    if kind == "GroupResumed":
        return GroupResumed()
    raise GroupDecodeError(f"unknown group event type {kind!r}")


def _point(data: dict[str, Any]) -> CompletionPoint:
    failure = data.pop("failure")
    return CompletionPoint(
        **{k: tuple(v) for k, v in data.items()},
        failure=None
        if failure is None
        else StepFailure(
            failure["step_id"],
            StepStatus(failure["status"]),
            ErrorInfo.model_validate(failure["error"]) if failure["error"] else None,
        ),
    )
