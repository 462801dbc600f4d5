"""The ``toolledger`` command: the composition root that wires backends."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from toolledger import logs, options
from toolledger.config import (
    DEFAULT_KAFKA,
    DEFAULT_POSTGRES,
    ConfigError,
    ToolSource,
    redaction_secret,
)
from toolledger.heap import releasing_free_memory
from toolledger.mcp_wiring import register_mcp_command
from toolledger.operator_cli import register_operator_commands
from toolledger.options import (
    DISTRIBUTED_PANEL,
    HELPDESK_PANEL,
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
    KafkaOption,
    MissingExtra,
    PartitionsOption,
    PrefixOption,
    SectionedCommand,
    ServeKafkaOption,
    ServePostgresOption,
)
from toolledger.processors.key_cache import DEFAULT_CACHE_ENTRIES
from toolledger.processors.runtime.sqlite_ledger import LedgerFileError, SqliteLedger
from toolledger.projections.sqlite import SqliteReadModel

if TYPE_CHECKING:
    from toolledger.http_server import ConnectionLimits
    from toolledger.processors.tools.registry import ToolRegistry
    from toolledger.serve import Security
    from toolledger.settings import LedgerSettings

# Plain help (click's layout): it wraps every option name and help text to the terminal,
# 80 columns included, where rich's tables cut long option names with an ellipsis.
app = typer.Typer(
    help="toolledger: an execution ledger for AI agents' tool calls.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)
command = functools.partial(app.command, cls=SectionedCommand)
console = Console(soft_wrap=True)  # an error is one line, whatever the width


def _say(line: str) -> None:
    console.print(line, style="red", markup=False, highlight=False)


def _require(*extras: str, what: str) -> None:
    """Exit 2 with the ``pip install`` line if an optional dependency is missing."""
    try:
        options.require(*extras, what=what)
    except MissingExtra as exc:
        console.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(2) from None


DataOption = Annotated[
    Path | None,
    typer.Option("--data", help="Directory of the embedded ledger (a temporary one if omitted)."),
]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        console.print(f"toolledger {version('toolledger')}")
        raise typer.Exit()


@app.callback()
def main(
    log_level: Annotated[str, typer.Option(help="Log level.")] = "WARNING",
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    logs.configure(log_level)


def _tracing() -> None:
    """Spans of the executor's stages, exported by OTLP if OTEL_EXPORTER_OTLP_ENDPOINT is set."""
    from toolledger.processors.tracing import configure_tracing

    configure_tracing(None)


@command()
def demo(data: DataOption = None) -> None:
    """Run a scripted agent session on the embedded backend and check its invariants."""
    from toolledger.demo import print_result, run_demo

    _tracing()
    with tempfile.TemporaryDirectory(prefix="toolledger-demo-") as tmp:
        workdir = data or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        console.print(f"[bold]toolledger demo[/] (embedded, data in {workdir})")
        checks = asyncio.run(run_demo(workdir, console))
    print_result(console, checks)
    raise typer.Exit(1 if checks.failures else 0)


ApprovalRequestTtlOption = Annotated[
    float, typer.Option(min=1.0, help="How long an approval request stays open, in seconds.")
]


