"""Throughput and latency of the HTTP API (``toolledger serve``, embedded backend), against a bare
FastAPI app doing the same JSON work without a ledger.

Run::

    .venv/bin/python -m bench.http [--requests N] [--concurrency C] [--out bench/results/http.json]
    .venv/bin/python -m bench.http --profile   # also: the server under cProfile, top 20
    .venv/bin/python -m bench.http --client httpx   # httpx instead of the raw load generator

``--profile`` runs both ledger phases once more (``--profile-requests`` each, default 4096) on a
server whose event loop is profiled from the start to the end of each measured phase only (see
:func:`profiled_server`), and prints its own time by layer, the top 20 functions by own time
and the top 20 toolledger functions by cumulative time.

Both servers are real processes on a free loopback port, started the way an operator starts
them: ``python -m toolledger.cli serve --tools bench.http:noop_registry --data <tmp>`` (a
no-op mutation tool, the one of ``bench/embedded.py``) and ``python -m uvicorn
bench.http:bare_app --factory`` with the settings ``toolledger serve`` gives uvicorn (no access
log, no lifespan). The load generator is this process: C workers in a closed loop (a worker
sends its next request as soon as its previous one is answered), each with its own keep-alive
HTTP/1.1 connection: by default raw asyncio streams with pre-encoded requests
(:class:`RawConnection`, ~0.1 ms of CPU per request), with ``--client httpx`` one
``httpx.AsyncClient`` (pool of one) per worker, which costs the load generator ~1 ms of CPU per
request, twice what the bare server spends, so the bare baseline then measures the client. (One
``httpx.AsyncClient`` with a shared pool of C connections is worse still, ~8 ms per request:
httpcore's pool scans all connections and queued requests on every assignment.) Every phase is
preceded by an untimed warm-up.

``calls_per_s``, ``p50_ms``, ``p99_ms``
    ``POST /v1/tools/bench_noop/calls`` with N distinct ``Idempotency-Key`` values (first
    executions). Requests per wall-clock second; latency of each request from send to the end
    of its response body. Checked: every answer is 200, has no ``Idempotent-Replayed`` header,
    and is the SUCCEEDED call of its key.
``replays_per_s``
    The same N requests again (same keys, same arguments). Checked: every answer is 200 with
    ``Idempotent-Replayed: true`` and a body byte-identical to the first answer of its key
    (every body is compared, not a sample). After the server has stopped, the ledger file is
    read back: exactly one ``ToolCallSucceeded`` per key (the handler ran once per key) and one
    ``ToolCallReplayed`` per replay.
``bare_per_s``
    The same N first-execution requests against the bare app: one POST route with the same
    signature that reads the body, validates it with a model configured like ``CallBody``,
    authenticates the Bearer token with the library's ``TokenStore``, checks the
    ``Idempotency-Key`` with the library's header parser and serialises a ``CallView``-shaped
    pydantic model of about the same size. No ledger, no SQLite.
``ratio_calls_vs_bare``
    ``calls_per_s / bare_per_s``.

The machine's cores are shared: the load generator runs beside the server and takes CPU from
it, and so does anything else running on the machine. ``meta.phases`` gives, per phase, the CPU
seconds of the server process, of the load generator and of every other process divided by the
phase's wall time (1.0 = one core busy the whole time), and the server's CPU milliseconds per
request (the least noisy number when the machine is busy).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import hashlib
import importlib.metadata
import io
import json
import os
import platform
import pstats
import re
import runpy
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter as Tally
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Annotated, Any, Protocol

import httpx
from fastapi import FastAPI, Header, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console, JustifyMethod
from rich.progress import (
    Progress,
    TaskID,
)
from rich.table import Table

from bench.common import (
    TOOL,
    Counter,
    cpu_seconds,
    machine_busy_seconds,
    make_registry,
    new_progress,
    write_result,
)
from toolledger import serving
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.producers.http.auth import TokenEntry, TokenStore
from toolledger.producers.http.headers import idempotency_key
from toolledger.schemas.events import ToolCallReplayed, ToolCallStarted, ToolCallSucceeded
from toolledger.schemas.keys import CallKey, InvalidIdempotencyKey

ROOT = Path(__file__).resolve().parent.parent
TOKEN_ENV = "BENCH_HTTP_TOKEN"
# One token per run (the servers get it from the environment): an answer with our token is an
# answer from our server, not from another process that took the port first.
TOKEN = os.environ.get(TOKEN_ENV) or f"bench-http-{secrets.token_hex(16)}"
RETRIES = 3  # attempts per request when the connection fails (same key: a safe retry)
TENANT = "acme"
PRINCIPAL = "bench"
PATH = f"/v1/tools/{TOOL}/calls"
JSON = "application/json"
CORES_NOTE = (
    "The load generator (one asyncio process, C workers) runs on the same machine as the "
    "server and competes with it for the {cores} cores, as does every other process; both "
    "servers are single uvicorn processes (one event loop: at most one core). meta.phases.* "
    "gives the CPU of the server, the load generator and all other processes per wall second."
)


# -- what the servers import ------------------------------------------------------------------


def noop_registry() -> ToolRegistry:
    """``toolledger serve --tools bench.http:noop_registry``: the no-op mutation tool."""
    return make_registry(Counter())


class BareBody(BaseModel):
    """Configured like ``producers.http.app.CallBody``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    arguments: dict[str, Any]
    run_id: Annotated[str, Field(min_length=1, max_length=255)] | None = None
    step_id: Annotated[str, Field(min_length=1, max_length=255)] | None = None
    approval_token: Annotated[str, Field(min_length=1, max_length=4096)] | None = None


