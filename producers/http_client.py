"""``HttpLedgerClient``: :meth:`LedgerClient.call` answered by a remote toolledger over its
HTTP API, for applications and adapters that do not run the ledger in their process.

It follows the server's semantics rather than adding its own:

- ``wait`` becomes ``Prefer: wait=<seconds>``; a ``202`` (still running when the wait ran out)
  is a PENDING result, and asking again with the same key and arguments gets the outcome;
- ``409 IDEMPOTENCY_KEY_IN_USE`` is PENDING too (another call with the key runs);
- a ``503`` or ``429`` with ``Retry-After`` is tried again after that delay while the wait
  lasts (the key makes it safe: the ledger runs a keyed call at most once), then returned;
- a server that cannot be reached raises :class:`TransportError` naming the URL: the call
  may or may not have been appended, and the same key makes calling again safe.

The tenant and principal are the token's: the server authenticates every request. A
``context`` passed to :meth:`call` only names the tenant for the call ids of refusals (which
the server does not give).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from toolledger.producers.approvals import Decision, PendingApproval, deny_reason
from toolledger.producers.client import (
    DEFAULT_WAIT_S,
    MAX_WAIT_S,
    CallResult,
    TransportError,
    TrustedContext,
)
from toolledger.schemas.errors import ErrorCode, ErrorInfo, FieldError
from toolledger.schemas.groups import GroupAnswer, GroupView
from toolledger.schemas.keys import (
    DEFAULT_KEY_SCOPE,
    CallKey,
    InvalidIdempotencyKey,
    check_idempotency_key,
)
from toolledger.schemas.nesting import NestingTooDeep
from toolledger.schemas.status import CallStatus

PROBLEM = "application/problem+json"
CONNECT_TIMEOUT_S = 5.0
# time for the server to answer beyond the wait it was asked for
ANSWER_MARGIN_S = 15.0


@dataclass(frozen=True, slots=True)
class RemoteTool:
    """A tool as ``GET /v1/tools`` lists it (what the adapters need: ``ToolSpec``)."""

    name: str
    keyed: bool
    manifest: Mapping[str, Any]


class HttpLedgerClient:
    """``async with HttpLedgerClient(url, token) as client: await client.call(...)``."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        default_wait_s: float = DEFAULT_WAIT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self._default_wait_s = default_wait_s
        self._http = httpx.AsyncClient(
            base_url=self.url,
            transport=transport,
            timeout=httpx.Timeout(MAX_WAIT_S + ANSWER_MARGIN_S, connect=CONNECT_TIMEOUT_S),
            headers={"Authorization": f"Bearer {token}"},
        )

    async def __aenter__(self) -> HttpLedgerClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        idempotency_key: str | None,
        context: TrustedContext | None = None,
        wait: float | None = None,
        run_id: str | None = None,
        step_id: str | None = None,
        approval_token: str | None = None,
    ) -> CallResult:
        """Run ``tool`` at most once per ``idempotency_key`` on the server; see the module."""
        call_id = ""  # the server names the call (in the key's scope), a refusal here too
        if context is not None and idempotency_key:  # in the scope of a new ledger's keys
            scoped = CallKey.scoped(
                DEFAULT_KEY_SCOPE, context.tenant_id, context.principal, tool, idempotency_key
            )
            call_id = scoped.call_id
        if idempotency_key is not None:
            try:
                check_idempotency_key(idempotency_key)
            except InvalidIdempotencyKey as exc:
                return _refused(ErrorCode.IDEMPOTENCY_KEY_INVALID, str(exc), call_id)
        body: dict[str, Any] = {"arguments": arguments}
        body.update(
            (name, value)
            for name, value in (
                ("run_id", run_id),
                ("step_id", step_id),
                ("approval_token", approval_token),
            )
            if value is not None
        )
        try:
            content = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError, UnicodeEncodeError) as exc:
            return _refused(
                ErrorCode.VALIDATION_FAILED,
                f"The arguments are not a JSON document: {exc}",
                call_id,
            )
        except RecursionError:  # deeper than any parser follows (the server refuses the rest)
            return _refused(
                ErrorCode.VALIDATION_FAILED, str(NestingTooDeep("the arguments")), call_id
            )
        headers = {"Content-Type": "application/json"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        waited = min(MAX_WAIT_S, self._default_wait_s if wait is None else max(0.0, wait))
        deadline = time.monotonic() + waited
        path = f"/v1/tools/{quote(tool, safe='')}/calls"
        while True:
            left = max(0.0, deadline - time.monotonic())
            headers["Prefer"] = f"wait={left:.3f}"
            response = await self._send("POST", path, content=content, headers=headers)
            delay = _retry_after(response)
            if (
                response.status_code in (429, 503)
                and delay is not None
                and time.monotonic() + delay < deadline
            ):
                await asyncio.sleep(delay)
                continue
            return _result_of(response, call_id)

    async def run_group(
        self,
        steps: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str,
        run_id: str,
        on_failure: str = "compensate",
        context: TrustedContext | None = None,
        wait: float | None = None,
    ) -> GroupAnswer:
        """Submit a call group (``POST /v1/groups``) and wait up to ``wait`` seconds for it to
        finish; a refusal (an invalid definition, the key used for another one) is returned
        as the answer's ``error``, nothing stored. ``context`` is not used: the token says who
        submits (it is taken, as by :meth:`call`, so this client runs a turn's group in the
        agent adapters like any other)."""
        body = {"run_id": run_id, "on_failure": on_failure, "steps": list(steps)}
        waited = min(MAX_WAIT_S, self._default_wait_s if wait is None else max(0.0, wait))
        headers = {"Idempotency-Key": idempotency_key, "Prefer": f"wait={waited:.3f}"}
        response = await self._send("POST", "/v1/groups", json=body, headers=headers)
        return _group_answer(response)

    async def resume_group(
        self,
        group_id: str,
        *,
        approval_tokens: Mapping[str, str] | None = None,
        context: TrustedContext | None = None,
        wait: float | None = None,
    ) -> GroupAnswer:
        """Continue a BLOCKED or FAILED group (``POST /v1/groups/{id}/resume``); ``context``:
        as in :meth:`run_group`."""
        waited = min(MAX_WAIT_S, self._default_wait_s if wait is None else max(0.0, wait))
        response = await self._send(
            "POST",
            f"/v1/groups/{quote(group_id, safe='')}/resume",
            json={"approval_tokens": dict(approval_tokens or {})},
            headers={"Prefer": f"wait={waited:.3f}"},
        )
        return _group_answer(response)

    async def tools(self) -> list[RemoteTool]:
        """The server's tools (``GET /v1/tools``, every page), as the adapters take them."""
        tools: list[RemoteTool] = []
        params: dict[str, str] = {}
        while True:
            response = await self._send("GET", "/v1/tools", params=params)
            page = _json(response)
            if response.status_code != 200:
                raise TransportError(f"{response.url} answered {response.status_code}: {page}")
            tools.extend(
                RemoteTool(t["name"], bool(t.get("idempotency_key_required")), t)
                for t in page.get("items", [])
            )
            cursor = page.get("next_cursor")
            if not cursor:
                return tools
            params = {"cursor": str(cursor)}

    async def approve(
        self, request: PendingApproval, context: TrustedContext | None = None
    ) -> Decision:
        """Grant ``request`` as this client's token (``POST
        /v1/approval-requests/{id}/approve``): the same call then goes ahead without a token.
        The server decides who may (``context`` is not used: the token says who decides)."""
        return await self._decide(request, "approve", None)

    async def deny(
        self, request: PendingApproval, context: TrustedContext | None = None, reason: str = ""
    ) -> Decision:
        """Deny ``request`` with ``reason`` as this client's token (``POST
        /v1/approval-requests/{id}/deny``): the same call then answers ``APPROVAL_INVALID``."""
        return await self._decide(request, "deny", {"reason": deny_reason(reason)})

    async def _decide(
        self, request: PendingApproval, verb: str, body: Mapping[str, str] | None
    ) -> Decision:
        path = f"/v1/approval-requests/{quote(request.id, safe='')}/{verb}"
        response = await self._send("POST", path, json=body)
        if response.status_code in (200, 202):
            return Decision(request.id, confirmed=response.status_code == 200)
        data = _json(response)
        if isinstance(data.get("code"), str):
            return Decision(request.id, _problem_result(response.status_code, data, "").error)
        raise TransportError(f"{response.url} answered {response.status_code} with no decision")

    async def get_call(self, call_id: str) -> dict[str, Any] | None:
        """The Call resource (``GET /v1/calls/{id}``), or None if this tenant has no such call."""
        response = await self._send("GET", f"/v1/calls/{quote(call_id, safe='')}")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise TransportError(f"{response.url} answered {response.status_code}")
        return _json(response)

    async def report_job(self, call_id: str, report: Mapping[str, Any]) -> tuple[int, Any]:
        """A job reports its status (``POST /v1/calls/{id}/job``): (HTTP status, body)."""
        response = await self._send(
            "POST", f"/v1/calls/{quote(call_id, safe='')}/job", json=dict(report)
        )
        return response.status_code, _json(response)

    async def cancel_job(self, call_id: str) -> tuple[int, Any]:
        """Cancel a call's job (``POST /v1/calls/{id}/job/cancel``): (HTTP status, body)."""
        response = await self._send("POST", f"/v1/calls/{quote(call_id, safe='')}/job/cancel")
        return response.status_code, _json(response)

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise TransportError(
                f"toolledger at {self.url} could not be reached ({type(exc).__name__}: {exc}); "
                "a keyed call may or may not have been appended: calling again with the same "
                "key and arguments is safe"
            ) from exc


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    return float(value) if value.isdigit() else None


def _result_of(response: httpx.Response, call_id: str) -> CallResult:
    """The caller's view of the server's answer, as :func:`producers.client.result_of` gives
    it in-process (without the event: the server does not send it)."""
    data = _json(response)
    media = response.headers.get("content-type", "").split(";")[0].strip()
    if media == PROBLEM and isinstance(data.get("code"), str):
        return _problem_result(response.status_code, data, call_id)
    if "status" not in data or response.status_code not in (200, 202):
        raise TransportError(
            f"{response.url} answered {response.status_code} with no call or problem in it"
        )
    status = CallStatus(data["status"])
    error = ErrorInfo.model_validate(data["error"]) if data.get("error") else None
    running = response.status_code == 202
    if running:
        error = ErrorInfo.of(ErrorCode.IDEMPOTENCY_KEY_IN_USE, "The call is running.")
    return CallResult(
        status,
        data.get("result"),
        error=error,
        attempts=int(data.get("attempts", 0)),
        replayed=response.headers.get("idempotent-replayed") == "true",
        running=running,
        call_id=str(data.get("call_id", call_id)),
        job=data.get("job"),
    )


def _problem_result(status: int, data: dict[str, Any], call_id: str) -> CallResult:
    error = ErrorInfo(
        code=data["code"],
        message=str(data.get("detail", "")),
        retryable=bool(data.get("retryable")),
        suggested_action=str(data.get("suggested_action", "")),
    )
    call_id = str(data.get("call_id") or call_id)
    if error.code == ErrorCode.IDEMPOTENCY_KEY_IN_USE or (
        status == 503 and error.code == ErrorCode.INTERNAL
    ):
        return CallResult(CallStatus.PENDING, error=error, call_id=call_id)
    field_errors = tuple(FieldError.model_validate(e) for e in data.get("errors") or ())
    return CallResult(
        None,
        error=error,
        call_id=call_id,
        field_errors=field_errors,
        approval_request=data.get("approval_request"),
    )


def _group_answer(response: httpx.Response) -> GroupAnswer:
    data = _json(response)
    if response.status_code in (200, 202) and "group_id" in data:
        replayed = response.headers.get("idempotent-replayed") == "true"
        return GroupAnswer(GroupView.model_validate(data), replayed=replayed)
    if isinstance(data.get("code"), str):
        refusal = _problem_result(response.status_code, data, "")
        return GroupAnswer(error=refusal.error, field_errors=refusal.field_errors)
    raise TransportError(f"{response.url} answered {response.status_code} with no group in it")


def _refused(code: ErrorCode, message: str, call_id: str) -> CallResult:
    return CallResult(status=None, error=ErrorInfo.of(code, message), call_id=call_id)