@command()
def executor(
    ctx: typer.Context,
    kafka: KafkaOption = DEFAULT_KAFKA,
    prefix: PrefixOption = "toolledger.",
    partitions: PartitionsOption = 4,
    tools: options.ToolsOption = None,
    demo: Annotated[
        bool,
        typer.Option(
            "--demo",
            help="The demo's helpdesk tools (toolledger.examples.helpdesk:registry) instead of "
            "--tools; their options below.",
        ),
    ] = False,
    helpdesk_db: Annotated[
        Path,
        typer.Option(
            help="Where the helpdesk tools write their side effects (SQLite).",
            rich_help_panel=HELPDESK_PANEL,
        ),
    ] = Path("helpdesk.db"),
    timeout_s: Annotated[
        float,
        typer.Option(help="The helpdesk tools' timeout, seconds.", rich_help_panel=HELPDESK_PANEL),
    ] = 10.0,
    flaky_timeout_s: Annotated[
        float,
        typer.Option(
            help="flaky_write's timeout (the fault-injection tool), seconds.",
            rich_help_panel=HELPDESK_PANEL,
        ),
    ] = 5.0,
    concurrency: Annotated[int, typer.Option(help="Calls in flight per partition.")] = 64,
    session_timeout_ms: Annotated[int, typer.Option(help="Consumer session timeout.")] = 30_000,
    redaction_secret_file: Annotated[Path | None, typer.Option(help="Redaction key file.")] = None,
    ready_file: Annotated[
        str | None, typer.Option(help="Touched once partitions are owned.")
    ] = None,
    approval_request_ttl_s: ApprovalRequestTtlOption = 86_400.0,
    intents_retention: options.TopicIntentsRetentionOption = "7d",
    key_retention: options.KeyRetentionOption = None,
    key_scope: options.KeyScopeOption = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where the local stores of owned partitions live; kept across restarts, a "
            "restart reads only the state topic's tail (default: <temp dir>/toolledger-state-"
            "<uid>/<consumer group>, private to the user; each store is locked while open, so "
            "executors on one host may share it)."
        ),
    ] = None,
    cache_entries: options.CacheEntriesOption = DEFAULT_CACHE_ENTRIES,
) -> None:
    """Run the executor on Kafka (until SIGTERM)."""
    _require("kafka", what="toolledger executor")
    from toolledger.distributed import run_executor
    from toolledger.settings import KAFKA, LedgerSettings

    try:
        source = ToolSource(tools, demo, helpdesk_db, timeout_s, flaky_timeout_s)
        source.check()
        if not demo:
            _helpdesk_only(ctx, "helpdesk_db", "timeout_s", "flaky_timeout_s")
        secret = redaction_secret(redaction_secret_file)
        registry = source.load()
        _retention_ms(intents_retention, allow_forever=False, what="--intents-retention")
        settings = LedgerSettings.of(
            backend=KAFKA,
            kafka=kafka,
            prefix=prefix,
            partitions=partitions,
            concurrency=concurrency,
            session_timeout_ms=session_timeout_ms,
            approval_request_ttl=timedelta(seconds=approval_request_ttl_s),
            intents_retention=intents_retention,
            key_retention=key_retention,
            state_dir=state_dir,
            cache_entries=cache_entries,
            key_scope=options.key_scope(key_scope),
        )
        source.make_store()  # written once every check passed
    except ConfigError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    _tracing()
    try:
        with options.services_reached(kafka, _say):
            asyncio.run(
                releasing_free_memory(
                    run_executor(settings, registry, secret, ready_file=ready_file)
                )
            )
    except ConfigError as exc:  # a key retention the deployment's record disagrees with
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None


def _helpdesk_only(ctx: typer.Context, *names: str) -> None:
    """:class:`ConfigError` if an option of the helpdesk toolset was given for another one."""
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name) if param.name in names else None
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            raise ConfigError(
                f"{param.opts[0]} is an option of the demo's helpdesk tools (--demo), not of "
                f"--tools {ctx.params['tools']}"
            )


