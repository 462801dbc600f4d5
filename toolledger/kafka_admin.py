"""Creates the topics of a :class:`~schemas.topics.Topics` layout and checks co-partitioning."""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from schemas.topics import Topics


async def ensure_topics(
    bootstrap: str,
    topics: Topics,
    *,
    replication_factor: int = 1,
    intents_retention_ms: int | None = None,
) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        intents_config = {"retention.ms": str(intents_retention_ms)} if intents_retention_ms else {}
        wanted = [
            NewTopic(
                topics.intents, topics.partitions, replication_factor, topic_configs=intents_config
            ),
            NewTopic(
                topics.outcomes,
                topics.partitions,
                replication_factor,
                topic_configs={"retention.ms": "-1"},
            ),
            NewTopic(
                topics.state,
                topics.partitions,
                replication_factor,
                topic_configs={"cleanup.policy": "compact"},
            ),
            NewTopic(
                topics.dead_letters,
                topics.partitions,
                replication_factor,
                topic_configs={"retention.ms": "-1"},
            ),
        ]
        existing = set(await admin.list_topics())
        missing = [t for t in wanted if t.name not in existing]
        if missing:
            response = await admin.create_topics(missing)
            for name, code, *_ in response.topic_errors:
                if code not in (0, TopicAlreadyExistsError.errno):
                    raise RuntimeError(f"creating topic {name} failed with Kafka error {code}")
        for _ in range(100):  # wait until every partition has a leader
            described = await admin.describe_topics([t.name for t in wanted])
            counts = {t["topic"]: len(t["partitions"]) for t in described}
            wrong = {n: c for n, c in counts.items() if c not in (0, topics.partitions)}
            if wrong:
                raise RuntimeError(
                    f"topics {wrong} do not have {topics.partitions} partitions: intents, "
                    "outcomes, state and dead letters must be co-partitioned"
                )
            if all(counts.values()) and all(
                p["leader"] >= 0 and not p["error_code"] for t in described for p in t["partitions"]
            ):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError("topics were created but their partitions have no leader")
    finally:
        await admin.close()
