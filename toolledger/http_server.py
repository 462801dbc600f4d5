"""The HTTP server under the API: uvicorn (h11), bounded against hostile or broken clients,
and shut down gracefully on SIGTERM/SIGINT.

- **Connections are capped** below the process's descriptor limit, so ``accept()`` never runs
  out of descriptors (an exhausted limit made asyncio log an error per attempt and starved
  every client). A connection over the cap is closed as soon as it is accepted.
- **Every connection has a deadline while the server waits on the client**: the request's
  headers must be complete within ``header_timeout_s`` of its first byte (or of the connection),
  its body within ``body_timeout_s``; between requests uvicorn's keep-alive timeout applies.
  A client that sends partial headers or a partial body is closed, not kept forever.
- **A repeated log message is rate-limited** (the first, then one per interval with a count).
- **A signal ends serving normally.** uvicorn re-raises the signal after its own shutdown,
  which kills the process before the ledger can let running calls finish, commit, checkpoint
  and release its lock; here serving just returns and the caller closes the ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("toolledger.http.server")

RESERVED_DESCRIPTORS = 64  # for the ledger's files, Kafka and PostgreSQL sockets, logs


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int | None = None  # None: 1,024, and always below the descriptor limit
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: int = 5
    shutdown_timeout_s: float = 30.0

    def connection_cap(self) -> int:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        ceiling = 1024 if self.max_connections is None else self.max_connections
        if soft == resource.RLIM_INFINITY:
            return ceiling
        return max(1, min(ceiling, soft - RESERVED_DESCRIPTORS))


class _GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a connection cap and read deadlines (see the module)."""

    cap = 1024
    header_timeout_s = 10.0
    body_timeout_s = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._reading_body = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.cap:
            log.info("connection refused: at the connection cap", extra={"open": self.cap})
            transport.abort()
            return
        self._arm(self.header_timeout_s, body=False)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.IDLE:  # headers not complete yet (perhaps after a keep-alive)
            if self._deadline is None or self._reading_body:
                self._arm(self.header_timeout_s, body=False)
        elif state is h11.SEND_BODY:
            if not self._reading_body:
                self._arm(self.body_timeout_s, body=True)
        else:  # the request is in: the application answers it, bounded by its own waits
            self._disarm()

    def on_response_complete(self) -> None:
        self._disarm()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float, *, body: bool) -> None:
        self._disarm()
        self._reading_body = body
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            log.info("connection closed: request headers or body not received in time")
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.disconnected = True
            self.transport.close()


class RepeatFilter(logging.Filter):
    """Lets a message (by logger and text) through once per ``every_s``; the next one that
    passes says how many were held back."""

    def __init__(self, every_s: float = 10.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        last, held = self._seen.get(key, (float("-inf"), 0))
        if now - last < self.every_s:
            self._seen[key] = (last, held + 1)
            return False
        if len(self._seen) > 1000:
            self._seen.clear()
        self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} (and {held} more like it)"
        return True


class AnnouncingServer(uvicorn.Server):
    """Says where it listens once its sockets are bound: one line on stderr whatever the log
    level (with ``--port 0`` it is the only way to learn the port)."""

    def __init__(self, config: uvicorn.Config, *, what: str = "toolledger", path: str = "") -> None:
        super().__init__(config)
        self._what, self._path = what, path

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if not self.started:
            return
        for server in self.servers:
            for bound in server.sockets:
                host, port = bound.getsockname()[:2]
                print(
                    f"{self._what} listening on http://{host}:{port}{self._path}",
                    file=sys.stderr,
                    flush=True,
                )


class _Server(AnnouncingServer):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Like uvicorn's, without re-raising the signal afterwards (see the module)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def install_log_guards() -> None:
    """Rate-limit what the event loop and the server log per connection."""
    guard = RepeatFilter()
    # per connection, not per request (a request's own logs are never held back)
    for name in ("asyncio", "uvicorn.error", log.name):
        logging.getLogger(name).addFilter(guard)


async def serve_app(
    app: Any, host: str, port: int, limits: ConnectionLimits, *, sock: socket.socket | None = None
) -> None:
    """Serve ``app`` until SIGTERM/SIGINT; returns once in-flight requests are answered
    (bounded by the shutdown timeout). ``sock``: an already bound socket to serve on instead
    of ``host:port`` (a worker of ``serve --workers``; the loop is the caller's then)."""
    cap = limits.connection_cap()

    class Protocol(_GuardedH11):
        pass

    Protocol.cap, Protocol.header_timeout_s = cap, limits.header_timeout_s
    Protocol.body_timeout_s = limits.body_timeout_s
    install_log_guards()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=Protocol,
        loop="none" if sock is not None else "asyncio",
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_keep_alive=limits.keep_alive_s,
        timeout_graceful_shutdown=max(1, round(limits.shutdown_timeout_s)),
    )
    log.info(
        "listening",
        extra={"host": host, "port": port, "pid": os.getpid(), "max_connections": cap},
    )
    await _Server(config).serve(sockets=[sock] if sock is not None else None)
