"""The front door's intent producer heals after a failed batch (a real broker).

An idempotent producer whose sent batch failed (aiokafka gives up on a batch whose partition
had no leader for longer than the request timeout, as through a slow broker restart) has a
hole in its sequence numbers: the broker refuses each later batch of that producer with
OUT_OF_ORDER_SEQUENCE_NUMBER, for ever, and the front door could append nothing more to the
partition. The test makes the hole directly (the producer skips sequence numbers) and checks
that the failed append is reported, the producer replaced, and the next append lands."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.services import Services
from toolledger.kafka_admin import ensure_topics
from toolledger.producers.client import TransportError
from toolledger.producers.kafka import KafkaTransport
from toolledger.schemas import codec
from toolledger.schemas.events import Envelope, ToolCallRequested
from toolledger.schemas.keys import CallKey
from toolledger.schemas.topics import Topics

pytestmark = pytest.mark.services


def _intent(key: str) -> ToolCallRequested:
    intent_id = uuid.uuid4().hex
    return ToolCallRequested(
        envelope=Envelope(
            event_id=f"{intent_id}/requested/1",
            call_key=str(CallKey("acme", "create_ticket", key)),
            tenant_id="acme",
            tool="create_ticket",
            tool_version="",
            idempotency_key=key,
            args_digest="",
            intent_id=intent_id,
            occurred_at=datetime.now(UTC),
        ),
        arguments_json="{}",
    )


async def _keys_in(bootstrap: str, tp: TopicPartition) -> list[str]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        keys: list[str] = []
        while await consumer.position(tp) < end:
            for records in (await consumer.getmany(tp, timeout_ms=1000)).values():
                for record in records:
                    event = codec.decode(record.value or b"")
                    assert isinstance(event, ToolCallRequested)
                    keys.append(event.envelope.idempotency_key)
        return keys
    finally:
        await consumer.stop()


async def test_a_producer_with_a_hole_in_its_sequence_is_replaced_and_appends_again(
    services: Services,
) -> None:
    topics = Topics(f"renew{uuid.uuid4().hex[:8]}.", 1)
    await ensure_topics(services.kafka, topics)
    transport = KafkaTransport(services.kafka, topics)
    await transport.start()
    try:
        await transport.send(_intent("before"))
        tp = TopicPartition(topics.intents, 0)
        # what a batch given up after it was sent leaves behind: numbers the broker never saw
        transport._producer._txn_manager.increment_sequence_number(tp, 7)

        with pytest.raises(TransportError, match="OutOfOrderSequenceNumber"):
            await transport.send(_intent("in-the-hole"))
        assert transport.renewals == 1

        await transport.send(_intent("after"))  # the new producer: a new id, numbered from 0
        await transport.send(_intent("after-2"))
        assert transport.renewals == 1
        assert await _keys_in(services.kafka, tp) == ["before", "after", "after-2"]
    finally:
        await transport.stop()