class BareView(BaseModel):
    """The rendered fields of ``schemas.calls.CallView`` (same names, same types)."""

    model_config = ConfigDict(frozen=True)
    call_id: str
    tenant_id: str
    tool: str
    tool_version: str
    idempotency_key: str
    args_digest: str
    status: str
    ok: bool
    result: Any = None
    error: dict[str, Any] | None = None
    attempts: int
    run_id: str | None = None
    step_id: str | None = None
    created_at: datetime
    updated_at: datetime


def bare_app() -> FastAPI:
    """``uvicorn bench.http:bare_app --factory``: the same JSON work, no ledger."""
    app = FastAPI(title="bare")
    tokens = TokenStore([TokenEntry(token=TOKEN, tenant=TENANT, principal=PRINCIPAL)])

    def problem(status: int, detail: str) -> Response:
        return Response(
            json.dumps({"status": status, "detail": detail}).encode(),
            status_code=status,
            media_type="application/problem+json",
        )

    @app.post("/v1/tools/{tool}/calls")
    async def call_tool(
        tool: str,
        request: Request,
        idempotency_key_header: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
        prefer: Annotated[str | None, Header()] = None,
    ) -> Response:
        context = tokens.authenticate(request.headers.get("authorization"))
        if context is None:
            return problem(401, "Send 'Authorization: Bearer <token>'.")
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != JSON:
            return problem(400, "Send the body as application/json.")
        try:
            body = BareBody.model_validate_json(await request.body())
        except ValueError as exc:
            return problem(400, f"The body is not a valid call: {exc}"[:2000])
        try:
            key = idempotency_key(request.headers.getlist("idempotency-key"))
        except InvalidIdempotencyKey as exc:
            return problem(400, str(exc))
        if key is None:
            return problem(400, "Send an Idempotency-Key header.")
        arguments = json.dumps(body.arguments, separators=(",", ":"), sort_keys=True)
        now = datetime.now(UTC)
        view = BareView(
            call_id=CallKey(context.tenant_id, tool, key).call_id,
            tenant_id=context.tenant_id,
            tool=tool,
            tool_version="1",
            idempotency_key=key,
            args_digest="sha256:" + hashlib.sha256(arguments.encode()).hexdigest(),
            status="SUCCEEDED",
            ok=True,
            result={"ok": True},
            attempts=1,
            run_id=body.run_id,
            step_id=body.step_id,
            created_at=now,
            updated_at=now,
        )
        return Response(view.model_dump_json().encode(), media_type=JSON)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/tools")
    async def list_tools(request: Request) -> Response:
        if tokens.authenticate(request.headers.get("authorization")) is None:
            return problem(401, "Send 'Authorization: Bearer <token>'.")
        return Response(json.dumps({"items": [{"name": TOOL}]}).encode(), media_type=JSON)

    return app


# -- servers ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def exists(path: Path) -> bool:
    return path.exists()


def open_log(path: Path) -> IO[bytes]:
    return path.open("wb")


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class Server:
    name: str
    port: int
    process: asyncio.subprocess.Process
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid


@contextlib.asynccontextmanager
async def running(name: str, argv: Sequence[str], port: int, log: Path) -> AsyncIterator[Server]:
    """Start ``argv`` (a server on ``port``), wait for ``/healthz``; SIGINT and wait at the end."""
    env = dict(os.environ)
    env[TOKEN_ENV] = TOKEN
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    handle = open_log(log)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=ROOT,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=handle,
            stderr=asyncio.subprocess.STDOUT,
        )
    finally:
        handle.close()  # the child has its own descriptor
    server = Server(name, port, process, log)
    failed = False
    try:
        await wait_healthy(server, timeout_s=60.0)
        yield server
    except BaseException:
        failed = True
        raise
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(process.wait(), 60.0)
            except TimeoutError:
                process.kill()
                await process.wait()
        if failed:
            sys.stderr.write(
                f"{name} (exit {process.returncode}), last lines of its log:\n{log_tail(log)}\n"
            )