@command()
def topics(
    kafka: KafkaOption = DEFAULT_KAFKA,
    prefix: PrefixOption = "toolledger.",
    partitions: PartitionsOption = 4,
    intents_retention: options.TopicIntentsRetentionOption = "7d",
    outcomes_retention: Annotated[
        str, typer.Option(help="How long outcome events (the audit trail) are kept, or 'forever'.")
    ] = "forever",
    replication_factor: Annotated[
        int,
        typer.Option(
            min=1,
            help="Replicas of each partition of the topics it creates (at most the number of "
            "brokers; with 3, set the brokers' min.insync.replicas to 2). Existing topics keep "
            "theirs.",
        ),
    ] = 1,
    key_retention: Annotated[
        str | None,
        typer.Option(
            "--key-retention",
            envvar="TOOLLEDGER_KEY_RETENTION",
            help="Record the deployment's key retention, for tools whose manifest sets none "
            "(90s, 30m, 24h, 7d, PT24H, or 'forever'): every executor and front door applies "
            "and states it from their next start, and refuses a --key-retention of its own that "
            "disagrees. Without it, the one recorded stays (or the first process to start "
            "records its own).",
        ),
    ] = None,
) -> None:
    """Create the Kafka topics if missing and set each one's config: intents with time
    retention, outcomes as told, state compacted (expired keys' tombstones shrink it), groups
    with the intents' retention (a group's events carry its steps' literal arguments), and the
    settings topic, which records the deployment's key retention."""
    _require("kafka", what="toolledger topics")
    from toolledger.kafka_admin import (
        TopicError,
        apply_topic_configs,
        ensure_topics,
        topic_configs,
    )
    from toolledger.kafka_settings import (
        RecordedRetention,
        recorded_key_retention,
        set_key_retention,
    )
    from toolledger.processors.tools.retention import RetentionError, describe, parse_retention
    from toolledger.schemas.topics import Topics

    try:
        intents_ms = _retention_ms(
            intents_retention, allow_forever=False, what="--intents-retention"
        )
        outcomes_ms = _retention_ms(
            outcomes_retention, allow_forever=True, what="--outcomes-retention"
        )
        keys = None if key_retention is None else parse_retention(key_retention)
    except (ConfigError, RetentionError) as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    layout = Topics(prefix, partitions)

    async def run() -> tuple[dict[str, dict[str, str]], RecordedRetention | None]:
        await ensure_topics(
            kafka, layout, replication_factor=replication_factor, intents_retention_ms=intents_ms
        )
        configs = topic_configs(
            layout, intents_retention_ms=intents_ms, outcomes_retention_ms=outcomes_ms
        )
        applied = await apply_topic_configs(kafka, configs)
        if keys is not None:
            return applied, await set_key_retention(kafka, layout, keys)
        return applied, await recorded_key_retention(kafka, layout)

    try:
        with options.services_reached(kafka, _say):
            applied, recorded = asyncio.run(run())
    except (TopicError, ConfigError) as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None
    for name, config in applied.items():
        console.print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in sorted(config.items())))
    if recorded is None:
        console.print(
            f"{layout.settings}: no key retention recorded yet (the first executor or front door "
            "to start records its own: its --key-retention, else 24h)"
        )
    else:
        console.print(
            f"{layout.settings}: key_retention={describe(recorded.key_retention)} "
            f"(recorded by {recorded.set_by}; running processes take a change when they restart)"
        )


def _retention_ms(text: str, *, allow_forever: bool, what: str) -> int:
    from toolledger.processors.tools.retention import FOREVER, RetentionError, parse_retention

    try:
        retention = parse_retention(text, what)
    except RetentionError as exc:
        raise ConfigError(str(exc)) from None
    if retention == FOREVER:
        if not allow_forever:
            raise ConfigError("intents need a time retention: they hold raw arguments")
        return -1
    assert not isinstance(retention, str)
    return int(retention.total_seconds() * 1000)


def _optional_retention(text: str, what: str) -> timedelta | None:
    """A retention that may be 'forever' (None); ``what``: its option, for the error."""
    ms = _retention_ms(text, allow_forever=True, what=what)
    return None if ms < 0 else timedelta(milliseconds=ms)


PostgresOption = Annotated[
    str, typer.Option("--postgres", envvar="TOOLLEDGER_POSTGRES", help="PostgreSQL URL.")
]


@command()
def migrate(postgres: PostgresOption = DEFAULT_POSTGRES) -> None:
    """Apply the projection migrations to PostgreSQL (safe to run twice)."""
    _require("postgres", what="toolledger migrate")
    from toolledger.projections.postgres import ProjectionError
    from toolledger.projections.postgres import migrate as apply_migrations

    try:
        applied = asyncio.run(apply_migrations(postgres))
    except ProjectionError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    console.print(f"applied {applied}" if applied else "nothing to apply: up to date")


