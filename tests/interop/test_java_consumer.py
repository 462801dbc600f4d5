"""Another team's consumer (docs/consuming.md): after a Kafka + PostgreSQL run with many kinds
of calls, a Java program (Apache Avro + kafka-clients, tests/interop/java) decodes every record
of every topic with only the published bundles and the headers, and its counts per event type
equal PostgreSQL's; and every record is keyed, partitioned and headed as the guide says."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.http.helpers import (
    approval_token,
    assert_call,
    assert_problem,
    eventually_get,
    post_call,
)
from tests.http.servers import ACME, OPERATOR, PARTITIONS, Server, start_distributed
from tests.services import Services
from toolledger.schemas.bundle import BUNDLE_DIR
from toolledger.schemas.codec import decode
from toolledger.schemas.keys import partition_for
from toolledger.schemas.topics import Topics, partition_key

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
JAVA = Path(__file__).resolve().parent / "java"
BUILD = ROOT / ".cache" / "java-consumer"
EMAIL = {"to": "a@example.com", "subject": "Refund", "body": "On its way."}


def build_java() -> Path:
    """The consumer's classes and jars, built once per pom and source (Maven offline then)."""
    digest = hashlib.sha256()
    for path in sorted(JAVA.rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(JAVA).as_posix().encode() + path.read_bytes())
    stamp = BUILD / "built"
    if not (stamp.exists() and stamp.read_text() == digest.hexdigest()):
        subprocess.run(
            [
                "mvn",
                "-B",
                "-ntp",
                "-q",
                "-f",
                str(JAVA / "pom.xml"),
                "package",
                f"-Dconsumer.build.dir={BUILD}",
            ],
            check=True,
            timeout=900,
        )
        stamp.write_text(digest.hexdigest())
    return BUILD


