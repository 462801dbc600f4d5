"""Operator commands over the HTTP API of a running ``toolledger serve``:
``toolledger calls``, ``toolledger approvals`` and ``toolledger switch``.

Every command takes ``--url`` (else ``TOOLLEDGER_URL``, else ``http://127.0.0.1:8080``) and
``--token`` (better: ``TOOLLEDGER_TOKEN``, which does not show in the process list), and
prints the server's JSON answer on stdout: indented, or on one line with ``--json``.

Exit codes: 0 the server answered the request; 1 it refused it (its problem's title, detail
and suggested action go to stderr); 2 the command could not ask (no token, a bad URL, the
server down or silent), one line on stderr.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, NoReturn
from urllib.parse import quote

import typer

from toolledger.options import SectionedCommand
from toolledger.schemas.status import CallStatus

URL_ENV = "TOOLLEDGER_URL"
TOKEN_ENV = "TOOLLEDGER_TOKEN"
DEFAULT_URL = "http://127.0.0.1:8080"
TIMEOUT_S = 30.0  # an approval or a switch waits up to 10 s for the projection

EXIT_REFUSED = 1
EXIT_UNREACHABLE = 2
SERVER_PANEL = "Server"


class ApprovalStatus(StrEnum):
    """The ``status`` filter of ``GET /v1/approval-requests``."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    CONSUMED = "consumed"
    EXPIRED = "expired"


class SwitchScope(StrEnum):
    TENANT = "tenant"
    GLOBAL = "global"


UrlOption = Annotated[
    str,
    typer.Option(
        "--url",
        envvar=URL_ENV,
        show_envvar=True,
        help="Base URL of the toolledger server.",
        rich_help_panel=SERVER_PANEL,
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar=TOKEN_ENV,
        show_envvar=True,
        show_default=False,
        help="Bearer token (a token of the server's tokens file, or a JWT). Prefer the "
        "environment variable: it does not show in the process list.",
        rich_help_panel=SERVER_PANEL,
    ),
]
CompactOption = Annotated[
    bool, typer.Option("--json", help="Print the answer as compact JSON on one line.")
]
LimitOption = Annotated[int, typer.Option("--limit", min=1, max=500, help="Items per page.")]
CursorOption = Annotated[
    str | None, typer.Option("--cursor", help="The next_cursor of the previous page.")
]
ReasonOption = Annotated[
    str,
    typer.Option("--reason", help="Why (kept in the audit trail; 1 to 1000 characters)."),
]


def _fail(code: int, message: str) -> NoReturn:
    typer.echo(f"toolledger: {' '.join(message.split())}", err=True)
    raise typer.Exit(code)


@dataclass(frozen=True)
class Api:
    """Where the commands send their requests, as whom, and how answers are printed."""

    url: str
    token: str | None
    compact: bool = False

    @property
    def base(self) -> str:
        return self.url.rstrip("/")

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str | int | None] | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        """Send one request and print its answer; exits 1 on a refusal, 2 if nothing came."""
        import httpx  # the ledger's own commands do not need the HTTP client

        if not self.token:
            _fail(
                EXIT_UNREACHABLE,
                f"no token: pass --token or set {TOKEN_ENV} (a token of the server's tokens "
                "file, or a JWT)",
            )
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Accept": "application/json, application/problem+json",
        }
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            with httpx.Client(base_url=self.base, headers=headers, timeout=TIMEOUT_S) as client:
                response = client.request(method, path, params=query, json=body)
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            _fail(EXIT_UNREACHABLE, f"--url {self.url!r} is not a usable URL: {exc}")
        except httpx.TimeoutException:
            _fail(EXIT_UNREACHABLE, f"no answer from the server at {self.base} in {TIMEOUT_S:g} s")
        except httpx.TransportError as exc:  # refused, unresolvable, reset, no http:// ...
            reason = str(exc) or type(exc).__name__
            _fail(EXIT_UNREACHABLE, f"cannot reach the server at {self.base}: {reason}")
        answer = _json_of(response)
        if response.is_success and answer is not None:
            self.show(answer)
            return
        where = f"{method} {self.base}{path}"
        if isinstance(answer, dict) and ("title" in answer or "detail" in answer):
            report_problem(answer, response.status_code)
            raise typer.Exit(EXIT_REFUSED)
        snippet = " ".join(response.text.split())[:200] or "(empty body)"
        _fail(EXIT_REFUSED, f"{where} answered HTTP {response.status_code}: {snippet}")

    def show(self, answer: Any) -> None:
        if self.compact:
            text = json.dumps(answer, separators=(",", ":"), ensure_ascii=False)
        else:
            text = json.dumps(answer, indent=2, ensure_ascii=False)
        typer.echo(text)


def _json_of(response: Any) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def report_problem(problem: dict[str, Any], status: int) -> None:
    """An ``application/problem+json`` answer, for a human, on stderr."""
    title = problem.get("title") or "The server refused the request"
    code = problem.get("code")
    typer.echo(f"{title} (HTTP {status}{f', {code}' if code else ''})", err=True)
    if problem.get("detail"):
        typer.echo(f"  {problem['detail']}", err=True)
    for error in problem.get("errors") or ():
        if isinstance(error, dict):
            typer.echo(f"  - {error.get('loc', '')}: {error.get('msg', '')}", err=True)
    request = problem.get("approval_request")
    if isinstance(request, dict) and request.get("id"):
        typer.echo(f"  approval request: {request['id']} ({request.get('status')})", err=True)
    if problem.get("suggested_action"):
        typer.echo(f"  what to do: {problem['suggested_action']}", err=True)


def _segment(value: str) -> str:
    return quote(value, safe="")


