"""Publishes the call groups' log to the ``groups`` topic (Kafka + PostgreSQL backend).

The orchestrator appends a group's events to ``group_log`` in PostgreSQL in the same
transaction as the group's read model (that is what makes a decision durable before it is
acted on, and what a takeover folds). That table is also the *outbox* of the groups topic:
this relay sends its unpublished rows to ``<prefix>groups``, keyed by group id and placed on
the partition :func:`schemas.keys.partition_for` gives that id (so one group's events are in
one partition, in order), and marks them published once the brokers have acknowledged them.

One relay publishes at a time, whichever front door holds the relay's advisory lock (its
session's, so a crashed leader's lock goes with it). Timeline of one round::

    leader: read unpublished rows (seq order) ─ send each, await every ack ─ mark them published
    crash after the acks, before the mark: the next round (or leader) sends those rows again

So publication is at least once, and every record carries its ``tl-seq`` header (the row's
``seq``, increasing within a group): a consumer applies a record only if its ``tl-seq`` is
greater than the last it applied for that group, and then sees each group's events exactly
once, in order. Order within a group holds because a group has one writer at a time, which
appends only after its previous append committed, and each round sends in ``seq`` order
through one idempotent producer.

The topic carries what the group log carries, the steps' literal arguments included, so its
retention is that of the intents topic: the retention of sensitive data.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from datetime import datetime
from types import TracebackType
from typing import Any

import psycopg
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from toolledger.schemas.cloudevents import Header, group_event_headers
from toolledger.schemas.keys import partition_for
from toolledger.schemas.topics import Topics

log = logging.getLogger("toolledger.groups")

SEQ_HEADER = "tl-seq"
TENANT_HEADER = "tl-tenant"
_LEADER_LOCK = (0x7472, 0)  # "tr": the relay's leadership (group claims use class "tg")

_UNPUBLISHED = (
    "SELECT l.seq, l.group_id, l.event_json, m.tenant_id FROM group_log l"
    " JOIN group_meta m ON m.group_id = l.group_id"
    " WHERE NOT l.published ORDER BY l.seq LIMIT %s"
)
_MARK = "UPDATE group_log SET published = true WHERE seq = ANY(%s)"


class GroupEventRelay:
    def __init__(
        self,
        dsn: str,
        bootstrap: str,
        topics: Topics,
        *,
        batch: int = 500,
        interval_s: float = 0.5,
    ) -> None:
        self._dsn = dsn
        self._topic = topics.groups
        self._partitions = topics.partitions
        self._batch = batch
        self._interval_s = interval_s
        self._bootstrap = bootstrap
        self._producer = self._new_producer()
        self._producer_started = False
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._leading = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self._bootstrap, enable_idempotence=True, acks="all", linger_ms=5
        )

    @property
    def leading(self) -> bool:
        return self._leading

    def wake(self) -> None:
        """Something was appended here: publish it now rather than at the next interval."""
        self._wake.set()

    async def start(self) -> None:
        await self._start_producer()
        self._task = asyncio.get_running_loop().create_task(self._keep_publishing())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:  # what this process appended last is published now, not by the next leader
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.publish_pending(), 5.0)
        finally:
            await self._disconnect()
            await self._producer.stop()

    async def __aenter__(self) -> GroupEventRelay:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def publish_pending(self) -> int:
        """One round: if this relay leads, send up to ``batch`` unpublished rows and mark
        them published. Returns how many were published (0 when another relay leads)."""
        conn = await self._lead()
        if conn is None:
            return 0
        rows = await (await conn.execute(_UNPUBLISHED, (self._batch,))).fetchall()
        if not rows:
            return 0
        await self._send(rows)
        await self._mark(conn, [row[0] for row in rows])
        return len(rows)

    async def _start_producer(self) -> None:
        try:
            await self._producer.start()
        except BaseException:
            await _stop_quietly(self._producer)
            self._producer = self._new_producer()  # a half-started one is not started again
            raise
        self._producer_started = True

    async def _send(self, rows: list[tuple[Any, ...]]) -> None:
        if not self._producer_started:
            await self._start_producer()
        sent = [
            await self._producer.send(
                self._topic,
                value=event_json.encode(),
                key=group_id.encode(),
                partition=partition_for(group_id.encode(), self._partitions),
                headers=_headers(seq, group_id, event_json, tenant),
            )
            for seq, group_id, event_json, tenant in rows
        ]
        try:
            await asyncio.gather(*sent)  # every ack before any mark
        except KafkaError:
            # a failed batch leaves a hole in the idempotent producer's sequence numbers and
            # the broker refuses its every later batch (producers.kafka.KafkaTransport._renew):
            # the next round sends, the unmarked rows again, through a new producer
            failed, self._producer = self._producer, self._new_producer()
            self._producer_started = False
            await _stop_quietly(failed)
            raise

    async def _mark(self, conn: psycopg.AsyncConnection[Any], seqs: list[int]) -> None:
        await conn.execute(_MARK, (seqs,))

    async def _lead(self) -> psycopg.AsyncConnection[Any] | None:
        if self._conn is None or self._conn.closed:
            self._leading = False
            self._conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True)
        if not self._leading:
            cur = await self._conn.execute("SELECT pg_try_advisory_lock(%s, %s)", _LEADER_LOCK)
            row = await cur.fetchone()
            self._leading = bool(row and row[0])
        return self._conn if self._leading else None

    async def _disconnect(self) -> None:
        self._leading = False
        if self._conn is not None:
            await self._conn.close()  # gives up the leadership with the session
            self._conn = None

    async def _keep_publishing(self) -> None:
        failures = 0
        while True:
            self._wake.clear()  # before the read: an append during the round wakes the next
            try:
                published = await self.publish_pending()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:  # PostgreSQL or the brokers away: lead again once they are back
                failures += 1
                log.warning("publishing group events failed", exc_info=failures == 1)
                await self._disconnect()
                await asyncio.sleep(min(30.0, self._interval_s * 2**failures))
                continue
            if published == self._batch:
                continue  # more are waiting
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval_s)


async def _stop_quietly(producer: AIOKafkaProducer) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(producer.stop(), 10.0)


def _headers(seq: int, group_id: str, event_json: str, tenant: str) -> list[Header]:
    """``tl-seq``, ``tl-tenant`` and the CloudEvents headers of a group log row."""
    event = json.loads(event_json)
    at = event.get("at")
    return [
        (SEQ_HEADER, str(seq).encode()),
        (TENANT_HEADER, tenant.encode()),
        *group_event_headers(
            tenant,
            group_id,
            seq,
            event["type"],
            datetime.fromisoformat(at) if isinstance(at, str) else None,
        ),
    ]
