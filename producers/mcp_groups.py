"""Call groups over MCP: three tools beside the ledger's own, served when the backend runs
groups (the same :class:`~schemas.groups.GroupService` as ``POST /v1/groups``):

* ``toolledger_run_group``: submit a group under an idempotency key (the group's key), wait
  up to the server's wait for it to finish or block, and answer the group resource;
* ``toolledger_get_group``: the group resource, to follow a group that was still running;
* ``toolledger_resume_group``: continue a BLOCKED or FAILED group from its completion point.

The session's authenticated identity submits and reads, never the arguments: a group of
another tenant is not found. A refusal (an invalid definition with its field errors, a key
reused for another definition) is a tool result with ``isError`` and nothing stored, like
any tool's. A group that ended FAILED, COMPENSATED or NEEDS_ATTENTION is an ``isError``
result too (the action did not happen as asked), with the group resource, which says what
completed and what was undone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from toolledger.producers.client import TrustedContext
from toolledger.schemas.errors import ErrorCode, ErrorInfo, FieldError
from toolledger.schemas.groups import STEP_ID_PATTERN, GroupAnswer, GroupService, GroupView
from toolledger.schemas.keys import InvalidIdempotencyKey, check_idempotency_key

RUN_GROUP = "toolledger_run_group"
GET_GROUP = "toolledger_get_group"
RESUME_GROUP = "toolledger_resume_group"
GROUP_TOOLS = (RUN_GROUP, GET_GROUP, RESUME_GROUP)
_FAILED = {"FAILED", "COMPENSATED", "NEEDS_ATTENTION"}
_GROUP_ID_PATTERN = "^grp_[0-9a-f]{32}$"
_GROUP_ID_FORMAT = re.compile(_GROUP_ID_PATTERN)
_GROUP_ID = {"type": "string", "pattern": _GROUP_ID_PATTERN, "description": "The group's id."}

_RUN_DESCRIPTION = (
    "Run several dependent tool calls as one group. Each step is an ordinary call of one of "
    "this server's tools under a key derived from this idempotency_key and the step id, so "
    "it runs at most once. Steps run in dependency order (depends_on), independent ones "
    'concurrently. An argument may be {"$from": "<step id>", "path": "a.b"}: that value of '
    "the earlier step's result (and a dependency on it). on_failure: 'compensate' (default) "
    "undoes the completed steps whose tool declares a compensation, in reverse order; 'stop' "
    f"leaves them, and {RESUME_GROUP} continues from the completion point. The answer is the "
    "group: its status (RUNNING, BLOCKED, SUCCEEDED, FAILED, COMPENSATING, COMPENSATED, "
    f"NEEDS_ATTENTION) and each step's status, result and error; while it runs, follow it "
    f"with {GET_GROUP}. A step that needs approval blocks the group (its approval_request "
    f"says who approves); once approved, call {RESUME_GROUP}.\nReplay: the same "
    "idempotency_key and steps return the stored group and run nothing again; the same key "
    "with other steps is refused (IDEMPOTENCY_KEY_REUSED)."
)


def _output_schema(error_schema: Mapping[str, Any]) -> dict[str, Any]:
    """Every ``structuredContent`` of a group tool: the group, or a refusal (which may carry
    the group too, e.g. GROUP_NOT_RESUMABLE)."""
    return {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "replayed": {"type": "boolean"},
            "group": {"type": "object"},
            "error": dict(error_schema),
        },
        "required": ["ok"],
        "anyOf": [
            {"required": ["group", "replayed"]},
            {"properties": {"ok": {"const": False}}, "required": ["error"]},
        ],
    }


def _schemas(key_schema: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    step = {
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": STEP_ID_PATTERN},
            "tool": {"type": "string", "minLength": 1},
            "arguments": {"type": "object"},
            "depends_on": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["id", "tool"],
    }
    return {
        RUN_GROUP: {
            "type": "object",
            "properties": {
                "idempotency_key": dict(key_schema),
                "run_id": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 255,
                    "description": "The agent run this group belongs to (searchable).",
                },
                "on_failure": {"enum": ["compensate", "stop"]},
                "steps": {"type": "array", "minItems": 1, "items": step},
            },
            "required": ["idempotency_key", "run_id", "steps"],
        },
        GET_GROUP: {
            "type": "object",
            "properties": {"group_id": _GROUP_ID},
            "required": ["group_id"],
        },
        RESUME_GROUP: {
            "type": "object",
            "properties": {
                "group_id": _GROUP_ID,
                "approval_tokens": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                    "description": "Approval tokens by step id, for steps that waited for an "
                    "approval (omit: the approval travels with the step's call).",
                },
            },
            "required": ["group_id"],
        },
    }


class McpGroups:
    def __init__(
        self,
        groups: GroupService,
        key_schema: Mapping[str, Any],
        error_schema: Mapping[str, Any],
        wait_s: float,
    ) -> None:
        """``key_schema`` and ``error_schema``: the ledger tools' own (producers.mcp_server)."""
        self._groups = groups
        self._wait_s = wait_s
        self.schemas = _schemas(key_schema)
        output = _output_schema(error_schema)
        changes = types.ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=True
        )
        self.listing = [
            types.Tool(
                name=RUN_GROUP,
                description=_RUN_DESCRIPTION,
                input_schema=self.schemas[RUN_GROUP],
                output_schema=output,
                annotations=changes,
                meta={"toolledger.dev/effect": "group"},
            ),
            types.Tool(
                name=GET_GROUP,
                description="The group resource (status, steps, completion point).\n"
                "Replay: Read-only: takes no idempotency key and is never replayed.",
                input_schema=self.schemas[GET_GROUP],
                output_schema=output,
                annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
                meta={"toolledger.dev/effect": "read_only"},
            ),
            types.Tool(
                name=RESUME_GROUP,
                description="Continue a BLOCKED or FAILED group from its completion point: "
                "completed steps never run again, failed retryable steps get a new round.\n"
                "Replay: a group that runs or has finished is not resumed again "
                "(GROUP_NOT_RESUMABLE); no step runs twice whichever way it is resumed.",
                input_schema=self.schemas[RESUME_GROUP],
                output_schema=output,
                annotations=changes,
                meta={"toolledger.dev/effect": "group"},
            ),
        ]

    async def call(
        self,
        name: str,
        arguments: Mapping[str, Any],
        context: TrustedContext,
        params_key: str | None,
    ) -> types.CallToolResult:
        """The SDK does not check arguments against the input schemas: what a handler reads
        is checked here first, a refusal being a tool result (never a retryable INTERNAL)."""
        if name == RUN_GROUP:
            key = _group_key(arguments.get("idempotency_key"), params_key)
            if isinstance(key, GroupAnswer):
                return _result(key)
            body = {k: v for k, v in arguments.items() if k != "idempotency_key"}
            answer = await self._groups.submit(
                tenant_id=context.tenant_id,
                principal=context.principal,
                scopes=sorted(context.scopes),
                group_key=key,
                body=body,
                wait_s=self._wait_s,
            )
            return _result(answer)
        group_id = arguments.get("group_id")
        if not isinstance(group_id, str) or _GROUP_ID_FORMAT.fullmatch(group_id) is None:
            return _result(_invalid("group_id", "a group id (grp_ and 32 hex digits)", group_id))
        if name == GET_GROUP:
            view = await self._groups.view(context.tenant_id, group_id)
            return _result(GroupAnswer(view) if view is not None else _not_found())
        tokens = arguments.get("approval_tokens") or {}
        if not isinstance(tokens, Mapping) or not all(isinstance(t, str) for t in tokens.values()):
            return _result(
                _invalid("approval_tokens", "an object of approval tokens by step id", tokens)
            )
        return _result(
            await self._groups.resume(context.tenant_id, group_id, dict(tokens), self._wait_s)
        )