async def wait_healthy(server: Server, *, timeout_s: float) -> None:
    """``/healthz`` answers, and ``/v1/tools`` knows this run's token and the bench tool."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=2.0) as client:
        while True:
            if server.process.returncode is not None:
                raise RuntimeError(
                    f"{server.name} exited with {server.process.returncode}:\n"
                    f"{log_tail(server.log)}"
                )
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/healthz")).status_code == 200:
                    tools = await client.get(
                        "/v1/tools", headers={"Authorization": f"Bearer {TOKEN}"}
                    )
                    if tools.status_code != 200 or TOOL not in tools.text:
                        raise RuntimeError(
                            f"port {server.url} is not {server.name} of this run "
                            f"(GET /v1/tools: {tools.status_code})"
                        )
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{server.name} not healthy after {timeout_s} s:\n{log_tail(server.log)}"
                )
            await asyncio.sleep(0.1)


def ledger_argv(port: int, data: Path, tokens: Path, profile_to: Path | None) -> list[str]:
    """``toolledger serve``; with ``profile_to``: under :func:`profiled_server`."""
    runner = (
        ["-m", "bench.http", PROFILED_SERVER, str(profile_to)]
        if profile_to
        else ["-m", "toolledger.cli"]
    )
    return [
        sys.executable,
        *runner,
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--data",
        str(data),
        "--tokens",
        str(tokens),
        "--tools",
        "bench.http:noop_registry",
        "--create",
    ]


PROFILED_SERVER = "--profiled-server"


def profiled_server(prefix: str, cli_args: Sequence[str]) -> None:
    """``python -m bench.http --profiled-server PREFIX serve ...``: ``toolledger`` whose main
    thread (the event loop) is under cProfile from a SIGUSR1 to the next SIGUSR2, so that a
    profile holds one measured phase and nothing else (no imports, no start-up, no warm-up).
    Window ``n`` is written to ``PREFIX.n.prof``; ``PREFIX.n.on`` says it has started."""
    windows: list[cProfile.Profile] = []

    def start(signum: int, frame: object) -> None:
        windows.append(cProfile.Profile())
        Path(f"{prefix}.{len(windows) - 1}.on").touch()
        windows[-1].enable()

    def stop(signum: int, frame: object) -> None:
        windows[-1].disable()
        path = Path(f"{prefix}.{len(windows) - 1}.prof")
        windows[-1].dump_stats(f"{path}.tmp")
        os.replace(f"{path}.tmp", path)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = ["toolledger", *cli_args]  # then exactly what python -m toolledger.cli does
    runpy.run_module("toolledger.cli", run_name="__main__", alter_sys=True)


async def profile_window(server: Server, prefix: Path, index: int, *, on: bool) -> None:
    """Start (``on``) or end profile window ``index`` of a :func:`profiled_server`; returns
    once the server has done it."""
    server.process.send_signal(signal.SIGUSR1 if on else signal.SIGUSR2)
    marker = Path(f"{prefix}.{index}.{'on' if on else 'prof'}")
    deadline = time.monotonic() + 30.0
    while not exists(marker):
        if time.monotonic() > deadline or server.process.returncode is not None:
            raise RuntimeError(f"the profiled server did not write {marker}")
        await asyncio.sleep(0.005)


def bare_argv(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "bench.http:bare_app",
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-access-log",
        "--lifespan",
        "off",
        "--log-level",
        "warning",
    ]


def write_tokens(path: Path) -> None:
    path.write_text(
        json.dumps(
            {
                "tokens": [
                    {
                        "token": TOKEN,
                        "tenant": TENANT,
                        "principal": PRINCIPAL,
                        "scopes": ["tools:call"],
                    }
                ]
            }
        )
    )


# -- the load -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Planned:
    key: str
    body: bytes
    headers: dict[str, str]

    def wire(self) -> bytes:
        """The whole HTTP/1.1 request, as :class:`RawConnection` sends it."""
        head = "".join(f"{name}: {value}\r\n" for name, value in self.headers.items())
        return (
            f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}"
            f"Content-Length: {len(self.body)}\r\n\r\n"
        ).encode() + self.body


def plan(n: int, prefix: str) -> list[Planned]:
    return [
        Planned(
            key := f"{prefix}-{i:08d}",
            json.dumps({"arguments": {"text": f"note {i}"}}, separators=(",", ":")).encode(),
            {"Authorization": f"Bearer {TOKEN}", "Idempotency-Key": key, "Content-Type": JSON},
        )
        for i in range(n)
    ]


# -- the load generator's connections ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class ConnectionLost(Exception):
    """The connection failed or closed before the whole answer arrived."""


class Connection(Protocol):
    async def send(self, planned: Planned) -> Answer: ...

    async def aclose(self) -> None: ...


class RawConnection:
    """One keep-alive HTTP/1.1 connection over asyncio streams, pre-encoded requests and just
    enough of a response parser for these servers (``Content-Length`` bodies). A small,
    constant cost per request, so the load generator takes little of the shared CPU."""

    def __init__(self, host: str, port: int) -> None:
        self._address = (host, port)
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._wire: dict[str, bytes] = {}

    async def send(self, planned: Planned) -> Answer:
        wire = self._wire.get(planned.key)
        if wire is None:
            wire = self._wire[planned.key] = planned.wire()
        try:
            if self._streams is None:
                self._streams = await asyncio.open_connection(*self._address)
            reader, writer = self._streams
            writer.write(wire)
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            if "content-length" not in headers:
                raise ConnectionLost(f"no Content-Length in {lines[0]!r}: {headers}")
            body = await reader.readexactly(int(headers["content-length"]))
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            await self.aclose()
            raise ConnectionLost(repr(exc)) from exc
        if headers.get("connection", "").lower() == "close":
            await self.aclose()
        return Answer(int(lines[0].split(" ", 2)[1]), headers, body)

    async def aclose(self) -> None:
        if self._streams is not None:
            writer = self._streams[1]
            self._streams = None
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


class HttpxConnection:
    """An ``httpx.AsyncClient`` with a pool of one connection (``--client httpx``)."""

    def __init__(self, url: str) -> None:
        self._url = url + PATH
        self._client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            timeout=httpx.Timeout(60.0),
            trust_env=False,
        )

    async def send(self, planned: Planned) -> Answer:
        try:
            response = await self._client.post(
                self._url, content=planned.body, headers=planned.headers
            )
        except httpx.TransportError as exc:
            raise ConnectionLost(repr(exc)) from exc
        return Answer(
            response.status_code,
            {name.lower(): value for name, value in response.headers.items()},
            response.content,
        )

    async def aclose(self) -> None:
        await self._client.aclose()


@contextlib.asynccontextmanager
async def connections(kind: str, server: Server, count: int) -> AsyncIterator[list[Connection]]:
    """``count`` connections, one per worker. Not one shared ``httpx.AsyncClient``: httpcore's
    pool scans every connection and every queued request on each assignment, which cost the
    load generator ~8 ms of CPU per request with 64 connections (more than the server)."""
    made: list[Connection] = []
    for _ in range(count):
        made.append(
            RawConnection("127.0.0.1", server.port)
            if kind == "raw"
            else HttpxConnection(server.url)
        )
    try:
        yield made
    finally:
        for connection in made:
            await connection.aclose()


@dataclass
class Checks:
    responses: int = 0
    failures: Tally[str] = field(default_factory=Tally)
    bodies_compared: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def fail(self, what: str, detail: str) -> None:
        self.failures[what] += 1
        if len(self.examples) < 5:
            self.examples.append(f"{what}: {detail}"[:400])

    def summary(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "responses": self.responses,
            "bodies_compared": self.bodies_compared,
            "failures": dict(self.failures),
            "examples": self.examples,
        }


Verify = Callable[[int, Planned, Answer, bool], None]  # bool: sent more than once


@dataclass
class Phase:
    requests: int
    seconds: float
    latencies_ms: list[float]
    client_cpu_s: float
    server_cpu_s: float
    machine_busy_s: float
    load_average: tuple[float, float]
    transport_errors: list[str]
    finished_s: list[float]  # when each answer arrived, from the start of the phase

    @property
    def per_s(self) -> float:
        return self.requests / self.seconds

    def per_s_by_quarter(self) -> list[float]:
        """Answers per second in each quarter of the answers (in arrival order): a trend
        shows whether the rate changes as the phase goes on (the ledger grows)."""
        ends = sorted(self.finished_s)
        if len(ends) < 4:
            return []
        bounds = [0.0] + [ends[min(len(ends), round(len(ends) * q / 4)) - 1] for q in (1, 2, 3, 4)]
        counts = [round(len(ends) * q / 4) - round(len(ends) * (q - 1) / 4) for q in (1, 2, 3, 4)]
        return [
            round(c / max(b - a, 1e-9), 1)
            for c, a, b in zip(counts, bounds[:-1], bounds[1:], strict=True)
        ]

    def quantile_ms(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

    def summary(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
            "per_s": round(self.per_s, 1),
            "per_s_by_quarter": self.per_s_by_quarter(),
            "p50_ms": round(self.quantile_ms(0.50), 2),
            "p90_ms": round(self.quantile_ms(0.90), 2),
            "p99_ms": round(self.quantile_ms(0.99), 2),
            "max_ms": round(max(self.latencies_ms), 2),
            "server_cpu_ms_per_request": round(self.server_cpu_s * 1000 / self.requests, 3),
            "client_cpu_ms_per_request": round(self.client_cpu_s * 1000 / self.requests, 3),
            "server_cpu_per_wall_s": round(self.server_cpu_s / self.seconds, 3),
            "client_cpu_per_wall_s": round(self.client_cpu_s / self.seconds, 3),
            "other_processes_cpu_per_wall_s": round(
                max(0.0, self.machine_busy_s - self.server_cpu_s - self.client_cpu_s)
                / self.seconds,
                3,
            ),
            "load_average_1min_before_after": list(self.load_average),
            "transport_errors_retried": len(self.transport_errors),
            "transport_error_examples": self.transport_errors[:3],
        }


async def drive(
    clients: Sequence[Connection],
    server: Server,
    plans: Sequence[Planned],
    verify: Verify | None,
    progress: Progress,
    task: TaskID,
) -> Phase:
    """Closed loop: one worker per connection, each sends its next request once answered."""
    latencies = [0.0] * len(plans)
    finished = [0.0] * len(plans)
    errors: list[str] = []
    cursor = 0
    done = 0

    async def send(client: Connection, planned: Planned) -> tuple[Answer, bool]:
        for attempt in range(1, RETRIES + 1):
            try:
                return await client.send(planned), attempt > 1
            except ConnectionLost as exc:
                errors.append(
                    f"{time.perf_counter() - started:.3f} s into the phase, "
                    f"{planned.key}, attempt {attempt}: {exc!r}"
                )
                if attempt == RETRIES or server.process.returncode is not None:
                    raise
        raise AssertionError("unreachable")

    async def worker(client: Connection) -> None:
        nonlocal cursor, done
        while cursor < len(plans):
            index = cursor
            cursor += 1
            planned = plans[index]
            sent = time.perf_counter()
            response, retried = await send(client, planned)
            now = time.perf_counter()
            latencies[index] = (now - sent) * 1000.0
            finished[index] = now - started
            if verify is not None:
                verify(index, planned, response, retried)
            done += 1
            if done % 64 == 0 or done == len(plans):
                rate = done / max(time.perf_counter() - started, 1e-9)
                progress.update(task, completed=done, rate=f"{rate:,.0f} req/s")

    load_before = os.getloadavg()[0]
    client_cpu = time.process_time()
    server_cpu = cpu_seconds(server.pid)
    machine = machine_busy_seconds()
    started = time.perf_counter()
    await asyncio.gather(*(worker(client) for client in clients[: len(plans)]))
    seconds = time.perf_counter() - started
    return Phase(
        len(plans),
        seconds,
        latencies,
        time.process_time() - client_cpu,
        cpu_seconds(server.pid) - server_cpu,
        machine_busy_seconds() - machine,
        (round(load_before, 2), round(os.getloadavg()[0], 2)),
        errors,
        finished,
    )


def check_first(checks: Checks, bodies: list[bytes]) -> Verify:
    def verify(index: int, planned: Planned, response: Answer, retried: bool) -> None:
        checks.responses += 1
        bodies[index] = response.body
        if response.status != 200:
            checks.fail("status", f"{planned.key}: {response.status} {response.body[:300]!r}")
        elif "idempotent-replayed" in response.headers and not retried:
            checks.fail("replayed_header_on_first", planned.key)
        else:
            view = response.json()
            if (
                view.get("status") != "SUCCEEDED"
                or view.get("idempotency_key") != planned.key
                or view.get("result") != {"ok": True}
            ):
                checks.fail("body", f"{planned.key}: {response.body[:300]!r}")

    return verify


def check_replay(checks: Checks, bodies: Sequence[bytes]) -> Verify:
    def verify(index: int, planned: Planned, response: Answer, retried: bool) -> None:
        checks.responses += 1
        if response.status != 200:
            checks.fail("status", f"{planned.key}: {response.status} {response.body[:300]!r}")
        elif response.headers.get("idempotent-replayed") != "true":
            checks.fail("replayed_header_missing", planned.key)
        else:
            checks.bodies_compared += 1
            if response.body != bodies[index]:
                checks.fail(
                    "body_differs", f"{planned.key}: {bodies[index]!r} vs {response.body!r}"
                )

    return verify


def check_bare(checks: Checks) -> Verify:
    def verify(index: int, planned: Planned, response: Answer, retried: bool) -> None:
        checks.responses += 1
        if response.status != 200:
            checks.fail("status", f"{planned.key}: {response.status} {response.body[:300]!r}")
        elif response.json().get("idempotency_key") != planned.key:
            checks.fail("body", f"{planned.key}: {response.body[:300]!r}")

    return verify


def ledger_counts(path: Path) -> dict[str, int]:
    """Events by type, distinct succeeded keys and call rows, read back from the ledger file's
    audit trail (``tool_call_events``) after the server has stopped."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        counts: Tally[str] = Tally()
        succeeded: set[str] = set()
        for event_type, call_key in conn.execute(
            "SELECT event_type, call_key FROM tool_call_events"
        ):
            counts[event_type] += 1
            if event_type == ToolCallSucceeded.TYPE:
                succeeded.add(call_key)
        counts["tool_calls_rows"] = conn.execute("SELECT COUNT(*) FROM tool_calls").fetchone()[0]
    finally:
        conn.close()
    counts["succeeded_distinct_keys"] = len(succeeded)
    return dict(counts)


