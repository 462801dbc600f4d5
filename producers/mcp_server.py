"""The MCP server: the ledger's tools for any MCP client, over stdio or streamable HTTP.

Built on the ``mcp`` SDK's low-level ``Server`` so the listing is exactly the manifests':

* input schema: the tool's argument JSON Schema (from its pydantic model); every tool that
  changes something (``mutation``, ``long_running``) gets two more string properties: the
  *required* ``idempotency_key`` (1..255 printable ASCII characters, taken verbatim: no
  trimming, no quotes) and the optional ``approval_token`` (the token a human's approval of
  this exact call gave);
* output schema (``outputSchema``): the normalised JSON body every call answers (below), its
  ``result`` the manifest's ``result_schema`` (the tool's result model); an object schema
  that error bodies match as well. Every result carries that body in ``structuredContent``
  and, serialised, in its one text block;
* description: the manifest's, which states the replay behaviour once, on its ``Replay:``
  line (the MCP layer adds that line only to a description without one, and does not
  restate it); then how long a key is kept and, for a tool whose manifest says
  ``approval: operator``, ``user`` or ``by arguments``, that a human must approve;
* annotations from the manifest: ``readOnlyHint`` (effect ``read_only``),
  ``destructiveHint`` (a mutation of risk ``high`` or ``irreversible``), ``idempotentHint``
  (true for keyed tools: the key is one of the arguments, and the same arguments, key
  included, give the same outcome without a second effect), ``openWorldHint`` (the
  manifest's ``open_world`` when it has one, else true, MCP's own default);
* ``_meta`` carries the manifest's version, effect and risk.

A call takes ``idempotency_key`` and ``approval_token`` out of the arguments and passes
them to :meth:`producers.client.LedgerClient.call` as the key and the approval token; the
rest are the tool's arguments (so neither is part of the args digest). Optional request
``_meta`` entries ``toolledger.dev/run_id``, ``toolledger.dev/step_id`` and
``toolledger.dev/approval_token`` (set by the client application, not by the model) are
passed through for the audit trail and approvals; an ``approval_token`` argument wins over
the ``_meta`` one.

Request idempotency (SEP-3182, the MCP "Request Idempotency" proposal): the server
advertises ``capabilities.tools.idempotency`` (``{}``) in its ``initialize`` and
``server/discover`` answers and accepts the key as ``idempotencyKey`` in the ``tools/call``
params -- set by a client application, which may not be able to touch the arguments -- as
well as the ``idempotency_key`` argument (a model's). The ledger treats both alike: same
tenant, tool, key and arguments, one execution; a retry is answered with the stored
outcome, a success or an error. With ``idempotencyKey``:

* a key that is not 1 to 255 printable ASCII characters is the JSON-RPC error ``-32602``
  (Invalid params), and so is an ``idempotency_key`` argument that differs from it (the
  same key in both is fine; the parameter is then the key);
* a call whose key's execution is still running when the server's wait ends (the ledger's
  ``IDEMPOTENCY_KEY_IN_USE``) is the JSON-RPC error ``-31409`` with ``error.data``
  ``{"type": "idempotency_key_in_progress", "idempotencyKey": <key>}``; the key with other
  arguments (``IDEMPOTENCY_KEY_REUSED``) is ``-32602`` with ``error.data`` ``{"type":
  "idempotency_key_conflict", "idempotencyKey": <key>}``. Every other answer is a result as
  below. With the ``idempotency_key`` argument only, these two stay error results the model
  reads (``IDEMPOTENCY_KEY_IN_USE``, ``IDEMPOTENCY_KEY_REUSED``);
* a read-only tool takes ``idempotencyKey`` (checked, then ignored): a read has no effect to
  deduplicate and runs every time.

A duplicate still running is not answered at once, as the proposal suggests (SHOULD): the
call waits for the first execution's outcome for at most the server's wait (``--wait``),
and only then answers that it is in progress.

Approvals: a call of a tool that needs a human's approval, made without a valid token, is
answered ``APPROVAL_REQUIRED`` (nothing runs, the key is not consumed).

* A request the *user* decides (``approver_kind`` ``user``), on a client that declared the
  ``elicitation`` capability (form mode): the server asks the client's human with
  ``elicitation/create`` -- the exact action (tool, impact, target, cost, whether it is
  irreversible, the arguments as the caller sent them) and a form with a boolean
  ``confirm`` and an optional ``reason``. Accepted with ``confirm`` true: the request is
  granted as the session's principal and the same call (same key) is made again, and its
  outcome is the result; declined, cancelled or ``confirm`` false: the request is denied
  (with the reason) and the result is the ledger's refusal (``APPROVAL_INVALID``). On the
  2026-07-28 protocol the question rides an ``InputRequiredResult`` (key
  :data:`ELICITATION_KEY`, ``requestState`` the request id) and the client's retry of the
  ``tools/call`` brings the answer; on earlier ones it is a request to the client in the
  middle of the call.
* Otherwise (an operator's four-eyes request, or a client without elicitation) the
  ``isError`` result carries, next to the error, an ``approval_request`` shaped like the
  HTTP API's (``id``, ``tool``, ``arguments`` with sensitive fields redacted,
  ``args_digest``, ``impact`` {summary, target, scope, cost, irreversible}, ``status``
  ``pending``, ``expires_at``). Whoever may decide it approves it over HTTP (``POST
  /v1/approval-requests/{id}/approve``); the same call (same key, same arguments) then runs
  once, without a token (the grant is kept with the key; the approver's ``approval_token``
  works too).

``APPROVAL_INVALID`` (a token for another call, expired, used, or a denied request) and
``TOOL_DISABLED`` are ordinary error results.

Errors, per the MCP specification ("Tools" > "Error handling"):

* *execution errors* are results with ``isError: true`` whose content is the normalised
  JSON of :meth:`CallResult.to_json` (``{"ok": false, "error": {"code", "message",
  "retryable", "suggested_action"}, ...}``; also in ``structuredContent``): every ledger
  outcome that is not SUCCEEDED, and every refusal the model can act on -- invalid
  arguments (``VALIDATION_FAILED``; since 2025-11-25 the specification classes input
  validation as an execution error, so the model can correct itself), a missing or invalid
  key, a reused key, a forbidden tool, a disabled tool, a missing approval;
* *protocol errors* stay JSON-RPC errors: an unknown tool name is ``-32602`` (Invalid
  params). The specification lists "unknown tools" among protocol errors: the name is not
  in the listing the client got, nothing was attempted, and there is no tool whose result
  could carry the error. The ledger is not asked (no ``TOOL_NOT_FOUND`` event is recorded);
  a request that is not a valid ``tools/call`` is rejected by the SDK in the same way.
  So are the ``idempotencyKey`` errors above: the client application set that key, and
  SEP-3182 asks for them in ``error.data``.

Tenant and principal come from the session's authentication, never from arguments (an
argument named ``tenant_id`` is just an unknown argument: ``VALIDATION_FAILED``):

* streamable HTTP: every request carries ``Authorization: Bearer <token>``, checked with
  the HTTP API's :class:`producers.http.auth.Authenticator` (the tokens file and, when
  configured, JWTs verified against a JWKS file); no or a wrong token is ``401`` before any
  MCP processing, with the authenticator's reason in ``error_description``. The SDK binds
  a stateful session to the identity (tenant and principal) that opened it; a request with
  another identity gets ``404`` for that session.
* stdio: there is no per-request credential (the MCP specification says stdio servers take
  credentials from their environment), so the trusted context is fixed when the process
  starts -- ``toolledger mcp --transport stdio`` resolves ``--token`` (or the environment
  variable ``TOOLLEDGER_MCP_TOKEN``) through the tokens file and refuses to start if it does
  not resolve. Whoever can start the process holds that token.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, Self

import anyio
import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toolledger.producers.adapters import (
    ToolSpec,
    arguments_schema,
    description,
    index_tools,
    refusal,
)
from toolledger.producers.approval_rules import confirmed_in_person
from toolledger.producers.approvals import (
    Approvals,
    Approve,
    Deny,
    LedgerApprovals,
    PendingApproval,
    apply_decision,
    pending_approval,
)
from toolledger.producers.client import CallResult, LedgerClient, QueuedProbe, TrustedContext
from toolledger.producers.governance import approval_request_json
from toolledger.producers.http.auth import Authenticator, AuthFailure, Throttled, throttled_check
from toolledger.producers.http.ratelimit import AuthThrottle
from toolledger.producers.mcp_groups import GROUP_TOOLS, McpGroups
from toolledger.producers.mcp_tasks import McpTasks
from toolledger.schemas.calls import CallQueries
from toolledger.schemas.errors import ErrorCode, ErrorInfo, FieldError
from toolledger.schemas.events import ApprovalRequested
from toolledger.schemas.groups import GroupService
from toolledger.schemas.keys import MAX_KEY_LENGTH, InvalidIdempotencyKey, check_idempotency_key
from toolledger.schemas.nesting import NestingTooDeep, check_depth, check_text_depth

log = logging.getLogger("toolledger.mcp")

KEY_ARGUMENT = "idempotency_key"
PARAMS_KEY = "idempotencyKey"  # SEP-3182: the key in the tools/call params
APPROVAL_ARGUMENT = "approval_token"
RESERVED_ARGUMENTS = (KEY_ARGUMENT, APPROVAL_ARGUMENT)
MAX_APPROVAL_TOKEN = 4096  # as the HTTP API's body
RUN_ID_META = "toolledger.dev/run_id"
STEP_ID_META = "toolledger.dev/step_id"
APPROVAL_META = "toolledger.dev/approval_token"
DEFAULT_PATH = "/mcp"
# the InputRequiredResult entry that asks the user to confirm a call (2026-07-28 protocol)
ELICITATION_KEY = "toolledger.dev/confirm"

# SEP-3182 ("Request Idempotency"): the capability, under ``capabilities.tools``, and the
# ``error.data`` types of a duplicate still running and of a key used with other arguments
IDEMPOTENCY_CAPABILITY = "idempotency"
KEY_IN_PROGRESS = "idempotency_key_in_progress"
KEY_CONFLICT = "idempotency_key_conflict"
# The SEP defines no error code. A conflict is the caller's mistake in the params: Invalid
# params. A duplicate still running is no mistake (the same request succeeds later): an
# application-defined code, outside JSON-RPC's reserved range as the MCP specification asks
# of codes it does not define (409: the HTTP status of this case in the IETF
# Idempotency-Key draft, in Stripe's API and in this ledger's HTTP API).
KEY_IN_PROGRESS_CODE = -31409

_KEY_DESCRIPTION = (
    "Names this intended action, not this attempt: derive it from your run and step "
    "(e.g. 'run-42:step-3') and send the same key, verbatim, whenever you retry the same "
    "action. 1 to 255 printable ASCII characters."
)

_APPROVAL_DESCRIPTION = (
    "Only after an APPROVAL_REQUIRED answer: the approval_token a human operator gave you "
    "for that approval request. Send it with the same idempotency_key and arguments. Omit "
    "it otherwise; it is not one of the tool's arguments."
)

# how long toolledger_run_group and toolledger_resume_group wait for the group to finish or
# block before they answer it RUNNING (it goes on; toolledger_get_group follows it)
DEFAULT_GROUP_WAIT_S = 20.0

_INSTRUCTIONS = (
    "Every tool that changes something takes a required idempotency_key. Use one key per "
    "intended action and reuse it verbatim when you retry that action: the ledger runs it at "
    "most once and answers a retry with the stored outcome. A new action needs a new key; "
    "the same key with different arguments is refused (IDEMPOTENCY_KEY_REUSED). Failures are "
    'results with isError and a JSON body {"ok": false, "error": {"code", "message", '
    '"retryable", "suggested_action"}}: follow suggested_action. Some tools need a human\'s '
    "approval: their first call answers APPROVAL_REQUIRED with an approval_request and runs "
    "nothing (a client that supports elicitation may be asked to confirm it at once); once a "
    "human has approved it, repeat the same call (same key, same arguments): no token needed."
)


def key_schema() -> dict[str, Any]:
    return {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_KEY_LENGTH,
        "pattern": r"^[\x20-\x7E]+$",
        "description": _KEY_DESCRIPTION,
    }


def approval_token_schema() -> dict[str, Any]:
    return {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_APPROVAL_TOKEN,
        "description": _APPROVAL_DESCRIPTION,
    }


def mcp_input_schema(spec: ToolSpec) -> dict[str, Any]:
    """The argument schema, plus the required ``idempotency_key`` and the optional
    ``approval_token`` for keyed tools."""
    schema = arguments_schema(spec)
    if not spec.keyed:
        return schema
    properties = schema.setdefault("properties", {})
    for name in RESERVED_ARGUMENTS:
        if name in properties:
            raise ValueError(
                f"{spec.name}: an argument is named {name!r}, which the MCP server reserves "
                "for the ledger"
            )
    properties[KEY_ARGUMENT] = key_schema()
    properties[APPROVAL_ARGUMENT] = approval_token_schema()
    required = [r for r in schema.get("required", []) if r not in RESERVED_ARGUMENTS]
    schema["required"] = [*required, KEY_ARGUMENT]
    return schema


_APPROVAL_NOTES = {
    "operator": "every call needs an operator's approval of its exact arguments (four eyes).",
    "user": "every call needs the user's confirmation of its exact arguments.",
    "by arguments": "some calls, depending on their arguments, need a human's approval of "
    "their exact arguments.",
}

REPLAY_LINE = "Replay:"
_KEYED_REPLAY = (
    "Calling again with the same idempotency key and arguments returns the stored outcome "
    "without running it again; the same key with other arguments is refused."
)
_READ_ONLY_REPLAY = "Read-only: takes no idempotency key and is never replayed."


def _states_replay(text: str) -> bool:
    return any(line.startswith(REPLAY_LINE) for line in text.splitlines())


def mcp_description(spec: ToolSpec) -> str:
    """The manifest's description, which states the replay behaviour on its ``Replay:`` line
    (one is added when it has none), plus what the manifest's text does not say: how long a
    key is kept and whether a human must approve. The replay behaviour is stated once."""
    text = description(spec)
    if not _states_replay(text):
        text += f"\n{REPLAY_LINE} {_KEYED_REPLAY if spec.keyed else _READ_ONLY_REPLAY}"
    if not spec.keyed:
        return text
    retention = spec.manifest.get("key_retention")
    if retention == "forever":
        text += "\nKeys: kept forever."
    elif isinstance(retention, str):
        seconds = spec.manifest.get("key_retention_seconds")
        plainly = f", {_in_words(seconds)}" if isinstance(seconds, int) else ""
        text += (
            f"\nKeys: a finished call's key is kept for {retention} (ISO 8601{plainly}) after "
            "its outcome; after that the same key runs as a new call."
        )
    note = _APPROVAL_NOTES.get(str(spec.manifest.get("approval")))
    if note is not None:
        text += (
            f"\nApproval: {note} Such a call first answers APPROVAL_REQUIRED with an "
            "approval_request and runs nothing; once a human approved it, repeat the same "
            "call (same idempotency_key, same arguments): the approval is kept with the key."
        )
    return text


def _in_words(seconds: int) -> str:
    """A retention for people: ``24 hours``, ``7 days``, ``1 minute 30 seconds``."""
    days, rest = divmod(seconds, 86_400)
    if days > 1 and not rest:  # 24 hours reads as such; 7 days too
        return _count(days, "day")
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return " ".join(
        _count(n, unit) for n, unit in ((hours, "hour"), (minutes, "minute"), (secs, "second")) if n
    )


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"


def mcp_annotations(spec: ToolSpec) -> types.ToolAnnotations:
    manifest = spec.manifest
    read_only = manifest.get("effect") == "read_only"
    open_world = manifest.get("open_world")
    return types.ToolAnnotations(
        read_only_hint=read_only,
        # destructive and idempotent hints are meaningful only for tools that change things
        destructive_hint=None if read_only else manifest.get("risk") in ("high", "irreversible"),
        idempotent_hint=None if read_only else spec.keyed,
        open_world_hint=open_world if isinstance(open_world, bool) else True,
    )


_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {"type": "string"},
        "message": {"type": "string"},
        "retryable": {"type": "boolean"},
        "suggested_action": {"type": "string"},
        "field_errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "loc": {"type": "string"},
                    "msg": {"type": "string"},
                    "type": {"type": "string"},
                },
                "required": ["loc", "msg", "type"],
            },
        },
    },
    "required": ["code", "message", "retryable", "suggested_action"],
}


def mcp_output_schema(spec: ToolSpec) -> dict[str, Any]:
    """The JSON Schema of every ``structuredContent`` a call of this tool answers: the
    normalised body of :meth:`CallResult.to_json` (plus ``approval_request`` on an
    ``APPROVAL_REQUIRED`` answer), its ``result`` the manifest's ``result_schema`` (the
    tool's result model). An object schema whose ``oneOf`` tells a success (``ok`` true,
    ``status`` ``SUCCEEDED``, a ``result``) from a failure (``ok`` false, an ``error``), so
    error results conform too. The result model's ``$defs`` move to the root, where its
    references (``#/$defs/...``) resolve."""
    manifest_schema = spec.manifest.get("result_schema")
    result: dict[str, Any] = (
        copy.deepcopy(dict(manifest_schema)) if isinstance(manifest_schema, Mapping) else {}
    )
    defs = result.pop("$defs", None)
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "status": {"type": ["string", "null"]},
            "result": result,
            "error": _ERROR_SCHEMA,
            "replayed": {"type": "boolean"},
            "attempts": {"type": "integer", "minimum": 0},
            "call_id": {"type": "string"},
            "approval_request": {"type": "object"},
            "job": {"type": "object"},  # a long-running call's job
        },
        "required": ["ok", "status", "replayed", "attempts", "call_id"],
        "oneOf": [
            {
                "properties": {"ok": {"const": True}, "status": {"const": "SUCCEEDED"}},
                "required": ["result"],
            },
            {"properties": {"ok": {"const": False}}, "required": ["error"]},
        ],
    }
    if isinstance(defs, Mapping) and defs:
        schema["$defs"] = dict(defs)
    return schema


