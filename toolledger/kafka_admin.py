"""Creates the topics of a :class:`~schemas.topics.Topics` layout, checks co-partitioning,
and sets the configs each topic's role needs (:func:`apply_topic_configs`):

* intents: time retention. Raw arguments live only here, so this is the retention of
  sensitive data; the executor has processed an intent long before it is deleted.
* outcomes: the audit trail and the projections' source; forever unless told otherwise.
* state: compacted, so an expired key's tombstone removes it; a takeover reads only live keys.
* dead letters: the intents' retention: a dead letter keeps the record it holds whole, an
  intent's raw arguments included (schemas.dead_letters).
* groups: the call groups' events (projections.group_relay). A submission carries its steps'
  literal arguments, so this topic has the intents' retention.
* settings: one partition, kept forever: the settings every process of the deployment shares
  (toolledger.kafka_settings).
"""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError

from toolledger.schemas.topics import Topics

DEFAULT_INTENTS_RETENTION_MS = 7 * 86_400_000
FOREVER_MS = -1
# how long a tombstone stays on the compacted state topic: a local store that has not read
# the topic for longer is rebuilt (processors.runtime.local_store.TOMBSTONE_HORIZON_S)
STATE_TOMBSTONE_RETENTION_MS = 86_400_000


def topic_configs(
    topics: Topics,
    *,
    intents_retention_ms: int = DEFAULT_INTENTS_RETENTION_MS,
    outcomes_retention_ms: int = FOREVER_MS,
) -> dict[str, dict[str, str]]:
    """The config of every topic of the layout, by topic name."""
    return {
        topics.intents: {"cleanup.policy": "delete", "retention.ms": str(intents_retention_ms)},
        topics.outcomes: {"cleanup.policy": "delete", "retention.ms": str(outcomes_retention_ms)},
        topics.state: {
            "cleanup.policy": "compact",
            "retention.ms": str(FOREVER_MS),
            "delete.retention.ms": str(STATE_TOMBSTONE_RETENTION_MS),
        },
        topics.dead_letters: {
            "cleanup.policy": "delete",
            "retention.ms": str(intents_retention_ms),
        },
        topics.groups: {"cleanup.policy": "delete", "retention.ms": str(intents_retention_ms)},
        topics.settings: {"cleanup.policy": "delete", "retention.ms": str(FOREVER_MS)},
    }


class TopicError(RuntimeError):
    """The topics cannot be created as asked (the broker's refusal, or partitions that do not
    match the layout)."""


CONFIG_SETTLE_S = 10.0  # how long a changed config may take to show in the broker's answers


async def apply_topic_configs(
    bootstrap: str, configs: dict[str, dict[str, str]]
) -> dict[str, dict[str, str]]:
    """Set ``configs`` on existing topics; returns what the broker reports afterwards: once
    it reports them all, or what it reports after :data:`CONFIG_SETTLE_S` (in KRaft mode a
    change reaches the broker's metadata after the controller accepted it, so a describe
    right after an alter can still answer the old value)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        responses = await admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, n, configs=c) for n, c in configs.items()]
        )
        for response in responses:
            for code, message, _type, name in response.resources:
                if code:
                    raise RuntimeError(f"setting the config of {name} failed: {code} {message}")
        deadline = asyncio.get_running_loop().time() + CONFIG_SETTLE_S
        while True:
            found = await _described(admin, configs)
            if found == configs or asyncio.get_running_loop().time() > deadline:
                return found
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def _described(
    admin: AIOKafkaAdminClient, wanted: dict[str, dict[str, str]]
) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, name) for name in wanted]
    )
    for response in responses:
        for _code, _message, _type, name, entries in response.resources:
            keys = wanted.get(name, {})
            found[name] = {e[0]: e[1] for e in entries if e[0] in keys}
    return found


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
        configs = topic_configs(
            topics, intents_retention_ms=intents_retention_ms or DEFAULT_INTENTS_RETENTION_MS
        )
        wanted = [
            NewTopic(
                name,
                1 if name == topics.settings else topics.partitions,
                replication_factor,
                topic_configs=config,
            )
            for name, config in configs.items()
        ]
        existing = set(await admin.list_topics())
        missing = [t for t in wanted if t.name not in existing]
        if missing:
            response = await admin.create_topics(missing)
            for name, code, *message in response.topic_errors:
                if code not in (0, TopicAlreadyExistsError.errno):
                    why = f": {message[0]}" if message and message[0] else ""
                    raise TopicError(f"creating topic {name} failed with Kafka error {code}{why}")
        for _ in range(100):  # wait until every partition has a leader
            described = await admin.describe_topics([t.name for t in wanted])
            counts = {t["topic"]: len(t["partitions"]) for t in described}
            wrong = {
                n: c
                for n, c in counts.items()
                if c not in (0, 1 if n == topics.settings else topics.partitions)
            }
            if wrong:
                raise TopicError(
                    f"topics {wrong} do not have {topics.partitions} partitions: intents, "
                    "outcomes, state, dead letters and groups must be co-partitioned"
                )
            if all(counts.values()) and all(
                p["leader"] >= 0 and not p["error_code"] for t in described for p in t["partitions"]
            ):
                return
            await asyncio.sleep(0.1)
        raise TopicError("topics were created but their partitions have no leader")
    finally:
        await admin.close()