calls_app = typer.Typer(
    help="Read the calls of your tenant: one by id, a search, or a call's events.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)
approvals_app = typer.Typer(
    help="List, read and decide approval requests (needs the 'operator' scope).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)
switch_app = typer.Typer(
    help="Switch a tool off or on again: the kill switch (needs the 'operator' scope).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)


@calls_app.command("get", cls=SectionedCommand)
def calls_get(
    call_id: Annotated[str, typer.Argument(help="The call's id (call_id of its answer).")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    compact: CompactOption = False,
) -> None:
    """Print one call: GET /v1/calls/CALL_ID."""
    Api(url, token, compact).request("GET", f"/v1/calls/{_segment(call_id)}")


@calls_app.command("search", cls=SectionedCommand)
def calls_search(
    tool: Annotated[str | None, typer.Option("--tool", help="Calls of this tool.")] = None,
    key: Annotated[
        str | None, typer.Option("--key", help="Calls with this idempotency key.")
    ] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Calls of this run.")] = None,
    status: Annotated[
        CallStatus | None,
        typer.Option("--status", case_sensitive=False, help="Calls in this state."),
    ] = None,
    limit: LimitOption = 50,
    cursor: CursorOption = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    compact: CompactOption = False,
) -> None:
    """Search the calls, newest first: GET /v1/calls."""
    params: dict[str, str | int | None] = {
        "tool": tool,
        "idempotency_key": key,
        "run_id": run_id,
        "status": None if status is None else status.value,
        "limit": limit,
        "cursor": cursor,
    }
    Api(url, token, compact).request("GET", "/v1/calls", params=params)


@calls_app.command("events", cls=SectionedCommand)
def calls_events(
    call_id: Annotated[str, typer.Argument(help="The call's id.")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    compact: CompactOption = False,
) -> None:
    """Print a call's audit trail: GET /v1/calls/CALL_ID/events."""
    Api(url, token, compact).request("GET", f"/v1/calls/{_segment(call_id)}/events")


ApprovalIdArgument = Annotated[
    str, typer.Argument(help="The approval request's id (the id of the 428's approval_request).")
]


@approvals_app.command("list", cls=SectionedCommand)
def approvals_list(
    status: Annotated[
        ApprovalStatus | None,
        typer.Option("--status", case_sensitive=False, help="Only requests in this state."),
    ] = None,
    limit: LimitOption = 50,
    cursor: CursorOption = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    compact: CompactOption = False,
) -> None:
    """List approval requests: GET /v1/approval-requests."""
    params: dict[str, str | int | None] = {
        "status": None if status is None else status.value,
        "limit": limit,
        "cursor": cursor,
    }
    Api(url, token, compact).request("GET", "/v1/approval-requests", params=params)


@approvals_app.command("get", cls=SectionedCommand)
def approvals_get(
    approval_id: ApprovalIdArgument,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    compact: CompactOption = False,
) -> None:
    """Print one approval request: GET /v1/approval-requests/ID."""
    Api(url, token, compact).request("GET", f"/v1/approval-requests/{_segment(approval_id)}")


@approvals_app.command("approve", cls=SectionedCommand)
def approvals_approve(
    approval_id: ApprovalIdArgument,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    compact: CompactOption = False,
) -> None:
    """Approve a pending request: prints the approval_token the agent sends with the same
    call. Four eyes: the principal who asked for the call cannot approve it."""
    path = f"/v1/approval-requests/{_segment(approval_id)}/approve"
    Api(url, token, compact).request("POST", path)


@approvals_app.command("deny", cls=SectionedCommand)
def approvals_deny(
    approval_id: ApprovalIdArgument,
    reason: ReasonOption,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    compact: CompactOption = False,
) -> None:
    """Deny a pending request, with the reason the agent is told."""
    path = f"/v1/approval-requests/{_segment(approval_id)}/deny"
    Api(url, token, compact).request("POST", path, body={"reason": reason})


ToolArgument = Annotated[str, typer.Argument(help="The tool's name, or '*' for every tool.")]
ScopeOption = Annotated[
    SwitchScope,
    typer.Option(
        "--scope",
        case_sensitive=False,
        help="Your tenant, or every tenant (needs 'operator:global').",
    ),
]


def _switch(tool: str, enabled: bool, reason: str, scope: SwitchScope, api: Api) -> None:
    body = {"enabled": enabled, "reason": reason, "scope": scope.value}
    api.request("PUT", f"/v1/tools/{_segment(tool)}/switch", body=body)


@switch_app.command("off", cls=SectionedCommand)
def switch_off(
    tool: ToolArgument,
    reason: ReasonOption,
    scope: ScopeOption = SwitchScope.TENANT,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    compact: CompactOption = False,
) -> None:
    """Switch a tool off: new calls of it are refused (503 TOOL_DISABLED) until it is on
    again; a call the ledger knows already is still answered from it."""
    _switch(tool, False, reason, scope, Api(url, token, compact))


@switch_app.command("on", cls=SectionedCommand)
def switch_on(
    tool: ToolArgument,
    reason: ReasonOption,
    scope: ScopeOption = SwitchScope.TENANT,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    compact: CompactOption = False,
) -> None:
    """Switch a tool on again."""
    _switch(tool, True, reason, scope, Api(url, token, compact))


def register_operator_commands(app: typer.Typer) -> None:
    """Add ``toolledger calls``, ``approvals`` and ``switch`` to the CLI."""
    for name, group in (("calls", calls_app), ("approvals", approvals_app), ("switch", switch_app)):
        assert group.info.help is not None
        app.add_typer(group, name=name, short_help=group.info.help)
