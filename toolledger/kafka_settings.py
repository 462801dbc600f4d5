"""The settings every process of a Kafka deployment must share, recorded on its settings topic
(``<prefix>settings``, one partition, kept forever): today the key retention of tools whose
manifest sets none. The executors decide expiries with it and the front doors state it
(``GET /v1/tools``, MCP), so both read it from here when they start, never from their own
flags alone.

Each record is a JSON object ``{"key_retention": "PT24H", "set_by": "topics"}``. The one in
force is the last one ``toolledger topics --key-retention`` wrote; before any, the first one
on the topic: the first executor or front door to start records its own (its
``--key-retention``, else the tools' default), and two that start at once with different
values agree on the first record written, so the other refuses to start. A process whose
``--key-retention`` disagrees with the record in force refuses to start, in one line.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from toolledger.config import ConfigError
from toolledger.processors.tools.retention import (
    KeyRetention,
    RetentionError,
    check_retention,
    describe,
)
from toolledger.schemas.topics import Topics

log = logging.getLogger("toolledger.settings")

SET_BY_TOPICS = "topics"
READ_TIMEOUT_S = 60.0
FETCH_WAIT_MS = 200


@dataclass(frozen=True)
class RecordedRetention:
    """The key retention in force and the command that recorded it."""

    key_retention: KeyRetention
    set_by: str


async def _records(bootstrap: str, topics: Topics) -> list[dict[str, str]]:
    """Every record of the settings topic, oldest first (none if the topic does not exist).
    Read from offset 0 up to the high watermark of the fetches: no offset lookup, which a
    partition made a moment ago answers with a leader error that aiokafka logs at ERROR."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        if topics.settings not in await consumer.topics():
            return []
        partition = TopicPartition(topics.settings, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        found: list[dict[str, str]] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while True:
            batch = await consumer.getmany(partition, timeout_ms=FETCH_WAIT_MS)
            found += [json.loads(r.value) for r in batch.get(partition, []) if r.value]
            end = consumer.highwater(partition)
            if end is not None and await consumer.position(partition) >= end:
                return found
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"{topics.settings} could not be read in {READ_TIMEOUT_S:.0f} s: is the "
                    f"broker at {bootstrap} up?"
                )
    finally:
        await consumer.stop()


def _in_force(records: list[dict[str, str]], topics: Topics) -> RecordedRetention | None:
    chosen = next((r for r in reversed(records) if r.get("set_by") == SET_BY_TOPICS), None)
    if chosen is None and records:
        chosen = records[0]
    if chosen is None:
        return None
    try:
        return RecordedRetention(check_retention(chosen["key_retention"]), chosen["set_by"])
    except (KeyError, RetentionError) as exc:
        raise ConfigError(f"{topics.settings} holds an unreadable key retention: {exc}") from None


async def _write(bootstrap: str, topics: Topics, retention: KeyRetention, set_by: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        value = {"key_retention": describe(retention), "set_by": set_by}
        await producer.send_and_wait(
            topics.settings, json.dumps(value).encode(), key=b"key_retention", partition=0
        )
    finally:
        await producer.stop()


async def recorded_key_retention(bootstrap: str, topics: Topics) -> RecordedRetention | None:
    """The key retention in force on this deployment, or None if none is recorded yet."""
    return _in_force(await _records(bootstrap, topics), topics)


async def set_key_retention(
    bootstrap: str, topics: Topics, retention: KeyRetention
) -> RecordedRetention:
    """Record ``retention`` as the deployment's (``toolledger topics --key-retention``); the
    processes running take it when they restart."""
    await _write(bootstrap, topics, retention, SET_BY_TOPICS)
    found = await recorded_key_retention(bootstrap, topics)
    assert found is not None, "a record just written is read back"
    return found


async def agreed_key_retention(
    bootstrap: str,
    topics: Topics,
    asked: KeyRetention | None,
    fallback: KeyRetention,
    *,
    who: str,
) -> KeyRetention:
    """The key retention this process must apply (``who``: the command, for the record and
    the log): the recorded one; if none is recorded yet, ``asked`` (its ``--key-retention``)
    or else ``fallback`` (the tools' default), recorded first. :class:`ConfigError` in one line
    if ``asked`` disagrees with the record in force."""
    found = await recorded_key_retention(bootstrap, topics)
    if found is None:
        await _write(bootstrap, topics, fallback if asked is None else asked, who)
        found = await recorded_key_retention(bootstrap, topics)  # a racer's may be first
        assert found is not None, "a record just written is read back"
    if asked is not None and asked != found.key_retention:
        raise ConfigError(
            f"--key-retention {describe(asked)} disagrees with this deployment's key retention "
            f"{describe(found.key_retention)} (recorded on {topics.settings} by "
            f"{found.set_by}): leave the option out, or change it for every process with "
            f"'toolledger topics --key-retention {describe(asked)}' and restart them"
        )
    log.info(
        "key retention",
        extra={"key_retention": describe(found.key_retention), "set_by": found.set_by},
    )
    return found.key_retention