# -- runs ---------------------------------------------------------------------------------------


@dataclass
class LedgerRun:
    first: Phase
    replays: Phase
    first_checks: Checks
    replay_checks: Checks
    counts: dict[str, int]
    response_bytes: int
    profiles: dict[str, Path] = field(default_factory=dict)


async def run_ledger(
    args: argparse.Namespace,
    work: Path,
    progress: Progress,
    *,
    profile: bool = False,
    label: str = "",
) -> LedgerRun:
    """First executions, then replays, on one ``toolledger serve`` process (``profile``: under
    :func:`profiled_server`, one profile window per measured phase)."""
    data, tokens = work / "data", work / "tokens.json"
    write_tokens(tokens)
    warm, plans = plan(args.warmup, "warm"), plan(args.requests, "key")
    bodies = [b""] * len(plans)
    warm_bodies = [b""] * len(warm)
    first_checks, replay_checks, warm_checks = Checks(), Checks(), Checks()
    prefix = work / "server"
    profiles = {"first": Path(f"{prefix}.0.prof"), "replays": Path(f"{prefix}.1.prof")}

    def tasks(name: str) -> tuple[TaskID, TaskID]:
        return (
            progress.add_task(f"{label}{name} warm-up", total=len(warm), rate=""),
            progress.add_task(f"{label}{name}", total=len(plans), rate=""),
        )

    async def measured(ledger: Server, index: int, phase: Awaitable[Phase]) -> Phase:
        if profile:
            await profile_window(ledger, prefix, index, on=True)
        result = await phase
        if profile:
            await profile_window(ledger, prefix, index, on=False)
        return result

    first_tasks, replay_tasks = tasks("ledger, first"), tasks("ledger, replays")
    port = free_port()
    argv = ledger_argv(port, data, tokens, prefix if profile else None)
    async with (
        running("toolledger serve", argv, port, work / "server.log") as ledger,
        connections(args.client, ledger, args.concurrency) as clients,
    ):
        warm_first = await drive(
            clients, ledger, warm, check_first(warm_checks, warm_bodies), progress, first_tasks[0]
        )
        first = await measured(
            ledger,
            0,
            drive(
                clients, ledger, plans, check_first(first_checks, bodies), progress, first_tasks[1]
            ),
        )
        warm_replays = await drive(
            clients, ledger, warm, check_replay(warm_checks, warm_bodies), progress, replay_tasks[0]
        )
        replays = await measured(
            ledger,
            1,
            drive(
                clients,
                ledger,
                plans,
                check_replay(replay_checks, bodies),
                progress,
                replay_tasks[1],
            ),
        )
    for what, count in warm_checks.failures.items():
        first_checks.failures[f"warm-up {what}"] += count
    counts = ledger_counts(data / "ledger.db")
    keys = len(plans) + len(warm)
    # A request retried after a connection error may have reached the ledger the first time:
    # its retry is then one more replay (answered from the ledger, the handler does not run).
    retried = sum(len(p.transport_errors) for p in (warm_first, first, warm_replays, replays))
    exact = {
        ToolCallStarted.TYPE: keys,
        ToolCallSucceeded.TYPE: keys,
        "succeeded_distinct_keys": keys,
        "tool_calls_rows": keys,
    }
    replayed = counts.get(ToolCallReplayed.TYPE, 0)
    if (
        any(counts.get(name) != value for name, value in exact.items())
        or not keys <= replayed <= keys + retried
        or set(counts) - {*exact, ToolCallReplayed.TYPE}
    ):
        first_checks.fail(
            "ledger_file", f"expected {exact}, {keys}..{keys + retried} replayed; found {counts}"
        )
    return LedgerRun(
        first,
        replays,
        first_checks,
        replay_checks,
        counts,
        len(bodies[0]),
        profiles if profile else {},
    )