@command()
def projector(
    kafka: KafkaOption = DEFAULT_KAFKA,
    postgres: PostgresOption = DEFAULT_POSTGRES,
    prefix: PrefixOption = "toolledger.",
    partitions: PartitionsOption = 4,
    ready_file: Annotated[
        str | None, typer.Option(help="Touched once its partitions are assigned.")
    ] = None,
    batch_max: Annotated[
        int, typer.Option(min=1, help="Most outcome records applied in one transaction.")
    ] = 2000,
    audit_retention: options.AuditRetentionOption = "forever",
) -> None:
    """Fold the outcome log into the PostgreSQL projections (until SIGTERM)."""
    _require("kafka", "postgres", what="toolledger projector")
    from toolledger.distributed import run_projector
    from toolledger.schemas.topics import Topics

    try:
        keep = _optional_retention(audit_retention, "--audit-retention")
    except ConfigError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    topics = Topics(prefix, partitions)
    with options.services_reached(kafka, _say):
        asyncio.run(
            releasing_free_memory(
                run_projector(
                    kafka,
                    postgres,
                    topics,
                    ready_file=ready_file,
                    batch_max=batch_max,
                    audit_retention=keep,
                )
            )
        )


@command()
def replay(
    data: Annotated[Path | None, typer.Option("--data", help="Embedded ledger directory.")] = None,
    kafka: KafkaOption = DEFAULT_KAFKA,
    postgres: PostgresOption = DEFAULT_POSTGRES,
    prefix: PrefixOption = "toolledger.",
    partitions: PartitionsOption = 4,
    tools: Annotated[
        str | None,
        typer.Option(
            "--tools",
            envvar="TOOLLEDGER_TOOLS",
            help="The tools the call groups used: module:attribute (imported from the working "
            "directory) or path/to/file.py:attribute. Only their manifests are read.",
        ),
    ] = None,
    demo: Annotated[
        bool,
        typer.Option(
            "--demo", help="The call groups used the demo's helpdesk tools (instead of --tools)."
        ),
    ] = False,
) -> None:
    """Drop the projections and rebuild them from the outcome log, and the call groups' read
    model from the group log.

    With --data: the embedded ledger in that directory. Otherwise: Kafka + PostgreSQL (stop the
    projectors and the front doors first).
    """
    from toolledger.processors.tools.group_tools import step_tools
    from toolledger.projections.groups import GroupRebuild

    rebuilt: GroupRebuild
    try:  # only the tools' facts are read (keys, compensations): the demo's store is not made
        registry = ToolSource(tools, demo).load()
    except ConfigError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    facts = step_tools(registry)
    if data is not None:
        from toolledger.projections.dialect import SQLITE
        from toolledger.projections.groups import SqliteGroupLog, rebuild_read_model

        log = _existing_ledger(data)
        try:
            with console.status("rebuilding projections from the log"):
                count = log.rebuild()
                rebuilt = asyncio.run(rebuild_read_model(SqliteGroupLog(log.conn), SQLITE, facts))
        except LedgerFileError as exc:
            console.print(f"[red]{exc}[/]")
            raise typer.Exit(2) from None
        finally:
            log.close()
    else:
        _require("kafka", "postgres", what="toolledger replay without --data")
        from toolledger.distributed import ProjectorsRunning, replay_distributed
        from toolledger.schemas.topics import Topics

        try:
            with console.status("rebuilding the PostgreSQL projections from Kafka"):
                count, rebuilt = asyncio.run(
                    replay_distributed(kafka, postgres, Topics(prefix, partitions), facts)
                )
        except ProjectorsRunning as exc:
            console.print(f"[red]{exc}[/]")
            raise typer.Exit(2) from None
    console.print(f"rebuilt projections from {count} events, and {rebuilt.groups} call groups")
    if rebuilt.unreadable:
        console.print(
            f"[red]{len(rebuilt.unreadable)} call groups no longer decode with these tools "
            f"(left out of the read model): {', '.join(rebuilt.unreadable[:10])}[/]"
        )
        raise typer.Exit(1)


