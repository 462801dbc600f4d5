"""``toolledger serve`` (embedded) against hostile connections and a failing disk: idle and
half-sent connections beyond the descriptor limit, a full disk while serving, a read-only
data directory. Normal clients are served again, the log stays small, nothing runs twice."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.faults.serve import EmbeddedServe
from tests.http.servers import ACME

FD_LIMIT = 256
IDLE = 300


def _raise_own_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _hostile(port: int, n: int) -> socket.socket:
    """Silent, half a header, or whole headers and half a body."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    kind = n % 3
    with contextlib.suppress(OSError):
        if kind == 1:
            sock.sendall(b"POST /v1/tools/create_ticket/calls HTTP/1.1\r\nHost: x\r\n")
        elif kind == 2:
            sock.sendall(
                b"POST /v1/tools/create_ticket/calls HTTP/1.1\r\nHost: x\r\n"
                b'Content-Type: application/json\r\nContent-Length: 400\r\n\r\n{"argu'
            )
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(0.01)
    try:
        data = sock.recv(65536)
    except TimeoutError:
        return False
    except OSError:
        return True  # reset
    while data:  # a 408/400/503 answer first is fine, then the end
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return False
        except OSError:
            return True
    return True


async def _served(server: EmbeddedServe, key: str) -> httpx.Response | None:
    try:
        async with server.client(timeout_s=5) as client:
            return await client.post(
                "/v1/tools/create_ticket/calls",
                json={"arguments": {"title": key}},
                headers={"Idempotency-Key": key},
            )
    except httpx.HTTPError:
        return None


async def test_300_idle_sockets_over_a_256_descriptor_limit_do_not_take_it_down(
    tmp_path: Path,
) -> None:
    _raise_own_fd_limit()
    server = EmbeddedServe.new(tmp_path, "--create", "--header-timeout", "2", "--body-timeout", "3")
    server.start(max_files=FD_LIMIT)
    sockets: list[socket.socket] = []
    try:
        for n in range(IDLE):
            with contextlib.suppress(OSError):
                sockets.append(_hostile(server.port, n))
        assert len(sockets) > FD_LIMIT  # the listen backlog takes what the server refuses
        deadline = time.monotonic() + 30
        answered = None
        n = 0
        while answered is None or answered.status_code != 200:
            assert time.monotonic() < deadline, "normal clients were never served again"
            await asyncio.sleep(0.5)
            n += 1
            answered = await _served(server, f"after-idle-{n}")
        assert answered.json()["status"] == "SUCCEEDED"
        still_open = list(sockets)
        closing_by = time.monotonic() + 20  # each gets its deadline once accepted
        while still_open and time.monotonic() < closing_by:
            still_open = [s for s in still_open if not _closed_by_server(s)]
            await asyncio.sleep(0.2)
        assert still_open == [], f"{len(still_open)} idle connections were never closed"
        server.process.check_alive() if server.process else None
        assert server.log_bytes() < 256 * 1024, server.log_bytes()  # no flood of errors
    finally:
        for sock in sockets:
            sock.close()
        server.stop()


@contextlib.contextmanager
def _small_disk(where: Path, size: str = "6m") -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert mounted.returncode == 0, f"cannot mount a tmpfs here: {mounted.stderr}"
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with filler.open("wb") as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 65536)
            out.flush()
    return filler


async def _readyz(server: EmbeddedServe) -> int:
    async with server.client(timeout_s=5) as client:
        return (await client.get("/readyz")).status_code


async def test_a_full_disk_while_serving_is_503_and_recovers_without_doubles(
    tmp_path: Path,
) -> None:
    with _small_disk(tmp_path / "disk") as disk:
        server = EmbeddedServe.new(tmp_path, "--create", data=disk / "data")
        server.start()
        try:
            keys = [f"disk-{n}" for n in range(10)]
            for key in keys:
                answered = await _served(server, key)
                assert answered is not None and answered.status_code == 200
            filler = _fill(disk)
            refused = None
            for n in range(300):  # the WAL fills up: then every commit fails
                key = f"full-{n}"
                keys.append(key)
                answered = await _served(server, key)
                if answered is not None and answered.status_code == 503:
                    refused = answered
                    break
                assert answered is not None and answered.status_code == 200, answered
            assert refused is not None, "the disk never filled up"
            problem = refused.json()
            assert problem["retryable"] is True and refused.headers.get("retry-after")
            statuses = []
            for _ in range(30):  # readiness says the ledger cannot commit
                statuses.append(await _readyz(server))
                if statuses[-1] == 503:
                    break
                await asyncio.sleep(0.2)
            assert statuses[-1] == 503, statuses
            filler.unlink()
            for _ in range(100):
                if await _readyz(server) == 200:
                    break
                await asyncio.sleep(0.2)
            assert await _readyz(server) == 200
            for key in keys:  # every key again: each ran once, or runs now, once
                for _ in range(50):
                    answered = await _served(server, key)
                    if answered is not None and answered.status_code == 200:
                        break
                    await asyncio.sleep(0.2)
                assert answered is not None and answered.status_code == 200, key
                assert answered.json()["status"] == "SUCCEEDED"
            counts = {key: server.effects("create_ticket", key) for key in keys}
            assert {k: c for k, c in counts.items() if c != 1} == {}
        finally:
            server.stop()


def test_a_read_only_data_directory_is_refused_with_one_line(tmp_path: Path) -> None:
    with _small_disk(tmp_path / "disk") as disk:
        server = EmbeddedServe.new(tmp_path, "--create", data=disk / "data")
        server.start()
        server.stop()
        before = (disk / "data" / "ledger.db").read_bytes()
        remount = ["mount", "-o", "remount,ro", str(disk)]
        assert subprocess.run(remount, capture_output=True, check=False).returncode == 0
        try:
            server.start(wait=False)
            assert server.wait_exit(60) == 2
            message = server.process.log() if server.process else ""
            # the first file of the data directory that cannot be written is named
            lines = [line for line in message.splitlines() if str(disk / "data") in line]
            assert len(lines) == 1 and "read-only" in lines[0], message
            assert "Traceback" not in message
        finally:
            rw = ["mount", "-o", "remount,rw", str(disk)]
            subprocess.run(rw, capture_output=True, check=False)
        assert (disk / "data" / "ledger.db").read_bytes() == before


@pytest.fixture(autouse=True)
def _no_mount_left(tmp_path: Path) -> Iterator[None]:
    yield
    subprocess.run(["umount", "-l", str(tmp_path / "disk")], capture_output=True, check=False)


async def test_a_client_gone_mid_body_is_logged_once_at_info(tmp_path: Path) -> None:
    server = EmbeddedServe.new(tmp_path, "--create")
    server.start()
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(
            b"POST /v1/tools/create_ticket/calls HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {ACME.token}\r\n".encode()
            + b"Idempotency-Key: gone-1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 400\r\n\r\n{"arguments": {"ti'
        )
        await writer.drain()
        await asyncio.sleep(0.3)
        writer.close()
        await writer.wait_closed()
        answered = await _served(server, "after-gone")
        assert answered is not None and answered.status_code == 200
        await asyncio.sleep(0.3)
        log = server.process.log(200_000) if server.process else ""
        assert "Traceback" not in log and '"level": "error"' not in log, log[-3000:]
        assert log.count("client disconnected before its request was read") == 1, log[-3000:]
        assert server.effects("create_ticket", "gone-1") == 0
    finally:
        server.stop()