async def run_bare(
    args: argparse.Namespace, work: Path, progress: Progress
) -> tuple[Phase, Checks, int]:
    warm, plans = plan(args.warmup, "warm"), plan(args.requests, "key")
    checks = Checks()
    warm_task = progress.add_task("bare FastAPI warm-up", total=len(warm), rate="")
    task = progress.add_task("bare FastAPI", total=len(plans), rate="")
    port = free_port()
    async with (
        running("bare uvicorn", bare_argv(port), port, work / "bare.log") as bare,
        connections(args.client, bare, args.concurrency) as clients,
    ):
        await drive(clients, bare, warm, check_bare(Checks()), progress, warm_task)
        phase = await drive(clients, bare, plans, check_bare(checks), progress, task)
        size = len((await clients[0].send(plans[0])).body)
    return phase, checks, size


@contextlib.contextmanager
def scratch_dir(base: Path | None) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="toolledger-bench-http-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def git_state() -> dict[str, Any]:
    """The commit measured and the tracked files changed on top of it (others may be editing
    the tree while this runs)."""

    def git(*argv: str) -> str:
        try:
            return subprocess.run(
                ["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    modified = [
        line.split(maxsplit=1)[-1]
        for line in git("status", "--porcelain", "--untracked-files=no").splitlines()
    ]
    return {"head": git("rev-parse", "--short", "HEAD") or None, "modified": modified}


def version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


async def measure(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    base = Path(args.tmp_dir) if args.tmp_dir else None
    with scratch_dir(base) as work, new_progress(console, 24) as progress:
        (work / "ledger").mkdir()
        (work / "bare").mkdir()
        ledger = await run_ledger(args, work / "ledger", progress)
        bare, bare_checks, bare_bytes = await run_bare(args, work / "bare", progress)
    first, replays = ledger.first, ledger.replays
    cores = os.cpu_count() or 0
    return {
        "calls_per_s": round(first.per_s, 1),
        "replays_per_s": round(replays.per_s, 1),
        "bare_per_s": round(bare.per_s, 1),
        "ratio_calls_vs_bare": round(first.per_s / bare.per_s, 4),
        "p50_ms": round(first.quantile_ms(0.50), 2),
        "p99_ms": round(first.quantile_ms(0.99), 2),
        "meta": {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "warmup_requests": args.warmup,
            "replay_p50_ms": round(replays.quantile_ms(0.50), 2),
            "replay_p99_ms": round(replays.quantile_ms(0.99), 2),
            "bare_p50_ms": round(bare.quantile_ms(0.50), 2),
            "bare_p99_ms": round(bare.quantile_ms(0.99), 2),
            "phases": {
                "first": first.summary(),
                "replays": replays.summary(),
                "bare": bare.summary(),
            },
            "cores": cores,
            "cpu_note": CORES_NOTE.format(cores=cores),
            "client": args.client,
            "load": (
                "closed loop: C workers, each with its own keep-alive HTTP/1.1 connection ("
                + (
                    "raw asyncio streams, pre-encoded requests"
                    if args.client == "raw"
                    else "an httpx.AsyncClient with a pool of one"
                )
                + "); latency = request written to end of response body read"
            ),
            "server": {
                "ledger": "python -m toolledger.cli serve --tools bench.http:noop_registry "
                "(embedded backend, synchronous=FULL, temp dir)",
                "bare": "python -m uvicorn bench.http:bare_app --factory --no-access-log "
                "--lifespan off",
                # toolledger serve: its guarded h11 protocol (httptools answers bad headers
                # itself), uvloop when installed; the bare app: uvicorn's defaults
                "uvicorn_http": {
                    "ledger": "h11",
                    "bare": "httptools" if version("httptools") else "h11",
                },
                "event_loop": {
                    "ledger": serving.event_loop(),
                    "bare": "uvloop" if version("uvloop") else "asyncio",
                },
            },
            "request_bytes": len(plan(1, "key")[0].body),
            "response_bytes": {"ledger": ledger.response_bytes, "bare": bare_bytes},
            "checks": {
                "first": ledger.first_checks.summary(),
                "replays": ledger.replay_checks.summary(),
                "bare": bare_checks.summary(),
                "ledger_file": ledger.counts,
            },
            "versions": {
                "toolledger": version("toolledger"),
                "python": platform.python_version(),
                **{
                    name: version(name)
                    for name in ("fastapi", "starlette", "uvicorn", "h11", "httpx", "pydantic")
                },
                "sqlite": sqlite3.sqlite_version,
            },
            "platform": platform.platform(),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    }


def show(result: dict[str, Any], console: Console) -> None:
    meta = result["meta"]
    phases, checks = meta["phases"], meta["checks"]

    def ok(name: str) -> str:
        return "ok" if checks[name]["passed"] else "[red]FAILED"

    table = Table(
        title=f"toolledger HTTP: {meta['requests']} requests, concurrency "
        f"{meta['concurrency']}, {meta['cores']} cores shared with the client"
    )
    columns: list[tuple[str, JustifyMethod]] = [
        ("metric", "left"),
        ("value", "right"),
        ("p50 ms", "right"),
        ("p99 ms", "right"),
        ("server CPU ms/req", "right"),
        ("server CPU", "right"),
        ("client CPU", "right"),
        ("others' CPU", "right"),
        ("notes", "left"),
    ]
    for column, justify in columns:
        table.add_column(column, justify=justify, no_wrap=column != "notes")
    for metric, phase, note in [
        ("calls_per_s", "first", f"first executions: {ok('first')}"),
        (
            "replays_per_s",
            "replays",
            f"{checks['replays']['bodies_compared']} bodies identical: {ok('replays')}",
        ),
        ("bare_per_s", "bare", f"no ledger: {ok('bare')}"),
    ]:
        p = phases[phase]
        table.add_row(
            metric,
            f"{result[metric]:,.1f}",
            f"{p['p50_ms']:.2f}",
            f"{p['p99_ms']:.2f}",
            f"{p['server_cpu_ms_per_request']:.3f}",
            f"{p['server_cpu_per_wall_s']:.2f}",
            f"{p['client_cpu_per_wall_s']:.2f}",
            f"{p['other_processes_cpu_per_wall_s']:.2f}",
            note,
        )
    table.add_row(
        "ratio_calls_vs_bare", f"{result['ratio_calls_vs_bare']:.4f}", "", "", "", "", "", "", ""
    )
    console.print(table)
    console.print(
        "req/s by quarter of each phase: "
        + "; ".join(
            f"{name} {', '.join(f'{r:,.0f}' for r in phase['per_s_by_quarter'])}"
            for name, phase in phases.items()
        )
    )
    console.print(f"ledger file: {checks['ledger_file']}")
    for name, phase in phases.items():
        if phase["transport_errors_retried"]:
            console.print(
                f"[yellow]{name}: {phase['transport_errors_retried']} requests retried "
                f"after a connection error, e.g. {phase['transport_error_examples']}"
            )
    for name in ("first", "replays", "bare"):
        if not checks[name]["passed"]:
            console.print(f"[red]checks failed ({name}): {checks[name]}")


# -- profile --------------------------------------------------------------------------------------


_SITE = re.compile(r"[/\\]site-packages[/\\]([^/\\]+)")
_STDLIB = re.compile(r"[/\\]lib[/\\]python3\.\d+[/\\]([^/\\]+)")


def layer(filename: str, function: str) -> str:
    """A coarse owner of a profile entry: a package, a project directory or a C function."""
    if filename == "~":
        if "sqlite3" in function:
            return "C: sqlite3 (incl. fsync)"
        if "pydantic_core" in function:
            return "C: pydantic-core"
        if "poll" in function or "select" in function:
            return "C: epoll wait (idle loop)"
        if "socket" in function or "send" in function or "recv" in function:
            return "C: socket"
        return "C: other builtins"
    if (match := _SITE.search(filename)) is not None:
        return match.group(1).removesuffix(".py")
    path = Path(filename)
    if path.is_relative_to(ROOT):
        return f"toolledger: {path.relative_to(ROOT).parts[0]}"
    if (match := _STDLIB.search(filename)) is not None:
        return f"stdlib: {match.group(1).removesuffix('.py')}"
    return filename


def print_profile(path: Path, title: str, console: Console) -> None:
    stats = pstats.Stats(str(path))
    by_layer: Tally[str] = Tally()
    entries: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, _line, function), (_cc, _nc, own, _cum, _callers) in entries.items():
        by_layer[layer(filename, function)] += own
    total = sum(by_layer.values())
    layers = Table(
        title=f"{title}: own time by layer (server process, wall clock, {total:.1f} s in total)"
    )
    layers.add_column("layer")
    layers.add_column("own s", justify="right")
    layers.add_column("share", justify="right")
    for name, own in by_layer.most_common(16):
        layers.add_row(name, f"{own:.2f}", f"{own / total:.1%}")
    console.print(layers)
    for order, restriction, what in [
        ("tottime", (), "top 20 by own time"),
        (
            "cumulative",
            (re.escape(str(ROOT)) + r"/(?!\.venv/)",),
            "top 20 toolledger functions by cumulative time (a coroutine's ncalls counts "
            "its resumptions)",
        ),
    ]:
        out = io.StringIO()
        stats.stream = out  # type: ignore[attr-defined]
        stats.sort_stats(order).print_stats(*restriction, 20)
        text = out.getvalue()
        console.print(f"[bold]{title}: {what}[/]")
        console.print(
            text[text.find("   ncalls") :].rstrip() + "\n",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def profile(args: argparse.Namespace, console: Console) -> None:
    """Both ledger phases once more, on a server profiled during the measured phases only."""
    base = Path(args.tmp_dir) if args.tmp_dir else None
    args = argparse.Namespace(**{**vars(args), "requests": args.profile_requests})
    with scratch_dir(base) as work:
        with new_progress(console, 24) as progress:
            run = asyncio.run(run_ledger(args, work, progress, profile=True, label="profile: "))
        passed = run.first_checks.passed and run.replay_checks.passed
        console.print(
            f"profiled: first executions {run.first.per_s:,.0f}/s, replays "
            f"{run.replays.per_s:,.0f}/s (server under cProfile, one window per measured "
            f"phase), checks {'ok' if passed else 'FAILED'}"
        )
        for phase, path in run.profiles.items():
            print_profile(path, f"profile, {phase} ({args.requests} requests)", console)
            if args.keep_profiles:
                keep = Path(args.keep_profiles)
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, keep / f"http-{phase}.prof")
                console.print(f"kept {keep / f'http-{phase}.prof'} (pstats, snakeviz)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.http",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=8192, help="requests per phase")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    parser.add_argument("--warmup", type=int, default=512, help="untimed requests per phase")
    parser.add_argument(
        "--client",
        choices=["raw", "httpx"],
        default="raw",
        help="the load generator's connections: raw asyncio streams (light) or "
        "one httpx.AsyncClient per connection",
    )
    parser.add_argument(
        "--profile-requests", type=int, default=4096, help="requests per profiled phase"
    )
    parser.add_argument(
        "--keep-profiles",
        default=None,
        metavar="DIR",
        help="with --profile: also copy the .prof files to DIR",
    )
    parser.add_argument("--tmp-dir", default=None, help="where the scratch directories go")
    parser.add_argument("--out", default="bench/results/http.json")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also run both ledger phases with the server under cProfile",
    )
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments[:1] == [PROFILED_SERVER]:
        profiled_server(arguments[1], arguments[2:])
        return 0
    args = parser.parse_args(arguments)
    if min(args.requests, args.concurrency, args.warmup, args.profile_requests) < 1:
        parser.error("--requests, --concurrency, --warmup and --profile-requests must be >= 1")
    console = Console()
    if not console.is_terminal:  # rich's default of 80 columns wraps the tables
        console.width = max(console.width, 132)
    tree = git_state()
    result = asyncio.run(measure(args, console))
    result["meta"]["git"] = tree
    show(result, console)
    write_result(result, args.out, console)
    if args.profile:
        profile(args, console)
    checks = result["meta"]["checks"]
    return 0 if all(checks[name]["passed"] for name in ("first", "replays", "bare")) else 1


if __name__ == "__main__":
    sys.exit(main())
