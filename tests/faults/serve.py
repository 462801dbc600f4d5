"""``toolledger serve`` (embedded) as a process that tests kill, signal, starve and restart."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.http.servers import ACME, Process, free_port, spawn, write_tokens


@dataclass
class EmbeddedServe:
    """One data directory; start, kill and restart the server on it (same port)."""

    workdir: Path
    data: Path
    extra: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    process: Process | None = None
    runs: int = 0

    @classmethod
    def new(cls, workdir: Path, *extra: str, data: Path | None = None) -> EmbeddedServe:
        workdir.mkdir(parents=True, exist_ok=True)
        write_tokens(workdir / "tokens.json")
        return cls(workdir, data or workdir / "data", extra)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *more: str, wait: bool = True, max_files: int | None = None) -> Process:
        self.runs += 1
        args = ["serve", "--host", "127.0.0.1", "--port", str(self.port)]
        args += ["--data", str(self.data), "--tokens", str(self.workdir / "tokens.json")]
        args += ["--demo", *self.extra, *more]
        self.process = spawn(f"serve-{self.runs}", args, self.workdir, max_files=max_files)
        if wait:
            self.wait_ready()
        return self.process

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while True:
            self.process.check_alive()
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"not ready in {timeout_s} s:\n{self.process.log()}")
            time.sleep(0.05)

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None
        os.kill(self.process.popen.pid, sig)

    def wait_exit(self, timeout_s: float = 60.0) -> int:
        assert self.process is not None
        return self.process.popen.wait(timeout=timeout_s)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait_exit()

    def stop(self) -> None:
        if self.process is not None and self.process.popen.poll() is None:
            self.process.stop()

    def client(self, timeout_s: float = 60.0) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, headers=ACME.headers, timeout=timeout_s)

    def effects(self, tool: str, key: str) -> int:
        """Rows the helpdesk store wrote for ``key``: each is a real side effect."""
        path = self.data / "helpdesk.db"
        conn = sqlite3.connect(path, timeout=30)
        try:
            row = conn.execute(
                "SELECT COUNT(*) FROM effects WHERE tenant_id = ? AND tool = ? "
                "AND idempotency_key = ?",
                (ACME.tenant, tool, key),
            ).fetchone()
        finally:
            conn.close()
        return int(row[0])

    def log_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.workdir.glob("serve-*.log"))


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