def mcp_tool(spec: ToolSpec) -> types.Tool:
    manifest = spec.manifest
    meta = {
        f"toolledger.dev/{field}": manifest[field]
        for field in ("version", "effect", "risk", "key_retention", "key_scope")
        if field in manifest
    }
    return types.Tool(
        name=spec.name,
        description=mcp_description(spec),
        input_schema=mcp_input_schema(spec),
        output_schema=mcp_output_schema(spec),
        annotations=mcp_annotations(spec),
        meta=meta or None,
    )


class SessionUser(AuthenticatedUser):
    """The authenticated caller of one HTTP request, with its trusted context.

    The SDK's session manager binds a stateful session to ``(client_id, iss, sub)`` of the
    user that opened it; ``client_id`` encodes tenant and principal, so a session opened by
    one tenant cannot be used by another.
    """

    def __init__(self, context: TrustedContext) -> None:
        super().__init__(
            AccessToken(
                token="",  # the raw token is not kept
                client_id=json.dumps([context.tenant_id, context.principal]),
                scopes=sorted(context.scopes),
                subject=context.principal,
                claims={"iss": "toolledger", "tenant_id": context.tenant_id},
            )
        )
        self.context = context


class BearerAuth:
    """ASGI wrapper of the MCP endpoint: ``Authorization: Bearer <token>`` checked with the
    HTTP API's authenticator (tokens file, JWTs) on every request.

    Authenticated: ``scope["user"]`` is a :class:`SessionUser` (the SDK binds sessions to
    it) and ``scope["auth"]`` its scopes. Otherwise ``401`` before any MCP processing, with
    the authenticator's reason (never the token) in ``error_description`` and in the log;
    ``429`` with ``Retry-After``, the token unchecked, while ``throttle`` holds the client's
    address back after too many refused tokens."""

    def __init__(self, app: ASGIApp, authenticator: Authenticator, throttle: AuthThrottle) -> None:
        self.app = app
        self.authenticator = authenticator
        self.throttle = throttle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        checked = throttled_check(
            self.authenticator,
            self.throttle,
            client[0] if client else None,
            Headers(scope=scope).get("authorization"),
        )
        if isinstance(checked, Throttled):
            log.warning(
                "authentication throttled",
                extra={"client": client[0] if client else None, "path": scope.get("path")},
            )
            body = json.dumps({"error": "rate_limited", "error_description": checked.detail})
            await _send_json(
                send, 429, body.encode(), [(b"retry-after", b"%d" % checked.retry_after_s)]
            )
            return
        if isinstance(checked, AuthFailure):
            await self._refuse(scope, send, checked)
            return
        scope["user"] = SessionUser(checked)
        scope["auth"] = AuthCredentials(sorted(checked.scopes))
        await self.app(scope, receive, send)

    @staticmethod
    async def _refuse(scope: Scope, send: Send, failure: AuthFailure) -> None:
        client = scope.get("client")
        log.log(
            logging.INFO if failure.reason == "missing" else logging.WARNING,
            "authentication failed",
            extra={
                "reason": failure.reason,
                "token_kind": failure.kind,
                "method": scope.get("method"),
                "path": str(scope.get("path", ""))[:256],
                "client": client[0] if client else None,
            },
        )
        detail = failure.detail.replace('"', "'").replace("\\", "/")
        # RFC 6750 3.1: no error code when the request had no credentials
        challenge = (
            "Bearer"
            if failure.reason == "missing"
            else f'Bearer error="invalid_token", error_description="{detail}"'
        )
        payload = json.dumps({"error": "invalid_token", "error_description": failure.detail})
        await _send_json(send, 401, payload.encode(), [(b"www-authenticate", challenge.encode())])


