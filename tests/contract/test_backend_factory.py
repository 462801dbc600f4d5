"""Each backend's factory (:mod:`toolledger.backends`) builds, from one
:class:`~toolledger.settings.LedgerSettings`, everything a front door needs, with the same
behaviour: the ledger client (a call runs once, its key replays), the read side that finds
the call, the raw arguments an approver is shown, the call groups, readiness, and the
settings' key retention applied to the tools. A backend the settings name by import name is
one module with a ``Factory``, as the one at the end of this file."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.contract.embedded import EmbeddedHarness
from tests.contract.harness import ACME, Harness, eventually
from tests.contract.kafka import KafkaHarness
from tests.services import Services
from toolledger.backends import BackendParts, backend_factory
from toolledger.backends.embedded import Factory as EmbeddedFactory
from toolledger.config import ConfigError
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.settings import LedgerSettings

CHAIN = {
    "run_id": "run-factory",
    "on_failure": "compensate",
    "steps": [
        {"id": "open", "tool": "create_ticket", "arguments": {"title": "Onboard"}},
        {
            "id": "close",
            "tool": "close_ticket",
            "arguments": {"ticket_id": {"$from": "open", "path": "ticket_id"}},
            "depends_on": ["open"],
        },
    ],
}
CHARGE = {"customer_id": "cus_factory_7", "amount_cents": 5000, "currency": "EUR"}


@contextlib.asynccontextmanager
async def opened(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[BackendParts, ToolRegistry]]:
    """The backend opened through its factory, with an executor answering its calls: in
    the same process (embedded), or the contract suite's Kafka executor on the same topics
    (its projector filling the database the factory reads)."""
    tools: Harness
    harness: KafkaHarness | None = None
    if backend == "embedded":
        tools = EmbeddedHarness(tmp_path)  # for its registry and downstream store only
        settings = LedgerSettings(path=tmp_path / "ledger.db", create=True, key_retention="2h")
    else:
        services: Services = request.getfixturevalue("services")
        harness = tools = KafkaHarness(tmp_path, services)
        await harness.start()
        settings = LedgerSettings(
            backend="kafka",
            kafka=services.kafka,
            postgres=harness.dsn,
            prefix=harness.topics.prefix,
            partitions=harness.topics.partitions,
            key_retention="2h",
        )
    try:
        async with backend_factory(settings).open(tools.registry) as parts:
            yield parts, tools.registry
    finally:
        if harness is not None:
            await harness.close()
        tools.store.close()


@pytest.mark.parametrize("backend", ["embedded", pytest.param("kafka", marks=pytest.mark.services)])
async def test_a_factory_builds_what_a_front_door_needs(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async with opened(backend, tmp_path, request) as (parts, registry):
        # the settings' key retention, applied to the tools (on Kafka: recorded, agreed)
        assert registry.default_key_retention == timedelta(hours=2)

        async def ready() -> bool:
            return all((await parts.ready()).values())

        await eventually(ready, timeout_s=30)
        key = f"factory-{uuid.uuid4().hex[:8]}"
        first = await parts.client.call(
            "create_ticket", {"title": "factory"}, idempotency_key=key, context=ACME, wait=30
        )
        again = await parts.client.call(
            "create_ticket", {"title": "factory"}, idempotency_key=key, context=ACME, wait=30
        )
        assert first.ok and not first.replayed and again.replayed
        assert again.result == first.result
        assert parts.queries is not None
        queries = parts.queries

        async def found() -> bool:
            view = await queries.get(ACME.tenant_id, first.call_id)
            return view is not None and view.status == "SUCCEEDED"

        await eventually(found, timeout_s=30)
        # an approval request's raw arguments are read back where the backend keeps them
        asked = await parts.client.call(
            "charge_card", CHARGE, idempotency_key=f"{key}-charge", context=ACME, wait=30
        )
        assert asked.error is not None and asked.error.code == "APPROVAL_REQUIRED"
        assert asked.event is not None
        shown: list[str] = []

        async def arguments() -> bool:
            assert asked.event is not None
            shown[:] = await parts.intents.arguments(
                asked.event.envelope.call_key, datetime.now(UTC)
            )
            return bool(shown)

        await eventually(arguments, timeout_s=30)
        assert json.loads(shown[0])["customer_id"] == CHARGE["customer_id"]
        # the call groups
        assert parts.groups is not None
        group = await parts.groups.submit(
            tenant_id=ACME.tenant_id,
            principal=ACME.principal,
            scopes=["tools:call"],
            group_key=f"{key}-group",
            body=CHAIN,
            wait_s=30,
        )
        assert group.error is None and group.view is not None, group
        assert group.view.status == "SUCCEEDED"
        assert parts.prune is not None


def test_the_settings_choose_the_factory_by_name_or_by_module() -> None:
    embedded = backend_factory(LedgerSettings())
    assert isinstance(embedded, EmbeddedFactory)
    custom = backend_factory(LedgerSettings(backend=__name__))
    assert type(custom) is Factory and custom.settings.backend == __name__
    with pytest.raises(ConfigError, match="no backend 'nosuch'"):
        backend_factory(LedgerSettings(backend="nosuch"))
    with pytest.raises(ConfigError, match="has no Factory"):
        backend_factory(LedgerSettings(backend="json"))


def test_bad_settings_are_one_line() -> None:
    with pytest.raises(ConfigError) as refused:
        LedgerSettings.of(key_retention="a while", partitions=0)
    text = str(refused.value)
    assert "\n" not in text and "key_retention: key retention 'a while'" in text
    assert "partitions: Input should be greater than or equal to 1" in text
    with pytest.raises(ConfigError, match="extra_option: Extra inputs are not permitted"):
        LedgerSettings.of(extra_option=1)
    kept: dict[str, Any] = {"intents_retention": "forever", "audit_retention": "30d"}
    settings = LedgerSettings.of(**kept)
    assert settings.intents_retention is None
    assert settings.audit_retention == timedelta(days=30)


class Factory(EmbeddedFactory):
    """Another backend, bound by naming this module in ``LedgerSettings.backend``."""
