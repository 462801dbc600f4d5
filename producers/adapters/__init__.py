"""Agent-framework adapters: ledger tools as OpenAI Agents SDK and Anthropic tools.

``producers.adapters.openai_agents`` needs ``openai-agents`` and
``producers.adapters.anthropic`` needs ``anthropic``; this package imports neither, so the
MCP server and the HTTP API can share its helpers without them.

Where the idempotency key comes from
------------------------------------
With these adapters the model never sees or supplies a key: the adapter derives it with
:func:`producers.keys.derive_idempotency_key` from the run id and the step id, both held by
the agent runtime. The provider's tool-call id (``toolu_...``, ``call_...``) is not used:
it is new every time a turn is regenerated, so a key built from it would execute a retried
turn's effects a second time. A step id must name *the intended action* and stay the same
when that action is attempted again:

* Anthropic (:func:`producers.adapters.anthropic.execute_tool_use`): the caller passes the
  step id. :func:`producers.adapters.anthropic.execute_tool_uses` uses
  ``turn-<n>/<tool>-<k>``: ``n`` the index of the assistant turn in the persisted
  conversation, ``k`` the ordinal of the ``tool_use`` block among that turn's blocks of the
  same tool. With a client that runs call groups, the turn is one group keyed by the run id
  and ``turn-<n>``, and its steps are keyed by the group (:mod:`producers.adapters.groups`).
* OpenAI Agents SDK (:mod:`producers.adapters.openai_agents`): the run context carries a
  :class:`~producers.adapters.openai_agents.LedgerRun` whose step counter the runtime
  persists with the conversation; a retried turn starts again from the persisted counter
  and so reuses the same step ids.

The tools are described by their manifests (``ToolSpec``: ``producers.http.app.ToolInfo``
fits), never by the registry: producers do not import processors.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from toolledger.producers.approvals import PendingApproval
from toolledger.producers.client import CallResult
from toolledger.schemas.errors import ErrorCode, ErrorInfo

__all__ = [
    "ToolSpec",
    "approval_rule",
    "arguments_schema",
    "awaiting_approval",
    "description",
    "index_tools",
    "refusal",
    "result_text",
    "runtime_keyed_description",
]


class ToolSpec(Protocol):
    """What an adapter needs to know about a tool: its name, whether it takes a key, and
    its public manifest (``processors.tools.manifest.Tool.manifest()``)."""

    @property
    def name(self) -> str: ...

    @property
    def keyed(self) -> bool: ...

    @property
    def manifest(self) -> Mapping[str, Any]: ...


def index_tools(tools: Mapping[str, ToolSpec] | Iterable[ToolSpec]) -> dict[str, ToolSpec]:
    """The tools by name (a mapping is re-keyed by each tool's own name)."""
    specs = tools.values() if isinstance(tools, Mapping) else tools
    indexed: dict[str, ToolSpec] = {}
    for spec in specs:
        if spec.name in indexed:
            raise ValueError(f"two tools are named {spec.name!r}")
        indexed[spec.name] = spec
    return indexed


def arguments_schema(spec: ToolSpec) -> dict[str, Any]:
    """A private copy of the tool's argument JSON Schema (from its pydantic model)."""
    schema = spec.manifest.get("arguments_schema")
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        raise ValueError(f"{spec.name}: the manifest has no object arguments_schema")
    return copy.deepcopy(dict(schema))


def description(spec: ToolSpec) -> str:
    """The manifest's description (when to use the tool, when not, replay behaviour)."""
    text = spec.manifest.get("description")
    return text if isinstance(text, str) and text else spec.name


def runtime_keyed_description(spec: ToolSpec) -> str:
    """The description for a model that does not supply the key (the adapters')."""
    text = description(spec)
    if spec.keyed:
        text += (
            "\nThe runtime attaches an idempotency key for this step: a retried step returns "
            "the stored outcome and does not run again."
        )
    return text


def approval_rule(spec: ToolSpec) -> str:
    """Who must approve the tool's calls, from the manifest: "none", "user", "operator" or
    "by arguments" (the ledger decides per call)."""
    rule = spec.manifest.get("approval")
    return rule if spec.keyed and isinstance(rule, str) and rule else "none"


_DECIDERS = {"user": "the user", "operator": "an operator (four eyes)"}


def awaiting_approval(result: CallResult, request: PendingApproval) -> CallResult:
    """``result`` (an ``APPROVAL_REQUIRED`` answer) as a model driven by a runtime reads it:
    the runtime, not the model, brings the human's decision back and runs the step."""
    assert result.error is not None
    action = (
        f"Nothing ran. The runtime asks {_DECIDERS[request.approver_kind]} to approve "
        f"approval request {request.id}; once approved, it runs this exact call once, without "
        "another call from you. Do not call the tool again with other arguments to get "
        "around the approval: tell the user what is waiting for a decision."
    )
    error = result.error.model_copy(update={"suggested_action": action})
    return dataclasses.replace(result, error=error)


def refusal(code: ErrorCode, message: str) -> CallResult:
    """A call refused before reaching the ledger (nothing appended, nothing executed)."""
    return CallResult(status=None, error=ErrorInfo.of(code, message))


def result_text(result: CallResult) -> str:
    """The normalised JSON a model reads: ``{"ok": true, "result": ...}`` or
    ``{"ok": false, "error": {"code", "message", "retryable", "suggested_action"}}``."""
    return json.dumps(result.to_json(), ensure_ascii=False, separators=(",", ":"))
