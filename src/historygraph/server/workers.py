"""``historygraph serve --workers N`` on Linux: N worker processes, each accepting on its own
listening socket bound to the same port with ``SO_REUSEPORT``, so that the kernel spreads new
connections over the workers.

Why not uvicorn's own multi-process mode: its supervisor binds one socket and every worker accepts
from that one queue. A worker whose event loop is idle wakes first and takes every connection
waiting in the queue at once, so a burst of connections (50 agents starting together) lands
mostly on one worker, and agents keep their keep-alive connection, and with it their worker, for
the whole session. Measured with ``bench/proxy_latency.py`` (prune, 50 sessions, 2 workers): 40/10
and 29/21 connections per worker in two runs, the busier worker at 58–81 % of the requests while
the other idled (bench/RESULTS.md, "Why requests queue at 50 sessions"). The same effect is
described for nginx in "Why does one NGINX worker take all the load?" (Marek Majkowski, Cloudflare
blog, 2017) and for Node.js's cluster module, whose documentation says that with a shared socket
"distribution tends to be very unbalanced" and which therefore hands connections out round-robin
by default. With one ``SO_REUSEPORT`` socket per worker, Linux picks the socket of each new
connection by a hash of its addresses (socket(7), ``SO_REUSEPORT``): every connection is an
independent draw, whatever the workers are doing when it arrives.

The supervisor keeps a socket bound to the port (not listening, so no connection is queued on it)
for as long as it runs: a port that is taken fails at once, before any worker starts, and no other
program can take the port between two workers' restarts. A worker that exits while the supervisor
runs is started again, unless it never finished starting (the app or the store cannot be opened:
restarting would fail the same way), in which case the supervisor stops the others and exits with
that code. SIGINT and SIGTERM stop every worker (uvicorn's graceful shutdown in each) and then the
supervisor. Elsewhere (no ``SO_REUSEPORT`` load balancing: macOS gives every connection to the last
socket bound) :data:`REUSE_PORT` is false and the CLI uses uvicorn's supervisor.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import signal
import socket
import sys
from typing import Any

log = logging.getLogger("historygraph.server")

REUSE_PORT = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")
"""Whether :func:`run_workers` can be used here (Linux: ``SO_REUSEPORT`` spreads connections)."""

STARTUP_FAILURE = 3
"""uvicorn's exit status of a server that failed to start (``uvicorn.config.STARTUP_FAILURE``)."""


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``(host, port)`` with ``SO_REUSEADDR`` and ``SO_REUSEPORT`` set, not
    yet listening. Raises ``OSError`` when the port is taken by a socket without ``SO_REUSEPORT``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _worker(app: str, host: str, port: int, log_level: str, started: Any) -> None:
    """One worker process (spawned): its own ``SO_REUSEPORT`` socket on the port and a uvicorn
    server on it running the app factory ``app``; sets ``started`` once it accepts connections."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                started.set()

    sock = reuse_port_socket(host, port)
    config = uvicorn.Config(app, factory=True, host=host, port=port, log_level=log_level)
    try:
        Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # SIGINT reaches the whole process group; the server already stopped
        pass


def run_workers(app: str, workers: int, host: str, port: int, log_level: str = "warning") -> int:
    """Run ``workers`` processes serving the app factory ``app`` (an import string) on
    ``host:port`` until SIGINT or SIGTERM (see the module docstring); returns the exit status
    (0, or a worker's when one failed to start). Raises ``OSError`` when the port is taken."""
    holder = reuse_port_socket(host, port)
    ctx = multiprocessing.get_context("spawn")
    stopping: list[int] = []

    def start() -> tuple[Any, Any]:
        started = ctx.Event()
        proc = ctx.Process(target=_worker, args=(app, host, port, log_level, started), name="historygraph-worker")
        proc.start()
        return proc, started

    previous = {sig: signal.signal(sig, lambda s, _f: stopping.append(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    status = 0
    procs = [start() for _ in range(workers)]
    try:
        while not stopping:
            multiprocessing.connection.wait([p.sentinel for p, _ in procs], timeout=0.5)
            for i, (proc, started) in enumerate(procs):
                if proc.exitcode is None or stopping:
                    continue
                if not started.is_set():  # it never served: a restart would fail the same way
                    log.error("worker %s failed to start (exit status %s); stopping", proc.pid, proc.exitcode)
                    status = proc.exitcode or STARTUP_FAILURE
                    stopping.append(0)
                    break
                log.warning("worker %s exited (status %s); starting another", proc.pid, proc.exitcode)
                procs[i] = start()
    finally:
        for proc, _ in procs:
            if proc.exitcode is None:
                proc.terminate()
        for proc, _ in procs:
            proc.join(30)
            if proc.exitcode is None:
                proc.kill()
                proc.join()
        holder.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status
