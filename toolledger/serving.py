"""How ``toolledger serve`` runs: the event loop it runs on, and ``--workers N``, N front-door
processes sharing one listening socket.

- **The event loop** is uvloop's when it is installed (the ``speed`` extra), asyncio's
  otherwise: the base install does not need it.
- **Workers** are for the Kafka + PostgreSQL backend only, whose front doors are stateless:
  what a call's answer depends on is in Kafka (the key's partition decides, in log order) and
  in PostgreSQL, never in a front door's memory, so any worker may answer any request and two
  workers given the same key at once still execute it once. The embedded ledger is one
  process (it holds the ledger file's lock), so the command refuses more than one worker there.
- **The supervisor** (the process the operator started) binds the socket, so the port is one
  port and ``--port 0`` is resolved once, and starts the workers (``spawn``: no state of the
  supervisor is inherited but the socket), each opening its own front door. The kernel spreads
  the connections over the workers accepting on the socket. SIGTERM/SIGINT to the supervisor is
  passed on to every worker, which shut down as a single ``serve`` does (in-flight requests are
  answered), and awaited. A worker that exits on its own stops the others and the supervisor
  (exit code 1): the process manager that restarts ``serve`` restarts it whole. A worker whose
  supervisor dies is stopped by the kernel (Linux: the parent-death signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Coroutine
from multiprocessing.connection import wait
from types import FrameType
from typing import Any

from toolledger.http_server import ConnectionLimits, serve_app

log = logging.getLogger("toolledger.serve")

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def event_loop() -> str:
    """``uvloop`` if it is installed, else ``asyncio``."""
    try:
        import uvloop  # noqa: F401  (the speed extra)
    except ModuleNotFoundError:
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, None]) -> None:
    """``asyncio.run(main)``, on uvloop's event loop when it is installed."""
    if event_loop() == "asyncio":
        asyncio.run(main)
        return
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket every worker accepts on (``port`` 0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve_socket(app: Any, sock: socket.socket, limits: ConnectionLimits) -> None:
    """Serve ``app`` on an already bound ``sock`` until SIGTERM/SIGINT, as ``serve`` does on a
    host and port (same protocol guards, same graceful shutdown). The parser is h11's:
    httptools' answers a header with a control character with its own ``text/plain`` 400
    before the app sees it (the API's contract is a problem document), and measured no faster
    here (bench/http.py)."""
    host, port = sock.getsockname()[:2]
    await serve_app(app, host, port, limits, sock=sock)


def _worker_main(target: Callable[[socket.socket], None], sock: socket.socket, parent: int) -> None:
    if sys.platform == "linux":
        # the kernel stops this worker if the supervisor dies without stopping it
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the line above
        return
    target(sock)


def supervise(
    workers: int,
    host: str,
    port: int,
    target: Callable[[socket.socket], None],
    *,
    stop_timeout_s: float,
) -> int:
    """Bind ``host:port``, run ``target(sock)`` in ``workers`` processes until SIGTERM/SIGINT
    or until one of them exits; returns the exit code (0 after a signal, 1 if a worker ended
    on its own). ``target`` must be picklable (a module-level function or a partial of one)."""
    sock = bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(
            target=_worker_main,
            args=(target, sock, os.getpid()),
            name=f"toolledger-worker-{n}",
        )
        for n in range(workers)
    ]
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    handled = (signal.SIGINT, signal.SIGTERM)
    original = {sig: signal.signal(sig, stop) for sig in handled}
    code = 0
    try:
        for process in processes:
            process.start()
        sock.close()  # the workers have their own copies; the supervisor accepts nothing
        print(
            f"toolledger: {workers} workers on http://{bound_host}:{bound_port}",
            file=sys.stderr,
            flush=True,
        )
        while not stopping:
            ended = wait([p.sentinel for p in processes], timeout=0.2)
            if ended and not stopping:
                gone = [p for p in processes if p.exitcode is not None]
                log.error(
                    "a worker exited; stopping the others",
                    extra={"workers": {p.name: p.exitcode for p in gone}},
                )
                code = 1
                break
    finally:
        sock.close()
        for process in processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + stop_timeout_s
        for process in processes:
            if process.pid is None:
                continue
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.warning("a worker did not stop in time; killed", extra={"pid": process.pid})
                process.kill()
                process.join()
        for sig, handler in original.items():
            signal.signal(sig, handler)
    return code
