"""``Ledger.run_group`` on the embedded ledger, on Kafka (groups' log in PostgreSQL) and
through the HTTP transport: the same group
answers the same, each step runs once, a failure compensates, a replay runs nothing."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tests.over_http import over_http
from tests.services import Services
from toolledger import Compensation, Ledger, Registry, ToolContext, ToolError, TrustedContext
from toolledger.embedded import EmbeddedLedger
from toolledger.schemas.topics import Topics
from toolledger.settings import LedgerSettings

ALICE = TrustedContext("acme", "alice")


class Booking(BaseModel):
    item: str


class Booked(BaseModel):
    booking_id: str


class Cancel(BaseModel):
    booking_id: str


def _registry(effects: list[str]) -> Registry:
    registry = Registry()

    def cancel_args(_arguments: Mapping[str, Any], result: Any) -> dict[str, Any]:
        return {"booking_id": result["booking_id"]}

    @registry.mutation(compensate=Compensation("cancel", cancel_args))
    async def book(args: Booking, ctx: ToolContext) -> Booked:
        """Book an item. Use when: a trip needs it."""
        if args.item == "sold-out":
            raise ToolError("SOLD_OUT", "Nothing left.", retryable=False)
        effects.append(f"book {args.item}")
        return Booked(booking_id=f"b-{args.item}")

    @registry.mutation()
    async def cancel(args: Cancel) -> Cancel:
        """Cancel a booking. Use when: a trip is called off."""
        effects.append(f"cancel {args.booking_id}")
        return args

    return registry


STEPS = [
    {"id": "flight", "tool": "book", "arguments": {"item": "flight"}},
    {"id": "hotel", "tool": "book", "arguments": {"item": "hotel"}, "depends_on": ["flight"]},
    {"id": "car", "tool": "book", "arguments": {"item": "sold-out"}, "depends_on": ["hotel"]},
]


@contextlib.asynccontextmanager
async def on_kafka(
    registry: Registry, services: Services, topics: Topics | None = None, dsn: str | None = None
) -> AsyncIterator[Ledger]:
    """``Ledger.kafka`` with ``postgres=``: the groups' log in PostgreSQL, the steps executed
    by a Kafka executor (in this process, with the same tools)."""
    from toolledger.kafka_admin import ensure_topics
    from toolledger.processors.pipeline import Stages
    from toolledger.processors.runtime.kafka import KafkaExecutor
    from toolledger.processors.tools.redaction import Redactor

    topics = topics or Topics(f"g{uuid.uuid4().hex[:10]}.", 4)
    prefix = topics.prefix
    await ensure_topics(services.kafka, topics)
    dsn = dsn or await services.fresh_database()
    executor = KafkaExecutor(
        services.kafka, topics, Stages(registry, Redactor(b"k" * 32)),
        session_timeout_ms=15000, sweep_interval_s=0.1,
    )  # fmt: skip
    await executor.start()
    try:
        await executor.assigned.wait()
        ledger = Ledger.kafka(
            services.kafka,
            registry,
            prefix=prefix,
            partitions=topics.partitions,
            postgres=dsn,
            context=ALICE,
        )
        async with ledger:
            yield ledger
    finally:
        await executor.stop()


@pytest.fixture(params=["embedded", "http", pytest.param("kafka", marks=pytest.mark.services)])
async def run(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    effects: list[str] = []
    registry = _registry(effects)
    if request.param == "kafka":
        services: Services = request.getfixturevalue("services")
        async with on_kafka(registry, services) as ledger:
            yield ledger, effects
        return
    if request.param == "embedded":
        async with Ledger.embedded(tmp_path / "l.db", registry, context=ALICE) as ledger:
            yield ledger, effects
        return
    async with EmbeddedLedger(
        LedgerSettings(path=tmp_path / "l.db", create=True), registry
    ) as embedded:
        door = over_http(embedded, lambda: registry)
        try:
            yield door.http_ledger(ALICE), effects
        finally:
            await door.close()


async def test_a_failed_group_compensates_once_and_its_replay_runs_nothing(run: Any) -> None:
    ledger, effects = run
    first = await ledger.run_group(STEPS, idempotency_key="trip-1", run_id="r-1", wait=20)
    assert first.error is None and first.view is not None, first
    assert first.view.status == "COMPENSATED"
    steps = {s.id: s for s in first.view.steps}
    assert (
        steps["car"].status == "FAILED_FINAL" and steps["car"].error.code == "DOWNSTREAM_SOLD_OUT"
    )
    assert effects == ["book flight", "book hotel", "cancel b-hotel", "cancel b-flight"]
    again = await ledger.run_group(STEPS, idempotency_key="trip-1", run_id="r-1", wait=20)
    assert again.replayed and again.view.status == "COMPENSATED"
    assert len(effects) == 4
    other = await ledger.run_group(STEPS[:1], idempotency_key="trip-1", run_id="r-1")
    assert other.error is not None and other.error.code == "IDEMPOTENCY_KEY_REUSED"


async def test_an_invalid_group_is_refused_with_field_errors(run: Any) -> None:
    ledger, effects = run
    cycle = [
        {"id": "a", "tool": "book", "arguments": {"item": "x"}, "depends_on": ["b"]},
        {"id": "b", "tool": "book", "arguments": {"item": "y"}, "depends_on": ["a"]},
    ]
    refused = await ledger.run_group(cycle, idempotency_key="trip-2", run_id="r-2")
    assert refused.error is not None and refused.error.code == "VALIDATION_FAILED"
    assert refused.field_errors and effects == []
