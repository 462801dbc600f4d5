"""Command-line options shared by ``toolledger serve`` and ``toolledger mcp``, and the
:class:`~toolledger.serve.Security` they build."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from processors.tools.registry import ToolRegistry
from processors.tools.retention import RetentionError, parse_retention
from toolledger.config import ConfigError

if TYPE_CHECKING:  # the commands start fast: the HTTP stack loads when a command runs
    from producers.http.auth import TokenStore
    from toolledger.serve import Security

KafkaOption = Annotated[str, typer.Option("--kafka", help="Kafka bootstrap servers.")]
ServeKafkaOption = Annotated[
    str | None, typer.Option("--kafka", help="Distributed mode: Kafka bootstrap servers.")
]
ServePostgresOption = Annotated[
    str | None, typer.Option("--postgres", help="Distributed mode: PostgreSQL URL.")
]
CreateOption = Annotated[
    bool,
    typer.Option(
        "--create",
        help="Make a new, empty embedded ledger in --data if there is none (without it, only "
        "in a new, empty directory: a missing ledger is never silently re-created).",
    ),
]


def creates(data: Path, create: bool) -> bool | None:
    """``--create`` as :class:`SqliteLog` takes it: True, or None (only in an empty directory,
    judged now, before anything such as the helpdesk store is written there)."""
    fresh = not data.exists() or (data.is_dir() and not any(data.iterdir()))
    return True if create or fresh else None


KeyRetentionOption = Annotated[
    str,
    typer.Option(
        "--key-retention",
        help="How long a finished call's key is kept, for tools whose manifest sets none: "
        "90s, 30m, 24h, 7d, PT24H, or 'forever'. After it, the same key runs as a new call.",
    ),
]


def key_retention(registry: ToolRegistry, text: str) -> None:
    """Apply ``--key-retention`` to ``registry`` (:class:`ConfigError` if it is no duration)."""
    try:
        registry.set_default_key_retention(parse_retention(text))
    except RetentionError as exc:
        raise ConfigError(str(exc)) from None


PrefixOption = Annotated[str, typer.Option("--prefix", help="Topic name prefix.")]

CacheEntriesOption = Annotated[
    int,
    typer.Option(
        "--cache-entries",
        min=1,
        help="Call keys the executor holds in memory (all partitions together); every other "
        "key is read from its store when used.",
    ),
]
PartitionsOption = Annotated[int, typer.Option("--partitions", help="Partitions per topic.")]
JwksOption = Annotated[
    Path | None,
    typer.Option(help="JWKS file (JSON): also accept JWT bearer tokens signed by its keys."),
]
JwtIssuerOption = Annotated[
    str | None, typer.Option(help="The 'iss' JWTs must carry (required with --jwks).")
]
JwtAudienceOption = Annotated[
    list[str] | None,
    typer.Option(help="An 'aud' JWTs may carry (required with --jwks; repeatable)."),
]
JwtAlgorithmsOption = Annotated[
    str, typer.Option(help="Accepted JWT algorithms, comma-separated (asymmetric only).")
]
JwtTenantClaimOption = Annotated[str, typer.Option(help="The JWT claim that names the tenant.")]
JwtPrincipalClaimOption = Annotated[
    str, typer.Option(help="The JWT claim that names the principal.")
]
JwtScopesClaimOption = Annotated[
    str | None,
    typer.Option(help="The JWT claim with the scopes (default: 'scope', else 'scopes')."),
]
JWT_ALGORITHMS = "RS256,ES256"
JWT_TENANT_CLAIM = "tenant_id"
JWT_PRINCIPAL_CLAIM = "sub"


def security(
    tokens: TokenStore,
    jwks: Path | None,
    jwt_issuer: str | None,
    jwt_audience: list[str] | None,
    jwt_algorithms: str,
    jwt_tenant_claim: str,
    jwt_principal_claim: str,
    jwt_scopes_claim: str | None,
    **governance: Any,
) -> Security:
    """The front door's :class:`Security` from the options (``governance``: its other fields)."""
    from producers.http.jwt_auth import ClaimNames
    from toolledger.serve import Security

    return Security(
        tokens,
        jwks,
        jwt_issuer,
        jwt_audience or None,
        jwt_algorithms=[a.strip() for a in jwt_algorithms.split(",") if a.strip()],
        jwt_claims=ClaimNames(jwt_tenant_claim, jwt_principal_claim, jwt_scopes_claim),
        **governance,
    )
