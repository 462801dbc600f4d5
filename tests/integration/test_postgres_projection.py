"""The PostgreSQL projection and the Kafka projector against the real services.

Needs ``TOOLLEDGER_POSTGRES`` (and ``TOOLLEDGER_KAFKA`` for the projector tests); see
``conftest.py``. Each test gets a fresh schema (``search_path`` in the DSN) and its own topics.
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests import postgres_reads
from tests.unit.test_governance_views import sqlite_load, sqlite_with
from toolledger.processors.ledger import CallState, fold_all
from toolledger.processors.ledger.rows import CALL_COLUMNS, call_row, state_of_row
from toolledger.projections import search
from toolledger.projections.postgres import (
    PostgresCalls,
    PostgresProjection,
    ProjectionError,
    ProjectionUnavailable,
    load_migrations,
    migrate,
)
from toolledger.projections.projector import KafkaProjector, rebuild
from toolledger.projections.rows import (
    ANALYTICS_COLUMNS,
    EVENT_COLUMNS,
    Position,
    audit_payload,
    latest_durations,
)
from toolledger.projections.sqlite import SqliteCalls
from toolledger.schemas.canonical import args_digest, canonical_json
from toolledger.schemas.codec import encode
from toolledger.schemas.dead_letters import DeadLetterRecord
from toolledger.schemas.errors import ErrorCode, ErrorInfo, FieldError
from toolledger.schemas.events import (
    Envelope,
    Event,
    FailureDisposition,
    Resolution,
    ToolCallFailed,
    ToolCallOutcomeUnknown,
    ToolCallReconciled,
    ToolCallRejected,
    ToolCallReplayed,
    ToolCallStarted,
    ToolCallSucceeded,
)
from toolledger.schemas.keys import CallKey, partition_for
from toolledger.schemas.status import CallStatus
from toolledger.schemas.topics import INTENT_ID_HEADER, Topics

pytestmark = pytest.mark.services

CONSUMER = "test-projector"
TOPIC = "test.outcomes"
T0 = datetime(2025, 3, 1, 9, 0, 0, tzinfo=UTC)
STEP_TIMEOUT_S = 60.0


# ------------------------------------------------------------------------- event builders


@dataclass(frozen=True)
class Call:
    key: CallKey
    run_id: str
    step_id: str
    digest: str

    @classmethod
    def of(cls, tenant: str, tool: str, idem: str, run_id: str = "run-1") -> Call:
        args = {"to": f"{idem}@example.com", "body": "héllo ✓", "n": 1.50}
        return cls(CallKey(tenant, tool, idem), run_id, idem, args_digest(args))


class History:
    """Outcome events as the executor writes them: deterministic ids, increasing times."""

    def __init__(self) -> None:
        self._tick = 0

    def env(self, call: Call, intent: str, n: int) -> Envelope:
        self._tick += 1
        return Envelope(
            event_id=f"{intent}/{n}",
            call_key=str(call.key),
            tenant_id=call.key.tenant_id,
            tool=call.key.tool,
            tool_version="1.2",
            idempotency_key=call.key.idempotency_key,
            args_digest=call.digest,
            intent_id=intent,
            run_id=call.run_id,
            step_id=call.step_id,
            principal="agent:planner",
            occurred_at=T0 + timedelta(milliseconds=7 * self._tick, microseconds=self._tick),
            trace_id=f"trace-{intent}",
        )

    def started(self, c: Call, intent: str, n: int, attempt: int, rnd: int = 1) -> Event:
        return ToolCallStarted(
            envelope=self.env(c, intent, n),
            attempt=attempt,
            round=rnd,
            executor_epoch=3,
            arguments_redacted_json=canonical_json({"to": "[redacted]", "body": "héllo ✓"}),
        )

    def succeeded(self, c: Call, intent: str, n: int, attempt: int) -> Event:
        result = canonical_json({"id": f"msg-{c.key.idempotency_key}", "ok": True, "cost": 0.1})
        return ToolCallSucceeded(
            envelope=self.env(c, intent, n),
            attempt=attempt,
            result_json=result,
            downstream_request_id=f"req-{intent}",
            duration_ms=12,
        )

    def failed(
        self, c: Call, intent: str, n: int, attempt: int, disposition: FailureDisposition
    ) -> Event:
        error = ErrorInfo.downstream(
            "TIMEOUT", "the mail server timed out", retryable=True, suggested_action="retry"
        )
        return ToolCallFailed(
            envelope=self.env(c, intent, n),
            attempt=attempt,
            error=error,
            disposition=disposition,
            fingerprint="fp-timeout",
            duration_ms=30_000,
        )

    def unknown(self, c: Call, intent: str, n: int, attempt: int) -> Event:
        return ToolCallOutcomeUnknown(
            envelope=self.env(c, intent, n), attempt=attempt, reason="timeout after dispatch"
        )

    def reconciled(self, c: Call, intent: str, n: int) -> Event:
        return ToolCallReconciled(
            envelope=self.env(c, intent, n),
            resolution=Resolution.SUCCEEDED,
            reconcile_attempt=1,
            result_json=canonical_json({"found": True}),
        )

    def replayed(self, c: Call, intent: str, n: int, original: str, attempts: int) -> Event:
        return ToolCallReplayed(
            envelope=self.env(c, intent, n),
            status=CallStatus.SUCCEEDED,
            attempts=attempts,
            original_intent_id=original,
            result_json=canonical_json({"id": f"msg-{c.key.idempotency_key}", "ok": True}),
        )

    def rejected(self, c: Call, intent: str, n: int) -> Event:
        return ToolCallRejected(
            envelope=self.env(c, intent, n),
            error=ErrorInfo.of(ErrorCode.VALIDATION_FAILED, "1 argument is invalid"),
            field_errors=[FieldError(loc="to", msg="not an address", type="value_error")],
        )

    def scenario(self, c: Call, kind: int, tag: str) -> list[Event]:
        """One call key's events; ``kind`` picks one of seven life stories."""
        i1, i2 = f"{tag}-i1", f"{tag}-i2"
        retry, retryable = FailureDisposition.RETRY, FailureDisposition.RETRYABLE
        match kind % 7:
            case 0:  # succeeded first time
                return [self.started(c, i1, 0, 1), self.succeeded(c, i1, 1, 1)]
            case 1:  # transient failure, retried inside the round
                return [
                    self.started(c, i1, 0, 1),
                    self.failed(c, i1, 1, 1, retry),
                    self.started(c, i1, 2, 2),
                    self.succeeded(c, i1, 3, 2),
                ]
            case 2:  # rejected before execution: an audit row, no call row
                return [self.rejected(c, i1, 0)]
            case 3:  # succeeded, then a same-key call is answered by a replay
                return [
                    self.started(c, i1, 0, 1),
                    self.succeeded(c, i1, 1, 1),
                    self.replayed(c, i2, 0, i1, 1),
                ]
            case 4:  # permanent failure
                return [
                    self.started(c, i1, 0, 1),
                    self.failed(c, i1, 1, 1, FailureDisposition.FINAL),
                ]
            case 5:  # outcome unknown, then reconciled
                return [
                    self.started(c, i1, 0, 1),
                    self.unknown(c, i1, 1, 1),
                    self.reconciled(c, i1, 2),
                ]
            case _:  # round over with a retryable failure; a new call runs a second round
                return [
                    self.started(c, i1, 0, 1),
                    self.failed(c, i1, 1, 1, retryable),
                    self.started(c, i2, 0, 2, rnd=2),
                    self.succeeded(c, i2, 1, 2),
                ]


