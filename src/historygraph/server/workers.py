"""``historygraph serve --workers N``: N worker processes accepting from one listening socket, each
taking a new connection only while it holds no more open connections than the least loaded other
worker, so that the connections, and with them the sessions, are spread evenly.

Why not uvicorn's own multi-process mode: its workers accept from one shared socket whenever it is
readable, and a worker whose event loop is idle wakes first and takes every connection waiting in
the queue at once. A burst of connections (50 agents starting together) then lands mostly on one
worker, and agents keep their keep-alive connection, and with it their worker, for the whole
session. Measured with ``bench/proxy_latency.py`` (prune, 50 sessions, 2 workers): 40/10, 42/8,
7/43 and 12/38 connections per worker in four of six runs (bench/RESULTS.md, "Why requests queue
at 50 sessions"). The same effect is described for nginx in "Why does one NGINX worker take all the
load?" (Marek Majkowski, Cloudflare blog, 2017) and in Node.js's cluster documentation (with a
shared socket "distribution tends to be very unbalanced"). One ``SO_REUSEPORT`` socket per worker
(commit 94cc1c4) spreads connections by a hash of their addresses: a fair draw per connection, but
still 16/34 in one of twelve runs.

Here (:class:`BalancedAcceptor`) each worker publishes its number of open connections in shared
memory and, when the shared socket is readable, accepts one connection if its count is at most the
smallest of the other workers' counts; otherwise it looks again after :data:`RETRY_S`, and takes
the connection anyway once one has waited :data:`PATIENCE_S` (a busy, hung or restarting worker
with fewer connections delays a new connection by that much at most). The connections are then
served by uvicorn's own HTTP protocol, as if uvicorn had accepted them.

The supervisor binds and listens; a worker that exits while it runs is started again (its count
reset to 0), unless it exited by itself before it finished starting (the app or the store cannot
be opened: a restart would fail the same way; one killed by a signal is restarted), in which case the supervisor stops the others and returns that exit
status. SIGINT and SIGTERM stop every worker (uvicorn's graceful shutdown in each) and then the
supervisor. On Windows (no ``add_reader`` on its event loop) :data:`BALANCED` is false and the CLI
uses uvicorn's supervisor.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.connection
import os
import select
import signal
import socket
import time
from typing import Any, Callable

log = logging.getLogger("historygraph.server")

BALANCED = os.name == "posix"
"""Whether :func:`run_workers` can be used here (an event loop with ``add_reader``)."""

STARTUP_FAILURE = 3
"""uvicorn's exit status of a server that failed to start (``uvicorn.config.STARTUP_FAILURE``)."""

RETRY_S = 0.002
"""Seconds a worker with more connections than another waits before looking at the queue again."""

PATIENCE_S = 0.02
"""Seconds a connection may wait for a less loaded worker; then the first worker to look takes it."""

PUBLISH_S = 0.1
"""Seconds between two updates of a worker's published connection count (also on every accept)."""


def listening_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A non-blocking TCP socket listening on ``(host, port)`` (``SO_REUSEADDR``, as uvicorn binds).
    Raises ``OSError`` when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class BalancedAcceptor:
    """Accepts connections from the shared ``sock`` on the running event loop for one worker
    (module docstring): ``counts`` is the shared array of every worker's open connections,
    ``index`` this worker's slot, ``open_connections()`` this worker's count now, and
    ``serve(conn)`` hands an accepted (non-blocking) socket to the HTTP server."""

    def __init__(self, sock: socket.socket, counts: Any, index: int, open_connections: Callable[[], int],
                 serve: Callable[[socket.socket], Any]) -> None:
        self.sock, self.counts, self.index = sock, counts, index
        self.open_connections, self.serve = open_connections, serve
        self.loop = asyncio.get_running_loop()
        self.waiting_since: float | None = None  # when a connection was first left for another worker
        self.setting_up = 0  # accepted, not yet counted by the server
        self.closed = False
        self.loop.add_reader(sock.fileno(), self._readable)
        self._publisher = self.loop.create_task(self._publish())

    def mine(self) -> int:
        return self.open_connections() + self.setting_up

    async def _publish(self) -> None:
        while not self.closed:
            self.counts[self.index] = self.mine()
            await asyncio.sleep(PUBLISH_S)

    def _readable(self) -> None:
        if self.closed:
            return
        mine = self.mine()
        self.counts[self.index] = mine
        others = [c for i, c in enumerate(self.counts) if i != self.index]
        now = time.monotonic()
        if others and mine > min(others):
            if self.waiting_since is None:
                self.waiting_since = now
            if now - self.waiting_since < PATIENCE_S:  # leave it to a less loaded worker for now
                self.loop.remove_reader(self.sock.fileno())
                self.loop.call_later(RETRY_S, self._resume)
                return
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError):  # another worker took it
            self.waiting_since = None
            return
        except OSError as exc:  # e.g. too many open files: try again shortly
            log.warning("accept failed: %s", exc)
            self.loop.remove_reader(self.sock.fileno())
            self.loop.call_later(0.1, self._resume)
            return
        self.waiting_since = None
        conn.setblocking(False)
        if conn.family in (socket.AF_INET, socket.AF_INET6):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.setting_up += 1
        self.counts[self.index] = self.mine()
        task = self.loop.create_task(self.serve(conn))
        task.add_done_callback(self._set_up)

    def _set_up(self, task: asyncio.Task) -> None:
        self.setting_up -= 1
        if not task.cancelled() and task.exception() is not None:
            log.warning("connection not served: %s", task.exception())

    def _resume(self) -> None:
        if self.closed:
            return
        if not select.select([self.sock], [], [], 0)[0]:  # another worker took what was waiting
            self.waiting_since = None
        self.loop.add_reader(self.sock.fileno(), self._readable)

    def close(self) -> None:
        """Stop accepting (the shared socket stays open for the other workers)."""
        if not self.closed:
            self.closed = True
            self.loop.remove_reader(self.sock.fileno())
            self._publisher.cancel()
            self.counts[self.index] = 0


