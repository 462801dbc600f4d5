"""``toolledger topics`` on a real broker: each topic gets the config its role needs, on
topics that exist already too (a re-run changes a retention, it never re-creates)."""

from __future__ import annotations

import uuid

import pytest
from typer.testing import CliRunner

from tests.services import Services
from toolledger.cli import app

pytestmark = pytest.mark.services


def test_topics_sets_retention_and_compaction_and_can_change_them(services: Services) -> None:
    prefix = f"cfg{uuid.uuid4().hex[:8]}."
    common = ["topics", "--kafka", services.kafka, "--prefix", prefix, "--partitions", "2"]
    first = CliRunner().invoke(app, [*common, "--intents-retention", "1d"])
    assert first.exit_code == 0, first.output
    assert f"{prefix}intents: cleanup.policy=delete, retention.ms=86400000" in first.output
    assert f"{prefix}state: cleanup.policy=compact" in first.output
    assert f"{prefix}outcomes: cleanup.policy=delete, retention.ms=-1" in first.output
    # the groups' events carry their steps' literal arguments: the intents' retention
    assert f"{prefix}groups: cleanup.policy=delete, retention.ms=86400000" in first.output
    # a dead letter keeps the intent it holds, raw arguments included: the intents' retention
    assert f"{prefix}dead-letters: cleanup.policy=delete, retention.ms=86400000" in first.output
    again = CliRunner().invoke(
        app, [*common, "--intents-retention", "2h", "--outcomes-retention", "30d"]
    )
    assert again.exit_code == 0, again.output
    assert f"{prefix}intents: cleanup.policy=delete, retention.ms=7200000" in again.output
    assert f"{prefix}outcomes: cleanup.policy=delete, retention.ms=2592000000" in again.output
    assert f"{prefix}groups: cleanup.policy=delete, retention.ms=7200000" in again.output
    assert f"{prefix}dead-letters: cleanup.policy=delete, retention.ms=7200000" in again.output


def test_topics_refuses_intents_kept_forever_or_a_bad_duration(services: Services) -> None:
    common = ["topics", "--kafka", services.kafka, "--prefix", f"cfg{uuid.uuid4().hex[:8]}."]
    forever = CliRunner().invoke(app, [*common, "--intents-retention", "forever"])
    assert forever.exit_code == 2 and "raw arguments" in forever.output
    bad = CliRunner().invoke(app, [*common, "--outcomes-retention", "a while"])
    assert bad.exit_code == 2 and "a while" in bad.output


def test_topics_refuses_more_replicas_than_brokers_in_one_line(services: Services) -> None:
    """The single test broker cannot hold three replicas: the broker's reason in one line, no
    traceback (tests/faults/test_cluster_faults.py makes three replicas on three nodes)."""
    prefix = f"cfg{uuid.uuid4().hex[:8]}."
    common = ["topics", "--kafka", services.kafka, "--prefix", prefix]
    refused = CliRunner().invoke(app, [*common, "--replication-factor", "3"])
    assert refused.exit_code == 1, refused.output
    assert f"creating topic {prefix}intents failed with Kafka error 38" in refused.output
    assert "replication factor of 3" in refused.output and "Traceback" not in refused.output
    zero = CliRunner().invoke(app, [*common, "--replication-factor", "0"])
    assert zero.exit_code == 2 and "--replication-factor" in zero.output
