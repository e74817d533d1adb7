"""``historygraph serve --workers N`` on Linux: one ``SO_REUSEPORT`` socket per worker
(:mod:`historygraph.server.workers`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from historygraph.server import workers

from test_server import _port  # one port picker for every test process

SRC = str(Path(__file__).resolve().parents[1] / "src")
pytestmark = pytest.mark.skipif(not workers.BALANCED, reason="the balanced supervisor needs add_reader (POSIX)")


def _serve_two_workers(tmp_path: Path, name: str) -> tuple[int, subprocess.Popen, Path]:
    """``historygraph serve --workers 2`` (prune, an upstream nobody answers) on a free port, from
    this checkout's source; its output goes to ``tmp_path/<name>.log``. Returns (port, process, log)."""
    port = _port()
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log = tmp_path / f"{name}.log"
    px = subprocess.Popen([sys.executable, "-m", "historygraph", "serve", "--upstream", "http://127.0.0.1:9/v1",
                           "--port", str(port), "--store", str(tmp_path / f"{name}.sqlite"), "--policy", "prune",
                           "--workers", "2"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    return port, px, log


def test_a_taken_port_fails_before_any_worker_starts():
    with socket.socket() as taken:  # an ordinary listening socket, without SO_REUSEPORT
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        t0 = time.monotonic()
        with pytest.raises(OSError):
            workers.run_workers("historygraph.server.app:create_app_from_env", 2, "127.0.0.1", taken.getsockname()[1])
        assert time.monotonic() - t0 < 5


def test_a_worker_that_cannot_start_stops_the_supervisor_with_its_status():
    # the app import string names no module: each worker exits during startup; the supervisor does
    # not restart it forever but returns the worker's exit status (uvicorn exits 1 here)
    t0 = time.monotonic()
    status = workers.run_workers("historygraph_no_such_module:app", 2, "127.0.0.1", _port())
    assert status != 0
    assert time.monotonic() - t0 < 60


@pytest.mark.slow
def test_a_burst_of_keep_alive_connections_is_spread_over_the_workers(tmp_path):
    """40 connections opened at once, as 40 agents starting together: with one shared socket and
    uvicorn's supervisor the first worker to wake took most of such a burst (40/10, 42/8, 7/43 of 50
    measured, bench/RESULTS.md); a worker here accepts only while it holds no more connections than
    the other (or once a connection has waited 20 ms), so the two hold 20 each (a worker that was
    not scheduled for 20 ms may take a few more: at most 6 apart is asserted)."""
    import psutil

    port, px, log = _serve_two_workers(tmp_path, "w")
    conns: list[socket.socket] = []
    try:
        def children() -> list[psutil.Process]:
            return [c for c in psutil.Process(px.pid).children() if "spawn_main" in " ".join(c.cmdline())]

        deadline = time.time() + 60
        while time.time() < deadline:  # both workers answering
            try:
                if len(children()) == 2 and all(httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=1).status_code == 200
                                                for _ in range(4)):
                    time.sleep(2)
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        assert px.poll() is None, log.read_text()
        for _ in range(40):
            conns.append(socket.create_connection(("127.0.0.1", port)))
        time.sleep(1)
        held = [sum(1 for k in c.net_connections("tcp") if k.status == psutil.CONN_ESTABLISHED and k.laddr.port == port)
                for c in children()]
        assert sum(held) == 40 and max(held) - min(held) <= 6, held
    finally:
        for c in conns:
            c.close()
        px.terminate()
        px.wait(30)
    assert px.returncode == 0, log.read_text()


def test_a_busier_worker_leaves_a_connection_to_the_other_until_it_has_waited_too_long():
    import asyncio

    async def main() -> tuple[float, float]:
        sock = workers.listening_socket("127.0.0.1", 0)
        port = sock.getsockname()[1]
        counts = [0, 0]
        taken: list[float] = []

        async def serve(conn: socket.socket) -> None:
            taken.append(time.monotonic())
            conn.close()

        mine = {"open": 0}
        acceptor = workers.BalancedAcceptor(sock, counts, 0, lambda: mine["open"], serve)
        try:
            t0 = time.monotonic()
            client = socket.create_connection(("127.0.0.1", port))  # both at 0: taken at once
            while not taken:
                await asyncio.sleep(0.001)
            at_once = taken[0] - t0
            client.close()
            mine["open"] = 3  # now 3 against the other worker's 0, which never accepts
            counts[1] = 0
            t1 = time.monotonic()
            client = socket.create_connection(("127.0.0.1", port))
            while len(taken) < 2:
                await asyncio.sleep(0.001)
            client.close()
            return at_once, taken[1] - t1
        finally:
            acceptor.close()
            sock.close()

    at_once, deferred = asyncio.run(main())
    assert at_once < workers.PATIENCE_S
    assert workers.PATIENCE_S <= deferred < workers.PATIENCE_S + 1.0


@pytest.mark.slow
def test_a_killed_worker_is_replaced(tmp_path):
    import psutil

    port, px, log = _serve_two_workers(tmp_path, "k")
    try:
        def children() -> list[int]:
            """The live worker processes (a killed one is a zombie until the supervisor reaps it,
            and its command line cannot be read then)."""
            out = []
            for c in psutil.Process(px.pid).children():
                try:
                    if c.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(c.cmdline()):
                        out.append(c.pid)
                except psutil.Error:  # exited or became a zombie meanwhile
                    pass
            return out

        def wait_for(pred, seconds: float = 60) -> None:
            """Until ``pred()`` holds (evaluated once per poll: the workers may change between two calls)."""
            deadline = time.time() + seconds
            while not pred():
                assert time.time() < deadline, f"workers now {children()}, killed {first[:1]}; log: {log.read_text()}"
                time.sleep(0.2)

        def answers() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=30).status_code == 200
            except httpx.HTTPError:
                return False

        first: list[int] = []
        wait_for(lambda: len(children()) == 2)
        wait_for(answers)
        first = children()
        os.kill(first[0], 9)  # killed by a signal after it started: restarted, not a startup failure
        wait_for(lambda: len(children()) == 2 and first[0] not in children())
        assert px.poll() is None, log.read_text()
        wait_for(answers)
    finally:
        px.terminate()
        px.wait(30)
