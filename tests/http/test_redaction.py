"""Sensitive argument values exist only on the intents stream.

A run with approvals, a replay, a refused token and a validation failure puts recognisable
secrets in every field the manifests redact; afterwards every other store (the outcome, state
and dead-letter logs, every projection table, the executor's state), every log line and every
exported span of every process is searched for them, on each backend. The intents stream is the
one place they must be found (so the search is shown to look in the right bytes).
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid

import httpx
import psycopg
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.http.helpers import approval_token, assert_call, assert_problem, post_call
from tests.http.servers import PARTITIONS, Server


def _sqlite_texts(server: Server) -> dict[str, bytes]:
    """Every table of the embedded ledger file (its raw intents: ``intents``)."""
    assert server.ledger_db is not None
    conn = sqlite3.connect(f"file:{server.ledger_db}?mode=ro", uri=True, timeout=30)
    try:
        found: dict[str, bytes] = {}
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                found[table] = (
                    found.get(table, b"")
                    + repr(row).encode()
                    + b"".join(v for v in row if isinstance(v, bytes))
                )
        return found
    finally:
        conn.close()


async def _topic_bytes(server: Server, topic: str) -> bytes:
    assert server.kafka is not None
    consumer = AIOKafkaConsumer(bootstrap_servers=server.kafka, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        chunks: list[bytes] = []

        async def behind() -> bool:
            return any([await consumer.position(tp) < end for tp, end in ends.items()])

        while await behind():
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    chunks += [record.key or b"", record.value or b""]
                    chunks += [v for _, v in record.headers or ()]
        return b"\n".join(chunks)
    finally:
        await consumer.stop()


async def _postgres_bytes(dsn: str) -> bytes:
    chunks: list[bytes] = []
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        tables = await (
            await conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )
        ).fetchall()
        for (table,) in tables:
            rows = await (await conn.execute(f'SELECT * FROM "{table}"')).fetchall()
            chunks += [repr(row).encode() for row in rows]
    return b"\n".join(chunks)


async def _stores(server: Server) -> tuple[dict[str, bytes], bytes]:
    """(stores that must not hold raw values, the intents stream)."""
    if server.ledger_db is not None:
        texts = _sqlite_texts(server)
        intents = texts.pop("intents", b"")
        return texts, intents
    assert server.prefix is not None and server.dsn is not None
    names = ("outcomes", "state", "dead-letters")
    texts = {n: await _topic_bytes(server, server.prefix + n) for n in names}
    texts["postgres"] = await _postgres_bytes(server.dsn)
    return texts, await _topic_bytes(server, server.prefix + "intents")


async def test_raw_sensitive_values_are_only_on_the_intents_stream(
    server: Server, client: httpx.AsyncClient, key: str
) -> None:
    tag = uuid.uuid4().hex[:10]
    secrets = {
        "email": f"secret.{tag}@private.example",
        "body": f"Body-with-secret-{tag}",
        "customer": f"cus_secret_{tag}",
    }
    email = {"to": secrets["email"], "subject": "Your refund", "body": secrets["body"]}
    token = await approval_token(client, "send_email", email, key)
    assert_call(
        await post_call(client, "send_email", email, key=key, approval_token=token),
        "SUCCEEDED",
        replayed=False,
    )
    await post_call(client, "send_email", email, key=key)  # replay
    charge = {"customer_id": secrets["customer"], "amount_cents": 700, "currency": "EUR"}
    asked = await post_call(client, "charge_card", charge, key=key, run_id=f"run-{tag}")
    assert_problem(asked, 428, "APPROVAL_REQUIRED")
    forged = await post_call(client, "charge_card", charge, key=key, approval_token="apt_x")
    assert_problem(forged, 403, "APPROVAL_INVALID")
    bad = {**charge, "amount_cents": -5}  # refused by validation, secret still in a field
    assert_problem(
        await post_call(client, "charge_card", bad, key=key + "-bad"), 400, "VALIDATION_FAILED"
    )

    async def searched() -> tuple[dict[str, bytes], bytes]:
        for _ in range(100):  # until the projection has the last answer
            stores, intents = await _stores(server)
            everything = b"".join(stores.values())
            if f"{key}-bad".encode() in everything and b"ToolCallReplayed" in everything:
                return stores, intents
            await asyncio.sleep(0.2)
        raise AssertionError("the stores never showed the run")

    stores, intents = await searched()
    logged = server.everything_logged()
    spans = b"".join(v for k, v in logged.items() if k.endswith(".spans.jsonl"))
    assert b'"name": "execute_tool ' in spans, "the executor's spans were not exported"
    assert b"ApprovalConsumed" in spans  # spans of this run, not only of earlier tests
    for name, value in secrets.items():
        raw = value.encode()
        assert raw in intents, f"{name}: the search does not see the intents stream"
        for where, content in {**stores, **logged}.items():
            assert raw not in content, f"{name} found in {where}"
    assert b"redacted:hmac-sha256:" in b"".join(stores.values())  # masked, still comparable