def _worker(app: str, sock: socket.socket, counts: Any, index: int, log_level: str, started: Any) -> None:
    """One worker process (spawned): a uvicorn server running the app factory ``app`` whose
    connections a :class:`BalancedAcceptor` takes from ``sock``; sets ``started`` once it accepts."""
    import uvicorn

    class Server(uvicorn.Server):
        acceptor: BalancedAcceptor | None = None

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=[])  # the app's lifespan; no listener of uvicorn's own
            if not self.started:
                return
            config, loop = self.config, asyncio.get_running_loop()

            def protocol() -> asyncio.Protocol:  # what uvicorn's startup gives its listeners
                return config.http_protocol_class(config=config, server_state=self.server_state,  # type: ignore[call-arg]
                                                  app_state=self.lifespan.state, _loop=loop)

            async def serve(conn: socket.socket) -> None:
                await loop.connect_accepted_socket(protocol, conn, ssl=config.ssl)

            self.acceptor = BalancedAcceptor(sock, counts, index, lambda: len(self.server_state.connections), serve)
            started.set()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if self.acceptor is not None:
                self.acceptor.close()
            await super().shutdown(sockets)

    config = uvicorn.Config(app, factory=True, log_level=log_level)
    try:
        Server(config).run(sockets=[])
    except KeyboardInterrupt:  # SIGINT reaches the whole process group; the server already stopped
        pass


def run_workers(app: str, workers: int, host: str, port: int, log_level: str = "warning") -> int:
    """Run ``workers`` processes serving the app factory ``app`` (an import string) on
    ``host:port`` until SIGINT or SIGTERM (see the module docstring); returns the exit status
    (0, or a worker's when one failed to start). Raises ``OSError`` when the port is taken."""
    sock = listening_socket(host, port)
    ctx = multiprocessing.get_context("spawn")
    counts = ctx.Array("i", workers, lock=False)  # each worker's open connections (shared memory)
    stopping: list[int] = []

    def start(index: int) -> tuple[Any, Any]:
        counts[index] = 0
        started = ctx.Event()
        proc = ctx.Process(target=_worker, args=(app, sock, counts, index, log_level, started), name="historygraph-worker")
        proc.start()
        return proc, started

    previous = {sig: signal.signal(sig, lambda s, _f: stopping.append(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    status = 0
    procs = [start(i) for i in range(workers)]
    try:
        while not stopping:
            multiprocessing.connection.wait([p.sentinel for p, _ in procs], timeout=0.5)
            for i, (proc, started) in enumerate(procs):
                if proc.exitcode is None or stopping:
                    continue
                if not started.is_set() and proc.exitcode > 0:  # it never served: a restart would fail the same way
                    log.error("worker %s failed to start (exit status %s); stopping", proc.pid, proc.exitcode)
                    status = proc.exitcode or STARTUP_FAILURE
                    stopping.append(0)
                    break
                log.warning("worker %s exited (status %s); starting another", proc.pid, proc.exitcode)
                procs[i] = start(i)
    finally:
        for proc, _ in procs:
            if proc.exitcode is None:
                proc.terminate()
        for proc, _ in procs:
            proc.join(30)
            if proc.exitcode is None:
                proc.kill()
                proc.join()
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status