@pytest.fixture(scope="module")
def server(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_distributed(tmp_path_factory.mktemp("interop"), services)
    try:
        yield running
    finally:
        running.stop()


async def workload(server: Server) -> None:
    """Successes, duplicates, failures, an UNKNOWN, reads, an approval, a job, a group, a
    kill switch, and an intent nobody can decode."""
    run = f"run-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=server.base_url, headers=ACME.headers, timeout=90) as c:
        for n in range(6):
            made = await post_call(
                c, "create_ticket", {"title": f"t{n}"}, key=f"ok-{n}", run_id=run
            )
            assert_call(made, "SUCCEEDED", replayed=False)
        again = await post_call(c, "create_ticket", {"title": "t0"}, key="ok-0", run_id=run)
        assert_call(again, "SUCCEEDED", replayed=True)
        reused = await post_call(c, "create_ticket", {"title": "other"}, key="ok-0")
        assert_problem(reused, 422, "IDEMPOTENCY_KEY_REUSED")
        for _ in range(3):
            assert (await post_call(c, "list_tickets", {})).status_code == 200
        failed = await post_call(c, "flaky_write", {"payload": "p", "fault": "final"}, key="fail")
        assert_call(failed, "FAILED_FINAL", replayed=False)
        hang = {"payload": "p", "fault": "hang_after_effect"}
        unknown = await post_call(
            c, "flaky_write", hang, key="unknown", wait=server.flaky_timeout_s + 20
        )
        unknown_call = assert_call(unknown, "UNKNOWN", replayed=False)
        await approval_token(c, "send_email", EMAIL, "mail")
        assert_call(
            await post_call(c, "send_email", EMAIL, key="mail"), "SUCCEEDED", replayed=False
        )
        job = await post_call(c, "export_tickets", {"delay_ms": 200}, key="job", wait=5)
        assert job.status_code in (200, 202), job.text
        job_call = job.json()
        steps = [
            {"id": "open", "tool": "create_ticket", "arguments": {"title": "grouped"}},
            {
                "id": "more",
                "tool": "create_ticket",
                "arguments": {"title": "b"},
                "depends_on": ["open"],
            },
        ]
        group = await c.post(
            "/v1/groups",
            json={"run_id": run, "steps": steps},
            headers={"Idempotency-Key": "group-1", "Prefer": "wait=30"},
        )
        assert group.status_code in (200, 201), group.text
        switch = {"enabled": False, "reason": "interop test"}
        off = await c.put("/v1/tools/close_ticket/switch", headers=OPERATOR.headers, json=switch)
        assert off.status_code == 200, off.text
        refused = await post_call(c, "close_ticket", {"ticket_id": "T_1"}, key="closed")
        assert_problem(refused, 503, "TOOL_DISABLED")
        switch["enabled"] = True
        on = await c.put("/v1/tools/close_ticket/switch", headers=OPERATOR.headers, json=switch)
        assert on.status_code == 200, on.text
        # the job finishes and the UNKNOWN is reconciled in the background: both are awaited,
        # so no outcome is still on its way when the Java consumer and PostgreSQL are counted
        for call in (job_call, unknown_call):
            await eventually_get(
                c,
                f"/v1/calls/{call['call_id']}",
                lambda r: r.json()["status"] not in ("PENDING", "UNKNOWN"),
                timeout_s=120,
            )
    assert server.kafka is not None and server.prefix is not None
    producer = AIOKafkaProducer(bootstrap_servers=server.kafka, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(
            f"{server.prefix}intents",
            b"not an event",
            key=b"k-raw",
            partition=1,
            headers=[("x-origin", b"interop")],
        )
    finally:
        await producer.stop()


async def read_all(bootstrap: str, topics: Topics) -> dict[str, list[Any]]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
    )
    await consumer.start()
    try:
        names = [topics.intents, topics.outcomes, topics.groups, topics.dead_letters]
        tps = [TopicPartition(t, p) for t in names for p in range(topics.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        found: dict[str, list[Any]] = {name: [] for name in names}
        while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                found[tp.topic] += records
        return found
    finally:
        await consumer.stop()


async def settled(server: Server, topics: Topics) -> None:
    """The projector has applied everything, the relay published every group event."""
    assert server.dsn is not None and server.kafka is not None
    for _ in range(300):
        consumer = AIOKafkaConsumer(bootstrap_servers=server.kafka)
        await consumer.start()
        try:
            tps = [TopicPartition(topics.outcomes, p) for p in range(topics.partitions)]
            end = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
        async with await psycopg.AsyncConnection.connect(server.dsn) as conn:
            stored: dict[int, int] = dict(
                await (
                    await conn.execute(
                        "SELECT partition, next_offset FROM projector_positions "
                        "WHERE consumer = %s AND topic = %s",
                        (topics.projector_group, topics.outcomes),
                    )
                ).fetchall()
            )
            unpublished = await (
                await conn.execute("SELECT count(*) FROM group_log WHERE NOT published")
            ).fetchone()
            letters = await (await conn.execute("SELECT count(*) FROM dead_letters")).fetchone()
        if (
            all(stored.get(tp.partition, 0) >= offset for tp, offset in end.items())
            and unpublished == (0,)
            and letters == (1,)
        ):
            return
        await asyncio.sleep(0.2)
    raise AssertionError("the projector or the group relay did not catch up")


async def postgres_counts(dsn: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        for query, label in (
            (
                "SELECT event_type, count(*) FROM tool_call_events GROUP BY 1",
                "outcomes toolledger.events.",
            ),
            (
                "SELECT event_json::jsonb->>'type', count(*) FROM group_log GROUP BY 1",
                "groups toolledger.groups.",
            ),
            (
                "SELECT regexp_replace(topic, '^.*\\.', ''), count(*) FROM dead_letters GROUP BY 1",
                "dead-letters ",
            ),
        ):
            for name, count in await (await conn.execute(query)).fetchall():
                counts[label + name] = count
    return counts


def test_a_java_consumer_reads_every_topic_and_agrees_with_postgres(server: Server) -> None:
    build = build_java()
    assert server.kafka is not None and server.prefix is not None and server.dsn is not None
    topics = Topics(prefix=server.prefix, partitions=PARTITIONS)
    asyncio.run(workload(server))
    asyncio.run(settled(server, topics))

    java = subprocess.run(
        [
            "java",
            "-cp",
            f"{build / 'classes'}:{build / 'libs'}/*",
            "toolledger.interop.Decode",
            server.kafka,
            server.prefix,
            str(BUNDLE_DIR),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert java.returncode == 0, java.stdout + java.stderr
    counted = Counter[str]()
    for line in java.stdout.splitlines():
        _, rest = line.split(" ", 1)
        what, count = rest.rsplit(" ", 1)
        counted[what] = int(count)
    expected = asyncio.run(postgres_counts(server.dsn))
    assert counted.pop("foreign intents") == 1  # the undecodable record: no CloudEvents headers
    assert {k: v for k, v in counted.items() if not k.startswith("intents ")} == expected
    kinds = {k.rsplit(".", 1)[-1] for k in expected}
    assert {
        "ToolCallSucceeded",
        "ToolCallReplayed",
        "ToolCallFailed",
        "ToolCallOutcomeUnknown",
        "ApprovalGranted",
        "ToolCallJobStarted",
        "ToolDisabled",
        "ToolCallRejected",
        "GroupSubmitted",
        "StepFinished",
        "GroupFinished",
    } <= kinds, kinds

    records = asyncio.run(read_all(server.kafka, topics))
    python_intents = Counter(
        f"intents toolledger.events.{decode(r.value).TYPE}"
        for r in {
            dict(r.headers)["ce_id"]: r for r in records[topics.intents] if r.key != b"k-raw"
        }.values()
    )
    assert {k: v for k, v in counted.items() if k.startswith("intents ")} == python_intents

    # keys: one per call, the same on both topics, and it alone gives the partition
    for topic in (topics.intents, topics.outcomes):
        for record in records[topic]:
            if record.key == b"k-raw":
                continue
            event = decode(record.value)
            assert record.key == partition_key(event)
            assert dict(record.headers)["ce_subject"].decode().startswith("call_")
            if type(event).TYPE not in ("ToolDisabled", "ToolEnabled"):  # sent to every partition
                assert record.partition == partition_for(record.key, topics.partitions)
    # the dead letter is the record as it was, plus why
    (letter,) = records[topics.dead_letters]
    assert (letter.key, letter.value) == (b"k-raw", b"not an event")
    headers = dict(letter.headers)
    assert headers["x-origin"] == b"interop"
    assert headers["__connect.errors.topic"] == topics.intents.encode()
    assert headers["__connect.errors.partition"] == b"1"
    assert b"undecodable" in headers["__connect.errors.exception.message"]