def workload(
    calls: int, tag: str = "w", tenants: Sequence[str] = ("acme", "globex")
) -> list[Event]:
    """``calls`` call keys' events, interleaved (each key's events stay in order)."""
    history = History()
    stories = [
        history.scenario(
            Call.of(tenants[i % len(tenants)], "send_email", f"{tag}-k{i}", f"run-{i % 5}"),
            i,
            f"{tag}{i}",
        )
        for i in range(calls)
    ]
    out: list[Event] = []
    for step in range(max(len(s) for s in stories)):
        out.extend(s[step] for s in stories if step < len(s))
    return out


def positioned(
    events: Iterable[Event], partition: int = 0, start: int = 0
) -> list[tuple[Event, Position]]:
    return [(e, Position(partition, start + i)) for i, e in enumerate(events)]


def expected_calls(events: Iterable[Event]) -> list[dict[str, Any]]:
    """The ``tool_calls`` rows the fold of ``events`` gives (first occurrence of an id wins),
    :func:`normalised`."""
    first: dict[str, Event] = {}
    for event in events:
        first.setdefault(event.event_id, event)
    states: dict[str, CallState] = fold_all(first.values())
    durations = latest_durations({}, first.values())
    rows = (call_row(k, s) | {"duration_ms": durations.get(k)} for k, s in states.items())
    return normalised(sorted(rows, key=lambda r: r["call_id"]))