BackendDataOption = Annotated[
    Path | None, typer.Option("--data", help="Embedded ledger directory (or --postgres).")
]
BackendPostgresOption = Annotated[
    str | None, typer.Option("--postgres", help="PostgreSQL URL of the read model (or --data).")
]
TenantOption = Annotated[
    str | None, typer.Option("--tenant", help="Only this tenant's calls (default: every tenant).")
]
SinceOption = Annotated[
    str | None,
    typer.Option(help="Start of the window, inclusive: an ISO 8601 date or time (UTC if no zone)."),
]
UntilOption = Annotated[
    str | None,
    typer.Option(help="End of the window, exclusive: an ISO 8601 date or time (UTC if no zone)."),
]


@command()
def report(
    run: Annotated[str | None, typer.Option("--run", help="The run to evaluate.")] = None,
    since: SinceOption = None,
    until: UntilOption = None,
    form: Annotated[str, typer.Option("--format", help="json, md (Markdown) or html.")] = "json",
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the report to this file (default: stdout).")
    ] = None,
    tenant: TenantOption = None,
    data: BackendDataOption = None,
    postgres: BackendPostgresOption = None,
) -> None:
    """The evaluation report of a run (--run), or of every run in a window (--since, --until):
    argument validity, repeated calls, recoveries, order against the groups' dependencies,
    budget and permission refusals, human rejections, UNKNOWNs, and the production metrics
    (docs/evaluation.md)."""
    from toolledger.analytics import AnalyticsError, read_side, window
    from toolledger.analytics import report as evaluate
    from toolledger.schemas.evaluation import FORMATS, render

    if postgres is not None:
        _require("postgres", what="toolledger report --postgres")
    try:
        if form not in FORMATS:
            raise AnalyticsError(f"--format {form!r}: give one of {', '.join(FORMATS)}")
        if run is not None and (since is not None or until is not None):
            raise AnalyticsError("give --run RUN_ID or a window (--since, --until), not both")
        if run is None and (since is None or until is None):
            raise AnalyticsError("give --run RUN_ID, or the window: --since and --until")
        start, end = (None, None) if since is None or until is None else window(since, until)

        async def go() -> str:
            async with read_side(data, postgres) as reads:
                found = await evaluate(reads, tenant_id=tenant, run_id=run, since=start, until=end)
            return render(found, form)

        text = asyncio.run(go())
    except AnalyticsError as exc:
        console.print(f"[red]{exc}[/]", markup=True, highlight=False)
        raise typer.Exit(2) from None
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text, encoding="utf-8")


@command()
def export(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the files under.")],
    since: SinceOption = None,
    until: UntilOption = None,
    form: Annotated[str, typer.Option("--format", help="parquet, csv or jsonl.")] = "parquet",
    tenant: TenantOption = None,
    data: BackendDataOption = None,
    postgres: BackendPostgresOption = None,
) -> None:
    """Export the audit trail and the calls of a window as files partitioned by day
    (OUT/tool_call_events/day=YYYY-MM-DD/part-0.parquet, and the same under OUT/tool_calls),
    as the audit trail holds them (redacted); their schema is in
    docs/data-dictionary.md#export."""
    _require("export", what="toolledger export")
    if postgres is not None:
        _require("postgres", what="toolledger export --postgres")
    from toolledger.analytics import EXPORT_FORMATS, AnalyticsError, read_side, window
    from toolledger.analytics import export as write_export

    try:
        if form not in EXPORT_FORMATS:
            raise AnalyticsError(f"--format {form!r}: give one of {', '.join(EXPORT_FORMATS)}")
        if since is None or until is None:
            raise AnalyticsError("give the window: --since and --until")
        start, end = window(since, until)

        async def go() -> dict[str, int]:
            async with read_side(data, postgres) as reads:
                return await write_export(
                    reads,
                    out,
                    form,
                    tenant_id=tenant,
                    since=start,
                    until=end,
                )

        written = asyncio.run(go())
    except AnalyticsError as exc:
        console.print(f"[red]{exc}[/]", markup=True, highlight=False)
        raise typer.Exit(2) from None
    for table, rows in written.items():
        console.print(f"{table}: {rows} rows under {out / table}", markup=False)