async def _send_json(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    """A whole JSON response, sent by an ASGI wrapper before the app."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# where arguments sit deepest in a request: params.arguments.steps[i].arguments of a group
_DEEPEST_ARGUMENTS = 5


class NestingGuard:
    """ASGI wrapper of the MCP endpoint: a request nested deeper than any tool call's
    arguments may be (``schemas.nesting``) is refused whole with ``400`` and a JSON-RPC
    error naming the limit, before the SDK's parser reads it (which fails on its own, with no
    limit named, at about 200 levels). Shallower arguments reach the tools, which answer
    ``VALIDATION_FAILED``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        body = bytearray()
        while True:  # the SDK reads the whole body too: this holds it no longer
            message = await receive()
            messages.append(message)
            body += message.get("body", b"")
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        try:
            check_text_depth(bytes(body), "a tool call's arguments", envelope=_DEEPEST_ARGUMENTS)
        except NestingTooDeep as exc:
            error = {"code": types.INVALID_PARAMS, "message": str(exc)}
            payload = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
            await _send_json(send, 400, payload, [])
            return
        buffered = iter(messages)

        async def replay() -> Message:
            return next(buffered, None) or await receive()

        await self.app(scope, replay, send)


def session_context(
    ctx: ServerRequestContext[Any, Any], fixed: TrustedContext | None
) -> TrustedContext | None:
    """The caller's trusted context: the request's authenticated user over HTTP, the
    context fixed at start-up otherwise (stdio). An HTTP request without an authenticated
    user gets nothing, even if a fixed context exists."""
    request = ctx.request
    if request is None:
        return fixed
    scope = getattr(request, "scope", None)
    user = scope.get("user") if isinstance(scope, Mapping) else None
    return user.context if isinstance(user, SessionUser) else None