async def calls_of(projection: PostgresProjection) -> list[dict[str, Any]]:
    """The ``tool_calls`` rows as :func:`expected_calls` gives them."""
    return normalised(await postgres_reads.call_rows(projection))


# ------------------------------------------------------------------------------- fixtures


@pytest.fixture
async def dsn(postgres_dsn: str) -> AsyncIterator[str]:
    """A fresh, empty schema, selected by ``search_path`` in the returned DSN."""
    schema = f"tl_test_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        await conn.execute(f'CREATE SCHEMA "{schema}"'.encode())
    yield make_conninfo(postgres_dsn, options=f"-c search_path={schema}")
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE'.encode())


@pytest.fixture
async def projection(dsn: str) -> AsyncIterator[PostgresProjection]:
    await migrate(dsn)
    async with PostgresProjection(dsn) as p:
        yield p


@pytest.fixture
async def topics(kafka_bootstrap: str) -> AsyncIterator[Topics]:
    topics = Topics(prefix=f"tp{uuid.uuid4().hex[:10]}.", partitions=3)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await step("admin start", admin.start())
    try:
        await step(
            "create topics",
            admin.create_topics(
                [
                    NewTopic(topics.outcomes, topics.partitions, 1),
                    NewTopic(topics.dead_letters, topics.partitions, 1),
                ]
            ),
        )
        yield topics
        await step("delete topics", admin.delete_topics([topics.outcomes, topics.dead_letters]))
    finally:
        await admin.close()


async def step(what: str, awaitable: Awaitable[Any], limit_s: float = STEP_TIMEOUT_S) -> Any:
    try:
        return await asyncio.wait_for(awaitable, limit_s)
    except TimeoutError:
        pytest.fail(f"timed out after {limit_s:.0f} s: {what}", pytrace=False)


async def eventually(
    what: str, check: Callable[[], Awaitable[bool]], limit_s: float = STEP_TIMEOUT_S
) -> None:
    deadline = time.monotonic() + limit_s
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {limit_s:.0f} s: {what}", pytrace=False)
        await asyncio.sleep(0.05)


