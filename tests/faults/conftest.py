from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest

from tests.faults.kafka_cluster import KafkaCluster
from tests.faults.procs import Cluster
from tests.services import Services
from toolledger.kafka_admin import ensure_topics
from toolledger.producers.client import LedgerClient
from toolledger.producers.kafka import KafkaTransport


@pytest.fixture
def cluster(services: Services, tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(services, tmp_path)
    try:
        yield cluster
    finally:
        cluster.stop_all()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed fault test (a timeout too) shows the end of each process's log: what the
    executor or projector was doing is the first thing needed to tell why."""
    report = yield
    running = getattr(item, "funcargs", {}).get("cluster")
    if report.when == "call" and report.failed and isinstance(running, Cluster):
        for started in running.processes:
            tail = started.log()[-6000:] if started.log_path.exists() else "(no log)"
            report.sections.append((f"{started.what} {started.log_path.name}", tail))
    return report


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[LedgerClient]:
    await ensure_topics(cluster.services.kafka, cluster.topics)
    transport = KafkaTransport(cluster.services.kafka, cluster.topics)
    await transport.start()
    try:
        yield LedgerClient(transport, default_wait_s=30)
    finally:
        await transport.stop()


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[KafkaCluster]:
    """The three-node cluster of services/kafka-cluster, started for the session's replicated
    fault tests and stopped after them (with-services.sh also stops it if pytest dies)."""
    cluster = KafkaCluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