ServePrefixOption = Annotated[
    str,
    typer.Option(
        "--prefix",
        envvar="TOOLLEDGER_PREFIX",
        help="Topic name prefix.",
        rich_help_panel=DISTRIBUTED_PANEL,
    ),
]
ServePartitionsOption = Annotated[
    int,
    typer.Option(
        "--partitions",
        envvar="TOOLLEDGER_PARTITIONS",
        min=1,
        help="Partitions per topic.",
        rich_help_panel=DISTRIBUTED_PANEL,
    ),
]


@command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port.")] = 8080,
    data: options.DataOption = Path(".toolledger"),
    tokens: options.TokensOption = Path("tokens.json"),
    tools: options.ToolsOption = None,
    demo: options.DemoOption = False,
    kafka: ServeKafkaOption = None,
    postgres: ServePostgresOption = None,
    prefix: ServePrefixOption = "toolledger.",
    partitions: ServePartitionsOption = 4,
    jwks: JwksOption = None,
    jwt_issuer: JwtIssuerOption = None,
    jwt_audience: JwtAudienceOption = None,
    jwt_algorithms: JwtAlgorithmsOption = JWT_ALGORITHMS,
    jwt_tenant_claim: JwtTenantClaimOption = JWT_TENANT_CLAIM,
    jwt_principal_claim: JwtPrincipalClaimOption = JWT_PRINCIPAL_CLAIM,
    jwt_scopes_claim: JwtScopesClaimOption = None,
    policy: Annotated[
        Path | None, typer.Option(help="Policy file (JSON): rate limits per tenant and tool.")
    ] = None,
    approval_ttl_s: Annotated[
        float, typer.Option(min=1.0, help="How long an approval token is valid, in seconds.")
    ] = 600.0,
    approval_request_ttl_s: ApprovalRequestTtlOption = 86_400.0,
    run_max_attempts: Annotated[
        int,
        typer.Option(
            min=0, help="Handler attempts a run may use over all its calls (0: no budget)."
        ),
    ] = 100,
    run_max_repeats: Annotated[
        int,
        typer.Option(
            min=1, help="Repeats of one failure of a tool before a run's calls of it stop."
        ),
    ] = 3,
    create: CreateOption = False,
    key_retention: options.KeyRetentionOption = None,
    key_scope: options.KeyScopeOption = None,
    shutdown_timeout_s: Annotated[
        float,
        typer.Option(
            "--shutdown-timeout",
            min=0.0,
            help="On SIGTERM/SIGINT: seconds running calls get to finish before the ledger "
            "closes (a call still running then is reconciled at the next start).",
        ),
    ] = 30.0,
    max_connections: Annotated[
        int | None,
        typer.Option(
            min=1, help="Open connections at most (default 1024, always below the fd limit)."
        ),
    ] = None,
    header_timeout_s: Annotated[
        float, typer.Option("--header-timeout", min=0.1, help="Seconds to send the headers.")
    ] = 10.0,
    body_timeout_s: Annotated[
        float, typer.Option("--body-timeout", min=0.1, help="Seconds to send the body.")
    ] = 30.0,
    cache_entries: options.CacheEntriesOption = DEFAULT_CACHE_ENTRIES,
    intents_retention: Annotated[
        str,
        typer.Option(
            help="Embedded: how long the raw arguments of approval requests are kept (their "
            "only copy: this is the retention of sensitive data; 7d, 24h, or 'forever')."
        ),
    ] = "7d",
    audit_retention: options.AuditRetentionOption = "forever",
    mcp: Annotated[
        bool,
        typer.Option(
            "--mcp",
            help="Also serve the tools over MCP (streamable HTTP at /mcp) from this process, "
            "on the same ledger, beside the HTTP API and its approval routes.",
        ),
    ] = False,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="Front-door processes sharing the port (Kafka + PostgreSQL backend only: "
            "its front doors are stateless; the embedded ledger is one process).",
        ),
    ] = 1,
) -> None:
    """Serve the HTTP API (embedded backend in --data unless --kafka and --postgres are given)."""
    from toolledger import serving
    from toolledger.http_server import ConnectionLimits
    from toolledger.producers.http.auth import TokenFileError, TokenStore
    from toolledger.producers.http.door_state import RunBudget

    # nothing is written before every check passed: no --data left behind by a refusal
    source = ToolSource(tools, demo, data / "helpdesk.db")
    try:
        registry = source.load()
        token_store = TokenStore.load(tokens)
        settings = options.door_settings(
            data,
            create,
            kafka,
            postgres,
            prefix=prefix,
            partitions=partitions,
            approval_request_ttl=timedelta(seconds=approval_request_ttl_s),
            shutdown_timeout_s=shutdown_timeout_s,
            cache_entries=cache_entries,
            key_retention=key_retention,
            key_scope=options.key_scope(key_scope),
            intents_retention=intents_retention,
            audit_retention=audit_retention,
        )
    except (TokenFileError, ConfigError, OSError) as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    if (kafka is None) != (postgres is None):
        console.print("[red]distributed mode needs both --kafka and --postgres[/]")
        raise typer.Exit(2)
    if kafka is not None:
        _require("kafka", "postgres", what="toolledger serve --kafka --postgres")
    if mcp:
        _require("mcp", what="toolledger serve --mcp")
    if workers > 1 and kafka is None:
        console.print(
            "[red]--workers needs the Kafka + PostgreSQL backend (--kafka and --postgres): the "
            "embedded ledger runs in one process, which holds the ledger file's lock[/]"
        )
        raise typer.Exit(2)
    if workers > 1 and mcp:
        console.print(
            "[red]--mcp serves from one process (MCP sessions live in it): use --workers 1[/]"
        )
        raise typer.Exit(2)
    security = options.security(
        token_store,
        jwks,
        jwt_issuer,
        jwt_audience,
        jwt_algorithms,
        jwt_tenant_claim,
        jwt_principal_claim,
        jwt_scopes_claim,
        policy=policy,
        approval_token_ttl=timedelta(seconds=approval_ttl_s),
        run_budget=RunBudget(run_max_attempts, run_max_repeats) if run_max_attempts else None,
    )
    try:  # the JWKS, the JWT settings and the policy, before anything is written
        security.build(registry)
    except ConfigError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    if kafka is None:  # the embedded ledger's directory; the demo's store beside the ledger
        try:
            data.mkdir(parents=True, exist_ok=True)
            source.make_store()
        except (ConfigError, OSError) as exc:
            console.print(f"[red]{exc}[/]")
            raise typer.Exit(2) from None

    spec = _DoorSpec(
        tools=source,
        settings=settings,
        security=security,
        limits=ConnectionLimits(
            max_connections, header_timeout_s, body_timeout_s, 5, shutdown_timeout_s
        ),
        log_level=logging.getLevelName(logging.getLogger().level),
    )
    if workers > 1:
        code = serving.supervise(
            workers,
            host,
            port,
            functools.partial(_serve_worker, spec),
            stop_timeout_s=shutdown_timeout_s + 15.0,
        )
        raise typer.Exit(code)
    _tracing()
    try:
        with options.services_reached(kafka, _say):
            serving.run(releasing_free_memory(spec.serve(registry, host=host, port=port, mcp=mcp)))
    except (ConfigError, LedgerFileError) as exc:  # JWKS, JWT settings, policy, ledger file
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None