def normalised(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with their times as aware datetimes in UTC (SQLite keeps ISO text) and their JSON
    columns parsed (PostgreSQL's jsonb spells a document its own way)."""
    out = []
    for row in rows:
        row = dict(row)
        for name in ("created_at", "updated_at", "occurred_at"):
            value = row.get(name)
            if isinstance(value, str):
                value = datetime.fromisoformat(value)
            if isinstance(value, datetime):
                row[name] = value.astimezone(UTC)
        for name in ("result_json", "error_json", "state_json", "payload_json"):
            if isinstance(row.get(name), str):
                row[name] = json.loads(row[name])
        out.append(row)
    return out


# ----------------------------------------------------------------------------- migrations


async def test_migrate_twice_applies_nothing_the_second_time(dsn: str) -> None:
    versions = [m.version for m in load_migrations()]
    assert versions and versions[0] == "0001"
    assert await migrate(dsn) == versions
    assert await migrate(dsn) == []
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT version FROM schema_migrations ORDER BY version")
        assert [r[0] for r in await cur.fetchall()] == versions
        # the tables have exactly the columns the shared row builders fill
        for table, columns in (("tool_calls", CALL_COLUMNS), ("tool_call_events", EVENT_COLUMNS)):
            cur = await conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = %s",
                (table,),
            )
            assert {r[0] for r in await cur.fetchall()} - {"seq"} == {
                *columns,
                *ANALYTICS_COLUMNS,
            }


async def test_concurrent_migrations_apply_each_version_once(dsn: str) -> None:
    results = await asyncio.gather(*(migrate(dsn) for _ in range(4)))
    versions = [m.version for m in load_migrations()]
    assert sorted(v for r in results for v in r) == versions
    assert sorted(results, key=len)[:-1] == [[]] * 3


# ----------------------------------------------------------------------------- apply


async def test_apply_folds_a_realistic_history(projection: PostgresProjection) -> None:
    history = History()
    ok = Call.of("acme", "send_email", "k-ok")
    retried = Call.of("acme", "send_email", "k-retried")
    rejected = Call.of("acme", "send_email", "k-rejected")
    same_key_other_tenant = Call.of("globex", "send_email", "k-ok")
    events = [
        *history.scenario(ok, 3, "ok"),  # Started, Succeeded, Replayed
        *history.scenario(retried, 1, "re"),  # Started, Failed RETRY, Started, Succeeded
        *history.scenario(rejected, 2, "rj"),  # Rejected
        *history.scenario(same_key_other_tenant, 4, "gx"),  # Started, Failed FINAL
    ]
    batch = positioned(events)
    result = await projection.apply(batch, CONSUMER, TOPIC)
    assert (result.new_events, result.calls_changed) == (len(events), 3)

    rows = {r["call_key"]: r for r in await postgres_reads.call_rows(projection)}
    assert set(rows) == {str(ok.key), str(retried.key), str(same_key_other_tenant.key)}
    r_ok = rows[str(ok.key)]
    assert (r_ok["status"], r_ok["attempts"], r_ok["rounds"]) == ("SUCCEEDED", 1, 1)
    assert json.loads(r_ok["result_json"]) == json.loads(events[1].result_json)  # type: ignore[attr-defined]
    assert r_ok["last_event_id"] == "ok-i1/1"  # the replay changes nothing
    assert r_ok["error_json"] is None
    r_retried = rows[str(retried.key)]
    assert (r_retried["status"], r_retried["attempts"]) == ("SUCCEEDED", 2)
    assert r_retried["error_json"] is None
    r_gx = rows[str(same_key_other_tenant.key)]
    assert (r_gx["status"], r_gx["attempts"], r_gx["tenant_id"]) == ("FAILED_FINAL", 1, "globex")
    assert json.loads(r_gx["error_json"])["code"] == "DOWNSTREAM_TIMEOUT"
    assert r_gx["created_at"] == events[-2].envelope.occurred_at
    assert r_gx["updated_at"] == events[-1].envelope.occurred_at
    # the row reads back as the fold of the key's events (its state_json holds what the
    # columns do not)
    assert state_of_row(r_gx) == fold_all(events)[str(same_key_other_tenant.key)]

    audit = await postgres_reads.event_rows(projection)
    assert len(audit) == len(events)
    assert {r["event_type"] for r in audit} >= {"ToolCallRejected", "ToolCallReplayed"}
    assert await projection.positions(CONSUMER, TOPIC) == {0: len(events)}

    # the same batch again (a redelivery) changes nothing
    calls_before = await postgres_reads.call_rows(projection)
    again = await projection.apply(batch, CONSUMER, TOPIC)
    assert (again.new_events, again.calls_changed) == (0, 0)
    assert await postgres_reads.call_rows(projection) == calls_before
    assert await postgres_reads.event_rows(projection) == audit
    assert await projection.positions(CONSUMER, TOPIC) == {0: len(events)}


async def test_batches_split_anywhere_give_the_same_rows(projection: PostgresProjection) -> None:
    events = workload(40)
    batch = positioned(events)
    # overlapping, redelivered and duplicated chunks, in log order
    for lo, hi in ((0, 7), (3, 30), (30, 31), (10, 80), (80, len(batch)), (0, len(batch))):
        await projection.apply(batch[lo:hi] + batch[lo:hi], CONSUMER, TOPIC)
    assert await calls_of(projection) == expected_calls(events)
    assert len(await postgres_reads.event_rows(projection)) == len(events)


async def test_a_failing_batch_writes_nothing(projection: PostgresProjection) -> None:
    history = History()
    read = Call.of("acme", "lookup", "")  # a read-only call: its row's id names its intent
    first = [
        *history.scenario(Call.of("acme", "t", "a"), 0, "a"),
        history.succeeded(read, "r", 0, 1),
    ]
    await projection.apply(positioned(first), CONSUMER, TOPIC)
    calls, audit = (
        await postgres_reads.call_rows(projection),
        await postgres_reads.event_rows(projection),
    )
    dead = DeadLetterRecord(TOPIC, 0, 99, "bad bytes", None, b"\x00\x01")

    # A second outcome of the read-only intent "r" under a new event id: its audit row inserts
    # fine, its call row then violates the primary key (the read's call id is its intent's,
    # already stored) -- a failure after the inserts, inside the transaction.
    good = history.scenario(Call.of("acme", "t", "b"), 0, "b")
    forged = history.succeeded(read, "r", 1, 1)
    doomed = positioned([*good, forged], start=len(first))
    with pytest.raises(ProjectionError) as failure:
        await projection.apply(doomed, CONSUMER, TOPIC, dead_letters=[dead])
    assert not failure.value.retriable
    assert await postgres_reads.call_rows(projection) == calls
    assert await postgres_reads.event_rows(projection) == audit
    assert await postgres_reads.dead_letter_count(projection) == 0
    assert await projection.positions(CONSUMER, TOPIC) == {0: len(first)}

    # the good part alone goes through
    await projection.apply(doomed[:-1], CONSUMER, TOPIC, dead_letters=[dead])
    assert await projection.positions(CONSUMER, TOPIC) == {0: len(first) + len(good)}
    assert await postgres_reads.dead_letter_count(projection) == 1


async def test_postgres_rows_equal_sqlite_rows(projection: PostgresProjection) -> None:
    events = workload(70, tenants=("acme", "globex", "initech"))
    batch = positioned(events, partition=2, start=1000)
    for lo in range(0, len(batch), 37):
        await projection.apply(batch[lo : lo + 37], CONSUMER, TOPIC)

    lite = sqlite_with()
    lite.row_factory = sqlite3.Row
    for lo in range(0, len(batch), 37):
        sqlite_load(lite, batch[lo : lo + 37])
    lite_calls = [dict(r) for r in lite.execute("SELECT * FROM tool_calls ORDER BY call_id")]
    lite_events = [
        {k: r[k] for k in EVENT_COLUMNS}
        for r in lite.execute("SELECT * FROM tool_call_events ORDER BY event_id")
    ]

    pg_calls = normalised(await postgres_reads.call_rows(projection))
    assert len(pg_calls) == len(lite_calls) == 60  # 10 of the 70 stories are rejections
    for pg, sq in zip(pg_calls, normalised(lite_calls), strict=True):
        for column in CALL_COLUMNS:
            assert pg[column] == sq[column], (column, pg["call_key"])
    pg_rows = await postgres_reads.event_rows(projection)
    pg_events = normalised(pg_rows)
    assert len(pg_events) == len(events)
    for raw, pg, lite_row, sq in zip(
        pg_rows, pg_events, lite_events, normalised(lite_events), strict=True
    ):
        # the embedded file's audit position is its log's (seq), and its row reads the whole
        # event from the log: the same event as PostgreSQL's row holds
        for column in EVENT_COLUMNS:
            if column not in ("log_offset", "payload_json"):
                assert pg[column] == sq[column], (column, pg["event_id"])
        assert audit_payload(raw) == audit_payload(lite_row), pg["event_id"]
    # and both equal the fold of the log
    assert expected_calls(events) == pg_calls


async def test_dead_letters_are_recorded_once(projection: PostgresProjection) -> None:
    letters = [
        DeadLetterRecord(
            "x.intents",
            1,
            5,
            "undecodable record: bad marker",
            b'["acme","t","k"]',
            b"\xff" * 10,
            (("ce_id", b"e-1"), ("binary", b"\xff\x00")),
        ),
        DeadLetterRecord("x.outcomes", 0, 7, "undecodable outcome record", None, None),
    ]
    await projection.record_dead_letters(letters, CONSUMER, {("x.dead-letters", 1): 1})
    await projection.record_dead_letters(letters, CONSUMER, {("x.dead-letters", 1): 1})
    assert await postgres_reads.dead_letter_count(projection) == 2
    assert await postgres_reads.dead_letter_reasons(projection, "x.intents") == [letters[0].reason]
    rows = await postgres_reads.dead_letter_rows(projection)
    assert [bytes(r["payload"]) for r in rows] == [b"\xff" * 10, b""]
    assert [r["record_key"] for r in rows] == [b'["acme","t","k"]', None]
    assert [r["headers"] for r in rows] == [
        [{"name": "ce_id", "value": "e-1"}, {"name": "binary", "base64": "/wA="}],
        [],
    ]
    assert await projection.positions(CONSUMER, "x.dead-letters") == {1: 1}
    await projection.reset()
    assert await postgres_reads.dead_letter_count(projection) == 0
    assert await projection.positions(CONSUMER, "x.dead-letters") == {}


async def test_positions_never_move_back(projection: PostgresProjection) -> None:
    events = positioned(workload(3), partition=1, start=10)
    await projection.apply(events, CONSUMER, TOPIC, next_offsets={(TOPIC, 1): 50})
    assert await projection.positions(CONSUMER, TOPIC) == {1: 50}
    await projection.apply(events[:2], CONSUMER, TOPIC)
    assert await projection.positions(CONSUMER, TOPIC) == {1: 50}


async def test_unreachable_database_is_unavailable_and_retriable() -> None:
    with socket.socket() as sock:  # a local port with nothing listening on it
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    projection = PostgresProjection(f"postgresql://postgres@127.0.0.1:{port}/none", timeout=1.0)
    with pytest.raises(ProjectionUnavailable) as failure:
        await projection.open()
    assert failure.value.retriable
    with pytest.raises(ProjectionUnavailable):
        await projection.positions(CONSUMER, TOPIC)
    await projection.close()


# ------------------------------------------------------------------ Kafka -> PostgreSQL


class Outage:
    """A TCP proxy in front of PostgreSQL that can cut every connection and refuse new ones:
    the projection sees a real outage (broken sockets, failed connects), not a mock."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._up = True
        self._links: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def cut(self) -> None:
        self._up = False
        for writer in list(self._links):
            writer.transport.abort()
        self._links.clear()

    def restore(self) -> None:
        self._up = True

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._up:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._links |= {writer, up_writer}
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            self._links.discard(writer)
            writer.transport.abort()


async def produce(
    bootstrap: str,
    topics: Topics,
    chunks: Sequence[Sequence[Event]],
    *,
    abort: Sequence[Event] = (),
    garbage: Sequence[tuple[int, bytes]] = (),
    dead_letters: Sequence[tuple[int, int, str, bytes]] = (),
) -> None:
    """Each chunk in its own committed transaction, as the executor writes: key = call key,
    partition = murmur2 of it; ``abort`` in a transaction that is aborted; ``garbage`` =
    (partition, bytes) on the outcomes topic; ``dead_letters`` = (partition, intent offset,
    reason, value) on the dead-letters topic."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"test-{uuid.uuid4().hex}",
        enable_idempotence=True,
    )
    await step("producer start", producer.start())

    async def send_events(events: Sequence[Event]) -> None:
        for event in events:
            key = event.call_key.encode("utf-8")
            await producer.send(
                topics.outcomes,
                encode(event),
                key=key,
                partition=partition_for(key, topics.partitions),
                headers=[(INTENT_ID_HEADER, event.intent_id.encode("utf-8"))],
            )

    try:
        for chunk in chunks:
            async with producer.transaction():
                await send_events(chunk)
        if abort:
            await producer.begin_transaction()
            await send_events(abort)
            await producer.abort_transaction()
        async with producer.transaction():
            for partition, value in garbage:
                await producer.send(topics.outcomes, value, partition=partition)
            for partition, offset, reason, value in dead_letters:
                letter = DeadLetterRecord(topics.intents, partition, offset, reason, None, value)
                await producer.send(
                    topics.dead_letters,
                    value,
                    partition=partition,
                    headers=letter.kafka_headers(),
                )
    finally:
        await producer.stop()


