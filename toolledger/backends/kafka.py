"""The Kafka + PostgreSQL backend, as a front door uses it: intents appended to the topics of
``settings.prefix`` on the cluster ``settings.kafka`` (the executors run them elsewhere), the
read models and the call groups' log in PostgreSQL (``settings.postgres``; without it, only
calls). Opened with tools, it makes the topics if they are missing and applies the
deployment's key retention (:mod:`toolledger.kafka_settings`); without, it only appends calls.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator

from toolledger.backends import BackendFactory, BackendParts
from toolledger.kafka_admin import ensure_topics
from toolledger.kafka_settings import agreed_key_retention
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.producers.client import LedgerClient
from toolledger.producers.kafka import KafkaTransport
from toolledger.producers.kafka_intents import KafkaIntentLookup
from toolledger.schemas.keys import DEFAULT_KEY_SCOPE


class Factory(BackendFactory):
    @contextlib.asynccontextmanager
    async def open(self, registry: ToolRegistry | None) -> AsyncIterator[BackendParts]:
        settings, topics = self.settings, self.settings.topics
        # the keys' scope of tools that set none (the executors must apply the same)
        scope = settings.key_scope or DEFAULT_KEY_SCOPE
        if registry is not None and settings.key_scope is not None:
            registry.set_default_key_scope(settings.key_scope)
        if registry is not None:  # a front door: the deployment's topics and key retention
            await ensure_topics(settings.kafka, topics)
            registry.set_default_key_retention(
                await agreed_key_retention(
                    settings.kafka,
                    topics,
                    settings.key_retention,
                    registry.default_key_retention,
                    who="a front door",
                )
            )
        transport = KafkaTransport(settings.kafka, topics)
        await transport.start()
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = LedgerClient(
                    transport,
                    default_wait_s=settings.default_wait_s,
                    max_argument_bytes=settings.max_argument_bytes,
                    key_scopes=(lambda _tool: scope) if registry is None else registry.key_scope_of,
                )
                yield await self._parts(stack, transport, client, registry)
        finally:
            await transport.stop()

    async def _parts(
        self,
        stack: contextlib.AsyncExitStack,
        transport: KafkaTransport,
        client: LedgerClient,
        registry: ToolRegistry | None,
    ) -> BackendParts:
        settings = self.settings
        intents = KafkaIntentLookup(settings.kafka, settings.topics)
        if settings.postgres is None or registry is None:  # calls only

            async def reachable() -> dict[str, bool]:
                return {"kafka": transport.running and await transport.reachable()}

            return BackendParts(client, None, None, intents, reachable, None)

        from toolledger.groups import postgres_groups
        from toolledger.projections.audit_retention import prune_postgres
        from toolledger.projections.postgres import PostgresCalls, PostgresProjection, migrate

        dsn = settings.postgres
        await migrate(dsn)
        projection = await stack.enter_async_context(PostgresProjection(dsn))
        calls = PostgresCalls(projection)
        groups = await postgres_groups(
            stack, projection, dsn, settings.kafka, settings.topics, client, lambda: registry
        )

        async def ready() -> dict[str, bool]:
            try:
                await calls.applied("readiness-probe")
                database = True
            except Exception:
                database = False
            kafka = transport.running and await transport.reachable()
            return {"postgres": database, "kafka": kafka}

        return BackendParts(
            client, calls, groups, intents, ready, functools.partial(prune_postgres, dsn)
        )
