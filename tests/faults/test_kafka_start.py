"""``toolledger executor`` and ``toolledger projector`` starting on a new Kafka cluster, as real
processes: each prints one ready line (its group, its partitions and their positions), and
the group coordinator the new cluster cannot name yet (it makes its offsets topic on the
first lookup, and aiokafka logs that at ERROR while it retries) is logged at INFO: no ERROR
line at all.

The cluster must be new for the coordinator to be missing, so this test starts a broker of
its own (``services/kafka/start.sh`` on free ports) beside the suite's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.faults.procs import ROOT, CliProcess, Cluster
from tests.http.servers import free_port
from tests.services import Services
from toolledger.schemas.topics import Topics

pytestmark = pytest.mark.services


@contextmanager
def new_broker() -> Iterator[str]:
    """A Kafka broker started for this test, with nothing in it yet: its bootstrap address."""
    port, controller = free_port(), free_port()
    env = {
        **os.environ,
        "TOOLLEDGER_KAFKA_PORT": str(port),
        "TOOLLEDGER_KAFKA_CONTROLLER_PORT": str(controller),
    }
    scripts = ROOT / "services" / "kafka"
    started = subprocess.run(
        ["bash", str(scripts / "start.sh")], env=env, capture_output=True, text=True, check=False
    )
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run(
            ["bash", str(scripts / "stop.sh")], env=env, capture_output=True, check=False
        )
        shutil.rmtree(ROOT / ".services" / "kafka" / str(port), ignore_errors=True)


def _records(started: CliProcess) -> tuple[list[str], list[dict[str, Any]]]:
    """The process's plain lines, and its JSON log records."""
    plain: list[str] = []
    records: list[dict[str, Any]] = []
    for line in started.log().splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
        else:
            plain.append(line)
    return plain, records


async def test_on_a_new_cluster_each_process_says_ready_once_and_logs_no_error(
    services: Services, tmp_path: Path
) -> None:
    topics = Topics(f"r{uuid.uuid4().hex[:10]}.", 2)
    with new_broker() as bootstrap:
        cluster = Cluster(Services(bootstrap, services.postgres), tmp_path, topics=topics)
        try:
            projector = cluster.spawn_projector(await services.fresh_database())
            executor = cluster.spawn()
            await projector.ready()
            await executor.ready()
        finally:
            cluster.stop_all()
    p = topics.prefix
    expected = [
        (
            executor,
            f"toolledger executor ready: group {p}executor, "
            f"{p}intents partitions 0@0 1@0 (partition@position)",
        ),
        (
            projector,
            f"toolledger projector ready: group {p}projector, {p}outcomes partitions 0@0 1@0, "
            f"{p}dead-letters partitions 0@0 1@0 (partition@position)",
        ),
    ]
    coordinator_missing: list[dict[str, Any]] = []
    for started, ready_line in expected:
        plain, records = _records(started)
        assert plain == [ready_line], started.log()[-3000:]
        errors = [r for r in records if r["level"] in ("error", "critical")]
        assert errors == [], errors
        coordinator_missing += [
            r
            for r in records
            if r["logger"] == "aiokafka.consumer.group_coordinator"
            and r["msg"].startswith("Group Coordinator Request failed")
        ]
        assert started.process.returncode == 0, started.log()[-3000:]  # SIGTERM: a clean stop
    # the first lookup of a new cluster finds no coordinator: it happened, and was INFO
    assert coordinator_missing, "the new cluster named a coordinator at once: nothing was shown"
    assert {r["level"] for r in coordinator_missing} == {"info"}, coordinator_missing