def chunked(events: Sequence[Event], size: int) -> list[Sequence[Event]]:
    return [events[i : i + size] for i in range(0, len(events), size)]


async def caught_up(projector: KafkaProjector) -> None:
    await eventually("the projector catches up", projector.caught_up)


async def test_projector_follows_the_log_and_rebuild_equals_live(
    kafka_bootstrap: str, projection: PostgresProjection, topics: Topics
) -> None:
    first = workload(150, "a")
    # a zombie executor re-sending events already in the log: deduplicated by event_id
    zombie = [e for e in first[:60] if isinstance(e, ToolCallStarted)][:5]
    aborted = workload(5, "aborted")
    await produce(
        kafka_bootstrap,
        topics,
        [*chunked(first, 40), zombie],
        abort=aborted,
        garbage=[(1, b"\xc3\x01not avro"), (2, b"plain garbage")],
        dead_letters=[(0, 17, "undecodable record: bad marker", b"junk")],
    )

    async with KafkaProjector(kafka_bootstrap, topics, projection, batch_max=64) as projector:
        await caught_up(projector)
        assert await calls_of(projection) == expected_calls(first)
        audit = await postgres_reads.event_rows(projection)
        assert sorted(r["event_id"] for r in audit) == sorted({e.event_id for e in first})
        assert not any(r["event_id"].startswith("aborted") for r in audit)
        reasons = await postgres_reads.dead_letter_reasons(projection)
        assert len(reasons) == 3
        assert sum("fingerprint" in r or "marker" in r for r in reasons) == 3, reasons
        assert await postgres_reads.dead_letter_reasons(projection, topics.intents) == [
            "undecodable record: bad marker"
        ]

        # more events while it runs: continuing calls and new ones
        second = workload(60, "b")
        await produce(kafka_bootstrap, topics, chunked(second, 25))
        await caught_up(projector)
        assert await calls_of(projection) == expected_calls(first + second)

    live = (
        await postgres_reads.call_rows(projection),
        await postgres_reads.event_rows(projection),
        await postgres_reads.dead_letter_rows(projection),
        await projection.positions(topics.projector_group, topics.outcomes),
    )
    result = await rebuild(kafka_bootstrap, topics, projection, batch_max=100)
    assert result.events == len({e.event_id for e in first + second})
    rebuilt = (
        await postgres_reads.call_rows(projection),
        await postgres_reads.event_rows(projection),
        await postgres_reads.dead_letter_rows(projection),
        await projection.positions(topics.projector_group, topics.outcomes),
    )
    assert rebuilt == live
    assert live[3] == {
        p: offset for (t, p), offset in result.end_offsets.items() if t == topics.outcomes
    }