@dataclass(frozen=True)
class _DoorSpec:
    """What a ``serve`` process needs to open its front door and serve, picklable: each
    worker of ``serve --workers`` gets it and loads the tools again in its own process."""

    tools: ToolSource
    settings: LedgerSettings
    security: Security
    limits: ConnectionLimits
    log_level: str

    async def serve(
        self,
        registry: ToolRegistry,
        *,
        host: str = "",
        port: int = 0,
        mcp: bool = False,
        sock: socket.socket | None = None,
    ) -> None:
        """On ``host:port`` (bound once the front door is open), or on the bound ``sock`` of
        a worker."""
        from toolledger import serve as wiring
        from toolledger.producers.http.app import create_app
        from toolledger.serving import bind, serve_socket

        async with wiring.front_door(self.settings, registry, self.security) as front:
            if mcp:
                await wiring.serve(front, host, port, self.limits, mcp_path="/mcp")
                return
            if sock is None:
                try:
                    sock = bind(host, port)
                except OSError as exc:
                    raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
            with sock:
                await serve_socket(create_app(front), sock, self.limits)


def _serve_worker(spec: _DoorSpec, sock: socket.socket) -> None:
    """A worker process of ``serve --workers``: one front door on the shared socket."""
    from toolledger import serving

    logs.configure(spec.log_level)
    _tracing()
    try:
        serving.run(releasing_free_memory(spec.serve(spec.tools.load(), sock=sock)))
    except (ConfigError, LedgerFileError) as exc:
        console.print(f"[red]{exc}[/]")
        raise SystemExit(2) from None


