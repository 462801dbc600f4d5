"""Raw arguments of a call, read back from the Kafka intents topic: what a human who decides an
approval is shown. Raw arguments live only there (the topic's retention is the retention of
sensitive data), never in projections, logs or spans.

An intent is found by its call key in the key's intents partition, from the offset of
:data:`WINDOW` before the approval was requested (``offsets_for_times``) to that long after
it, with a bound on the records read and on the time spent: a lookup reads a few minutes of
one partition whatever the topic holds.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta

from aiokafka import AIOKafkaConsumer, TopicPartition

from toolledger.schemas.codec import CodecError, decode
from toolledger.schemas.events import ToolCallRequested
from toolledger.schemas.keys import partition_for
from toolledger.schemas.topics import Topics

WINDOW = timedelta(minutes=2)
MAX_RECORDS = 200_000  # read at most this many records of the partition per lookup
MAX_SECONDS = 5.0
MAX_CANDIDATES = 64


class KafkaIntentLookup:
    """``arguments(call_key, around)``: the raw ``arguments_json`` of the intents of a call key
    appended within :data:`WINDOW` of ``around``, newest first."""

    def __init__(self, bootstrap: str, topics: Topics) -> None:
        self._bootstrap = bootstrap
        self._topics = topics
        self._lock = asyncio.Lock()  # one lookup at a time: a human's pace, one consumer

    async def arguments(self, call_key: str, around: datetime) -> list[str]:
        async with self._lock:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self._bootstrap, group_id=None, enable_auto_commit=False
            )
            await consumer.start()
            try:
                return await self._read(consumer, call_key, around)
            finally:
                await consumer.stop()

    async def _read(self, consumer: AIOKafkaConsumer, call_key: str, around: datetime) -> list[str]:
        key = call_key.encode("utf-8")
        tp = TopicPartition(self._topics.intents, partition_for(key, self._topics.partitions))
        consumer.assign([tp])
        start_ms = int((around - WINDOW).timestamp() * 1000)
        end_ms = int((around + WINDOW).timestamp() * 1000)
        found = (await consumer.offsets_for_times({tp: start_ms}))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        if found is None:
            return []  # nothing appended since then
        consumer.seek(tp, found.offset)
        matches: list[str] = []
        read, deadline = 0, time.monotonic() + MAX_SECONDS
        while read < MAX_RECORDS and time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=200, max_records=5_000)
            records = batch.get(tp, [])
            for record in records:
                read += 1
                if record.timestamp > end_ms:
                    return matches[::-1][:MAX_CANDIDATES]
                if record.key != key or record.value is None:
                    continue
                try:
                    event = decode(record.value)
                except CodecError:
                    continue
                if isinstance(event, ToolCallRequested):
                    matches.append(event.arguments_json)
            if not records and await consumer.position(tp) >= end:
                break
        return matches[::-1][:MAX_CANDIDATES]
