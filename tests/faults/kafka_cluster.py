"""The three-node Kafka cluster of ``services/kafka-cluster`` as the replicated fault tests see
it: start and stop it, kill -9, stop and start one node, find partition leaders and
transaction coordinators, and wait until every replica is back in sync."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from tests.faults.procs import ROOT

SCRIPTS = ROOT / "services" / "kafka-cluster"
NODES = (1, 2, 3)
REPLICAS = len(NODES)
COORDINATOR_TRANSACTION = 1  # FindCoordinator key type of a transactional id
INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")
ASK_WITHIN_S = 30.0
T = TypeVar("T")


class ClusterError(AssertionError):
    pass


def _run(*args: str, timeout_s: float = 300) -> str:
    done = subprocess.run(
        ["bash", *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        raise ClusterError(
            f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
        )
    return done.stdout


@dataclass
class KafkaCluster:
    bootstrap: str
    started_here: bool

    @classmethod
    def start(cls) -> KafkaCluster:
        """Start the cluster (or find it running: then :meth:`stop` leaves it running)."""
        output = _run(str(SCRIPTS / "start.sh"))
        lines = output.strip().splitlines()
        return cls(lines[-1], not any("already running" in line for line in lines))

    def stop(self) -> None:
        if self.started_here:
            _run(str(SCRIPTS / "stop.sh"))

    async def node(self, action: str, node: int) -> None:
        """``kill`` (SIGKILL), ``stop`` (controlled shutdown), ``start`` or ``restart``."""
        await asyncio.to_thread(_run, str(SCRIPTS / "node.sh"), action, str(node))

    def log(self, node: int, tail: int = 3000) -> str:
        """The end of node ``node``'s broker log (the state lives under the first port)."""
        base = self.bootstrap.split(",")[0].rpartition(":")[2]
        path = ROOT / ".services" / "kafka-cluster" / base / f"node-{node}" / "logs" / "kafka.out"
        return path.read_text(errors="replace")[-tail:]

    async def _ask(self, question: Callable[[AIOKafkaAdminClient], Awaitable[T]]) -> T:
        """``question`` with a new admin client, again while a node is down and the client
        still asks it (for up to ``ASK_WITHIN_S``)."""
        deadline = time.monotonic() + ASK_WITHIN_S
        while True:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5000)
            try:
                await admin.start()
                return await question(admin)
            except KafkaError:
                if time.monotonic() > deadline:
                    raise
            finally:
                await admin.close()
            await asyncio.sleep(0.5)

    async def describe(self, topics: Sequence[str]) -> list[dict[str, Any]]:
        return await self._ask(lambda admin: admin.describe_topics(list(topics)))

    async def leaders(self, topic: str) -> dict[int, int]:
        """The leader's node id of each partition of ``topic``."""
        (described,) = await self.describe([topic])
        return {p["partition"]: p["leader"] for p in described["partitions"]}

    async def wait_led_without(
        self, node: int, topics: Sequence[str], timeout_s: float = 60.0
    ) -> None:
        """Until no partition of ``topics`` is led by ``node`` (a killed node's leaderships move
        once the controller fenced it: ``broker.session.timeout.ms`` after its last heartbeat)."""
        deadline = time.monotonic() + timeout_s
        while True:
            led = {t: [n for n in (await self.leaders(t)).values() if n == node] for t in topics}
            if not any(led.values()):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"node {node} still leads after {timeout_s} s: {led}")
            await asyncio.sleep(0.25)

    async def transaction_coordinator(self, transactional_id: str) -> int:
        return int(
            await self._ask(
                lambda admin: admin.find_coordinator(transactional_id, COORDINATOR_TRANSACTION)
            )
        )

    async def delete(self, topics: Sequence[str]) -> None:
        await self._ask(lambda admin: admin.delete_topics(list(topics)))

    async def wait_in_sync(self, topics: Sequence[str], timeout_s: float = 120.0) -> None:
        """Until all three nodes run, are registered, and every partition of ``topics`` and of
        the internal topics (if made yet) has a leader and all three replicas in its ISR."""
        deadline = time.monotonic() + timeout_s
        names = [*topics, *INTERNAL_TOPICS]
        lagging: object = "not asked yet"
        while time.monotonic() < deadline:
            try:
                brokers = (await self._ask(lambda admin: admin.describe_cluster()))["brokers"]
                described = await self.describe(names)
            except KafkaError as exc:  # a node is still starting: ask again
                lagging = repr(exc)
            else:
                lagging = {
                    (t["topic"], p["partition"]): (p["leader"], sorted(p["isr"]))
                    for t in described
                    for p in t["partitions"]
                    if p["leader"] < 0 or len(p["isr"]) < REPLICAS or p["error_code"]
                }
                missing = {  # the internal topics exist once a group or transaction used them
                    t["topic"]
                    for t in described
                    if (t["error_code"] or not t["partitions"]) and t["topic"] in topics
                }
                if len(brokers) == REPLICAS and not lagging and not missing:
                    return
                lagging = {"brokers": len(brokers), "missing": missing, "partitions": lagging}
            await asyncio.sleep(0.5)
        raise ClusterError(f"the cluster is not in sync after {timeout_s} s: {lagging}")

    async def heal(self, topics: Sequence[str]) -> None:
        """Start every node that is down, then :meth:`wait_in_sync`."""
        for node in NODES:
            try:
                await self.node("start", node)
            except ClusterError as exc:
                if "already runs" not in str(exc):
                    raise
        await self.wait_in_sync(topics)
