"""The HTTP API as real processes: ``toolledger serve`` on a free port, and in distributed mode
an executor and a projector next to it, so the tests speak real HTTP to a real server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.services import Services

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4
REDACTION_SECRET = "5e" * 32


@dataclass(frozen=True)
class Token:
    token: str
    tenant: str
    principal: str
    scopes: tuple[str, ...]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


ACME = Token(f"acme-{uuid.uuid4().hex}", "acme", "alice", ("tools:call",))
GLOBEX = Token(f"globex-{uuid.uuid4().hex}", "globex", "bob", ("tools:call",))
NO_SCOPE = Token(f"noscope-{uuid.uuid4().hex}", "acme", "mallory", ())
OPERATOR = Token(f"op-{uuid.uuid4().hex}", "acme", "olga", ("operator",))
# an operator who is also a caller: may not approve what it asked for itself
SELF_OP = Token(f"selfop-{uuid.uuid4().hex}", "acme", "sam", ("tools:call", "operator"))
PLATFORM_OP = Token(f"root-{uuid.uuid4().hex}", "platform", "root", ("operator", "operator:global"))
# what a background job reports its status with
JOB_REPORTER = Token(f"jobs-{uuid.uuid4().hex}", "acme", "export-worker", ("jobs:report",))
GLOBEX_REPORTER = Token(f"gjobs-{uuid.uuid4().hex}", "globex", "g-worker", ("jobs:report",))
# another user of alice's tenant: may not decide what alice's agent asked for
CAROL = Token(f"carol-{uuid.uuid4().hex}", "acme", "carol", ("tools:call",))
# alice's own credential (ACME is her agent's): confirms what her agent asked for
ALICE_CONFIRM = Token(f"alice-{uuid.uuid4().hex}", "acme", "alice", ("approvals:confirm",))
TOKENS = (
    ACME,
    GLOBEX,
    NO_SCOPE,
    OPERATOR,
    SELF_OP,
    PLATFORM_OP,
    JOB_REPORTER,
    GLOBEX_REPORTER,
    CAROL,
    ALICE_CONFIRM,
)


def write_tokens(path: Path) -> Path:
    entries = [
        {"token": t.token, "tenant": t.tenant, "principal": t.principal, "scopes": list(t.scopes)}
        for t in TOKENS
    ]
    path.write_text(json.dumps({"tokens": entries}))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def log(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    @property
    def spans_path(self) -> Path:
        """Where the process appends its finished spans (JSON lines)."""
        return self.log_path.with_suffix(".spans.jsonl")

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.popen.returncode}:\n{self.log()}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=20)


def spawn(
    name: str,
    args: list[str],
    workdir: Path,
    env: dict[str, str] | None = None,
    *,
    max_files: int | None = None,
) -> Process:
    """``toolledger ARGS`` with its output in ``workdir/NAME.log``; ``max_files``: its
    descriptor limit (RLIMIT_NOFILE)."""
    log_path = workdir / f"{name}.log"
    spans = {"TOOLLEDGER_SPANS_FILE": str(log_path.with_suffix(".spans.jsonl"))}
    command = [sys.executable, "-m", "toolledger.cli", "--log-level", "INFO", *args]
    with open(log_path, "wb") as log_file:
        popen = subprocess.Popen(
            command,
            cwd=ROOT,
            env=dict(os.environ, **spans, **(env or {})),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=None if max_files is None else _limit_files(max_files),
        )
    return Process(name, popen, log_path)


def _limit_files(count: int) -> Callable[[], None]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))

    return limit


def wait_for_file(process: Process, path: Path, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        process.check_alive()
        if time.monotonic() > deadline:
            raise AssertionError(f"{process.name} not ready in {timeout_s} s:\n{process.log()}")
        time.sleep(0.1)


@dataclass
class Server:
    """A running ``toolledger serve`` and where its tools leave their side effects."""

    backend: str
    base_url: str
    helpdesk_db: Path
    flaky_timeout_s: float
    processes: list[Process] = field(default_factory=list)
    ledger_db: Path | None = None  # embedded: the log, state and projections
    kafka: str | None = None  # distributed: where its topics are, and its database
    prefix: str | None = None
    dsn: str | None = None
    ready_path: str = "/readyz"  # ``toolledger mcp`` answers /healthz

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            for process in self.processes:
                process.check_alive()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}{self.ready_path}", timeout=2).status_code == 200:
                    return
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{p.log()}" for p in self.processes)
                raise AssertionError(f"server not ready in {timeout_s} s:\n{logs}")
            time.sleep(0.1)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log()}" for p in self.processes)

    def everything_logged(self) -> dict[str, bytes]:
        """Every log line and every exported span of every process, in full."""
        found: dict[str, bytes] = {}
        for p in self.processes:
            for path in (p.log_path, p.spans_path):
                if path.exists():
                    found[path.name] = path.read_bytes()
        return found

    # -- the downstream: every real side effect is a row ------------------------------------

    def _query(self, sql: str, params: tuple[str, ...]) -> int:
        if not self.helpdesk_db.exists():
            return 0
        conn = sqlite3.connect(self.helpdesk_db, timeout=30)
        try:
            row = conn.execute(sql, params).fetchone()
        except sqlite3.OperationalError as exc:  # not created yet: nothing happened
            if "no such table" in str(exc):
                return 0
            raise
        finally:
            conn.close()
        return int(row[0]) if row else 0

    def effects(self, tenant: str, tool: str, key: str) -> int:
        return self._query(
            "SELECT COUNT(*) FROM effects WHERE tenant_id = ? AND tool = ? AND idempotency_key = ?",
            (tenant, tool, key),
        )

    def effects_with_key(self, key: str) -> int:
        """Effects under ``key`` in any tenant and tool."""
        return self._query("SELECT COUNT(*) FROM effects WHERE idempotency_key = ?", (key,))


def start_embedded(workdir: Path, *extra: str) -> Server:
    """``toolledger serve`` (with ``extra`` options) on a new data directory."""
    workdir.mkdir(parents=True, exist_ok=True)
    tokens = write_tokens(workdir / "tokens.json")
    data = workdir / "data"
    port = free_port()
    server = Server("embedded", f"http://127.0.0.1:{port}", data / "helpdesk.db", 5.0)
    server.ledger_db = data / "ledger.db"
    args = ["serve", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--data", str(data), "--tokens", str(tokens), "--demo", *extra]
    server.processes.append(spawn("server", args, workdir))
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def start_distributed(
    workdir: Path,
    services: Services,
    *extra: str,
    front: str = "serve",
    prefix: str | None = None,
    executor_extra: tuple[str, ...] = (),
) -> Server:
    """Executor (with ``executor_extra`` options) + projector + front door (with ``extra``
    options) on fresh topics (or on the topics of ``prefix``, made beforehand) and a fresh
    database; ``front`` ``"mcp"``: ``toolledger mcp --transport http`` instead of ``serve``."""
    workdir.mkdir(parents=True, exist_ok=True)
    tokens = write_tokens(workdir / "tokens.json")
    dsn = asyncio.run(services.fresh_database())
    prefix = prefix or f"h{uuid.uuid4().hex[:10]}."
    common = ["--kafka", services.kafka, "--prefix", prefix, "--partitions", str(PARTITIONS)]
    port = free_port()
    server = Server("kafka", f"http://127.0.0.1:{port}", workdir / "helpdesk.db", 3.0)
    server.kafka, server.prefix, server.dsn = services.kafka, prefix, dsn
    try:
        executor_ready = workdir / "executor.ready"
        executor = [
            "executor",
            *common,
            "--demo",
            "--helpdesk-db",
            str(server.helpdesk_db),
            "--flaky-timeout-s",
            str(server.flaky_timeout_s),
            "--ready-file",
            str(executor_ready),
            *executor_extra,
        ]
        secret = {"TOOLLEDGER_REDACTION_SECRET": REDACTION_SECRET}
        server.processes.append(spawn("executor", executor, workdir, secret))
        projector_ready = workdir / "projector.ready"
        projector = ["projector", *common, "--postgres", dsn, "--ready-file", str(projector_ready)]
        server.processes.append(spawn("projector", projector, workdir))
        wait_for_file(server.processes[0], executor_ready)
        wait_for_file(server.processes[1], projector_ready)
        # the front door reads the demo tools' manifests (the executor runs them)
        args = ["serve"] if front == "serve" else ["mcp", "--transport", "http"]
        args += ["--host", "127.0.0.1", "--port", str(port), "--demo"]
        args += ["--data", str(workdir / "server"), "--tokens", str(tokens)]
        args += [*common, "--postgres", dsn, *extra]
        if front == "mcp":
            server.ready_path = "/healthz"
        server.processes.append(spawn("server", args, workdir))
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server