async def test_projector_killed_mid_way_resumes_without_gaps_or_duplicates(
    kafka_bootstrap: str, projection: PostgresProjection, topics: Topics
) -> None:
    events = workload(400, "k")
    await produce(kafka_bootstrap, topics, chunked(events, 50))
    logs: dict[int, list[Event]] = {}
    for event in events:
        partition = partition_for(event.call_key.encode("utf-8"), topics.partitions)
        logs.setdefault(partition, []).append(event)

    progress: list[int] = []
    for kill_after in (2, 5, 9):  # kill it several times, at different points
        projector = KafkaProjector(kafka_bootstrap, topics, projection, batch_max=23)
        await step("start", projector.start())
        await eventually("some batches applied", functools.partial(_applied, projector, kill_after))
        await projector.stop()  # cancels it wherever it is, maybe inside a transaction

        # what is there is exactly a prefix of each partition's log, and the stored position
        # is past it: nothing missing, nothing twice, rows and position from one transaction
        stored = await projection.positions(topics.projector_group, topics.outcomes)
        audit = await postgres_reads.event_rows(projection)
        applied = {r["event_id"]: r for r in audit}
        for partition, log in logs.items():
            done = [e.event_id for e in log if e.event_id in applied]
            assert done == [e.event_id for e in log[: len(done)]], f"gap in partition {partition}"
            if done:
                assert applied[done[-1]]["log_offset"] < stored[partition]
        assert await calls_of(projection) == expected_calls(
            e for e in events if e.event_id in applied
        )
        progress.append(len(applied))
    assert 0 < progress[0] < len(events), progress  # the first kill, at least, was mid-way

    async with KafkaProjector(kafka_bootstrap, topics, projection) as projector:
        await caught_up(projector)
    assert await calls_of(projection) == expected_calls(events)
    audit = await postgres_reads.event_rows(projection)
    assert len(audit) == len(events) == len({r["event_id"] for r in audit})


