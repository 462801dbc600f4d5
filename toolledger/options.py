"""Command-line options shared by ``toolledger serve`` and ``toolledger mcp``, and the
:class:`~toolledger.serve.Security` they build."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand

from toolledger.config import ConfigError
from toolledger.processors.runtime.ledger_file import LedgerFileError, must_create, traces
from toolledger.processors.toolsets.helpdesk import holds_effects
from toolledger.schemas.keys import KeyScope

if TYPE_CHECKING:  # the commands start fast: the HTTP stack loads when a command runs
    from toolledger.producers.http.auth import TokenStore
    from toolledger.serve import Security
    from toolledger.settings import LedgerSettings

JWT_PANEL = "JWT bearer tokens"
DISTRIBUTED_PANEL = "Distributed mode (Kafka + PostgreSQL)"
HELPDESK_PANEL = "The demo's helpdesk tools (only with --demo)"

ToolsOption = Annotated[
    str | None,
    typer.Option(
        "--tools",
        envvar="TOOLLEDGER_TOOLS",
        help="The tools: module:attribute (imported from the working directory, e.g. "
        "mytools:registry) or path/to/file.py:attribute, naming a Registry or a function "
        "without arguments that returns one.",
    ),
]
DemoOption = Annotated[
    bool,
    typer.Option(
        "--demo",
        help="The demo's helpdesk tools (toolledger.examples.helpdesk:registry) instead of "
        "--tools; their side effects go to a SQLite file, helpdesk.db in --data.",
    ),
]


class SectionedCommand(TyperCommand):
    """A command whose plain help lists its options in sections: ``rich_help_panel`` names
    an option's section ("Options" when it has none), in the order they first appear."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        arguments: list[tuple[str, str]] = []
        sections: dict[str, list[tuple[str, str]]] = {"Options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append(record)
            else:
                panel = getattr(param, "rich_help_panel", None) or "Options"
                sections.setdefault(panel, []).append(record)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        for title, rows in sections.items():
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


# The optional packages of each extra: commands that need one import it when they run.
EXTRAS: dict[str, tuple[str, ...]] = {
    "kafka": ("aiokafka",),
    "postgres": ("psycopg", "psycopg_pool"),
    "mcp": ("mcp",),
    "export": ("pyarrow", "duckdb"),
}


class MissingExtra(ConfigError):
    pass


def require(*extras: str, what: str) -> None:
    """:class:`MissingExtra` naming the ``pip install`` line if a package of ``extras`` is
    not installed (``what``: the command or mode that needs them)."""
    missing: dict[str, str] = {}  # extra -> its first module that does not import
    for extra in extras:
        for module in EXTRAS[extra]:
            try:
                importlib.import_module(module)
            except ImportError:
                missing[extra] = module
                break
    if missing:
        modules = " and ".join(missing.values())
        raise MissingExtra(
            f"{what} needs {modules} (not installed): pip install 'toolledger[{','.join(missing)}]'"
        )


KafkaOption = Annotated[
    str, typer.Option("--kafka", envvar="TOOLLEDGER_KAFKA", help="Kafka bootstrap servers.")
]
ServeKafkaOption = Annotated[
    str | None,
    typer.Option(
        "--kafka",
        help="Distributed mode: Kafka bootstrap servers (with --postgres).",
        rich_help_panel=DISTRIBUTED_PANEL,
    ),
]
ServePostgresOption = Annotated[
    str | None,
    typer.Option(
        "--postgres",
        help="Distributed mode: PostgreSQL URL (with --kafka).",
        rich_help_panel=DISTRIBUTED_PANEL,
    ),
]
CreateOption = Annotated[
    bool,
    typer.Option(
        "--create",
        help="Make a new, empty embedded ledger in --data if there never was one (without it, "
        "only in a new, empty directory). Refused where a ledger was (its id file, WAL or lock, "
        "or the helpdesk store, are there): a missing ledger is never re-created.",
    ),
]


def door_settings(
    data: Path, create: bool, kafka: str | None, postgres: str | None, **given: Any
) -> LedgerSettings:
    """The settings of a front door (``serve``, ``mcp``) from its options: the embedded ledger
    in ``data`` unless both ``--kafka`` and ``--postgres`` are given; ``given``: the other
    fields of :class:`~toolledger.settings.LedgerSettings` (:class:`ConfigError` if one is
    wrong, or if ``--create`` is refused: :func:`creates`)."""
    from toolledger.config import DEFAULT_KAFKA
    from toolledger.settings import EMBEDDED, KAFKA, LedgerSettings

    return LedgerSettings.of(
        backend=EMBEDDED if kafka is None or postgres is None else KAFKA,
        path=data / "ledger.db",
        create=creates(data, create, embedded=kafka is None),
        kafka=kafka or DEFAULT_KAFKA,
        postgres=postgres,
        **given,
    )


def creates(data: Path, create: bool, *, embedded: bool) -> bool | None:
    """``--create`` as :class:`SqliteLedger` takes it: True, or None (only in an empty directory,
    judged now, before anything such as the helpdesk store is written there). On the embedded
    backend the ledger file is checked here too, before anything is written, and refused
    (:class:`ConfigError`, one line) where :func:`must_create` refuses it, or where a helpdesk
    store that recorded effects is but no ledger: the effects were made under a ledger that is
    gone, whose keys would all run again (``--create`` too)."""
    fresh = not data.exists() or (data.is_dir() and not any(data.iterdir()))
    new = True if create or fresh else None
    if not embedded:
        return new
    store, ledger = data / "helpdesk.db", data / "ledger.db"
    if not ledger.exists() and not traces(ledger) and holds_effects(store):
        raise ConfigError(
            f"{ledger} is missing but the helpdesk store {store.name} holds effects: a ledger "
            f"was here and was deleted or moved; restore it, or delete the whole directory "
            f"{data} for a new, empty ledger (whose keys all run again)"
        )
    try:
        must_create(ledger, new)
    except LedgerFileError as exc:
        raise ConfigError(str(exc)) from None
    return new


KeyRetentionOption = Annotated[
    str | None,
    typer.Option(
        "--key-retention",
        envvar="TOOLLEDGER_KEY_RETENTION",
        help="How long a finished call's key is kept, for tools whose manifest sets none: "
        "90s, 30m, 24h, 7d, PT24H, or 'forever' (default: the tools' registry's, 24h). After "
        "it, the same key runs as a new call. On Kafka the deployment's is recorded on its "
        "settings topic (set by 'toolledger topics --key-retention', else by the first process "
        "to start): a process whose option disagrees refuses to start.",
    ),
]


KeyScopeOption = Annotated[
    str | None,
    typer.Option(
        "--key-scope",
        help="Whose keys an idempotency key names a call among, for tools that set none: "
        "'tenant' (any principal of the tenant sending the key and the same arguments gets "
        "that call's outcome) or 'tenant+principal' (each principal's keys are its own). "
        "Default: the embedded ledger's, recorded when it was made (tenant+principal for a new "
        "one; another one is refused); on Kafka tenant+principal, and serve and executor must "
        "say the same (the executor refuses keys of another scope).",
    ),
]


def key_scope(text: str | None) -> KeyScope | None:
    """``--key-scope`` (None if not given); :class:`ConfigError` naming the two scopes."""
    try:
        return None if text is None else KeyScope.parse(text)
    except ValueError as exc:
        raise ConfigError(f"--key-scope: {exc}") from None


TopicIntentsRetentionOption = Annotated[
    str,
    typer.Option(
        help="How long the intents topic keeps intents (`topics` sets it on every run, "
        "`executor` only when it creates the topic). They hold the only copy of raw arguments: "
        "this is the retention of sensitive data (90s, 30m, 24h, 7d, P7D).",
    ),
]
AuditRetentionOption = Annotated[
    str,
    typer.Option(
        help="How long the audit trail keeps the record of a finished call whose key has "
        "expired (30d, 720h, or 'forever'). Open calls and live keys keep theirs. One process "
        "per read model prunes it: the front door (serve) or the projector.",
    ),
]
PrefixOption = Annotated[
    str, typer.Option("--prefix", envvar="TOOLLEDGER_PREFIX", help="Topic name prefix.")
]

CacheEntriesOption = Annotated[
    int,
    typer.Option(
        "--cache-entries",
        min=1,
        help="Call keys the executor holds in memory (all partitions together); every other "
        "key is read from its store when used.",
    ),
]
PartitionsOption = Annotated[
    int,
    typer.Option(
        "--partitions", envvar="TOOLLEDGER_PARTITIONS", min=1, help="Partitions per topic."
    ),
]
DataOption = Annotated[
    Path,
    typer.Option("--data", envvar="TOOLLEDGER_DATA", help="Embedded ledger directory."),
]
TokensOption = Annotated[
    Path, typer.Option("--tokens", envvar="TOOLLEDGER_TOKENS", help="Tokens file (JSON).")
]
JwksOption = Annotated[
    Path | None,
    typer.Option(
        help="JWKS file (JSON): also accept JWT bearer tokens signed by its keys.",
        rich_help_panel=JWT_PANEL,
    ),
]
JwtIssuerOption = Annotated[
    str | None,
    typer.Option(
        help="The 'iss' JWTs must carry (required with --jwks).", rich_help_panel=JWT_PANEL
    ),
]
JwtAudienceOption = Annotated[
    list[str] | None,
    typer.Option(
        help="An 'aud' JWTs may carry (required with --jwks; repeatable).",
        rich_help_panel=JWT_PANEL,
    ),
]
JwtAlgorithmsOption = Annotated[
    str,
    typer.Option(
        help="Accepted JWT algorithms, comma-separated (asymmetric only).",
        rich_help_panel=JWT_PANEL,
    ),
]
JwtTenantClaimOption = Annotated[
    str, typer.Option(help="The JWT claim that names the tenant.", rich_help_panel=JWT_PANEL)
]
JwtPrincipalClaimOption = Annotated[
    str, typer.Option(help="The JWT claim that names the principal.", rich_help_panel=JWT_PANEL)
]
JwtScopesClaimOption = Annotated[
    str | None,
    typer.Option(
        help="The JWT claim with the scopes (default: 'scope', else 'scopes').",
        rich_help_panel=JWT_PANEL,
    ),
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
    from toolledger.producers.http.jwt_auth import ClaimNames
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


def _unreachable() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """The errors of a Kafka cluster and of a PostgreSQL server that cannot be reached (none
    where the extra that brings its client is not installed)."""
    kafka: tuple[type[BaseException], ...] = ()
    postgres: tuple[type[BaseException], ...] = ()
    try:
        from aiokafka.errors import KafkaConnectionError

        kafka = (KafkaConnectionError,)
    except ImportError:
        pass
    try:
        from psycopg import OperationalError

        from toolledger.projections.postgres import ProjectionUnavailable

        postgres = (OperationalError, ProjectionUnavailable)
    except ImportError:
        pass
    return kafka, postgres


@contextlib.contextmanager
def services_reached(kafka: str | None, say: Callable[[str], None]) -> Iterator[None]:
    """A command of the distributed backend whose Kafka cluster or PostgreSQL server cannot be
    reached says so in one line (``say``) and exits 1, instead of a traceback."""
    kafka_down, postgres_down = _unreachable()
    try:
        yield
    except kafka_down as exc:
        say(
            f"cannot reach Kafka at {kafka} ({' '.join(str(exc).split())}): start the broker, "
            "or name it with --kafka or TOOLLEDGER_KAFKA"
        )
        raise typer.Exit(1) from None
    except postgres_down as exc:
        why = " ".join(str(exc.__cause__ or exc).split())
        say(
            f"cannot reach PostgreSQL ({why}): start it, or name it with --postgres or "
            "TOOLLEDGER_POSTGRES"
        )
        raise typer.Exit(1) from None