def _group_key(argument: Any, params_key: str | None) -> str | GroupAnswer:
    """The group's key: the ``idempotencyKey`` parameter (already checked by the caller) or
    the ``idempotency_key`` argument, which must agree when both are given; a refusal when
    there is none or it is not a key."""
    if params_key is not None:
        if argument is not None and argument != params_key:
            raise MCPError(
                types.INVALID_PARAMS,
                "The idempotencyKey parameter and the idempotency_key argument differ.",
            )
        return params_key
    if argument is None:
        return GroupAnswer(
            error=ErrorInfo.of(
                ErrorCode.IDEMPOTENCY_KEY_MISSING,
                f"{RUN_GROUP} runs calls: pass the argument idempotency_key (the group's key).",
            )
        )
    if not isinstance(argument, str):
        return GroupAnswer(
            error=ErrorInfo.of(
                ErrorCode.IDEMPOTENCY_KEY_INVALID, "idempotency_key must be a string."
            )
        )
    try:
        return check_idempotency_key(argument)
    except InvalidIdempotencyKey as exc:
        return GroupAnswer(error=ErrorInfo.of(ErrorCode.IDEMPOTENCY_KEY_INVALID, str(exc)))


def _invalid(field: str, expected: str, got: Any) -> GroupAnswer:
    message = f"{field} must be {expected}; got {type(got).__name__}."
    return GroupAnswer(
        error=ErrorInfo.of(ErrorCode.VALIDATION_FAILED, f"1 argument is invalid: {message}"),
        field_errors=(FieldError(loc=field, msg=message, type="value_error"),),
    )


def _not_found() -> GroupAnswer:
    return GroupAnswer(
        error=ErrorInfo(
            code="NOT_FOUND",
            message="There is no group with this id in this tenant.",
            retryable=False,
            suggested_action="Check the group id (it is in the run_group answer).",
        )
    )


def _body(answer: GroupAnswer) -> dict[str, Any]:
    if answer.error is not None:
        error = answer.error.model_dump()
        if answer.field_errors:
            error["field_errors"] = [f.model_dump() for f in answer.field_errors]
        body: dict[str, Any] = {"ok": False, "error": error}
        if answer.view is not None:
            body["group"] = answer.view.model_dump(mode="json")
        return body
    view: GroupView | None = answer.view
    assert view is not None
    return {
        "ok": view.status not in _FAILED,
        "replayed": answer.replayed,
        "group": view.model_dump(mode="json"),
    }


def _result(answer: GroupAnswer) -> types.CallToolResult:
    body = _body(answer)
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(body, ensure_ascii=False))],
        structured_content=body,
        is_error=not body["ok"],
    )
