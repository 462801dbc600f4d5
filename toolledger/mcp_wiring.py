"""Wiring of the MCP server (``toolledger mcp``): stdio or streamable HTTP, on the embedded
backend (default) or on Kafka + PostgreSQL, through the same doors as ``toolledger serve``.

Authentication:

* ``--transport http``: every request needs ``Authorization: Bearer <token>``, checked with
  the same authenticator as ``toolledger serve`` builds: a token of the tokens file or, with
  ``--jwks`` (and ``--jwt-issuer``, ``--jwt-audience``; the other ``--jwt-*`` options as in
  ``toolledger serve``), a JWT signed by a key of that JWKS file. The tenant and principal
  come from the token of each request. ``--token`` is not used.
* ``--transport stdio``: a stdio server has no per-request credential, so the process is
  bound to one identity at start: ``--token`` (better: the environment variable
  ``TOOLLEDGER_MCP_TOKEN``, which does not show in the process list) is looked up in the
  tokens file, and the server refuses to start if it is not there. JWTs are not accepted
  here: the identity would outlive the token's expiry. An MCP client config then reads
  e.g. ``{"command": "toolledger", "args": ["mcp", "--data", "...", "--tokens", "..."],
  "env": {"TOOLLEDGER_MCP_TOKEN": "..."}}``.

stdout belongs to the protocol in stdio mode: logs go to stderr, and so do this command's
own messages.

The embedded ledger is single-node: one process per ``--data`` directory. A stdio server is
one process per MCP client, so on the embedded backend only one stdio client (and no
``toolledger serve``) can use a directory at a time; a second one exits with status 2. Serve
several clients with ``--transport http``, or run on Kafka + PostgreSQL.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from toolledger import options
from toolledger.options import (
    JWT_ALGORITHMS,
    JWT_PRINCIPAL_CLAIM,
    JWT_TENANT_CLAIM,
    CreateOption,
    JwksOption,
    JwtAlgorithmsOption,
    JwtAudienceOption,
    JwtIssuerOption,
    JwtPrincipalClaimOption,
    JwtScopesClaimOption,
    JwtTenantClaimOption,
    PartitionsOption,
    PrefixOption,
    ServeKafkaOption,
    ServePostgresOption,
)

if TYPE_CHECKING:  # imported when used: ``toolledger --help`` need not load the MCP SDK
    from starlette.applications import Starlette

    from toolledger.producers.client import QueuedProbe, TrustedContext
    from toolledger.producers.http.app import FrontDoor
    from toolledger.producers.http.auth import Authenticator, TokenStore
    from toolledger.producers.mcp_server import LedgerMcpServer

log = logging.getLogger("toolledger.mcp")

TOKEN_ENV = "TOOLLEDGER_MCP_TOKEN"
_err = Console(stderr=True, soft_wrap=True)


class Transport(StrEnum):
    STDIO = "stdio"
    HTTP = "http"


class McpConfigError(ValueError):
    pass


def stdio_context(tokens: TokenStore, token: str | None) -> TrustedContext:
    """The identity a stdio server runs as: ``token`` looked up in the tokens file."""
    if not token:
        raise McpConfigError(
            f"stdio needs an identity: set {TOKEN_ENV} (or pass --token) to a token of the "
            "tokens file"
        )
    context = tokens.authenticate(f"Bearer {token}")
    if context is None:
        raise McpConfigError(f"the token in {TOKEN_ENV} / --token is not in the tokens file")
    return context


def mcp_server(
    door: FrontDoor, *, fixed_context: TrustedContext | None = None, wait_s: float | None = None
) -> LedgerMcpServer:
    from toolledger.producers.http.governance import admission
    from toolledger.producers.mcp_server import LedgerMcpServer

    return LedgerMcpServer(
        door.client,
        door.tools,
        fixed_context=fixed_context,
        wait_s=wait_s,
        admit=admission(door),
        queued=queued_probes(door),
        queries=door.queries,
        groups=door.groups,
    )


def queued_probes(
    door: FrontDoor,
) -> Callable[[TrustedContext, str, Mapping[str, Any]], QueuedProbe]:
    """For a keyed MCP call: whether another intent holds its key with the same arguments and
    is still running, read from ``door``'s projection, as the HTTP API asks
    (docs/architecture.md#the-http-contract). The ledger client asks only once the call's
    wait has run out; then the call is
    answered ``IDEMPOTENCY_KEY_IN_USE`` (over MCP with ``idempotencyKey``: SEP-3182's
    ``idempotency_key_in_progress``) instead of waiting on for the running call's outcome.
    Arguments that differ from the key's first ones are never "in use": the executor refuses
    them at once."""
    from toolledger.producers.http.call_answer import queued_probe

    def probe(context: TrustedContext, tool: str, arguments: Mapping[str, Any]) -> QueuedProbe:
        info = door.tools.get(tool)
        if info is None:
            return _never_queued
        return queued_probe(door, context, info, dict(arguments))

    return probe


async def _never_queued(_call_id: str, _intent_id: str) -> bool:
    return False  # an unknown tool: the executor refuses the call at once


async def run_stdio(door: FrontDoor, context: TrustedContext, *, wait_s: float | None) -> None:
    log.info("mcp over stdio", extra={"tenant": context.tenant_id})
    await mcp_server(door, fixed_context=context, wait_s=wait_s).run_stdio()


def door_authenticator(door: FrontDoor) -> Authenticator:
    """What the HTTP API of ``door`` authenticates with: its authenticator (tokens file
    and/or JWTs) when it has one, else its tokens file."""
    return door.tokens if door.authenticator is None else door.authenticator


def mcp_http_app(door: FrontDoor, *, host: str, path: str, wait_s: float | None) -> Starlette:
    """The MCP server of ``door`` as a Starlette app: streamable HTTP at ``path``, Bearer
    tokens checked as the HTTP API checks them."""
    return mcp_server(door, wait_s=wait_s).http_app(
        door_authenticator(door), throttle=door.auth_throttle, path=path, host=host
    )


async def serve_http(
    door: FrontDoor, host: str, port: int, *, wait_s: float | None, path: str = "/mcp"
) -> None:
    import uvicorn

    from toolledger.http_server import AnnouncingServer

    app = mcp_http_app(door, host=host, path=path, wait_s=wait_s)
    config = uvicorn.Config(
        app, host=host, port=port, log_config=None, access_log=False, lifespan="on"
    )
    log.info("mcp over streamable http", extra={"host": host, "port": port, "path": path})
    await AnnouncingServer(config, what="toolledger mcp", path=path).serve()


def register_mcp_command(app: typer.Typer) -> None:
    """Add ``toolledger mcp`` to the CLI."""

    @app.command("mcp")
    def mcp(
        transport: Annotated[
            Transport, typer.Option("--transport", help="stdio, or streamable HTTP.")
        ] = Transport.STDIO,
        host: Annotated[str, typer.Option(help="HTTP: address to listen on.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(min=0, max=65535, help="HTTP: port.")] = 8081,
        data: options.DataOption = Path(".toolledger"),
        tokens: options.TokensOption = Path("tokens.json"),
        token: Annotated[
            str | None,
            typer.Option(
                envvar=TOKEN_ENV,
                show_envvar=True,
                help="stdio: the token (of the tokens file) this server acts as.",
            ),
        ] = None,
        tools: options.ToolsOption = None,
        demo: options.DemoOption = False,
        wait: Annotated[
            float,
            typer.Option(min=0.0, max=60.0, help="Seconds a call waits for its outcome."),
        ] = 10.0,
        kafka: ServeKafkaOption = None,
        postgres: ServePostgresOption = None,
        prefix: PrefixOption = "toolledger.",
        partitions: PartitionsOption = 4,
        jwks: JwksOption = None,
        jwt_issuer: JwtIssuerOption = None,
        jwt_audience: JwtAudienceOption = None,
        jwt_algorithms: JwtAlgorithmsOption = JWT_ALGORITHMS,
        jwt_tenant_claim: JwtTenantClaimOption = JWT_TENANT_CLAIM,
        jwt_principal_claim: JwtPrincipalClaimOption = JWT_PRINCIPAL_CLAIM,
        jwt_scopes_claim: JwtScopesClaimOption = None,
        create: CreateOption = False,
        key_retention: options.KeyRetentionOption = None,
        key_scope: options.KeyScopeOption = None,
    ) -> None:
        """Serve the tools over MCP (stdio by default; --transport http for streamable HTTP)."""
        import asyncio

        from toolledger import serve as wiring
        from toolledger.config import ConfigError, ToolSource
        from toolledger.heap import releasing_free_memory
        from toolledger.processors.runtime.sqlite_ledger import LedgerFileError
        from toolledger.producers.http.auth import TokenFileError, TokenStore

        if (kafka is None) != (postgres is None):
            _err.print("[red]distributed mode needs both --kafka and --postgres[/]")
            raise typer.Exit(2)
        try:
            source = ToolSource(tools, demo, data / "helpdesk.db")
            registry = source.load()
            token_store = TokenStore.load(tokens)
            context = stdio_context(token_store, token) if transport is Transport.STDIO else None
            security = options.security(
                token_store,
                jwks,
                jwt_issuer,
                jwt_audience,
                jwt_algorithms,
                jwt_tenant_claim,
                jwt_principal_claim,
                jwt_scopes_claim,
            )
            security.build(registry)  # the JWKS and the JWT settings, before anything is opened
            settings = options.door_settings(
                data,
                create,
                kafka,
                postgres,
                prefix=prefix,
                partitions=partitions,
                key_retention=key_retention,
                key_scope=options.key_scope(key_scope),
            )
            if kafka is None:  # written only once every check passed
                data.mkdir(parents=True, exist_ok=True)
                source.make_store()
        except (TokenFileError, McpConfigError, ConfigError, OSError) as exc:
            _err.print(f"[red]{exc}[/]")
            raise typer.Exit(2) from None

        async def main() -> None:
            async with wiring.front_door(settings, registry, security) as front:
                if context is not None:
                    await run_stdio(front, context, wait_s=wait)
                else:
                    await serve_http(front, host, port, wait_s=wait)

        def say(line: str) -> None:
            _err.print(line, style="red", markup=False, highlight=False)

        try:
            with options.services_reached(kafka, say):
                asyncio.run(releasing_free_memory(main()))
        except (LedgerFileError, ConfigError) as exc:  # e.g. another process holds the ledger
            _err.print(f"[red]{exc}[/]")
            raise typer.Exit(2) from None


def _standalone() -> None:
    """``python -m toolledger.mcp_wiring ...``: the same command outside the main CLI."""
    from toolledger import logs

    logs.configure("WARNING")
    app = typer.Typer(add_completion=False)
    register_mcp_command(app)
    app()


if __name__ == "__main__":
    _standalone()
