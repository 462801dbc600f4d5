"""Wiring of the distributed backend: executor and transport on Kafka, projections in Postgres.

``toolledger executor`` and ``toolledger projector`` run until SIGTERM. Each says once, on
stderr whatever the log level, when it is ready: its consumer group, and the partitions it was
assigned with the position it starts each one at. While it starts, a group coordinator Kafka
cannot name yet (a new cluster makes its offsets topic on the first lookup) is logged at INFO:
aiokafka logs it at ERROR and retries."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from aiokafka.errors import GroupCoordinatorNotAvailableError

from toolledger.audit import audit_retention as audit_retention_of
from toolledger.kafka_admin import ensure_topics
from toolledger.kafka_settings import agreed_key_retention
from toolledger.processors.pipeline import Stages
from toolledger.processors.runtime.kafka import KafkaExecutor
from toolledger.processors.tools.redaction import Redactor
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.schemas.topics import Topics
from toolledger.settings import LedgerSettings

if TYPE_CHECKING:
    from toolledger.processors.groups.facts import StepTool
    from toolledger.projections.groups import GroupRebuild
    from toolledger.projections.projector import KafkaProjector

log = logging.getLogger("toolledger")
COORDINATOR_LOG = "aiokafka.consumer.group_coordinator"


async def wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


class CoordinatorNotYetAvailable(logging.Filter):
    """aiokafka's "Group Coordinator Request failed" for a coordinator not available yet, at
    INFO instead of ERROR: it is retried until the broker names one. Shown only where the
    logger shows INFO."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.levelno < logging.ERROR or not any(
            isinstance(arg, GroupCoordinatorNotAvailableError) for arg in args
        ):
            return True
        record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)


@contextlib.contextmanager
def starting() -> Iterator[CoordinatorNotYetAvailable]:
    """While a process starts: a coordinator not available yet is no error (see
    :class:`CoordinatorNotYetAvailable`); the filter is removed at the end, or by
    :func:`run_until_signal` once the process is ready."""
    quiet = CoordinatorNotYetAvailable()
    logging.getLogger(COORDINATOR_LOG).addFilter(quiet)
    try:
        yield quiet
    finally:
        logging.getLogger(COORDINATOR_LOG).removeFilter(quiet)


async def run_until_signal(
    ready: Callable[[], Awaitable[str]],
    quiet: CoordinatorNotYetAvailable,
    ready_file: str | None,
) -> None:
    """Until SIGTERM or SIGINT; meanwhile, once ``ready`` answers its line: the coordinator's
    errors are errors again, the line is printed on stderr and ``ready_file`` is written."""

    async def announce() -> None:
        line = await ready()
        logging.getLogger(COORDINATOR_LOG).removeFilter(quiet)
        print(line, file=sys.stderr, flush=True)
        if ready_file:
            await asyncio.to_thread(Path(ready_file).write_text, "ready\n")

    announcing = asyncio.create_task(announce())
    try:
        await wait_for_signal()
    finally:
        announcing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await announcing


def at_positions(positions: Mapping[int, int]) -> str:
    """``0@12 1@0``: partitions at their positions (or that there are none)."""
    if not positions:
        return "no partitions (the group's other members have them)"
    return "partitions " + " ".join(f"{p}@{at}" for p, at in sorted(positions.items()))


async def executor_ready(executor: KafkaExecutor) -> str:
    """The executor's ready line, once it owns partitions (taken over: fenced, restored)."""
    await executor.assigned.wait()
    owned = {p: o.executor.position(p) for p, o in executor.owned.items()}
    return (
        f"toolledger executor ready: group {executor.topics.executor_group}, "
        f"{executor.topics.intents} {at_positions(owned)} (partition@position)"
    )


async def projector_ready(projector: KafkaProjector) -> str:
    """The projector's ready line, once its partitions are assigned and sought to the
    positions PostgreSQL holds."""
    await projector.assigned.wait()
    by_topic: dict[str, dict[int, int]] = {
        topic: {} for topic in (projector.topics.outcomes, projector.topics.dead_letters)
    }
    for tp, position in projector.positions.items():
        by_topic.setdefault(tp.topic, {})[tp.partition] = position
    held = ", ".join(f"{topic} {at_positions(at)}" for topic, at in by_topic.items())
    return f"toolledger projector ready: group {projector.name}, {held} (partition@position)"


