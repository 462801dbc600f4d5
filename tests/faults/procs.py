"""Executors and projectors as real processes, so the fault tests can SIGKILL, SIGSTOP and
SIGCONT them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.services import Services
from toolledger.processors.toolsets.helpdesk import HelpdeskStore
from toolledger.producers.client import CallResult, LedgerClient, TrustedContext
from toolledger.schemas.codec import decode
from toolledger.schemas.events import Event
from toolledger.schemas.status import CallStatus
from toolledger.schemas.topics import Topics

SESSION_TIMEOUT_MS = 6000  # the broker's minimum: takeovers in these tests take about this long
ROOT = Path(__file__).resolve().parents[2]
AGENT = TrustedContext("acme", "fault-agent")


@dataclass
class CliProcess:
    """A ``toolledger`` command (``what``: executor or projector) running in its own process,
    its stdout and stderr in ``log_path``."""

    what: str
    process: subprocess.Popen[bytes]
    log_path: Path
    ready_file: Path

    async def ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ready_file.exists():
            if self.process.poll() is not None:
                raise AssertionError(f"{self.what} exited early:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.what} not ready in {timeout_s} s:\n{self.log()[-3000:]}"
                )
            await asyncio.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: signal.Signals) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Cluster:
    """A topic layout, a shared downstream store and the executor (and projector) processes
    running on it."""

    services: Services
    workdir: Path
    topics: Topics = field(default_factory=lambda: Topics(f"f{uuid.uuid4().hex[:10]}.", 4))
    timeout_s: float = 3.0
    flaky_timeout_s: float = 3.0
    processes: list[CliProcess] = field(default_factory=list)

    @property
    def helpdesk_db(self) -> Path:
        return self.workdir / "helpdesk.db"

    def store(self) -> HelpdeskStore:
        return HelpdeskStore(self.helpdesk_db)

    def spawn(self) -> CliProcess:
        """An executor."""
        return self._start(
            "executor",
            "--demo",
            "--helpdesk-db",
            str(self.helpdesk_db),
            "--timeout-s",
            str(self.timeout_s),
            "--flaky-timeout-s",
            str(self.flaky_timeout_s),
            "--session-timeout-ms",
            str(SESSION_TIMEOUT_MS),
        )

    def spawn_projector(self, postgres: str, *options: str) -> CliProcess:
        """A projector into the database ``postgres``, with more ``options``."""
        return self._start("projector", "--postgres", postgres, *options)

    def _start(self, what: str, *options: str) -> CliProcess:
        n = len(self.processes)
        ready = self.workdir / f"{what}-{n}.ready"
        log_path = self.workdir / f"{what}-{n}.log"
        env = dict(os.environ, TOOLLEDGER_REDACTION_SECRET="00" * 32)
        command = [
            sys.executable,
            "-m",
            "toolledger.cli",
            "--log-level",
            "INFO",
            what,
            "--kafka",
            self.services.kafka,
            "--prefix",
            self.topics.prefix,
            "--partitions",
            str(self.topics.partitions),
            "--ready-file",
            str(ready),
            *options,
        ]
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT
            )
        started = CliProcess(what, process, log_path, ready)
        self.processes.append(started)
        return started

    def stop_all(self) -> None:
        for started in self.processes:
            started.terminate()


async def settle(
    client: LedgerClient,
    tool: str,
    key: str,
    arguments: dict[str, object],
    result: CallResult,
    *,
    rounds: int = 10,
    approval_token: str | None = None,
) -> CallResult:
    """Retry with the same key until the outcome is final: how a real agent resolves UNKNOWN."""
    for _ in range(rounds):
        if result.status in (CallStatus.SUCCEEDED, CallStatus.FAILED_FINAL):
            return result
        await asyncio.sleep(0.2)
        result = await client.call(
            tool,
            arguments,
            idempotency_key=key,
            context=AGENT,
            wait=30,
            approval_token=approval_token,
        )
    return result


def outcome_types(events: list[dict[str, object]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for event in events:
        counts[str(event["type"])] = counts.get(str(event["type"]), 0) + 1
    return counts


def dump(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=1, default=str))


async def read_outcomes(bootstrap: str, topics: Topics) -> list[Event]:
    """Every committed outcome event, partition by partition, up to the last stable offset."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        partitions = [TopicPartition(topics.outcomes, p) for p in range(topics.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        events: list[Event] = []
        for tp in partitions:
            while await consumer.position(tp) < ends[tp]:
                for records in (await consumer.getmany(tp, timeout_ms=500)).values():
                    events.extend(decode(r.value or b"") for r in records)
        return events
    finally:
        await consumer.stop()