def _meta_string(meta: Mapping[str, Any] | None, key: str, limit: int) -> str | None:
    value = (meta or {}).get(key)
    if isinstance(value, str) and 0 < len(value) <= limit:
        return value
    return None


_DECIDERS = {
    "user": "the user this session acts for (or an operator of the tenant)",
    "operator": "an operator of the tenant other than this session's principal (four eyes)",
}


def _approval_action(request: Mapping[str, Any]) -> str:
    decider = _DECIDERS.get(str(request.get("approver_kind")), _DECIDERS["operator"])
    return (
        f"Nothing ran. Approval request {request['id']} waits for {decider}. Once it is "
        "approved, call the tool again with the same idempotency_key and arguments: it runs "
        "once, no approval_token needed (an approval_token the approver gives you works "
        "too). Do not use a new key."
    )


def result_body(result: CallResult) -> dict[str, Any]:
    """The normalised JSON of a result; an ``APPROVAL_REQUIRED`` answer also carries its
    ``approval_request``."""
    body = result.to_json()
    event = result.event
    if (
        result.error is not None
        and result.error.code == ErrorCode.APPROVAL_REQUIRED
        and isinstance(event, ApprovalRequested)
    ):
        request = approval_request_json(event)
        body["error"]["suggested_action"] = _approval_action(request)
        body["approval_request"] = request
    return body


