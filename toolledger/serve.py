"""Wiring of the HTTP front door for the embedded or the distributed backend."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn

from processors.tools.registry import ToolRegistry
from producers.http.app import FrontDoor, ToolInfo, create_app
from producers.http.auth import TokenStore

log = logging.getLogger("toolledger.serve")


def tool_infos(registry: ToolRegistry) -> dict[str, ToolInfo]:
    return {t.name: ToolInfo(t.name, t.keyed, t.manifest()) for t in registry}


@contextlib.asynccontextmanager
async def embedded_door(
    data: Path, registry: ToolRegistry, tokens: TokenStore
) -> AsyncIterator[FrontDoor]:
    from projections.sqlite import SqliteCalls
    from toolledger.embedded import EmbeddedLedger

    async with EmbeddedLedger(data / "ledger.db", registry) as ledger:
        assert ledger.log is not None and ledger.runtime is not None
        runtime = ledger.runtime

        async def ready() -> dict[str, bool]:
            return {"executor": all(w.failed is None for w in runtime.workers)}

        yield FrontDoor(
            ledger.client, SqliteCalls(ledger.log.conn), tool_infos(registry), tokens, ready
        )


@contextlib.asynccontextmanager
async def distributed_door(
    kafka: str,
    postgres: str,
    prefix: str,
    partitions: int,
    registry: ToolRegistry,
    tokens: TokenStore,
) -> AsyncIterator[FrontDoor]:
    from producers.client import LedgerClient
    from producers.kafka import KafkaTransport
    from projections.postgres import PostgresCalls, PostgresProjection, migrate
    from schemas.topics import Topics
    from toolledger.kafka_admin import ensure_topics

    topics = Topics(prefix, partitions)
    await ensure_topics(kafka, topics)
    await migrate(postgres)
    transport = KafkaTransport(kafka, topics)
    await transport.start()
    try:
        async with PostgresProjection(postgres) as projection:
            calls = PostgresCalls(projection)

            async def ready() -> dict[str, bool]:
                try:
                    await calls.applied("readiness-probe")
                    database = True
                except Exception:
                    database = False
                return {"postgres": database, "kafka": transport.running}

            yield FrontDoor(LedgerClient(transport), calls, tool_infos(registry), tokens, ready)
    finally:
        await transport.stop()


async def serve(door: FrontDoor, host: str, port: int) -> None:
    config = uvicorn.Config(
        create_app(door), host=host, port=port, log_config=None, access_log=False, lifespan="off"
    )
    server = uvicorn.Server(config)
    log.info("serving", extra={"host": host, "port": port})
    await server.serve()
