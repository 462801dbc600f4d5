"""Wiring of the distributed backend: executor and transport on Kafka, projections in Postgres."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from processors.key_cache import DEFAULT_CACHE_ENTRIES
from processors.pipeline import DEFAULT_APPROVAL_REQUEST_TTL, Stages
from processors.runtime.kafka import KafkaExecutor
from processors.tools.redaction import Redactor
from processors.tools.registry import ToolRegistry
from schemas.topics import Topics
from toolledger.audit import audit_retention as audit_retention_of
from toolledger.kafka_admin import ensure_topics

if TYPE_CHECKING:
    from processors.groups.facts import StepTool
    from projections.groups import GroupRebuild

log = logging.getLogger("toolledger")


async def wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def run_executor(
    bootstrap: str,
    topics: Topics,
    registry: ToolRegistry,
    secret: bytes,
    *,
    concurrency: int,
    session_timeout_ms: int,
    ready_file: str | None,
    approval_request_ttl: timedelta = DEFAULT_APPROVAL_REQUEST_TTL,
    intents_retention_ms: int | None = None,
    state_dir: Path | None = None,
    cache_entries: int = DEFAULT_CACHE_ENTRIES,
) -> None:
    await ensure_topics(bootstrap, topics, intents_retention_ms=intents_retention_ms)
    executor = KafkaExecutor(
        bootstrap,
        topics,
        Stages(registry, Redactor(secret), approval_request_ttl=approval_request_ttl),
        concurrency=concurrency,
        session_timeout_ms=session_timeout_ms,
        state_dir=state_dir,
        cache_entries=cache_entries,
    )
    await executor.start()
    log.info("executor started", extra={"group": topics.executor_group, "tools": len(registry)})
    if ready_file:
        await executor.assigned.wait()
        await asyncio.to_thread(Path(ready_file).write_text, "ready\n")
    try:
        await wait_for_signal()
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
    from projections.audit_retention import prune_postgres
    from projections.postgres import PostgresProjection, migrate
    from projections.projector import KafkaProjector

    await ensure_topics(bootstrap, topics)
    await migrate(postgres)
    async with PostgresProjection(postgres) as projection:
        projector = KafkaProjector(bootstrap, topics, projection, batch_max=batch_max)
        await projector.start()
        log.info("projector started", extra={"group": projector.name})
        if ready_file:
            await asyncio.to_thread(Path(ready_file).write_text, "ready\n")
        try:
            async with audit_retention_of(
                functools.partial(prune_postgres, postgres), audit_retention
            ):
                await wait_for_signal()
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

    from projections.dialect import POSTGRES
    from projections.groups import rebuild_read_model
    from projections.postgres import PostgresProjection, migrate
    from projections.postgres_groups import PostgresGroupLog
    from projections.projector import rebuild

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
