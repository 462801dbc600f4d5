"""``toolledger serve --workers N``: N stateless front doors on one port (Kafka + PostgreSQL),
refused on the embedded backend (one process holds the ledger file)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from tests.http.helpers import is_replay, post_call
from tests.http.servers import (
    ACME,
    PARTITIONS,
    REDACTION_SECRET,
    Server,
    free_port,
    spawn,
    wait_for_file,
    write_tokens,
)
from tests.services import Services
from toolledger.cli import app

WORKERS = 2
RACERS = 40


@pytest.fixture
def two_workers(tmp_path: Path, services: Services) -> Iterator[Server]:
    """Executor + projector + ``serve --workers 2`` on fresh topics and a fresh database."""
    tokens = write_tokens(tmp_path / "tokens.json")
    dsn = asyncio.run(services.fresh_database())
    prefix = f"w{uuid.uuid4().hex[:10]}."
    common = ["--kafka", services.kafka, "--prefix", prefix, "--partitions", str(PARTITIONS)]
    port = free_port()
    server = Server("kafka", f"http://127.0.0.1:{port}", tmp_path / "helpdesk.db", 3.0)
    try:
        executor = ["executor", *common, "--demo", "--helpdesk-db", str(server.helpdesk_db)]
        executor += ["--ready-file", str(tmp_path / "executor.ready")]
        secret = {"TOOLLEDGER_REDACTION_SECRET": REDACTION_SECRET}
        server.processes.append(spawn("executor", executor, tmp_path, secret))
        projector = ["projector", *common, "--postgres", dsn]
        projector += ["--ready-file", str(tmp_path / "projector.ready")]
        server.processes.append(spawn("projector", projector, tmp_path))
        wait_for_file(server.processes[0], tmp_path / "executor.ready")
        wait_for_file(server.processes[1], tmp_path / "projector.ready")
        serve = ["serve", "--host", "127.0.0.1", "--port", str(port), "--workers", str(WORKERS)]
        serve += ["--data", str(tmp_path / "server"), "--tokens", str(tokens), "--demo"]
        serve += [*common, "--postgres", dsn]
        server.processes.append(spawn("server", serve, tmp_path))
        server.wait_ready()
        yield server
    finally:
        server.stop()


def worker_pids(server: Server, timeout_s: float = 60.0) -> set[int]:
    """The pids of the workers that said they listen (one JSON log line each), once there are
    as many as the server has workers (the first one ready made it ready)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = set()
        for line in server.processes[-1].log(tail=1_000_000).splitlines():
            if line.startswith("{") and '"msg": "listening"' in line:
                pids.add(int(json.loads(line)["pid"]))
        if len(pids) >= WORKERS or time.monotonic() > deadline:
            return pids
        time.sleep(0.2)


@pytest.mark.services
async def test_two_workers_share_the_port_and_a_key_executes_once(two_workers: Server) -> None:
    server = two_workers
    supervisor = server.processes[-1].popen.pid
    pids = worker_pids(server)
    assert len(pids) == WORKERS and supervisor not in pids, server.logs()
    key = f"workers-{uuid.uuid4().hex[:12]}"
    arguments = {"payload": "race", "fault": "slow", "delay_ms": 300}
    gate = asyncio.Event()
    # a client (connection) per racer: the kernel spreads the connections over both workers
    clients = [
        httpx.AsyncClient(base_url=server.base_url, headers=ACME.headers, timeout=90)
        for _ in range(RACERS)
    ]

    async def racer(client: httpx.AsyncClient) -> httpx.Response:
        await gate.wait()
        return await post_call(client, "flaky_write", arguments, key=key, wait=60)

    try:
        tasks = [asyncio.create_task(racer(c)) for c in clients]
        await asyncio.sleep(0.1)
        gate.set()
        responses = await asyncio.gather(*tasks)
        others = [
            await post_call(clients[n], "create_ticket", {"title": f"t{n}"}, key=f"{key}-{n}")
            for n in range(8)
        ]
    finally:
        for client in clients:
            await client.aclose()
    assert [r.status_code for r in responses] == [200] * RACERS, [
        (r.status_code, r.text) for r in responses if r.status_code != 200
    ]
    first = [r for r in responses if not is_replay(r)]
    assert len(first) == 1
    assert all(r.content == first[0].content for r in responses)
    assert server.effects("acme", "flaky_write", key) == 1
    assert [r.status_code for r in others] == [200] * len(others)
    assert not any(is_replay(r) for r in others)
    server.stop()
    assert server.processes[-1].popen.returncode == 0, server.logs()


def test_workers_on_the_embedded_backend_are_refused(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "tokens.json")
    args = ["serve", "--workers", "2", "--demo", "--data", str(tmp_path / "data")]
    result = CliRunner().invoke(app, [*args, "--tokens", str(tokens)])
    assert result.exit_code == 2, result.output
    message = re.sub(r"\s+", " ", result.output)
    assert "--workers needs the Kafka + PostgreSQL backend" in message
    assert "holds the ledger file's lock" in message
    assert not (tmp_path / "data" / "ledger.db").exists()