@command()
def init(
    data: Annotated[Path, typer.Argument(help="Directory of the new embedded ledger.")],
    partitions: PartitionsOption = 4,
) -> None:
    """Create a new, empty embedded ledger in DATA (refused if one is there already)."""
    path = data / "ledger.db"
    if path.exists():
        console.print(f"[red]{path} exists already: a ledger is never re-created[/]")
        raise typer.Exit(2)
    try:
        SqliteLedger(path, read_model=SqliteReadModel(), partitions=partitions, create=True).close()
    except LedgerFileError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    console.print(f"created an empty ledger with {partitions} partitions: {path}")


@command()
def vacuum(
    data: Annotated[Path, typer.Argument(help="Directory of an embedded ledger not in use.")],
) -> None:
    """Reclaim the space of an embedded ledger: checkpoint its WAL and rewrite the file without
    free pages. Needs the ledger to itself (stop serve/mcp first); nothing is deleted."""
    log = _existing_ledger(data)
    try:
        before, after = log.vacuum()
    finally:
        log.close()
    console.print(f"{data / 'ledger.db'}: {before:,} bytes -> {after:,} bytes")


def _existing_ledger(data: Path) -> SqliteLedger:
    """The embedded ledger in ``data``, never created; else one line and exit code 2."""
    try:
        return SqliteLedger(data / "ledger.db", read_model=SqliteReadModel(), create=False)
    except LedgerFileError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None


def _mcp_needs_its_extras(typer_app: typer.Typer) -> None:
    """``toolledger mcp`` checks for the MCP SDK (and, in distributed mode, Kafka and
    PostgreSQL's clients) before it starts: a missing extra is one line, not a traceback."""
    for info in typer_app.registered_commands:
        if info.name == "mcp" and info.callback is not None:
            info.callback = _checking_mcp_extras(info.callback)


def _checking_mcp_extras(callback: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(callback)  # the same signature: the same options
    def mcp(*args: Any, **kwargs: Any) -> Any:
        _require("mcp", what="toolledger mcp")
        if kwargs.get("kafka") is not None and kwargs.get("postgres") is not None:
            _require("kafka", "postgres", what="toolledger mcp --kafka --postgres")
        return callback(*args, **kwargs)

    return mcp


def _whole_short_help(typer_app: typer.Typer) -> None:
    """The command list shows each command's first paragraph whole, wrapped (click would cut
    it to one line with '...')."""
    for info in typer_app.registered_commands:
        doc = info.help or (info.callback.__doc__ if info.callback else None)
        if info.short_help is None and doc:
            first = inspect.cleandoc(doc).split("\n\n")[0]
            info.short_help = " ".join(first.split())
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _whole_short_help(group.typer_instance)


register_mcp_command(app)
_mcp_needs_its_extras(app)
register_operator_commands(app)
_whole_short_help(app)

if __name__ == "__main__":
    app()