def _tool_result(result: CallResult) -> types.CallToolResult:
    body = result_body(result)
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))  # as result_text
    return types.CallToolResult(
        content=[types.TextContent(text=text)],
        structured_content=body,
        is_error=not result.ok,
    )


def _invalid_approval_token(message: str, kind: str) -> CallResult:
    return CallResult(
        status=None,
        error=ErrorInfo.of(ErrorCode.VALIDATION_FAILED, message),
        field_errors=(FieldError(loc=APPROVAL_ARGUMENT, msg=message, type=kind),),
    )


def request_idempotency_key(params: Mapping[str, Any] | None) -> str | None:
    """The ``idempotencyKey`` of a ``tools/call``'s wire params (SEP-3182); ``None`` when it
    is absent or ``null``. A key that is not 1 to 255 printable ASCII characters is the
    protocol's Invalid params (``-32602``): the client application set it, not the model."""
    raw = None if params is None else params.get(PARAMS_KEY)
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise MCPError(types.INVALID_PARAMS, f"{PARAMS_KEY} must be a string.")
    try:
        return check_idempotency_key(raw)
    except InvalidIdempotencyKey as exc:
        raise MCPError(
            types.INVALID_PARAMS,
            f"{PARAMS_KEY} must be 1 to {MAX_KEY_LENGTH} printable ASCII characters: {exc}.",
        ) from None


def raise_idempotency_error(result: CallResult, key: str) -> None:
    """For a call keyed by ``idempotencyKey``: raise the JSON-RPC error SEP-3182 asks for
    when the ledger answered that the key's call is still running (``IDEMPOTENCY_KEY_IN_USE``)
    or that the key was used with other arguments (``IDEMPOTENCY_KEY_REUSED``), with
    ``error.data`` ``{"type": ..., "idempotencyKey": key}``. Any other answer is a result."""
    code = None if result.error is None else result.error.code
    if code == ErrorCode.IDEMPOTENCY_KEY_IN_USE:
        raise MCPError(
            KEY_IN_PROGRESS_CODE,
            "A request with this idempotencyKey is still in progress: retry later with the "
            "same key and arguments.",
            {"type": KEY_IN_PROGRESS, PARAMS_KEY: key},
        )
    if code == ErrorCode.IDEMPOTENCY_KEY_REUSED:
        raise MCPError(
            types.INVALID_PARAMS,
            "This idempotencyKey was used with other arguments: use a new key for a new action.",
            {"type": KEY_CONFLICT, PARAMS_KEY: key},
        )


