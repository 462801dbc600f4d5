"""The group resource built from a group's state (pure: time comes in as data)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from toolledger.processors.groups.codec import completion_json
from toolledger.processors.groups.core import GroupFinished, GroupState, StepStatus, step_status
from toolledger.processors.groups.definition import compensation_key, step_key
from toolledger.processors.groups.facts import StepTool
from toolledger.schemas.groups import CompensationView, GroupStepView, GroupView
from toolledger.schemas.keys import DEFAULT_KEY_SCOPE, CallKey


@dataclass(frozen=True, slots=True)
class GroupMeta:
    """Who submitted the group and when: what its calls run as, after a restart too."""

    group_id: str
    tenant_id: str
    principal: str
    scopes: tuple[str, ...]
    group_key: str
    created_at: datetime


def group_view(
    meta: GroupMeta, state: GroupState, updated_at: datetime, tools: Mapping[str, StepTool]
) -> GroupView:
    """``tools``: the tools' facts, for the key scope of each call's key (a compensating tool
    need not be a step's)."""
    definition = state.definition

    def call_id(tool: str, key: str) -> str:
        facts = tools.get(tool)
        scope = DEFAULT_KEY_SCOPE if facts is None else facts.key_scope
        return CallKey.scoped(scope, meta.tenant_id, meta.principal, tool, key).call_id

    steps = []
    for step in definition.steps:
        record = state.step(step.id)
        status = step_status(state, step.id)
        step_call = None
        if record.call.started and step.facts.keyed:
            step_call = call_id(step.tool, step_key(meta.group_key, step.id))
        compensation = None
        spec = step.facts.compensation
        if spec is not None and record.compensation.started:
            key = compensation_key(meta.group_key, step.id)
            compensation = CompensationView(
                status=record.compensation.status.value,
                call_id=call_id(spec.tool, key),
            )
        blocked = record.call.status is StepStatus.BLOCKED and status is StepStatus.BLOCKED
        steps.append(
            GroupStepView(
                id=step.id,
                tool=step.tool,
                status=status.value,
                call_id=step_call,
                result=json.loads(record.call.result_json) if record.call.result_json else None,
                error=record.call.error,
                depends_on=list(step.depends_on),
                compensation=compensation,
                approval_request={"id": record.call.approval_request_id} if blocked else None,
            )
        )
    point = None
    if state.finished is not None and state.completion is not None:
        point = completion_json(GroupFinished(state.finished, state.completion))
    return GroupView(
        group_id=meta.group_id,
        status=state.status.value,
        run_id=definition.run_id,
        on_failure=definition.on_failure.value,
        idempotency_key=meta.group_key,
        created_at=meta.created_at,
        updated_at=updated_at,
        steps=steps,
        completion_point=point,
    )