async def _applied(projector: KafkaProjector, batches: int) -> bool:
    return projector.batches >= batches


async def test_projector_rides_out_a_database_outage(
    kafka_bootstrap: str, dsn: str, topics: Topics
) -> None:
    await migrate(dsn)
    params = conninfo_to_dict(dsn)
    proxy = Outage(str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432))))
    await proxy.start()
    via_proxy = make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))
    events = workload(200, "o")
    try:
        async with PostgresProjection(via_proxy, timeout=1.0) as projection:
            projector = KafkaProjector(
                kafka_bootstrap, topics, projection, batch_max=30, backoff_max=0.5
            )
            async with projector:
                await produce(kafka_bootstrap, topics, chunked(events[:200], 50))
                await eventually("some batches applied", lambda: _applied(projector, 2))
                proxy.cut()
                await produce(kafka_bootstrap, topics, chunked(events[200:], 50))
                await eventually("an apply failed", lambda: _failed(projector))
                await asyncio.sleep(2)  # down for a while: several retries
                proxy.restore()
                await caught_up(projector)
                assert projector.unavailable >= 2
            assert await calls_of(projection) == expected_calls(events)
            assert len(await postgres_reads.event_rows(projection)) == len(events)
    finally:
        await proxy.close()


async def _failed(projector: KafkaProjector) -> bool:
    return projector.unavailable > 0


async def test_applied_among_answers_alike_on_both_read_sides(
    projection: PostgresProjection,
) -> None:
    """One lookup for many waiters (the front doors' read-your-writes): the applied events
    among those asked, the same on PostgreSQL and SQLite, over several lookups' worth."""
    events = workload(40, tenants=("acme", "globex"))
    half = len(events) // 2
    batch = positioned(events[:half], partition=1, start=0)
    await projection.apply(batch, CONSUMER, TOPIC)
    lite = sqlite_with(batch)

    applied = {event.event_id for event in events[:half]}
    later = [event.event_id for event in events[half:]]  # not applied yet
    unknown = [f"no-such-event-{i}" for i in range(search.APPLIED_AMONG_MAX + 7)]
    asked = [*unknown[:300], *applied, *later, *unknown[300:]]
    for reads in (PostgresCalls(projection), SqliteCalls(lite)):
        assert await reads.applied_among(asked) == applied, type(reads).__name__
        assert await reads.applied_among([]) == set()
        assert await reads.applied_among(later) == set()