async def advertise_idempotency(
    ctx: ServerRequestContext[Any, Any], call_next: CallNext
) -> HandlerResult:
    """Server middleware adding SEP-3182's ``tools.idempotency`` (``{}``) to the capabilities
    of ``initialize`` and ``server/discover`` answers. The SDK's result models know no such
    field and drop it, so it goes into the wire form, which the middleware receives."""
    result = await call_next(ctx)
    if ctx.method not in ("initialize", "server/discover") or not isinstance(result, dict):
        return result
    capabilities = result.get("capabilities")
    if not isinstance(capabilities, dict) or not isinstance(capabilities.get("tools"), dict):
        return result
    tools = {**capabilities["tools"], IDEMPOTENCY_CAPABILITY: {}}
    return {**result, "capabilities": {**capabilities, "tools": tools}}


_CONFIRM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "confirm": {
            "type": "boolean",
            "title": "Run this action",
            "description": "true: run it, once; false: refuse it.",
        },
        "reason": {
            "type": "string",
            "title": "Reason",
            "description": "If you refuse: why (the agent reads it).",
            "maxLength": 1000,
        },
    },
    "required": ["confirm"],
}


def elicits_form(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the client declared form elicitation (a bare ``elicitation: {}`` counts)."""
    capabilities = ctx.session.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def confirmation_message(
    request: PendingApproval, principal: str, arguments: Mapping[str, Any]
) -> str:
    """What the user is asked: the exact action, as the caller sent it."""
    impact = request.impact
    lines = [f"Your agent ({principal}) asks to run {request.tool}."]
    for label, name in (("What", "summary"), ("Target", "target"), ("Scope", "scope")):
        if impact.get(name):
            lines.append(f"{label}: {impact[name]}")
    lines.append(f"Cost: {impact.get('cost') or 'none stated'}")
    lines.append(f"Irreversible: {'yes' if impact.get('irreversible') else 'no'}")
    lines.append("Arguments: " + json.dumps(arguments, ensure_ascii=False, sort_keys=True))
    lines.append(
        f"Approval request {request.id}, open until {request.request.get('expires_at')}. "
        "Confirm to run it once; refuse it otherwise."
    )
    return "\n".join(lines)


def _confirmation(answer: types.ElicitResult) -> Approve | Deny:
    content = answer.content or {}
    if answer.action == "accept" and content.get("confirm") is True:
        return Approve()
    reason = content.get("reason")
    if isinstance(reason, str) and reason.strip():
        return Deny(f"The user refused: {reason}")
    what = {"decline": "declined", "cancel": "cancelled"}.get(answer.action, "refused")
    return Deny(f"The user {what} the confirmation in the MCP client.")


# the front door's refusals before anything is appended (rate limit, kill switch, run budget)
Admission = Callable[[TrustedContext, str, str | None, str | None], Awaitable[ErrorInfo | None]]
# for a keyed call (context, tool, the tool's arguments): the probe that tells the ledger
# client whether another call with the same key and arguments runs (see LedgerClient.call)
QueuedFor = Callable[[TrustedContext, str, Mapping[str, Any]], QueuedProbe]


class LedgerMcpServer:
    """The ledger's tools as an MCP server.

    ``fixed_context`` is the trusted context of a transport without per-request
    authentication (stdio, in-process); streamable HTTP ignores it and authenticates every
    request (:meth:`http_app`). ``queued`` (the wiring gives one that reads the ledger's
    projection) lets a duplicate queued behind a running call with the same key and
    arguments be answered "in progress" once ``wait_s`` has run out, instead of waiting on
    for the running call's outcome. ``approvals`` decides what the session's user confirms
    by elicitation (default: in-process, through ``client``). With ``queries`` (the ledger's
    call projection), long-running tools answer clients that declare MCP's Tasks extension
    with a task handle and serve ``tasks/get`` and ``tasks/cancel`` (:mod:`producers.mcp_tasks`).
    With ``groups`` (the backend's group orchestrator), call groups are three more tools
    (:mod:`producers.mcp_groups`).
    """

    def __init__(
        self,
        client: LedgerClient,
        tools: Mapping[str, ToolSpec] | Iterable[ToolSpec],
        *,
        fixed_context: TrustedContext | None = None,
        wait_s: float | None = None,
        admit: Admission | None = None,
        queued: QueuedFor | None = None,
        approvals: Approvals | None = None,
        queries: CallQueries | None = None,
        groups: GroupService | None = None,
        name: str = "toolledger",
        version: str = "0.1.0",
    ) -> None:
        self.client = client
        self.tools = index_tools(tools)
        self.fixed_context = fixed_context
        self.wait_s = wait_s
        self.admit = admit
        self.queued = queued
        self.approvals = approvals or LedgerApprovals(client)
        self.listing = [mcp_tool(spec) for spec in self.tools.values()]
        self.groups: McpGroups | None = None
        if groups is not None:
            taken = sorted(set(GROUP_TOOLS) & set(self.tools))
            if taken:
                raise ValueError(f"tools named {taken} clash with the MCP server's group tools")
            self.groups = McpGroups(
                groups,
                key_schema(),
                _ERROR_SCHEMA,
                DEFAULT_GROUP_WAIT_S if wait_s is None else wait_s,
            )
            self.listing += self.groups.listing
        self._schemas = {tool.name: tool.input_schema for tool in self.listing}
        self.server: Server[Any] = Server(
            name,
            version=version,
            instructions=_INSTRUCTIONS,
            get_tool_input_schema=self._schemas.get,
            on_list_tools=self._list_tools,
        )
        # not on_call_tool=: a call may also be answered with a task handle (an extension's
        # result type, which the SDK's typed hook does not admit)
        self.server.add_request_handler("tools/call", types.CallToolRequestParams, self._call_tool)
        self.server.middleware.append(advertise_idempotency)
        self.tasks: McpTasks | None = None
        if queries is not None:
            self.tasks = McpTasks(
                queries,
                client,
                self.tools,
                lambda ctx: session_context(ctx, self.fixed_context),
                _tool_result,
            )
            self.tasks.install(self.server)

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool.model_copy(deep=True) for tool in self.listing])

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
        spec = self.tools.get(params.name)
        if spec is None and self.groups is not None and params.name in GROUP_TOOLS:
            return await self._group_tool(ctx, params)
        if spec is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
        sent = dict(params.arguments or {})
        # the SDK's params model drops fields it does not know: read the wire params
        params_key = request_idempotency_key(ctx.params)
        if params_key is not None and spec.keyed:
            argument_key = sent.get(KEY_ARGUMENT)
            if argument_key is not None and argument_key != params_key:
                raise MCPError(
                    types.INVALID_PARAMS,
                    f"The {PARAMS_KEY} parameter and the {KEY_ARGUMENT} argument differ: send "
                    "one of them, or the same key in both.",
                )
        context = session_context(ctx, self.fixed_context)
        if context is None:
            return _tool_result(
                refusal(ErrorCode.UNAUTHENTICATED, "This session is not authenticated.")
            )
        try:
            check_depth(sent)
        except NestingTooDeep as exc:
            return _tool_result(refusal(ErrorCode.VALIDATION_FAILED, str(exc)))
        meta: Mapping[str, Any] | None = params.meta

        async def attempt() -> CallResult:
            try:
                return await self.call(
                    spec,
                    dict(sent),
                    context,
                    run_id=_meta_string(meta, RUN_ID_META, 255),
                    step_id=_meta_string(meta, STEP_ID_META, 255),
                    approval_token=_meta_string(meta, APPROVAL_META, 4096),
                    idempotency_key=params_key if spec.keyed else None,
                )
            except Exception:
                # never a stack trace or a driver message to the caller; the same key is safe
                log.exception("mcp call failed", extra={"tool": spec.name})
                return refusal(ErrorCode.INTERNAL, "The ledger could not answer this call.")

        result = await attempt()
        request = pending_approval(result)
        if request is not None and request.approver_kind == "user" and elicits_form(ctx):
            shown = {k: v for k, v in sent.items() if k not in RESERVED_ARGUMENTS}
            answer = await self._ask(
                ctx, params, request, confirmation_message(request, context.principal, shown)
            )
            if isinstance(answer, types.InputRequiredResult):
                return answer
            if answer is not None:
                # the client asked its human: the user's own answer, whatever the token holds
                decided = await apply_decision(
                    self.approvals, request, confirmed_in_person(context), _confirmation(answer)
                )
                result = (
                    await attempt()
                    if decided.error is None
                    else CallResult(status=None, error=decided.error)
                )
        if self.tasks is not None:
            task = await self.tasks.handle(ctx, context, result)
            if task is not None:
                return task  # a running job: the client follows it with tasks/get
        if params_key is not None and spec.keyed:
            raise_idempotency_error(result, params_key)
        return _tool_result(result)

    async def _group_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        assert self.groups is not None
        context = session_context(ctx, self.fixed_context)
        if context is None:
            return _tool_result(
                refusal(ErrorCode.UNAUTHENTICATED, "This session is not authenticated.")
            )
        try:
            return await self.groups.call(
                params.name, params.arguments or {}, context, request_idempotency_key(ctx.params)
            )
        except MCPError:
            raise
        except Exception:  # never a stack trace to the caller; the same key is safe
            log.exception("mcp group call failed", extra={"tool": params.name})
            return _tool_result(refusal(ErrorCode.INTERNAL, "The ledger could not answer this."))

    async def _ask(
        self,
        ctx: ServerRequestContext[Any, Any],
        params: types.CallToolRequestParams,
        request: PendingApproval,
        message: str,
    ) -> types.ElicitResult | types.InputRequiredResult | None:
        """The user's answer to ``message`` about ``request``: on the 2026-07-28 protocol
        from the client's retry of this ``tools/call`` (the question rides an
        ``InputRequiredResult`` until then), on earlier ones from an ``elicitation/create``
        request now. None if the client could not be asked (the result then carries the
        request)."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            answer = (params.input_responses or {}).get(ELICITATION_KEY)
            if isinstance(answer, types.ElicitResult) and params.request_state == request.id:
                return answer
            question = types.ElicitRequest(
                params=types.ElicitRequestFormParams(
                    message=message, requested_schema=copy.deepcopy(_CONFIRM_SCHEMA)
                )
            )
            return types.InputRequiredResult(
                input_requests={ELICITATION_KEY: question}, request_state=request.id
            )
        try:
            return await ctx.session.elicit_form(
                message, copy.deepcopy(_CONFIRM_SCHEMA), related_request_id=ctx.request_id
            )
        except Exception:  # no back-channel, a client error, an invalid answer
            log.warning("the MCP client could not be asked to confirm", exc_info=True)
            return None

    async def call(
        self,
        spec: ToolSpec,
        arguments: dict[str, Any],
        context: TrustedContext,
        *,
        run_id: str | None = None,
        step_id: str | None = None,
        approval_token: str | None = None,
        idempotency_key: str | None = None,
    ) -> CallResult:
        """Take the key and the approval token out of ``arguments`` and run the call
        through the ledger. An ``approval_token`` argument (``null``: absent) wins over the
        ``approval_token`` parameter (the request's ``_meta`` entry). ``idempotency_key``
        (the request's ``idempotencyKey``, checked by the caller to be the argument's key
        when both are given) is the key when given; the argument's otherwise."""
        key: str | None = None
        if spec.keyed:
            raw_key = arguments.pop(KEY_ARGUMENT, None)
            raw_token = arguments.pop(APPROVAL_ARGUMENT, None)
            if idempotency_key is not None:
                raw_key = idempotency_key
            if raw_key is None:
                return refusal(
                    ErrorCode.IDEMPOTENCY_KEY_MISSING,
                    f"{spec.name} changes something: pass the argument {KEY_ARGUMENT}.",
                )
            if not isinstance(raw_key, str):
                return refusal(
                    ErrorCode.IDEMPOTENCY_KEY_INVALID, f"{KEY_ARGUMENT} must be a string."
                )
            key = raw_key
            if raw_token is not None:
                if not isinstance(raw_token, str):
                    return _invalid_approval_token(
                        f"{APPROVAL_ARGUMENT} must be a string.", "string_type"
                    )
                if not 0 < len(raw_token) <= MAX_APPROVAL_TOKEN:
                    return _invalid_approval_token(
                        f"{APPROVAL_ARGUMENT} must be 1 to {MAX_APPROVAL_TOKEN} characters.",
                        "string_length",
                    )
                approval_token = raw_token
        if self.admit is not None:
            refused = await self.admit(context, spec.name, key, run_id)
            if refused is not None:
                return CallResult(status=None, error=refused)
        queued = None
        if key is not None and self.queued is not None:
            queued = self.queued(context, spec.name, arguments)
        return await self.client.call(
            spec.name,
            arguments,
            idempotency_key=key,
            context=context,
            wait=self.wait_s,
            run_id=run_id,
            step_id=step_id,
            approval_token=approval_token,
            queued=queued,
        )

    async def run_stdio(self) -> None:
        """Serve one client over this process's stdin and stdout until it disconnects."""
        async with stdio_server() as (read_stream, write_stream):
            await self.server.run(
                AnsweringMalformed(read_stream, write_stream),
                write_stream,
                self.server.create_initialization_options(),
            )

    def http_app(
        self,
        authenticator: Authenticator,
        *,
        throttle: AuthThrottle,
        path: str = DEFAULT_PATH,
        host: str = "127.0.0.1",
        json_response: bool = False,
        stateless: bool = False,
        transport_security: TransportSecuritySettings | None = None,
    ) -> Starlette:
        """A Starlette app serving streamable HTTP at ``path`` (Bearer tokens checked with
        ``authenticator``: a :class:`producers.http.auth.TokenStore`, or the HTTP API's
        ``FrontDoor.authenticator`` for JWTs as well, and held back by ``throttle``, the HTTP
        API's, after too many refused tokens from one address) and an unauthenticated ``GET
        /healthz``. Run its lifespan (uvicorn does)."""
        if transport_security is None and host in ("127.0.0.1", "localhost", "::1"):
            # the SDK's own default for loopback servers: DNS rebinding protection
            transport_security = TransportSecuritySettings(
                enable_dns_rebinding_protection=True,
                allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
                allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
            )
        manager = StreamableHTTPSessionManager(
            app=self.server,
            json_response=json_response,
            stateless=stateless,
            security_settings=transport_security,
        )
        endpoint = BearerAuth(NestingGuard(StreamableHTTPASGIApp(manager)), authenticator, throttle)

        async def healthz(request: Request) -> JSONResponse:
            return JSONResponse({"status": "ok"})

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            async with manager.run():
                yield

        return Starlette(
            routes=[Route(path, endpoint=endpoint), Route("/healthz", healthz, methods=["GET"])],
            lifespan=lifespan,
        )


class AnsweringMalformed:
    """The stdio transport's inbound stream without its lines that are not JSON-RPC messages,
    each answered as JSON-RPC 2.0 asks, with ``id`` null: ``-32700`` (Parse error) for what is
    not JSON (or nests deeper than the parser's limit), ``-32600`` (Invalid Request) for JSON
    that is not a request, notification or response. The SDK's stdio transport hands such a
    line on as an exception, which its dispatcher only logs at debug level: the client would
    wait for an answer that never comes. (Over streamable HTTP the SDK answers them itself,
    with HTTP 400.)"""

    def __init__(
        self,
        inbound: ReadStream[SessionMessage | Exception],
        outbound: WriteStream[SessionMessage],
    ) -> None:
        self._inbound = inbound
        self._outbound = outbound

    @property
    def last_context(self) -> contextvars.Context | None:
        """The sender's context of the last item (the SDK's dispatcher runs handlers in it)."""
        context: contextvars.Context | None = getattr(self._inbound, "last_context", None)
        return context

    async def receive(self) -> SessionMessage | Exception:
        while True:
            item = await self._inbound.receive()
            if not isinstance(item, Exception):
                return item
            await self._outbound.send(
                SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=None, error=malformed(item)))
            )

    def __aiter__(self) -> AnsweringMalformed:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inbound.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def malformed(exc: Exception) -> types.ErrorData:
    """The JSON-RPC error for a message the transport could not read (``exc``: its parse or
    validation error); short, without the validator's dump of the input."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    if errors and all(e["type"] != "json_invalid" for e in errors):
        return types.ErrorData(
            code=types.INVALID_REQUEST,
            message="Invalid Request: not a JSON-RPC 2.0 request, notification or response.",
        )
    reason = errors[0]["msg"] if errors else type(exc).__name__
    return types.ErrorData(code=types.PARSE_ERROR, message=f"Parse error: {reason}")