async def run_executor(
    settings: LedgerSettings, registry: ToolRegistry, secret: bytes, *, ready_file: str | None
) -> None:
    """Run an executor on the Kafka cluster of ``settings`` until SIGTERM. The deployment's
    recorded key retention is applied to ``registry``, and a ``settings.key_retention`` that
    disagrees refused (:class:`~toolledger.config.ConfigError`,
    :mod:`toolledger.kafka_settings`). ``settings.key_scope`` (else the default) is the scope of
    the keys of tools that set none: a call whose key is of another scope is refused."""
    if settings.key_scope is not None:
        registry.set_default_key_scope(settings.key_scope)
    bootstrap, topics, retention = settings.kafka, settings.topics, settings.intents_retention
    assert retention is not None, "intents need a time retention: they hold raw arguments"
    await ensure_topics(
        bootstrap, topics, intents_retention_ms=int(retention.total_seconds() * 1000)
    )
    registry.set_default_key_retention(
        await agreed_key_retention(
            bootstrap,
            topics,
            settings.key_retention,
            registry.default_key_retention,
            who="executor",
        )
    )
    executor = KafkaExecutor(
        bootstrap,
        topics,
        Stages(
            registry,
            Redactor(secret),
            approval_request_ttl=settings.approval_request_ttl,
            max_argument_bytes=settings.max_argument_bytes,
        ),
        concurrency=settings.concurrency,
        session_timeout_ms=settings.session_timeout_ms,
        state_dir=settings.state_dir,
        cache_entries=settings.cache_entries,
    )
    with starting() as quiet:
        await executor.start()
        log.info("executor started", extra={"group": topics.executor_group, "tools": len(registry)})
        try:
            await run_until_signal(functools.partial(executor_ready, executor), quiet, ready_file)
        finally:
            await executor.stop()
            log.info("executor stopped")


async def run_projector(
    bootstrap: str,
    postgres: str,
    topics: Topics,
    *,
    ready_file: str | None,
    batch_max: int = 2000,
    audit_retention: timedelta | None = None,
) -> None:
    """Fold the outcome log into PostgreSQL until SIGTERM; with ``audit_retention``, also
    prune the audit trail of expired keys past it (:mod:`toolledger.audit`)."""
    from toolledger.projections.audit_retention import prune_postgres
    from toolledger.projections.postgres import PostgresProjection, migrate
    from toolledger.projections.projector import KafkaProjector

    await ensure_topics(bootstrap, topics)
    await migrate(postgres)
    async with PostgresProjection(postgres) as projection:
        projector = KafkaProjector(bootstrap, topics, projection, batch_max=batch_max)
        with starting() as quiet:
            await projector.start()
            log.info("projector started", extra={"group": projector.name})
            try:
                async with audit_retention_of(
                    functools.partial(prune_postgres, postgres), audit_retention
                ):
                    await run_until_signal(
                        functools.partial(projector_ready, projector), quiet, ready_file
                    )
            finally:
                await projector.stop()
                log.info("projector stopped")


class ProjectorsRunning(RuntimeError):
    pass


async def replay_distributed(
    bootstrap: str, postgres: str, topics: Topics, tools: Mapping[str, StepTool]
) -> tuple[int, GroupRebuild]:
    """Rebuild the Postgres projections from the outcome log, and the call groups' read model
    from their log (``tools``: the facts of the tools they used); projectors must be stopped.
    Returns the events read and what was rebuilt of the groups."""
    from aiokafka.admin import AIOKafkaAdminClient

    from toolledger.projections.dialect import POSTGRES
    from toolledger.projections.groups import rebuild_read_model
    from toolledger.projections.postgres import PostgresProjection, migrate
    from toolledger.projections.postgres_groups import PostgresGroupLog
    from toolledger.projections.projector import rebuild

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_consumer_groups([topics.projector_group])
    finally:
        await admin.close()
    for group in described:
        for _error, _group_id, state, _protocol_type, _protocol, members, *_ in group.groups:
            if members:
                raise ProjectorsRunning(
                    f"{len(members)} projector(s) of {topics.projector_group} are running "
                    f"(group state {state}): stop them before a replay"
                )
    await migrate(postgres)
    async with PostgresProjection(postgres) as projection:
        result = await rebuild(bootstrap, topics, projection)
        groups = await rebuild_read_model(PostgresGroupLog(projection, postgres), POSTGRES, tools)
    return result.events, groups
